"""The allocation rules of SPEC section 2, one rule per test: alloc-placed,
alloc-updated, alloc-stop-requested, alloc-remove-requested, alloc-removed,
and desired status only moving forward. The ``cluster`` fixture is in
``tests/conftest.py``.
"""

from __future__ import annotations

import json

import pytest

from projections.history import history

# -- alloc-placed -----------------------------------------------------------


def test_a_placed_allocation_is_pending_desired_run_holding_its_slot_and_addresses(cluster):
    cluster.ready_node("n1", slots=2)

    position = cluster.place(
        "a1", "n1", job="web", slot=1, addresses=["10.0.0.5", "8080"], max_disconnect=300
    )

    alloc = cluster.alloc("a1")
    assert {k: alloc[k] for k in ("node", "job", "slot", "desired_status", "client_status",
                                  "max_disconnect", "needs_reconnect", "removed")} == {
        "node": "n1", "job": "web", "slot": 1, "desired_status": "run",
        "client_status": "pending", "max_disconnect": 300, "needs_reconnect": 0, "removed": 0,
    }
    assert json.loads(alloc["addresses"]) == ["10.0.0.5", "8080"]
    assert alloc["placed_position"] == position
    slot = cluster.slot("n1", 1)
    assert (slot["state"], slot["alloc"], slot["since_position"]) == ("allocated", "a1", position)
    assert cluster.slot_state("n1", 0) == ("free", None)
    assert cluster.holder("10.0.0.5") == ("a1", "held")
    assert cluster.holder("8080") == ("a1", "held")
    assert cluster.states("a1") == []


def test_an_allocation_may_be_placed_without_a_slot(cluster):
    cluster.ready_node("n1", slots=1)

    cluster.place("a1", "n1")

    assert (cluster.alloc("a1")["slot"], cluster.alloc("a1")["client_status"]) == (None, "pending")
    assert cluster.slot_state("n1", 0) == ("free", None)


def test_a_placement_on_an_unknown_node_is_rejected(cluster):
    assert cluster.refused("alloc-placed", alloc="a1", node="n9") == "node n9 is not registered"
    assert cluster.rows("SELECT * FROM allocations") == []


def test_an_initializing_node_takes_no_placements(cluster):
    cluster.happens("node-registered", node="n1", slots=1)

    reason = cluster.refused("alloc-placed", alloc="a1", node="n1", slot=0)

    assert reason == "node n1 is not ready (status initializing); it takes no placements"
    assert cluster.slot_state("n1", 0) == ("free", None)
    assert cluster.rows("SELECT * FROM allocations") == []


def test_a_disconnected_node_takes_no_placements(cluster):
    cluster.ready_node("n1", slots=2)
    cluster.running("a1", "n1", slot=0, max_disconnect=300)
    cluster.happens("heartbeat-missed", node="n1")

    reason = cluster.refused("alloc-placed", alloc="a2", node="n1", slot=1)

    assert reason == "node n1 is not ready (status disconnected); it takes no placements"
    assert cluster.slot_state("n1", 1) == ("free", None)


def test_a_down_node_takes_no_placements(cluster):
    cluster.ready_node("n1", slots=1)
    cluster.happens("node-down", node="n1")

    reason = cluster.refused("alloc-placed", alloc="a1", node="n1", slot=0)

    assert reason == "node n1 is not ready (status down); it takes no placements"


def test_a_removed_node_takes_no_placements(cluster):
    cluster.ready_node("n1", slots=1)
    cluster.happens("node-removed", node="n1")

    assert cluster.refused("alloc-placed", alloc="a1", node="n1") == "node n1 has been removed"


def test_a_suspect_node_takes_no_placements(cluster):
    cluster.ready_node("n1", slots=1)
    cluster.happens("node-suspected", node="n1", reason="disk errors")

    reason = cluster.refused("alloc-placed", alloc="a1", node="n1")

    assert reason == "node n1 is suspect; it takes no placements"
    assert cluster.rows("SELECT * FROM allocations") == []


@pytest.mark.parametrize(("slots", "has"), [(2, "2 slots"), (1, "1 slot"), (0, "0 slots")])
def test_a_slot_index_out_of_range_is_rejected(cluster, slots, has):
    cluster.ready_node("n1", slots=slots)

    reason = cluster.refused("alloc-placed", alloc="a1", node="n1", slot=2)

    assert reason == f"slot n1#2 is out of range (node n1 has {has})"
    assert cluster.rows("SELECT * FROM allocations") == []


