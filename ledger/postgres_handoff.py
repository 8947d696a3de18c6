"""PostgreSQL writers hand their batches to one leader, which decides them all.

Serializing writers on the log's lock makes every writer wait through every
other writer's whole transaction (preload, deciding, writes, commit), so the
wait grows with the number of writers. Here writers combine instead:

* A writer hands its validated batch over with one INSERT into ``handoff``,
  an UNLOGGED table (no disk flush), which NOTIFYs the leader.
* Every writer process keeps a standby thread trying for an advisory lock,
  held in a transaction on a *lease* connection; the thread that holds it
  leads. In one transaction it takes the batches handed over, oldest first
  and at most ``ROUND_BYTES`` of them (one at least; the rest wait for the
  next round), decides them in that order against its own cache, takes the
  log's EXCLUSIVE lock, appends them, and commits (one flush for all). The
  cache stays valid while it leads; a writer with ``?writers=lock`` that
  appends meanwhile is seen by the head under the lock, and the round is
  decided again. Each writer's receipts go to its own NOTIFY channel, which
  delivers them when the round commits: in the notification when they fit,
  else in ``outcomes`` (UNLOGGED), where the notification tells it to look.
* Rounds overlap: while one round's writes and commit run on the server, the
  leader takes the next round's batches on a second connection and decides
  them against its cache (which already holds everything the committing
  round changed; what it loads, no round in flight changed). It takes the
  log's lock, and writes, only once the previous round has committed; if that
  commit failed, the next round rolls back too and its batches go back.
* A writer reads its receipts only after that commit, so an acknowledged
  event is durable. If the leader's process dies, its transaction rolls back
  (the batches go back into ``handoff``), its lock is released and another
  standby leads at once. If it stops (SIGSTOP, a machine cut off), the
  server ends its lease after ``timeout``/3 idle (the *lease*), and its
  round too: a round reads through a Sync, so the server waits for it idle
  in its transaction (``ledger.postgres_pipeline.SyncingCursor``). Where it
  stopped between two statements, which PostgreSQL 15 does not time, the
  next leader or a writer waiting for it ends it (``STALLED``). Either way
  its batches go back, for the next leader. A batch whose writer's session
  has ended before a leader took it is dropped, not decided later on behalf
  of no one.

Positions stay one gapless order: every round appends under the log's
EXCLUSIVE lock, after the head it was decided against. No one waits for a
lock unbounded: a round waits for the log's at most the lease (its lead is
gone by then), and a writer takes its batch back only if no round holds it
(``WITHDRAW``). A writer that hears nothing within the store's ``timeout``
withdraws its batch if it is still waiting (nothing of it was written) and
reports the store unavailable; one whose batch a round holds waits once
more as long for the answer. Nor does a writer wait unbounded for a server
that stops answering (``Watchdog``).
"""

from __future__ import annotations

import itertools
import os
import re
import socket
import sys
import threading
import time
import uuid
import zlib
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack, contextmanager, suppress
from typing import TYPE_CHECKING, Any

import orjson
import psycopg
from psycopg import sql

from ledger.batches import BATCH_BYTES
from ledger.errors import InvalidEvent, StoreUnavailable
from ledger.events import received
from ledger.model import Event, Receipt
from ledger.store import Decider

if TYPE_CHECKING:
    from ledger.postgres_store import PostgresStore

