"""Entities to projection rows and back; the SQL that reads and writes them.

``TableSource`` lets the domain load entities from the projection tables,
``write_changes`` writes what the domain changed, in the caller's
transaction, one ``executemany`` per table.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import orjson

from ledger.domain import Changes, Cluster
from ledger.model import AddressHold, Allocation, Node, Slot, rejected_json
from projections import tables

if TYPE_CHECKING:
    from ledger.store import Store

NODE_COLUMNS = (
    "node, status, health, parent, slots, slots_used, allocs, reason, since_position, "
    "last_heartbeat_at, last_heartbeat_position, lost_allocs, registered_position, health_reason"
)
SLOT_COLUMNS = "node, slot, state, alloc, since_position, reported_alloc, reported_position"
ALLOC_COLUMNS = (
    "alloc, node, job, slot, desired_status, client_status, needs_reconnect, addresses, "
    "max_disconnect, unknown_since_position, unknown_since_at, deadline, placed_position, "
    "updated_position, removed"
)
ADDRESS_COLUMNS = "address, alloc, node, state, since_position"
# Columns a row keeps from its insert: a node is registered once, an
# allocation placed once. An upsert leaves them out of its SET, so SQLite
# does not rewrite the indexes on them (parent; node, job) for every update.
FIXED = {
    "nodes": ("node", "parent", "slots", "registered_position"),
    "slots": ("node", "slot"),
    "allocations": (
        "alloc", "node", "job", "slot", "addresses", "max_disconnect", "placed_position"),
    "addresses": ("address",),
}


def names(columns: str) -> list[str]:
    return [c.strip() for c in columns.split(",")]


def updates(table: str, columns: str) -> str:
    """The SET list of an upsert of ``columns`` into ``table`` (of any prefix)."""
    return ", ".join(f"{c} = excluded.{c}" for c in names(columns) if c not in FIXED[table])


def _upsert(table: str, columns: str, keys: str, p: str, prefix: str) -> str:
    marks = ", ".join([p] * len(names(columns)))
    return (
        f"INSERT INTO {prefix}{table} ({columns}) VALUES ({marks}) "
        f"ON CONFLICT ({keys}) DO UPDATE SET {updates(table, columns)}"
    )


def _json_list(values: list[str]) -> str:
    return orjson.dumps(values).decode() if values else "[]"


def node_row(n: Node) -> tuple[Any, ...]:
    return (
        n.node, n.status, n.health, n.parent, n.slots, n.slots_used, n.allocs, n.reason,
        n.since_position, n.last_heartbeat_at, n.last_heartbeat_position,
        _json_list(n.lost_allocs), n.registered_position, n.health_reason,
    )


def node_from(row: Any) -> Node:
    (node, status, health, parent, slots, slots_used, allocs, reason, since_position,
     heartbeat_at, heartbeat_position, lost_allocs, registered_position, health_reason) = row
    return Node(
        node=node, slots=slots, parent=parent, status=status, health=health, reason=reason,
        since_position=since_position, last_heartbeat_at=heartbeat_at,
        last_heartbeat_position=heartbeat_position, slots_used=slots_used, allocs=allocs,
        lost_allocs=json.loads(lost_allocs), registered_position=registered_position,
        health_reason=health_reason,
    )


def slot_row(s: Slot) -> tuple[Any, ...]:
    return (s.node, s.slot, s.state, s.alloc, s.since_position, s.reported_alloc,
            s.reported_position)


def alloc_row(a: Allocation) -> tuple[Any, ...]:
    return (
        a.alloc, a.node, a.job, a.slot, a.desired_status, a.client_status,
        int(a.needs_reconnect), _json_list(a.addresses), a.max_disconnect,
        a.unknown_since_position, a.unknown_since_at, a.deadline, a.placed_position,
        a.updated_position, int(a.removed),
    )


def alloc_from(row: Any) -> Allocation:
    (alloc, node, job, slot, desired, client, needs, addresses, max_disconnect,
     since_position, since_at, _deadline, placed, updated, removed) = row
    return Allocation(
        alloc, node, job, slot, json.loads(addresses), max_disconnect, desired, client,
        bool(needs), since_position, since_at, placed, updated, bool(removed),
    )


def address_row(h: AddressHold) -> tuple[Any, ...]:
    return (h.address, h.alloc, h.node, h.state, h.since_position)


class Statements:
    """The SQL for one table prefix and one parameter style."""

    def __init__(self, param: str, prefix: str = "") -> None:
        p, t = param, prefix
        self.prefix = prefix
        self.node = f"SELECT {NODE_COLUMNS} FROM {t}nodes WHERE node = {p}"
        self.slots = f"SELECT {SLOT_COLUMNS} FROM {t}slots WHERE node = {p} ORDER BY slot"
        self.alloc = f"SELECT {ALLOC_COLUMNS} FROM {t}allocations WHERE alloc = {p}"
        self.address = f"SELECT {ADDRESS_COLUMNS} FROM {t}addresses WHERE address = {p}"
        self.live = (
            f"SELECT alloc FROM {t}allocations WHERE node = {p} "
            f"AND client_status IN {tables.LIVE}"
        )
        self.children = f"SELECT node FROM {t}nodes WHERE parent = {p}"
        self.upsert_node = _upsert("nodes", NODE_COLUMNS, "node", p, t)
        self.heartbeat = (
            f"UPDATE {t}nodes SET last_heartbeat_at = {p}, last_heartbeat_position = {p} "
            f"WHERE node = {p}"
        )
        self.upsert_slot = _upsert("slots", SLOT_COLUMNS, "node, slot", p, t)
        self.upsert_alloc = _upsert("allocations", ALLOC_COLUMNS, "alloc", p, t)
        self.upsert_address = _upsert("addresses", ADDRESS_COLUMNS, "address", p, t)
        self.delete_address = f"DELETE FROM {t}addresses WHERE address = {p}"
        self.insert_state = (
            f"INSERT INTO {t}alloc_states (alloc, position, value, at) VALUES ({p}, {p}, {p}, {p})"
        )
        self.insert_rejection = (
            f"INSERT INTO {t}rejections (position, type, entity, reason, event, at) "
            f"VALUES ({p}, {p}, {p}, {p}, {p}, {p})"
        )


class TableSource:
    """Loads entities from the projection tables through the current cursor."""

    def __init__(self, statements: Statements, store: Store | None = None) -> None:
        self.sql = statements
        self.cursor: Any = None
        self.store = store if store is not None and store.loads_many else None

    @property
    def loads_many(self) -> bool:
        return self.store is not None

    def load_nodes(self, cluster: Cluster, nodes: set[str]) -> None:
        """Many nodes at once, where the store can (``Store.load_nodes``)."""
        if self.store is not None:
            self.store.load_nodes(self.cursor, self.sql, cluster, nodes)

    def _one(self, statement: str, key: str) -> Any:
        self.cursor.execute(statement, (key,))
        return self.cursor.fetchone()

    def load_node(self, node: str) -> Node | None:
        row = self._one(self.sql.node, node)
        return None if row is None else node_from(row)

    def load_slots(self, node: str) -> list[Slot]:
        self.cursor.execute(self.sql.slots, (node,))
        return [Slot(*row) for row in self.cursor.fetchall()]

    def load_alloc(self, alloc: str) -> Allocation | None:
        row = self._one(self.sql.alloc, alloc)
        return None if row is None else alloc_from(row)

    def load_address(self, address: str) -> AddressHold | None:
        row = self._one(self.sql.address, address)
        return None if row is None else AddressHold(*row)

    def load_live_allocs(self, node: str) -> set[str]:
        self.cursor.execute(self.sql.live, (node,))
        return {row[0] for row in self.cursor.fetchall()}

    def load_children(self, node: str) -> set[str]:
        self.cursor.execute(self.sql.children, (node,))
        return {row[0] for row in self.cursor.fetchall()}


ChangedRows = list[tuple[str, list[tuple[Any, ...]]]]  # (statement name, its rows)
LOGS = ("insert_state", "insert_rejection")  # statements of the logs kept for reporting


def changed_rows(changes: Changes) -> ChangedRows:
    """The rows each ``Statements`` statement (by attribute name) writes for
    what the domain changed; a node changed by heartbeats alone is
    ``(at, position, node)`` for ``heartbeat``. Built as the rows are at the
    time: the entities go on changing."""
    beats = changes.beats
    return [
        ("upsert_node", [node_row(n) for n in changes.nodes if n.node not in beats]),
        (
            "heartbeat",
            [(n.last_heartbeat_at, n.last_heartbeat_position, n.node)
             for n in changes.nodes if n.node in beats],
        ),
        ("upsert_slot", [slot_row(s) for s in changes.slots]),
        ("upsert_alloc", [alloc_row(a) for a in changes.allocs]),
        ("delete_address", [(a,) for a in changes.released]),
        ("upsert_address", [address_row(h) for h in changes.held]),
        ("insert_state", [(s.alloc, s.position, s.value, s.at) for s in changes.alloc_states]),
        (
            "insert_rejection",
            [(r.position, r.type, r.entity, r.reason, rejected_json(r.event), r.at)
             for r in changes.rejections],
        ),
    ]


def write_changes(cursor: Any, sql: Statements, changes: Changes) -> None:
    """Write everything the domain changed, one ``executemany`` per table (a
    node changed by heartbeats alone by an UPDATE of those two columns)."""
    for name, rows in changed_rows(changes):
        if rows:
            cursor.executemany(getattr(sql, name), rows)
