"""The projection tables and views: plain SQL, the same in SQLite and PostgreSQL.

Timestamps are UTC text of one fixed width (``2026-01-01T00:00:00.000000Z``)
so that text order is time order in both databases; lists are JSON text.
"""

from __future__ import annotations

import re
from typing import Any

from ledger import model


def sql_set(values: frozenset[str]) -> str:
    """A set of statuses as an SQL list: ``('a','b')``."""
    return "(" + ",".join(f"'{value}'" for value in sorted(values)) + ")"


TABLES = ("nodes", "slots", "allocations", "alloc_states", "addresses", "rejections")
VIEWS = ("needs_reconnect", "zombie_slots")
# The prefix of the copies that PostgreSQL's writers decide against
# (``state_nodes`` …), kept at the head of the log beside the live tables.
STATE_PREFIX = "state_"
LIVE = sql_set(model.LIVE)
TERMINAL = sql_set(model.TERMINAL)
# The current time in the tables' text form (``ledger.model.timestamp``), to
# the millisecond in SQLite, for the views' ``expired``.
NOW_TEXT = {
    "sqlite": "(strftime('%Y-%m-%dT%H:%M:%f', 'now') || '000Z')",
    "postgresql": (
        """pg_catalog.to_char(pg_catalog.now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')"""
    ),
}


def create_statements(prefix: str = "", dialect: str = "sqlite") -> list[str]:
    """DDL for every projection table and view; ``prefix`` names scratch copies."""
    p = prefix
    now = NOW_TEXT[dialect]
    return [
        f"""CREATE TABLE IF NOT EXISTS {p}nodes (
            node TEXT PRIMARY KEY,
            status TEXT NOT NULL,
            health TEXT NOT NULL,
            parent TEXT,
            slots INTEGER NOT NULL,
            slots_used INTEGER NOT NULL,
            allocs INTEGER NOT NULL,
            reason TEXT,
            since_position BIGINT NOT NULL,
            last_heartbeat_at TEXT,
            last_heartbeat_position BIGINT,
            lost_allocs TEXT NOT NULL,
            registered_position BIGINT NOT NULL,
            health_reason TEXT)""",
        f"CREATE INDEX IF NOT EXISTS {p}nodes_parent ON {p}nodes (parent)",
        f"""CREATE TABLE IF NOT EXISTS {p}slots (
            node TEXT NOT NULL,
            slot INTEGER NOT NULL,
            state TEXT NOT NULL,
            alloc TEXT,
            since_position BIGINT NOT NULL,
            reported_alloc TEXT,
            reported_position BIGINT,
            PRIMARY KEY (node, slot))""",
        f"""CREATE INDEX IF NOT EXISTS {p}slots_reported ON {p}slots (reported_alloc)
            WHERE reported_alloc IS NOT NULL""",
        f"""CREATE TABLE IF NOT EXISTS {p}allocations (
            alloc TEXT PRIMARY KEY,
            node TEXT NOT NULL,
            job TEXT,
            slot INTEGER,
            desired_status TEXT NOT NULL,
            client_status TEXT NOT NULL,
            needs_reconnect INTEGER NOT NULL,
            addresses TEXT NOT NULL,
            max_disconnect INTEGER,
            unknown_since_position BIGINT,
            unknown_since_at TEXT,
            deadline TEXT,
            placed_position BIGINT NOT NULL,
            updated_position BIGINT NOT NULL,
            removed INTEGER NOT NULL)""",
        f"""CREATE INDEX IF NOT EXISTS {p}allocations_live ON {p}allocations (node)
            WHERE client_status IN {LIVE}""",
        f"CREATE INDEX IF NOT EXISTS {p}allocations_node ON {p}allocations (node)",
        f"CREATE INDEX IF NOT EXISTS {p}allocations_job ON {p}allocations (job)",
        f"""CREATE INDEX IF NOT EXISTS {p}allocations_reconnect ON {p}allocations (alloc)
            WHERE needs_reconnect = 1""",
        f"""CREATE TABLE IF NOT EXISTS {p}alloc_states (
            alloc TEXT NOT NULL,
            position BIGINT NOT NULL,
            value TEXT NOT NULL,
            at TEXT NOT NULL,
            PRIMARY KEY (alloc, position))""",
        f"""CREATE TABLE IF NOT EXISTS {p}addresses (
            address TEXT PRIMARY KEY,
            alloc TEXT NOT NULL,
            node TEXT NOT NULL,
            state TEXT NOT NULL,
            since_position BIGINT NOT NULL)""",
        f"CREATE INDEX IF NOT EXISTS {p}addresses_alloc ON {p}addresses (alloc)",
        f"""CREATE TABLE IF NOT EXISTS {p}rejections (
            position BIGINT PRIMARY KEY,
            type TEXT NOT NULL,
            entity TEXT NOT NULL,
            reason TEXT NOT NULL,
            event TEXT NOT NULL,
            at TEXT NOT NULL)""",
        f"""CREATE VIEW {p}needs_reconnect AS
            SELECT alloc, node, job, desired_status, unknown_since_position,
                   unknown_since_at, deadline, max_disconnect,
                   CASE WHEN deadline IS NULL THEN NULL
                        WHEN deadline <= {now} THEN 1 ELSE 0 END AS expired
            FROM {p}allocations WHERE needs_reconnect = 1""",
        f"""CREATE VIEW {p}zombie_slots AS
            SELECT node, slot, alloc, reason, position FROM (
                SELECT s.node, s.slot, s.reported_alloc AS alloc,
                    CASE
                        WHEN a.alloc IS NULL THEN 'unknown-alloc'
                        WHEN a.removed = 1 OR a.client_status IN {TERMINAL} THEN 'released'
                        WHEN d.n > 1
                            AND NOT (a.node = s.node AND a.slot IS NOT NULL AND a.slot = s.slot)
                            THEN 'duplicate'
                        WHEN a.node <> s.node OR a.slot IS NULL OR a.slot <> s.slot
                            THEN 'moved'
                    END AS reason,
                    s.reported_position AS position
                FROM {p}slots s
                JOIN {p}nodes n ON n.node = s.node AND n.status <> 'removed'
                LEFT JOIN {p}allocations a ON a.alloc = s.reported_alloc
                LEFT JOIN (
                    SELECT node, reported_alloc, COUNT(*) AS n FROM {p}slots
                    WHERE reported_alloc IS NOT NULL GROUP BY node, reported_alloc
                ) d ON d.node = s.node AND d.reported_alloc = s.reported_alloc
                WHERE s.reported_alloc IS NOT NULL
            ) z WHERE reason IS NOT NULL""",
    ]


