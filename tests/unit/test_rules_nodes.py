"""The node rules of SPEC section 2, one rule per test: node-registered,
heartbeat, heartbeat-missed, node-down, node-removed, node-suspected,
health-checked. The ``cluster`` fixture is in ``tests/conftest.py``.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from ledger.domain import Cluster
from ledger.model import RULES, Fact

# -- node-registered --------------------------------------------------------


def test_a_registered_node_is_initializing_and_healthy_with_free_slots(cluster):
    position = cluster.happens("node-registered", node="n1", slots=2)

    node = cluster.node("n1")
    assert (node["status"], node["health"], node["slots"], node["parent"]) == (
        "initializing", "ok", 2, None
    )
    assert node["since_position"] == position
    assert cluster.rows("SELECT node, slot, state, alloc FROM slots ORDER BY slot") == [
        {"node": "n1", "slot": 0, "state": "free", "alloc": None},
        {"node": "n1", "slot": 1, "state": "free", "alloc": None},
    ]


def test_a_node_registered_without_slots_has_none(cluster):
    cluster.happens("node-registered", node="n1")

    assert cluster.node("n1")["slots"] == 0
    assert cluster.rows("SELECT * FROM slots") == []


def test_a_node_may_be_registered_under_an_existing_parent(cluster):
    cluster.happens("node-registered", node="host")

    cluster.happens("node-registered", node="wc1", parent="host")

    assert cluster.node("wc1")["parent"] == "host"
    assert cluster.status("wc1") == "initializing"


def test_the_parent_must_be_registered(cluster):
    reason = cluster.refused("node-registered", node="wc1", parent="host")

    assert reason == "parent node host is not registered"
    assert cluster.rows("SELECT * FROM nodes") == []


def test_the_parent_must_not_be_down(cluster):
    cluster.happens("node-registered", node="host")
    cluster.happens("node-down", node="host")

    reason = cluster.refused("node-registered", node="wc1", parent="host")

    assert reason == "parent node host is down"
    assert cluster.rows("SELECT node FROM nodes") == [{"node": "host"}]


def test_the_parent_must_not_be_removed(cluster):
    cluster.happens("node-registered", node="host")
    cluster.happens("node-removed", node="host")

    reason = cluster.refused("node-registered", node="wc1", parent="host")

    assert reason == "parent node host is removed"
    assert cluster.rows("SELECT node FROM nodes") == [{"node": "host"}]


def test_registering_a_node_again_is_rejected(cluster):
    cluster.ready_node("n1", slots=1)

    reason = cluster.refused("node-registered", node="n1", slots=4)

    assert reason == "node n1 is already registered"
    assert (cluster.status("n1"), cluster.node("n1")["slots"]) == ("ready", 1)


# -- heartbeat --------------------------------------------------------------


def test_a_heartbeat_from_an_unknown_node_is_rejected(cluster):
    assert cluster.refused("heartbeat", node="n9") == "node n9 is not registered"
    assert cluster.rows("SELECT * FROM nodes") == []


def test_a_heartbeat_from_a_removed_node_is_rejected(cluster):
    cluster.ready_node("n1")
    cluster.happens("node-removed", node="n1")

    assert cluster.refused("heartbeat", node="n1") == "node n1 has been removed"
    assert cluster.status("n1") == "removed"


def test_the_first_heartbeat_makes_an_initializing_node_ready(cluster):
    cluster.happens("node-registered", node="n1")

    position = cluster.happens("heartbeat", node="n1")

    node = cluster.node("n1")
    assert (node["status"], node["since_position"]) == ("ready", position)
    assert node["last_heartbeat_position"] == position


def test_a_heartbeat_brings_a_down_node_back_ready(cluster):
    cluster.ready_node("n1")
    cluster.happens("node-down", node="n1", reason="instance gone")

    cluster.happens("heartbeat", node="n1")

    assert cluster.status("n1") == "ready"


def test_a_heartbeat_keeps_a_ready_node_ready(cluster):
    cluster.ready_node("n1")

    position = cluster.happens("heartbeat", node="n1")

    node = cluster.node("n1")
    assert (node["status"], node["since_position"], node["last_heartbeat_position"]) == (
        "ready", 2, position
    )


def test_a_returning_node_with_an_allocation_to_reconnect_is_initializing(cluster):
    """Nomad #15808: no new placements until it has reported its allocations."""
    cluster.ready_node("n1", slots=2)
    cluster.running("a1", "n1", slot=0, max_disconnect=300)
    cluster.happens("heartbeat-missed", node="n1")

    cluster.happens("heartbeat", node="n1")

    assert cluster.status("n1") == "initializing"
    assert cluster.needing_reconnect() == ["a1"]
    assert cluster.refused("alloc-placed", alloc="a2", node="n1", slot=1) == (
        "node n1 is not ready (status initializing); it takes no placements"
    )


def test_a_returning_node_with_nothing_to_reconnect_is_ready(cluster):
    cluster.ready_node("n1")
    cluster.place("a1", "n1", max_disconnect=300)  # pending: lost on disconnect
    cluster.happens("heartbeat-missed", node="n1")
    assert cluster.status("n1") == "disconnected"

    cluster.happens("heartbeat", node="n1")

    assert cluster.status("n1") == "ready"


def test_more_heartbeats_keep_a_returning_node_initializing_until_it_reports(cluster):
    """SPEC says initializing -> ready on heartbeat; the code (reasonably, per
    Nomad #15808) keeps it initializing while an allocation still needs to reconnect."""
    cluster.ready_node("n1")
    cluster.running("a1", "n1", max_disconnect=300)
    cluster.happens("heartbeat-missed", node="n1")
    cluster.happens("heartbeat", node="n1")

    cluster.happens("heartbeat", node="n1")

    assert cluster.status("n1") == "initializing"


def test_more_heartbeats_of_an_initializing_node_leave_its_status_since_where_it_was(cluster):
    """``since_position`` says since when the node has its status: the
    heartbeat that brought it back, not the latest one."""
    cluster.ready_node("n1")
    cluster.running("a1", "n1", max_disconnect=300)
    cluster.happens("heartbeat-missed", node="n1")
    back = cluster.happens("heartbeat", node="n1")

    latest = cluster.happens("heartbeat", node="n1")

    node = cluster.node("n1")
    assert (node["status"], node["since_position"]) == ("initializing", back)
    assert node["last_heartbeat_position"] == latest


def reported(cluster, node):
    found = cluster.rows(
        "SELECT slot, reported_alloc, reported_position FROM slots WHERE node = ? ORDER BY slot",
        node,
    )
    return [(row["slot"], row["reported_alloc"], row["reported_position"]) for row in found]


