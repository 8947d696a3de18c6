"""``replay --repair``: projection tables edited, emptied, dropped or left
behind by hand are made again from the log, and the ledger goes on as if
nothing had happened; the log is never written."""

from __future__ import annotations

import json
from typing import Any

import pytest
from audit_support import StoreUnderTest, one_line_error, run
from test_replay import live_tables, replayed, scratch_tables, told

from ledger.application import Ledger

EVENTS = 900


def repaired(target: StoreUnderTest) -> tuple[dict[str, Any], str]:
    done = run("replay", "--repair", "--format", "json", url=target.url)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), done.stderr.decode()


def log_rows(target: StoreUnderTest) -> list[tuple[Any, ...]]:
    return target.sql("SELECT originator_version, state FROM stored_events ORDER BY 1")


def test_repair_makes_edited_tables_equal_to_the_replay_and_says_what_it_repaired(
    under_test: StoreUnderTest,
) -> None:
    told(under_test, EVENTS)
    untouched, log = live_tables(under_test), log_rows(under_test)
    sql = under_test.sql
    (gone,) = sql("SELECT node FROM nodes ORDER BY node LIMIT 1")[0]
    sql("UPDATE nodes SET status = 'down' WHERE node = (SELECT MAX(node) FROM nodes)")
    sql("DELETE FROM nodes WHERE node = ?", (gone,))
    sql("DELETE FROM alloc_states")
    sql("INSERT INTO addresses (address, alloc, node, state, since_position) "
        "VALUES ('203.0.113.9', 'a-ghost', 'n-ghost', 'held', 3)")

    report, said = repaired(under_test)

    assert (report["ok"], report["repaired"]) == (False, EVENTS)
    tables = {d["table"] for d in report["differences"]}
    assert {"nodes", "alloc_states", "addresses"} <= tables
    assert report["compared_with"].startswith(f"the live tables at position {EVENTS}")
    assert said == (
        f"repaired: {len(report['differences'])} differences with {report['compared_with']}; "
        f"the live tables now hold the replay of the log up to position {EVENTS}\n")
    assert live_tables(under_test) == untouched
    assert log_rows(under_test) == log
    assert scratch_tables(under_test) == []
    code, again, _ = replayed(under_test)
    assert (code, again["differences"]) == (0, [])


def test_repair_of_tables_that_match_changes_nothing(under_test: StoreUnderTest) -> None:
    told(under_test, 300)
    before = live_tables(under_test)

    report, said = repaired(under_test)

    assert (report["ok"], report["repaired"], report["differences"], said) == (True, None, [], "")
    assert live_tables(under_test) == before


def test_repair_makes_a_dropped_table_and_view_again_and_fills_them(
    under_test: StoreUnderTest,
) -> None:
    told(under_test, EVENTS)
    untouched = live_tables(under_test)
    cascade = "" if under_test.dialect == "sqlite" else " CASCADE"
    under_test.sql(f"DROP TABLE allocations{cascade}")  # the views read it
    under_test.sql("DROP VIEW IF EXISTS zombie_slots")
    broken = run("replay", url=under_test.url)
    assert broken.returncode == 3
    missing = ('relation "allocations" does not exist' if under_test.dialect == "postgresql"
               else "no such table: allocations")
    assert one_line_error(broken.stderr).endswith(
        f"{missing} (a projection table dropped by hand? alloc-ledger replay --repair makes "
        "it again from the log)")

    report, _ = repaired(under_test)

    assert report["repaired"] == EVENTS
    assert {d["table"] for d in report["differences"]} >= {"allocations", "needs_reconnect"}
    assert live_tables(under_test) == untouched
    for question in ("zombie-slots", "needs-reconnect", "allocs"):
        assert run("query", question, url=under_test.url).returncode == 0


def test_repair_leaves_a_column_a_dba_added_alone_and_replay_does_not_compare_it(
    under_test: StoreUnderTest,
) -> None:
    told(under_test, 300)
    under_test.sql("ALTER TABLE nodes ADD COLUMN rack TEXT")
    under_test.sql("UPDATE nodes SET rack = 'r1', health = 'suspect'")

    code, report, _ = replayed(under_test)
    assert code == 1
    assert {(d["table"], d["column"]) for d in report["differences"]} == {("nodes", "health")}

    repaired(under_test)

    code, report, _ = replayed(under_test)
    assert (code, report["differences"]) == (0, [])
    assert {row[0] for row in under_test.sql("SELECT rack FROM nodes")} == {None}


def test_repair_after_a_lowered_tracking_row_and_the_ledger_goes_on(
    under_test: StoreUnderTest,
) -> None:
    """Tables ahead of their tracking position refuse to catch up
    (``TablesDisagree``); the repair brings both to the head, and the next
    submit decides against them as usual."""
    told(under_test, EVENTS)
    under_test.sql("UPDATE tracking SET notification_id = 500")
    stuck = run("project", url=under_test.url)
    assert stuck.returncode == 1, stuck.stderr
    assert "their tracking position 500" in one_line_error(stuck.stderr)

    report, _ = repaired(under_test)

    assert report["repaired"] == EVENTS
    assert under_test.sql("SELECT MAX(notification_id) FROM tracking")[0][0] == EVENTS
    with Ledger.open(under_test.url) as ledger:
        placed = ledger.submit({"type": "node-registered", "node": "n-new", "slots": 1})
        assert ledger.submit({"type": "heartbeat", "node": "n-new"}).status == "appended"
        ledger.project()
    assert placed.position == EVENTS + 1
    nodes = json.loads(run("query", "nodes", "--format", "json", url=under_test.url).stdout)
    assert next(n for n in nodes if n["node"] == "n-new")["status"] == "ready"
    code, again, _ = replayed(under_test)
    assert (code, again["differences"]) == (0, [])


@pytest.mark.postgres
def test_on_postgresql_repair_mends_the_decision_tables_too(
    pg_under_test: StoreUnderTest,
) -> None:
    told(pg_under_test, 600)
    before = pg_under_test.sql("SELECT * FROM state_allocations ORDER BY alloc")
    pg_under_test.sql("UPDATE state_allocations SET job = 'forged'")
    pg_under_test.sql("DELETE FROM state_nodes")

    report, _ = repaired(pg_under_test)

    named = {d["table"] for d in report["differences"]}  # the views over them too
    assert {"state_allocations", "state_nodes"} <= named
    assert all(table.startswith("state_") for table in named)
    assert pg_under_test.sql("SELECT * FROM state_allocations ORDER BY alloc") == before
    code, again, _ = replayed(pg_under_test)
    assert (code, again["differences"]) == (0, [])


def test_repair_with_to_is_a_usage_error(sqlite_under_test: StoreUnderTest) -> None:
    told(sqlite_under_test, 50)
    done = run("replay", "--repair", "--to", "10", url=sqlite_under_test.url)
    assert done.returncode == 2
    assert "--repair replaces the live tables" in one_line_error(done.stderr)
