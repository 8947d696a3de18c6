"""The projector: applies the log to the projection tables, exactly once.

It reads kept events after the tracked position, applies them to a cluster
loaded from the tables, and writes the changed rows together with the new
tracking position in the caller's transaction; a crash at any point leaves
the tables and the tracking position consistent, and the next run resumes.
"""

from __future__ import annotations

from typing import Any

import orjson

from ledger.batches import BATCH_BYTES, batched
from ledger.collection import fewer_collections
from ledger.domain import Cluster
from ledger.errors import LogEndsEarly, Refused, TablesDisagree, Unchained
from ledger.readable import stored_problem
from ledger.records import LoggedEvent, Progress, replay_log
from ledger.store import Store
from projections.rows import Statements, TableSource, changed_rows

# The events applied and written at a time: a page ends at PAGE events or
# once their kept JSON reaches PAGE_BYTES (as a submit's batch does): 400
# rejected events of 1 MiB were one write, whose rejection rows PostgreSQL
# refused (a jsonb array is at most 256 MB) after holding 1.5 GB here.
PAGE = 1000
PAGE_BYTES = BATCH_BYTES


class Projector:
    """Keeps one set of projection tables (``prefix``) in step with the log."""

    def __init__(self, store: Store, prefix: str = "") -> None:
        self.store = store
        self.sql = Statements(store.param, prefix)
        self.source = TableSource(self.sql, store)
        self.cluster = Cluster(self.source)

    def update(self, limit: int | None = None, waits: float | None = None) -> tuple[int, int]:
        """Bring the tables up to date in a transaction of their own (at most
        ``limit`` events), waiting for another projector at most ``waits``
        seconds; return the (from, to) positions."""
        with self.store.reading() as cursor:
            start, head = self.store.tracked(cursor), self.store.head(cursor)
        if start == head:  # (past the head: the catch-up names the deleted events)
            return start, head
        with self.store.projecting(waits) as cursor:
            start = self.store.tracked(cursor)
            end = self.catch_up(cursor, limit=limit)
        return start, end

    @fewer_collections()
    def catch_up(self, cursor: Any, head: int | None = None, limit: int | None = None) -> int:
        """Apply what the tables have not seen yet (up to ``head``, at most
        ``limit`` events) in the caller's transaction; return the new position.
        A ``head`` given is one the caller appended in this transaction; the
        head read from the log is checked to be the ledger's (``Unchained``)."""
        self.source.cursor = cursor
        self.cluster.forget()
        tracked = self.store.tracked(cursor)
        appended_here = head is not None  # by the writer calling, in this transaction
        if head is None:
            head = self.store.head(cursor)
        if tracked > head:
            raise LogEndsEarly(head, tracked, "applied")
        if limit is not None:
            head = min(head, tracked + limit)
        if tracked >= head:
            return tracked
        if not appended_here:
            self._check_chained(cursor, tracked, head)
        pages = batched(self.store.read_log(tracked, head), PAGE, kept_size, PAGE_BYTES)
        progress = Progress(tracked)
        while progress.position < head:
            before = progress.position
            page = next(pages, [])
            # What the page names, loaded at once where a load is a round trip
            # (PostgreSQL): one by one, 10,000 nodes cost a second each 1,500.
            try:
                self.store.preload(cursor, self.sql, self.cluster, events_of(page), ids=False)
            except (TypeError, LookupError, AttributeError):
                if all(stored_problem(kept.state) is None for kept in page):
                    raise  # nothing is wrong with the page's events: a failure of its own
                # an event edited in the log: the replay below names it
            try:
                replay_log(self.cluster, page, progress)
            except Refused as refused:
                raise TablesDisagree(refused, tracked) from None
            self.store.write_rows(cursor, self.sql, changed_rows(self.cluster.take_changes()))
            if progress.position == before:  # nothing applied is ever tracked as applied
                raise LogEndsEarly(before, head)
        self.store.track(cursor, head)
        self.cluster.forget()
        return head

    def _check_chained(self, cursor: Any, tracked: int, head: int) -> None:
        """The ledger appends each event with its chain hash, and each append
        chains on the hash of the head before it: so a head without one, and
        every event after the last hashed, was written by something else."""
        if self.store.hash_at(cursor, head) is not None:
            return
        cursor.execute(
            f"SELECT MAX(position) FROM event_hashes WHERE position <= {self.store.param}",
            (head,),
        )
        raise Unchained(max(cursor.fetchone()[0] or 0, tracked) + 1)


def kept_size(stored: LoggedEvent) -> int:
    return len(stored.state)


def events_of(page: list[LoggedEvent]) -> list[dict[str, Any]]:
    """The events a page of the log holds, as far as they read as events;
    one that does not is left for the replay to name (``Unreadable``)."""
    events = []
    for _, _, data in page:
        try:
            event = orjson.loads(data)["event"]
        except (ValueError, LookupError, TypeError):
            continue
        if isinstance(event, dict) and isinstance(event.get("type"), str):
            events.append(event)
    return events
