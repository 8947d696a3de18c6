"""Every event and rejection touching one entity, in log order.

A history is a search, not a replay: the database reads the log for the
kept events whose stored JSON holds the name, and only those are read
here, a few at a time, as the rows are printed; and counts, in the log's
index, the positions it holds. So it also says what it could not list:
positions missing from the log in the range it searched (deleted), and kept
events its search found that cannot be read.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ledger.batches import batched
from ledger.domain import touched_by
from ledger.errors import HistoryIncomplete, Unreadable
from ledger.records import Record, read
from ledger.store import LoggedEvent, Store

# A history reads the log a page of positions found at a time, and the
# events found a few at a time: never all of a long history at once.
PAGE = 1000  # positions of events found, per search of the log
READ_BYTES = 4 << 20  # kept events read at once: until they reach this many bytes


@dataclass(slots=True)
class History:
    """A search of the log for one entity, up to position ``end``. Its rows
    are read as they are used (``rows``): a history as long as the log is
    never held whole. What the log could not give of them (``missing``,
    ``unreadable``) is known once they have been read to their end."""

    store: Store
    entity: str
    upto: int | None  # the point of history asked for (None: the head)
    needle: str  # what the stored JSON of every event found holds
    end: int  # the last position searched
    missing: list[tuple[int, int]] = field(default_factory=list)  # (first, last) positions
    unreadable: list[Unreadable] = field(default_factory=list)
    read: bool = False  # the rows were read to their end: missing and unreadable are known

    def rows(self) -> Iterator[dict[str, Any]]:
        """The history's rows in log order, read from the log as they are
        taken (each call reads them again)."""
        unreadable: list[Unreadable] = []
        self.unreadable, self.read = unreadable, False
        for stored in self._found():
            try:
                record = read(stored)
            except Unreadable as error:  # it may name the entity: the search found it
                unreadable.append(error)
                continue
            if touches(record, self.entity):
                yield row_of(record)
        # Counted after the events were read: a position deleted while they
        # were is missing from what was listed too.
        with self.store.reading() as cursor:
            gone = held(self.store, cursor, self.end) < self.end
            self.missing = missing_positions(self.store, cursor, self.end) if gone else []
        self.read = True

    def _found(self) -> Iterator[LoggedEvent]:
        """The kept events whose stored JSON holds the needle, in order: a
        page of their positions per search, then a few events per read, each
        in a read transaction of its own (none is held while they are used)."""
        after = 0
        while True:
            with self.store.reading() as cursor:
                page = self.store.search_log(cursor, self.needle, after, self.end, PAGE)
            for run in batched(page, PAGE, stored_size, READ_BYTES):
                with self.store.reading() as cursor:
                    kept = self.store.kept_at(cursor, [position for position, _ in run])
                yield from kept
            if len(page) < PAGE:
                return
            after = page[-1][0]

    @property
    def whole(self) -> bool:
        if not self.read:
            for _ in self.rows():  # known only once they are read
                pass
        return not self.missing and not self.unreadable

    def check_whole(self) -> None:
        """``HistoryIncomplete`` unless the rows are the whole history."""
        if not self.whole:
            raise HistoryIncomplete(self.entity, self.upto, self.missing, self.unreadable)


def touches(record: Record, entity: str) -> bool:
    """Whether a kept event names the entity or changed it: looked for until
    found (a slot report names a thousand slots and allocations)."""
    return (
        entity in record.touches
        or any(name == entity for name in touched_by(record.event))
        or entity in slots_created(record)
    )


def stored_size(found: tuple[int, int]) -> int:
    """The stored size of an event found (position, size): none if NULL."""
    return found[1] or 0


def row_of(record: Record) -> dict[str, Any]:
    return {
        "position": record.position,
        "type": record.event["type"],
        "status": "rejected" if record.rejected else "appended",
        "at": record.event["at"],
        "recorded_at": record.recorded_at,
        "reason": record.reason,
        "event": record.event,
    }


def slots_created(record: Record) -> list[str]:
    """The slots (``n1#0`` …) a node's registration created: derived from the
    event here, since the kept registrations name only the node (and its
    parent) among what they touch, and a history must not depend on the
    release that kept them."""
    event = record.event
    if record.rejected or event["type"] != "node-registered":
        return []
    return [f"{event['node']}#{index}" for index in range(event["slots"])]


def history(store: Store, entity: str, upto: int | None = None) -> list[dict[str, Any]]:
    """The whole history of an entity as a list (``HistoryIncomplete`` if
    the log cannot give it whole)."""
    found = search(store, entity, upto)
    rows = list(found.rows())
    found.check_whole()
    return rows


def search(store: Store, entity: str, upto: int | None = None) -> History:
    """Events naming a node, allocation, slot (``n1#0``) or address, or
    changed by one, up to ``upto`` (default: the head), with what the log
    could not give of them: read as its ``rows`` are taken."""
    # As the kept JSON writes the name: whole, or for a name with '#' (a slot
    # n1#0, or an allocation or address web#blue) its start, which both the
    # slot's node "n1" and a whole name "web#blue" begin with; then picked
    # exactly. (A new allocation or address may not read as a slot: events.)
    if "#" in entity:
        needle = json.dumps(entity.split("#", 1)[0], ensure_ascii=False)[:-1]
    else:
        needle = json.dumps(entity, ensure_ascii=False)
    if upto is not None:
        return History(store, entity, upto, needle, upto)
    with store.reading() as cursor:
        # Up to the head, or past it to where the projection tables have
        # applied: the log held those positions once (its last were deleted).
        end = max(store.head(cursor), store.tracked(cursor))
    return History(store, entity, upto, needle, end)


def held(store: Store, cursor: Any, end: int) -> int:
    """How many of the positions 1 to ``end`` the log holds: counted in its
    index (positions are gapless, so ``end`` unless some were deleted)."""
    cursor.execute(
        f"SELECT COUNT(*) FROM stored_events WHERE originator_id = {store.param} "
        f"AND originator_version BETWEEN 1 AND {store.param}", (store.stream, end))
    return int(cursor.fetchone()[0])


def missing_positions(store: Store, cursor: Any, end: int) -> list[tuple[int, int]]:
    """The positions 1 to ``end`` the log lacks, as (first, last) ranges:
    read only once a count says some are (positions are gapless)."""
    p = store.param
    builtin = "pg_catalog." if store.dialect == "postgresql" else ""  # not another schema's lag
    cursor.execute(
        "SELECT previous + 1, originator_version - 1 FROM (SELECT originator_version, "
        f"{builtin}lag(originator_version, 1, 0) OVER (ORDER BY originator_version) AS previous "
        f"FROM stored_events WHERE originator_id = {p} AND originator_version BETWEEN 1 AND {p}"
        ") kept WHERE originator_version > previous + 1 ORDER BY originator_version",
        (store.stream, end),
    )
    gaps = [(int(row[0]), int(row[1])) for row in cursor.fetchall()]
    cursor.execute(
        f"SELECT MAX(originator_version) FROM stored_events WHERE originator_id = {p} "
        f"AND originator_version BETWEEN 1 AND {p}", (store.stream, end))
    last = int(cursor.fetchone()[0] or 0)
    return gaps + ([(last + 1, end)] if last < end else [])
