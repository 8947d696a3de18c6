"""Repair: the live projection tables replaced by a replay of the log.

The projection tables are derived from the log, so whatever happened to
them (a row edited or deleted by hand, a table dropped, the tracking row
lowered) the log can make them again. ``replay --repair`` replays the log
into scratch tables (``projections.replay``), compares, and where anything
differs replaces every live table's rows, and those of the tables writers
decide against (PostgreSQL's ``state_…``), with the replay at the head of
the log, and sets the tracking position there: one transaction, in which no
writer appends and no projector catches up (``Store.repairing``). The log
itself is never written; ``verify`` is its check.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ledger.store import Store
from projections import tables

if TYPE_CHECKING:
    from projections.replay import Scratch

# What writers decide against, where they have tables of their own: the
# tables among them (the views follow from the tables).
DECIDED = ("nodes", "slots", "allocations", "addresses")


def make_dropped_tables(store: Store) -> None:
    """Tables and views dropped by hand made again, empty: the replay then
    names every row they lack, and the repair fills them."""
    with store.repairing() as cursor:
        for prefix in _prefixes(store):
            tables.create(cursor, store.dialect, prefix)


def replace_live(store: Store, scratch: Scratch) -> int | None:
    """The live tables replaced by ``scratch`` if it has replayed up to the
    head of the log, in one transaction; the position they now hold, or
    None if the log has moved on (replay the rest first)."""
    with store.repairing() as cursor:
        head = store.head(cursor)
        if head != scratch.position:
            return None
        for prefix in _prefixes(store):
            for relation in DECIDED if prefix else tables.TABLES:
                _copy(cursor, scratch.prefix + relation, prefix + relation)
        if store.tracked(cursor) < head:  # never past the head here: the replay checked
            store.track(cursor, head)
    return head


def _prefixes(store: Store) -> tuple[str, ...]:
    """The live tables, and those writers decide against if they are others."""
    return ("", store.state_prefix) if store.state_prefix else ("",)


def _copy(cursor: Any, source: str, target: str) -> None:
    """``target``'s rows replaced by ``source``'s, in ``source``'s columns
    (a column a DBA added to ``target`` is left empty)."""
    cursor.execute(f"SELECT * FROM {source} WHERE 1 = 0")
    columns = ", ".join(d[0] for d in cursor.description)
    cursor.execute(f"DELETE FROM {target}")
    cursor.execute(f"INSERT INTO {target} ({columns}) SELECT {columns} FROM {source}")