TABLES = [  # created with the schema (PostgresStore)
    """CREATE UNLOGGED TABLE IF NOT EXISTS handoff (
        id BIGSERIAL PRIMARY KEY, batch TEXT NOT NULL, events BYTEA NOT NULL,
        pid INTEGER NOT NULL, started TIMESTAMPTZ)""",
    # schema 3: whether the batch's writer keeps the projections inline
    "ALTER TABLE handoff ADD COLUMN IF NOT EXISTS inline BOOLEAN NOT NULL DEFAULT false",
    """CREATE UNLOGGED TABLE IF NOT EXISTS outcomes (
        batch TEXT PRIMARY KEY, receipts BYTEA NOT NULL,
        decided_at TIMESTAMPTZ NOT NULL DEFAULT pg_catalog.now())""",
    "CREATE INDEX IF NOT EXISTS outcomes_decided_at ON outcomes (decided_at)",
]
# A batch names the session that handed it over; a batch whose writer has
# gone (killed before it was taken: no such pid, or the pid of a later
# session) is dropped, never decided later. ``backend_start`` is hidden from
# roles without the privilege to see another role's sessions: a batch whose
# start is not visible counts as its writer's.
HAND = (
    "WITH handed AS (INSERT INTO handoff (batch, events, inline, pid, started) "
    "SELECT %s, %s, %s, pid, backend_start FROM "
    "pg_catalog.pg_stat_get_activity(pg_catalog.pg_backend_pid()) "
    "RETURNING 1) SELECT pg_catalog.pg_notify(%s, '') FROM handed"
)
# A round takes the oldest batches waiting whose handed-over events hold at
# most ``ROUND_BYTES`` (the oldest alone when it holds more), in order: a
# running sum of their sizes, read without their events, so that batches past
# the budget are neither locked nor fetched; they wait for the next round.
# Batches the round still committing took (``committing``: those it drops
# too, their writer gone, which come back without their events) are locked:
# they are left out of the sum, and the lock skips them (and those that
# another session holds: a writer taking its batch back).
TAKE = (
    "WITH waiting AS (SELECT id, pg_catalog.row_number() OVER w AS nth, "
    "pg_catalog.sum(pg_catalog.octet_length(events)) OVER w AS held FROM handoff "
    "WHERE id <> ALL(%(committing)s::bigint[]) "
    "WINDOW w AS (ORDER BY id ROWS UNBOUNDED PRECEDING)), "
    "taken AS (DELETE FROM handoff WHERE id IN (SELECT id FROM handoff WHERE id IN "
    "(SELECT id FROM waiting WHERE nth = 1 OR held <= %(budget)s) FOR UPDATE SKIP LOCKED) "
    "RETURNING id, batch, events, inline, pid, started) "
    "SELECT id, batch, CASE WHEN alive THEN events END, pid, inline, alive FROM ("
    "SELECT t.*, a.pid IS NOT NULL AND (a.backend_start IS NULL OR t.started IS NULL "
    "OR a.backend_start = t.started) "
    # handed over to this ledger, not restored from a dump of another (``home_key``)
    "AND (a.datid IS NULL OR a.datid = (SELECT oid FROM pg_catalog.pg_database "
    "WHERE datname = pg_catalog.current_database())) "
    "AND (pg_catalog.substr(t.batch, 13, 1) <> '0' "
    "OR pg_catalog.substr(t.batch, 1, 8) = %(home)s) AS alive FROM taken t "
    "LEFT JOIN pg_catalog.pg_stat_get_activity(NULL) a ON a.pid = t.pid) t ORDER BY id"
)
# The events a round takes, in bytes of their JSON as handed over: a leader
# holds a round several times over while it decides and writes it (and the
# next round while this one commits), so taking every batch waiting grew with
# the writers, each batch up to ``BATCH_BYTES`` of input.
ROUND_BYTES = BATCH_BYTES
ANY_HANDED = "SELECT EXISTS (SELECT 1 FROM handoff)"
# What the server answers a value it cannot take (a text where a number goes,
# a key too long for its index): a batch no writer makes, to look for.
BATCH_ERRORS = (psycopg.errors.DataError, psycopg.errors.ProgramLimitExceeded)
# Receipts go to each writer's own channel, in the notification itself when
# they fit (a notification carries at most 8000 bytes), else in ``outcomes``.
GIVE = (
    "INSERT INTO outcomes (batch, receipts) "
    "SELECT * FROM ROWS FROM (pg_catalog.unnest(%s::text[]), pg_catalog.unnest(%s::bytea[]))"
)
TELL = ("SELECT pg_catalog.pg_notify(c, p) FROM "
        "ROWS FROM (pg_catalog.unnest(%s::text[]), pg_catalog.unnest(%s::text[])) t(c, p)")
