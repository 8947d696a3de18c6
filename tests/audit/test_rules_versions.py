"""Kept events are applied again under the rules that decided them.

A log kept by an earlier version (rules 1, which recorded no version)
replays to the tables that version kept, while new events follow today's
rules; and a kept event that its own rules refuse on replay is named, with
its position, as decided against tables that did not match the log.
"""

from __future__ import annotations

import json
import re
from typing import Any

from audit_support import StoreUnderTest, one_line_error, run

from ledger.application import Ledger
from ledger.model import RULES
from projections import tables

RULES_1 = [  # where rules 1 and 2 part: a node back under a parent that is down
    {"type": "node-registered", "node": "host", "slots": 1},
    {"type": "heartbeat", "node": "host"},
    {"type": "node-registered", "node": "wc1", "slots": 1, "parent": "host"},
    {"type": "heartbeat", "node": "wc1"},
    {"type": "alloc-placed", "alloc": "a1", "node": "wc1", "slot": 0, "max_disconnect": 300},
    {"type": "alloc-updated", "alloc": "a1", "client_status": "running"},
    {"type": "heartbeat-missed", "node": "wc1"},
    {"type": "heartbeat", "node": "wc1"},
    {"type": "alloc-updated", "alloc": "a1", "client_status": "running"},  # reconnects
    {"type": "node-down", "node": "host"},
    {"type": "heartbeat", "node": "wc1"},  # rules 1: ready again, under a host that is down
    {"type": "alloc-placed", "alloc": "a2", "node": "wc1", "slot": 0},
]
TODAY = [
    {"type": "node-down", "node": "wc1"},
    {"type": "heartbeat", "node": "wc1"},  # today: stays down while host is
    {"type": "alloc-placed", "alloc": "a3", "node": "wc1", "slot": 0},
]


def kept(target: StoreUnderTest, events: list[dict[str, Any]], rules: int) -> list[str]:
    with Ledger.open(target.url) as ledger:
        ledger.rules = rules
        statuses = [ledger.submit(event).status for event in events]
        ledger.project()
    return statuses


def one(target: StoreUnderTest, query: str, *args: str) -> Any:
    done = run("query", query, *args, "--format", "json", url=target.url)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_log_kept_under_rules_1_replays_to_its_tables_and_new_events_follow_today(
    under_test: StoreUnderTest,
) -> None:
    assert kept(under_test, RULES_1, rules=1) == ["appended"] * len(RULES_1)
    a1 = one(under_test, "alloc", "a1")
    assert (a1["client_status"], a1["unknown_since_position"]) == ("lost", 7)  # as rules 1 kept it

    assert kept(under_test, TODAY, rules=RULES) == ["appended", "appended", "rejected"]

    replayed = run("replay", "--format", "json", url=under_test.url)
    assert replayed.returncode == 0, replayed.stderr
    assert json.loads(replayed.stdout)["differences"] == []
    assert run("verify", url=under_test.url).returncode == 0
    wc1_then = next(n for n in one(under_test, "nodes", "--as-of", "12") if n["node"] == "wc1")
    wc1_now = next(n for n in one(under_test, "nodes") if n["node"] == "wc1")
    assert (wc1_then["status"], wc1_now["status"]) == ("ready", "down")
    states = [json.loads(bytes(row[0])) for row in under_test.sql(
        "SELECT state FROM stored_events ORDER BY originator_version")]
    assert ["rules" in state for state in states] == [False] * len(RULES_1) + [True] * len(TODAY)
    assert {state["rules"] for state in states[len(RULES_1):]} == {RULES}


def test_a_kept_event_its_rules_refuse_on_replay_is_named_with_its_position(
    sqlite_under_test: StoreUnderTest,
) -> None:
    target = sqlite_under_test
    for event in ({"type": "node-registered", "node": "n1", "slots": 1},
                  {"type": "heartbeat", "node": "n1"},
                  {"type": "node-down", "node": "n1"}):
        assert run("submit", "-", url=target.url, stdin=json.dumps(event).encode()).returncode == 0
    target.sql("UPDATE nodes SET status = 'ready' WHERE node = 'n1'")  # SQLite decides from these
    placed = run("submit", "alloc-placed", "--alloc", "a1", "--node", "n1", url=target.url)
    assert placed.returncode == 0, placed.stderr  # decided against the edited table

    assert run("verify", url=target.url).returncode == 0  # the log itself is as kept
    for command in (["replay"], ["audit"], ["query", "nodes", "--as-of", "4"]):
        done = run(*command, url=target.url)
        assert done.returncode == 1, (command, done.stderr)
        assert one_line_error(done.stderr) == (
            "Error: the kept event at position 4 was appended, but replaying the log refuses "
            "it (node n1 is not ready (status down); it takes no placements): it was decided "
            "against tables that did not match the log (were they edited?); alloc-ledger "
            "verify checks the log itself"
        ), command


