"""How an event is kept in the log, and how a kept event is applied again.

Each kept event is one eventsourcing ``StoredEvent`` of the single ledger
stream: ``originator_version`` is its global, gapless ``position``; the topic
is its type (or ``rejected``); the state is JSON with the event as received
(defaults and ``at`` filled in), ``recorded_at``, the entities its effects
touched, and for a rejection the reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
from eventsourcing.persistence import StoredEvent

from ledger.domain import Cluster
from ledger.model import Fact
from ledger.store import LEDGER_STREAM, Kept

REJECTED = "rejected"


@dataclass(frozen=True, slots=True)
class Record:
    position: int
    topic: str
    event: dict[str, Any]
    recorded_at: str
    touches: list[str]
    reason: str | None = None

    @property
    def rejected(self) -> bool:
        return self.topic == REJECTED

    @property
    def fact(self) -> Fact:
        return Fact(self.position, self.event["at"])


def encode(record: Record) -> StoredEvent:
    state: dict[str, Any] = {"event": record.event, "recorded_at": record.recorded_at}
    if record.touches:
        state["touches"] = record.touches
    if record.reason is not None:
        state["reason"] = record.reason
    return StoredEvent(
        originator_id=LEDGER_STREAM,
        originator_version=record.position,
        topic=record.topic,
        state=orjson.dumps(state),
    )


def decode(stored: Kept) -> Record:
    state = orjson.loads(stored.state)
    return Record(
        stored.originator_version,
        stored.topic,
        state["event"],
        state["recorded_at"],
        state.get("touches", []),
        state.get("reason"),
    )


def replay(cluster: Cluster, record: Record) -> None:
    """Apply a kept event to a cluster exactly as it was decided."""
    if record.rejected:
        cluster.reject(record.event, record.reason or "", record.fact)
    else:
        cluster.apply(record.event, record.fact)


def replay_stored(cluster: Cluster, stored: Kept, until: str | None = None) -> str | None:
    """``replay(cluster, decode(stored))`` without building a Record (replays
    run this for every event of history); return the event's ``at``, or
    None, applying nothing, when that is later than ``until``."""
    state = orjson.loads(stored.state)
    event = state["event"]
    at: str = event["at"]
    if until is not None and at > until:
        return None
    fact = Fact(stored.originator_version, at)
    if stored.topic == REJECTED:
        cluster.reject(event, state.get("reason") or "", fact)
    else:
        cluster.apply(event, fact)
    return at