# Receipts of writers that died before reading them.
PURGE = "DELETE FROM outcomes WHERE decided_at < pg_catalog.now() - interval '1 hour'"
PURGE_EVERY = 1000  # rounds
POLL = 0.05  # seconds a writer or an idle leader waits for a notification before looking
RENEW = 0.5  # seconds between a leader's renewals of its lease
PAYLOAD = 7900  # bytes of receipts a notification carries, else they are in ``outcomes``
# The lead: an advisory lock in the two-int form, this number and the schema's
# OID (see ``ledger.postgres_schema.SCHEMA_LOCK``), apart from every other
# schema's. Earlier releases took a one-bigint key, a hash of the schema's
# name, which two schemas could share (and then one of them had no leader):
# a leader of theirs and one of this release may lead at once, which is safe
# (each round decides under the log's lock, after the head it read, as a lock
# writer does; batches are taken SKIP LOCKED, answers go to the writer's
# channel, whose name is unchanged), only slower.
LEADER_LOCK = -1562185270  # crc32("alloc-ledger:leader") as a signed int4
RESTARTS = 3  # times a writer stands by again, while it waits, after its own leader lost the lead
# The server ended the session (idle in a transaction past the lease, an
# administrator, a restart) or the connection broke (no SQLSTATE), or a round
# waited for the log's lock as long as the lease (55P03: the lease, not
# renewed meanwhile, is gone too): the lead is lost, not the batch, which went
# back to ``handoff`` with the round.
LEAD_LOST = ("25P03", "57P01", "57P02", "55P03")
# A writer takes its batch back only if no round holds it: one that does (it
# may be stopped) is waited for as the leader's answer, never as a lock.
WITHDRAW = (
    "DELETE FROM handoff WHERE id IN "
    "(SELECT id FROM handoff WHERE batch = %s FOR UPDATE SKIP LOCKED) RETURNING 1"
)
# Sessions that hold the log's lock, or batches taken from ``handoff``, in
# the middle of a transaction whose client has sent nothing for longer than
# the lease while the server waits for it *active* (ClientRead): between two
# statements of a pipeline, where PostgreSQL 15 runs no timer (see
# ``ledger.postgres_pipeline.SyncingCursor``). A leader or writer stopped or cut
# off there: whoever waits for it ends it, as the server ends one stopped
# idle in its transaction.
STALLED = (
    "SELECT DISTINCT a.pid FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
    "WHERE l.granted AND l.database = (SELECT oid FROM pg_database "
    "WHERE datname = pg_catalog.current_database()) "
    "AND ((l.relation = 'stored_events'::regclass AND l.mode = 'ExclusiveLock') "
    "OR (l.relation = 'handoff'::regclass AND l.mode = 'RowExclusiveLock')) "
    "AND a.state = 'active' AND a.wait_event = 'ClientRead' AND a.pid <> "
    "pg_catalog.pg_backend_pid() "
    "AND a.state_change < pg_catalog.now() - pg_catalog.make_interval(secs => %s)"
)


class Unanswered(psycopg.OperationalError):
    """The server did not answer a writer's statement in time (``Watchdog``)."""


class Watchdog:
    """Bounds how long the server may take to answer a writer's statement
    (``within``). A server that stops answering (frozen, or cut off without
    a reset) would keep a writer waiting until it answers again or TCP gives
    up: past the bound, the connection's socket is shut down (the connection
    object is left to its thread), and the statement fails as ``Unanswered``.
    One thread for every bound, started when first needed, and woken only
    when a bound comes before the one it sleeps towards (or it has none):
    a later one it finds when it wakes, so most statements do not pay for a
    thread switch."""

    def __init__(self) -> None:
        self.changed = threading.Condition()
        self.armed: tuple[float, int] | None = None  # (deadline, socket)
        self.fired = False
        self.closed = False
        self.until: float | None = None  # what the thread sleeps towards (None: no bound)
        self.thread: threading.Thread | None = None

    @contextmanager
    def within(self, connection: psycopg.Connection[Any], seconds: float) -> Iterator[None]:
        with self.changed:
            if self.thread is None:
                self.thread = threading.Thread(
                    target=self._watch, name="alloc-ledger-watchdog", daemon=True)
                self.thread.start()
            deadline = time.monotonic() + seconds
            self.armed, self.fired = (deadline, connection.fileno()), False
            if self.until is None or deadline < self.until:
                self.changed.notify()
        try:
            yield
        except BaseException as error:
            if self._disarm() and isinstance(error, psycopg.Error):
                raise Unanswered(f"the server did not answer within {seconds:g} s") from error
            raise
        if self._disarm():  # answered as the bound ran out: the connection is gone all the same
            raise Unanswered(f"the server did not answer within {seconds:g} s")

    def _disarm(self) -> bool:
        """Whether the bound ran out."""
        with self.changed:
            self.armed = None
            return self.fired

    def close(self) -> None:
        """Stop the thread and wait for it to end, so a closed store leaves none."""
        with self.changed:
            self.closed = True
            self.changed.notify()
            thread = self.thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)

    def _watch(self) -> None:
        with self.changed:
            while not self.closed:
                armed = self.armed
                if armed is None:
                    self.until = None
                    self.changed.wait()
                    continue
                left = armed[0] - time.monotonic()
                if left > 0:
                    self.until = armed[0]
                    self.changed.wait(left)
                    continue
                with suppress(OSError), socket.socket(fileno=os.dup(armed[1])) as sock:
                    sock.shutdown(socket.SHUT_RDWR)
                self.armed, self.fired = None, True