def test_a_slot_report_is_kept_beside_the_ledgers_own_slot_table(cluster):
    cluster.ready_node("n1", slots=2)
    cluster.place("a1", "n1", slot=0)

    position = cluster.happens(
        "heartbeat", node="n1", slots=[{"slot": 0, "alloc": "a1"}, {"slot": 1, "alloc": "x"}]
    )

    assert reported(cluster, "n1") == [(0, "a1", position), (1, "x", position)]
    assert cluster.slot_state("n1", 1) == ("free", None)


@pytest.mark.parametrize(("slot", "reasons"), [
    (None, ["duplicate", "duplicate"]),  # placed without a slot: on neither
    (0, [None, "duplicate"]),  # where it is placed it is no zombie
])
def test_an_allocation_reported_on_two_slots_of_its_node_is_a_duplicate(cluster, slot, reasons):
    cluster.ready_node("n1", slots=3)
    cluster.place("a1", "n1", slot=slot)

    position = cluster.happens(
        "heartbeat", node="n1", slots=[{"slot": 0, "alloc": "a1"}, {"slot": 1, "alloc": "a1"}]
    )

    zombies = {row["slot"]: row for row in cluster.rows("SELECT * FROM zombie_slots")}
    assert [zombies[s]["reason"] if s in zombies else None for s in (0, 1)] == reasons
    assert {row["position"] for row in zombies.values()} == {position}


def zombies(cluster):
    return cluster.rows("SELECT node, slot, alloc, reason, position FROM zombie_slots "
                        "ORDER BY node, slot")


@pytest.mark.parametrize(("node", "slot"), [
    ("n2", 0),  # held on another node's slot
    ("n2", None),  # on another node, without a slot
    ("n1", None),  # on this node, but bound to no slot
    ("n1", 1),  # on this node, bound to its other slot (Flink: a slot report behind a move)
])
def test_an_allocation_history_binds_elsewhere_is_a_moved_zombie(cluster, node, slot):
    """SPEC: ``moved``, history binds it to another slot or node."""
    cluster.ready_node("n1", slots=2)
    cluster.ready_node("n2", slots=1)
    cluster.running("a1", node, slot=slot)

    position = cluster.happens("heartbeat", node="n1", slots=[{"slot": 0, "alloc": "a1"}])

    assert zombies(cluster) == [
        {"node": "n1", "slot": 0, "alloc": "a1", "reason": "moved", "position": position}]
    assert cluster.slot_state("n1", 0) == ("free", None)
    assert cluster.slot_state("n1", 1) == (("active", "a1") if slot == 1 else ("free", None))


def test_an_allocation_reported_by_two_nodes_is_one_zombie_row_not_a_duplicate(cluster):
    """SPEC: ``duplicate`` is one report showing an allocation on two slots; a
    report by another node is that node's zombie (``moved``), once."""
    cluster.ready_node("n1", slots=1)
    cluster.ready_node("n2", slots=1)
    cluster.running("a1", "n1", slot=0)
    cluster.happens("heartbeat", node="n1", slots=[{"slot": 0, "alloc": "a1"}])

    position = cluster.happens("heartbeat", node="n2", slots=[{"slot": 0, "alloc": "a1"}])

    assert zombies(cluster) == [
        {"node": "n2", "slot": 0, "alloc": "a1", "reason": "moved", "position": position}]


@pytest.mark.parametrize("end", ["complete", "lost"])
def test_an_allocation_that_was_removed_is_a_released_zombie(cluster, end):
    """SPEC: ``released``, history says that allocation is terminal or removed;
    a removed allocation is not ``unknown-alloc``: it was placed."""
    cluster.ready_node("n1", slots=1)
    cluster.running("a1", "n1", slot=0)
    if end == "complete":
        cluster.report("a1", "complete")
    else:
        cluster.happens("node-down", node="n1")
        cluster.happens("heartbeat", node="n1")
    cluster.happens("alloc-removed", alloc="a1")
    assert cluster.alloc("a1")["removed"] == 1
    cluster.running("a2", "n1", slot=0)  # the slot is someone else's now

    position = cluster.happens("heartbeat", node="n1", slots=[{"slot": 0, "alloc": "a1"}])

    assert zombies(cluster) == [
        {"node": "n1", "slot": 0, "alloc": "a1", "reason": "released", "position": position}]
    assert cluster.slot_state("n1", 0) == ("active", "a2")


@pytest.mark.parametrize("gone", ["node-removed", "node-down"])
def test_a_removed_node_s_last_report_is_no_zombie_but_a_down_node_s_is(cluster, gone):
    """README: a removed node is gone, and its later reports are refused, so
    what it last reported would stay a zombie for ever; a node that is down
    may come back with the same slots."""
    cluster.ready_node("n1", slots=2)
    cluster.running("a1", "n1", slot=0)
    cluster.report("a1", "complete")
    position = cluster.happens("heartbeat", node="n1", slots=[
        {"slot": 0, "alloc": "a1"}, {"slot": 1, "alloc": "ghost"}])
    assert [(z["slot"], z["reason"]) for z in zombies(cluster)] == [
        (0, "released"), (1, "unknown-alloc")]

    cluster.happens(gone, node="n1")

    expected = [] if gone == "node-removed" else [(0, "released"), (1, "unknown-alloc")]
    assert [(z["slot"], z["reason"]) for z in zombies(cluster)] == expected
    assert [(row["reported_alloc"], row["reported_position"]) for row in cluster.rows(
        "SELECT reported_alloc, reported_position FROM slots ORDER BY slot")] == [
        ("a1", position), ("ghost", position)]  # the slot table keeps what it said


def test_slots_first_reported_empty_are_reported_since_that_heartbeat(cluster):
    """An empty slot is reported too: since when the node says so is kept."""
    cluster.ready_node("n1", slots=2)

    position = cluster.happens("heartbeat", node="n1", slots=[{"slot": 0, "alloc": None}])

    assert reported(cluster, "n1") == [(0, None, position), (1, None, position)]


def test_a_slot_report_replaces_the_last_reported_table(cluster):
    cluster.ready_node("n1", slots=3)
    cluster.happens(
        "heartbeat", node="n1", slots=[{"slot": 0, "alloc": "a1"}, {"slot": 1, "alloc": "a2"}]
    )

    position = cluster.happens("heartbeat", node="n1", slots=[{"slot": 2, "alloc": "a1"}])

    assert reported(cluster, "n1") == [(0, None, position), (1, None, position),
                                       (2, "a1", position)]


def test_a_heartbeat_without_a_slot_report_keeps_the_last_one(cluster):
    cluster.ready_node("n1", slots=1)
    position = cluster.happens("heartbeat", node="n1", slots=[{"slot": 0, "alloc": "a1"}])

    cluster.happens("heartbeat", node="n1")

    assert reported(cluster, "n1") == [(0, "a1", position)]


