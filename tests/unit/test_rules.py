"""Ledger-wide rules (SPEC section 2): positions, the rejection log, invalid
events and safe retries by ``id``.

The rules of each event type are in ``test_rules_nodes.py`` and
``test_rules_allocs.py``; the ``cluster`` fixture is in ``tests/conftest.py``.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta

import pytest

from projections.history import history


def test_positions_are_gapless_and_start_at_1(cluster):
    assert cluster.happens("node-registered", node="n1", slots=1) == 1
    assert cluster.happens("heartbeat", node="n1") == 2
    assert cluster.happens("alloc-placed", alloc="a1", node="n1", slot=0) == 3
    assert cluster.head() == 3


def test_a_rejected_event_takes_the_next_position_like_any_other(cluster):
    cluster.happens("node-registered", node="n1")

    receipt = cluster.submit("node-registered", node="n1")

    assert (receipt.status, receipt.position) == ("rejected", 2)
    assert cluster.happens("heartbeat", node="n1") == 3


def test_positions_continue_after_the_store_is_reopened(cluster):
    cluster.happens("node-registered", node="n1")
    cluster.happens("heartbeat", node="n1")

    cluster.reopen()

    assert cluster.happens("heartbeat", node="n1") == 3
    assert cluster.status("n1") == "ready"


# -- the rejection log ------------------------------------------------------

def busy_cluster(cluster):
    """n1 (2 slots) runs a1 on n1#0 with 10.0.0.5; a2 is complete; a3 is desired remove."""
    cluster.ready_node("n1", slots=2)
    cluster.running("a1", "n1", slot=0, addresses=["10.0.0.5"], max_disconnect=60)
    cluster.place("a2", "n1")
    cluster.report("a2", "complete")
    cluster.place("a3", "n1")
    cluster.happens("alloc-remove-requested", alloc="a3")


REFUSED = [
    pytest.param(
        {"type": "alloc-placed", "alloc": "a4", "node": "n1", "slot": 0},
        "slot n1#0 is already held by allocation a1",
        id="slot-held",
    ),
    pytest.param(
        {"type": "alloc-placed", "alloc": "a4", "node": "n1", "addresses": ["10.0.0.5"]},
        "address 10.0.0.5 is still held by allocation a1, which has not shut down",
        id="address-held",
    ),
    pytest.param(
        {"type": "alloc-placed", "alloc": "a1", "node": "n1", "slot": 1},
        "allocation a1 already holds slot n1#0",
        id="allocation-moves",
    ),
    pytest.param(
        {"type": "alloc-updated", "alloc": "a2", "client_status": "running"},
        "allocation a2 is complete; a terminal status never changes",
        id="terminal-final",
    ),
    pytest.param(
        {"type": "alloc-stop-requested", "alloc": "a3"},
        "allocation a3 is already desired remove; desired status only moves forward "
        "(run, stop, remove), not to stop",
        id="desired-backwards",
    ),
    pytest.param(
        {"type": "alloc-removed", "alloc": "a1"},
        "allocation a1 is running; removing it now would free 10.0.0.5 and slot n1#0 "
        "before it shuts down",
        id="removed-before-shutdown",
    ),
    pytest.param(
        {"type": "node-registered", "node": "n1", "slots": 4},
        "node n1 is already registered",
        id="re-register",
    ),
    pytest.param(
        {"type": "heartbeat", "node": "n1", "slots": [{"slot": 2, "alloc": "a1"}]},
        "slot report names slot n1#2, but node n1 has 2 slots",
        id="bad-slot-report",
    ),
]


