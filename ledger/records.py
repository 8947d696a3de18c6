"""How an event is kept in the log, and how a kept event is applied again.

Each kept event is one eventsourcing ``StoredEvent`` of the single ledger
stream: ``originator_version`` is its global, gapless ``position``; the topic
is its type (or ``rejected``); the state is JSON with the event as received
(defaults and ``at`` filled in), ``recorded_at``, the entities its effects
touched, and for a rejection the reason.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from ledger.domain import AlreadyPlaced, Cluster
from ledger.errors import (
    LedgerError,
    LogEdited,
    LogEndsEarly,
    PositionMissing,
    Refused,
    RulesTooNew,
    RuleViolation,
    Unreadable,
)
from ledger.model import RULES, Fact
from ledger.readable import check, event_problem, inapplicable, stored_problem, unreadable
from ledger.store import Kept, LoggedEvent, logged

REJECTED = "rejected"
_blank_fact = object.__new__


@dataclass(slots=True)
class Record:  # not frozen: a frozen dataclass's __init__ costs twice as much, per event
    position: int
    topic: str
    event: dict[str, Any]
    recorded_at: str
    touches: list[str]
    reason: str | None = None
    rules: int = RULES

    @property
    def rejected(self) -> bool:
        return self.topic == REJECTED

    @property
    def fact(self) -> Fact:
        return Fact(self.position, self.event["at"], self.rules)


def encode(record: Record) -> LoggedEvent:
    """The kept form of a record: a ``StoredEvent`` of the ledger stream, less
    the stream (as a ``LoggedEvent``: building the frozen dataclass was a
    twentieth of deciding an event)."""
    state: dict[str, Any] = {"event": record.event, "recorded_at": record.recorded_at}
    if record.touches:
        state["touches"] = record.touches
    if record.reason is not None:
        state["reason"] = record.reason
    if record.rules != 1:  # as version 1 kept it: without
        state["rules"] = record.rules
    return logged((record.position, record.topic, dumped(state)))


def dumped(value: Any) -> bytes:
    """``orjson.dumps`` in a copy of its exact size: orjson (3.13) hands back
    its bytes in the buffer it wrote them in, 4 KiB at least (a 150-byte
    event took 4 KiB, a 37 KB slot report 260 KB), and many are held at
    once (a batch's kept events while it is written and the next decided:
    200,000 simulated events peaked at 170–185 MB, 149 MB with the copy, no
    slower; docs/performance.md)."""
    return bytes(memoryview(orjson.dumps(value)))


def decode(stored: Kept) -> Record:
    """A kept event as a Record (``Unreadable`` if it cannot be one); its
    event is not checked: applying it does that (``replay``), or ``read``."""
    try:
        return _record(stored, orjson.loads(stored.state))
    except (ValueError, LookupError, TypeError, AttributeError):
        raise unreadable(stored.originator_version, stored.state) from None


def read(stored: Kept) -> Record:
    """``decode``, and check the kept event is as the ledger keeps one
    (``Unreadable`` if not): for readers of a few events (``history``),
    which apply none, so that nothing else would tell them."""
    try:
        state = orjson.loads(stored.state)
    except ValueError:
        raise unreadable(stored.originator_version, stored.state) from None
    check(stored.originator_version, state)
    return _record(stored, state)


def _record(stored: Kept, state: dict[str, Any]) -> Record:
    return Record(
        stored.originator_version,
        stored.topic,
        state["event"],
        state["recorded_at"],
        state.get("touches", []),
        state.get("reason"),
        rules_of(state, stored.originator_version),
    )


def replay(cluster: Cluster, record: Record) -> None:
    """Apply a kept event to a cluster exactly as it was decided."""
    if record.rejected:
        cluster.reject(record.event, record.reason or "", record.fact)
        return
    try:
        cluster.apply(record.event, record.fact)
    except (RuleViolation, AlreadyPlaced) as violation:  # a placement kept once already
        raise refused(record.position, record.event, violation) from None
    except (ValueError, LookupError, TypeError, AttributeError):  # its type or a field edited?
        edited = inapplicable(record.position, record.event)
        if edited is None:
            raise  # nothing is wrong with the kept event: the domain's own failure
        raise edited from None


@dataclass(slots=True)
class Progress:
    """How far a replay has come through the log."""

    position: int  # the last event applied
    max_at: str = ""  # the latest ``at`` applied
    stopped: bool = False  # it reached an event later than ``until``


def replay_log(
    cluster: Cluster, log: Iterable[LoggedEvent], progress: Progress, until: str | None = None
) -> None:
    """``replay(cluster, decode(stored))`` for each kept event of ``log``, in
    one loop without building Records (replays run it for every event of
    history; a call per event was a twentieth of a rebuild), advancing
    ``progress``; stop, applying nothing more, at the first event whose
    ``at`` is later than ``until``."""
    position, max_at = progress.position, progress.max_at
    stored = None
    try:
        for stored in log:
            kept, topic, data = stored  # a LoggedEvent: a tuple, read faster than by name
            if kept != position + 1:
                raise missing(position + 1, kept)
            state = orjson.loads(data)
            event = state["event"]
            at: str = event["at"]
            if until is not None and at > until:
                progress.stopped = True
                break
            position = kept
            fact = _blank_fact(Fact)  # filled here: Fact's __init__ costs a frame per event
            fact.position = position
            fact.at = at
            rules = state.get("rules", 1)
            fact.rules = rules if rules <= RULES else rules_of(state, position)  # (which raises)
            if topic == REJECTED:
                cluster.reject(event, state.get("reason") or "", fact)
            else:
                cluster.apply(event, fact)
            if at > max_at:  # noqa: PLR1730 - a call per event costs more
                max_at = at
    except (ValueError, LookupError, TypeError, AttributeError):
        # a kept event that is not as it was kept: the log was edited
        if stored is None:
            raise unreadable(None, None) from None
        problem = stored_problem(stored.state)
        if problem is None:
            raise  # nothing is wrong with the kept event: the domain's own failure
        raise Unreadable(stored.originator_version, problem) from None
    except (RuleViolation, AlreadyPlaced) as violation:  # a placement kept once already
        assert stored is not None
        raise refused(stored.originator_version, event, violation) from None
    progress.position, progress.max_at = position, max_at


def refused(position: int, event: Any, violation: LedgerError) -> LogEdited:
    """A kept event its own rules refuse on replay: one not as the ledger
    keeps one (a field edited to null) cannot be read; any other was decided
    against tables that did not match the log before it."""
    problem = event_problem(event)
    return Refused(position, violation) if problem is None else Unreadable(position, problem)


def gapless(log: Iterable[Kept], after: int = 0) -> Iterator[Kept]:
    """The kept events of ``log``, which starts after position ``after``;
    raise at the first position missing (``replay_log`` checks the same inline)."""
    expected = after + 1
    for stored in log:
        if stored.originator_version != expected:
            raise missing(expected, stored.originator_version)
        expected += 1
        yield stored


def check_read_whole(position: int, later: Iterable[LoggedEvent], needed: int | None) -> None:
    """A replay asked the log for more than it got: its events stopped at
    ``position``. That is the log's end only if nothing is kept after it
    (``later``: the log after ``position``; else the positions between were
    deleted, and the first is named) and it reaches ``needed``, a position
    the log held when the replay began (else its last events were deleted)."""
    for stored in later:
        raise missing(position + 1, stored.originator_version)
    if needed is not None and position < needed:
        raise LogEndsEarly(position, needed)


def missing(position: int, found: int) -> PositionMissing:
    """The log skips positions: they were deleted."""
    return PositionMissing(position, found, "; alloc-ledger verify checks whether the log was edited")


def rules_of(state: dict[str, Any], position: int) -> int:
    """The rules a kept event was decided by (none recorded: 1); raise for
    rules newer than this release knows."""
    rules: int = state.get("rules", 1)
    if rules > RULES:
        raise RulesTooNew(position, rules, RULES)
    return rules