@pytest.mark.parametrize(("slots", "has"), [(2, "2 slots"), (1, "1 slot")])
def test_a_slot_report_naming_a_slot_out_of_range_is_rejected(cluster, slots, has):
    cluster.ready_node("n1", slots=slots)
    before = cluster.snapshot()

    reason = cluster.refused("heartbeat", node="n1", slots=[{"slot": 2, "alloc": "a1"}])

    assert reason == f"slot report names slot n1#2, but node n1 has {has}"
    assert cluster.snapshot() == before


def test_a_slot_report_naming_a_slot_below_0_is_rejected(cluster):
    cluster.ready_node("n1", slots=2)
    before = cluster.snapshot()

    reason = cluster.refused("heartbeat", node="n1", slots=[{"slot": -1, "alloc": "a1"}])

    assert reason == "slot report names slot n1#-1, but node n1 has 2 slots"
    assert cluster.snapshot() == before


def test_a_slot_report_listing_a_slot_twice_is_rejected(cluster):
    cluster.ready_node("n1", slots=2)
    before = cluster.snapshot()

    reason = cluster.refused(
        "heartbeat", node="n1", slots=[{"slot": 0, "alloc": "a1"}, {"slot": 0, "alloc": None}]
    )

    assert reason == "slot report lists slot n1#0 twice"
    assert cluster.snapshot() == before


# -- heartbeat-missed -------------------------------------------------------


def test_a_missed_heartbeat_disconnects_a_node_with_an_allocation_that_may_wait(cluster):
    cluster.ready_node("n1", slots=1)
    cluster.running("a1", "n1", slot=0, addresses=["10.0.0.5"], max_disconnect=300)

    position = cluster.happens("heartbeat-missed", node="n1")

    assert cluster.status("n1") == "disconnected"
    alloc = cluster.alloc("a1")
    assert (alloc["client_status"], alloc["desired_status"], alloc["needs_reconnect"]) == (
        "unknown", "run", 1
    )
    assert alloc["unknown_since_position"] == position
    assert cluster.states("a1") == [("unknown", position)]
    assert cluster.needing_reconnect() == ["a1"]


@pytest.mark.parametrize(("since", "deadline"), [
    ("2026-01-01T00:00:00Z", "2026-01-01T00:05:00.000000Z"),
    ("0999-01-01T00:00:00Z", "0999-01-01T00:05:00.000000Z"),  # the one fixed-width form
    ("9999-12-31T23:59:00Z", "9999-12-31T23:59:59.999999Z"),  # past the year 9999: never
])
def test_the_deadline_is_the_disconnect_plus_max_disconnect_in_one_text_form(
    cluster, since, deadline
):
    cluster.ready_node("n1", slots=1)
    cluster.running("a1", "n1", slot=0, max_disconnect=300)

    cluster.happens("heartbeat-missed", node="n1", at=since)

    assert cluster.one("SELECT deadline FROM allocations WHERE alloc = ?", "a1") == {
        "deadline": deadline}


def test_the_view_says_whether_the_deadline_has_passed_by_the_clock(cluster):
    """SPEC §3: ``expired`` is deadline <= now; the view, which has no
    ``--now``, reads the database's clock."""
    now = datetime.now(UTC)
    disconnects = {  # node: (at, max_disconnect)
        "n1": (now - timedelta(hours=2), 60),  # long past
        "n2": (now - timedelta(seconds=1), 0),  # a second ago
        "n3": (now + timedelta(minutes=1), 0),  # a minute ahead
        "n4": (now - timedelta(seconds=30), 3600),  # in an hour
    }
    for node, (at, seconds) in disconnects.items():
        cluster.ready_node(node, slots=1)
        cluster.running(f"a-{node}", node, slot=0, max_disconnect=seconds)
        cluster.happens("heartbeat-missed", node=node, at=at.isoformat())

    found = cluster.rows("SELECT alloc, expired FROM needs_reconnect ORDER BY alloc")

    assert found == [{"alloc": "a-n1", "expired": 1}, {"alloc": "a-n2", "expired": 1},
                     {"alloc": "a-n3", "expired": 0}, {"alloc": "a-n4", "expired": 0}]


def test_an_allocation_waiting_for_its_node_keeps_its_slot_and_addresses(cluster):
    cluster.ready_node("n1", slots=1)
    cluster.running("a1", "n1", slot=0, addresses=["10.0.0.5"], max_disconnect=300)

    cluster.happens("heartbeat-missed", node="n1")

    assert cluster.slot_state("n1", 0) == ("active", "a1")
    assert cluster.holder("10.0.0.5") == ("a1", "held")


def test_on_disconnect_every_other_live_allocation_is_lost(cluster):
    cluster.ready_node("n1", slots=3)
    cluster.running("waits", "n1", slot=0, max_disconnect=300)
    cluster.place("pending", "n1", slot=1, max_disconnect=300, addresses=["10.0.0.6"])
    cluster.running("no-wait", "n1", slot=2, addresses=["10.0.0.7"])

    position = cluster.happens("heartbeat-missed", node="n1")

    assert cluster.status("n1") == "disconnected"
    for lost in ("pending", "no-wait"):
        alloc = cluster.alloc(lost)
        assert (alloc["client_status"], alloc["needs_reconnect"]) == ("lost", 0)
        # The SPEC only says "lost" here; the code also moves desired to stop, as node-down does.
        assert alloc["desired_status"] == "stop"
        assert cluster.states(lost) == [("lost", position)]
    assert cluster.slot_state("n1", 1) == ("free", None)
    assert cluster.slot_state("n1", 2) == ("free", None)
    assert cluster.holder("10.0.0.6") is None
    assert cluster.holder("10.0.0.7") is None
    assert cluster.alloc("waits")["client_status"] == "unknown"


def test_an_allocation_lost_while_it_waited_is_no_longer_unknown_since_anything(cluster):
    cluster.ready_node("n1", slots=1)
    cluster.running("a1", "n1", slot=0, max_disconnect=300)
    unknown_at = cluster.happens("heartbeat-missed", node="n1")

    position = cluster.happens("node-down", node="n1")

    alloc = cluster.alloc("a1")
    assert (alloc["client_status"], alloc["needs_reconnect"], alloc["unknown_since_position"],
            alloc["unknown_since_at"], alloc["deadline"]) == ("lost", 0, None, None, None)
    assert cluster.states("a1") == [("unknown", unknown_at), ("lost", position)]


def test_on_disconnect_a_running_allocation_with_max_disconnect_waits_whatever_is_desired(
    cluster,
):
    """The SPEC: "each of its running allocations with max_disconnect gets client status
    unknown"; only the decision to disconnect looks at desired run."""
    cluster.ready_node("n1")
    cluster.running("keeps", "n1", max_disconnect=300)
    cluster.running("stopping", "n1", max_disconnect=300)
    cluster.happens("alloc-stop-requested", alloc="stopping")

    position = cluster.happens("heartbeat-missed", node="n1")

    assert cluster.status("n1") == "disconnected"
    assert cluster.states("stopping") == [("unknown", position)]
    assert cluster.needing_reconnect() == ["keeps", "stopping"]