@pytest.mark.parametrize(("event", "reason"), REFUSED)
def test_a_rejected_event_is_kept_in_the_rejection_log_and_changes_nothing_else(
    cluster, event, reason
):
    busy_cluster(cluster)
    before = cluster.snapshot()
    head = cluster.head()

    receipt = cluster.ledger.submit(event)

    assert (receipt.status, receipt.position, receipt.error) == ("rejected", head + 1, reason)
    [kept] = cluster.rejections()
    assert (kept["position"], kept["type"], kept["reason"]) == (head + 1, event["type"], reason)
    assert kept["entity"] == event.get("alloc", event.get("node"))
    stored = json.loads(kept["event"])
    assert {field: stored.get(field) for field in event} == event
    assert stored["at"] == kept["at"]
    assert cluster.snapshot() == before


def test_an_appended_event_leaves_the_rejection_log_alone(cluster):
    busy_cluster(cluster)

    assert cluster.rejections() == []


# -- invalid events ---------------------------------------------------------

# SPEC section 2's event types, in its order: an unknown type names them.
SPEC_TYPES = (
    "node-registered, heartbeat, heartbeat-missed, node-down, node-removed, node-suspected, "
    "health-checked, alloc-placed, alloc-updated, alloc-stop-requested, "
    "alloc-remove-requested, alloc-removed"
)
INVALID = [
    pytest.param({"type": "node-rebooted", "node": "n1"},
                 f"unknown type 'node-rebooted' (the types: {SPEC_TYPES})", id="unknown-type"),
    pytest.param({"type": "heartbeat", "node": "n1", "at": "2026-01-01T00:00:00"},
                 "field 'at': needs a time zone (Z or +hh:mm)", id="time-without-zone"),
    pytest.param({"node": "n1"}, "missing field 'type'", id="missing-type"),
    pytest.param({"type": "heartbeat", "node": "n1", "colour": "red"},
                 "unknown field 'colour'", id="unknown-field"),
    pytest.param({"type": "node-registered", "node": "n2", "slots": "2"},
                 "field 'slots': Input should be a valid integer", id="wrong-type-int"),
    pytest.param({"type": "health-checked", "node": "n1", "passed": "yes"},
                 "field 'passed': must be true or false (JSON), not \"yes\"", id="wrong-type-bool"),
    pytest.param({"type": "alloc-placed", "alloc": "a2", "node": "n1", "addresses": "10.0.0.9"},
                 "field 'addresses': Input should be a valid array", id="wrong-type-list"),
    pytest.param({"type": "alloc-placed", "alloc": "a2"}, "missing field 'node'",
                 id="missing-field"),
    pytest.param({"type": "alloc-updated", "alloc": "a1", "client_status": "lost"},
                 "field 'client_status': Input should be 'pending', 'running', 'complete' "
                 "or 'failed'", id="status-not-reportable"),
    pytest.param({"type": "heartbeat", "node": "n1", "slots": [{"slot": "0", "alloc": None}]},
                 "field 'slots.0.slot': Input should be a valid integer", id="slot-report-type"),
]


@pytest.mark.parametrize(("event", "message"), INVALID)
def test_an_invalid_event_is_reported_naming_the_field_and_changes_nothing(
    cluster, event, message
):
    cluster.ready_node("n1", slots=1)
    cluster.running("a1", "n1", slot=0)
    before = cluster.snapshot()

    receipt = cluster.ledger.submit(event)

    assert (receipt.status, receipt.position, receipt.error) == ("invalid", None, message)
    assert cluster.head() == 4
    assert cluster.rejections() == []
    assert cluster.snapshot() == before


def test_an_invalid_event_takes_no_position(cluster):
    cluster.happens("node-registered", node="n1")

    assert cluster.submit("heartbeat", node="n1", colour="red").status == "invalid"

    assert cluster.happens("heartbeat", node="n1") == 2


# -- safe retries by id -----------------------------------------------------

def test_an_id_already_in_the_ledger_is_a_duplicate_with_the_original_position(cluster):
    cluster.happens("node-registered", node="n1", id="reg-n1")
    cluster.happens("heartbeat", node="n1", id="hb-1")
    before = cluster.snapshot()

    receipt = cluster.submit("node-registered", node="n1", id="reg-n1")

    assert (receipt.status, receipt.position, receipt.error) == ("duplicate", 1, None)
    assert receipt.ok
    assert cluster.head() == 2
    assert cluster.rejections() == []
    assert cluster.snapshot() == before