def test_a_kept_event_of_newer_rules_is_refused_by_every_replay(
    sqlite_under_test: StoreUnderTest,
) -> None:
    """A log written by a newer release: this one does not guess its rules."""
    target = sqlite_under_test
    kept(target, RULES_1[:2], rules=RULES + 1)

    for command in (["replay"], ["audit"], ["query", "nodes", "--as-of", "2"]):
        done = run(*command, url=target.url)
        assert done.returncode == 3, (command, done.stderr)  # as a schema a newer release made
        assert one_line_error(done.stderr) == (
            f"Error: the kept event at position 1 was decided by rules {RULES + 1}, newer than "
            f"this alloc-ledger's ({RULES}): upgrade alloc-ledger to apply it"
        ), command


RULES_2 = [  # where rules 2 and 3 part: a node's reason while suspect and down
    {"type": "node-registered", "node": "n1", "slots": 1},
    {"type": "heartbeat", "node": "n1"},
    {"type": "node-suspected", "node": "n1", "reason": "flaky disk"},
    {"type": "node-down", "node": "n1", "reason": "instance gone"},
    {"type": "heartbeat", "node": "n1"},  # rules 2: suspect, for the reason it went down
]


def test_a_log_kept_under_rules_2_keeps_its_reasons_and_new_suspicions_follow_rules_3(
    under_test: StoreUnderTest,
) -> None:
    assert kept(under_test, RULES_2, rules=2) == ["appended"] * len(RULES_2)
    n1 = one(under_test, "suspects")[0]
    assert (n1["health"], n1["reason"]) == ("suspect", "instance gone")  # as rules 2 kept it

    assert kept(under_test, [
        {"type": "node-down", "node": "n1", "reason": "instance gone again"},
        {"type": "heartbeat", "node": "n1"},  # the suspicion was kept under rules 2: no reason for it
        {"type": "node-suspected", "node": "n1", "reason": "bad memory"},
        {"type": "node-down", "node": "n1", "reason": "recycled"},
        {"type": "heartbeat", "node": "n1"},
    ], rules=RULES) == ["appended"] * 5

    n1 = one(under_test, "suspects")[0]
    assert (n1["status"], n1["health"], n1["reason"]) == ("ready", "suspect", "bad memory")
    replayed = run("replay", "--format", "json", url=under_test.url)
    assert replayed.returncode == 0, replayed.stderr
    assert json.loads(replayed.stdout)["differences"] == []
    at_5 = one(under_test, "suspects", "--as-of", "5")[0]
    at_7 = one(under_test, "suspects", "--as-of", "7")[0]
    assert (at_5["reason"], at_7["reason"]) == ("instance gone", "instance gone again")


def made_by_the_last_version(target: StoreUnderTest) -> None:
    """Turn a store back into what the first version made: no
    ``nodes.health_reason``, the old ``zombie_slots`` (which counted removed
    nodes' reports) and ``needs_reconnect`` (without ``expired``), the old
    schema mark; and no ``projection_status`` or ``log_positions``."""
    statements = tables.create_statements(dialect=target.dialect)
    old_zombies = next(s for s in statements if s.startswith("CREATE VIEW zombie_slots "))
    old_zombies = re.sub(r"\n *JOIN nodes n ON [^\n]*", "", old_zombies).replace(
        "a.slot IS NOT NULL AND ", "")
    old_reconnects = next(s for s in statements if s.startswith("CREATE VIEW needs_reconnect "))
    old_reconnects = re.sub(r",\s*CASE .* AS expired", "", old_reconnects, flags=re.DOTALL)
    assert "nodes n" not in old_zombies and "expired" not in old_reconnects
    prefixes = [""] if target.dialect == "sqlite" else ["", "state_"]
    for prefix in prefixes:
        for view, old_view in (("zombie_slots", old_zombies), ("needs_reconnect", old_reconnects)):
            target.sql(f"DROP VIEW {prefix}{view}")
            target.sql(old_view.replace(view, f"{prefix}{view}", 1)
                       .replace(" slots s", f" {prefix}slots s")
                       .replace(" allocations a", f" {prefix}allocations a")
                       .replace("FROM slots", f"FROM {prefix}slots")
                       .replace("FROM allocations", f"FROM {prefix}allocations"))
        target.sql(f"ALTER TABLE {prefix}nodes DROP COLUMN health_reason")
    target.sql("DROP VIEW projection_status")
    target.sql("DROP VIEW log_positions")
    if target.dialect == "sqlite":
        target.sql("PRAGMA user_version = 1")
    else:
        target.sql("COMMENT ON TABLE event_hashes IS 'alloc-ledger schema 3'")
        target.sql("GRANT SELECT ON zombie_slots TO PUBLIC")
        target.sql("GRANT SELECT ON needs_reconnect TO PUBLIC")