def test_a_missed_heartbeat_from_an_initializing_node_disconnects_it_again(cluster):
    """SPEC: heartbeat-missed takes a ``ready``/``initializing`` node to
    ``disconnected`` while an allocation may wait; README: an allocation
    already unknown stays unknown (not lost), still waiting since it first was."""
    cluster.ready_node("n1", slots=2)
    cluster.running("a1", "n1", slot=0, addresses=["10.0.0.5"], max_disconnect=300)
    cluster.running("a2", "n1", slot=1, max_disconnect=300)
    first = cluster.happens("heartbeat-missed", node="n1", at="2026-01-01T00:00:00Z")
    cluster.happens("heartbeat", node="n1")
    assert cluster.status("n1") == "initializing"  # neither a1 nor a2 has reported yet

    position = cluster.happens("heartbeat-missed", node="n1", at="2026-01-01T00:01:00Z")

    node = cluster.node("n1")
    assert (node["status"], node["reason"], node["since_position"]) == (
        "disconnected", None, position)
    assert json.loads(node["lost_allocs"]) == []
    for name in ("a1", "a2"):
        alloc = cluster.alloc(name)
        assert (alloc["client_status"], alloc["desired_status"], alloc["needs_reconnect"]) == (
            "unknown", "run", 1)
        assert (alloc["unknown_since_position"], alloc["deadline"]) == (
            first, "2026-01-01T00:05:00.000000Z")
        assert cluster.states(name) == [("unknown", first)]
    assert cluster.needing_reconnect() == ["a1", "a2"]
    assert cluster.slot_state("n1", 0) == ("active", "a1")
    assert cluster.holder("10.0.0.5") == ("a1", "held")
    assert cluster.refused("alloc-updated", alloc="a1", client_status="running") == (
        "node n1 is not allowed to update allocs while in status disconnected")


def test_an_initializing_node_whose_waiting_allocation_is_desired_stop_goes_down(cluster):
    """Nothing on it may wait any more (desired stop): down, and what waited is lost."""
    cluster.ready_node("n1", slots=1)
    cluster.running("a1", "n1", slot=0, max_disconnect=300)
    first = cluster.happens("heartbeat-missed", node="n1")
    cluster.happens("heartbeat", node="n1")
    cluster.happens("alloc-stop-requested", alloc="a1")
    assert cluster.status("n1") == "initializing"

    position = cluster.happens("heartbeat-missed", node="n1")

    node = cluster.node("n1")
    assert (node["status"], node["reason"], json.loads(node["lost_allocs"])) == (
        "down", "missed heartbeat", ["a1"])
    assert cluster.states("a1") == [("unknown", first), ("lost", position)]
    assert cluster.needing_reconnect() == []
    assert cluster.slot_state("n1", 0) == ("free", None)


def test_a_missed_heartbeat_after_a_partial_reconnect_leaves_the_other_allocation_unknown(
    cluster,
):
    """The node is ready again (a1 reported), a2 has not: a2 stays unknown
    from the first disconnect, a1 waits again."""
    cluster.ready_node("n1", slots=2)
    cluster.running("a1", "n1", slot=0, max_disconnect=300)
    cluster.running("a2", "n1", slot=1, max_disconnect=300)
    first = cluster.happens("heartbeat-missed", node="n1")
    cluster.happens("heartbeat", node="n1")  # initializing: a1 and a2 must report
    back = cluster.report("a1", "running")  # the node is ready again, a2 still unknown
    assert cluster.status("n1") == "ready"

    position = cluster.happens("heartbeat-missed", node="n1")

    assert cluster.status("n1") == "disconnected"
    assert cluster.states("a1") == [("unknown", first), ("running", back), ("unknown", position)]
    assert cluster.states("a2") == [("unknown", first)]
    assert cluster.needing_reconnect() == ["a1", "a2"]


def test_an_allocation_with_max_disconnect_and_desired_stop_does_not_keep_the_node(cluster):
    cluster.ready_node("n1")
    cluster.running("a1", "n1", max_disconnect=300)
    cluster.happens("alloc-stop-requested", alloc="a1")

    cluster.happens("heartbeat-missed", node="n1")

    assert cluster.status("n1") == "down"
    assert cluster.alloc("a1")["client_status"] == "lost"


def test_a_terminal_allocation_with_max_disconnect_does_not_keep_the_node(cluster):
    cluster.ready_node("n1")
    cluster.running("a1", "n1", max_disconnect=300)
    cluster.report("a1", "complete")

    position = cluster.happens("heartbeat-missed", node="n1")

    node = cluster.node("n1")
    assert (node["status"], node["reason"], node["since_position"]) == (
        "down", "missed heartbeat", position
    )
    assert cluster.alloc("a1")["client_status"] == "complete"
    assert cluster.states("a1") == []


def test_a_node_down_after_a_disconnect_took_with_it_what_it_lost_at_the_disconnect(cluster):
    cluster.ready_node("n1", slots=2)
    cluster.running("a1", "n1", slot=0, max_disconnect=60)
    cluster.running("a2", "n1", slot=1)

    cluster.happens("heartbeat-missed", node="n1")
    assert json.loads(cluster.node("n1")["lost_allocs"]) == ["a2"]
    cluster.happens("node-down", node="n1", reason="max disconnect expired")

    node = cluster.node("n1")
    assert (node["status"], json.loads(node["lost_allocs"])) == ("down", ["a1", "a2"])
    cluster.happens("heartbeat", node="n1")
    assert json.loads(cluster.node("n1")["lost_allocs"]) == []  # ready again: nothing lost since


def test_a_missed_heartbeat_takes_down_a_node_whose_allocations_cannot_wait(cluster):
    cluster.ready_node("n1", slots=1)
    cluster.running("a1", "n1", slot=0, addresses=["10.0.0.5"])

    position = cluster.happens("heartbeat-missed", node="n1")

    node = cluster.node("n1")
    assert (node["status"], node["reason"]) == ("down", "missed heartbeat")
    assert json.loads(node["lost_allocs"]) == ["a1"]
    alloc = cluster.alloc("a1")
    assert (alloc["client_status"], alloc["desired_status"]) == ("lost", "stop")
    assert cluster.states("a1") == [("lost", position)]
    assert cluster.slot_state("n1", 0) == ("free", None)
    assert cluster.holder("10.0.0.5") is None