def test_an_id_used_again_for_another_event_is_invalid_naming_the_kept_one(cluster):
    """README: the same id with another event is not a retry (a counter reset,
    two tools choosing one key); answering duplicate would drop it silently."""
    cluster.happens("node-registered", node="n1", id="e-1")
    before = cluster.snapshot()

    receipt = cluster.submit("heartbeat", node="n1", id="e-1")

    assert (receipt.status, receipt.position) == ("invalid", None)
    assert receipt.error == (
        "id 'e-1' is already used by another event (node-registered at position 1; "
        "slots, type differ): a retry must repeat the event, a new event needs a new id"
    )
    assert not receipt.ok
    assert cluster.head() == 1
    assert cluster.snapshot() == before


def test_another_event_under_a_kept_id_is_invalid_after_the_store_is_reopened(cluster):
    cluster.ready_node("n1", slots=1)
    cluster.happens("alloc-placed", alloc="a1", node="n1", slot=0, id="p-1")
    cluster.reopen()  # what was kept under the id is read back from the log

    receipt = cluster.submit("alloc-placed", alloc="a2", node="n1", slot=0, id="p-1")

    assert receipt.status == "invalid"
    assert "(alloc-placed at position 3; alloc differs)" in receipt.error
    assert cluster.rows("SELECT alloc FROM allocations") == [{"alloc": "a1"}]


def test_another_event_under_an_id_of_the_same_batch_is_invalid(cluster):
    receipts = cluster.ledger.submit_batch([
        {"type": "node-registered", "node": "n1", "id": "k"},
        {"type": "node-registered", "node": "n1", "id": "k"},
        {"type": "node-registered", "node": "n2", "id": "k"},
    ])

    assert [(r.status, r.position) for r in receipts] == [
        ("appended", 1), ("duplicate", 1), ("invalid", None)]
    assert "node differs" in receipts[2].error


def test_a_retry_without_at_is_the_event_the_ledger_stamped(cluster):
    """The first submission's ``at`` was the time it was received: a retry
    that leaves ``at`` out is the same event; one that gives another is not."""
    cluster.happens("node-registered", node="n1", id="r", source="sim")
    cluster.happens("node-registered", node="n2", id="s", at="2026-01-01T01:00:00+01:00")

    assert cluster.submit("node-registered", node="n1", id="r", source="sim").status == (
        "duplicate")
    assert cluster.submit("node-registered", node="n2", id="s").status == "duplicate"
    assert cluster.submit(  # the same moment written otherwise
        "node-registered", node="n2", id="s", at="2026-01-01T00:00:00Z").status == "duplicate"
    other_time = cluster.submit(
        "node-registered", node="n2", id="s", at="2026-01-01T00:00:01Z")
    assert (other_time.status, "at differs" in other_time.error) == ("invalid", True)
    other_source = cluster.submit("node-registered", node="n1", id="r")
    assert (other_source.status, "source differs" in other_source.error) == ("invalid", True)
    assert cluster.head() == 2


def test_a_retry_decided_again_is_not_taken_for_another_event(cluster):
    """A batch is decided again when the decision it was made on is dropped
    (another writer appended meanwhile): the ledger's stamp on the first
    decision must not stay on the event, or its retry would differ in ``at``."""
    class Dropped(Exception):
        pass

    cluster.happens("node-registered", node="n1")
    batch = [{"type": "heartbeat", "node": "n1", "id": "x"}]
    with pytest.raises(Dropped), cluster.ledger.store.writing() as cursor:
        assert cluster.ledger.decide(cursor, batch)[0].status == "appended"
        raise Dropped  # the transaction is rolled back: nothing of it is kept
    cluster.ledger.forget()
    assert "at" not in batch[0]
    assert cluster.happens("heartbeat", node="n1", id="x") == 2  # kept meanwhile, stamped now

    with cluster.ledger.store.writing() as cursor:
        again = cluster.ledger.decide(cursor, batch)

    assert [(r.status, r.position, r.error) for r in again] == [("duplicate", 2, None)]


