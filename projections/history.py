"""Every event and rejection touching one entity, in log order."""

from __future__ import annotations

import json
from typing import Any

from ledger.domain import touched_by
from ledger.records import Record, decode
from ledger.store import LoggedEvent, Store


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
    """Events naming a node, allocation, slot (``n1#0``) or address, or changed by one."""
    # As the kept JSON writes the name: whole, or for a name with '#' (a slot
    # n1#0, or an allocation or address web#blue) its start, which both the
    # slot's node "n1" and a whole name "web#blue" begin with; then picked
    # exactly. (A new allocation or address may not read as a slot: events.)
    if "#" in entity:
        needle = json.dumps(entity.split("#", 1)[0], ensure_ascii=False)[:-1]
    else:
        needle = json.dumps(entity, ensure_ascii=False)
    with store.reading() as cursor:
        found = store.search_log(cursor, needle)
    rows = []
    for position, topic, state in found:
        if upto is not None and position > upto:
            break
        record = decode(LoggedEvent(position, topic, state))
        named = set(touched_by(record.event)) | set(record.touches)
        if entity not in named and entity not in slots_created(record):
            continue
        rows.append(
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
    return rows
