"""PostgreSQL writers load everything a batch names in one round trip.

One pipelined flush sends a query per table (nodes with their slot tables,
live allocations and children; allocations; addresses named, and those the
allocations named list) and the batch's client ids; the writer waits once for all the answers and fills the cluster's caches.

An allocation never moves (an id is placed once), so the node of every
allocation read is kept for the life of the store: a batch's nodes are then
mostly known on the client, and the server looks up only the nodes of
allocations it has never been asked about.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from psycopg.rows import tuple_row

from ledger.model import AddressHold, Slot
from projections.rows import (
    ADDRESS_COLUMNS,
    ALLOC_COLUMNS,
    NODE_COLUMNS,
    SLOT_COLUMNS,
    alloc_from,
    node_from,
)
from projections.tables import LIVE

NODES_TOO = 100_000  # allocations whose node a store remembers, at most


@dataclass
class Named:
    """What a batch names."""

    nodes: set[str]
    allocs: set[str]
    addresses: set[str]
    ids: list[str]


def named_by(batch: list[dict[str, Any]]) -> Named:
    named = Named(set(), set(), set(), [])
    for event in batch:
        for key in ("node", "parent"):
            if isinstance(event.get(key), str):
                named.nodes.add(event[key])
        if isinstance(event.get("alloc"), str):
            named.allocs.add(event["alloc"])
        for address in event.get("addresses") or ():
            if isinstance(address, str):  # (an edited log's other values load alone, and fail)
                named.addresses.add(address)
        slots = event.get("slots")
        for entry in slots if isinstance(slots, list) else ():
            if isinstance(entry, dict) and isinstance(entry.get("alloc"), str):
                named.allocs.add(entry["alloc"])
        if "id" in event:
            named.ids.append(event["id"])
    return named


def not_cached(cluster: Any, named: Named) -> Named:
    """What a batch names that the cluster does not hold yet (a leader that
    kept deciding holds most of it: it is the only writer)."""
    def held(node: str) -> bool:
        return node in cluster.nodes and (
            cluster.nodes[node] is None
            or (node in cluster.slot_tables and node in cluster.live and node in cluster.children)
        )

    return Named(
        nodes={n for n in named.nodes if not held(n)},
        allocs={a for a in named.allocs if a not in cluster.allocs},
        addresses={x for x in named.addresses if x not in cluster.addresses},
        ids=named.ids,
    )


class PreloadQueries:
    """The preload's SQL for one table prefix; ``%(n)b`` are the nodes named or
    known, ``%(u)b`` allocations whose node is not known yet."""

    def __init__(self, prefix: str) -> None:
        t = prefix
        nodes = (
            "SELECT node FROM pg_catalog.unnest(%(n)b::text[]) n(node) UNION "
            f"SELECT node FROM {t}allocations WHERE alloc = ANY(%(u)b::text[])"
        )
        self.queries = {
            "nodes": f"SELECT {NODE_COLUMNS} FROM {t}nodes WHERE node IN ({nodes})",
            "slots": f"SELECT {SLOT_COLUMNS} FROM {t}slots WHERE node IN ({nodes}) "
                     "ORDER BY node, slot",
            "live": f"SELECT node, alloc FROM {t}allocations WHERE node IN ({nodes}) "
                    f"AND client_status IN {LIVE}",
            "children": f"SELECT parent, node FROM {t}nodes WHERE parent IN ({nodes})",
            "allocs": f"SELECT {ALLOC_COLUMNS} FROM {t}allocations WHERE alloc = ANY(%(a)b::text[])",
            "addresses": f"SELECT {ADDRESS_COLUMNS} FROM {t}addresses WHERE address IN ("
                         "SELECT pg_catalog.unnest(%(x)b::text[]) UNION "
                         "SELECT pg_catalog.json_array_elements_text(addresses::json) "
                         f"FROM {t}allocations WHERE alloc = ANY(%(a)b::text[]))",
        }


KNOWN_IDS = "SELECT id, position FROM event_ids WHERE id = ANY(%b::text[])"
ALLOCS_ONLY = ("allocs", "addresses")  # allocations whose nodes are loaded already


class Preload:
    """Sends a batch's loads, then fills a cluster from the answers."""

    def __init__(self) -> None:
        self.queries: dict[str, PreloadQueries] = {}
        self.node_of: dict[str, str] = {}  # allocation -> its node, for good

    def send(
        self, cursor: Any, prefix: str, named: Named, only: tuple[str, ...] | None = None
    ) -> dict[str, Any]:
        """Queue the queries (``only`` those named; nothing waits yet); return
        their cursors."""
        queries = self.queries.get(prefix)
        if queries is None:
            queries = self.queries[prefix] = PreloadQueries(prefix)
        known = {self.node_of[a] for a in named.allocs if a in self.node_of}
        params = {
            "n": sorted(named.nodes | known),
            "u": sorted(a for a in named.allocs if a not in self.node_of),
            "a": sorted(named.allocs),
            "x": sorted(named.addresses),
        }
        sent = {}
        for key, statement in queries.queries.items() if params["n"] or params["a"] or params["x"] else ():
            if only is not None and key not in only:
                continue
            sent[key] = cursor.connection.cursor(row_factory=tuple_row)
            sent[key].execute(statement, params)
        if named.ids:
            sent["ids"] = cursor.connection.cursor(row_factory=tuple_row)
            sent["ids"].execute(KNOWN_IDS, (named.ids,))
        return sent

    def fill(self, cluster: Any, named: Named, sent: dict[str, Any]) -> None:
        rows = {key: c.fetchall() for key, c in sent.items() if key != "ids"}
        if not rows:
            return  # nothing to load
        loaded_nodes = {row[0]: node_from(row) for row in rows.get("nodes", ())}
        for name in named.nodes | set(loaded_nodes):
            cluster.nodes.setdefault(name, loaded_nodes.get(name))
        slot_tables: dict[str, list[Slot]] = {name: [] for name in loaded_nodes}
        for row in rows.get("slots", ()):
            slot_tables.setdefault(row[0], []).append(Slot(*row))
        for name, table in slot_tables.items():
            cluster.slot_tables.setdefault(name, table)
        live: dict[str, set[str]] = {name: set() for name in loaded_nodes}
        for node, alloc in rows.get("live", ()):
            live.setdefault(node, set()).add(alloc)
        for name, found in live.items():
            cluster.live.setdefault(name, found)
        children: dict[str, set[str]] = {name: set() for name in loaded_nodes}
        for parent, node in rows.get("children", ()):
            children.setdefault(parent, set()).add(node)
        for name, found in children.items():
            cluster.children.setdefault(name, found)
        loaded_allocs = {row[0]: alloc_from(row) for row in rows.get("allocs", ())}
        for name in named.allocs:
            cluster.allocs.setdefault(name, loaded_allocs.get(name))
        if len(self.node_of) > NODES_TOO:
            self.node_of.clear()
        self.node_of.update((row[0], row[1]) for row in rows.get("allocs", ()))
        held = {row[0]: AddressHold(*row) for row in rows.get("addresses", ())}
        listed = (a for alloc in loaded_allocs.values() for a in alloc.addresses)
        for address in named.addresses.union(listed):
            cluster.addresses.setdefault(address, held.get(address))


def known_ids(sent: dict[str, Any]) -> dict[str, int]:
    """The answer to the ids query ``send`` queued."""
    cursor = sent.get("ids")
    return {} if cursor is None else {row[0]: row[1] for row in cursor.fetchall()}