def test_a_retry_by_id_may_list_the_addresses_in_another_order(cluster):
    """Addresses are a set, as when an allocation is placed again (README)."""
    cluster.ready_node("n1", slots=1)
    cluster.happens("alloc-placed", alloc="a1", node="n1", addresses=["x", "y"], id="p")

    retry = cluster.submit("alloc-placed", alloc="a1", node="n1", addresses=["y", "x"], id="p")
    other = cluster.submit("alloc-placed", alloc="a1", node="n1", addresses=["x", "z"], id="p")

    assert (retry.status, retry.position, retry.error) == ("duplicate", 3, None)
    assert other.status == "invalid"
    assert "(alloc-placed at position 3; addresses differ)" in other.error


def test_a_retry_by_id_may_list_a_slot_report_in_another_order(cluster):
    """A report is a table of which allocation each slot holds."""
    cluster.ready_node("n1", slots=2)
    report = [{"slot": 0, "alloc": "a1"}, {"slot": 1, "alloc": None}]
    cluster.happens("heartbeat", node="n1", slots=report, id="h")

    retry = cluster.submit("heartbeat", node="n1", slots=report[::-1], id="h")
    other = cluster.submit("heartbeat", node="n1", slots=[
        {"slot": 0, "alloc": None}, {"slot": 1, "alloc": "a1"}], id="h")

    assert (retry.status, retry.position, retry.error) == ("duplicate", 3, None)
    assert other.status == "invalid"
    assert "(heartbeat at position 3; slots differ)" in other.error


def test_a_retry_that_spells_out_a_default_is_the_same_event(cluster):
    cluster.happens("node-registered", node="n1", id="r")

    receipt = cluster.submit("node-registered", node="n1", slots=0, id="r")

    assert (receipt.status, receipt.position, receipt.error) == ("duplicate", 1, None)


def test_a_retried_rejection_is_a_duplicate_carrying_the_rejection(cluster):
    """It did not take effect: the duplicate says so (and ``submit`` exits 1)."""
    cluster.happens("node-registered", node="n1")
    assert cluster.refused("node-registered", node="n1", id="again") == (
        "node n1 is already registered"
    )

    receipt = cluster.submit("node-registered", node="n1", id="again")
    cluster.reopen()
    reread = cluster.submit("node-registered", node="n1", id="again")

    for answer in (receipt, reread):
        assert (answer.status, answer.position) == ("duplicate", 2)
        assert answer.error == "rejected at position 2: node n1 is already registered"
        assert not answer.ok
    assert [r["position"] for r in cluster.rejections()] == [2]
    assert cluster.head() == 2


def test_an_invalid_event_does_not_use_up_its_id(cluster):
    assert cluster.submit("node-registered", node="n1", slots="1", id="reg").status == "invalid"

    assert cluster.happens("node-registered", node="n1", slots=1, id="reg") == 1


def test_an_id_is_still_a_duplicate_after_the_store_is_reopened(cluster):
    cluster.happens("node-registered", node="n1", slots=1, id="reg-n1")
    cluster.happens("heartbeat", node="n1", id="hb-1")
    cluster.reopen()
    before = cluster.snapshot()

    receipt = cluster.submit("heartbeat", node="n1", id="hb-1")

    assert (receipt.status, receipt.position) == ("duplicate", 2)
    assert cluster.head() == 2
    assert cluster.snapshot() == before
    assert cluster.happens("heartbeat", node="n1", id="hb-2") == 3