@pytest.mark.parametrize("slot", [-1, -(2**31), 2**31 - 1])
def test_a_slot_index_no_node_has_is_rejected_and_kept_for_audits(cluster, slot):
    """Below 0 or past every node's slots, the index is out of range: a
    rule refuses it and the rejection log keeps it, as any other."""
    cluster.ready_node("n1", slots=2)
    cluster.place("a2", "n1", slot=1)  # the last slot held: -1 must not reach it

    reason = cluster.refused("alloc-placed", alloc="a1", node="n1", slot=slot)

    assert reason == f"slot n1#{slot} is out of range (node n1 has 2 slots)"
    kept = cluster.rows("SELECT entity, reason, event FROM rejections")
    assert [(row["entity"], row["reason"], json.loads(row["event"])["slot"])
            for row in kept] == [("a1", reason, slot)]
    assert cluster.rows("SELECT alloc FROM allocations") == [{"alloc": "a2"}]
    concerning = [row["type"] for row in history(cluster.ledger.store, "a2")]
    assert concerning == ["alloc-placed"]  # not the refused placement


def test_a_slot_held_by_another_allocation_is_not_given_away(cluster):
    cluster.ready_node("n1", slots=1)
    cluster.place("a2", "n1", slot=0)

    reason = cluster.refused("alloc-placed", alloc="a1", node="n1", slot=0)

    assert reason == "slot n1#0 is already held by allocation a2"
    assert cluster.slot_state("n1", 0) == ("allocated", "a2")
    assert cluster.rows("SELECT alloc FROM allocations") == [{"alloc": "a2"}]


def test_a_placement_refused_for_a_held_slot_or_address_is_in_the_holders_history(cluster):
    """docs/queries.md: a refused placement is also in the history of the
    allocations that held the slot or addresses it asked for."""
    cluster.ready_node("n1", slots=1)
    cluster.place("a2", "n1", slot=0)
    cluster.place("t1", "n1", addresses=["10.0.0.5"])

    for_slot = cluster.submit("alloc-placed", alloc="a1", node="n1", slot=0).position
    for_address = cluster.submit(
        "alloc-placed", alloc="t2", node="n1", addresses=["10.0.0.5"]).position

    assert [(row["position"], row["status"]) for row in history(cluster.ledger.store, "a2")][
        -1:] == [(for_slot, "rejected")]
    assert [(row["position"], row["status"]) for row in history(cluster.ledger.store, "t1")][
        -1:] == [(for_address, "rejected")]


def test_an_allocation_holding_a_slot_cannot_take_another(cluster):
    """The Flink fix: one AllocationID, one slot."""
    cluster.ready_node("n1", slots=2)
    cluster.place("a1", "n1", slot=0)

    reason = cluster.refused("alloc-placed", alloc="a1", node="n1", slot=1)

    assert reason == "allocation a1 already holds slot n1#0"
    assert (cluster.slot_state("n1", 0), cluster.slot_state("n1", 1)) == (
        ("allocated", "a1"), ("free", None)
    )


def test_an_allocation_holding_a_slot_cannot_be_placed_on_another_node(cluster):
    cluster.ready_node("n1", slots=1)
    cluster.ready_node("n2", slots=1)
    cluster.place("a1", "n1", slot=0)

    reason = cluster.refused("alloc-placed", alloc="a1", node="n2", slot=0)

    assert reason == "allocation a1 already holds slot n1#0"
    assert cluster.slot_state("n2", 0) == ("free", None)
    assert cluster.alloc("a1")["node"] == "n1"


def test_an_allocation_on_a_node_cannot_be_placed_on_another_node(cluster):
    cluster.ready_node("n1")
    cluster.ready_node("n2")
    cluster.place("a1", "n1")

    reason = cluster.refused("alloc-placed", alloc="a1", node="n2")

    assert reason == "allocation a1 is already placed on node n1"
    assert cluster.alloc("a1")["node"] == "n1"


def test_placing_again_with_a_slot_names_the_slot_as_a_field_that_differs(cluster):
    """Placed on n1 without a slot, placed again on n1#0: it is pending, not
    running, and on the same node; what differs is the slot."""
    cluster.ready_node("n1", slots=1)
    cluster.place("a1", "n1")

    reason = cluster.refused("alloc-placed", alloc="a1", node="n1", slot=0, job="web")

    assert reason == (
        "allocation a1 is already placed on node n1, and its slot and job differ; "
        "placing it again must repeat the same fields"
    )
    assert cluster.slot_state("n1", 0) == ("free", None)


def test_the_same_allocation_with_other_fields_is_not_the_same_placement(cluster):
    cluster.ready_node("n1", slots=1)
    cluster.place("a1", "n1", slot=0, job="web")

    reason = cluster.refused("alloc-placed", alloc="a1", node="n1", slot=0, job="batch")

    assert reason == (
        "allocation a1 already holds slot n1#0, and its job differs; "
        "placing it again must repeat the same fields"
    )
    assert cluster.alloc("a1")["job"] == "web"


