"""PostgreSQL: the store's transactions, each taking its locks in one
order before anything else (a writer's: the log's EXCLUSIVE lock; a
projector's: the tracking row, never the log), waiting for a lock a bounded
time, and telling what a lost one means for a batch."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from functools import partial
from typing import TYPE_CHECKING, Any

import psycopg
from eventsourcing.persistence import PersistenceError
from psycopg.rows import tuple_row

from ledger.errors import LockWaitedOut, RelationsBusy, StoreUnavailable
from ledger.postgres_connections import PostgresConnections
from ledger.postgres_errors import describe
from ledger.postgres_handoff import TRACKING_HELD, connection_lost, waited_for_tracking
from ledger.postgres_pipeline import _Pipelined
from ledger.postgres_schema import TRACKING
from ledger.store import PROJECTIONS

if TYPE_CHECKING:
    from ledger.postgres_handoff import Handoff
    from ledger.postgres_writes import LogRecorder

# Writers and the projector look rows up by key only, in tables that are young
# and often not yet analyzed: a planner without statistics reads a whole table
# for an IN list of a few hundred keys (every batch, under the log's lock).
# A scan that must read a whole table (the handoff) then costs 1e10 in the
# plan, which would make the server JIT-compile it (~170 ms): no JIT.
# A batch's rows (a function scan the planner guesses at 100 rows) join a
# table by key: by looking each key up, not by hashing or merging the whole
# table, which the planner picks once the table is a few hundred rows.
KEYS_ONLY = (
    "SELECT pg_catalog.set_config('enable_seqscan', 'off', true), pg_catalog.set_config('jit', "
    "'off', true), "
    "pg_catalog.set_config('enable_hashjoin', 'off', true), "
    "pg_catalog.set_config('enable_mergejoin', 'off', true)"
)
# A write transaction's limits: how long it waits for a lock (the log's, a
# row's), and how long the server lets its client stall idle in it (the
# lease): a writer or leader stopped (SIGSTOP, a machine cut off) while it
# holds the log's lock loses it, and no one waits for a lock unbounded.
BOUNDED = (
    f"{KEYS_ONLY}, pg_catalog.set_config('lock_timeout', %s, true), "
    "pg_catalog.set_config('idle_in_transaction_session_timeout', %s, true)"
)

SET_LOCK_TIMEOUT = "SELECT pg_catalog.set_config('lock_timeout', %s, true)"
# How long a repair, holding the log's lock, waits for a lock another session
# holds on a table or view it makes again, before it lets the log go.
BRIEF_LOCK = 0.2


def _ms(seconds: float) -> str:
    return f"{max(1, round(seconds * 1000))}ms"


class PostgresTransactions(PostgresConnections):
    """A store's transactions (``writing``, ``projecting``, ``repairing``,
    ``reading``, ``combining``) on its pool or a connection given, with this
    thread's cursor and transaction kept for the log's reads."""

    handoff: Handoff
    recorder: LogRecorder
    projects_inline: bool
    _local: threading.local

    @property
    def lock_wait(self) -> float:
        """How long a command waits for a lock another holds (the URL's ``timeout``)."""
        return self.handoff.timeout

    @contextmanager
    def _transaction(
        self, prepare: Callable[[Any], None], pipelined: bool = False,
        given: psycopg.Connection[Any] | None = None, waits: float | None = None,
        commits_batch: bool = False, holder: str = "",
    ) -> Iterator[Any]:
        """One transaction on a pooled connection (or the one given); ``pipelined``:
        statements whose results are not read are sent without waiting (psycopg
        pipeline mode), so a write transaction costs a round trip per read, not
        per statement. ``waits``: the seconds ``prepare`` lets it wait for a lock
        (whose ``holder`` is most likely another projector's, or else a writer's).
        ``commits_batch``: a writer's batch is kept by its COMMIT, so a
        connection lost once the COMMIT is sent leaves it unknown whether it was."""
        transaction: Any = None
        try:
            with (
                nullcontext(given) if given else self.datastore.get_connection()
            ) as connection, (
                _Pipelined.begin(connection) if pipelined else connection.transaction()
            ) as transaction:
                cursor = connection.cursor(row_factory=tuple_row)
                prepare(cursor)
                self._local.cursor = cursor
                self._local.transaction = transaction
                try:
                    yield cursor
                finally:
                    self._local.cursor = None
                    self._local.transaction = None
                    self._local.last = None
                    self._local.ids = None
        except (psycopg.Error, PersistenceError) as error:  # the cause kept: see lost_lead
            cause = error.__cause__ if isinstance(error, PersistenceError) else error
            if isinstance(cause, psycopg.errors.LockNotAvailable):  # ``lock_timeout``
                held = (f"the projection tables', most likely: a {holder} transaction holds "
                        "them, maybe stopped or stuck" if holder else TRACKING_HELD
                        if waited_for_tracking(cause) else
                        "the log's, most likely: its holder may be a writer stopped or cut off")
                raise LockWaitedOut(
                    f"store {self.shown}: gave up waiting for a lock after {waits or 0:g} s "
                    f"({held}); nothing of this transaction was written"
                ) from cause
            if commits_batch and isinstance(transaction, _Pipelined) and (
                transaction.committed and connection_lost(cause)
            ):  # the server may have committed before the connection went
                raise StoreUnavailable(
                    f"store {self.shown}: {describe(error)} (after its COMMIT was sent: the "
                    "batch's events may or may not be kept)"
                ) from error
            raise StoreUnavailable(f"store {self.shown}: {describe(error)}") from error

    def writing(self) -> Any:
        """A write transaction: the log's EXCLUSIVE lock first, then everything
        else; it waits for a lock at most the store's ``timeout``."""
        timeout = self.handoff.timeout
        return self._transaction(
            partial(self._lock_log, timeout), pipelined=True, waits=timeout, commits_batch=True)

    def projecting(self, waits: float | None = None) -> Any:
        """A transaction for the projection tables: the tracking row locked, never
        the log; waiting for another projector at most ``waits`` seconds."""
        if waits is None:
            return self._transaction(self._track_by_key, pipelined=True)
        return self._transaction(
            partial(self._track_within, waits), pipelined=True, waits=waits, holder="projector's")

    def repairing(self) -> Any:
        """A write transaction holding the log's lock, then the tracking row's
        (in the order an inline writer takes them): no writer appends and no
        follower catches up until it ends."""
        timeout = self.handoff.timeout  # not pipelined: it reads as it goes
        return self._transaction(partial(self._lock_all, timeout), waits=timeout)

    def _lock_all(self, waits: float, cursor: Any) -> None:
        self._bounded(waits, cursor)
        self.lock_log(cursor, tracking=True)

    def reading(self) -> Any:
        """A read-only transaction with one snapshot."""
        return self._transaction(self._snapshot)

    def combining(self, connection: psycopg.Connection[Any]) -> Any:
        """A write transaction on a connection of the leader's own
        (``connect(idle=...)``) that takes the log's lock only when
        asked (``lock_log``): a leader takes batches and decides them first.
        It waits for a lock no longer than the lead lasts unrenewed (the lease)."""
        lease = self.handoff.lease
        return self._transaction(
            partial(self._bounded, lease), pipelined=True, given=connection, waits=lease)

    def send_commit(self) -> None:
        """Send the COMMIT of this thread's combining transaction now: the
        server commits as soon as it arrives, while the thread that ends
        the transaction (the leader's committer) waits for its answer."""
        transaction = getattr(self._local, "transaction", None)
        if isinstance(transaction, _Pipelined):
            transaction.commit()

    def _lock_log(self, waits: float, cursor: Any) -> None:
        self._bounded(waits, cursor)
        self.lock_log(cursor)

    def _bounded(self, waits: float, cursor: Any) -> None:
        """Keys only; a lock waited for at most ``waits`` seconds; the session
        ended by the server when its client stalls longer than the lease."""
        cursor.execute(BOUNDED, (_ms(waits), _ms(self.handoff.lease)))

    def lock_log(self, cursor: Any, tracking: bool | None = None) -> None:
        """The log's EXCLUSIVE lock (the recorder's), and the tracking row's when
        the projections follow inline (``tracking``; by default as this store's
        URL says). How long it waits is the transaction's ``lock_timeout``."""
        cursor.connection.cursor().execute(self.recorder.lock_statement, prepare=True)
        if self.projects_inline if tracking is None else tracking:
            self._lock_tracking(cursor)

    @staticmethod
    def _keys_only(cursor: Any) -> None:
        cursor.execute(KEYS_ONLY)

    def _lock_tracking(self, cursor: Any) -> None:
        cursor.execute(
            f"SELECT notification_id FROM {TRACKING} WHERE application_name = %s FOR UPDATE",
            (PROJECTIONS,),
        )

    def _track_by_key(self, cursor: Any) -> None:
        self._keys_only(cursor)
        self._lock_tracking(cursor)

    def _track_within(self, waits: float, cursor: Any) -> None:
        self._bounded(waits, cursor)
        self._lock_tracking(cursor)

    @staticmethod
    def _snapshot(cursor: Any) -> None:
        cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")

    @contextmanager
    def changing(self, cursor: Any) -> Iterator[None]:
        """Relations made again while this transaction holds the log's lock
        (a repair): a lock a reader holds on one (a reporting tool idle in
        its transaction) is waited for ``BRIEF_LOCK`` seconds, then
        ``RelationsBusy``: the caller lets the log's lock go, so writers are
        not held up behind a reader, and tries again."""
        cursor.execute(SET_LOCK_TIMEOUT, (_ms(BRIEF_LOCK),))
        try:
            yield
        except psycopg.errors.LockNotAvailable as error:
            raise RelationsBusy(f"store {self.shown}: a projection table or view is "
                                "locked by another session") from error
        cursor.execute(SET_LOCK_TIMEOUT, (_ms(self.lock_wait),))