# -- the envelope: id, source, recorded_at ----------------------------------

@pytest.mark.parametrize(("ident", "limit"), [
    pytest.param("", "at least 1 character", id="empty"),
    pytest.param("x" * 129, "at most 128 characters", id="129-chars"),
])
def test_an_id_outside_1_to_128_characters_is_invalid_naming_the_field(cluster, ident, limit):
    """SPEC section 2: ``id`` is 1-128 characters."""
    receipt = cluster.submit("node-registered", node="n1", id=ident)

    assert (receipt.status, receipt.position) == ("invalid", None)
    assert receipt.error is not None
    assert receipt.error.startswith("field 'id': "), receipt.error
    assert limit in receipt.error
    assert cluster.head() == 0
    assert cluster.rows("SELECT * FROM nodes") == []


def test_an_id_of_128_characters_is_kept_whole(cluster):
    ident = "i" * 127 + "d"

    assert cluster.happens("node-registered", node="n1", id=ident) == 1

    again = cluster.submit("node-registered", node="n1", id=ident)
    assert (again.status, again.position) == ("duplicate", 1)
    other = cluster.submit("node-registered", node="n2", id="i" * 128)  # same first 127
    assert (other.status, other.position) == ("appended", 2)


def kept_log(cluster):
    """Every kept event as the log holds it: (position, topic, state)."""
    found = cluster.rows(
        "SELECT originator_version, topic, state FROM stored_events ORDER BY originator_version")
    return [(r["originator_version"], r["topic"], json.loads(bytes(r["state"]))) for r in found]


def test_the_source_is_kept_with_the_event_appended_or_rejected(cluster):
    """SPEC section 2: ``source`` (who reported it, free text) is part of the
    event; the kept event, and so ``query history``, shows it."""
    cluster.happens("node-registered", node="n1", source="nomad-server-2 \"eu\"")
    cluster.refused("node-registered", node="n1", source="retry-bot")
    cluster.happens("heartbeat", node="n1")

    rows = history(cluster.ledger.store, "n1")
    assert [(r["position"], r["status"], r["event"].get("source")) for r in rows] == [
        (1, "appended", "nomad-server-2 \"eu\""), (2, "rejected", "retry-bot"), (3, "appended", None),
    ]
    assert [state["event"].get("source") for _, _, state in kept_log(cluster)] == [
        "nomad-server-2 \"eu\"", "retry-bot", None,
    ]
    assert json.loads(cluster.rejections()[0]["event"])["source"] == "retry-bot"


def test_every_kept_event_has_the_time_it_was_recorded(cluster):
    """SPEC section 2: the ledger adds ``position`` and ``recorded_at`` (kept in
    the log's ``state``, README "Tables for reporting tools"), whatever ``at``
    says; ``at`` defaults to the time received."""
    def utc_text(moment: datetime) -> str:
        return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")

    before = utc_text(datetime.now(UTC) - timedelta(seconds=1))
    cluster.happens("node-registered", node="n1", at="2020-01-01T00:00:00Z")
    cluster.refused("node-registered", node="n1", at="2020-01-01T00:00:01Z")
    assert cluster.submit("heartbeat", node="n1", colour="red").status == "invalid"
    cluster.happens("heartbeat", node="n1")
    after = utc_text(datetime.now(UTC) + timedelta(seconds=1))

    kept = kept_log(cluster)

    assert [(position, topic) for position, topic, _ in kept] == [
        (1, "node-registered"), (2, "rejected"), (3, "heartbeat")]
    for _, _, state in kept:
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", state["recorded_at"])
        assert before <= state["recorded_at"] <= after
    ats = [state["event"]["at"] for _, _, state in kept]
    assert ats[:2] == ["2020-01-01T00:00:00.000000Z", "2020-01-01T00:00:01.000000Z"]
    assert ats[2] == kept[2][2]["recorded_at"]  # no ``at``: the time it was received
