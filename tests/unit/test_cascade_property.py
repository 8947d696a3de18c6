"""The node cascade walks the parent tree with a stack: for every forest of
nodes it must do exactly what the recursive walk it replaced did (the one
of e4fee08, kept here as the reference), in the same order, since replays
of old logs must give the same tables: the same reasons, lost
allocations, alloc states, positions, changed rows, and touched entities.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledger import errors
from ledger.domain import AlreadyPlaced, Cluster
from ledger.model import Fact, Node


class RecursiveCluster(Cluster):
    """The cascade as it was before the stack: one call per level."""

    def _take_down(
        self, node: Node, reason: str | None, fact: Fact, status: str = "down"
    ) -> None:
        self._bring_down(node, reason, fact, status)  # its own losses: unchanged by the stack
        why = f"parent {node.node} {'went down' if status == 'down' else 'was removed'}"
        self._cascade(node, why, fact)

    def _cascade(self, node: Node, why: str, fact: Fact) -> None:
        for child_name in sorted(self.child_nodes(node.node)):
            child = self.node(child_name)
            if child is None:
                continue
            if child.status in ("down", "removed"):
                self._cascade(child, why, fact)
            else:
                self._take_down(child, why, fact)


@st.composite
def forests(draw: Any) -> list[tuple[dict[str, Any], int]]:
    """A random forest of nodes (random parents, names not in registration
    order), all ready with allocations on them, then random downs, removals,
    heartbeats (rules 1 lets a child back up under a down parent), health
    failures, disconnects and placements, each decided by random rules."""
    size = draw(st.integers(1, 14))
    names = draw(st.permutations([f"n{i:02d}" for i in range(size)]))
    events: list[tuple[dict[str, Any], int]] = []
    for i, name in enumerate(names):
        parent = draw(st.none() | st.sampled_from(names[:i])) if i else None
        events.append(({"type": "node-registered", "node": name, "slots": 2,
                        **({"parent": parent} if parent else {})}, 3))
    for name in names:
        events.append(({"type": "heartbeat", "node": name}, 3))
    node = st.sampled_from(names)
    rules = st.integers(1, 3)
    count = 0

    def place(on: str) -> list[dict[str, Any]]:
        nonlocal count
        count += 1
        alloc = f"a{count:02d}"
        return [{"type": "alloc-placed", "alloc": alloc, "node": on,
                 "slot": draw(st.none() | st.integers(0, 1)),
                 "addresses": [f"10.0.0.{count}"] if draw(st.booleans()) else [],
                 "max_disconnect": draw(st.none() | st.just(60))},
                {"type": "alloc-updated", "alloc": alloc, "blame": "app",
                 "client_status": draw(st.sampled_from(["running", "pending"]))}]

    for _ in range(draw(st.integers(0, 2 * size))):
        events.extend((event, 3) for event in place(draw(node)))
    for _ in range(draw(st.integers(1, 12))):
        kind = draw(st.sampled_from(["node-down", "node-down", "node-removed", "heartbeat",
                                     "heartbeat", "heartbeat-missed", "health-checked",
                                     "alloc-placed"]))
        on = draw(node)
        if kind == "alloc-placed":
            events.extend((event, 3) for event in place(on))
            continue
        extra = {"node-down": {"reason": "gone"}, "health-checked": {"passed": False}}
        events.append(({"type": kind, "node": on, **extra.get(kind, {})}, draw(rules)))
    return events


def outcome(cluster: Cluster, event: dict[str, Any], fact: Fact) -> Any:
    try:
        touched = cluster.apply(event, fact)
    except (errors.LedgerError, AlreadyPlaced) as error:
        return ("refused", type(error).__name__, str(error))
    changes = cluster.take_changes()
    return ("applied", touched, changes)


def snapshot(cluster: Cluster) -> Any:
    return (
        {k: v for k, v in cluster.nodes.items() if v is not None},
        {k: v for k, v in cluster.allocs.items() if v is not None},
        {k: v for k, v in cluster.addresses.items() if v is not None},
        {k: list(v) for k, v in cluster.slot_tables.items()},
        {k: set(v) for k, v in cluster.live.items()},
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(forests())
def test_the_stack_cascade_does_what_the_recursive_one_did(events):
    stacked, recursive = Cluster(), RecursiveCluster()
    for position, (event, rules) in enumerate(events, start=1):
        fact = Fact(position, f"2026-01-01T00:00:{position % 60:02d}.000000Z", rules)
        assert outcome(stacked, event, fact) == outcome(recursive, event, fact), (position, event)
        assert snapshot(stacked) == snapshot(recursive), (position, event)


def test_a_tree_with_children_back_up_under_a_down_parent_cascades_as_before():
    """A fixed forest reaching every branch of the walk: a child let back up by
    rules 1 under a down parent, a removed grandchild, siblings out of name
    order, allocations on every level."""
    events: list[tuple[dict[str, Any], int]] = []

    def on(event: dict[str, Any], rules: int = 3) -> None:
        events.append((event, rules))

    on({"type": "node-registered", "node": "root", "slots": 1})
    for name, parent in [("b", "root"), ("a", "root"), ("c", "a"), ("d", "a"), ("e", "c"),
                         ("f", "b"), ("g", "f"), ("h", "e")]:
        on({"type": "node-registered", "node": name, "slots": 1, "parent": parent})
    for name in ["root", "a", "b", "c", "d", "e", "f", "g", "h"]:
        on({"type": "heartbeat", "node": name})
        on({"type": "alloc-placed", "alloc": f"x{name}", "node": name, "slot": 0})
        on({"type": "alloc-updated", "alloc": f"x{name}", "client_status": "running",
            "blame": "app"})
    on({"type": "node-down", "node": "a", "reason": "gone"})
    on({"type": "heartbeat", "node": "c"}, rules=1)  # back up while a is down
    on({"type": "node-removed", "node": "d"})
    on({"type": "alloc-placed", "alloc": "y", "node": "c", "slot": 0})
    on({"type": "node-down", "node": "root", "reason": "power"})
    on({"type": "node-removed", "node": "root"})

    stacked, recursive = Cluster(), RecursiveCluster()
    for position, (event, rules) in enumerate(events, start=1):
        fact = Fact(position, "2026-01-01T00:00:00.000000Z", rules)
        assert outcome(stacked, event, fact) == outcome(recursive, event, fact), (position, event)
        assert snapshot(stacked) == snapshot(recursive), (position, event)
    assert stacked.node("h").reason == "parent e went down"