def test_a_missed_heartbeat_that_takes_a_node_down_takes_its_descendants_down(cluster):
    """SPEC: heartbeat-missed "On down: see node-down", which cascades to every
    node whose parent chain includes it; a descendant's allocation that could
    wait is lost with it (the descendants go down, they do not disconnect)."""
    family(cluster)
    cluster.running("waits", "wc2", max_disconnect=300)

    position = cluster.happens("heartbeat-missed", node="host")

    statuses = {r["node"]: (r["status"], r["reason"], r["since_position"])
                for r in cluster.rows("SELECT * FROM nodes")}
    assert statuses == {
        "host": ("down", "missed heartbeat", position),
        "wc1": ("down", "parent host went down", position),
        "wc2": ("down", "parent wc1 went down", position),
        "other": ("ready", None, 8),
    }
    for node, lost in (("host", ["lease-host"]), ("wc1", ["lease-wc1"]),
                       ("wc2", ["lease-wc2", "waits"])):
        assert json.loads(cluster.node(node)["lost_allocs"]) == lost
        for alloc in lost:
            row = cluster.alloc(alloc)
            assert (row["client_status"], row["desired_status"]) == ("lost", "stop")
            assert cluster.states(alloc) == [("lost", position)]
        assert cluster.slot_state(node, 0) == ("free", None)
    assert cluster.needing_reconnect() == []
    assert cluster.alloc("lease-other")["client_status"] == "running"
    assert cluster.refused("alloc-placed", alloc="lease-9", node="wc2", slot=0) == (
        "node wc2 is not ready (status down); it takes no placements")


def test_a_missed_heartbeat_from_a_new_node_takes_it_down(cluster):
    cluster.happens("node-registered", node="n1")

    cluster.happens("heartbeat-missed", node="n1")

    assert cluster.status("n1") == "down"


@pytest.mark.parametrize("how", ["disconnected", "down"])
def test_a_missed_heartbeat_from_a_node_already_away_is_appended_and_changes_nothing(
    cluster, how
):
    cluster.ready_node("n1", slots=1)
    cluster.running("a1", "n1", slot=0, max_disconnect=300)
    cluster.happens("heartbeat-missed" if how == "disconnected" else "node-down", node="n1")
    assert cluster.status("n1") == how
    before = cluster.snapshot()

    assert cluster.happens("heartbeat-missed", node="n1") == 6

    assert cluster.snapshot() == before
    assert cluster.rejections() == []


def test_a_missed_heartbeat_from_a_removed_node_is_rejected(cluster):
    cluster.ready_node("n1")
    cluster.happens("node-removed", node="n1")

    assert cluster.refused("heartbeat-missed", node="n1") == "node n1 has been removed"


# -- node-down --------------------------------------------------------------


def test_a_node_going_down_loses_its_live_allocations(cluster):
    cluster.ready_node("n1", slots=2)
    cluster.running("a1", "n1", slot=0, addresses=["10.0.0.5"], max_disconnect=300)
    cluster.place("a2", "n1", slot=1, addresses=["10.0.0.6", "10.0.0.7"])

    position = cluster.happens("node-down", node="n1", reason="instance gone")

    node = cluster.node("n1")
    assert (node["status"], node["reason"], node["since_position"]) == (
        "down", "instance gone", position
    )
    assert json.loads(node["lost_allocs"]) == ["a1", "a2"]
    for name in ("a1", "a2"):
        alloc = cluster.alloc(name)
        assert (alloc["client_status"], alloc["desired_status"]) == ("lost", "stop")
        assert cluster.states(name) == [("lost", position)]
    assert cluster.rows("SELECT state, alloc FROM slots") == [
        {"state": "free", "alloc": None}, {"state": "free", "alloc": None}
    ]
    assert cluster.rows("SELECT * FROM addresses") == []


def test_a_node_going_down_without_a_reason_has_none(cluster):
    cluster.ready_node("n1")

    cluster.happens("node-down", node="n1")

    assert (cluster.status("n1"), cluster.node("n1")["reason"]) == ("down", None)


def test_a_node_going_down_leaves_finished_allocations_as_they_are(cluster):
    cluster.ready_node("n1")
    cluster.running("done", "n1")
    cluster.report("done", "complete")

    cluster.happens("node-down", node="n1")

    alloc = cluster.alloc("done")
    assert (alloc["client_status"], alloc["desired_status"]) == ("complete", "run")
    assert cluster.states("done") == []


def test_a_disconnected_node_going_down_loses_the_allocations_that_waited(cluster):
    cluster.ready_node("n1")
    cluster.running("a1", "n1", max_disconnect=300)
    unknown_at = cluster.happens("heartbeat-missed", node="n1")

    position = cluster.happens("node-down", node="n1", reason="max disconnect expired")

    alloc = cluster.alloc("a1")
    assert (alloc["client_status"], alloc["needs_reconnect"]) == ("lost", 0)
    assert cluster.states("a1") == [("unknown", unknown_at), ("lost", position)]
    assert cluster.needing_reconnect() == []


def family(cluster):
    """host > wc1 > wc2, each running one allocation; other stays outside."""
    cluster.ready_node("host", slots=1)
    cluster.ready_node("wc1", slots=1, parent="host")
    cluster.ready_node("wc2", slots=1, parent="wc1")
    cluster.ready_node("other", slots=1)
    for node in ("host", "wc1", "wc2", "other"):
        cluster.running(f"lease-{node}", node, slot=0)


def test_a_node_going_down_takes_its_children_and_grandchildren_down(cluster):
    family(cluster)

    position = cluster.happens("node-down", node="host", reason="resource vanished")

    statuses = {r["node"]: (r["status"], r["reason"], r["since_position"])
                for r in cluster.rows("SELECT * FROM nodes")}
    assert statuses == {
        "host": ("down", "resource vanished", position),
        "wc1": ("down", "parent host went down", position),
        "wc2": ("down", "parent wc1 went down", position),
        "other": ("ready", None, 8),
    }
    for node in ("host", "wc1", "wc2"):
        assert cluster.alloc(f"lease-{node}")["client_status"] == "lost"
        assert cluster.states(f"lease-{node}") == [("lost", position)]
        assert cluster.slot_state(node, 0) == ("free", None)
    assert cluster.alloc("lease-other")["client_status"] == "running"


@pytest.mark.parametrize("gone", ["node-down", "node-removed"])
def test_a_heartbeat_does_not_bring_back_a_node_whose_parent_chain_is_gone(cluster, gone):
    """A working copy on a host that is gone takes no leases, whatever it
    reports (registering under it is refused the same way); its heartbeat is
    kept."""
    family(cluster)
    cluster.happens(gone, node="host")

    position = cluster.happens("heartbeat", node="wc2")  # behind wc1, down behind host

    node = cluster.node("wc2")
    assert (node["status"], node["reason"]) == ("down", "parent wc1 went down")
    assert node["last_heartbeat_position"] == position
    assert cluster.refused("alloc-placed", alloc="lease-9", node="wc2", slot=0) == (
        "node wc2 is not ready (status down); it takes no placements")
    assert cluster.refused("node-registered", node="wc3", parent="wc2") == (
        "parent node wc2 is down")


