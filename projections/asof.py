"""The state as of any point of history, rebuilt from the log (never from
today's tables) into scratch tables of an in-memory SQLite database, where
the same queries answer it."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import NamedTuple

from ledger.collection import fewer_collections
from ledger.domain import Cluster
from ledger.errors import BadOption, LogEndsEarly, OutOfRange, Unreadable
from ledger.model import (
    EXAMPLE_TIME,
    NEEDS_ZONE,
    NOT_RFC3339,
    OUT_OF_YEARS,
    rfc3339,
    timestamp,
)
from ledger.records import Progress, check_read_whole, read, replay_log
from ledger.store import Store
from projections import checkpoints, tables
from projections.rows import Statements, write_changes


def head_within(store: Store, position: int | None, option: str) -> int:
    """The head of the log; ``OutOfRange`` if ``position`` is past it (there
    is no state right after an event the log does not hold yet).

    ``LogEndsEarly`` if what is asked for reaches past the log's end (the
    head, or ``position``) to events whose chain hashes are kept, or that
    the projection tables have applied: the log's last events were deleted,
    and a state or report "at the head" would quietly leave them out."""
    with store.reading() as cursor:
        head, (chained, tracked) = store.head(cursor), store.known_end(cursor)
    for known, what in ((chained, "chained"), (tracked, "applied")):
        if (known if position is None else min(position, known)) > head:
            raise LogEndsEarly(head, known, what)
    if position is not None and position > head:
        raise OutOfRange(option, f"position {position} is beyond the head of the log ({head})")
    return head


@dataclass(frozen=True)
class AsOf:
    """A point of history: a position, or a time (``at`` at or before it)."""

    position: int | None = None
    at: str | None = None

    @classmethod
    def parse(cls, text: str, option: str = "--as-of") -> AsOf:
        if is_position(text):
            return cls(position=int(text))
        return cls(at=moment_of(text, option, "is neither a position nor an RFC 3339 timestamp"))


def is_position(text: str) -> bool:
    """Whether an option's value is a position: ASCII digits only (``int``
    would also take ``0_3`` and other scripts' digits)."""
    return text.isascii() and text.isdigit()


def moment_of(text: str, option: str, not_a_time: str = "is not an RFC 3339 time") -> str:
    """An RFC 3339 time given for ``option``, in the ledger's fixed-width UTC form."""
    try:
        moment = rfc3339(text)
    except ValueError as error:
        problem = str(error)
        if problem == NEEDS_ZONE:
            why = f" {NEEDS_ZONE}"
        elif problem == NOT_RFC3339:
            why = f" {not_a_time} (e.g. {EXAMPLE_TIME})"
        else:  # of RFC 3339's form, but a field is out of range
            why = f": {problem}"
        raise BadOption(option, f"{text!r}{why}") from None
    try:
        return timestamp(moment)
    except OverflowError:
        raise BadOption(option, f"{text!r} is {OUT_OF_YEARS}") from None


@fewer_collections()
def rebuild(
    store: Store, point: AsOf | None = None, every: int = checkpoints.EVERY
) -> tuple[Cluster, int]:
    """Replay the log into an in-memory cluster up to a point, starting from
    the nearest checkpoint and keeping new ones every ``every`` positions
    (``every=0``: from scratch, no checkpoints read or kept)."""
    cluster, progress = replayed(store, point, every)
    return cluster, progress.position


def replayed(
    store: Store, point: AsOf | None = None, every: int = checkpoints.EVERY
) -> tuple[Cluster, Progress]:
    """``rebuild``, with how far it came: the position and the latest ``at``."""
    upto = point.position if point is not None else None
    until = point.at if point is not None else None
    bounded = upto is not None or until is not None
    start = checkpoints.nearest(store, upto, until) if every and bounded else None
    cluster, position, max_at = start if start is not None else (Cluster(), 0, "")
    progress = Progress(position, max_at)
    kept = position  # the checkpoint this replay started from or kept last (0: none)
    while True:
        end = _next_stop(progress.position, every, upto)
        replay_log(cluster, store.read_log(progress.position, end), progress, until)
        if progress.stopped:
            break  # the first event after the moment asked for
        if progress.position != end:  # the end of the log, unless positions were deleted
            if end is not None:  # (a position past the head: the state at the head)
                check_read_whole(progress.position, store.read_log(progress.position), None)
            break
        if every and end % every == 0 and _due(store, cluster, end, kept, every, point):
            checkpoints.keep(store, cluster, end, progress.max_at)
            kept = end
        if end == upto:
            break
    return cluster, progress


def _due(
    store: Store, cluster: Cluster, end: int, kept: int, every: int, point: AsOf | None
) -> bool:
    """Whether a replay paused at ``end`` (a multiple of ``every``) keeps a
    checkpoint there. Never again where it started or kept one. Once it has
    replayed ``every`` events since the last one kept, or as many as the
    state has records, whichever is more: a checkpoint writes the whole
    state, which grows with history (removed allocations, alloc states,
    rejections), so that writing them takes a bounded share of a long replay
    instead of most of it. Otherwise at the last pause before the point
    asked for, so that the next question near it starts there (tried last:
    for a time, it reads the next pause's event)."""
    if end <= kept:
        return False
    if end - kept >= max(every, cluster.records()):
        return True
    return point is not None and _last_pause(store, end, every, point)


def _last_pause(store: Store, end: int, every: int, point: AsOf) -> bool:
    """Whether a replay to ``point`` pauses at ``end`` for the last time: a
    position is less than ``every`` ahead; a time, earlier than the ``at``
    of the event at the next pause, or the log ends before it (at times in
    order, exact; otherwise the prefix may end sooner, and this pause keeps
    no checkpoint it would not have kept anyway)."""
    if point.position is not None:
        return point.position - end < every
    if point.at is None:
        return False
    with store.reading() as cursor:
        found = store.kept_at(cursor, [end + every])
    if not found:
        return True
    try:
        at: str = read(found[0]).event["at"]
    except Unreadable:
        return True  # the replay names it, after the state here
    return at > point.at


def _next_stop(position: int, every: int, upto: int | None) -> int | None:
    """Where a replay from ``position`` pauses next: the next checkpoint
    (every ``every`` positions, if any), or ``upto``."""
    if not every:
        return upto
    checkpoint = (position // every + 1) * every
    return checkpoint if upto is None else min(checkpoint, upto)


@fewer_collections()
def materialize(cluster: Cluster) -> sqlite3.Connection:
    """Scratch projection tables holding a replayed cluster."""
    connection = sqlite3.connect(":memory:")
    cursor = connection.cursor()
    tables.create(cursor, "sqlite", indexes=False)
    write_changes(cursor, Statements("?"), cluster.everything())
    tables.create_indexes(cursor)
    return connection


class Replayed(NamedTuple):
    """The state at a point of history, in scratch tables."""

    connection: sqlite3.Connection
    position: int  # the last event applied
    # The point's time: the TIMESTAMP asked for, or the latest ``at`` up to
    # the POSITION (None before the first event).
    moment: str | None


def state_at(store: Store, point: AsOf) -> Replayed:
    cluster, progress = replayed(store, point)
    moment = point.at if point.at is not None else progress.max_at or None
    return Replayed(materialize(cluster), progress.position, moment)
