"""Properties over any stream of events, valid or not (SQLite; the same on
PostgreSQL in ``tests/integration/test_properties_pg.py``).

Streams come from ``model_support.scenarios``: ready nodes (some under a
parent chain), then mostly placements, updates and heartbeats, with slot
reports true and false, ids and retries, ``at`` out of order, shared
addresses and slots, disconnects and reconnects, kills, and invalid input.
For every such stream:

- the application never raises, and answers every event appended,
  duplicate, rejected or invalid, with the position and (for a rejection)
  the rule that ``model_support.Model``, a small model of SPEC section 2
  and the README's choices written apart from ``ledger.domain``, says;
- after every batch (the ledger sometimes opened again, its caches cold) the
  projection tables hold what the model says (node status, health, reason
  and lost_allocs, allocations' client and desired status, who holds each
  slot and address and since when, alloc states, needs-reconnect, zombie
  slots, the rejection log), and a batch that appended nothing changed no
  projection row;
- ``alloc-ledger replay`` finds no difference, ``alloc-ledger verify`` passes;
- ``--as-of P`` holds what the model held after P, and equals a store that
  received only the first P kept events; ``--as-of TIME`` stops where the
  model says; from a checkpoint equals from scratch.

``test_the_streams_reach_every_state_and_every_rejection`` measures, with
fixed seeds and the model alone, that the streams get where they should
(``-s`` prints the counts; ``--hypothesis-show-statistics`` shows what the
examples of the other tests reached).
"""

from __future__ import annotations

import sqlite3
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from model_support import (
    INVALID_KINDS,
    REASONS,
    Model,
    Scenario,
    Step,
    check_as_of,
    check_history,
    label,
    normal_at,
    replay_model,
    require_reached,
    run_checked,
    scenarios,
)

from ledger.application import Ledger
from projections import tables
from projections.asof import AsOf, materialize, rebuild, state_at

PROJECTED = ("nodes", "slots", "allocations", "alloc_states", "addresses", "rejections")
SLOW = [HealthCheck.too_slow, HealthCheck.data_too_large]


def rows(connection: sqlite3.Connection) -> dict[str, list[tuple[Any, ...]]]:
    return {t: sorted(connection.execute(f"SELECT * FROM {t}").fetchall()) for t in PROJECTED}