@pytest.mark.parametrize(("placed", "named"), [
    ({"max_disconnect": 60}, "addresses and max_disconnect differ"),  # every field that differs
    ({}, "addresses differ"),  # addresses alone, in the plural
])
def test_placing_again_on_the_same_node_names_the_fields_that_differ(cluster, placed, named):
    cluster.ready_node("n1")
    cluster.place("a1", "n1", addresses=["10.0.0.5"], **placed)

    reason = cluster.refused("alloc-placed", alloc="a1", node="n1", addresses=["10.0.0.6"])

    assert reason == (
        f"allocation a1 is already placed on node n1, and its {named}; "
        "placing it again must repeat the same fields"
    )


def test_the_same_addresses_in_another_order_are_the_same_placement(cluster):
    cluster.ready_node("n1", slots=1)
    placed = cluster.place("a1", "n1", slot=0, addresses=["10.0.0.5", "10.0.0.6"])

    again = cluster.submit("alloc-placed", alloc="a1", node="n1", slot=0,
                           addresses=["10.0.0.6", "10.0.0.5"])

    assert (again.status, again.position) == ("duplicate", placed)


def test_a_finished_allocation_id_is_not_placed_again(cluster):
    cluster.ready_node("n1", slots=2)
    cluster.place("a1", "n1", slot=0)
    cluster.report("a1", "complete")

    reason = cluster.refused("alloc-placed", alloc="a1", node="n1", slot=1)

    assert reason == (
        "allocation a1 was already placed and is complete; an allocation id is placed once"
    )
    assert cluster.slot_state("n1", 1) == ("free", None)


def test_an_address_held_by_a_task_that_has_not_shut_down_is_not_given_away(cluster):
    """The Swarmkit fix: the old task keeps its IP until it is terminal."""
    cluster.ready_node("n1", slots=1)
    cluster.running("t1", "n1", addresses=["10.0.0.5"])

    reason = cluster.refused("alloc-placed", alloc="t2", node="n1", slot=0,
                             addresses=["10.0.0.9", "10.0.0.5"])

    assert reason == "address 10.0.0.5 is still held by allocation t1, which has not shut down"
    assert cluster.holder("10.0.0.5") == ("t1", "held")
    assert cluster.holder("10.0.0.9") is None
    assert cluster.slot_state("n1", 0) == ("free", None)


def test_an_allocation_placed_before_the_store_was_reopened_is_not_placed_again(cluster):
    """With the caches cold (another process placed it), the allocation a
    placement names is read back from the tables before the batch is decided
    (``Store.preload``): found, it is the same placement or a refused one,
    never a second allocation under the same id."""
    cluster.ready_node("n1", slots=2)
    placed = cluster.place("a1", "n1", slot=0, job="web")
    cluster.reopen()

    again = cluster.submit("alloc-placed", alloc="a1", node="n1", slot=0, job="web")
    reason = cluster.refused("alloc-placed", alloc="a1", node="n1", slot=1, job="web")

    assert (again.status, again.position) == ("duplicate", placed)
    assert reason == "allocation a1 already holds slot n1#0"
    assert cluster.alloc("a1")["slot"] == 0
    assert cluster.slot_state("n1", 1) == ("free", None)


def test_an_address_held_before_the_store_was_reopened_is_not_given_away(cluster):
    """With the caches cold, who holds the addresses a placement asks for is
    read back from the tables (``Store.preload``): the holder keeps it."""
    cluster.ready_node("n1", slots=1)
    cluster.running("t1", "n1", addresses=["10.0.0.5"])
    cluster.reopen()

    reason = cluster.refused("alloc-placed", alloc="t2", node="n1", slot=0,
                             addresses=["10.0.0.9", "10.0.0.5"])

    assert reason == "address 10.0.0.5 is still held by allocation t1, which has not shut down"
    assert cluster.holder("10.0.0.5") == ("t1", "held")
    assert cluster.holder("10.0.0.9") is None


def test_an_address_stays_held_through_stop_and_remove_requests(cluster):
    cluster.ready_node("n1")
    cluster.running("t1", "n1", addresses=["10.0.0.5"])
    stopping = cluster.happens("alloc-stop-requested", alloc="t1")
    cluster.happens("alloc-remove-requested", alloc="t1")

    reason = cluster.refused("alloc-placed", alloc="t2", node="n1", addresses=["10.0.0.5"])

    assert reason == "address 10.0.0.5 is still held by allocation t1, which has not shut down"
    assert cluster.holder("10.0.0.5") == ("t1", "releasing")
    # releasing since the stop request: the remove request changes nothing about it
    assert cluster.one("SELECT since_position FROM addresses")["since_position"] == stopping


def test_an_address_is_free_again_once_its_holder_is_terminal(cluster):
    cluster.ready_node("n1")
    cluster.running("t1", "n1", addresses=["10.0.0.5"])
    cluster.report("t1", "complete")

    position = cluster.place("t2", "n1", addresses=["10.0.0.5"])

    assert cluster.one("SELECT alloc, state, since_position FROM addresses") == {
        "alloc": "t2", "state": "held", "since_position": position
    }


