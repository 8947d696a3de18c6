"""A node going down on PostgreSQL takes what lies under it loaded a level
at a time, not node by node: a round trip per node and table made a
node-down of a root with 10,000 children take 20 s as a one-shot submit."""

from __future__ import annotations

from typing import Any

import pytest

from ledger.application import Ledger
from projections.rows import TableSource

DECISION_TABLES = ("nodes", "slots", "allocations", "addresses")
LOADS = ("load_node", "load_slots", "load_alloc", "load_address", "load_live_allocs",
         "load_children")
CHILDREN, GRANDCHILDREN = 30, 3


def tree() -> list[dict[str, Any]]:
    """A root, children under it, grandchildren under each, and a running
    allocation with an address on every node below the root."""
    events: list[dict[str, Any]] = [{"type": "node-registered", "node": "root", "slots": 1}]
    below = []
    for i in range(CHILDREN):
        events.append({"type": "node-registered", "node": f"c{i}", "slots": 1, "parent": "root"})
        below.append(f"c{i}")
        for j in range(GRANDCHILDREN):
            events.append({"type": "node-registered", "node": f"g{i}.{j}", "slots": 2,
                           "parent": f"c{i}"})
            below.append(f"g{i}.{j}")
    events += [{"type": "heartbeat", "node": n} for n in ["root", *below]]
    for k, node in enumerate(below):
        events.append({"type": "alloc-placed", "alloc": f"a-{node}", "node": node, "slot": 0,
                       "addresses": [f"10.1.{k // 250}.{k % 250}"]})
        events.append({"type": "alloc-updated", "alloc": f"a-{node}", "client_status": "running"})
    return events


@pytest.fixture
def one_by_one(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """Every single load from the tables, by what it loaded."""
    loaded: list[tuple[str, str]] = []
    for load in LOADS:
        original = getattr(TableSource, load)

        def counted(source: TableSource, key: str, original: Any = original,
                    load: str = load) -> Any:
            loaded.append((load, key))
            return original(source, key)

        monkeypatch.setattr(TableSource, load, counted)
    return loaded


def test_a_node_down_loads_what_lies_under_it_a_level_at_a_time(
    pg_url: str, tables: Any, replayed: Any, one_by_one: list[tuple[str, str]]
) -> None:
    with Ledger.open(pg_url) as ledger:
        assert {r.status for r in ledger.submit_batch(tree())} == {"appended"}
        ledger.project()
    one_by_one.clear()

    with Ledger.open(pg_url) as cold:  # its caches hold nothing yet
        receipts = cold.submit_batch([
            # changed in memory earlier in the batch: the cascade must see it
            {"type": "alloc-placed", "alloc": "late", "node": "g3.1", "slot": 1},
            {"type": "node-registered", "node": "g3.9", "slots": 1, "parent": "c3"},
            {"type": "heartbeat", "node": "g3.9"},
            {"type": "node-down", "node": "root", "reason": "rack power"},
        ])
    assert [r.status for r in receipts] == ["appended"] * 4
    # Only what the batch names is loaded alone (the preload misses nothing
    # else): the nodes and allocation it names, before the cascade starts.
    assert {key for _, key in one_by_one} <= {"root", "g3.1", "c3", "g3.9", "late"}, one_by_one

    with Ledger.open(pg_url) as follower:
        follower.project()
    assert {key for _, key in one_by_one} <= {"root", "g3.1", "c3", "g3.9", "late"}, one_by_one

    read = tables(pg_url)
    assert read.value("SELECT COUNT(*) FROM nodes WHERE status = 'down'") == (
        2 + CHILDREN * (1 + GRANDCHILDREN))
    assert read.value("SELECT COUNT(*) FROM allocations WHERE client_status = 'lost'") == (
        1 + CHILDREN * (1 + GRANDCHILDREN))
    assert read.value("SELECT reason FROM nodes WHERE node = 'g3.9'") == "parent c3 went down"
    assert read.value("SELECT reason FROM nodes WHERE node = 'g7.2'") == "parent c7 went down"
    assert read.snapshot() == replayed(pg_url)
    assert read.snapshot("state_", DECISION_TABLES) == replayed(pg_url, only=DECISION_TABLES)