def test_a_heartbeat_does_not_bring_back_a_node_whose_parent_was_removed(cluster):
    """The nearest node of its parent chain that is gone may be removed, not
    down: the working copy of a removed host stays down too."""
    family(cluster)
    cluster.happens("node-removed", node="host")

    position = cluster.happens("heartbeat", node="wc1")  # right under the removed host

    node = cluster.node("wc1")
    assert (node["status"], node["reason"]) == ("down", "parent host was removed")
    assert node["last_heartbeat_position"] == position
    assert cluster.refused("alloc-placed", alloc="lease-9", node="wc1", slot=0) == (
        "node wc1 is not ready (status down); it takes no placements")


def test_under_rules_1_the_cascade_reaches_a_grandchild_back_behind_a_child_down(cluster):
    """Rules 1 let a node come back under a parent that was down; in a log
    they kept, a later cascade still reaches it."""
    cluster.ledger.rules = 1
    family(cluster)
    cluster.happens("node-down", node="wc1")
    cluster.happens("heartbeat", node="wc2")  # back under wc1, which is down
    cluster.running("lease-2", "wc2", slot=0)
    cluster.ledger.rules = RULES

    position = cluster.happens("node-down", node="host")

    assert cluster.status("wc2") == "down"
    assert cluster.states("lease-2") == [("lost", position)]


def test_a_node_stays_down_while_a_grandparent_is_down_behind_a_parent_back(cluster):
    """Rules 1 let wc1 back under host, which is down; today wc2 behind it
    still finds host down in its parent chain, not only its parent."""
    family(cluster)
    cluster.happens("node-down", node="host")
    cluster.ledger.rules = 1
    cluster.happens("heartbeat", node="wc1")  # back under host, which is down
    cluster.ledger.rules = RULES
    assert cluster.status("wc1") == "ready"

    position = cluster.happens("heartbeat", node="wc2")

    node = cluster.node("wc2")
    assert (node["status"], node["reason"]) == ("down", "parent wc1 went down")
    assert node["last_heartbeat_position"] == position
    assert cluster.refused("alloc-placed", alloc="lease-9", node="wc2", slot=0) == (
        "node wc2 is not ready (status down); it takes no placements")


def test_a_node_comes_back_once_every_node_of_its_parent_chain_is_back(cluster):
    family(cluster)
    cluster.happens("node-down", node="host")
    cluster.happens("heartbeat", node="host")

    cluster.happens("heartbeat", node="wc2")
    behind_wc1 = cluster.status("wc2")
    cluster.happens("heartbeat", node="wc1")
    position = cluster.happens("heartbeat", node="wc2")

    assert behind_wc1 == "down"
    node = cluster.node("wc2")
    assert (node["status"], node["since_position"], node["reason"]) == ("ready", position, None)


def test_a_node_already_down_going_down_again_is_appended_and_changes_nothing(cluster):
    family(cluster)
    cluster.happens("node-down", node="host", reason="instance gone")
    before = cluster.snapshot()

    cluster.happens("node-down", node="host", reason="still gone")

    assert cluster.snapshot() == before
    assert cluster.node("host")["reason"] == "instance gone"


def test_a_removed_node_cannot_go_down(cluster):
    cluster.ready_node("n1")
    cluster.happens("node-removed", node="n1")

    assert cluster.refused("node-down", node="n1") == "node n1 has been removed"


# -- node-removed -----------------------------------------------------------


def test_a_removed_child_stays_removed_when_its_parent_goes_down(cluster):
    """The cascade passes over a removed node: removal is for good (later
    events for it are still rejected)."""
    family(cluster)
    removed = cluster.happens("node-removed", node="wc1")
    assert cluster.node("wc2")["reason"] == "parent wc1 was removed"

    cluster.happens("node-down", node="host", reason="resource vanished")

    wc1 = cluster.node("wc1")
    assert (wc1["status"], wc1["reason"], wc1["since_position"]) == ("removed", None, removed)
    assert cluster.node("wc2")["reason"] == "parent wc1 was removed"
    assert cluster.refused("heartbeat", node="wc1") == "node wc1 has been removed"


def test_a_removed_node_loses_its_allocations(cluster):
    cluster.ready_node("n1", slots=1)
    cluster.running("a1", "n1", slot=0, addresses=["10.0.0.5"])

    position = cluster.happens("node-removed", node="n1")

    assert cluster.status("n1") == "removed"
    alloc = cluster.alloc("a1")
    assert (alloc["client_status"], alloc["desired_status"]) == ("lost", "stop")
    assert cluster.states("a1") == [("lost", position)]
    assert cluster.slot_state("n1", 0) == ("free", None)
    assert cluster.holder("10.0.0.5") is None


@pytest.mark.parametrize("down_first, reason", [(False, None), (True, "instance gone")])
def test_a_removed_node_keeps_only_the_reason_it_went_down(cluster, down_first, reason):
    cluster.ready_node("n1")
    cluster.happens("node-suspected", node="n1", reason="flaky disk")
    if down_first:
        cluster.happens("node-down", node="n1", reason="instance gone")

    cluster.happens("node-removed", node="n1")

    node = cluster.node("n1")
    assert (node["status"], node["health"], node["reason"], node["health_reason"]) == (
        "removed", "suspect", reason, "flaky disk"
    )


def test_a_node_going_down_cascades_to_children_registered_before_the_store_was_reopened(
    cluster,
):
    """The children and live allocations are read back from the tables when
    the caches are cold (another process registered them)."""
    family(cluster)
    cluster.reopen()

    position = cluster.happens("node-down", node="host")

    assert {r["node"]: (r["status"], r["since_position"])
            for r in cluster.rows("SELECT * FROM nodes")} == {
        "host": ("down", position), "wc1": ("down", position), "wc2": ("down", position),
        "other": ("ready", 8)}
    assert cluster.alloc("lease-wc2")["client_status"] == "lost"


def test_a_disconnected_node_still_waits_for_its_allocation_after_the_store_is_reopened(
    cluster,
):
    """Which allocations wait to reconnect is read back from the tables when
    the caches are cold: the node returns initializing (Nomad #15808), and the
    allocation's update reconnects it."""
    cluster.ready_node("n1", slots=2)
    cluster.running("a1", "n1", slot=0, max_disconnect=60)
    missed = cluster.happens("heartbeat-missed", node="n1")
    cluster.reopen()

    cluster.happens("heartbeat", node="n1")

    assert cluster.status("n1") == "initializing"
    assert cluster.needing_reconnect() == ["a1"]
    reported = cluster.report("a1", "running")
    assert cluster.states("a1") == [("unknown", missed), ("running", reported)]
    assert cluster.status("n1") == "ready"


