"""PostgreSQL writes a batch as one statement per table.

Rows travel as one array per column, in binary (``%b``), and the server
unnests them: one parse, plan and executor start per table and batch instead
of one per row, and psycopg dumps a column in one call. The column types come
from the projection tables' own DDL (``projections.tables``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from eventsourcing.persistence import StoredEvent
from eventsourcing.postgres import PostgresProcessRecorder
from psycopg import sql

from ledger.domain import Changes
from projections import tables
from projections.rows import (
    ADDRESS_COLUMNS,
    ALLOC_COLUMNS,
    NODE_COLUMNS,
    SLOT_COLUMNS,
    changed_rows,
)

Rows = Sequence[tuple[Any, ...]]
ARRAY_TYPES = {"TEXT": "text[]", "INTEGER": "integer[]", "BIGINT": "bigint[]"}
_TABLE = re.compile(r"CREATE TABLE IF NOT EXISTS (\w+) \((.*)\)", re.DOTALL)
_COLUMN = re.compile(r"^\s*(\w+) (TEXT|INTEGER|BIGINT)\b", re.MULTILINE)


def column_types() -> dict[str, dict[str, str]]:
    """Each projection table's columns and their array types, read from its DDL."""
    found = {}
    for statement in tables.create_statements():
        table = _TABLE.match(statement)
        if table:
            found[table[1]] = {
                name: ARRAY_TYPES[kind] for name, kind in _COLUMN.findall(table[2])
            }
    return found


def unnested(table: str, columns: str, types: dict[str, str]) -> str:
    """``INSERT INTO table (columns) SELECT * FROM unnest(one array per column)``."""
    names = [c.strip() for c in columns.split(",")]
    arrays = ", ".join(f"%b::{types[name]}" for name in names)
    return f"INSERT INTO {table} ({', '.join(names)}) SELECT * FROM unnest({arrays})"


def upsert(table: str, columns: str, keys: str, types: dict[str, str]) -> str:
    key_names = {k.strip() for k in keys.split(",")}
    updates = ", ".join(
        f"{c} = excluded.{c}" for c in (n.strip() for n in columns.split(",")) if c not in key_names
    )
    return f"{unnested(table, columns, types)} ON CONFLICT ({keys}) DO UPDATE SET {updates}"


def by_column(rows: Rows) -> list[list[Any]]:
    """Rows as one list per column (what ``unnested`` statements take)."""
    return [list(column) for column in zip(*rows, strict=True)]


class BatchStatements:
    """The set-based SQL for one table prefix (``state_`` or the public tables)."""

    def __init__(self, prefix: str) -> None:
        types = column_types()
        t = prefix
        self.upsert_node = upsert(f"{t}nodes", NODE_COLUMNS, "node", types["nodes"])
        self.heartbeat = (
            f"UPDATE {t}nodes n SET last_heartbeat_at = u.at, last_heartbeat_position = u.position "
            "FROM unnest(%b::text[], %b::bigint[], %b::text[]) u(at, position, node) "
            "WHERE n.node = u.node"
        )
        self.upsert_slot = upsert(f"{t}slots", SLOT_COLUMNS, "node, slot", types["slots"])
        self.upsert_alloc = upsert(
            f"{t}allocations", ALLOC_COLUMNS, "alloc", types["allocations"])
        self.upsert_address = upsert(
            f"{t}addresses", ADDRESS_COLUMNS, "address", types["addresses"])
        self.delete_address = f"DELETE FROM {t}addresses WHERE address = ANY(%b::text[])"
        self.insert_state = unnested(
            f"{t}alloc_states", "alloc, position, value, at", types["alloc_states"])
        self.insert_rejection = unnested(
            f"{t}rejections", "position, type, entity, reason, event, at", types["rejections"])


def write_changes(
    cursor: Any, statements: BatchStatements, prefix: str, changes: Changes,
    decisions_only: bool = False,
) -> None:
    """``projections.rows.write_changes``, one statement per table."""
    for name, rows in changed_rows(changes, keep_logs=not (decisions_only and prefix)):
        if rows:
            cursor.execute(getattr(statements, name), by_column(rows))


class LogRecorder(PostgresProcessRecorder):
    """The library's recorder, with a batch insert for writers that hold its
    EXCLUSIVE lock already (taken when their transaction begins): the stored
    events travel as parallel arrays in binary, where the library's own insert
    dumps an array of a composite type as text, which costs several times more."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.insert_arrays_statement = sql.SQL(
            "INSERT INTO {schema}.{table} (originator_id, originator_version, topic, state) "
            "SELECT * FROM unnest(%b::{id_type}[], %b::bigint[], %b::text[], %b::bytea[])"
        ).format(
            schema=sql.Identifier(self.datastore.schema),
            table=sql.Identifier(self.events_table_name),
            id_type=sql.SQL(self.datastore.originator_id_type),
        )

    def insert_locked(self, curs: Any, stored_events: Sequence[StoredEvent]) -> None:
        """Insert in the caller's transaction, which holds the lock; notify followers."""
        self._notify_channel(curs)
        curs.execute(self.insert_arrays_statement, (
            [e.originator_id for e in stored_events],
            [e.originator_version for e in stored_events],
            [e.topic for e in stored_events],
            [e.state for e in stored_events],
        ))


INSERT_HASHES = "INSERT INTO event_hashes (position, hash) SELECT * FROM unnest(%b::bigint[], %b::text[])"
INSERT_IDS = "INSERT INTO event_ids (id, position) SELECT * FROM unnest(%b::text[], %b::bigint[])"