def test_a_slot_is_free_again_once_its_allocation_is_terminal(cluster):
    cluster.ready_node("n1", slots=1)
    cluster.running("a1", "n1", slot=0)
    cluster.report("a1", "failed", blame="alloc")

    cluster.place("a2", "n1", slot=0)

    assert cluster.slot_state("n1", 0) == ("allocated", "a2")


def test_a_rejection_about_a_finished_allocation_is_not_in_the_history_of_its_old_address(
    cluster,
):
    """docs/queries.md: a rejection about an allocation is in the history of
    the addresses it held then, not of those it gave back (now t2's)."""
    cluster.ready_node("n1")
    placed = cluster.place("t1", "n1", addresses=["10.0.0.5"])
    released = cluster.report("t1", "complete")
    taken = cluster.place("t2", "n1", addresses=["10.0.0.5"])

    late = cluster.submit("alloc-updated", alloc="t1", client_status="running").position

    assert [row["position"] for row in history(cluster.ledger.store, "10.0.0.5")] == [
        placed, released, taken]
    assert late in [row["position"] for row in history(cluster.ledger.store, "n1")]


def test_a_slot_freed_by_a_terminal_status_is_free_since_that_update(cluster):
    cluster.ready_node("n1", slots=1)
    cluster.running("a1", "n1", slot=0)

    finished = cluster.report("a1", "complete")

    slot = cluster.slot("n1", 0)
    assert (slot["state"], slot["alloc"], slot["since_position"]) == ("free", None, finished)


def test_a_stop_request_for_a_finished_allocation_leaves_its_old_address_to_the_new_holder(
    cluster,
):
    """The address went to t2 once t1 was terminal: a late stop or remove
    request for t1 does not make t2's hold ``releasing``."""
    cluster.ready_node("n1")
    cluster.running("t1", "n1", addresses=["10.0.0.5"])
    cluster.report("t1", "complete")
    taken = cluster.place("t2", "n1", addresses=["10.0.0.5"])

    cluster.happens("alloc-stop-requested", alloc="t1")
    cluster.happens("alloc-remove-requested", alloc="t1")

    assert cluster.one("SELECT alloc, state, since_position FROM addresses") == {
        "alloc": "t2", "state": "held", "since_position": taken
    }


def test_placing_the_same_allocation_again_is_a_duplicate_and_appends_nothing(cluster):
    cluster.ready_node("n1", slots=1)
    placed = cluster.place("a1", "n1", job="web", slot=0, addresses=["10.0.0.5"],
                           max_disconnect=60)
    cluster.report("a1", "running")
    before = cluster.snapshot()

    receipt = cluster.submit("alloc-placed", alloc="a1", node="n1", job="web", slot=0,
                             addresses=["10.0.0.5"], max_disconnect=60)

    assert (receipt.status, receipt.position, receipt.error) == ("duplicate", placed, None)
    assert cluster.head() == 4
    assert cluster.rejections() == []
    assert cluster.snapshot() == before


@pytest.mark.parametrize("removed", [False, True])
def test_placing_a_finished_allocation_again_the_same_way_is_still_a_duplicate(cluster, removed):
    """A retry of a placement that was accepted: its answer does not change
    once the allocation is terminal, or reaped (README)."""
    cluster.ready_node("n1", slots=1)
    placed = cluster.place("a1", "n1", slot=0, addresses=["10.0.0.5"])
    cluster.report("a1", "complete")
    if removed:
        cluster.happens("alloc-removed", alloc="a1")
    head, before = cluster.head(), cluster.snapshot()

    receipt = cluster.submit("alloc-placed", alloc="a1", node="n1", slot=0,
                             addresses=["10.0.0.5"])

    assert (receipt.status, receipt.position, receipt.error) == ("duplicate", placed, None)
    assert cluster.head() == head
    assert cluster.rejections() == []
    assert cluster.snapshot() == before


# -- alloc-updated ----------------------------------------------------------


def test_an_update_for_an_allocation_never_placed_is_rejected(cluster):
    cluster.ready_node("n1")

    reason = cluster.refused("alloc-updated", alloc="a9", client_status="running")

    assert reason == "allocation a9 is not placed"
    assert cluster.rows("SELECT * FROM allocations") == []


def test_an_update_for_a_removed_allocation_is_rejected(cluster):
    cluster.ready_node("n1")
    cluster.running("a1", "n1")
    cluster.report("a1", "complete")
    cluster.happens("alloc-removed", alloc="a1")

    reason = cluster.refused("alloc-updated", alloc="a1", client_status="running")

    assert reason == "allocation a1 has been removed"


