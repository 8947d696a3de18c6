"""The questions of SPEC section 3, asked of projection tables with SQL.

The same SQL answers the live tables of either store and the scratch
tables an as-of replay builds; every answer is a list of plain dicts.
"""

from __future__ import annotations

import json
from typing import Any

from ledger.model import NEVER, past_the_years

COLUMNS: dict[str, tuple[str, ...]] = {
    "needs-reconnect": (
        "alloc", "node", "job", "desired_status", "unknown_since_position",
        "unknown_since_at", "deadline", "expired",
    ),
    "zombie-slots": ("node", "slot", "alloc", "reason", "position"),
    "slots": ("node", "slot", "state", "alloc", "reported_alloc", "since_position"),
    "nodes": (
        "node", "status", "health", "parent", "slots", "slots_used", "allocs",
        "last_heartbeat_at", "last_heartbeat_position", "reason", "since_position",
    ),
    "allocs": (
        "alloc", "node", "job", "slot", "desired_status", "client_status",
        "needs_reconnect", "addresses",
    ),
    "addresses": ("address", "alloc", "node", "state"),
    "suspects": ("node", "health", "status", "reason", "since_position", "lost_allocs"),
    "rejections": ("position", "type", "entity", "reason", "event"),
    "history": ("position", "type", "status", "at", "recorded_at", "reason", "event"),
}


class Queries:
    """Answers from projection tables reached through one DB-API cursor."""

    def __init__(self, cursor: Any, param: str = "?", name_order: str = "") -> None:
        self.cursor = cursor
        self.p = param
        self.c = name_order  # names are ordered by code point, whatever the database's collation

    @classmethod
    def of(cls, store: Any, cursor: Any) -> Queries:
        """Queries through a cursor of ``store``, in its placeholders and name order."""
        return cls(cursor, store.param, store.name_order)

    def _rows(self, statement: str, params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
        self.cursor.execute(statement, params)
        names = [d[0] for d in self.cursor.description]
        return [dict(zip(names, row, strict=True)) for row in self.cursor.fetchall()]

    def needs_reconnect(self, now: str) -> list[dict[str, Any]]:
        rows = self._rows(
            "SELECT alloc, node, job, desired_status, unknown_since_position, unknown_since_at, "
            "deadline, max_disconnect FROM needs_reconnect ORDER BY unknown_since_position, "
            f"alloc{self.c}"
        )
        for row in rows:
            seconds = row.pop("max_disconnect")
            row["expired"] = row["deadline"] is not None and row["deadline"] <= now and not (
                row["deadline"] == NEVER and past_the_years(row["unknown_since_at"], seconds))
        return rows

    def zombie_slots(self) -> list[dict[str, Any]]:
        return self._rows(
            "SELECT node, slot, alloc, reason, position FROM zombie_slots "
            f"ORDER BY node{self.c}, slot"
        )

    def slots(self, node: str | None = None) -> list[dict[str, Any]]:
        where, params = self._filters(node=node)
        return self._rows(
            "SELECT node, slot, state, alloc, reported_alloc, since_position FROM slots"
            f"{where} ORDER BY node{self.c}, slot",
            params,
        )

    def nodes(self) -> list[dict[str, Any]]:
        return self._rows(
            "SELECT node, status, health, parent, slots, slots_used, allocs, "
            "last_heartbeat_at, last_heartbeat_position, reason, since_position "
            f"FROM nodes ORDER BY node{self.c}"
        )

    def allocs(
        self, node: str | None = None, job: str | None = None, status: str | None = None
    ) -> list[dict[str, Any]]:
        where, params = self._filters(node=node, job=job, client_status=status)
        where = f"{where} AND removed = 0" if where else " WHERE removed = 0"
        rows = self._rows(
            "SELECT alloc, node, job, slot, desired_status, client_status, needs_reconnect, "
            f"addresses FROM allocations{where} ORDER BY alloc{self.c}",
            params,
        )
        return [_decoded(row) for row in rows]

    def alloc(self, alloc: str) -> dict[str, Any] | None:
        rows = self._rows(
            "SELECT alloc, node, job, slot, desired_status, client_status, needs_reconnect, "
            "addresses, max_disconnect, unknown_since_position, unknown_since_at, deadline, "
            f"placed_position, updated_position, removed FROM allocations WHERE alloc = {self.p}",
            (alloc,),
        )
        if not rows:
            return None
        found = _decoded(rows[0])
        found["removed"] = bool(found["removed"])
        found["alloc_states"] = self._rows(
            f"SELECT value, position, at FROM alloc_states WHERE alloc = {self.p} "
            "ORDER BY position",
            (alloc,),
        )
        return found

    def addresses(self) -> list[dict[str, Any]]:
        return self._rows(
            f"SELECT address, alloc, node, state FROM addresses ORDER BY address{self.c}")

    def suspects(self) -> list[dict[str, Any]]:
        rows = self._rows(
            "SELECT node, health, status, reason, since_position, lost_allocs FROM nodes "
            "WHERE (health = 'suspect' AND status <> 'removed') OR status = 'down' "
            f"ORDER BY since_position, node{self.c}"
        )
        for row in rows:
            row["lost_allocs"] = json.loads(row["lost_allocs"])
        return rows

    def rejections(self) -> list[dict[str, Any]]:
        rows = self._rows(
            "SELECT position, type, entity, reason, event FROM rejections ORDER BY position"
        )
        for row in rows:
            row["event"] = json.loads(row["event"])
        return rows

    def has_node(self, node: str) -> bool:
        """Whether the node was ever registered (removed ones too)."""
        return bool(self._rows(f"SELECT 1 FROM nodes WHERE node = {self.p}", (node,)))

    def has_job(self, job: str) -> bool:
        """Whether any allocation of the job was ever placed (removed ones too)."""
        return bool(self._rows(f"SELECT 1 FROM allocations WHERE job = {self.p} LIMIT 1", (job,)))

    def _filters(self, **filters: str | None) -> tuple[str, tuple[Any, ...]]:
        used = {k: v for k, v in filters.items() if v is not None}
        if not used:
            return "", ()
        clause = " AND ".join(f"{name} = {self.p}" for name in used)
        return f" WHERE {clause}", tuple(used.values())


def _decoded(row: dict[str, Any]) -> dict[str, Any]:
    row["addresses"] = json.loads(row["addresses"])
    row["needs_reconnect"] = bool(row["needs_reconnect"])
    return row
