"""PostgreSQL: what a store's URL may say about its sessions, and the
sessions of their own a store opens beside its pool (autocommit, named in
pg_stat_activity): to listen, to hand batches over, to hold a replay's claim
on its scratch tables; and, when one is refused, why, in a line."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any, NoReturn
from urllib.parse import unquote

import psycopg
from eventsourcing.postgres import PostgresDatastore

from ledger.errors import StoreUnavailable
from ledger.postgres_errors import describe
from ledger.postgres_pipeline import SyncingCursor
from ledger.store import Abandoned, seconds

SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
# libpq's parameters a URL may give, passed on as they are: TLS, the name in
# pg_stat_activity, which server of several to take, and how soon a connection
# to a server that vanished without a word is given up.
LIBPQ_OPTIONS = (
    "sslmode", "sslrootcert", "sslcert", "sslkey", "sslpassword", "sslcrl", "channel_binding",
    "gssencmode", "target_session_attrs", "application_name", "keepalives", "keepalives_idle",
    "keepalives_interval", "keepalives_count", "tcp_user_timeout",
)
APPLICATION = "alloc-ledger"  # the sessions' application_name, unless the URL gives one
OPTIONS = {
    "schema", "projections", "writers", "connect_timeout", "timeout", "password", "host",
    *LIBPQ_OPTIONS}
# A session that stalls inside its transaction (a client on a machine cut off
# from the network) must not hold its locks until TCP notices: the server ends
# it after this many seconds idle in a transaction (a write transaction: after
# the lease, ``BOUNDED``).
IDLE_IN_TRANSACTION = 60
SCRATCH_LOCK = -216778827  # crc32("alloc-ledger:scratch") as a signed int4: a replay's tables
CONNECTIONS = (  # whichever command it is: the writer's connections are the most
    "a writer opens up to 6 connections when writers combine (the default), one with "
    "&writers=lock, other commands one (a replay two); raise the role's CONNECTION LIMIT "
    "or use &writers=lock"
)
LOCK_CONNECTIONS = (  # whichever command it is: a writer, a query, a replay's first
    "with &writers=lock a command holds one connection (a replay two): the role's other "
    "sessions leave none (pg_stat_activity names them); raise the role's CONNECTION LIMIT"
)
CREATE_CONNECTIONS = (
    "creating a ledger holds two connections (its schema's lock, and the one that makes its "
    "tables), whatever its writers: the role's CONNECTION LIMIT must leave two beside its "
    "other sessions, or create it once as a role that may"
)
REPLAY_CONNECTIONS = (
    "replay and replay --repair hold two connections (alloc-ledger, and alloc-ledger replay, "
    "which claims their scratch tables): the role's CONNECTION LIMIT must leave two beside "
    "its other sessions"
)


def host_of(netloc: str) -> str:
    """The host of a URL's network location as written, unescaped: a name,
    an address ([::1] without its brackets), or a socket's folder (%2F…)."""
    host = netloc.rpartition("@")[2]
    if host.startswith("["):
        return host[1:host.find("]")]
    return unquote(host.rpartition(":")[0] if ":" in host else host)


class PostgresConnections:
    """A store's sessions: where they connect (``connect_args``, as the URL
    says), how each is named, and why one was refused."""

    shown: str
    schema: str
    datastore: PostgresDatastore  # the pool
    combines: bool
    connect_args: dict[str, Any]
    connect_timeout: float
    named: bool
    extra: dict[str, str]

    def connect(self, idle: float | None = None, role: str = "") -> psycopg.Connection[Any]:
        """A connection of its own (autocommit), for listening and handing over,
        or for transactions that the server ends when they stay ``idle`` (seconds);
        named ``alloc-ledger ROLE`` in pg_stat_activity unless the URL names it."""
        connection = self._connect(self.connect_timeout, self._named(role), role)
        if idle is not None:
            connection.execute(
                f"SET idle_in_transaction_session_timeout = '{round(idle * 1000)}ms'")
        return connection

    def _named(self, role: str) -> dict[str, str]:
        if not (role and self.named):
            return self.extra
        return {**self.extra, "application_name": f"{APPLICATION} {role}"}

    def unavailable(self, error: BaseException) -> StoreUnavailable:
        return StoreUnavailable(f"store {self.shown}: {describe(error)}")

    def _seconds(self, options: dict[str, str], name: str, default: float) -> float:
        try:
            return seconds(options, name, default)
        except ValueError as error:
            self._fail(str(error))

    def _fail(self, reason: str) -> NoReturn:
        raise StoreUnavailable(f"cannot open store {self.shown}: {reason}") from None

    def _connect(
        self, timeout: float, extra: dict[str, str], role: str = ""
    ) -> psycopg.Connection[Any]:
        arguments: dict[str, Any] = {**self.connect_args, **extra}
        try:
            return psycopg.connect(
                **arguments, connect_timeout=max(1, int(timeout)), autocommit=True,
                cursor_factory=SyncingCursor,
            )
        except psycopg.Error as error:
            reason = self._why_not_connected(error, role)
            if role == "replay":  # the store is open: this is the replay's second connection
                raise StoreUnavailable(
                    f"store {self.shown}: a replay's second connection (its claim on its "
                    f"scratch tables) refused: {reason}") from None
            self._fail(reason)

    def _why_not_connected(self, error: psycopg.Error, role: str = "") -> str:
        """libpq's message, shortened to what went wrong: 'database "x" does not
        exist', 'password authentication failed for user "u"', 'server … unreachable'."""
        text = (str(error).strip().splitlines() or [type(error).__name__])[0]
        if text.startswith("connection is bad: invalid "):  # a parameter libpq refused
            return text[len("connection is bad: "):]
        reason = text.rsplit(" failed: ", 1)[-1]
        if "SSL" in reason or "certificate" in reason:  # it answered: TLS is what failed
            return f"TLS with server {self._where()}: {reason}"
        if reason.startswith("FATAL:"):
            refused = reason[len("FATAL:"):].strip()
            if refused.startswith("too many connections for role"):
                hint = {"replay": REPLAY_CONNECTIONS, "create": CREATE_CONNECTIONS}.get(role) or (
                    CONNECTIONS if self.combines else LOCK_CONNECTIONS)
                return f"{refused} ({hint})"
            return refused
        return f"server {self._where()} unreachable: {reason}"

    def _where(self) -> str:
        return f"{self.connect_args['host'] or 'localhost'}:{self.connect_args['port']}"

    @contextmanager
    def claimed(self, prefix: str) -> Iterator[Abandoned]:
        """A session of its own holds an advisory lock named by the prefix
        while its scratch tables are in use: it ends with the process, however
        that ends, and the lock with it. The same session tells which others
        no session holds (no third connection)."""
        with self.connect(role="replay") as connection:
            connection.execute("SELECT pg_catalog.pg_advisory_lock(%s, pg_catalog.hashtext(%s))",
                               (SCRATCH_LOCK, prefix))
            yield partial(_abandoned, connection)


def _abandoned(connection: psycopg.Connection[Any], prefixes: list[str]) -> list[str]:
    """Those whose advisory lock no other session holds."""
    free = []
    for prefix in prefixes:
        key = (SCRATCH_LOCK, prefix)
        row = connection.execute(
            "SELECT pg_catalog.pg_try_advisory_lock(%s, pg_catalog.hashtext(%s))", key).fetchone()
        if row is not None and row[0]:
            free.append(prefix)
            connection.execute(
                "SELECT pg_catalog.pg_advisory_unlock(%s, pg_catalog.hashtext(%s))", key)
    return free
