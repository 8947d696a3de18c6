"""SQLite writes a batch as one statement per table (and reads what it
names that way, ``preload``).

A statement's rows travel as one JSON document, an array of row arrays that
orjson writes in C, and SQLite reads them with ``json_each``. The point is
the GIL, not the statement count: ``executemany`` takes the GIL back after
every row it steps, while one statement steps all of a table's rows in one
``sqlite3_step``, without it. So a bulk submit can write and commit one
batch in a thread while the main thread decides the next
(``ledger.pipeline``); with ``executemany`` the two threads convoy on the
GIL and the overlap is lost.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Any

import orjson

from ledger.model import AddressHold
from ledger.store import LoggedEvent
from projections.rows import (
    ADDRESS_COLUMNS,
    ALLOC_COLUMNS,
    NODE_COLUMNS,
    SLOT_COLUMNS,
    ChangedRows,
    alloc_from,
    names,
    updates,
)

Rows = Sequence[Sequence[Any]]


def picked(count: int) -> str:
    """The columns of a row of the JSON parameter, as ``json_each`` gives it."""
    return ", ".join(f"json_extract(value, '$[{i}]')" for i in range(count))


def inserted(table: str, columns: str) -> str:
    listed = names(columns)
    return (
        f"INSERT INTO {table} ({', '.join(listed)}) "
        f"SELECT {picked(len(listed))} FROM json_each(?) WHERE true"  # WHERE: see ON CONFLICT
    )


def upsert(prefix: str, table: str, columns: str, keys: str) -> str:
    return (
        f"{inserted(prefix + table, columns)} "
        f"ON CONFLICT ({keys}) DO UPDATE SET {updates(table, columns)}"
    )


def as_json(rows: Sequence[Any]) -> bytes:
    """The parameter of a statement of this module."""
    return orjson.dumps(rows)


class BatchStatements:
    """The statements of ``projections.rows.Statements`` (by the same names)
    for one table prefix, each writing every row of a batch at once."""

    def __init__(self, prefix: str) -> None:
        t = prefix
        self.upsert_node = upsert(t, "nodes", NODE_COLUMNS, "node")
        self.heartbeat = (
            f"UPDATE {t}nodes SET last_heartbeat_at = u.at, last_heartbeat_position = u.position "
            "FROM (SELECT json_extract(value, '$[0]') AS at, json_extract(value, '$[1]') AS position, "
            "json_extract(value, '$[2]') AS node FROM json_each(?)) u "
            f"WHERE {t}nodes.node = u.node"
        )
        self.upsert_slot = upsert(t, "slots", SLOT_COLUMNS, "node, slot")
        self.upsert_alloc = upsert(t, "allocations", ALLOC_COLUMNS, "alloc")
        self.upsert_address = upsert(t, "addresses", ADDRESS_COLUMNS, "address")
        self.delete_address = (
            f"DELETE FROM {t}addresses WHERE address IN "
            "(SELECT json_extract(value, '$[0]') FROM json_each(?))"
        )
        self.insert_state = inserted(f"{t}alloc_states", "alloc, position, value, at")
        self.insert_rejection = inserted(
            f"{t}rejections", "position, type, entity, reason, event, at")
        self.allocs_named = (
            f"SELECT {ALLOC_COLUMNS} FROM {t}allocations "
            "WHERE alloc IN (SELECT value FROM json_each(?))"
        )
        self.addresses_named = (
            f"SELECT {ADDRESS_COLUMNS} FROM {t}addresses "
            "WHERE address IN (SELECT value FROM json_each(?))"
        )


INSERT_HASHES = inserted("event_hashes", "position, hash")
INSERT_IDS = inserted("event_ids", "id, position")
KNOWN_IDS = "SELECT id, position FROM event_ids WHERE id IN (SELECT value FROM json_each(?))"


def insert_events(table: str) -> str:
    """A batch of one stream's stored events into the recorder's table (its
    columns); a state is JSON text, carried as a JSON string and stored as
    the same bytes."""
    return (
        f"INSERT INTO {table} (originator_id, originator_version, topic, state) "
        "SELECT ?, json_extract(value, '$[0]'), json_extract(value, '$[1]'), "
        "CAST(json_extract(value, '$[2]') AS BLOB) FROM json_each(?)"
    )


@cache
def statements_for(prefix: str) -> BatchStatements:
    return BatchStatements(prefix)


def preload(
    cursor: Any, prefix: str, cluster: Any, allocs: set[str], addresses: set[str]
) -> None:
    """Load allocations and addresses into a cluster's caches, absent ones
    too, one statement each."""
    statements = statements_for(prefix)
    if allocs:
        cursor.execute(statements.allocs_named, (as_json(list(allocs)),))
        found = {row[0]: alloc_from(row) for row in cursor.fetchall()}
        for alloc in allocs:
            cluster.allocs[alloc] = found.get(alloc)
    if addresses:
        cursor.execute(statements.addresses_named, (as_json(list(addresses)),))
        held = {row[0]: AddressHold(*row) for row in cursor.fetchall()}
        for address in addresses:
            cluster.addresses[address] = held.get(address)


def write_rows(cursor: Any, prefix: str, changed: ChangedRows) -> None:
    """Rows ``projections.rows.changed_rows`` built, into the tables of a
    prefix, one statement per table with rows."""
    statements = statements_for(prefix)
    for name, rows in changed:
        if rows:
            cursor.execute(getattr(statements, name), (as_json(rows),))


def write_events(
    cursor: Any, table: str, stream: str, events: Sequence[LoggedEvent], hashes: Rows, ids: Rows
) -> None:
    """Stored events of one stream, their chain hashes and client ids."""
    cursor.execute(
        insert_events(table),
        (stream, as_json([(e.originator_version, e.topic, e.state.decode()) for e in events])),
    )
    cursor.execute(INSERT_HASHES, (as_json(hashes),))
    if ids:
        cursor.execute(INSERT_IDS, (as_json(ids),))
