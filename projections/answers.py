"""Answers to the questions of SPEC section 3, from the live projection
tables or from history replayed as of a point: what ``alloc-ledger query``
prints, for Python code too.

On SQLite the live tables are always up to date. On PostgreSQL they are as
far as ``project --follow`` (or inline projection) has brought them:
``wait`` catches them up first, and ``behind`` says how far they lag.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing, contextmanager
from datetime import UTC, datetime
from typing import Any

from ledger.errors import LedgerError, LogEndsEarly
from ledger.model import timestamp
from ledger.store import Store, open_store
from projections.asof import AsOf, head_within, moment_of, state_at
from projections.projector import Projector
from projections.queries import Queries


class NotInLedger(LedgerError):
    """A name a filter asks for (a node, a job) that the
    ledger never held at the point asked: a mistyped name must not read as
    "nothing wrong"."""


class Answers:
    """The questions asked of one state of the ledger; every answer is a
    list of plain dicts (``alloc``: one dict), in the command line's order."""

    def __init__(
        self, queries: Queries, position: int | None = None, moment: str | None = None,
        behind: int = 0,
    ) -> None:
        self.queries = queries
        # The position answered as of: None for live tables that are current.
        self.position = position
        self.moment = moment  # the point's time, for --as-of (None: now)
        self.behind = behind  # positions the live tables lag behind the log

    def needs_reconnect(self, now: str | None = None) -> list[dict[str, Any]]:
        """``expired`` judged at ``now`` (an RFC 3339 time); by default at
        the point's time, else the current time."""
        judged = moment_of(now, "now") if now is not None else self.moment
        return self.queries.needs_reconnect(judged or timestamp(datetime.now(UTC)))

    def zombie_slots(self) -> list[dict[str, Any]]:
        return self.queries.zombie_slots()

    def slots(self, node: str | None = None) -> list[dict[str, Any]]:
        found = self.queries.slots(node)
        if not found:
            self._known(node=node)
        return found

    def nodes(self) -> list[dict[str, Any]]:
        return self.queries.nodes()

    def allocs(
        self, node: str | None = None, job: str | None = None, status: str | None = None
    ) -> list[dict[str, Any]]:
        found = self.queries.allocs(node, job, status)
        if not found:
            self._known(node=node, job=job)
        return found

    def alloc(self, alloc: str) -> dict[str, Any] | None:
        """One allocation with its alloc states (None: not in the ledger)."""
        return self.queries.alloc(alloc)

    def addresses(self) -> list[dict[str, Any]]:
        return self.queries.addresses()

    def suspects(self) -> list[dict[str, Any]]:
        return self.queries.suspects()

    def rejections(self) -> list[dict[str, Any]]:
        return self.queries.rejections()

    def _known(self, node: str | None = None, job: str | None = None) -> None:
        """A filter naming what the ledger never held is an error, not a
        quiet empty answer."""
        if node is not None and not self.queries.has_node(node):
            raise NotInLedger(f"node {node} is not in the ledger{self._when()}")
        if job is not None and not self.queries.has_job(job):
            raise NotInLedger(f"no allocation of job {job} is in the ledger{self._when()}")

    def _when(self) -> str:
        return "" if self.position is None else f" at position {self.position}"


@contextmanager
def answering(store: Store, point: AsOf | None = None, wait: bool = False) -> Iterator[Answers]:
    """Answers from the live tables, or (``point``) from history replayed
    into scratch tables, which are dropped after."""
    if point is not None:
        head_within(store, point.position, "--as-of")
        state = state_at(store, point)
        with closing(state.connection):
            yield Answers(Queries(state.connection.cursor()), state.position, state.moment)
        return
    if wait or store.state_prefix == "":
        # bounded: a follower stopped inside its transaction holds the tables
        Projector(store).update(waits=store.lock_wait)
    with store.reading() as cursor:
        head, tracked = store.head(cursor), store.tracked(cursor)
        if tracked > head:  # as a catch-up refuses them (SQLite's, ``wait``'s)
            raise LogEndsEarly(head, tracked, "applied")
        # "not in the ledger" is then said of the tables' position, not of the log's
        yield Answers(Queries.of(store, cursor), tracked if head > tracked else None,
                      behind=head - tracked)


@contextmanager
def ask(
    url: str | None = None, as_of: int | str | None = None, wait: bool = False
) -> Iterator[Answers]:
    """The answers of the ledger at ``url`` (as ``Ledger.open`` takes it),
    live or ``as_of`` a position or an RFC 3339 time (as ``--as-of`` takes
    them)."""
    point = None if as_of is None else AsOf.parse(str(as_of), "as_of")
    with closing(open_store(url, create=False)) as store, answering(store, point, wait) as found:
        yield found