def test_a_node_down_after_the_store_is_reopened_took_what_it_lost_at_the_disconnect(cluster):
    cluster.ready_node("n1", slots=2)
    cluster.running("a1", "n1", slot=0, max_disconnect=60)
    cluster.running("a2", "n1", slot=1)
    cluster.happens("heartbeat-missed", node="n1")
    cluster.reopen()

    position = cluster.happens("node-down", node="n1", reason="max disconnect expired")

    node = cluster.node("n1")
    assert (node["status"], json.loads(node["lost_allocs"])) == ("down", ["a1", "a2"])
    assert cluster.alloc("a1")["client_status"] == "lost"
    assert cluster.states("a1")[-1] == ("lost", position)


def test_a_suspect_node_keeps_its_health_reason_through_a_change_after_the_store_is_reopened(
    cluster,
):
    cluster.ready_node("n1", slots=1)
    cluster.running("a1", "n1", slot=0)
    cluster.happens("node-suspected", node="n1", reason="flaky disk")
    cluster.reopen()

    cluster.report("a1", "complete")  # frees the slot: the node's row is written again

    node = cluster.node("n1")
    assert (node["health"], node["health_reason"], node["slots_used"]) == (
        "suspect", "flaky disk", 0)


def test_removing_a_node_takes_its_children_and_grandchildren_down(cluster):
    """The SPEC says "same cascade as node-down": descendants go down, not removed."""
    family(cluster)

    position = cluster.happens("node-removed", node="host")

    statuses = {r["node"]: (r["status"], r["reason"]) for r in cluster.rows("SELECT * FROM nodes")}
    assert statuses == {
        "host": ("removed", None),
        "wc1": ("down", "parent host was removed"),
        "wc2": ("down", "parent wc1 went down"),
        "other": ("ready", None),
    }
    for node in ("host", "wc1", "wc2"):
        assert cluster.states(f"lease-{node}") == [("lost", position)]
    assert cluster.alloc("lease-other")["client_status"] == "running"


CHAIN = 1000  # nodes in one parent chain: c0 <- c1 <- ... <- c999


def chain(cluster, length: int = CHAIN) -> None:
    """A parent chain of ``length`` ready nodes, a running lease on the last."""
    events = [{"type": "node-registered", "node": "c0", "slots": 1}]
    events += [{"type": "node-registered", "node": f"c{i}", "slots": 1, "parent": f"c{i - 1}"}
               for i in range(1, length)]
    events += [{"type": "heartbeat", "node": f"c{i}"} for i in range(length)]
    events += [{"type": "alloc-placed", "alloc": "deep", "node": f"c{length - 1}", "slot": 0},
               {"type": "alloc-updated", "alloc": "deep", "client_status": "running"}]
    assert {r.status for r in cluster.ledger.submit_many(events, batch=5000)} == {"appended"}


GONE = [
    pytest.param("node-down", {"reason": "instance gone"}, id="node-down"),
    pytest.param("node-removed", {}, id="node-removed"),
    pytest.param("health-checked", {"passed": False}, id="health-check-failed"),
    pytest.param("heartbeat-missed", {}, id="heartbeat-missed"),
]


@pytest.mark.parametrize(("gone", "fields"), GONE)
def test_a_cascade_reaches_the_end_of_a_long_parent_chain(cluster, gone, fields):
    """SPEC: node-down "cascades to every node whose parent chain includes
    it", whatever the chain's length (the SPEC and README set none). A chain
    of a few hundred nodes made the cascade exceed Python's recursion limit:
    from about 500 nodes the event is refused as an internal error
    (RecursionError, nothing kept); from about 490, submit keeps it but
    replay, audit, --as-of and PostgreSQL's follower fail on it for ever."""
    chain(cluster)

    position = cluster.happens(gone, node="c0", **fields)

    last = cluster.node(f"c{CHAIN - 1}")
    assert (last["status"], last["reason"], last["since_position"]) == (
        "down", f"parent c{CHAIN - 2} went down", position)
    assert cluster.states("deep") == [("lost", position)]
    assert cluster.rows("SELECT COUNT(*) AS n FROM nodes WHERE status = 'down'") == [
        {"n": CHAIN - (gone == "node-removed")}]


def test_a_cascade_down_a_long_parent_chain_replays():
    """Replays (``replay``, ``audit``, ``--as-of``, the PostgreSQL follower)
    apply kept events to an in-memory Cluster: the cascade of a node-down
    kept in the log must replay there too, whatever the chain's length."""
    cluster = Cluster()
    position = 0

    def apply(event):
        nonlocal position
        position += 1
        cluster.apply(event, Fact(position, "2026-01-01T00:00:00.000000Z"))

    apply({"type": "node-registered", "node": "c0", "slots": 0})
    for i in range(1, CHAIN):
        apply({"type": "node-registered", "node": f"c{i}", "slots": 0, "parent": f"c{i - 1}"})

    apply({"type": "node-down", "node": "c0"})

    assert cluster.node(f"c{CHAIN - 1}").status == "down"


LATER = [
    pytest.param("heartbeat", {}, "node n1 has been removed", id="heartbeat"),
    pytest.param("heartbeat-missed", {}, "node n1 has been removed", id="heartbeat-missed"),
    pytest.param("node-down", {}, "node n1 has been removed", id="node-down"),
    pytest.param("node-removed", {}, "node n1 has been removed", id="node-removed"),
    pytest.param("node-suspected", {"reason": "disk"}, "node n1 has been removed",
                 id="node-suspected"),
    pytest.param("health-checked", {"passed": True}, "node n1 has been removed",
                 id="health-checked"),
    pytest.param("alloc-placed", {"alloc": "a2"}, "node n1 has been removed", id="alloc-placed"),
    pytest.param("node-registered", {"slots": 1}, "node n1 is already registered",
                 id="node-registered"),
]


@pytest.mark.parametrize(("kind", "fields", "reason"), LATER)
def test_later_events_for_a_removed_node_are_rejected(cluster, kind, fields, reason):
    cluster.ready_node("n1", slots=1)
    cluster.running("a1", "n1", slot=0)
    cluster.happens("node-removed", node="n1")
    before = cluster.snapshot()

    assert cluster.refused(kind, node="n1", **fields) == reason

    assert cluster.snapshot() == before


# -- node-suspected ---------------------------------------------------------