def test_a_store_of_the_last_version_is_upgraded_when_opened_and_replays_alike(
    under_test: StoreUnderTest,
) -> None:
    assert kept(under_test, RULES_2 + [
        {"type": "alloc-placed", "alloc": "a1", "node": "n1"},
        {"type": "heartbeat", "node": "n1", "slots": [{"slot": 0, "alloc": "a1"}]},
        {"type": "node-registered", "node": "n2", "slots": 2},
        {"type": "heartbeat", "node": "n2"},
        {"type": "alloc-placed", "alloc": "a2", "node": "n2"},
        {"type": "heartbeat", "node": "n2",
         "slots": [{"slot": 0, "alloc": "a2"}, {"slot": 1, "alloc": "a2"}]},
    ], rules=2)[-6:-4] == ["rejected", "appended"]  # n1 is suspect: a1 is refused
    made_by_the_last_version(under_test)
    zombies = "SELECT node, reason FROM zombie_slots ORDER BY node, slot"
    assert under_test.sql(zombies) == [  # the last version's view, before any open
        ("n1", "unknown-alloc"), ("n2", "moved"), ("n2", "moved")]
    assert "expired" not in under_test.columns("needs_reconnect")

    assert kept(under_test, [
        {"type": "node-registered", "node": "n3"},
        {"type": "heartbeat", "node": "n3"},
        {"type": "node-suspected", "node": "n3", "reason": "flaky disk"},
        {"type": "node-down", "node": "n3", "reason": "instance gone"},
        {"type": "heartbeat", "node": "n3"},
    ], rules=RULES) == ["appended"] * 5

    assert under_test.sql(zombies) == [  # upgraded by the first open
        ("n1", "unknown-alloc"), ("n2", "duplicate"), ("n2", "duplicate")]
    assert [(s["node"], s["reason"]) for s in one(under_test, "suspects")] == [
        ("n1", "instance gone"), ("n3", "flaky disk")]
    replayed = run("replay", "--format", "json", url=under_test.url)
    assert replayed.returncode == 0, replayed.stderr
    assert json.loads(replayed.stdout)["differences"] == []
    assert under_test.columns("needs_reconnect")[-1] == "expired"
    head = under_test.sql("SELECT MAX(originator_version) FROM stored_events")[0][0]
    assert under_test.sql("SELECT head_position, lag FROM projection_status") == [(head, 0)]
    assert under_test.sql(
        "SELECT position, type, rejected FROM log_positions WHERE position IN (3, 6) ORDER BY position"
    ) == [(3, "node-suspected", 0), (6, "alloc-placed", 1)]  # a1 refused: n1 is down
    if under_test.dialect == "sqlite":
        assert under_test.sql("PRAGMA user_version") == [(3,)]
    else:
        assert under_test.sql(
            "SELECT has_table_privilege('public', 'zombie_slots', 'SELECT'), "
            "has_table_privilege('public', 'needs_reconnect', 'SELECT'), "
            "has_table_privilege('public', 'projection_status', 'SELECT'), "
            "has_table_privilege('public', 'log_positions', 'SELECT')"
        ) == [(True, True, True, True)]  # who read the views reads the new ones


LOSSES = [
    {"type": "node-registered", "node": "n1", "slots": 2},
    {"type": "heartbeat", "node": "n1"},
    {"type": "alloc-placed", "alloc": "a1", "node": "n1", "slot": 0, "max_disconnect": 60},
    {"type": "alloc-updated", "alloc": "a1", "client_status": "running"},
    {"type": "alloc-placed", "alloc": "a2", "node": "n1", "slot": 1},
    {"type": "heartbeat-missed", "node": "n1"},  # a2 lost, a1 unknown
    {"type": "node-down", "node": "n1"},  # a1 lost
]