def test_a_disconnected_node_may_not_update_its_allocations(cluster):
    cluster.ready_node("n1", slots=1)
    cluster.running("a1", "n1", slot=0, max_disconnect=300)
    cluster.happens("heartbeat-missed", node="n1")
    before = cluster.snapshot()

    reason = cluster.refused("alloc-updated", alloc="a1", client_status="running")

    assert reason == "node n1 is not allowed to update allocs while in status disconnected"
    assert cluster.snapshot() == before
    assert cluster.needing_reconnect() == ["a1"]


@pytest.mark.parametrize("event", ["node-down", "node-removed"])
def test_a_node_that_is_gone_may_not_update_its_allocations(cluster, event):
    cluster.ready_node("n1")
    cluster.running("a1", "n1")
    cluster.happens(event, node="n1")
    status = {"node-down": "down", "node-removed": "removed"}[event]

    reason = cluster.refused("alloc-updated", alloc="a1", client_status="running")

    assert cluster.status("n1") == status
    assert reason == f"node n1 is not allowed to update allocs while in status {status}"
    assert cluster.alloc("a1")["client_status"] == "lost"


@pytest.mark.parametrize("final", ["complete", "failed"])
def test_a_terminal_status_never_changes(cluster, final):
    cluster.ready_node("n1")
    cluster.running("a1", "n1")
    cluster.report("a1", final, blame="alloc")

    reason = cluster.refused("alloc-updated", alloc="a1", client_status="running")

    assert reason == f"allocation a1 is {final}; a terminal status never changes"
    assert cluster.alloc("a1")["client_status"] == final


def test_a_lost_allocation_stays_lost_when_its_node_comes_back(cluster):
    cluster.ready_node("n1", slots=1)
    cluster.running("a1", "n1", slot=0)
    cluster.happens("node-down", node="n1")
    cluster.happens("heartbeat", node="n1")

    reason = cluster.refused("alloc-updated", alloc="a1", client_status="running")

    assert reason == "allocation a1 is lost; a terminal status never changes"
    assert cluster.slot_state("n1", 0) == ("free", None)


def test_an_update_reconnects_an_allocation_with_the_reported_status(cluster):
    cluster.ready_node("n1", slots=1)
    cluster.running("a1", "n1", slot=0, addresses=["10.0.0.5"], max_disconnect=300)
    unknown_at = cluster.happens("heartbeat-missed", node="n1")
    cluster.happens("heartbeat", node="n1")

    position = cluster.report("a1", "running")

    alloc = cluster.alloc("a1")
    assert (alloc["client_status"], alloc["needs_reconnect"]) == ("running", 0)
    assert (alloc["unknown_since_position"], alloc["unknown_since_at"], alloc["deadline"]) == (
        None, None, None)  # not unknown since anything now; the alloc states say when it was
    assert cluster.states("a1") == [("unknown", unknown_at), ("running", position)]
    assert cluster.needing_reconnect() == []
    assert cluster.slot_state("n1", 0) == ("active", "a1")
    assert cluster.holder("10.0.0.5") == ("a1", "held")


def test_an_allocation_may_reconnect_with_a_terminal_status(cluster):
    cluster.ready_node("n1", slots=1)
    cluster.running("a1", "n1", slot=0, addresses=["10.0.0.5"], max_disconnect=300)
    unknown_at = cluster.happens("heartbeat-missed", node="n1")
    cluster.happens("heartbeat", node="n1")

    position = cluster.report("a1", "complete")

    assert cluster.states("a1") == [("unknown", unknown_at), ("complete", position)]
    assert cluster.slot_state("n1", 0) == ("free", None)
    assert cluster.holder("10.0.0.5") is None


def test_an_update_that_is_not_a_reconnect_adds_no_alloc_state(cluster):
    cluster.ready_node("n1")
    cluster.place("a1", "n1")

    cluster.report("a1", "running")
    cluster.report("a1", "complete")

    assert cluster.states("a1") == []
    assert cluster.alloc("a1")["client_status"] == "complete"


def test_the_first_accepted_update_from_an_initializing_node_makes_it_ready(cluster):
    cluster.ready_node("n1", slots=2)
    cluster.running("a1", "n1", slot=0, max_disconnect=300)
    cluster.running("a2", "n1", slot=1, max_disconnect=300)
    cluster.happens("heartbeat-missed", node="n1")
    cluster.happens("heartbeat", node="n1")
    assert cluster.status("n1") == "initializing"

    position = cluster.report("a1", "running")

    node = cluster.node("n1")
    assert (node["status"], node["since_position"]) == ("ready", position)
    # As the SPEC says: the first update, even while a2 has not reported yet.
    assert cluster.needing_reconnect() == ["a2"]


