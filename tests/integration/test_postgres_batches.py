"""PostgreSQL writes and loads a batch set-based (one statement per table, one
round trip for the preload), and that changes nothing about what is kept."""

from __future__ import annotations

from typing import Any

import pytest

from ledger import events
from ledger.application import Ledger
from ledger.domain import AlreadyPlaced, Changes, Cluster
from ledger.errors import RuleViolation
from ledger.model import AddressHold, Fact
from ledger.store import open_store
from projections import rows
from projections.rows import Statements, TableSource
from scripts.simulate import generate

WRITTEN = ("nodes", "slots", "allocations", "alloc_states", "addresses", "rejections")
DECIDED = ("nodes", "slots", "allocations", "addresses")  # the tables writers decide against


def simulated_changes(count: int, every: int) -> list[Changes]:
    """A simulated history decided in memory, its changes taken every few events."""
    cluster = Cluster()
    taken = []
    for position, data in enumerate(generate(count, nodes=12, slots=2, seed=5), 1):
        event = events.received(data)
        fact = Fact(position, event["at"])
        try:
            cluster.apply(event, fact)
        except AlreadyPlaced:
            pass
        except RuleViolation as violation:
            cluster.reject(event, str(violation), fact)
        if position % every == 0:
            taken.append(cluster.take_changes())
    taken.append(cluster.take_changes())
    return taken


def test_set_based_writes_keep_what_row_by_row_writes_keep(pg_url, tables):
    """The same changes, written row by row into the public tables and set-based
    into the state_ copies, leave the same rows: upserts over earlier batches,
    NULL columns, releases, alloc states and rejections."""
    batches = simulated_changes(3000, every=250)
    taken = batches[-2]
    hold = taken.held[0] if taken.held else AddressHold("10.9.9.9", "a-x", "n-x", "held", 1)
    batches.append(Changes(held=[hold]))
    batches.append(Changes(  # one batch frees an address and another allocation takes it
        released=[hold.address],
        held=[AddressHold(hold.address, "a-next", hold.node, "held", 9999)],
    ))
    store = open_store(pg_url)
    try:
        with store.projecting() as cursor:
            for changes in batches:
                rows.write_changes(cursor, Statements(store.param), changes)
                store.write_rows(
                    cursor, Statements(store.param, "state_"), rows.changed_rows(changes))
    finally:
        store.close()
    by_row = tables(pg_url).snapshot(only=WRITTEN)
    set_based = tables(pg_url).snapshot("state_", only=WRITTEN)
    assert set_based == by_row
    assert all(by_row[table] for table in WRITTEN), {t: len(r) for t, r in by_row.items()}
    assert (hold.address, "a-next", hold.node, "held", 9999) in by_row["addresses"]


def counting_loads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """Every entity the domain loads one by one (through ``TableSource``)."""
    loads: list[tuple[str, str]] = []
    for name in ("load_node", "load_slots", "load_alloc", "load_address",
                 "load_live_allocs", "load_children"):
        original = getattr(TableSource, name)

        def load(self: TableSource, key: str, _original: Any = original, _name: str = name) -> Any:
            loads.append((_name, key))
            return _original(self, key)

        monkeypatch.setattr(TableSource, name, load)
    return loads


# A host with a working copy under it; a1 placed with two addresses, a2
# running with one.
HOST_AND_COPY = [
    {"type": "node-registered", "node": "host", "slots": 2},
    {"type": "node-registered", "node": "wc", "slots": 1, "parent": "host"},
    {"type": "heartbeat", "node": "host"},
    {"type": "heartbeat", "node": "wc"},
    {"type": "alloc-placed", "alloc": "a1", "node": "host", "slot": 0,
     "addresses": ["10.0.0.1", "10.0.0.2"]},
    {"type": "alloc-placed", "alloc": "a2", "node": "host", "slot": 1,
     "addresses": ["10.0.0.3"]},
    {"type": "alloc-updated", "alloc": "a2", "client_status": "running"},
]


