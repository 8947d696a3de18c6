"""Checkpoints of replayed state, so an as-of answer replays a bounded stretch.

Every ``EVERY`` positions an as-of replay passes, it keeps the whole
replayed state (compressed) with the position and the latest ``at`` so far.
They are a cache derived from the log: deleting them loses nothing.
"""

from __future__ import annotations

import zlib
from typing import Any

import orjson

from ledger.domain import Cluster, Snapshot
from ledger.errors import StoreUnavailable
from ledger.store import Store

EVERY = 100_000


def _table(store: Store) -> str:
    blob = "BYTEA" if store.dialect != "sqlite" else "BLOB"
    return (
        "CREATE TABLE IF NOT EXISTS checkpoints ("
        f"position BIGINT PRIMARY KEY, max_at TEXT NOT NULL, state {blob} NOT NULL)"
    )


def nearest(store: Store, position: int | None, at: str | None) -> tuple[Cluster, int, str] | None:
    """The latest checkpoint at or before a position (or wholly at or before a time)."""
    p = store.param
    where, bound = (
        (f"position <= {p}", position) if position is not None else (f"max_at <= {p}", at)
    )
    try:
        with store.reading() as cursor:
            cursor.execute(
                f"SELECT position, max_at, state FROM checkpoints WHERE {where} "
                "ORDER BY position DESC LIMIT 1",
                (bound,),
            )
            row = cursor.fetchone()
    except StoreUnavailable:  # no table yet (nothing was checkpointed), or a reader role
        return None
    if row is None:
        return None
    state: dict[str, Any] = orjson.loads(zlib.decompress(bytes(row[2])))
    return Snapshot.restore(state), row[0], row[1]


def keep(store: Store, cluster: Cluster, position: int, max_at: str) -> None:
    """Keep a checkpoint of a replayed cluster (once per position)."""
    state = zlib.compress(orjson.dumps(Snapshot.of(cluster)), 1)
    p = store.param
    try:
        with store.projecting() as cursor:
            cursor.execute(_table(store))
            cursor.execute(
                f"INSERT INTO checkpoints (position, max_at, state) VALUES ({p}, {p}, {p}) "
                "ON CONFLICT (position) DO NOTHING",
                (position, max_at, state),
            )
    except StoreUnavailable:
        pass  # a cache: a reader that may not write answers all the same, only slower