def test_an_allocation_reporting_after_its_node_is_ready_again_still_reconnects(cluster):
    cluster.ready_node("n1")
    cluster.running("a1", "n1", max_disconnect=300)
    cluster.running("a2", "n1", max_disconnect=300)
    unknown_at = cluster.happens("heartbeat-missed", node="n1")
    cluster.happens("heartbeat", node="n1")
    cluster.report("a1", "running")
    assert cluster.status("n1") == "ready"

    position = cluster.report("a2", "failed", blame="alloc")

    assert cluster.states("a2") == [("unknown", unknown_at), ("failed", position)]
    assert cluster.needing_reconnect() == []


def test_a_rejected_update_leaves_an_initializing_node_initializing(cluster):
    cluster.ready_node("n1")
    cluster.running("a1", "n1", max_disconnect=300)
    cluster.place("a2", "n1")  # pending: lost on disconnect
    cluster.happens("heartbeat-missed", node="n1")
    cluster.happens("heartbeat", node="n1")

    cluster.refused("alloc-updated", alloc="a2", client_status="running")

    assert cluster.status("n1") == "initializing"


def test_a_running_allocation_makes_its_slot_active(cluster):
    cluster.ready_node("n1", slots=1)
    cluster.place("a1", "n1", slot=0)

    position = cluster.report("a1", "running")

    slot = cluster.slot("n1", 0)
    assert (slot["state"], slot["alloc"], slot["since_position"]) == ("active", "a1", position)
    assert cluster.alloc("a1")["updated_position"] == position


def test_a_pending_report_keeps_the_slot_allocated(cluster):
    cluster.ready_node("n1", slots=1)
    placed = cluster.place("a1", "n1", slot=0)

    cluster.report("a1", "pending")

    slot = cluster.slot("n1", 0)
    assert (slot["state"], slot["alloc"], slot["since_position"]) == ("allocated", "a1", placed)


@pytest.mark.parametrize("final", ["complete", "failed"])
def test_a_terminal_status_frees_the_slot_and_the_addresses(cluster, final):
    cluster.ready_node("n1", slots=1)
    cluster.running("a1", "n1", slot=0, addresses=["10.0.0.5", "10.0.0.6"])

    cluster.report("a1", final, blame="alloc")

    assert cluster.slot_state("n1", 0) == ("free", None)
    assert cluster.rows("SELECT * FROM addresses") == []
    assert cluster.alloc("a1")["client_status"] == final


def test_a_status_report_is_in_the_history_of_the_node_that_reported_it(cluster):
    """alloc-updated is the node reporting its allocation (Nomad
    ``Node.UpdateAlloc``): its node's history lists it, though it names only
    the allocation and changes nothing else of the node."""
    cluster.ready_node("n1")
    placed = cluster.place("a1", "n1")

    reported = cluster.report("a1", "running")

    assert [row["position"] for row in history(cluster.ledger.store, "n1")][-2:] == [
        placed, reported]


def test_a_failure_blamed_on_the_node_marks_the_node_suspect(cluster):
    cluster.ready_node("n1", slots=2)
    cluster.running("a1", "n1", slot=0)

    position = cluster.report("a1", "failed")  # blame defaults to the node

    node = cluster.node("n1")
    assert (node["health"], node["status"], node["reason"], node["since_position"]) == (
        "suspect", "ready", "allocation a1 failed", position
    )
    assert cluster.refused("alloc-placed", alloc="a2", node="n1", slot=1) == (
        "node n1 is suspect; it takes no placements"
    )


def test_a_failure_blamed_on_the_allocation_leaves_the_node_healthy(cluster):
    cluster.ready_node("n1", slots=2)
    cluster.running("a1", "n1", slot=0)

    cluster.report("a1", "failed", blame="alloc")

    node = cluster.node("n1")
    assert (node["health"], node["reason"]) == ("ok", None)
    cluster.place("a2", "n1", slot=1)


# -- alloc-stop-requested ---------------------------------------------------


def test_a_stop_request_moves_desired_to_stop_and_frees_nothing(cluster):
    cluster.ready_node("n1", slots=1)
    cluster.running("a1", "n1", slot=0, addresses=["10.0.0.5"])

    position = cluster.happens("alloc-stop-requested", alloc="a1")

    alloc = cluster.alloc("a1")
    assert (alloc["desired_status"], alloc["client_status"], alloc["updated_position"]) == (
        "stop", "running", position
    )
    assert cluster.slot_state("n1", 0) == ("active", "a1")
    assert cluster.holder("10.0.0.5") == ("a1", "releasing")


def test_a_stop_request_after_a_remove_request_is_rejected(cluster):
    cluster.ready_node("n1")
    cluster.running("a1", "n1")
    cluster.happens("alloc-remove-requested", alloc="a1")

    reason = cluster.refused("alloc-stop-requested", alloc="a1")

    assert reason == (
        "allocation a1 is already desired remove; desired status only moves forward "
        "(run, stop, remove), not to stop"
    )
    assert cluster.alloc("a1")["desired_status"] == "remove"


