"""PostgreSQL: the log as a store reads and appends to it: its head with
its chain hash, the batch's entities and client ids preloaded, what is kept
and tracked, pages of it, and a session of its own that hears of appends."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from uuid import UUID

import psycopg
from eventsourcing.persistence import PersistenceError, Tracking
from psycopg import sql
from psycopg.rows import dict_row

from ledger import postgres_writes
from ledger.errors import StoreUnavailable
from ledger.postgres_errors import describe
from ledger.postgres_preload import (
    ALLOCS_ONLY,
    KNOWN_IDS,
    Named,
    Preload,
    known_ids,
    named_by,
    not_cached,
)
from ledger.postgres_schema import TRACKING
from ledger.postgres_transactions import PostgresTransactions
from ledger.store import PAGE, PAGE_BYTES, PROJECTIONS, REPAIRS, LoggedEvent, logged
from projections.rows import ChangedRows, Statements

# The head of the log with its chain hash; the same with the count of repairs.
HEAD = ("SELECT last, (SELECT hash FROM event_hashes WHERE position = last) FROM "
        "(SELECT MAX(originator_version) AS last FROM stored_events "
        "WHERE originator_id = %s) head")
HEAD_AND_REPAIRS = HEAD.replace(
    " FROM (", f", (SELECT notification_id FROM {TRACKING} WHERE application_name = %s), "
    f"(SELECT MAX(notification_id) FROM {TRACKING} WHERE application_name = %s) FROM (", 1)
# A page of the log: ``PAGE`` events, or fewer: up to the one at which their
# stored bytes reach ``PAGE_BYTES``. The page's sizes are summed first, and
# only a page that comes to the budget has its running sums taken (a window
# over positions and sizes: one over the states as well copied each, and
# read ordinary pages a third slower); ``octet_length`` of a state stored out
# of line reads its size, not its bytes. The events past the cut are never
# sent (psycopg's cursor takes a whole result at once). A state set to NULL
# by hand reads as no bytes, which verify names.
_PAGE_SIZES = (
    "SELECT originator_version, COALESCE(pg_catalog.octet_length(state), 0) AS size FROM "
    "stored_events "
    "WHERE originator_id = %(stream)s AND originator_version > %(after)s "
    "AND originator_version <= %(upto)s ORDER BY originator_version LIMIT %(page)s")
LOG_PAGE = (
    "SELECT originator_version, topic, COALESCE(state, ''::bytea) FROM stored_events "
    "WHERE originator_id = %(stream)s AND originator_version > %(after)s "
    "AND originator_version <= (SELECT CASE WHEN COALESCE(pg_catalog.sum(size), 0) < %(bytes)s "
    "THEN %(upto)s "
    "ELSE (SELECT pg_catalog.min(originator_version) FROM (SELECT originator_version, "
    "pg_catalog.sum(size) OVER "
    f"(ORDER BY originator_version ROWS UNBOUNDED PRECEDING) AS upto FROM ({_PAGE_SIZES}) page) "
    f"sizes WHERE upto >= %(bytes)s) END FROM ({_PAGE_SIZES}) page) "
    "ORDER BY originator_version LIMIT %(page)s")


class PostgresLog(PostgresTransactions):
    """The log's reads and appends, inside this thread's transaction
    (``PostgresTransactions``), and the appends others make."""

    stream: UUID
    _preload: Preload

    def preload(
        self, cursor: Any, statements: Statements, cluster: Any, batch: list[dict[str, Any]],
        ids: bool = True,
    ) -> None:
        """Load every entity a batch names into the cluster's caches, and the
        batch's known client ids for ``known_ids`` (``ids``): one round trip in all."""
        named = not_cached(cluster, named_by(batch))
        if not ids:
            named.ids = []
        sent = self._preload.send(cursor, statements.prefix, named)
        if ids:
            self._local.ids = (named.ids, sent)
        self._preload.fill(cluster, named, sent)

    def load_nodes(
        self, cursor: Any, statements: Statements, cluster: Any, nodes: set[str]
    ) -> None:
        """Nodes with their slot tables, live allocations and children, then
        those allocations with their addresses: two round trips."""
        named = not_cached(cluster, Named(set(nodes), set(), set(), []))
        self._preload.fill(cluster, named, self._preload.send(cursor, statements.prefix, named))
        allocs = {a for n in nodes for a in cluster.live.get(n, ())} - cluster.allocs.keys()
        if allocs:
            named = Named(set(), allocs, set(), [])
            sent = self._preload.send(cursor, statements.prefix, named, ALLOCS_ONLY)
            self._preload.fill(cluster, named, sent)

    def head(self, cursor: Any) -> int:
        """The last position, read together with its chain hash (the next append
        needs it); the log's tables alone (a role may read only those: an auditor's)."""
        return self._read_head(cursor, HEAD, (self.stream,))[0]

    def head_and_repairs(self, cursor: Any) -> tuple[int, int, int]:
        """``head``, the count of repairs and the position the projection
        tables have applied, in the same round trip (a writer's)."""
        head, repairs, applied = self._read_head(
            cursor, HEAD_AND_REPAIRS, (REPAIRS, PROJECTIONS, self.stream))
        return head, int(repairs or 0), int(applied or 0)

    def _read_head(self, cursor: Any, query: str, params: tuple[Any, ...]) -> list[Any]:
        """The head (kept with its chain hash for the next append), then what
        else ``query`` reads beside them."""
        cursor.execute(query, params)
        last, chain_hash, *more = cursor.fetchone()
        self._local.last = (last or 0, chain_hash)
        return [int(last or 0), *more]

    def write_kept(
        self, cursor: Any, sql: Any, events: list[LoggedEvent], hashes: list[tuple[int, str]],
        ids: list[tuple[str, int]], changed: ChangedRows,
    ) -> None:
        """In one statement (``postgres_writes.write_kept``)."""
        postgres_writes.write_kept(
            cursor, sql.prefix, self.recorder, self.stream, events, hashes, ids, changed)
        self._local.last = None

    def hash_at(self, cursor: Any, position: int) -> str | None:
        last = getattr(self._local, "last", None)
        if last is not None and last[0] == position:
            return None if last[1] is None else str(last[1])
        cursor.execute("SELECT hash FROM event_hashes WHERE position = %s", (position,))
        row = cursor.fetchone()
        return None if row is None else str(row[0])

    def known_end(self, cursor: Any) -> tuple[int, int]:
        cursor.execute("SELECT (SELECT MAX(position) FROM event_hashes), "
                       f"pg_catalog.has_table_privilege('{TRACKING}', 'SELECT')")
        chained, readable = cursor.fetchone()
        return chained or 0, self.tracked(cursor) if readable else 0

    def tracked(self, cursor: Any) -> int:
        curs = cursor.connection.cursor(row_factory=dict_row)  # as the library's pool gives
        return self.recorder._max_tracking_id(PROJECTIONS, curs) or 0

    def track(self, cursor: Any, position: int) -> None:
        self.recorder._insert_tracking(cursor.connection.cursor(), Tracking(PROJECTIONS, position))

    def set_tracked(self, cursor: Any, position: int) -> None:
        cursor.execute(f"UPDATE {TRACKING} SET notification_id = %s WHERE application_name = %s",
                       (position, PROJECTIONS))

    def known_ids(self, cursor: Any, ids: list[str]) -> dict[str, int]:
        preloaded, self._local.ids = getattr(self._local, "ids", None), None
        if preloaded is not None and preloaded[0] == ids:
            return known_ids(preloaded[1])
        if not ids:
            return {}
        cursor.execute(KNOWN_IDS, (ids,))
        return {row[0]: row[1] for row in cursor.fetchall()}

    def kept_at(self, cursor: Any, positions: list[int]) -> list[LoggedEvent]:
        cursor.execute(
            "SELECT originator_version, topic, COALESCE(state, ''::bytea) FROM stored_events "
            "WHERE originator_id = %s AND originator_version = ANY(%s::bigint[]) ORDER BY originator_version",
            (self.stream, positions),
        )
        return [logged((row[0], row[1], bytes(row[2]))) for row in cursor.fetchall()]

    def write_rows(self, cursor: Any, sql: Any, changed: ChangedRows) -> None:
        postgres_writes.write_rows(cursor, sql.prefix, changed)

    def read_log(self, after: int, upto: int | None = None) -> Iterator[LoggedEvent]:
        """Pages of the log (``LOG_PAGE``); inside a transaction of this store,
        through that transaction (so a writer projecting inline sees what it
        just appended)."""
        while upto is None or after < upto:
            page = self._page(after, upto)
            yield from page
            if len(page) < PAGE and sum(len(stored.state) for stored in page) < PAGE_BYTES:
                return  # not ended by its count or its bytes: the log ends there
            after = page[-1].originator_version
            del page  # not held while the next is read

    def _page(self, after: int, upto: int | None) -> list[LoggedEvent]:
        cursor = getattr(self._local, "cursor", None)
        if cursor is None:
            with self.reading():  # a page in a transaction of its own
                return self._page(after, upto)
        try:
            cursor.execute(LOG_PAGE, {
                "stream": self.stream, "after": after, "upto": upto if upto is not None else 2**62,
                "page": PAGE, "bytes": PAGE_BYTES,
            })
            return [logged((row[0], row[1], bytes(row[2]))) for row in cursor.fetchall()]
        except (psycopg.Error, PersistenceError) as error:
            raise StoreUnavailable(f"store {self.shown}: {describe(error)}") from None

    def search_log(
        self, cursor: Any, needle: str, after: int, upto: int, limit: int
    ) -> list[tuple[int, int]]:
        cursor.execute(
            "SELECT originator_version, pg_catalog.octet_length(state) FROM stored_events "
            "WHERE originator_id = %s AND originator_version > %s AND originator_version <= %s "
            "AND position(%s::bytea IN state) > 0 ORDER BY originator_version LIMIT %s",
            (self.stream, max(after, 0), upto, needle.encode(), limit),  # (before 1: not the log's)
        )
        return [(row[0], row[1]) for row in cursor.fetchall()]

    @contextmanager
    def appends(self) -> Iterator[Callable[[float], bool]]:
        """Listen for appends (the recorder NOTIFYs on every insert); yield a
        ``wait(timeout)`` that returns whether something was appended."""
        channel = self.recorder.channel_name
        connection = self._connect(5, self._named("follower"))
        try:
            try:
                connection.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
            except psycopg.Error as error:
                raise StoreUnavailable(f"store {self.shown}: {describe(error)}") from None

            def wait(timeout: float) -> bool:
                try:
                    heard = False
                    for _ in connection.notifies(timeout=timeout, stop_after=1):
                        heard = True
                    return heard
                except psycopg.Error as error:
                    raise StoreUnavailable(f"store {self.shown}: {describe(error)}") from None

            yield wait
        finally:
            connection.close()
