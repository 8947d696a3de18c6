"""PostgreSQL writes a batch as one statement per table.

A statement's rows travel as one JSON document, an array of row arrays that
orjson writes in C, and the server reads them with ``jsonb_array_elements``:
one parse, plan and executor start per table and batch instead of one per
row. (Arrays in binary, one per column, cost the writer about 0.5 us per
value in psycopg's list dumpers, ten times the JSON; the server's side is
about the same.) The column types come from the projection tables' own DDL
(``projections.tables``).
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Sequence
from functools import cache
from typing import Any

import orjson
from eventsourcing.postgres import PostgresProcessRecorder
from psycopg import sql

from ledger.store import LoggedEvent
from projections import tables
from projections.rows import (
    ADDRESS_COLUMNS,
    ALLOC_COLUMNS,
    LOGS,
    NODE_COLUMNS,
    SLOT_COLUMNS,
    ChangedRows,
    names,
    updates,
)

Rows = Sequence[Sequence[Any]]
SQL_TYPES = {"TEXT": "text", "INTEGER": "integer", "BIGINT": "bigint"}
_TABLE = re.compile(r"CREATE TABLE IF NOT EXISTS (\w+) \((.*)\)", re.DOTALL)
_COLUMN = re.compile(r"^\s*(\w+) (TEXT|INTEGER|BIGINT)\b", re.MULTILINE)


def column_types() -> dict[str, dict[str, str]]:
    """Each projection table's columns and their SQL types, read from its DDL."""
    found = {}
    for statement in tables.create_statements():
        table = _TABLE.match(statement)
        if table:
            found[table[1]] = {
                name: SQL_TYPES[kind] for name, kind in _COLUMN.findall(table[2])
            }
    return found


def rows_of(types: Sequence[str]) -> str:
    """A FROM item of the rows in the statement's JSON parameter (``as_json``),
    one column per type: ``(SELECT (r->>0)::text, ... FROM jsonb_array_elements(%s))``."""
    picked = ", ".join(f"(r->>{i})::{kind}" for i, kind in enumerate(types))
    return f"(SELECT {picked} FROM pg_catalog.jsonb_array_elements(%s::jsonb) r)"


def as_json(rows: Rows) -> str:
    """The parameter of a ``rows_of`` statement."""
    return orjson.dumps(rows).decode()


def inserted(table: str, columns: str, types: dict[str, str]) -> str:
    """``INSERT INTO table (columns) SELECT * FROM`` the rows of ``rows_of``."""
    listed = names(columns)
    return (
        f"INSERT INTO {table} ({', '.join(listed)}) "
        f"SELECT * FROM {rows_of([types[name] for name in listed])} rows"
    )


def upsert(prefix: str, table: str, columns: str, keys: str, types: dict[str, str]) -> str:
    return (
        f"{inserted(prefix + table, columns, types)} "
        f"ON CONFLICT ({keys}) DO UPDATE SET {updates(table, columns)}"
    )


class BatchStatements:
    """The set-based SQL for one table prefix (``state_`` or the public tables)."""

    def __init__(self, prefix: str) -> None:
        types = column_types()
        t = prefix
        self.upsert_node = upsert(t, "nodes", NODE_COLUMNS, "node", types["nodes"])
        self.heartbeat = (
            f"UPDATE {t}nodes n SET last_heartbeat_at = u.at, last_heartbeat_position = u.position "
            f"FROM {rows_of(['text', 'bigint', 'text'])} u(at, position, node) "
            "WHERE n.node = u.node"
        )
        self.upsert_slot = upsert(t, "slots", SLOT_COLUMNS, "node, slot", types["slots"])
        self.upsert_alloc = upsert(
            t, "allocations", ALLOC_COLUMNS, "alloc", types["allocations"])
        self.upsert_address = upsert(
            t, "addresses", ADDRESS_COLUMNS, "address", types["addresses"])
        self.delete_address = (
            f"DELETE FROM {t}addresses WHERE address IN (SELECT * FROM {rows_of(['text'])} r)")
        self.insert_state = inserted(
            f"{t}alloc_states", "alloc, position, value, at", types["alloc_states"])
        self.insert_rejection = inserted(
            f"{t}rejections", "position, type, entity, reason, event, at", types["rejections"])
        self.prefix = prefix
        self._together: dict[tuple[Any, ...], str] = {}

    def together(self, names: Sequence[str], first: Sequence[str] = (), then: str = "1") -> str:
        """One statement that runs ``first`` (SQL) and the named statements
        of this class as data-modifying CTEs, each taking its parameters in
        that order, then ``SELECT then``. One statement per batch, not one
        per table: each costs the writer and the server a parse, a plan (once
        prepared) and an executor start, and psycopg a round of its pipeline."""
        key = (tuple(names), tuple(first), then)
        found = self._together.get(key)
        if found is None:
            parts = [*first, *(getattr(self, name) for name in names)]
            ctes = ", ".join(f"w{number} AS ({part})" for number, part in enumerate(parts))
            found = self._together[key] = f"WITH {ctes} SELECT {then}"
        return found


