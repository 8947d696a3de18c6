"""Repair: the live projection tables made again from the log.

The projection tables are derived from the log, so whatever happened to
them (a row edited or deleted by hand, a table or view dropped or
redefined, the tracking row moved) the log can make them again.
``repair`` replays the log into scratch tables, as ``replay`` does, up to
its head; then, in one transaction in which no writer appends and no
projector catches up (``Store.repairing``), it compares them with the live
tables, and those writers decide against where they are others
(PostgreSQL's ``state_…``), and replaces every table that differs and every
view that still does, and sets the tracking position to the head. It
checks that nothing differs any more before it commits: a repair is whole
or not at all (a table dropped by hand is made again in that transaction,
never left empty for writers to decide against). A table or view made
again is readable, and owned, as before (``Store.keeping_grants``: on
PostgreSQL, one dropped by hand gets what the others share, so the roles
``grant-reporting`` gave them read it again). The log is never written;
``verify`` is its check.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ledger.errors import LedgerError, LockWaitedOut, RelationsBusy
from ledger.store import Store, count_repair
from projections import tables
from projections.replay import (
    DECISIONS,
    KEYS,
    Difference,
    ReplayReport,
    Scratch,
    ahead,
    compare,
    scratch_tables,
)


class RepairIncomplete(LedgerError):
    """Live tables that still differ from the replay once replaced."""

    def __init__(self, differences: list[Difference]) -> None:
        named = ", ".join(sorted({d.table for d in differences}))
        super().__init__(
            f"the repair left {len(differences)} difference(s) in {named}; nothing was changed")


def repair(store: Store, waiting: Callable[[str], None] | None = None) -> ReplayReport:
    """Replay the log and make the live tables (and PostgreSQL's decision
    tables) what it gives, where they differ; the report of what differed.
    A table or view to make again that another session holds (a reporting
    tool's open transaction) is waited for with the log's lock let go, so
    writers go on, up to the store's lock wait; ``waiting`` is told once."""
    busy = Busy(store, waiting)
    with scratch_tables(store) as scratch:
        while True:
            with store.reading() as cursor:
                head = store.head(cursor)
            scratch.replay_to(ahead(head, scratch, "the head of the log"))
            try:
                report = _replaced(store, scratch)
            except RelationsBusy as error:
                busy.wait(error.relations)
                continue
            if report is not None:
                break
    report.events, report.seconds = scratch.position, scratch.seconds
    return report


class Busy:
    """A repair's wait for tables or views another session holds: a try
    every ``RETRY`` seconds until the store's lock wait is over, then
    ``LockWaitedOut`` naming what is held, and by whom."""

    RETRY = 0.25

    def __init__(self, store: Store, waiting: Callable[[str], None] | None) -> None:
        self.store, self.waiting = store, waiting
        self.since: float | None = None

    def wait(self, relations: list[str]) -> None:
        held = ", ".join(self.store.holders(relations)) or "a projection table or view"
        if self.since is None:
            self.since = time.monotonic()
            if self.waiting is not None:
                self.waiting(f"waiting for {held}, which the repair makes again; writers go on "
                             f"meanwhile (it gives up after {self.store.lock_wait:g} s)")
        elif time.monotonic() - self.since >= self.store.lock_wait:
            raise LockWaitedOut(
                f"gave up waiting for a lock after {self.store.lock_wait:g} s on {held}, which "
                "the repair makes again: end that session's transaction (a reporting tool's, "
                "left open?) and repair again; nothing was changed")
        time.sleep(self.RETRY)


def _replaced(store: Store, scratch: Scratch) -> ReplayReport | None:
    """In one transaction, if the log still ends where ``scratch`` does (else
    None: replay the rest first): compare, replace what differs, check."""
    with store.repairing() as cursor, store.keeping_grants(cursor):
        head = store.head(cursor)
        if head != scratch.position:
            return None
        tracked = store.tracked(cursor)
        report = ReplayReport(head, head, _compared_with(store, tracked, head), repairing=True)
        for prefix, relations in _relations(store):
            differing: list[Difference] = []
            try:
                with store.changing(cursor):
                    # A table dropped by hand made again, empty for now; not yet its
                    # indexes and views: a table that lost a column by hand cannot take them.
                    tables.create(cursor, store.dialect, prefix, indexes=False, views=False)
                    differing = _differing(cursor, scratch, prefix, relations)
                    report.differences += differing
                    if differing:
                        _replace(cursor, store, scratch, prefix, differing)
            except RelationsBusy as busy:
                busy.relations = sorted({d.table for d in differing})  # what it makes again
                raise
        if report.differences or tracked != head:
            _track(cursor, store, tracked, head)
            count_repair(cursor, store.param)  # running writers drop what they loaded before
            report.repaired = head
    return report


def _compared_with(store: Store, tracked: int, head: int) -> str:
    what = f"the live tables at position {tracked}"
    if store.state_prefix:
        what += " and the decision tables"
    return what if tracked == head else f"{what}, against the log up to {head}"


def _relations(store: Store) -> list[tuple[str, tuple[str, ...]]]:
    """The live tables and views, and those writers decide against if they are others."""
    live = [("", tuple(KEYS))]
    return live + [(store.state_prefix, DECISIONS)] if store.state_prefix else live


def _differing(
    cursor: Any, scratch: Scratch, prefix: str, relations: tuple[str, ...] | set[str]
) -> list[Difference]:
    """What differs, a view's definition included (one redefined by hand is made again)."""
    return compare(cursor, expected=scratch.prefix, found=prefix, relations=tuple(relations),
                   dialect=scratch.store.dialect)


def _relation(difference: Difference, prefix: str) -> str:
    return difference.table.removeprefix(prefix)


def _replace(
    cursor: Any, store: Store, scratch: Scratch, prefix: str, differences: list[Difference]
) -> None:
    """The differing tables' rows replaced by the replay's (a table that lacks
    a column made again first); then the views that still differ (redefined
    by hand) made again as they were made."""
    differing = {_relation(d, prefix) for d in differences}
    if lacking := {_relation(d, prefix) for d in differences if d.key == "(columns)"}:
        tables.remake(cursor, store.dialect, prefix, tuple(sorted(lacking)))
    rows = {_relation(d, prefix) for d in differences if d.key != "(indexes)"}
    for relation in rows & set(tables.TABLES):
        _copy(cursor, scratch.prefix + relation, prefix + relation)
    tables.create(cursor, store.dialect, prefix)  # the indexes and views still missing
    views = differing & set(tables.VIEWS)
    still = {_relation(d, prefix) for d in _differing(cursor, scratch, prefix, views)}
    if still:
        tables.remake_views(cursor, store.dialect, prefix, tuple(sorted(still)))
    if left := _differing(cursor, scratch, prefix, differing):
        raise RepairIncomplete(left)


def _copy(cursor: Any, source: str, target: str) -> None:
    """``target``'s rows replaced by ``source``'s, in ``source``'s columns
    (a column a DBA added to ``target`` is left empty)."""
    columns = ", ".join(tables.columns_of(cursor, source))
    cursor.execute(f"DELETE FROM {target}")
    cursor.execute(f"INSERT INTO {target} ({columns}) SELECT {columns} FROM {source}")


def _track(cursor: Any, store: Store, tracked: int, head: int) -> None:
    """The tracking position set to the head: raised as a projector raises
    it, or lowered from past the head (a tracking row raised by hand, or a
    log whose last events were deleted: ``verify --digest`` tells)."""
    if tracked < head:
        store.track(cursor, head)
    elif tracked > head:
        store.set_tracked(cursor, head)
