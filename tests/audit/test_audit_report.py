"""The audit report, told as a story: a rejected race, a node that went away
and came back, a zombie slot, an address held past its remove request, a
suspect host that took its working copy down with it."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from audit_support import StoreUnderTest, history, texts
from click.testing import CliRunner

from commands.cli import cli
from ledger.application import Ledger
from ledger.store import open_store
from projections.audit import audit

START = datetime(2026, 1, 1, tzinfo=UTC)


def at(seconds: float) -> str:
    return (START + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


STORY: list[tuple[float, dict[str, Any]]] = [
    (0, {"type": "node-registered", "node": "n1", "slots": 2}),  # 1
    (1, {"type": "heartbeat", "node": "n1"}),  # 2
    (2, {"type": "node-registered", "node": "n2", "slots": 1}),  # 3
    (3, {"type": "heartbeat", "node": "n2"}),  # 4
    (10, {"type": "alloc-placed", "alloc": "a1", "node": "n1", "slot": 0,
          "addresses": ["10.0.0.5"], "max_disconnect": 300}),  # 5
    (11, {"type": "alloc-updated", "alloc": "a1", "client_status": "running"}),  # 6
    (12, {"type": "alloc-placed", "alloc": "a2", "node": "n1", "slot": 0}),  # 7 rejected
    (100, {"type": "heartbeat-missed", "node": "n1"}),  # 8 a1 unknown
    (160, {"type": "heartbeat", "node": "n1"}),  # 9
    (170, {"type": "alloc-updated", "alloc": "a1", "client_status": "running"}),  # 10
    (180, {"type": "heartbeat", "node": "n1",
           "slots": [{"slot": 0, "alloc": "a1"}, {"slot": 1, "alloc": "ghost"}]}),  # 11
    (200, {"type": "heartbeat", "node": "n1", "slots": [{"slot": 0, "alloc": "a1"}]}),  # 12
    (210, {"type": "alloc-remove-requested", "alloc": "a1"}),  # 13
    (215, {"type": "alloc-placed", "alloc": "t2", "node": "n2",
           "addresses": ["10.0.0.5"]}),  # 14 rejected
    (250, {"type": "alloc-updated", "alloc": "a1", "client_status": "complete"}),  # 15
    (260, {"type": "node-suspected", "node": "n2", "reason": "disk errors"}),  # 16
    (265, {"type": "node-registered", "node": "n3", "parent": "n2"}),  # 17
    (266, {"type": "heartbeat", "node": "n3"}),  # 18
    (270, {"type": "alloc-placed", "alloc": "a3", "node": "n3"}),  # 19
    (300, {"type": "health-checked", "node": "n2", "passed": False}),  # 20
]


@pytest.fixture
def story(under_test: StoreUnderTest) -> StoreUnderTest:
    with Ledger.open(under_test.url) as ledger:
        for seconds, event in STORY:
            receipt = ledger.submit(json.dumps(event | {"at": at(seconds)}))
            assert receipt.status in ("appended", "rejected"), (event, receipt)
    return under_test


def audited(target: StoreUnderTest, *args: str) -> dict[str, Any]:
    result = CliRunner().invoke(cli, ["--store", target.url, "audit", "--format", "json", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def test_the_audit_tells_everything_unusual_in_the_story(story: StoreUnderTest) -> None:
    report = audited(story)

    assert (report["from"], report["to"], report["events"]) == (1, 20, 20)
    assert [(r["position"], r["type"], r["entity"]) for r in report["rejections"]] == [
        (7, "alloc-placed", "a2"), (14, "alloc-placed", "t2")]
    assert "slot n1#0 is already held by allocation a1" in report["rejections"][0]["reason"]
    assert "still held by allocation a1" in report["rejections"][1]["reason"]

    assert report["reconnects"] == [{
        "alloc": "a1", "node": "n1", "unknown_position": 8, "unknown_at": at(100),
        "resolved_position": 10, "resolved_at": at(170), "outcome": "running",
        "seconds": 70.0, "max_disconnect": 300, "past_deadline": False, "ongoing": False,
    }]
    assert report["zombie_slots"] == [
        {"node": "n1", "slot": 1, "alloc": "ghost", "reason": "unknown-alloc",
         "appeared_position": 11, "appeared_at": at(180), "cleared_position": 12,
         "cleared_at": at(200), "seconds": 20.0, "ongoing": False},
        {"node": "n1", "slot": 0, "alloc": "a1", "reason": "released",
         "appeared_position": 15, "appeared_at": at(250), "cleared_position": None,
         "cleared_at": None, "seconds": 50.0, "ongoing": True},
    ]
    assert report["releasing_addresses"] == [{
        "address": "10.0.0.5", "alloc": "a1", "node": "n1", "requested": "remove",
        "requested_position": 13, "requested_at": at(210), "released_position": 15,
        "released_at": at(250), "outcome": "complete", "seconds": 40.0, "ongoing": False,
    }]
    assert report["suspects"] == [{
        "node": "n2", "reason": "disk errors", "suspect_position": 16, "suspect_at": at(260),
        "cleared_position": None, "cleared_at": None, "seconds": 40.0, "ongoing": True,
    }]
    assert report["downs"] == [{
        "position": 20, "at": at(300), "node": "n2", "status": "down",
        "reason": "health check failed", "cascade": ["n3"], "lost_allocs": ["a3"],
    }]


def test_a_zombie_slot_is_cleared_when_its_node_is_removed(story: StoreUnderTest) -> None:
    with Ledger.open(story.url) as ledger:
        assert ledger.submit(json.dumps(
            {"type": "node-removed", "node": "n1", "at": at(320)})).position == 21

    report = audited(story)

    assert [(z["alloc"], z["cleared_position"], z["seconds"], z["ongoing"])
            for z in report["zombie_slots"]] == [("ghost", 12, 20.0, False),
                                                 ("a1", 21, 70.0, False)]
    assert story.sql("SELECT * FROM zombie_slots") == []


def test_a_range_keeps_what_happened_or_was_still_going_in_it(story: StoreUnderTest) -> None:
    report = audited(story, "--from", "12", "--to", "14")

    assert (report["from"], report["to"], report["events"], report["head"]) == (12, 14, 3, 20)
    assert [r["position"] for r in report["rejections"]] == [14]
    assert report["reconnects"] == []  # over by position 10
    assert [(z["alloc"], z["cleared_position"]) for z in report["zombie_slots"]] == [("ghost", 12)]
    assert [(h["address"], h["ongoing"], h["seconds"]) for h in report["releasing_addresses"]] == [
        ("10.0.0.5", True, 5.0)]
    assert report["suspects"] == report["downs"] == []


def test_the_readable_report_has_a_table_per_section(story: StoreUnderTest) -> None:
    result = CliRunner().invoke(cli, ["--store", story.url, "audit", "--format", "table"])
    assert result.exit_code == 0, result.output
    text = result.stdout
    for heading in ("rejections (2):", "reconnects (1):", "zombie slots (2):",
                    "releasing addresses (1):", "suspects (1):", "downs (1):"):
        assert heading in text
    assert any(line.split()[:3] == ["a1", "n1", "8"] for line in text.splitlines())


def test_jsonl_gives_one_finding_per_line_with_its_section(story: StoreUnderTest) -> None:
    result = CliRunner().invoke(cli, ["--store", story.url, "audit", "--format", "jsonl"])
    assert result.exit_code == 0, result.output
    sections = [json.loads(line)["section"] for line in result.stdout.splitlines()]
    assert sections == ["rejections", "rejections", "reconnects", "zombie_slots",
                        "zombie_slots", "releasing_addresses", "suspects", "downs"]


@pytest.mark.parametrize("args", [["--from", "15", "--to", "14"], ["--to", "21"], ["--from", "0"]])
def test_a_range_outside_the_log_is_a_usage_error(story: StoreUnderTest, args: list[str]) -> None:
    result = CliRunner().invoke(cli, ["--store", story.url, "audit", *args])
    assert result.exit_code == 2, result.output


def test_what_is_still_going_at_the_head_is_what_the_tables_show(
    under_test: StoreUnderTest,
) -> None:
    with Ledger.open(under_test.url) as ledger:
        list(ledger.submit_many(texts(history(3000, nodes=40, seed=17)), batch=500))
        ledger.project()
    store = open_store(under_test.url)
    try:
        found = audit(store).as_dict()
    finally:
        store.close()

    def going(section: str, *columns: str) -> set[tuple[Any, ...]]:
        return {tuple(row[c] for c in columns) for row in found[section] if row["ongoing"]}

    sql = under_test.sql
    assert going("zombie_slots", "node", "slot", "alloc", "reason") == set(
        sql("SELECT node, slot, alloc, reason FROM zombie_slots"))
    assert going("reconnects", "alloc", "unknown_position") == set(
        sql("SELECT alloc, unknown_since_position FROM needs_reconnect"))
    assert going("releasing_addresses", "address", "alloc") == set(
        sql("SELECT address, alloc FROM addresses WHERE state = 'releasing'"))
    assert going("suspects", "node") == set(sql("SELECT node FROM nodes WHERE health = 'suspect'"))
    assert [r["position"] for r in found["rejections"]] == [
        row[0] for row in sql("SELECT position FROM rejections ORDER BY position")]
    assert found["zombie_slots_count"] > 0 and found["reconnects_count"] > 0


def test_every_audit_command_has_help() -> None:
    for name in ("replay", "verify", "digest", "audit"):
        result = CliRunner().invoke(cli, [name, "--help"])
        assert result.exit_code == 0
        assert "Example" in result.output or "alloc-ledger " + name in result.output
        command = cli.commands[name]
        assert command.help
        assert all(option.help for option in command.params if hasattr(option, "help")
                   and option.name != "help")


def test_a_suspicion_of_a_node_that_is_down_is_told_with_its_own_reason(
    under_test: StoreUnderTest,
) -> None:
    with Ledger.open(under_test.url) as ledger:
        for event in (
            {"type": "node-registered", "node": "n1"},
            {"type": "heartbeat", "node": "n1"},
            {"type": "node-down", "node": "n1", "reason": "instance gone"},
            {"type": "node-suspected", "node": "n1", "reason": "flaky disk"},
        ):
            assert ledger.submit(event).status == "appended"

    report = audited(under_test)

    assert [(s["node"], s["reason"]) for s in report["suspects"]] == [("n1", "flaky disk")]
    assert [(d["node"], d["reason"]) for d in report["downs"]] == [("n1", "instance gone")]


def told(target: StoreUnderTest, timed: list[tuple[float, dict[str, Any]]]) -> None:
    """Events submitted with their ``at`` (seconds after START), each appended."""
    with Ledger.open(target.url) as ledger:
        for seconds, event in timed:
            assert ledger.submit(json.dumps(event | {"at": at(seconds)})).status == "appended"


def expired_as_of(target: StoreUnderTest, position: int) -> list[bool]:
    """What needs-reconnect --as-of says of each deadline."""
    result = CliRunner().invoke(cli, ["--store", target.url, "query", "needs-reconnect",
                                      "--as-of", str(position), "--format", "json"])
    assert result.exit_code == 0, result.output
    return [row["expired"] for row in json.loads(result.stdout)]


# n1 runs a1, which may be disconnected for 60 s (positions 1-4)
A1_RUNNING: list[tuple[float, dict[str, Any]]] = [
    (0, {"type": "node-registered", "node": "n1", "slots": 1}),
    (1, {"type": "heartbeat", "node": "n1"}),
    (2, {"type": "alloc-placed", "alloc": "a1", "node": "n1", "slot": 0, "max_disconnect": 60}),
    (3, {"type": "alloc-updated", "alloc": "a1", "client_status": "running"}),
]


def test_a_reconnect_that_ends_at_its_deadline_is_past_it(under_test: StoreUnderTest) -> None:
    """SPEC §3: expired is deadline <= now; the audit's past_deadline agrees."""
    told(under_test, [*A1_RUNNING, (10, {"type": "heartbeat-missed", "node": "n1"}),
                      (70, {"type": "node-down", "node": "n1"})])

    reconnect = audited(under_test)["reconnects"][0]

    assert (reconnect["outcome"], reconnect["seconds"], reconnect["past_deadline"]) == (
        "lost", 60.0, True)