def test_a_stop_request_for_an_allocation_never_placed_is_rejected(cluster):
    assert cluster.refused("alloc-stop-requested", alloc="a9") == "allocation a9 is not placed"


def test_a_second_stop_request_changes_nothing(cluster):
    cluster.ready_node("n1")
    cluster.running("a1", "n1", addresses=["10.0.0.5"])
    stopped = cluster.happens("alloc-stop-requested", alloc="a1")
    before = cluster.snapshot()

    cluster.happens("alloc-stop-requested", alloc="a1")

    assert cluster.snapshot() == before
    assert cluster.alloc("a1")["updated_position"] == stopped


# -- alloc-remove-requested -------------------------------------------------


def test_a_remove_request_moves_desired_to_remove_and_frees_nothing(cluster):
    cluster.ready_node("n1", slots=1)
    cluster.running("a1", "n1", slot=0, addresses=["10.0.0.5"])

    cluster.happens("alloc-remove-requested", alloc="a1")

    alloc = cluster.alloc("a1")
    assert (alloc["desired_status"], alloc["client_status"], alloc["removed"]) == (
        "remove", "running", 0
    )
    assert cluster.slot_state("n1", 0) == ("active", "a1")
    assert cluster.holder("10.0.0.5") == ("a1", "releasing")


def test_a_remove_request_follows_a_stop_request(cluster):
    cluster.ready_node("n1")
    cluster.running("a1", "n1")
    cluster.happens("alloc-stop-requested", alloc="a1")

    cluster.happens("alloc-remove-requested", alloc="a1")

    assert cluster.alloc("a1")["desired_status"] == "remove"


def test_a_remove_request_for_an_allocation_never_placed_is_rejected(cluster):
    assert cluster.refused("alloc-remove-requested", alloc="a9") == "allocation a9 is not placed"


# -- alloc-removed ----------------------------------------------------------


def test_a_running_allocation_is_not_reaped_before_it_shuts_down(cluster):
    cluster.ready_node("n1")
    cluster.running("t1", "n1", addresses=["10.0.0.5"])
    cluster.happens("alloc-remove-requested", alloc="t1")
    before = cluster.snapshot()

    reason = cluster.refused("alloc-removed", alloc="t1")

    assert reason == (
        "allocation t1 is running; removing it now would free 10.0.0.5 before it shuts down"
    )
    assert cluster.snapshot() == before


def test_reaping_names_every_hold_a_live_allocation_still_has(cluster):
    cluster.ready_node("n1", slots=1)
    cluster.place("t1", "n1", slot=0, addresses=["10.0.0.5", "10.0.0.6"])

    reason = cluster.refused("alloc-removed", alloc="t1")

    assert reason == (
        "allocation t1 is pending; removing it now would free 10.0.0.5, 10.0.0.6 and slot n1#0 "
        "before it shuts down"
    )


def test_an_allocation_waiting_to_reconnect_is_not_reaped(cluster):
    cluster.ready_node("n1")
    cluster.running("t1", "n1", max_disconnect=300)
    cluster.happens("heartbeat-missed", node="n1")

    reason = cluster.refused("alloc-removed", alloc="t1")

    assert reason == (
        "allocation t1 is unknown; removing it now would free its place on node n1 "
        "before it shuts down"
    )


def test_a_terminal_allocation_is_reaped_and_its_history_stays(cluster):
    cluster.ready_node("n1", slots=1)
    cluster.running("t1", "n1", slot=0, addresses=["10.0.0.5"])
    lost_at = cluster.happens("node-down", node="n1")
    cluster.happens("heartbeat", node="n1")

    position = cluster.happens("alloc-removed", alloc="t1")

    # The code keeps the row, marked removed, rather than deleting it.
    alloc = cluster.alloc("t1")
    assert (alloc["removed"], alloc["client_status"], alloc["updated_position"]) == (
        1, "lost", position
    )
    assert cluster.states("t1") == [("lost", lost_at)]
    assert cluster.slot_state("n1", 0) == ("free", None)
    assert cluster.holder("10.0.0.5") is None


@pytest.mark.parametrize(
    ("kind", "fields"),
    [
        ("alloc-removed", {}),
        ("alloc-stop-requested", {}),
        ("alloc-remove-requested", {}),
        ("alloc-updated", {"client_status": "running"}),
    ],
)
def test_later_events_for_a_reaped_allocation_are_rejected(cluster, kind, fields):
    cluster.ready_node("n1")
    cluster.running("t1", "n1")
    cluster.report("t1", "complete")
    cluster.happens("alloc-removed", alloc="t1")

    assert cluster.refused(kind, alloc="t1", **fields) == "allocation t1 has been removed"