def test_what_a_node_took_with_it_is_what_its_rules_kept(under_test: StoreUnderTest) -> None:
    assert kept(under_test, LOSSES, rules=2) == ["appended"] * len(LOSSES)
    assert one(under_test, "suspects")[0]["lost_allocs"] == ["a1"]  # rules 2: the down's only

    assert kept(under_test, [
        {"type": "heartbeat", "node": "n1"},
        {"type": "alloc-placed", "alloc": "a3", "node": "n1", "slot": 0, "max_disconnect": 60},
        {"type": "alloc-updated", "alloc": "a3", "client_status": "running"},
        {"type": "alloc-placed", "alloc": "a4", "node": "n1", "slot": 1},
        *LOSSES[-2:],
    ], rules=RULES) == ["appended"] * 6

    assert one(under_test, "suspects")[0]["lost_allocs"] == ["a3", "a4"]
    replayed = run("replay", "--format", "json", url=under_test.url)
    assert replayed.returncode == 0, replayed.stderr
    assert json.loads(replayed.stdout)["differences"] == []


def test_events_of_rules_2_after_rules_3_follow_rules_2(under_test: StoreUnderTest) -> None:
    """An earlier release still writing beside this one: its events keep its
    rules, even about what a rules-3 event recorded before them."""
    assert kept(under_test, [
        {"type": "node-registered", "node": "n1"},
        {"type": "heartbeat", "node": "n1"},
        {"type": "node-suspected", "node": "n1", "reason": "flaky disk"},
        {"type": "node-registered", "node": "n2"},
        {"type": "heartbeat", "node": "n2"},
        {"type": "node-suspected", "node": "n2", "reason": "bad memory"},
    ], rules=RULES) == ["appended"] * 6
    assert kept(under_test, [
        {"type": "node-down", "node": "n1", "reason": "instance gone"},
        {"type": "heartbeat", "node": "n1"},  # rules 2: suspect, for the reason it went down
        {"type": "health-checked", "node": "n2", "passed": True},  # rules 2 kept no health_reason
    ], rules=2) == ["appended"] * 3

    n1 = one(under_test, "suspects")[0]
    assert (n1["node"], n1["status"], n1["reason"]) == ("n1", "ready", "instance gone")
    assert under_test.sql("SELECT node, health, health_reason FROM nodes ORDER BY node") == [
        ("n1", "suspect", "flaky disk"), ("n2", "ok", "bad memory")]  # as rules 2 left them
    replayed = run("replay", "--format", "json", url=under_test.url)
    assert replayed.returncode == 0, replayed.stderr
    assert json.loads(replayed.stdout)["differences"] == []

    assert kept(under_test, [
        {"type": "node-suspected", "node": "n2", "reason": "bad cable"},
    ], rules=2) == ["appended"]
    audited = run("audit", "--format", "json", url=under_test.url)
    assert audited.returncode == 0, audited.stderr
    assert [(s["node"], s["reason"]) for s in json.loads(audited.stdout)["suspects"]] == [
        ("n1", "flaky disk"), ("n2", "bad memory"), ("n2", "bad cable")]  # not the stale one


def test_a_ledger_of_this_schema_without_the_log_positions_view_gets_it_when_opened(
    under_test: StoreUnderTest,
) -> None:
    """As the release before left it (the same schema version): the next
    open that may write makes the view, for whoever read the others."""
    assert kept(under_test, RULES_1[:2], rules=RULES) == ["appended", "appended"]
    under_test.sql("DROP VIEW log_positions")
    if under_test.dialect == "postgresql":  # as grant-reporting grants: every view
        under_test.sql("GRANT SELECT ON needs_reconnect, zombie_slots, projection_status "
                       "TO PUBLIC")

    assert run("query", "nodes", url=under_test.url).returncode == 0

    assert under_test.sql("SELECT position, type FROM log_positions ORDER BY position") == [
        (1, "node-registered"), (2, "heartbeat")]
    if under_test.dialect == "postgresql":
        assert under_test.sql("SELECT has_table_privilege('public', 'log_positions', 'SELECT')"
                              ) == [(True,)]


def test_a_table_of_another_application_by_the_log_positions_name_is_left_alone(
    under_test: StoreUnderTest,
) -> None:
    """Put beside an earlier release's ledger: every command still opens it."""
    assert kept(under_test, RULES_1[:2], rules=RULES) == ["appended", "appended"]
    under_test.sql("DROP VIEW log_positions")
    under_test.sql("CREATE TABLE log_positions (shelf TEXT)")

    for command in (["submit", "heartbeat", "--node", "host"], ["query", "nodes"]):
        done = run(*command, url=under_test.url)
        assert done.returncode == 0, (command, done.stderr)
    assert under_test.columns("log_positions") == ["shelf"]
