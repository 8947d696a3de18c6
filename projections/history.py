"""Every event and rejection touching one entity, in log order.

A history is a search, not a replay: the database reads the log for the
kept events whose stored JSON holds the name, and only those are read
here; and counts, in the log's index, the positions it holds. So it also
says what it could not list: positions missing from the log in the range
it searched (deleted), and kept events its search found that cannot be read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ledger.domain import touched_by
from ledger.errors import HistoryIncomplete, Unreadable
from ledger.records import Record, read
from ledger.store import Store


@dataclass(slots=True)
class History:
    """What a search of the log found about one entity."""

    entity: str
    upto: int | None  # the point of history asked for (None: the head)
    rows: list[dict[str, Any]] = field(default_factory=list)
    missing: list[tuple[int, int]] = field(default_factory=list)  # (first, last) positions
    unreadable: list[Unreadable] = field(default_factory=list)

    @property
    def whole(self) -> bool:
        return not self.missing and not self.unreadable

    def check_whole(self) -> None:
        """``HistoryIncomplete`` unless the rows are the whole history."""
        if not self.whole:
            raise HistoryIncomplete(self.entity, self.upto, self.missing, self.unreadable)


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
    """The whole history of an entity (``HistoryIncomplete`` if the log
    cannot give it whole)."""
    found = search(store, entity, upto)
    found.check_whole()
    return found.rows


def search(store: Store, entity: str, upto: int | None = None) -> History:
    """Events naming a node, allocation, slot (``n1#0``) or address, or
    changed by one, up to ``upto`` (default: the head), with what the log
    could not give of them."""
    # As the kept JSON writes the name: whole, or for a name with '#' (a slot
    # n1#0, or an allocation or address web#blue) its start, which both the
    # slot's node "n1" and a whole name "web#blue" begin with; then picked
    # exactly. (A new allocation or address may not read as a slot: events.)
    if "#" in entity:
        needle = json.dumps(entity.split("#", 1)[0], ensure_ascii=False)[:-1]
    else:
        needle = json.dumps(entity, ensure_ascii=False)
    found = History(entity, upto)
    with store.reading() as cursor:
        # Up to the head, or past it to where the projection tables have
        # applied: the log held those positions once (its last were deleted).
        end = upto if upto is not None else max(store.head(cursor), store.tracked(cursor))
        kept = store.search_log(cursor, needle, upto)
        if held(store, cursor, end) < end:
            found.missing = missing_positions(store, cursor, end)
    for stored in kept:
        try:
            record = read(stored)
        except Unreadable as unreadable:  # it may name the entity: the search found it
            found.unreadable.append(unreadable)
            continue
        named = set(touched_by(record.event)) | set(record.touches)
        if entity not in named and entity not in slots_created(record):
            continue
        found.rows.append(
            {
                "position": record.position,
                "type": record.event["type"],
                "status": "rejected" if record.rejected else "appended",
                "at": record.event["at"],
                "recorded_at": record.recorded_at,
                "reason": record.reason,
                "event": record.event,
            }
        )
    return found


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
    cursor.execute(
        "SELECT previous + 1, originator_version - 1 FROM (SELECT originator_version, "
        "LAG(originator_version, 1, 0) OVER (ORDER BY originator_version) AS previous "
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