# Views of the log for readers who may not read it or ``tracking`` (a
# PostgreSQL view runs as its owner): how far the projection tables have
# read it, and what each position is (its type and times, so a reporting
# tool can turn a ``since_position`` into a time).
STATUS_VIEW = "projection_status"
POSITIONS_VIEW = "log_positions"
LOG_VIEWS = (STATUS_VIEW, POSITIONS_VIEW)
ALL_VIEWS = (*VIEWS, *LOG_VIEWS)
REPORTED = (*TABLES, *ALL_VIEWS)  # what a reporting tool reads
# The JSON of a kept event (``ledger.records``), as each database reads it.
_KEPT = {
    "sqlite": "CAST(e.state AS TEXT)",
    "postgresql": "pg_catalog.convert_from(e.state, 'UTF8')::json",
}
_FIELD = {
    "sqlite": lambda kept, *path: f"json_extract({kept}, '$.{'.'.join(path)}')",
    "postgresql": lambda kept, *path: f"({kept} #>> '{{{','.join(path)}}}')",
}


def log_view_statements(dialect: str, stream: str, application: str) -> dict[str, str]:
    """The log's views: ``stream`` is the log's, ``application`` the
    projections' row in ``tracking``."""
    field = _FIELD[dialect]
    kept = "k.kept"
    return {
        STATUS_VIEW: f"""CREATE VIEW {STATUS_VIEW} AS
        SELECT h.head AS head_position, t.projected AS projected_position,
               h.head - t.projected AS lag
        FROM (SELECT COALESCE(MAX(originator_version), 0) AS head FROM stored_events
              WHERE originator_id = '{stream}') h,
             (SELECT COALESCE(MAX(notification_id), 0) AS projected FROM tracking
              WHERE application_name = '{application}') t""",
        POSITIONS_VIEW: f"""CREATE VIEW {POSITIONS_VIEW} AS
        SELECT k.position, {field(kept, "event", "type")} AS type,
               {field(kept, "event", "at")} AS at, {field(kept, "recorded_at")} AS recorded_at,
               CASE WHEN k.topic = 'rejected' THEN 1 ELSE 0 END AS rejected
        FROM (SELECT e.originator_version AS position, e.topic, {_KEPT[dialect]} AS kept
              FROM stored_events e WHERE e.originator_id = '{stream}') k""",
    }