@cache
def statements_for(prefix: str) -> BatchStatements:
    return BatchStatements(prefix)


def write_rows(cursor: Any, prefix: str, changed: ChangedRows) -> None:
    """Rows ``projections.rows.changed_rows`` built, into the tables of a
    prefix, in one statement (``together``)."""
    statements = statements_for(prefix)
    if any(rows for _, rows in changed):
        cursor.execute(
            statements.together([name for name, _ in changed]),
            [as_json(rows) for _, rows in changed],
        )


def write_kept(
    cursor: Any, prefix: str, recorder: LogRecorder, stream: Any,
    events: Sequence[LoggedEvent], hashes: Rows, ids: Rows, changed: ChangedRows,
) -> None:
    """Append stored events of ``stream`` with their chain hashes and client
    ids, write the decision rows they changed (not the logs kept for
    reporting: alloc states, rejections), and notify the log's followers, in
    one statement (``together``); the caller holds the log's lock."""
    changed = [(name, rows) for name, rows in changed if name not in LOGS]
    first = [recorder.insert_rows, INSERT_HASHES, INSERT_IDS]
    cursor.execute(
        statements_for(prefix).together(
            [name for name, _ in changed], first, "pg_catalog.pg_notify(%s, '')"),
        [
            stream,
            as_json([(e.originator_version, e.topic, e.state.decode()) for e in events]),
            as_json(hashes),
            as_json(ids),
            *(as_json(rows) for _, rows in changed),
            recorder.channel_name,
        ],
    )


class LogRecorder(PostgresProcessRecorder):
    """The library's recorder, with the SQL of a batch insert into its table
    for ``write_kept``: the stored events travel as one JSON document
    (``rows_of``), where the library's own insert dumps an array of a
    composite type as text, which costs several times more. A state is JSON
    text, carried as a JSON string."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        statement = sql.SQL(
            "INSERT INTO {schema}.{table} (originator_id, originator_version, topic, state) "
            "SELECT %s::{id_type}, version, topic, pg_catalog.convert_to(state, 'UTF8') FROM "
        ).format(
            schema=sql.Identifier(self.datastore.schema),
            table=sql.Identifier(self.events_table_name),
            id_type=sql.SQL(self.datastore.originator_id_type),
        ) + sql.SQL(rows_of(["bigint", "text", "text"]) + " r(version, topic, state)")
        self.insert_rows = statement.as_string(None)
        # The library's lock (``_lock_table``) without the ``SET LOCAL
        # lock_timeout`` it sends first (the datastore's: none): the store
        # bounds the wait itself (``PostgresStore.lock_log``).
        lock = self.lock_table_statements[-1]
        self.lock_statement = lock.as_string(None) if isinstance(lock, sql.Composable) else str(lock)
        # The library names the channel of appends after the table alone, so
        # every schema's followers would wake on every schema's appends: one of
        # the schema's own (by the crc32 of its name, as the writers' receipts).
        self.channel_name = appends_channel(self.datastore.schema)


def appends_channel(schema: str) -> str:
    """The NOTIFY channel of a schema's appends, which its followers LISTEN on."""
    return f"alloc_ledger_{zlib.crc32(schema.encode()):08x}_appended"


INSERT_HASHES = f"INSERT INTO event_hashes (position, hash) SELECT * FROM {rows_of(['bigint', 'text'])} r"
INSERT_IDS = f"INSERT INTO event_ids (id, position) SELECT * FROM {rows_of(['text', 'bigint'])} r"
