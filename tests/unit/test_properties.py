"""Properties over any stream of events, valid or not.

- the application never raises, whatever it is fed;
- a rejected or invalid event changes no projection row;
- the projection tables equal a projection rebuilt from scratch by replaying the log;
- ``--as-of P`` equals a store that received only the first P kept events.
"""

from __future__ import annotations

import sqlite3
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledger.application import Ledger
from projections import tables
from projections.asof import AsOf, materialize, rebuild, state_at

NODES = ["n1", "n2", "n3"]
ALLOCS = ["a1", "a2", "a3", "a4"]
ADDRESSES = ["10.0.0.1", "10.0.0.2"]

node = st.sampled_from(NODES)
alloc = st.sampled_from(ALLOCS)
slot = st.integers(min_value=0, max_value=2)


def event(kind: str, **fields: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({"type": st.just(kind), **fields})


report = st.lists(
    st.fixed_dictionaries({"slot": slot, "alloc": st.one_of(st.none(), alloc, st.just("ghost"))}),
    max_size=3,
)
EVENTS = st.one_of(
    event("node-registered", node=node, slots=st.integers(0, 2)),
    event("node-registered", node=node, slots=st.integers(0, 2), parent=node),
    event("heartbeat", node=node),
    event("heartbeat", node=node, slots=report),
    event("heartbeat-missed", node=node),
    event("node-down", node=node),
    event("node-removed", node=node),
    event("node-suspected", node=node, reason=st.just("flaky disk")),
    event("health-checked", node=node, passed=st.booleans()),
    event("alloc-placed", alloc=alloc, node=node),
    event("alloc-placed", alloc=alloc, node=node, slot=slot,
          addresses=st.lists(st.sampled_from(ADDRESSES), max_size=1),
          max_disconnect=st.sampled_from([0, 60])),
    event("alloc-updated", alloc=alloc,
          client_status=st.sampled_from(["pending", "running", "complete", "failed"]),
          blame=st.sampled_from(["node", "alloc"])),
    event("alloc-stop-requested", alloc=alloc),
    event("alloc-remove-requested", alloc=alloc),
    event("alloc-removed", alloc=alloc),
    # malformed: unknown type, unknown field, wrong type
    st.just({"type": "node-exploded", "node": "n1"}),
    st.just({"type": "heartbeat", "node": "n1", "colour": "red"}),
    st.just({"type": "node-registered", "node": "n1", "slots": "two"}),
)

PROJECTED = ("nodes", "slots", "allocations", "alloc_states", "addresses", "rejections")


def rows(connection: sqlite3.Connection) -> dict[str, list[tuple[Any, ...]]]:
    return {t: sorted(connection.execute(f"SELECT * FROM {t}").fetchall()) for t in PROJECTED}


def live_rows(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    connection = sqlite3.connect(path)
    try:
        return rows(connection)
    finally:
        connection.close()


def timed(stream: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Give every event its own ``at``, so two stores fed the same events agree."""
    return [dict(item, at=f"2026-01-01T00:{i // 60:02d}:{i % 60:02d}Z") for i, item in enumerate(stream)]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(EVENTS, max_size=40), st.integers(1, 5))
def test_any_stream_never_raises_and_projections_equal_a_replay(stream, batch):
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "l.db"
        with Ledger.open(f"sqlite:///{path}") as ledger:
            receipts = list(ledger.submit_many(stream, batch=batch))
            assert len(receipts) == len(stream)
            kept = [r.position for r in receipts if r.status in ("appended", "rejected")]
            assert kept == list(range(1, len(kept) + 1)), "positions are gapless from 1"
            rebuilt, position = state_at(ledger.store, AsOf())
            assert position == len(kept)
            assert rows(rebuilt) == live_rows(path)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(EVENTS, max_size=30))
def test_rejected_and_invalid_events_change_no_projection(stream):
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "l.db"
        with Ledger.open(f"sqlite:///{path}") as ledger:
            for item in stream:
                before = live_rows(path)
                receipt = ledger.submit(item)
                after = live_rows(path)
                if receipt.status == "invalid":
                    assert receipt.position is None
                    assert after == before
                elif receipt.status == "rejected":
                    assert after["rejections"][:-1] == before["rejections"]
                    assert after["rejections"][-1][0] == receipt.position
                    assert {t: r for t, r in after.items() if t != "rejections"} == {
                        t: r for t, r in before.items() if t != "rejections"
                    }


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(EVENTS, min_size=1, max_size=30), st.data())
def test_as_of_p_equals_a_store_that_received_only_the_first_p_events(stream, data):
    stream = timed(stream)
    with tempfile.TemporaryDirectory() as directory:
        whole = Path(directory) / "whole.db"
        with Ledger.open(f"sqlite:///{whole}") as ledger:
            receipts = list(ledger.submit_many(stream, batch=4))
            head = max([r.position or 0 for r in receipts if r.status != "duplicate"] + [0])
            p = data.draw(st.integers(0, head))
            as_of, position = state_at(ledger.store, AsOf(position=p))
            assert position == p
            # The kept events are exactly what a store fed the same prefix would keep.
            prefix = [
                item for item, r in zip(stream, receipts, strict=True)
                if r.status in ("appended", "rejected") and (r.position or 0) <= p
            ]
        part = Path(directory) / "part.db"
        with Ledger.open(f"sqlite:///{part}") as ledger:
            list(ledger.submit_many(prefix, batch=4))
        assert rows(as_of) == live_rows(part)


def test_the_scratch_tables_have_the_documented_names():
    connection = sqlite3.connect(":memory:")
    tables.create(connection.cursor(), "sqlite")
    names = {r[0] for r in connection.execute("SELECT name FROM sqlite_master")}
    assert set(tables.TABLES) | set(tables.VIEWS) <= names


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(EVENTS, min_size=1, max_size=40), st.data())
def test_as_of_from_a_checkpoint_equals_as_of_from_scratch(stream, data):
    stream = timed(stream)
    with (
        tempfile.TemporaryDirectory() as directory,
        Ledger.open(f"sqlite:///{Path(directory) / 'l.db'}") as ledger,
    ):
        list(ledger.submit_many(stream, batch=5))
        every = data.draw(st.integers(1, 7))
        for point in (AsOf(position=data.draw(st.integers(0, 40))),
                      AsOf(at=f"2026-01-01T00:00:{data.draw(st.integers(0, 45)):02d}.000000Z")):
            first, p1 = rebuild(ledger.store, point, every=every)  # keeps checkpoints
            again, p2 = rebuild(ledger.store, point, every=every)  # starts from one
            scratch, p3 = rebuild(ledger.store, point, every=0)
            assert p1 == p2 == p3
            assert rows(materialize(again)) == rows(materialize(scratch))
            assert rows(materialize(first)) == rows(materialize(scratch))


def test_a_writer_that_forgets_its_cache_decides_alike(tmp_path, monkeypatch):
    from ledger import application
    from scripts.simulate import generate

    stream = list(generate(3000, nodes=40, slots=2, seed=3))
    with Ledger.open(f"sqlite:///{tmp_path / 'remembers.db'}") as ledger:
        remembered = [r.as_dict() for r in ledger.submit_many(stream, batch=100)]
    monkeypatch.setattr(application, "CACHE_LIMIT", 10)
    with Ledger.open(f"sqlite:///{tmp_path / 'forgets.db'}") as ledger:
        forgotten = [r.as_dict() for r in ledger.submit_many(stream, batch=100)]
    assert forgotten == remembered
    assert live_rows(tmp_path / "forgets.db") == live_rows(tmp_path / "remembers.db")
