"""PostgreSQL: many writers on many machines share one log.

The log is eventsourcing's ``PostgresProcessRecorder`` (``stored_events`` and
``tracking``) in the schema the URL names (``?schema=name``, created when
missing). Beside it:

* ``event_ids`` and ``event_hashes`` (append-only, like ``stored_events``:
  a trigger refuses UPDATE, DELETE and TRUNCATE);
* the decision tables ``state_*``, which are decided against and updated in
  the transaction that appends, after taking the library's EXCLUSIVE lock on
  ``stored_events`` first: rules are race-free and positions gapless across
  processes and machines. By default writers hand their batches to one
  leader that decides them all (``ledger.postgres_handoff``); with
  ``?writers=lock`` each writer takes the lock in its own transaction;
* the public projection tables (``nodes``, ``slots``, …), kept by
  ``alloc-ledger project [--follow]`` in transactions that lock the tracking
  row (never the log), or by the writers themselves with ``?projections=inline``.

Only the ``ledger.postgres_*`` modules import psycopg, and only this one is
imported from outside them, when a PostgreSQL store is opened
(``ledger.store.open_store``); every cursor it hands out yields tuples.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext, suppress
from functools import partial
from typing import Any, NamedTuple, NoReturn
from urllib.parse import SplitResult, unquote

import psycopg
from eventsourcing.persistence import PersistenceError, Tracking
from eventsourcing.postgres import PostgresDatastore, PostgresProcessRecorder
from psycopg import sql
from psycopg.generators import send
from psycopg.rows import dict_row, tuple_row

from ledger import postgres_access, postgres_writes
from ledger.errors import (
    GrantRefused,
    LockWaitedOut,
    MadeByNewer,
    RelationsBusy,
    StoreUnavailable,
    first_few,
)
from ledger.postgres_handoff import TABLES as HANDOFF_TABLES
from ledger.postgres_handoff import TRACKING_HELD, Handoff, connection_lost, waited_for_tracking
from ledger.postgres_preload import (
    ALLOCS_ONLY,
    KNOWN_IDS,
    Named,
    Preload,
    known_ids,
    named_by,
    not_cached,
)
from ledger.postgres_writes import LogRecorder
from ledger.store import (
    LEDGER_STREAM,
    PAGE,
    PAGE_BYTES,
    PROJECTIONS,
    REPAIRS,
    Abandoned,
    Decider,
    Guards,
    LoggedEvent,
    decide_here,
    logged,
    not_a_ledger_yet,
    redacted,
    seconds,
)
from projections import tables
from projections.rows import ChangedRows, Statements

# 2: the handoff tables (ledger.postgres_handoff); 3: handoff.inline;
# 4: nodes.health_reason, zombie_slots; 5: needs_reconnect.expired, no
# zombie slots on removed nodes (``projections.tables.upgrade``). Views of the
# log a release adds (``projections.tables.LOG_VIEWS``) need no new version:
# any open by a role that may make them makes them, as on SQLite.
SCHEMA_VERSION = 5
# The tables the event recorder makes first, as it makes them: a schema that
# holds only these (the log empty) holds a ledger whose creation was cut short.
RECORDER_COLUMNS = {
    "stored_events": ("originator_id", "originator_version", "topic", "state", "notification_id"),
    "tracking": ("application_name", "notification_id"),
}
MARK = f"alloc-ledger schema {SCHEMA_VERSION}"
MARKED = re.compile(r"alloc-ledger schema (\d+)")
# Marks no release made a version of its own: 0b5e267 (main for an hour on
# 2026-11-26) marked its schema 6 for a view 3e2f13f renamed in schema 5's
# ``log_positions``, which an open makes where missing. The next version is 7.
WITHDRAWN = {6: 5}
TRACKING = "tracking"
# The head of the log with its chain hash; the same with the count of repairs.
HEAD = ("SELECT last, (SELECT hash FROM event_hashes WHERE position = last) FROM "
        "(SELECT MAX(originator_version) AS last FROM stored_events "
        "WHERE originator_id = %s) head")
HEAD_AND_REPAIRS = HEAD.replace(
    " FROM (", f", (SELECT notification_id FROM {TRACKING} WHERE application_name = %s), "
    f"(SELECT MAX(notification_id) FROM {TRACKING} WHERE application_name = %s) FROM (", 1)
STATE_PREFIX = tables.STATE_PREFIX
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
# Who holds a lock on which of the ledger's relations (a repair's error names them).
HOLDERS = """
SELECT DISTINCT c.relname, a.pid, coalesce(a.application_name, ''), coalesce(a.state, '')
FROM pg_locks l
JOIN pg_class c ON c.oid = l.relation
JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.granted AND l.pid <> pg_catalog.pg_backend_pid() AND n.nspname = %s AND c.relname = ANY(%s)
ORDER BY c.relname, a.pid
"""

APPEND_ONLY = [
    """CREATE TABLE IF NOT EXISTS event_ids (id TEXT PRIMARY KEY, position BIGINT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS event_hashes (position BIGINT PRIMARY KEY, hash TEXT NOT NULL)""",
]
APPEND_ONLY_TABLES = ("stored_events", "event_hashes", "event_ids")
# The body of the function every guard runs, as every store has it (one
# replaced by hand is no guard).
REFUSAL = """
       BEGIN
           RAISE EXCEPTION 'the event log is append-only: % on % refused', TG_OP, TG_TABLE_NAME
               USING ERRCODE = 'insufficient_privilege';
       END """
# The log, its hash chain and its client ids are append-only (a lost id would
# let a retry append its event again): a trigger refuses UPDATE and DELETE,
# another TRUNCATE, on each. A store made before the ids were guarded, or
# whose guards were dropped, disabled or altered by hand (to "fix a row"),
# or whose function was dropped or replaced, is guarded again when next
# opened by a role that may (the tables' owner). Each guard: its table, its
# name, what it refuses, and how it fires (pg_trigger.tgtype: FOR EACH ROW 1,
# BEFORE 2, DELETE 8, UPDATE 16, TRUNCATE 32).
GUARDED = [
    (table, f"{table}_{name}", f"{refused} ON {table} FOR EACH {each}", fires)
    for table in APPEND_ONLY_TABLES
    for name, refused, each, fires in (
        ("append_only", "UPDATE OR DELETE", "ROW", 1 | 2 | 8 | 16),
        ("no_truncate", "TRUNCATE", "STATEMENT", 2 | 32))
]
GUARDS = [
    f"CREATE OR REPLACE FUNCTION refuse_change() RETURNS trigger LANGUAGE plpgsql AS $${REFUSAL}$$",
    *(f"CREATE OR REPLACE TRIGGER {name} BEFORE {refused} EXECUTE FUNCTION refuse_change()"
      for _, name, refused, _ in GUARDED),
]
# Each guard that is not as made, and how (``missing``, ``disabled``:
# disabled or firing only for replicas, ``altered``: another function, other
# events or columns, a condition; the function missing or its body replaced),
# in the order of ``GUARDS``; NULL for one in place.
GUARD_STATES = (
    "SELECT g.name, CASE WHEN t.oid IS NULL THEN 'missing' "
    "WHEN t.tgenabled IN ('D', 'R') THEN 'disabled' "
    "WHEN t.tgfoid IS DISTINCT FROM pg_catalog.to_regprocedure(%(refusal)s) OR t.tgtype <> g.fires "
    "OR t.tgqual IS NOT NULL OR t.tgattr <> ''::int2vector THEN 'altered' END AS how, g.n "
    "FROM ROWS FROM (pg_catalog.unnest(%(guarded)s::text[]), "
    "pg_catalog.unnest(%(guards)s::text[]), pg_catalog.unnest(%(fires)s::int2[])) "
    "WITH ORDINALITY g(relation, name, fires, n) "
    "LEFT JOIN pg_trigger t ON t.tgrelid = pg_catalog.to_regclass(g.relation) AND t.tgname = "
    "g.name "
    "UNION ALL SELECT 'refuse_change()', CASE WHEN p.oid IS NULL THEN 'missing' "
    "WHEN p.prosrc <> %(body)s THEN 'altered' END, 0 "
    "FROM (SELECT pg_catalog.to_regprocedure(%(refusal)s) AS oid) f LEFT JOIN pg_proc p ON p.oid "
    "= f.oid"
)
UNGUARDED = f"SELECT name, how FROM ({GUARD_STATES}) s WHERE how IS NOT NULL ORDER BY n"
# The roles besides the schema's owner and the log's (or a member of theirs:
# the ledger's own writers) that may create in it (PUBLIC: all).
CREATORS = (
    "SELECT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE pg_catalog.pg_get_userbyid(a.grantee) END "
    "FROM pg_catalog.pg_namespace s, pg_catalog.aclexplode(COALESCE(s.nspacl, "
    "pg_catalog.acldefault('n', s.nspowner))) a WHERE s.nspname = %(schema)s "
    "AND a.privilege_type = 'CREATE' AND a.grantee <> s.nspowner AND (a.grantee = 0 OR NOT "
    "COALESCE(pg_catalog.pg_has_role(a.grantee, (SELECT c.relowner FROM pg_catalog.pg_class c "
    "WHERE c.oid = pg_catalog.to_regclass(%(log)s)), 'MEMBER'), false)) ORDER BY 1"
)
OWNER = ("SELECT pg_catalog.pg_get_userbyid(relowner) FROM pg_class "
         "WHERE oid = pg_catalog.to_regclass(%s)")


class Found(NamedTuple):
    """What a schema holds: the schema version of its ledger (0: none),
    whether all its guards are there as made (``GUARDED``), its OID (None:
    no such schema), and whether the log's views (or what else holds their
    names) are there."""

    version: int
    guarded: bool
    oid: int | None
    viewed: bool


# What ``Found`` holds (the ledger's mark, the guards: each trigger on its
# table as made, enabled, running ``refuse_change`` with its body as made; the
# schema's OID: see SCHEMA_LOCK; the log's views): one round trip for every open.
FOUND = (
    "SELECT pg_catalog.obj_description(pg_catalog.to_regclass(%(hashes)s), 'pg_class'), "
    f"NOT EXISTS ({UNGUARDED}), "
    "(SELECT oid::int4 FROM pg_namespace WHERE nspname = %(schema)s), "
    # a keyword (user, default) that the ledger's and the library's SQL write unquoted
    "pg_catalog.quote_ident(%(schema)s) <> %(schema)s, "
    # the log's views, or whatever else holds their names
    "(SELECT COUNT(*) = pg_catalog.cardinality(%(log_views)s::text[]) FROM pg_class c "
    "JOIN pg_namespace n ON n.oid = c.relnamespace "
    "WHERE n.nspname = %(schema)s AND c.relname = ANY(%(log_views)s::text[]))"
)
# Advisory locks are database-wide: the ledger's are in PostgreSQL's two-int
# form (a lock space apart from the one-bigint form), a fixed number of
# alloc-ledger's and the schema's OID, so no two schemas' locks are one.
# This one serializes creating and upgrading a schema; the default writers'
# lead is ``ledger.postgres_handoff.LEADER_LOCK``.
SCHEMA_LOCK = -275817905  # crc32("alloc-ledger:schema") as a signed int4
SCRATCH_LOCK = -216778827  # crc32("alloc-ledger:scratch") as a signed int4: a replay's tables


class SyncingCursor(psycopg.Cursor[Any]):
    """A cursor whose reads in a pipeline end it with a Sync, where psycopg's
    own send a Flush (one round trip either way).

    After a Flush the server waits for the next statement *active*, and
    PostgreSQL (15) runs no timer there: ``statement_timeout`` stops when each
    statement completes, the idle timer starts only at a Sync. A writer
    stopped between two reads held its transaction, and the log's lock, until
    it resumed. After a Sync the server waits *idle in transaction*, and
    ``idle_in_transaction_session_timeout`` ends a session whose client stopped
    (SIGSTOP, a machine cut off). (psycopg has no public switch: this replaces
    the one step that sends the Flush. A Sync after every statement would
    close the rest of the gap, but psycopg hands results that come back
    before they are read to the cursor's next statement.)"""

    def _fetch_pipeline(self) -> None:
        pipeline = self._conn._pipeline
        if (
            isinstance(pipeline, psycopg.Pipeline)
            and self._execmany_returning is not False
            and not self.pgresult
        ):
            synced(self._conn, pipeline)


def synced(connection: psycopg.Connection[Any], pipeline: psycopg.Pipeline) -> None:
    """``pipeline.sync()``, once what the pipeline holds is sent whole.

    psycopg's (3.3.9) sync stops sending once its queue of commands is
    empty, whatever libpq's buffer still holds, and then waits for results:
    a statement larger than the socket takes in a few writes (a replay's
    write of 40 rejected 1 MiB events, 50 MB of text alone) was left half
    sent, and the server waited for its rest (ClientRead) as long as the
    client waited for its answer. Sent first, only the Sync is left to it."""
    with connection.lock:
        connection.wait(send(connection.pgconn))
    pipeline.sync()


class _Pipelined:
    """A transaction in pipeline mode: BEGIN goes with its first statements,
    COMMIT (or ROLLBACK) with a Sync.

    Not psycopg's ``transaction()``, which in a pipeline ends with a Sync,
    then a Flush, then COMMIT: PostgreSQL stops the idle-in-transaction timer
    when the Flush arrives and starts it again only at the next Sync, so a
    client stopped before its COMMIT held the transaction, and the log's
    lock, until it resumed. Here the server waits for the client inside the
    transaction after a Sync (``SyncingCursor``), or for as long as the client
    takes between two statements."""

    def __init__(self, connection: psycopg.Connection[Any]) -> None:
        self.connection = connection
        self.committed = False

    def commit(self) -> None:
        """Send the COMMIT now (the server commits when it arrives); its
        answer is read when the transaction ends. ``committed`` from the
        moment it is being sent: from then on a connection lost may have
        left the transaction committed."""
        if not self.committed:
            self.committed = True
            self.connection.execute("COMMIT")

    @classmethod
    @contextmanager
    def begin(cls, connection: psycopg.Connection[Any]) -> Iterator[_Pipelined]:
        with connection.pipeline() as pipeline:
            transaction = cls(connection)
            connection.execute("BEGIN")
            try:
                yield transaction
                transaction.commit()
                synced(connection, pipeline)
            except BaseException:
                with suppress(psycopg.Error):  # the server skips what follows an error until a Sync
                    synced(connection, pipeline)
                with suppress(psycopg.Error):  # a connection lost is rolled back by the server
                    connection.execute("ROLLBACK")
                    synced(connection, pipeline)
                raise


def _ms(seconds: float) -> str:
    return f"{max(1, round(seconds * 1000))}ms"


# What to do about a database's (or role's) ``statement_timeout`` that a
# batch's statements outlast: managed PostgreSQL often sets one low.
STATEMENT_TIMEOUT = (
    "the server's statement_timeout cut it short: use smaller batches (--batch), or raise "
    "it for this role, e.g. ALTER ROLE name SET statement_timeout = '5min'"
)

READ_ONLY = (
    "the server takes no writes: a standby in recovery, or default_transaction_read_only "
    "set for this role or database; give --store the primary"
)

ROLE_DENIED = (
    "alloc-ledger's commands need a role that may use the ledger's own tables, such as their "
    "owner; a role from grant-reporting reads the projection tables with SQL only"
)


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


def describe(error: BaseException, hint: bool = True) -> str:
    """One line for a database error: the server's message, without libpq's
    hints, with ours for a statement timeout, a read-only server or a privilege refused."""
    cause = error.__cause__ if isinstance(error, PersistenceError) and error.__cause__ else error
    diag = getattr(cause, "diag", None)
    primary = getattr(diag, "message_primary", None)
    text = primary or str(cause) or type(cause).__name__
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    line = lines[0] if lines else type(cause).__name__
    if hint and isinstance(cause, psycopg.errors.QueryCanceled) and "statement timeout" in line:
        return f"{line} ({STATEMENT_TIMEOUT})"
    if hint and isinstance(cause, psycopg.errors.ReadOnlySqlTransaction):
        return f"{line} ({READ_ONLY})"  # 'cannot execute LISTEN during recovery' and the like
    if hint and isinstance(cause, psycopg.errors.InsufficientPrivilege) and re.match(
        r"permission denied for (table|view|sequence|relation) ", line
    ):  # not for a database or schema: creating a ledger asks for more
        return f"{line} ({ROLE_DENIED})"
    return tables.with_repair_hint(line) if hint else line


# The ledger's tables and views but those a reporting role reads: the log
# and its indexes, tracking, the writers' own.
OWN_TABLES = (
    "stored_events", "event_ids", "event_hashes", TRACKING, "checkpoints",
    "handoff", "outcomes", *(STATE_PREFIX + t for t in (*tables.TABLES, *tables.VIEWS)),
)


def _host_of(netloc: str) -> str:
    """The host of a URL's network location as written, unescaped: a name,
    an address ([::1] without its brackets), or a socket's folder (%2F…)."""
    host = netloc.rpartition("@")[2]
    if host.startswith("["):
        return host[1:host.find("]")]
    return unquote(host.rpartition(":")[0] if ":" in host else host)


def exposed(schema: str, creators: list[str]) -> str:
    """What roles besides its owner that may create in the ledger's schema
    put at risk ("" if there are none)."""
    if not creators:
        return ""
    who = ", ".join("every role (PUBLIC)" if role == "PUBLIC" else role for role in creators)
    named = ", ".join(
        role if role == "PUBLIC" else sql.Identifier(role).as_string(None) for role in creators)
    return (
        f"{who} may create objects in schema {schema}, which the ledger's sessions search: "
        "a function made there to match a call better than PostgreSQL's own runs as the "
        "writer that calls it, with its rights over the log; REVOKE CREATE ON SCHEMA "
        f"{schema} FROM {named}, or keep the ledger in a schema of its own "
        "(docs/postgresql.md, Security)"
    )


def _value(connection: Any, statement: Any, params: Any = ()) -> Any:
    """The first column of a statement's first row (None: no row)."""
    row = connection.execute(statement, params).fetchone()
    return None if row is None else row[0]


def _rows(connection: Any, statement: str, params: Any) -> list[Any]:
    return list(connection.execute(statement, params).fetchall())


# The sequences of the ledger's tables (a serial column's), by schema and name.
SEQUENCES_OF = (
    "SELECT DISTINCT ns.nspname AS nsp, s.relname AS rel FROM pg_depend d "
    "JOIN pg_class s ON s.oid = d.objid AND s.relkind = 'S' "
    "JOIN pg_namespace ns ON ns.oid = s.relnamespace "
    "WHERE d.classid = 'pg_class'::regclass AND d.refclassid = 'pg_class'::regclass "
    "AND d.refobjid = ANY(SELECT pg_catalog.to_regclass(t) FROM pg_catalog.unnest(%s::text[]) t) "
    "ORDER BY 1, 2"
)
# What a role may still do on the ledger's tables, sequences and schema
# beyond reading the projections: through a role it belongs to, or PUBLIC.
BEYOND_READING = (
    "SELECT pg_catalog.format('%%s on %%s', p, n) AS what FROM "
    "pg_catalog.unnest(%(ledger)s::text[]) n, "
    "pg_catalog.unnest(array['SELECT', 'INSERT', 'UPDATE', 'REFERENCES']) p "
    "WHERE (p <> 'SELECT' OR n <> ALL(%(names)s::text[])) "  # a column's privilege too
    "AND pg_catalog.has_any_column_privilege(%(role)s::text, pg_catalog.format('%%I.%%I', "
    "%(schema)s::text, n), p) "
    "UNION ALL SELECT pg_catalog.format('%%s on %%s', p, n) FROM "
    "pg_catalog.unnest(%(ledger)s::text[]) n, "
    "pg_catalog.unnest(array['DELETE', 'TRUNCATE', 'TRIGGER']) p "
    "WHERE pg_catalog.has_table_privilege(%(role)s::text, pg_catalog.format('%%I.%%I', "
    "%(schema)s::text, n), p) "
    "UNION ALL SELECT pg_catalog.format('%%s on sequence %%s', p, q) FROM "
    "pg_catalog.unnest(%(sequences)s::text[]) q, "
    "pg_catalog.unnest(array['USAGE', 'SELECT', 'UPDATE']) p "
    "WHERE pg_catalog.has_sequence_privilege(%(role)s::text, q, p) "
    "UNION ALL SELECT pg_catalog.format('CREATE in schema %%s', %(schema)s::text) "
    "WHERE pg_catalog.has_schema_privilege(%(role)s::text, %(schema)s::text, 'CREATE')"
)


def _more_than_granted(run: Callable[..., list[Any]], role: str, schema: str) -> str | None:
    """Why a role would keep more than any grant gives it: it is a superuser,
    or owns (or belongs to the owner of) the ledger's schema or tables; so it
    is refused before anything is revoked (an owner revoking its own
    privileges would lock the ledger's writers out)."""
    found = run(
        "SELECT r.rolsuper AS superuser, (SELECT pg_catalog.array_agg(c.relname::text ORDER BY "
        "c.relname) "
        "FROM pg_class c JOIN pg_namespace ns ON ns.oid = c.relnamespace "
        "WHERE ns.nspname = %s AND c.relname = ANY(%s::text[]) "
        "AND pg_catalog.pg_has_role(r.oid, c.relowner, 'MEMBER')) AS owned "
        "FROM pg_roles r WHERE r.rolname = %s",
        (schema, [*tables.REPORTED, *OWN_TABLES], role))
    if not found:
        return None  # no such role: the grant says so
    if found[0]["superuser"]:
        return "it is a superuser, which reads and writes everything whatever it is granted"
    if found[0]["owned"]:
        return (f"it owns {first_few(found[0]['owned'])} (or is a member of their owner), "
                "and an owner may do anything with them")
    return None


def _may_not_grant(role: str, names: list[str]) -> str:
    return (f"cannot grant reporting to {role}: this connection's role may not grant "
            f"SELECT on {', '.join(names)} (the owner of the ledger's schema can)")


def _denied(error: BaseException) -> bool:
    """Whether the server refused a privilege (the event recorder wraps its errors)."""
    cause = error.__cause__ if isinstance(error, PersistenceError) else error
    return isinstance(cause, psycopg.errors.InsufficientPrivilege)


class PostgresStore:
    dialect = "postgresql"
    param = "%s"
    # not the database's collation (en-US sorts "_z a b B", SQLite "B _z a b"):
    # an answer's order is the same on either store, and as of any position
    name_order = ' COLLATE "C"'
    state_prefix = STATE_PREFIX
    overlaps = False  # writers hand batches to a leader, which overlaps its own rounds
    loads_many = True  # a load is a round trip: a cascade loads its nodes a level at a time

    def __init__(
        self, url: str, parts: SplitResult, options: dict[str, str], create: bool = True
    ) -> None:
        self.url = url
        self.create = create
        self.shown = redacted(url)
        unknown = set(options) - OPTIONS
        if unknown:
            known = ", ".join(sorted(OPTIONS))
            self._fail(f"unknown option {min(unknown)!r} (known: {known})")
        self.schema = options.get("schema", "public")
        if len(self.schema) > 63:  # PostgreSQL's NAMEDATALEN - 1
            self._fail(f"schema name {self.schema!r} is {len(self.schema)} characters long, "
                       "more than PostgreSQL's 63")
        if not SCHEMA_NAME.fullmatch(self.schema):
            self._fail(f"schema name {self.schema!r} must be lower case letters, digits and _")
        if self.schema.startswith("pg_") or self.schema == "information_schema":
            self._fail(f"schema name {self.schema!r} is PostgreSQL's own (pg_… and "
                       "information_schema are the system's): choose another")
        inline = options.get("projections", "follow")
        if inline not in ("inline", "follow"):
            self._fail(f"projections={inline} must be inline or follow")
        self.projects_inline = inline == "inline"
        writers = options.get("writers", "combine")
        if writers not in ("lock", "combine"):
            self._fail(f"writers={writers} must be lock or combine")
        self.combines = writers == "combine"
        self.stream = LEDGER_STREAM
        self._local = threading.local()
        self._preload = Preload()
        self.schema_oid: int | None = None  # known once opened (``_check_and_create``)
        dbname = unquote(parts.path.lstrip("/"))
        if not dbname:  # libpq would pick one (the user's name, PGDATABASE): not the ledger's
            self._fail("the URL names no database (postgresql://user@host:port/db)")
        self.connect_args: dict[str, Any] = {
            "dbname": dbname,
            # as written (a socket's folder may be %2F-escaped: urlsplit would lower its case),
            # or as libpq's ?host= gives it (a socket's folder, several hosts)
            "host": options.get("host") or _host_of(parts.netloc),
            "port": parts.port or 5432,
            "user": unquote(parts.username or ""),
            "password": unquote(parts.password or ""),
        }
        if "password" in options:  # as libpq reads it: for one that is awkward to escape
            if parts.password is not None:
                self._fail("the password is given twice: in the user part and as ?password=")
            self.connect_args["password"] = options["password"]
        timeout = self.connect_timeout = self._seconds(options, "connect_timeout", 5)
        self.handoff = Handoff(self, self._seconds(options, "timeout", 30))
        # Sessions are named in pg_stat_activity (the URL's name, if it gives one).
        self.named = "application_name" not in options
        extra = {"options": f"-c search_path={self.schema}", "application_name": APPLICATION}
        extra.update((k, v) for k, v in options.items() if k in LIBPQ_OPTIONS)
        self.extra = extra
        self._check_and_create(timeout, extra)
        try:
            self.datastore = PostgresDatastore(
                **self.connect_args, schema=self.schema, connect_timeout=timeout,
                # no pool_open_timeout: eventsourcing would call psycopg_pool's
                # open(wait=True) at every use, which asserts (and after its
                # timeout closes the pool for good) once two threads find the
                # pool's one connection taken; it is opened once, below
                pool_size=1, max_overflow=3,
                idle_in_transaction_session_timeout=IDLE_IN_TRANSACTION,
            )
            arguments = self.datastore.pool.kwargs  # every pooled connection's
            arguments.update(extra, cursor_factory=SyncingCursor)  # type: ignore[union-attr]
            # its one connection made before a first use asks for one (which,
            # finding none yet, would have the pool make another: a role's
            # CONNECTION LIMIT counts them)
            self.datastore.pool.open(wait=True, timeout=timeout)
            self.recorder = LogRecorder(self.datastore, tracking_table_name=TRACKING)
            self.datastore.register_type_adapters()
        except (PersistenceError, psycopg.Error) as error:
            self._fail(describe(error))

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

    @property
    def lock_wait(self) -> float:
        """How long a command waits for a lock another holds (the URL's ``timeout``)."""
        return self.handoff.timeout

    def unavailable(self, error: BaseException) -> StoreUnavailable:
        return StoreUnavailable(f"store {self.shown}: {describe(error)}")

    def decide(self, batch: list[dict[str, Any]], decider: Decider) -> list[Any]:
        """Hand the batch to the writer that leads, which decides every waiting
        batch in one transaction (``ledger.postgres_handoff``), or
        (``?writers=lock``) take the log's lock and decide in this process's own."""
        if self.combines:
            return self.handoff.decide(batch, decider)
        return decide_here(self, batch, decider)

    def _seconds(self, options: dict[str, str], name: str, default: float) -> float:
        try:
            return seconds(options, name, default)
        except ValueError as error:
            self._fail(str(error))

    def _fail(self, reason: str) -> NoReturn:
        raise StoreUnavailable(f"cannot open store {self.shown}: {reason}") from None

    # -- opening -------------------------------------------------------------

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

    def _check_and_create(self, timeout: float, extra: dict[str, str]) -> None:
        """Create the schema once, or bring one an earlier version made up to
        this one (serialized across processes by an advisory lock)."""
        with self._connect(timeout, extra) as connection:
            if connection.info.server_version >= 140000:
                # Sessions idle by design (a follower or a standby listening, a
                # replay's claim, a pooled connection between a stream's
                # batches) are not ended by a role's or server's idle_session_timeout.
                extra["options"] = extra.get("options", "") + " -c idle_session_timeout=0"
            version, guarded, self.schema_oid, viewed = self._found(connection)
            if version == SCHEMA_VERSION:
                if not (guarded and viewed):
                    self._mend(connection)
                return
            if version > SCHEMA_VERSION:
                raise MadeByNewer(self.shown, version, SCHEMA_VERSION) from None
            if version == 0 and not self.create:
                self._fail(
                    f"there is no ledger in schema {self.schema} (nothing has been submitted "
                    "to it; check --store)"
                )
            try:
                key = (SCHEMA_LOCK, self._make_schema(connection))
                connection.execute("SELECT pg_catalog.pg_advisory_lock(%s, %s)", key)
                try:
                    version, _, self.schema_oid, _ = self._found(connection)
                    if version == 0 and (others := self._foreign(connection)):
                        self._fail(
                            f"schema {self.schema} holds tables of something else "
                            f"({first_few(others)}), not a ledger; name another schema for the "
                            "ledger (?schema=name)")
                    if version != SCHEMA_VERSION:
                        self._create_schema(connection, extra)
                finally:
                    connection.execute("SELECT pg_catalog.pg_advisory_unlock(%s, %s)", key)
            except (psycopg.Error, PersistenceError) as error:
                if version and _denied(error):
                    self._fail(
                        f"it was made by an earlier alloc-ledger (schema version {version}): "
                        "open it once as a role that may change its tables (their owner) to "
                        f"upgrade it ({describe(error, hint=False)})"
                    )
                self._fail(describe(error))

    def _foreign(self, connection: psycopg.Connection[Any]) -> list[str]:
        """What in a schema that holds no ledger would clash with one: tables
        or views by the names of the ledger's own (but for the log and the
        library's tracking table, which a ledger made halfway leaves, empty),
        and a log that holds events. A ledger of a release before the mark
        is known by its chain hashes: nothing of it is foreign."""
        names = (*OWN_TABLES, *tables.TABLES, *tables.ALL_VIEWS)
        try:
            present = dict(connection.execute(  # each with its columns
                "SELECT c.relname, (SELECT pg_catalog.array_agg(a.attname::text ORDER BY a.attnum) "
                "FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attnum > 0 "
                "AND NOT a.attisdropped) FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = %s AND c.relkind IN ('r', 'v', 'm', 'p', 'f') "
                "AND c.relname = ANY(%s) ORDER BY 1", (self.schema, list(names))).fetchall())
            if "event_hashes" in present:
                return []
            return not_a_ledger_yet(
                {name: tuple(columns or ()) for name, columns in present.items()},
                RECORDER_COLUMNS,
                lambda: bool(_value(connection, sql.SQL("SELECT EXISTS (SELECT FROM {})").format(
                    sql.Identifier(self.schema, "stored_events")))))
        except psycopg.Error as error:
            self._fail(describe(error))

    def _make_schema(self, connection: psycopg.Connection[Any]) -> int:
        """The schema's OID, the schema created if missing (by one process
        of several racing: the others find it made)."""
        for _ in range(2):
            found = self._found(connection).oid
            if found is not None:
                return found
            with suppress(psycopg.errors.UniqueViolation, psycopg.errors.DuplicateSchema):
                connection.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(
                    sql.Identifier(self.schema)))
        found = self._found(connection).oid
        if found is None:  # dropped as soon as made
            self._fail(f"schema {self.schema} vanished while it was being created")
        return found

    def _mend(self, connection: psycopg.Connection[Any]) -> None:
        """Make again the guards (``GUARDS``) of a store that lacks any, and the
        log's views it lacks (another process may be doing it too: under the
        schema's lock, look again)."""
        try:
            with connection.transaction():
                connection.execute(
                    "SELECT pg_catalog.pg_advisory_xact_lock(%s, %s)",
                    (SCHEMA_LOCK, self.schema_oid))
                found = self._found(connection)
                if not found.guarded:
                    for statement in GUARDS:
                        connection.execute(statement)
                if not found.viewed:
                    with connection.cursor() as cursor:
                        self._make_log_views(cursor)
        except psycopg.errors.InsufficientPrivilege:
            return  # not the owner: its next open mends them
        except psycopg.Error as error:
            self._fail(describe(error))

    def _make_log_views(self, cursor: Any) -> None:
        """The log's views that are missing, readable by whoever may read the
        others (``postgres_access``)."""
        with postgres_access.kept(cursor):
            tables.create_log_views(cursor, self.dialect, str(self.stream), PROJECTIONS)

    def _guard_names(self) -> dict[str, Any]:
        """The parameters of ``GUARD_STATES``."""
        return {
            "guarded": [f"{self.schema}.{table}" for table, _, _, _ in GUARDED],
            "guards": [name for _, name, _, _ in GUARDED],
            "fires": [fires for _, _, _, fires in GUARDED],
            "refusal": f"{self.schema}.refuse_change()", "body": REFUSAL,
        }

    def _found(self, connection: psycopg.Connection[Any]) -> Found:
        """What the schema holds (``Found``)."""
        names = {
            "hashes": f"{self.schema}.event_hashes", "schema": self.schema,
            "log_views": list(tables.LOG_VIEWS), **self._guard_names(),
        }
        try:
            row = connection.execute(FOUND, names).fetchone()
        except psycopg.Error as error:  # the server went away after it answered
            self._fail(describe(error))
        if row is None:
            return Found(0, False, None, False)
        if row[3]:
            self._fail(f"schema name {self.schema!r} is an SQL keyword: choose another")
        mark = MARKED.fullmatch(row[0] or "")
        version = int(mark[1]) if mark else 0
        return Found(WITHDRAWN.get(version, version), bool(row[1]), row[2], bool(row[4]))

    def _create_schema(self, connection: psycopg.Connection[Any], extra: dict[str, str]) -> None:
        """The ledger's tables in the schema ``_make_schema`` made."""
        # The recorder makes its tables on a connection of its pool, a second
        # one: made and closed here first, as a refused one says why (the
        # pool would say only how long it tried, after 10 s).
        self._connect(self.connect_timeout, extra, role="create").close()
        datastore = PostgresDatastore(
            **self.connect_args, schema=self.schema, pool_size=1, max_overflow=0,
            pool_open_timeout=10,
        )
        try:
            datastore.pool.kwargs.update(extra)  # type: ignore[union-attr]
            PostgresProcessRecorder(datastore, tracking_table_name=TRACKING).create_table()
        finally:
            datastore.close()
        with connection.transaction(), connection.cursor() as cursor:
            for statement in APPEND_ONLY + GUARDS:
                cursor.execute(statement)
            for prefix in ("", STATE_PREFIX):
                tables.create(cursor, self.dialect, prefix=prefix)
                tables.upgrade(cursor, self.dialect, prefix=prefix)  # made by an earlier version
            self._make_log_views(cursor)
            for statement in HANDOFF_TABLES:
                cursor.execute(statement)
            cursor.execute(
                f"INSERT INTO {TRACKING} (application_name, notification_id) VALUES (%s, 0) "
                "ON CONFLICT DO NOTHING",
                (PROJECTIONS,),
            )
            cursor.execute(f"COMMENT ON TABLE event_hashes IS '{MARK}'")

    # -- transactions --------------------------------------------------------

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

    # -- the log -------------------------------------------------------------

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

    # -- following and reporting (PostgreSQL only) ----------------------------

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

    def holders(self, relations: list[str]) -> list[str]:
        """Other sessions holding a lock on these tables or views (none given:
        any projection table or view): which, and who (pid, application,
        state), as ``pg_stat_activity`` says."""
        names = relations or [*tables.REPORTED, *(self.state_prefix + t for t in tables.TABLES)]
        with self.datastore.get_connection() as connection:
            rows = connection.cursor(row_factory=tuple_row).execute(
                HOLDERS, (self.schema, names)).fetchall()
        held: dict[str, list[str]] = {}
        for relation, pid, application, state in rows:
            who = f"pid {pid}" + (f" {application!r}" if application else "") + (
                f", {state}" if state else "")
            if who not in held.setdefault(relation, []):
                held[relation].append(who)
        return [f"{relation} (held by {'; '.join(who)})" for relation, who in held.items()]

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

    def keeping_grants(self, cursor: Any) -> Any:
        """Projection tables and views made again or redefined inside are
        readable, and owned, as before (``postgres_access``)."""
        return postgres_access.kept(cursor)

    def guards(self, cursor: Any) -> Guards:
        """The guards that are not as made (``GUARD_STATES``); only the
        tables' owner, opening the store, makes them again (``_mend``)."""
        cursor.execute(UNGUARDED, self._guard_names())
        lacking = tuple(f"{name}: {how}" for name, how in cursor.fetchall())
        owner = ""
        if lacking:
            cursor.execute(OWNER, (f"{self.schema}.stored_events",))
            found = cursor.fetchone()
            owner = f" ({found[0]})" if found and found[0] else ""
        cursor.execute(CREATORS, {"schema": self.schema, "log": f"{self.schema}.stored_events"})
        return Guards(lacking, f"open the store as the role that owns its tables{owner}: any "
                               "alloc-ledger command run as it makes them again",
                      exposed(self.schema, [row[0] for row in cursor.fetchall()]))

    def grant_reporting(self, role: str) -> list[str]:
        """Let a role read the projection tables and views, and nothing else:
        whatever it was granted on the ledger's other tables and sequences,
        or beyond SELECT on these, is revoked; a role that would still have
        more (a superuser, an owner, a member of a role that may write) is
        refused, nothing changed."""
        names = list(tables.REPORTED)
        schema, grantee = sql.Identifier(self.schema), sql.Identifier(role)
        try:
            with self.datastore.get_connection() as connection, connection.transaction():
                run = partial(_rows, connection)
                if (why := _more_than_granted(run, role, self.schema)) is not None:
                    raise GrantRefused(f"cannot make {role} a reporting role: {why}; "
                                      "nothing was changed: grant to a role of its own")
                ledger = [row["n"] for row in run(  # as far as they exist
                    "SELECT n FROM pg_catalog.unnest(%s::text[]) n "
                    "WHERE pg_catalog.to_regclass(pg_catalog.format('%%I.%%I', %s::text, n)) IS "
                    "NOT NULL",
                    ([*names, *OWN_TABLES], self.schema))]
                sequences = [(row["nsp"], row["rel"]) for row in run(SEQUENCES_OF, (
                    [f'"{self.schema}"."{n}"' for n in ledger],))]
                statements = [
                    sql.SQL("REVOKE ALL ON {} FROM {}").format(
                        sql.SQL(", ").join(sql.Identifier(self.schema, n) for n in ledger),
                        grantee),
                    *([sql.SQL("REVOKE ALL ON SEQUENCE {} FROM {}").format(
                        sql.SQL(", ").join(sql.Identifier(*q) for q in sequences), grantee)]
                      if sequences else []),
                    # public is shared: what else the role creates there is not the ledger's
                    *([sql.SQL("REVOKE CREATE ON SCHEMA {} FROM {}").format(schema, grantee)]
                      if self.schema != "public" else []),
                    sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(schema, grantee),
                    sql.SQL("GRANT SELECT ON {} TO {}").format(
                        sql.SQL(", ").join(sql.Identifier(self.schema, n) for n in names),
                        grantee),
                ]
                for statement in statements:
                    connection.execute(statement)
                # A GRANT by a role that may not grant only warns: check what took.
                missing = [row["n"] for row in run(
                    "SELECT n FROM pg_catalog.unnest(%s::text[]) n "
                    "WHERE NOT pg_catalog.has_table_privilege(%s::text, "
                    "pg_catalog.format('%%I.%%I', %s::text, n), "
                    "'SELECT') OR NOT pg_catalog.has_schema_privilege(%s::text, %s::text, 'USAGE')",
                    (names, role, self.schema, role, self.schema))]
                if missing:
                    raise GrantRefused(_may_not_grant(role, missing))
                beyond = [row["what"] for row in run(BEYOND_READING, {
                    "ledger": ledger, "names": names, "role": role, "schema": self.schema,
                    "sequences": [f'"{nsp}"."{rel}"' for nsp, rel in sequences]})]
                if beyond:
                    creates = (
                        f" (one that may create in the ledger's schema may run its code as "
                        f"the ledger's writers: REVOKE CREATE ON SCHEMA {self.schema} FROM "
                        "PUBLIC, as PostgreSQL 15 does for public, or from the role it has it "
                        "from)"
                    ) if any(w.startswith("CREATE in schema") for w in beyond) else ""
                    raise GrantRefused(
                        f"cannot make {role} a reporting role: it may still {first_few(beyond)} "
                        "(as a member of a role that may, or through PUBLIC); nothing was "
                        f"changed: grant to a role of its own{creates}"
                    )
        except (psycopg.Error, PersistenceError) as error:
            if _denied(error):  # a REVOKE on what it has no privilege on at all
                raise GrantRefused(_may_not_grant(role, names)) from None
            raise GrantRefused(f"cannot grant reporting to {role}: {describe(error)}") from None
        return names

    def close(self) -> None:
        self.handoff.close()
        self.datastore.close()


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