def test_a_suspected_node_is_suspect_and_keeps_its_status(cluster):
    cluster.ready_node("n1")
    cluster.running("a1", "n1")

    position = cluster.happens("node-suspected", node="n1", reason="disk errors")

    node = cluster.node("n1")
    assert (node["health"], node["status"], node["reason"], node["since_position"]) == (
        "suspect", "ready", "disk errors", position
    )
    assert cluster.alloc("a1")["client_status"] == "running"


def test_a_suspect_node_takes_no_placements(cluster):
    cluster.ready_node("n1", slots=1)
    cluster.happens("node-suspected", node="n1", reason="disk errors")

    reason = cluster.refused("alloc-placed", alloc="a1", node="n1", slot=0)

    assert reason == "node n1 is suspect; it takes no placements"
    assert cluster.slot_state("n1", 0) == ("free", None)


def test_a_suspicion_is_not_inherited_by_the_children(cluster):
    # SPEC refuses placements on a node that is suspect and says nothing of
    # its children; only down and removed cascade (README, Choices). Drydock
    # would keep leases off a suspect host's working copies: a scheduler that
    # wants that reads query suspects and the nodes' parent column.
    cluster.ready_node("h1")
    cluster.ready_node("wc1", slots=1, parent="h1")
    cluster.happens("node-suspected", node="h1", reason="disk errors")

    cluster.place("L1", "wc1", slot=0)

    assert cluster.node("wc1")["health"] == "ok"
    assert cluster.slot_state("wc1", 0) == ("allocated", "L1")


def test_an_unknown_node_cannot_be_suspected(cluster):
    assert cluster.refused("node-suspected", node="n9", reason="x") == "node n9 is not registered"


# -- health-checked ---------------------------------------------------------


def test_a_passed_health_check_makes_a_suspect_node_healthy_again(cluster):
    cluster.ready_node("n1", slots=1)
    cluster.happens("node-suspected", node="n1", reason="disk errors")

    cleared = cluster.happens("health-checked", node="n1", passed=True)

    node = cluster.node("n1")
    assert (node["health"], node["status"], node["reason"], node["since_position"]) == (
        "ok", "ready", None, cleared)
    cluster.place("a1", "n1", slot=0)
    assert cluster.slot_state("n1", 0) == ("allocated", "a1")


def test_a_passed_health_check_of_a_healthy_node_changes_nothing(cluster):
    cluster.ready_node("n1", slots=1)
    cluster.running("a1", "n1", slot=0)
    before = cluster.snapshot()

    cluster.happens("health-checked", node="n1", passed=True)

    assert cluster.snapshot() == before


def test_a_down_node_suspected_and_cleared_keeps_the_reason_it_went_down(cluster):
    cluster.ready_node("n1")
    cluster.happens("node-down", node="n1", reason="instance gone")

    suspected = cluster.happens("node-suspected", node="n1", reason="flaky disk")
    node = cluster.node("n1")
    assert (node["status"], node["health"], node["reason"], node["health_reason"]) == (
        "down", "suspect", "instance gone", "flaky disk"
    )
    assert node["since_position"] == suspected

    cluster.happens("health-checked", node="n1", passed=True)
    node = cluster.node("n1")
    assert (node["status"], node["health"], node["reason"], node["health_reason"]) == (
        "down", "ok", "instance gone", None
    )


@pytest.mark.parametrize("down", [
    ("node-down", {"reason": "instance gone"}),
    ("health-checked", {"passed": False}),
    ("heartbeat-missed", {}),
])
def test_a_suspect_node_back_from_down_shows_its_suspicion_again(cluster, down):
    cluster.ready_node("n1")
    cluster.happens("node-suspected", node="n1", reason="flaky disk")
    kind, fields = down
    cluster.happens(kind, node="n1", **fields)
    assert cluster.node("n1")["status"] == "down"

    cluster.happens("heartbeat", node="n1")

    node = cluster.node("n1")
    assert (node["status"], node["health"], node["reason"]) == ("ready", "suspect", "flaky disk")


def test_a_suspect_node_that_is_suspected_again_shows_the_latest_suspicion(cluster):
    cluster.ready_node("n1")
    cluster.happens("node-suspected", node="n1", reason="flaky disk")
    cluster.happens("node-down", node="n1", reason="instance gone")
    cluster.happens("node-suspected", node="n1", reason="bad memory")

    cluster.happens("heartbeat", node="n1")

    assert cluster.node("n1")["reason"] == "bad memory"


def test_a_failed_health_check_recycles_the_node_like_node_down(cluster):
    family(cluster)
    cluster.running("a2", "host", addresses=["10.0.0.5"])

    position = cluster.happens("health-checked", node="host", passed=False)

    node = cluster.node("host")
    assert (node["status"], node["reason"], node["since_position"]) == (
        "down", "health check failed", position
    )
    for alloc in ("lease-host", "a2"):
        row = cluster.alloc(alloc)
        assert (row["client_status"], row["desired_status"]) == ("lost", "stop")
        assert cluster.states(alloc) == [("lost", position)]
    assert cluster.slot_state("host", 0) == ("free", None)
    assert cluster.holder("10.0.0.5") is None
    assert (cluster.status("wc1"), cluster.status("wc2")) == ("down", "down")
    assert cluster.states("lease-wc2") == [("lost", position)]


@pytest.mark.parametrize("status", ["disconnected", "initializing"])
def test_a_failed_health_check_recycles_a_node_that_is_not_ready_too(cluster, status):
    """A node that missed its heartbeat (and one heartbeating again while its
    allocations still need to reconnect) goes down on a failed check: what
    waited to reconnect is lost, not left waiting on a recycled node."""
    cluster.ready_node("n1", slots=1)
    cluster.running("a1", "n1", slot=0, addresses=["10.0.0.5"], max_disconnect=300)
    missed = cluster.happens("heartbeat-missed", node="n1")
    if status == "initializing":
        cluster.happens("heartbeat", node="n1")
    assert (cluster.status("n1"), cluster.needing_reconnect()) == (status, ["a1"])

    position = cluster.happens("health-checked", node="n1", passed=False)

    node = cluster.node("n1")
    assert (node["status"], node["reason"], node["since_position"]) == (
        "down", "health check failed", position
    )
    alloc = cluster.alloc("a1")
    assert (alloc["client_status"], alloc["desired_status"], alloc["needs_reconnect"]) == (
        "lost", "stop", 0
    )
    assert cluster.states("a1") == [("unknown", missed), ("lost", position)]
    assert cluster.needing_reconnect() == []
    assert cluster.slot_state("n1", 0) == ("free", None)
    assert cluster.holder("10.0.0.5") is None


def test_a_failed_health_check_on_a_node_already_down_changes_nothing(cluster):
    cluster.ready_node("n1")
    cluster.happens("node-down", node="n1", reason="instance gone")
    before = cluster.snapshot()

    cluster.happens("health-checked", node="n1", passed=False)

    assert cluster.snapshot() == before
