"""Read-side promises no other test pins down (found by mutating the
projections' queries, views, history, as-of, audit and replay)."""

from __future__ import annotations

from projections.answers import ask

EARLY = "2026-01-01T11:59:00Z"


def test_needs_reconnect_is_ordered_by_when_then_by_allocation(cluster) -> None:
    """docs/queries.md: by unknown_since_position, then allocation; not by name."""
    for node in ("n1", "n2"):
        cluster.happens("node-registered", node=node, slots=2, at=EARLY)
        cluster.happens("heartbeat", node=node, at=EARLY)
    for alloc, node, slot in (("b1", "n1", 0), ("b2", "n2", 0), ("a9", "n2", 1)):
        cluster.place(alloc, node, slot=slot, job="web", max_disconnect=60, at=EARLY)
        cluster.report(alloc, "running", at=EARLY)
    first = cluster.happens("heartbeat-missed", node="n1", at="2026-01-01T12:00:00Z")
    second = cluster.happens("heartbeat-missed", node="n2", at="2026-01-01T12:00:01Z")
    with ask(cluster.url) as answers:
        found = answers.needs_reconnect(now="2026-01-01T12:00:30Z")
    assert [(r["alloc"], r["unknown_since_position"]) for r in found] == [
        ("b1", first), ("a9", second), ("b2", second)]


def test_slots_and_zombie_slots_are_ordered_by_node_then_slot(cluster) -> None:
    """docs/queries.md: ``slots`` and ``zombie-slots`` by node, then slot."""
    for node in ("n1", "n2"):
        cluster.ready_node(node, slots=2)
    cluster.happens("heartbeat", node="n2", slots=[{"slot": 0, "alloc": "x2"}])
    cluster.happens("heartbeat", node="n1", slots=[{"slot": 1, "alloc": "x1"}])
    with ask(cluster.url) as answers:
        slots = [(r["node"], r["slot"]) for r in answers.slots()]
        zombies = [(r["node"], r["slot"], r["reason"]) for r in answers.zombie_slots()]
    assert slots == [("n1", 0), ("n1", 1), ("n2", 0), ("n2", 1)]
    assert zombies == [("n1", 1, "unknown-alloc"), ("n2", 0, "unknown-alloc")]


def test_an_allocation_reported_by_another_node_is_a_moved_zombie(cluster) -> None:
    """SPEC 3: ``moved``, history binds it to another slot *or node* (same slot number here)."""
    for node in ("n1", "n2"):
        cluster.ready_node(node, slots=1)
    cluster.running("a1", "n2", slot=0)
    position = cluster.happens("heartbeat", node="n1", slots=[{"slot": 0, "alloc": "a1"}])
    with ask(cluster.url) as answers:
        assert answers.zombie_slots() == [
            {"node": "n1", "slot": 0, "alloc": "a1", "reason": "moved", "position": position}]