def test_a_writer_that_forgot_its_cache_loads_a_batch_in_one_round_trip(pg_url, monkeypatch):
    loads = counting_loads(monkeypatch)
    with Ledger.open(pg_url) as ledger:
        setup = ledger.submit_batch(HOST_AND_COPY)
        assert [r.status for r in setup] == ["appended"] * 7, setup
        ledger.cluster.forget()  # as when another writer has moved the head
        loads.clear()
        receipts = ledger.submit_batch([
            {"type": "alloc-updated", "alloc": "a1", "client_status": "failed"},
            {"type": "alloc-placed", "alloc": "a3", "node": "wc", "slot": 0,
             "addresses": ["10.0.0.1"]},
            {"type": "alloc-remove-requested", "alloc": "a2"},
            {"type": "alloc-updated", "alloc": "a2", "client_status": "complete"},
            {"type": "heartbeat", "node": "wc"},
            {"type": "heartbeat-missed", "node": "host"},
            {"type": "node-down", "node": "host", "reason": "gone"},
        ])
    assert [r.status for r in receipts] == ["appended"] * 7, receipts
    assert loads == []


def test_a_cold_writer_loads_what_a_batch_names_only_by_the_way_in_one_round_trip(
    pg_url, monkeypatch
):
    """The node of an allocation a batch names, a node named only as a
    parent, and an address a placement names come in the one round trip,
    not loaded one by one later."""
    loads = counting_loads(monkeypatch)
    with Ledger.open(pg_url) as ledger:
        setup = ledger.submit_batch([
            {"type": "node-registered", "node": "host", "slots": 1},
            {"type": "node-registered", "node": "spare", "slots": 1},
            {"type": "heartbeat", "node": "host"},
            {"type": "heartbeat", "node": "spare"},
            {"type": "alloc-placed", "alloc": "a1", "node": "host", "slot": 0},
        ])
        assert [r.status for r in setup] == ["appended"] * 5, setup
        for batch in (
            [{"type": "alloc-updated", "alloc": "a1", "client_status": "running"}],
            [{"type": "node-registered", "node": "child", "parent": "spare"}],
            [{"type": "alloc-placed", "alloc": "a2", "node": "spare", "slot": 0,
              "addresses": ["10.9.9.9"]}],
        ):
            ledger.cluster.forget()  # as when another writer has moved the head
            loads.clear()
            receipts = ledger.submit_batch(batch)
            assert [r.status for r in receipts] == ["appended"], (batch, receipts)
            assert loads == [], batch


def test_a_cold_writer_decides_a_cascade_as_a_warm_one_would(pg_url, tables, replayed):
    """A writer whose caches are empty decides from what the preload brings:
    the down node's children (not named in the batch), its live allocations,
    and the addresses an allocation holds (named only in its row), so what it
    decides and writes is what a replay of the log holds."""
    with Ledger.open(pg_url) as ledger:
        setup = ledger.submit_batch([
            *HOST_AND_COPY,
            {"type": "alloc-placed", "alloc": "w1", "node": "wc", "slot": 0},
            {"type": "alloc-updated", "alloc": "w1", "client_status": "running"},
        ])
        assert [r.status for r in setup] == ["appended"] * 9, setup
    with Ledger.open(pg_url) as cold:
        receipts = cold.submit_batch([
            {"type": "alloc-updated", "alloc": "a1", "client_status": "complete"},
            {"type": "node-down", "node": "host", "reason": "gone"},
        ])
    assert [r.status for r in receipts] == ["appended"] * 2, receipts

    decided = tables(pg_url).snapshot("state_", DECIDED)
    assert decided == replayed(pg_url, only=DECIDED)
    by_alloc = {row[0]: row for row in decided["allocations"]}
    assert {a: by_alloc[a][5] for a in ("a1", "a2", "w1")} == {
        "a1": "complete", "a2": "lost", "w1": "lost"}
    assert decided["addresses"] == []
    assert {row[0]: row[1] for row in decided["nodes"]} == {"host": "down", "wc": "down"}