def test_an_ongoing_reconnect_is_past_its_deadline_where_needs_reconnect_says_expired(
    under_test: StoreUnderTest,
) -> None:
    """docs/audit.md: past_deadline is judged "as needs-reconnect says expired";
    docs/queries.md: needs-reconnect --as-of P judges at the latest `at` up to
    P. A last event carrying an earlier `at` (allowed) must not make the audit
    of the same range call an expired deadline not reached."""
    told(under_test, [
        *A1_RUNNING,
        (0, {"type": "node-registered", "node": "n2", "slots": 1}),  # 5
        (10, {"type": "heartbeat-missed", "node": "n1"}),  # 6: a1 unknown, deadline 70
        (1800, {"type": "heartbeat", "node": "n2"}),  # 7
        (15, {"type": "heartbeat", "node": "n2"}),  # 8: a late report
    ])

    assert expired_as_of(under_test, 8) == [True]
    reconnect = audited(under_test)["reconnects"][0]
    assert (reconnect["ongoing"], reconnect["past_deadline"]) == (True, True), reconnect


def test_a_reconnect_that_ends_a_fraction_of_a_millisecond_before_its_deadline_is_not_past_it(
    under_test: StoreUnderTest,
) -> None:
    """SPEC §3: expired is deadline <= now, and docs/audit.md says past_deadline
    is judged as needs-reconnect says expired. Unknown at 10.5 s with
    max_disconnect 60: the deadline is 70.5 s; a heartbeat at 70.4996 s came
    before it. past_deadline was once `seconds >= max_disconnect`, with
    seconds rounded to the millisecond (59.9996 -> 60.0), so the audit called
    past its deadline what needs-reconnect --as-of called not expired."""
    told(under_test, [*A1_RUNNING, (10.5, {"type": "heartbeat-missed", "node": "n1"}),  # 5
                      (70.4996, {"type": "heartbeat", "node": "n1"})])  # 6: before the deadline

    assert expired_as_of(under_test, 6) == [False]
    reconnect = audited(under_test)["reconnects"][0]
    assert (reconnect["ongoing"], reconnect["past_deadline"]) == (True, False), reconnect
