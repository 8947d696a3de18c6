"""The state as of any point of history, rebuilt from the log (never from
today's tables) into scratch tables of an in-memory SQLite database, where
the same queries answer it."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from datetime import datetime

from ledger.domain import Cluster
from ledger.errors import LedgerError
from ledger.events import timestamp
from ledger.records import decode, replay
from ledger.store import Store
from projections import tables
from projections.rows import Statements, write_changes


@dataclass(frozen=True)
class AsOf:
    """A point of history: a position, or a time (``at`` at or before it)."""

    position: int | None = None
    at: str | None = None

    @classmethod
    def parse(cls, text: str) -> AsOf:
        if text.isdigit():
            return cls(position=int(text))
        try:
            moment = datetime.fromisoformat(text.replace("z", "Z"))
        except ValueError:
            raise LedgerError(
                f"--as-of {text!r} is neither a position nor an RFC 3339 timestamp"
            ) from None
        if moment.tzinfo is None:
            raise LedgerError(f"--as-of {text!r} needs a time zone (Z or +hh:mm)")
        return cls(at=timestamp(moment))


def rebuild(store: Store, point: AsOf | None = None) -> tuple[Cluster, int]:
    """Replay the log into a fresh in-memory cluster up to a point."""
    cluster = Cluster()
    position = 0
    upto = point.position if point is not None else None
    until = point.at if point is not None else None
    for stored in store.read_log(0, upto):
        record = decode(stored)
        if until is not None and record.event["at"] > until:
            break
        replay(cluster, record)
        position = record.position
    return cluster, position


def materialize(cluster: Cluster) -> sqlite3.Connection:
    """Scratch projection tables holding a replayed cluster."""
    connection = sqlite3.connect(":memory:")
    cursor = connection.cursor()
    tables.create(cursor, "sqlite")
    write_changes(cursor, Statements("?"), cluster.everything())
    return connection


def state_at(store: Store, point: AsOf) -> tuple[sqlite3.Connection, int]:
    cluster, position = rebuild(store, point)
    return materialize(cluster), position
