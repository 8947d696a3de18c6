"""Checkpoints of replayed state, so an as-of answer replays a bounded stretch.

Every ``EVERY`` positions an as-of replay passes, it keeps the whole
replayed state (compressed) with the position and the latest ``at`` so far.
They are a cache derived from the log: deleting them loses nothing.

Each is bound to the log: its ``hash`` covers the chain hash kept for its
position, its latest ``at`` and its state. One that does not match (its state edited,
copied from another ledger, or the log under it rewritten) or cannot be
read (its state rewritten as TEXT by a DBA or a tool) is not used, and is
dropped where the role may, so the next replay past it keeps a good one.
Like the chain, this catches careless tampering; anyone who can write the
database can also recompute the hash.
"""

from __future__ import annotations

import zlib
from hashlib import sha256
from typing import Any

import orjson

from ledger.domain import Cluster, Snapshot
from ledger.errors import StoreUnavailable
from ledger.store import Store
from projections import tables
from projections.history import held

EVERY = 100_000
# A checkpoint is a cache: not worth waiting for another projector's
# transaction (a follower stopped inside one would hold an as-of query for good).
WAIT = 0.2


def _table(store: Store) -> str:
    blob = "BYTEA" if store.dialect != "sqlite" else "BLOB"
    return (
        "CREATE TABLE IF NOT EXISTS checkpoints ("
        f"position BIGINT PRIMARY KEY, max_at TEXT NOT NULL, state {blob} NOT NULL, hash TEXT)"
    )


def bound(chain_hash: str | None, max_at: str, state: bytes) -> str | None:
    """The hash binding a checkpoint (its latest ``at`` and its state) to the
    log at its position."""
    if chain_hash is None:
        return None
    return sha256(b"\n".join((chain_hash.encode(), max_at.encode(), state))).hexdigest()


def nearest(store: Store, position: int | None, at: str | None) -> tuple[Cluster, int, str] | None:
    """The latest good checkpoint at or before a position (or wholly at or
    before a time); a bad one is passed over (and dropped, where allowed).
    None if the log lacks a position under it (deleted since it was kept)."""
    p = store.param
    where, bound_value = (
        (f"position <= {p}", position) if position is not None else (f"max_at <= {p}", at)
    )
    # On SQLite a row's type is its own: a TEXT state (not always UTF-8) is read as NULL.
    state = "CASE WHEN typeof(state) = 'blob' THEN state END" if store.dialect == "sqlite" else "state"
    below: int | None = None
    while True:
        try:
            with store.reading() as cursor:
                cursor.execute(
                    f"SELECT position, max_at, {state}, hash FROM checkpoints WHERE {where}"
                    + ("" if below is None else f" AND position < {p}")
                    + " ORDER BY position DESC LIMIT 1",
                    (bound_value,) if below is None else (bound_value, below),
                )
                row = cursor.fetchone()
                if row is None:
                    return None
                kept = store.hash_at(cursor, row[0])
                if held(store, cursor, row[0]) != row[0]:
                    # positions deleted under it: a replay from the start names them
                    return None
        except StoreUnavailable:  # no table yet (nothing was checkpointed), or a reader role
            return None
        found = _restored(row[1], _as_kept(row[2]), row[3], kept)
        if found is not None:
            return found, row[0], row[1]
        _drop(store, row[0], row[3])
        below = row[0]


def _as_kept(state: object) -> bytes | None:
    """A checkpoint's state as it was kept (bytes), or None for one rewritten
    as text (on PostgreSQL, with its column's type)."""
    return bytes(state) if isinstance(state, (bytes, bytearray, memoryview)) else None


def _restored(
    max_at: str, state: bytes | None, kept_hash: str | None, chain_hash: str | None
) -> Cluster | None:
    """The cluster a checkpoint holds, or None when it is not bound to this log."""
    if state is None or kept_hash is None or kept_hash != bound(chain_hash, max_at, state):
        return None
    try:
        return Snapshot.restore(orjson.loads(zlib.decompress(state)))
    except (zlib.error, ValueError, LookupError, TypeError):  # bound, yet unreadable
        return None


def _drop(store: Store, position: int, kept_hash: str | None) -> None:
    """Drop a bad checkpoint, not a good one another process has kept since."""
    p = store.param
    try:
        with store.projecting(waits=WAIT) as cursor:
            cursor.execute(
                f"DELETE FROM checkpoints WHERE position = {p} AND COALESCE(hash, '') = {p}",
                (position, kept_hash or ""))
    except StoreUnavailable:
        pass  # a reader that may not write passes over it all the same


def keep(store: Store, cluster: Cluster, position: int, max_at: str) -> None:
    """Keep a checkpoint of a replayed cluster (once per position; one kept
    there before that is not bound to this log is replaced)."""
    state = zlib.compress(orjson.dumps(Snapshot.of(cluster)), 1)
    p = store.param
    try:
        with store.projecting(waits=WAIT) as cursor:
            cursor.execute(_table(store))
            # a table an earlier release made has no ``hash``: its rows are never used
            tables.add_column(cursor, store.dialect, "checkpoints", "hash", "TEXT")
            _state_as_bytes(cursor, store)
            digest = bound(store.hash_at(cursor, position), max_at, state)
            if digest is None:
                return  # no chain hash kept for it: verify names that
            cursor.execute(
                f"INSERT INTO checkpoints (position, max_at, state, hash) "
                f"VALUES ({p}, {p}, {p}, {p}) ON CONFLICT (position) DO UPDATE "
                "SET max_at = excluded.max_at, state = excluded.state, hash = excluded.hash "
                "WHERE checkpoints.hash IS NULL OR checkpoints.hash <> excluded.hash",
                (position, max_at, state, digest),
            )
    except StoreUnavailable:
        pass  # a cache: a reader that may not write answers all the same, only slower


def _state_as_bytes(cursor: Any, store: Store) -> None:
    """On PostgreSQL, a ``state`` column made TEXT by hand (or by a tool) is
    made BYTEA again, so that fresh checkpoints can be kept in it (looked up
    first, as ``tables.add_column`` does): the text it holds becomes bytes
    that no hash matches, passed over and dropped like any bad checkpoint.
    (On SQLite a row's type is its own: ``nearest`` drops a TEXT one.)"""
    if store.dialect == "sqlite":
        return
    cursor.execute(
        "SELECT data_type FROM information_schema.columns "
        "WHERE table_schema = pg_catalog.current_schema() "
        "AND table_name = 'checkpoints' AND column_name = 'state'")
    row = cursor.fetchone()
    if row is not None and row[0] != "bytea":
        cursor.execute("ALTER TABLE checkpoints ALTER COLUMN state TYPE BYTEA "
                       "USING pg_catalog.convert_to(state::text, 'UTF8')")