def live_rows(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    connection = sqlite3.connect(path)
    try:
        return rows(connection)
    finally:
        connection.close()


@settings(max_examples=120, deadline=None, suppress_health_check=SLOW)
@given(scenarios(max_steps=60), st.integers(0, 1000))
def test_every_event_agrees_with_the_model_and_a_replay(scenario: Scenario, moment: int) -> None:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "l.db"

        def finish(ledger: Ledger, model: Model) -> None:
            check_history(ledger, model, moment)
            check_as_of(ledger, scenario, moment % (model.head + 1))
            rebuilt, position, _ = state_at(ledger.store, AsOf())
            assert position == model.head
            assert rows(rebuilt) == live_rows(path)

        model = run_checked(f"sqlite:///{path}", scenario, finish=finish)
    label(model)


def timed(scenario: Scenario) -> list[Any]:
    """The scenario's submissions, every valid one with an ``at`` of its own in
    order, so two stores fed the same events keep the same events."""
    out = []
    for i, step in enumerate(scenario.steps):
        if step.event is None:
            out.append(step.submission)
        else:
            out.append(dict(step.event, at=f"2026-01-01T00:{i // 60:02d}:{i % 60:02d}Z"))
    return out


@settings(max_examples=20, deadline=None, suppress_health_check=SLOW)
@given(scenarios(max_steps=30), st.data())
def test_as_of_p_equals_a_store_that_received_only_the_first_p_events(scenario, data):
    stream = timed(scenario)
    with tempfile.TemporaryDirectory() as directory:
        whole = Path(directory) / "whole.db"
        with Ledger.open(f"sqlite:///{whole}") as ledger:
            receipts = list(ledger.submit_many(stream, batch=4))
            head = max([r.position or 0 for r in receipts if r.status != "duplicate"] + [0])
            p = data.draw(st.integers(0, head))
            as_of, position, _ = state_at(ledger.store, AsOf(position=p))
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


@settings(max_examples=15, deadline=None, suppress_health_check=SLOW)
@given(scenarios(max_steps=40), st.data())
def test_as_of_from_a_checkpoint_equals_as_of_from_scratch(scenario, data):
    stream = timed(scenario)
    with (
        tempfile.TemporaryDirectory() as directory,
        Ledger.open(f"sqlite:///{Path(directory) / 'l.db'}") as ledger,
    ):
        list(ledger.submit_many(stream, batch=5))
        every = data.draw(st.integers(1, 7))
        second = data.draw(st.integers(0, len(stream) + 2))
        for point in (AsOf(position=data.draw(st.integers(0, len(stream)))),
                      AsOf(at=normal_at(f"2026-01-01T00:{second // 60:02d}:{second % 60:02d}Z"))):
            first, p1 = rebuild(ledger.store, point, every=every)  # keeps checkpoints
            again, p2 = rebuild(ledger.store, point, every=every)  # starts from one
            scratch, p3 = rebuild(ledger.store, point, every=0)
            assert p1 == p2 == p3
            assert rows(materialize(again)) == rows(materialize(scratch))
            assert rows(materialize(first)) == rows(materialize(scratch))


# What the streams must reach, each in a fair share of examples: every state
# of SPEC section 1, both sides of a disconnect, every zombie reason, every
# rejection and kind of invalid input.
MUST_REACH = (
    "alloc running", "alloc unknown", "alloc lost", "alloc complete", "alloc failed",
    "alloc removed", "reconnected", "node initializing, allocations to reconnect",
    "node disconnected", "node down", "node removed", "node suspect", "down node back",
    "cascade", "heartbeat of a node whose parent is gone", "lost at a disconnect",
    "still unknown at a second disconnect", "address releasing", "two addresses held",
    "zombie released", "zombie moved", "zombie unknown-alloc", "zombie duplicate",
    "duplicate:id", "duplicate:id of a rejection", "invalid:id used again", "duplicate:placement", "at out of order", "suspect by a failed allocation",
    *(f"rejected:{kind}" for kind in REASONS),
    *(f"invalid:{kind}" for kind in INVALID_KINDS),
)


def test_the_streams_reach_every_state_and_every_rejection(capsys: Any) -> None:
    """With fixed seeds, count the examples that reach each state (the model
    alone decides, so this is quick), print the counts and require each.
    Several seeds, as Hypothesis draws most examples of a run from a few."""
    seen: Counter[str] = Counter()
    seeds, each = range(5), 25

    def count(scenario: Scenario) -> None:
        model, _ = replay_model(scenario)
        seen.update(set(model.reached))
        seen.update({f"invalid:{s.label}" for s in scenario.steps if s.event is None})

    require_reached(scenarios(), count, seen, MUST_REACH, capsys, "state", seeds=seeds, each=each)


def test_a_retry_is_a_duplicate_of_the_first_answer(tmp_path: Path) -> None:
    """The model's id rule on its own: a retry answers as the first did (a
    rejection's retry is a duplicate carrying it), another event under a kept
    id is invalid; a placement retried without an id is a duplicate of the
    placement."""
    placed = {"type": "alloc-placed", "alloc": "a1", "node": "n1", "slot": 0,
              "addresses": ["10.0.0.1", "10.0.0.2"]}
    steps = [
        {"type": "node-registered", "node": "n1", "slots": 1, "id": "r1"},
        {"type": "heartbeat", "node": "n1"},
        {"type": "heartbeat", "node": "n2", "id": "x"},  # rejected under id x
        {"type": "heartbeat", "node": "n2", "id": "x"},  # its retry: a duplicate of it
        {"type": "node-registered", "node": "n2", "id": "x"},  # x for another event
        dict(placed, id="p"),
        dict(placed, addresses=["10.0.0.2", "10.0.0.1"], id="q"),  # the same placement
        {"type": "heartbeat", "node": "n1", "id": "q"},  # q was not recorded
        {"type": "node-registered", "node": "n1", "slots": 1, "id": "r1"},  # a retry
        {"type": "node-registered", "node": "n1", "slots": 5, "id": "r1"},  # not one
    ]
    scenario = Scenario([Step(s, s, "retry") for s in steps], [3], frozenset({1}))
    model = run_checked(f"sqlite:///{tmp_path / 'l.db'}", scenario)
    outcomes = replay_model(scenario)[1]
    assert [o.status for o in outcomes] == [
        "appended", "appended", "rejected", "duplicate", "invalid", "appended", "duplicate",
        "appended", "duplicate", "invalid"]
    assert outcomes[3].kinds == outcomes[2].kinds != frozenset()
    assert model.head == 5


def test_the_scratch_tables_have_the_documented_names():
    connection = sqlite3.connect(":memory:")
    tables.create(connection.cursor(), "sqlite")
    names = {r[0] for r in connection.execute("SELECT name FROM sqlite_master")}
    assert set(tables.TABLES) | set(tables.VIEWS) <= names
    assert {  # SPEC section 5: the same names in both stores
        "nodes", "allocations", "alloc_states", "slots", "addresses", "rejections",
        "needs_reconnect", "zombie_slots",
    } <= names


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
