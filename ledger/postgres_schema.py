"""PostgreSQL: opening a store makes its schema once, brings up to this
version one an earlier release made (serialized across processes by an
advisory lock), and makes again the guards and log views it lacks; then
tells which guards are not as made."""

from __future__ import annotations

import re
from contextlib import suppress
from typing import Any, NamedTuple
from uuid import UUID

import psycopg
from eventsourcing.persistence import PersistenceError
from eventsourcing.postgres import PostgresDatastore, PostgresProcessRecorder
from psycopg import sql

from ledger import postgres_access
from ledger.errors import MadeByNewer, first_few
from ledger.postgres_connections import PostgresConnections
from ledger.postgres_errors import denied, describe
from ledger.postgres_guards import (
    CREATORS,
    GUARDED,
    GUARDS,
    OWNER,
    REFUSAL,
    UNGUARDED,
    exposed,
)
from ledger.postgres_handoff import TABLES as HANDOFF_TABLES
from ledger.store import PROJECTIONS, Guards, not_a_ledger_yet
from projections import tables

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
STATE_PREFIX = tables.STATE_PREFIX
APPEND_ONLY = [
    """CREATE TABLE IF NOT EXISTS event_ids (id TEXT PRIMARY KEY, position BIGINT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS event_hashes (position BIGINT PRIMARY KEY, hash TEXT NOT NULL)""",
]


class Found(NamedTuple):
    """What a schema holds: the schema version of its ledger (0: none),
    whether all its guards are there as made (``GUARDED``), its OID (None:
    no such schema), and whether the log's views (or what else holds their
    names) are there."""

    version: int
    guarded: bool
    oid: int | None
    viewed: bool
    # a log's chain hashes are there (a ledger, marked or not: a restore
    # without comments leaves out the version mark)
    chained: bool = False
    handed: bool = False  # the writers' hand-over tables are there


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
    "WHERE n.nspname = %(schema)s AND c.relname = ANY(%(log_views)s::text[])), "
    # the ledger's chain hashes, as made, beside a log (not another
    # application's table of that name)
    "pg_catalog.to_regclass(%(events)s) IS NOT NULL AND (SELECT pg_catalog.array_agg("
    "a.attname::text ORDER BY a.attnum) FROM pg_attribute a "
    "WHERE a.attrelid = pg_catalog.to_regclass(%(hashes)s) AND a.attnum > 0 "
    "AND NOT a.attisdropped) = ARRAY['position', 'hash']::text[], "
    # (a dump that leaves out the writers' UNLOGGED tables, whose rows name the
    # original's sessions, restores a ledger without them)
    "pg_catalog.to_regclass(%(handoff)s) IS NOT NULL "
    "AND pg_catalog.to_regclass(%(outcomes)s) IS NOT NULL"
)
UNMARKED = ("its schema version mark is missing (a COMMENT on event_hashes, which a dump or "
            "restore with --no-comments leaves out)")
# Advisory locks are database-wide: the ledger's are in PostgreSQL's two-int
# form (a lock space apart from the one-bigint form), a fixed number of
# alloc-ledger's and the schema's OID, so no two schemas' locks are one.
# This one serializes creating and upgrading a schema; the default writers'
# lead is ``ledger.postgres_handoff.LEADER_LOCK``.
SCHEMA_LOCK = -275817905  # crc32("alloc-ledger:schema") as a signed int4
# The ledger's tables and views but those a reporting role reads: the log
# and its indexes, tracking, the writers' own.
OWN_TABLES = (
    *postgres_access.LOG_TABLES, *(STATE_PREFIX + t for t in (*tables.TABLES, *tables.VIEWS)),
)


def _value(connection: Any, statement: Any, params: Any = ()) -> Any:
    """The first column of a statement's first row (None: no row)."""
    row = connection.execute(statement, params).fetchone()
    return None if row is None else row[0]


class PostgresSchema(PostgresConnections):
    """A store's schema: made, upgraded or mended when the store opens
    (``_check_and_create``), and its guards' state (``guards``)."""

    create: bool
    schema_oid: int | None
    dialect: str
    stream: UUID

    def _check_and_create(self, timeout: float, extra: dict[str, str]) -> None:
        """Create the schema once, or bring one an earlier version made up to
        this one (serialized across processes by an advisory lock)."""
        with self._connect(timeout, extra) as connection:
            if connection.info.server_version >= 140000:
                # Sessions idle by design (a follower or a standby listening, a
                # replay's claim, a pooled connection between a stream's
                # batches) are not ended by a role's or server's idle_session_timeout.
                extra["options"] = extra.get("options", "") + " -c idle_session_timeout=0"
            found = self._found(connection)
            version, self.schema_oid = found.version, found.oid
            if version == SCHEMA_VERSION:
                if not (found.guarded and found.viewed and found.handed):
                    self._mend(connection)
                return
            if version > SCHEMA_VERSION:
                raise MadeByNewer(self.shown, version, SCHEMA_VERSION) from None
            # a log without the mark (restored without comments, or of a
            # release before it) is made up to this version as an earlier one
            unmarked = version == 0 and found.chained
            if version == 0 and not self.create and not unmarked:
                self._fail(
                    f"there is no ledger in schema {self.schema} (nothing has been submitted "
                    "to it; check --store)"
                )
            try:
                key = (SCHEMA_LOCK, self._make_schema(connection))
                connection.execute("SELECT pg_catalog.pg_advisory_lock(%s, %s)", key)
                try:
                    found = self._found(connection)
                    version, self.schema_oid = found.version, found.oid
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
                if (unmarked or version) and denied(error):
                    why, then = (
                        (UNMARKED, "mark it again") if unmarked else
                        (f"it was made by an earlier alloc-ledger (schema version {version})",
                         "upgrade it"))
                    self._fail(
                        f"{why}: open it once as a role that may change its tables (their "
                        f"owner) to {then} ({describe(error, hint=False)})")
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
        """Make again the guards (``GUARDS``) of a store that lacks any, the
        log's views it lacks and the writers' hand-over tables (another
        process may be doing it too: under the schema's lock, look again)."""
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
                if not found.handed:  # empty: what was on its way was the original's
                    with connection.cursor() as cursor, postgres_access.kept(cursor):
                        for statement in HANDOFF_TABLES:
                            cursor.execute(statement)
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
            "handoff": f"{self.schema}.handoff", "outcomes": f"{self.schema}.outcomes",
            "events": f"{self.schema}.stored_events",
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
        return Found(WITHDRAWN.get(version, version), bool(row[1]), row[2], bool(row[4]),
                     bool(row[5]), bool(row[6]))

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