# -- desired status only moves forward ----------------------------------------


def test_a_lost_allocation_is_desired_stop_and_a_stop_request_keeps_it_there(cluster):
    cluster.ready_node("n1")
    cluster.running("a1", "n1")
    lost_at = cluster.happens("node-down", node="n1")

    cluster.happens("alloc-stop-requested", alloc="a1")

    alloc = cluster.alloc("a1")
    assert (alloc["desired_status"], alloc["updated_position"]) == ("stop", lost_at)


def test_losing_an_allocation_desired_remove_keeps_it_desired_remove(cluster):
    cluster.ready_node("n1")
    cluster.running("a1", "n1")
    cluster.happens("alloc-remove-requested", alloc="a1")

    cluster.happens("node-down", node="n1")

    alloc = cluster.alloc("a1")
    assert (alloc["desired_status"], alloc["client_status"]) == ("remove", "lost")


def test_a_second_remove_request_changes_nothing(cluster):
    cluster.ready_node("n1")
    cluster.running("a1", "n1")
    cluster.happens("alloc-remove-requested", alloc="a1")
    before = cluster.snapshot()

    cluster.happens("alloc-remove-requested", alloc="a1")

    assert cluster.snapshot() == before


# -- nodes.slots_used follows the slot table ----------------------------------


def used(cluster, node="n1"):
    """The node's slots_used, and the count of its slots that are not free."""
    held = cluster.one(
        "SELECT COUNT(*) AS n FROM slots WHERE node = ? AND state <> 'free'", node)["n"]
    return cluster.node(node)["slots_used"], held


FREED = [
    pytest.param([("alloc-updated", {"alloc": "a1", "client_status": "complete"})], 1,
                 id="complete"),
    pytest.param([("alloc-updated", {"alloc": "a2", "client_status": "failed",
                                     "blame": "alloc"})], 1, id="failed"),
    pytest.param([("alloc-updated", {"alloc": "a1", "client_status": "complete"}),
                  ("alloc-removed", {"alloc": "a1"})], 1, id="complete-then-reaped"),
    pytest.param([("node-down", {"node": "n1"})], 0, id="node-down"),
    pytest.param([("node-removed", {"node": "n1"})], 0, id="node-removed"),
    pytest.param([("health-checked", {"node": "n1", "passed": False})], 0,
                 id="health-check-failed"),
    pytest.param([("heartbeat-missed", {"node": "n1"})], 0, id="heartbeat-missed-down"),
    pytest.param([("node-down", {"node": "host"})], 0, id="parent-down"),
]


@pytest.mark.parametrize(("events", "left"), FREED)
def test_slots_used_goes_down_when_a_slot_is_freed(cluster, events, left):
    """SPEC section 3, ``nodes``: slots_used; a terminal status, a loss
    (node down, removed, recycled, missed heartbeat, a parent gone) frees the slot."""
    cluster.ready_node("host")
    cluster.ready_node("n1", slots=3, parent="host")
    assert used(cluster) == (0, 0)
    cluster.running("a1", "n1", slot=0)
    assert used(cluster) == (1, 1)
    cluster.place("a2", "n1", slot=1)
    cluster.place("a3", "n1")  # holds no slot
    assert used(cluster) == (2, 2)

    for kind, fields in events:
        cluster.happens(kind, **fields)

    assert used(cluster) == (left, left)


@pytest.mark.parametrize(("events", "left"), FREED)
def test_allocs_goes_down_when_an_allocation_is_terminal(cluster, events, left):
    """SPEC section 3, ``nodes``: allocs counts the node's live allocations,
    with a slot or without."""
    cluster.ready_node("host")
    cluster.ready_node("n1", slots=3, parent="host")
    cluster.running("a1", "n1", slot=0)
    cluster.place("a2", "n1", slot=1)
    cluster.place("a3", "n1")  # holds no slot
    assert cluster.node("n1")["allocs"] == 3

    for kind, fields in events:
        cluster.happens(kind, **fields)

    assert cluster.node("n1")["allocs"] == (2 if left else 0)  # a2 and a3, unless n1 is gone


def test_slots_used_keeps_the_slot_of_an_allocation_waiting_to_reconnect(cluster):
    cluster.ready_node("n1", slots=3)
    cluster.running("waits", "n1", slot=0, max_disconnect=300)
    cluster.running("a2", "n1", slot=1)
    cluster.place("a3", "n1", slot=2, max_disconnect=300)  # pending: lost
    assert used(cluster) == (3, 3)

    cluster.happens("heartbeat-missed", node="n1")

    assert cluster.status("n1") == "disconnected"
    assert used(cluster) == (1, 1)
    cluster.happens("heartbeat", node="n1")
    cluster.report("waits", "complete")
    assert used(cluster) == (0, 0)