def end_stalled(connection: psycopg.Connection[Any], lease: float) -> None:
    """End the ``STALLED`` sessions (those this role may end: its own)."""
    for (pid,) in connection.execute(STALLED, (lease,)).fetchall():
        with suppress(psycopg.errors.InsufficientPrivilege):
            connection.execute("SELECT pg_catalog.pg_terminate_backend(%s)", (pid,))


def connection_lost(error: BaseException | None) -> bool:
    """Whether the connection broke or the server ended the session (an
    administrator, a shutdown, a crash): not an error that rolled back a
    transaction, which the server reports and carries on."""
    if not isinstance(error, psycopg.Error):
        return False
    state = error.sqlstate
    return state is None or state.startswith("08") or state in ("57P01", "57P02", "57P03")


def waited_for_tracking(error: BaseException | None) -> bool:
    """Whether a lock waited out was the projections' tracking row (held by a
    follower's transaction; taken by a writer that projects inline), not the
    log's: PostgreSQL names the relation of a row it was locking."""
    return isinstance(error, psycopg.errors.LockNotAvailable) and (
        'relation "tracking"' in (error.diag.context or ""))


TRACKING_HELD = ("the projection tables' tracking row, which a writer that projects inline "
                 "takes: a follower's transaction holds it, maybe stopped or cut off")


def lost_lead(error: BaseException) -> bool:
    """Whether a leader's failure was its session ending (or its lease running
    out waiting for the log's lock), not its work failing."""
    cause = error.__cause__ if isinstance(error, StoreUnavailable) else error
    if isinstance(cause, psycopg.OperationalError) and cause.sqlstate is None:
        return True  # the connection broke
    return isinstance(cause, psycopg.Error) and cause.sqlstate in LEAD_LOST


def _listen(connection: psycopg.Connection[Any]) -> None:
    """Wait for a batch to be handed over, at most ``POLL`` seconds."""
    for _ in connection.notifies(timeout=POLL, stop_after=1):
        pass


def _wait(committing: Future[None] | None) -> None:
    """Wait for the previous round's commit; raise its error if it failed."""
    if committing is not None:
        committing.result()


def home_of(schema_oid: int | None) -> str | None:
    """The first 8 hex digits of a ledger's batch keys (``home_key``)."""
    return None if schema_oid is None else f"{schema_oid & 0xFFFFFFFF:08x}"


def home_key(home: str | None) -> str:
    """A batch's key: 32 hex digits, as a uuid4's (a leader of an earlier
    release takes it), of which the first 8 are the ledger's schema OID and
    the 13th, a uuid4's version digit ``4``, is ``0``. A dump taken while a
    batch waits in ``handoff`` carries it, and a restore (another schema,
    another database) brings it back beside a writer still alive, writing to
    the original: the restored ledger's leader drops it, never appends to the
    copy what nobody submitted there (helper-502). Keys of an earlier
    release's writers (a ``4`` there) are taken as before."""
    random = uuid.uuid4().hex
    if home is None:
        return random
    return f"{home}{random[8:12]}0{random[13:]}"


BAD_KEY = "a key no writer makes"
KEY = re.compile(r"[0-9a-f]{32}")  # a writer's: uuid4().hex
NUL = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")  # JSON's escape of NUL: \u0000 after no backslash


def refused_a_value(error: BaseException) -> bool:
    """Whether the server refused a value it was given (``BATCH_ERRORS``),
    through the errors that carry it."""
    cause: BaseException | None = error
    while cause is not None and not isinstance(cause, BATCH_ERRORS):
        cause = cause.__cause__
    return cause is not None