def create_log_views(cursor: Any, dialect: str, stream: str, application: str) -> list[str]:
    """The log's views that are missing (once); the names of those made now.
    A name something else holds (a table another application put beside an
    earlier release's ledger) is left to it: that view is not made."""
    made = []
    for name, statement in log_view_statements(dialect, stream, application).items():
        cursor.execute(name_taken_check(dialect, name))
        if cursor.fetchone() is None:
            cursor.execute(statement)
            made.append(name)
    return made


def name_taken_check(dialect: str, name: str) -> str:
    """A query with a row when a table, view or other relation has the name."""
    if dialect == "sqlite":
        return f"SELECT 1 FROM sqlite_master WHERE name='{name}'"
    return ("SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            f"WHERE n.nspname = pg_catalog.current_schema() AND c.relname = '{name}'")


def view_exists_check(dialect: str, name: str) -> str:
    if dialect == "sqlite":
        return f"SELECT 1 FROM sqlite_master WHERE type='view' AND name='{name}'"
    return ("SELECT 1 FROM information_schema.views "
            f"WHERE table_name='{name}' AND table_schema=pg_catalog.current_schema()")


def create(
    cursor: object, dialect: str, prefix: str = "", indexes: bool = True, views: bool = True
) -> None:
    """Create the tables and (once) the views; ``indexes=False`` leaves the
    indexes to ``create_indexes``, for tables about to be filled in bulk;
    ``views=False`` only the tables (and indexes)."""
    for statement in create_statements(prefix, dialect):
        if statement.startswith("CREATE VIEW") or (
            not indexes and statement.startswith("CREATE INDEX")
        ):
            continue
        if dialect == "sqlite":  # there, only INTEGER PRIMARY KEY is the row id itself
            statement = statement.replace("BIGINT PRIMARY KEY", "INTEGER PRIMARY KEY")
        cursor.execute(statement)  # type: ignore[attr-defined]
    if views:
        create_views(cursor, dialect, prefix)


def create_views(cursor: Any, dialect: str, prefix: str = "") -> None:
    """The views of a prefix that are missing (those there are left as they
    are): derived from the tables, so one dropped by hand is made again as it was."""
    for statement in create_statements(prefix, dialect):
        if statement.startswith("CREATE VIEW"):
            cursor.execute(view_exists_check(dialect, statement.split()[2]))
            if cursor.fetchone() is None:
                cursor.execute(statement)


# What a store made by an earlier version lacks; creating its tables and
# views again leaves the ones there as they are. ``nodes.health_reason``:
# rules 3. ``zombie_slots``: an allocation placed without a slot, reported on
# two slots, is a duplicate (it was called moved); a removed node's last
# report is no zombie (schema 3 on SQLite, 5 on PostgreSQL).
# ``needs_reconnect.expired`` (schema 3 and 5).
ADDED_COLUMNS = {"nodes": [("health_reason", "TEXT")]}
CHANGED_VIEWS = ("zombie_slots", "needs_reconnect")


def upgrade(cursor: Any, dialect: str, prefix: str = "") -> None:
    """Bring the tables and views of a prefix to this version's shape (a
    PostgreSQL view is replaced in place, keeping what was granted on it)."""
    for table, columns in ADDED_COLUMNS.items():
        for column, kind in columns:
            add_column(cursor, dialect, prefix + table, column, kind)
    remake_views(cursor, dialect, prefix, CHANGED_VIEWS)


def remake_views(cursor: Any, dialect: str, prefix: str, views: tuple[str, ...]) -> None:
    """Views of a prefix made again as this version makes them (a PostgreSQL
    view is replaced in place, keeping what was granted on it, where its
    columns are still those this version gives it)."""
    for view in views:
        statement = next(s for s in create_statements(prefix, dialect)
                         if s.startswith(f"CREATE VIEW {prefix}{view} "))
        if dialect == "postgresql" and _columns_kept(cursor, prefix + view, statement):
            cursor.execute(statement.replace("CREATE VIEW", "CREATE OR REPLACE VIEW", 1))
        else:  # PostgreSQL replaces a view in place only where its columns stay
            cursor.execute(f"DROP VIEW IF EXISTS {prefix}{view}")
            cursor.execute(statement)


def _columns_kept(cursor: Any, view: str, statement: str) -> bool:
    """Whether a PostgreSQL view that is there (or none) has the columns
    ``statement`` begins with, in order: ``CREATE OR REPLACE`` may add
    columns after them, never rename or drop one."""
    cursor.execute("SELECT pg_catalog.to_regclass(%s) IS NULL", (view,))
    if cursor.fetchone()[0]:
        return True
    held = columns_of(cursor, view)
    return held == columns_of(cursor, f"({statement.split(' AS', 1)[1]}) v")[:len(held)]


def columns_of(cursor: Any, relation: str) -> list[str]:
    """A table's or view's (or a subquery's) columns, in their order."""
    cursor.execute(f"SELECT * FROM {relation} WHERE 1 = 0")
    return [d[0] for d in cursor.description]


def remake(cursor: Any, dialect: str, prefix: str, names: tuple[str, ...]) -> None:
    """Tables of a prefix that lost columns by hand made whole again, empty.
    SQLite's are dropped and made again (its views name them, and read them
    again once they are back). PostgreSQL's are emptied and given back the
    columns, primary key, indexes and views they lack: dropping one would
    take every view over it along, a reporting tool's own too."""
    for name in names:
        table = prefix + name
        if dialect == "sqlite":
            cursor.execute(f"DROP TABLE {table}")
            continue
        cursor.execute(f"DELETE FROM {table}")
        present = set(columns_of(cursor, table))
        columns, key = shape(name)
        retyped = [c for c, kind in column_types(cursor, table).items()
                   if c in columns and kind != _kind(columns[c])]
        if retyped:  # its views cannot stay over a column whose type changes
            for view in VIEWS:
                cursor.execute(f"DROP VIEW IF EXISTS {prefix}{view}")
        for column in retyped:
            kind = columns[column].split()[0]
            cursor.execute(f"ALTER TABLE {table} ALTER COLUMN {column} TYPE {kind} "
                           f"USING NULL::{kind}")
        for column, definition in columns.items():
            if column not in present:
                cursor.execute(f"ALTER TABLE {table} ADD COLUMN {column} {definition}")
        cursor.execute("SELECT 1 FROM pg_constraint WHERE contype = 'p' AND "
                       "conrelid = pg_catalog.to_regclass(%s)", (table,))
        if key and cursor.fetchone() is None:
            cursor.execute(f"ALTER TABLE {table} ADD {key}")
    create(cursor, dialect, prefix)


def indexes_of(prefix: str, table: str) -> list[str]:
    """The names of the indexes this version gives a prefix's table."""
    return [s.split()[5] for s in create_statements(prefix)
            if s.startswith("CREATE INDEX") and s.split()[7] == prefix + table]


def index_names(cursor: Any, dialect: str, table: str) -> set[str]:
    """The indexes a table has, by name."""
    if dialect == "sqlite":
        cursor.execute("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = ?",
                       (table,))
    else:
        cursor.execute("SELECT indexname FROM pg_indexes "
                       "WHERE schemaname = pg_catalog.current_schema() AND tablename = %s",
                       (table,))
    return {row[0] for row in cursor.fetchall()}


def column_types(cursor: Any, table: str) -> dict[str, str]:
    """A PostgreSQL table's columns and their types, as the server names them."""
    cursor.execute("SELECT column_name, data_type FROM information_schema.columns "
                   "WHERE table_schema = pg_catalog.current_schema() AND table_name = %s",
                   (table,))
    return {row[0]: row[1] for row in cursor.fetchall()}


def _kind(definition: str) -> str:
    """The server's name of the type a column definition gives."""
    return {"TEXT": "text", "INTEGER": "integer", "BIGINT": "bigint"}[definition.split()[0]]


def shape(name: str) -> tuple[dict[str, str], str | None]:
    """A projection table's columns (name: definition), and its primary key
    if it is a clause of its own (``PRIMARY KEY (node, slot)``), as made."""
    statement = next(s for s in create_statements() if s.startswith(f"CREATE TABLE IF NOT EXISTS {name} ("))
    body = statement.split("(", 1)[1].rsplit(")", 1)[0]
    columns, key = {}, None
    for part in (p.strip() for p in re.split(r",\s*\n", body)):
        if part.startswith("PRIMARY KEY"):
            key = part
        else:
            column, definition = part.split(None, 1)
            columns[column] = definition
    return columns, key


def add_column(cursor: Any, dialect: str, table: str, column: str, kind: str) -> None:
    """Add a column a table made by an earlier version lacks. Looked up first:
    adding one takes the table's owner and its strongest lock, even where the
    column is there already (PostgreSQL's ``ADD COLUMN IF NOT EXISTS``)."""
    if dialect == "sqlite":
        cursor.execute(f"SELECT 1 FROM pragma_table_info('{table}') WHERE name = '{column}'")
    else:
        cursor.execute(
            "SELECT 1 FROM information_schema.columns "
            "WHERE table_schema = pg_catalog.current_schema() "
            f"AND table_name = '{table}' AND column_name = '{column}'")
    if cursor.fetchone() is None:
        cursor.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")


def create_indexes(cursor: object, prefix: str = "") -> None:
    """The indexes ``create(..., indexes=False)`` left out (once filled, building
    an index is faster than keeping it up to date row by row)."""
    for statement in create_statements(prefix):
        if statement.startswith("CREATE INDEX"):
            cursor.execute(statement)  # type: ignore[attr-defined]


# The names of the relations in the store's own schema that begin with a
# prefix (LIKE's wildcards in it escaped), as each database lists them.
_NAMED_LIKE = {
    "sqlite": "SELECT name FROM sqlite_master WHERE name LIKE ? ESCAPE '!'",
    "postgresql": "SELECT relname FROM pg_class WHERE relnamespace = "
                  "pg_catalog.current_schema()::regnamespace AND relname LIKE %s ESCAPE '!'",
}


def named_like(cursor: Any, dialect: str, prefix: str) -> list[str]:
    """The tables and views whose names begin with ``prefix``."""
    escaped = prefix.replace("!", "!!").replace("_", "!_").replace("%", "!%")
    cursor.execute(_NAMED_LIKE[dialect], (escaped + "%",))
    return [row[0] for row in cursor.fetchall()]


def drop(cursor: object, prefix: str) -> None:
    """Drop scratch copies made with ``prefix``."""
    for view in VIEWS:
        cursor.execute(f"DROP VIEW IF EXISTS {prefix}{view}")  # type: ignore[attr-defined]
    for table in TABLES:
        cursor.execute(f"DROP TABLE IF EXISTS {prefix}{table}")  # type: ignore[attr-defined]


# A database's words for a table or view that is not there: SQLite's, PostgreSQL's.
MISSING = re.compile(r'no such table: (?:\w+\.)?(\w+)|relation "(?:\w+\.)?(\w+)" does not exist')
DERIVED = frozenset({*TABLES, *VIEWS, *(STATE_PREFIX + name for name in (*TABLES, *VIEWS))})


# Their words for a column that is not there (in a statement of the ledger's own).
NO_COLUMN = re.compile(r'no such column: (?:\w+\.)?(\w+)|has no column named (\w+)|'
                       r'column "?(?:\w+\.)?(\w+)"? (?:of relation "\w+" )?does not exist')


def with_repair_hint(line: str) -> str:
    """A database error naming a projection table (or view, or PostgreSQL's
    ``state_`` copy) that is not there, or a column of one, with how to make
    it again."""
    found = MISSING.search(line)
    if found is not None and (found.group(1) or found.group(2)) in DERIVED:
        return (f"{line} (a projection table dropped by hand? alloc-ledger replay --repair "
                "makes it again from the log)")
    column = NO_COLUMN.search(line)
    if column is not None and next(g for g in column.groups() if g) in _projected_columns():
        return (f"{line} (a column of a projection table dropped by hand? alloc-ledger replay "
                "--repair makes the table whole again from the log)")
    return line


def _projected_columns() -> set[str]:
    return {column for table in TABLES for column in shape(table)[0]}