def not_handed_by_a_writer(key: str, raw: bytes) -> str | None:
    """What a writer never hands over, seen without parsing the batch (every
    round looks): a key of other form, or a NUL in a text (the vocabulary
    refuses it, and PostgreSQL's text cannot hold it)."""
    if not KEY.fullmatch(key):
        return BAD_KEY
    if b"\\u0000" in raw and NUL.search(raw):  # not a text's backslash before "u0000"
        return "a text holds NUL"
    return None


def malformed(batch: Any) -> str | None:
    """What makes a batch handed over one a writer does not make (a list of
    events as ``ledger.events.received`` returns them, which it takes back
    as they are); None if nothing. It validates every event again, so it is
    asked only of a round after one that failed, or one that holds a batch
    ``not_handed_by_a_writer`` names."""
    if not isinstance(batch, list) or not batch:
        return "not a list of events"
    for event in batch:
        if not isinstance(event, dict):
            return "an event is not an object"
        try:  # compared as JSON: true is not 1
            if orjson.dumps(received(event), option=orjson.OPT_SORT_KEYS) != orjson.dumps(
                event, option=orjson.OPT_SORT_KEYS
            ):
                return "an event is not as a writer hands it over"
        except InvalidEvent as invalid:
            return str(invalid)
    return None


class Handoff:
    """One writer process's side of combining: hand over, wait, and stand by to lead."""

    def __init__(self, store: PostgresStore, timeout: float) -> None:
        self.store = store
        self.timeout = timeout
        schema = store.schema
        self.to_leader = f"alloc_ledger_{schema}_handoff"[:63]
        self.to_writer = f"alloc_ledger_{zlib.crc32(schema.encode()):08x}_"  # + writer's pid
        self.home: str | None = None  # its batch keys' start (``home_of``), once the store is open
        self.connection: psycopg.Connection[Any] | None = None
        self.decider: Decider | None = None
        self.standby: threading.Thread | None = None
        self.standby_connection: psycopg.Connection[Any] | None = None
        self.lease_connection: psycopg.Connection[Any] | None = None
        self.lease = max(timeout / 3, 1.0)  # seconds a leader may stall before it loses the lead
        self.stopping = threading.Event()
        # How the standby ended, published at once for the writer to read at
        # once: its failure, and whether that failure is the lead lost
        # (``lost_lead``); None while it stands by or leads.
        self.ended: tuple[BaseException, bool] | None = None
        self.cannot_stand_by: BaseException | None = None  # it could not connect
        self.leading = False
        self.rounds = 0
        self.in_round: list[int] = []  # the batches (``handoff`` ids) the last round took
        # A round failed in a way no batch a writer of this release hands
        # over makes it fail: the next rounds look at each batch first.
        self.doubting = False
        self.watchdog = Watchdog()  # the writer's statements answered in time

    # -- the writer's side -----------------------------------------------------

    @property
    def lock_key(self) -> tuple[int, int | None]:
        """The lead's advisory lock (``LEADER_LOCK``)."""
        return LEADER_LOCK, self.store.schema_oid

    @property
    def failure(self) -> BaseException | None:
        return None if self.ended is None else self.ended[0]

    def decide(self, batch: list[Event], decider: Decider) -> list[Receipt]:
        """Hand a batch over and return its receipts once they are durable."""
        self.decider = decider
        key = home_key(self.home)
        handed = sending = False
        try:
            connection = self._writer_connection()
            with self.watchdog.within(connection, self.timeout):
                sending = True
                connection.execute(
                    HAND, (key, orjson.dumps(batch), self.store.projects_inline, self.to_leader))
            handed = True
            self._stand_by()
            return self._await(connection, key)
        except psycopg.Error as error:
            self._drop_writer_connection()
            lost = self.store.unavailable(error)
            # Cut off while handing it over (the watchdog's ``Unanswered`` too): the
            # hand-over may have committed, its answer lost with the connection.
            if handed or (sending and connection_lost(error)):
                raise StoreUnavailable(
                    f"{lost} (after the batch was handed over: its events may or may not be kept)"
                ) from None
            raise lost from None

    def _await(self, connection: psycopg.Connection[Any], key: str) -> list[Receipt]:
        deadline = stand_by_until = time.monotonic() + self.timeout
        taken = False
        restarts = 0
        while True:
            heard = [n.payload for n in connection.notifies(timeout=POLL, stop_after=1)]
            mine = [p[len(key) :] for p in heard if p.startswith(key)]
            if mine and mine[0]:
                return [Receipt(*fields) for fields in orjson.loads(mine[0])]
            if mine:  # too many for a notification: in ``outcomes``
                with self.watchdog.within(connection, self.lease):
                    row = connection.execute(
                        "DELETE FROM outcomes WHERE batch = %s RETURNING receipts", (key,)
                    ).fetchone()
                if row is not None:
                    return [Receipt(*fields) for fields in orjson.loads(row[0])]
            ended = self.ended  # read once: its two parts were published together
            if ended is not None and ended[1] and restarts < RESTARTS and (
                time.monotonic() <= stand_by_until
            ):
                # This process's leader lost the lead (it stalled past its
                # lease: Ctrl-Z and fg): its round rolled back, and the batch
                # waits in ``handoff`` for whoever leads next. Stand by again,
                # as a new writer would, once the failed standby has ended.
                restarts += self._stand_by()
                continue
            if ended is None and self.cannot_stand_by is not None:
                self._stand_by()  # try again: another process may lead meanwhile
            # A round that failed in the database (not the lead lost) is told at once.
            failed = None if ended is None or ended[1] else ended[0]
            late = time.monotonic() > deadline
            if late or (failed is not None and not taken):
                with self.watchdog.within(connection, self.lease):
                    withdrawn = self._withdraw(connection, key)
                if withdrawn:  # nothing of it was written
                    if failed is not None:
                        raise failed
                    raise StoreUnavailable(
                        f"store {self.store.shown}: no writer decided the batch within "
                        f"{self.timeout:g} s (nothing of it was written{self._why(ended)})"
                    )
                if taken:  # a leader took it and has not answered in twice the time
                    raise StoreUnavailable(
                        f"store {self.store.shown}: the leader that took the batch did not "
                        f"answer within {self.timeout:g} s (its events may or may not be kept)"
                    )
                # A round holds it: its answer should be coming. A leader
                # that stopped has its round ended after the lease, by the
                # server or here: the batch is back, for the next leader.
                with self.watchdog.within(connection, self.lease):
                    end_stalled(connection, self.lease)
                taken = True
                deadline = time.monotonic() + self.timeout

    def _why(self, ended: tuple[BaseException, bool] | None) -> str:
        """Why this process did not decide the batch itself, if it knows."""
        if self.cannot_stand_by is not None:
            return f"; this process could not stand by: {self.cannot_stand_by}"
        if ended is None:
            return ""
        # It lost the lead as often as it may stand by again.
        if waited_for_tracking(ended[0].__cause__):
            return f"; its leader waited {self.lease:g} s in vain for {TRACKING_HELD}"
        if isinstance(ended[0].__cause__, psycopg.errors.LockNotAvailable):
            return (f"; its leader waited {self.lease:g} s for the log's lock in vain: "
                    "another session holds it, a writer stopped or cut off maybe")
        why = str(ended[0]).removeprefix(f"store {self.store.shown}: ")
        return f"; this process lost the lead: {why}"

    @staticmethod
    def _withdraw(connection: psycopg.Connection[Any], key: str) -> bool:
        """Take a batch back unless a leader has taken it or holds it in a
        round; whether it was taken back."""
        return connection.execute(WITHDRAW, (key,)).fetchone() is not None

    def _writer_connection(self) -> psycopg.Connection[Any]:
        if self.connection is None or self.connection.closed:
            self.connection = self.store.connect(role="writer")
            channel = f"{self.to_writer}{self.connection.info.backend_pid}"
            self.connection.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
        return self.connection

    def _drop_writer_connection(self) -> None:
        if self.connection is not None:
            self.connection.close()
            self.connection = None

    # -- the standby's side ---------------------------------------------------

    def _stand_by(self) -> bool:
        """Start standing by unless this process already does; whether it started."""
        if self.standby is not None and self.standby.is_alive():
            return False
        self.ended = None
        self.standby = threading.Thread(
            target=self._lead_when_free, name="alloc-ledger-standby", daemon=True
        )
        self.standby.start()
        return True

    def _lead_when_free(self) -> None:
        self.standby_connection = self.lease_connection = None
        try:
            try:  # one connection while standing by; the leader's others once it leads
                lease = self.lease_connection = self.store.connect(idle=self.lease, role="standby")
            except StoreUnavailable as error:  # too many connections, say
                self.cannot_stand_by = error  # not this batch's end: another may lead
                self.stopping.wait(POLL * 10)
                return
            self.cannot_stand_by = None
            while not self.stopping.is_set():  # stand by: try for the lead now and then
                lease.execute("BEGIN")
                row = lease.execute(
                    "SELECT pg_catalog.pg_try_advisory_xact_lock(%s, %s)", self.lock_key).fetchone()
                if row is not None and row[0]:
                    break
                lease.execute("ROLLBACK")
                self.stopping.wait(POLL)
            else:
                return
            self.leading = True
            connection = self.standby_connection = self.store.connect(role="leader")
            connection.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.to_leader)))
            self._lead(connection, lease)
        except BaseException as error:  # noqa: BLE001 - for the writer waiting in this process
            if not self.stopping.is_set():
                failure = (
                    self.store.unavailable(error) if isinstance(error, psycopg.Error) else error
                )
                self.ended = (failure, lost_lead(error))
        finally:
            self.leading = False
            for held in (self.lease_connection, self.standby_connection):
                if held is not None:
                    held.close()  # the lease's end releases the lock: another standby leads

    def _lead(self, connection: psycopg.Connection[Any], lease: psycopg.Connection[Any]) -> None:
        """Rounds one after another: while one round commits (a thread waits
        for it), the next takes its batches and decides them. The lead is
        held in a transaction on ``lease`` that the server ends when it idles
        longer than ``self.lease``: a leader that stops (SIGSTOP, a machine
        cut off) loses the lead, and its rounds, and another standby leads.
        A leader renews it between rounds."""
        committing: Future[None] | None = None
        renewed = looked = time.monotonic()
        with (
            self.store.connect(idle=self.lease, role="leader") as one,
            self.store.connect(idle=self.lease, role="leader") as other,
            ThreadPoolExecutor(1, thread_name_prefix="alloc-ledger-commit") as committer,
        ):
            turns = itertools.cycle([one, other])  # a round on one, the next on the other
            try:
                while not self.stopping.is_set():
                    if time.monotonic() - renewed > RENEW:
                        lease.execute("SELECT 1")  # fails if the lead was lost
                        renewed = time.monotonic()
                    idle = committing is None
                    if idle:
                        handed = connection.execute(ANY_HANDED).fetchone()
                        if not (handed and handed[0]):  # no log lock when idle
                            _listen(connection)
                            continue
                    try:
                        written = self._round(next(turns), committing)
                    except StoreUnavailable as error:
                        if isinstance(error.__cause__, psycopg.errors.LockNotAvailable):
                            end_stalled(connection, self.lease)  # it waited a lease for the log
                        if self.doubting or not refused_a_value(error):
                            raise
                        self._doubt(committing)  # a value no writer sends?
                        committing = None
                        continue
                    except (TypeError, ValueError, LookupError, AttributeError):
                        if self.doubting:
                            raise  # every batch looked well made: the failure is this code's
                        self._doubt(committing)  # a batch no writer made?
                        committing = None
                        continue
                    self.doubting = False  # until a round fails so again
                    committing = None if written is None else committer.submit(written.close)
                    if written is None and idle:  # every batch handed is in another's round
                        if time.monotonic() - looked > RENEW:
                            end_stalled(connection, self.lease)  # a leader stopped in it?
                            looked = time.monotonic()
                        _listen(connection)
            finally:
                if committing is not None:
                    committing.result()

    def _round(
        self, connection: psycopg.Connection[Any], committing: Future[None] | None
    ) -> ExitStack | None:
        """Take the oldest batches handed over, up to ``ROUND_BYTES`` (``TAKE``),
        decide and write them in one transaction; return it to be committed,
        or None if there were none. The previous round may still be
        committing: these batches are decided after it, and written once it
        is committed."""
        assert self.decider is not None
        transaction = ExitStack()
        cursor = transaction.enter_context(self.store.combining(connection))
        try:
            held = self.in_round if committing is not None else []
            cursor.execute(TAKE, {"committing": held, "budget": ROUND_BYTES,
                                  "home": self.home or ""})
            rows = cursor.fetchall()
            self.in_round = [row[0] for row in rows]
            taken = [row for row in rows if row[5]]  # the others' writers are gone: dropped
            if not taken:
                _wait(committing)
                transaction.close()
                return None
            handed = [(key, bytes(events), pid) for _, key, events, pid, _, _ in taken]
            if self.doubting or any(not_handed_by_a_writer(key, raw) for key, raw, _ in handed):
                batches = self._refuse_malformed(cursor, handed)
                if not batches:
                    _wait(committing)
                    self.store.send_commit()
                    return transaction  # the refusals, committed
            else:
                batches = [(key, orjson.loads(raw), pid) for key, raw, pid in handed]
            events = [e for _, b, _ in batches for e in b]
            inline = any(row[4] for row in taken)  # a writer wants the projections inline
            ahead = committing is not None and not inline
            decided = self.decider.decide_ahead(cursor, events) if ahead else None
            _wait(committing)
            self.store.lock_log(cursor, tracking=inline)
            if decided is None:
                receipts = self.decider.decide(cursor, events, inline)
            else:
                receipts = self.decider.write_ahead(cursor, decided)
            self._give(cursor, batches, receipts)
            self.store.send_commit()  # not left to the committer thread: see _Pipelined
        except BaseException:
            self.decider.forget()  # what it decided may not be kept
            transaction.__exit__(*sys.exc_info())  # rolls back: the batches go back
            raise
        return transaction

    def _doubt(self, committing: Future[None] | None) -> None:
        """After a round failed in a way a batch no writer made would fail it
        (rolled back, its batches back in ``handoff``): look at each batch of
        the next rounds (``_refuse_malformed``), once the round before it
        has ended (its failure, if it is the one that failed, is that one)."""
        self.doubting = True
        if committing is not None:
            with suppress(Exception):
                committing.result()

    def _refuse_malformed(
        self, cursor: Any, handed: list[tuple[str, bytes, int]]
    ) -> list[tuple[str, list[Event], int]]:
        """The batches, parsed, whose events are each as a writer hands one
        over; the others (put in ``handoff`` by hand, or by a writer of
        another release) are answered invalid and dropped, so that one of
        them does not fail every round, and every writer with it
        (helper-305, helper-306); one under a key no writer makes is
        dropped unanswered."""
        kept: list[tuple[str, list[Event], int]] = []
        refused: list[tuple[str, list[Event], int]] = []
        receipts: list[Receipt] = []
        for key, raw, pid in handed:
            problem = not_handed_by_a_writer(key, raw)
            if problem == BAD_KEY:
                continue
            try:
                batch = orjson.loads(raw)
            except orjson.JSONDecodeError:
                batch, problem = None, "not JSON"
            problem = problem or malformed(batch)
            if problem is None:
                kept.append((key, batch, pid))
                continue
            events = batch if isinstance(batch, list) and batch else [{}]  # one answer at least
            refused.append((key, events, pid))
            receipts += [Receipt("invalid", None, f"the batch handed over to the leader is not "
                                 f"one a writer makes: {problem}")] * len(events)
        if refused:
            self._give(cursor, refused, receipts)
        return kept

    def _give(
        self, cursor: Any, batches: list[tuple[str, list[Event], int]], receipts: list[Receipt]
    ) -> None:
        """Tell each writer its receipts (delivered when the round commits)."""
        channels, payloads, kept_keys, kept = [], [], [], []
        start = 0
        for key, batch, pid in batches:
            answer = orjson.dumps(
                [(r.status, r.position, r.error) for r in receipts[start : start + len(batch)]])
            start += len(batch)
            channels.append(f"{self.to_writer}{pid}")
            if len(answer) + len(key) <= PAYLOAD:
                payloads.append(key + answer.decode())
            else:
                payloads.append(key)  # look in ``outcomes``
                kept_keys.append(key)
                kept.append(answer)
        if kept:
            cursor.execute(GIVE, (kept_keys, kept))
        cursor.execute(TELL, (channels, payloads))
        self.rounds += 1
        if self.rounds % PURGE_EVERY == 0:
            cursor.execute(PURGE)

    def close(self) -> None:
        """Stop standing by (a leader finishes its round first); others take over."""
        self.stopping.set()
        standby = self.standby
        if standby is not None and standby.is_alive():
            standby.join(timeout=10)  # a standby stops at its next look, a leader after its round
        self._drop_writer_connection()
        self.watchdog.close()

