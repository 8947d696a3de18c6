"""A rebuild keeps a checkpoint at every multiple of ``every`` it passes,
and nowhere else, whether it stops at a position, a time or the head."""

from __future__ import annotations

import sqlite3

from ledger.application import Ledger
from projections.asof import AsOf, materialize, rebuild
from scripts.simulate import generate


def kept_checkpoints(path) -> list[int]:
    connection = sqlite3.connect(path)
    try:
        return [r[0] for r in connection.execute("SELECT position FROM checkpoints ORDER BY 1")]
    finally:
        connection.close()


def dump(cluster) -> list[tuple]:
    connection = materialize(cluster)
    return [
        row
        for table in ("nodes", "slots", "allocations", "alloc_states", "addresses", "rejections")
        for row in connection.execute(f"SELECT * FROM {table} ORDER BY 1, 2")
    ]


def test_a_rebuild_to_a_position_keeps_checkpoints_at_the_multiples_it_passes(tmp_path):
    path = tmp_path / "l.db"
    with Ledger.open(f"sqlite:///{path}") as ledger:
        list(ledger.submit_many(list(generate(60, nodes=5, slots=2, seed=4)), batch=7))
        cluster, position = rebuild(ledger.store, AsOf(position=40), every=10)
        scratch, _ = rebuild(ledger.store, AsOf(position=40), every=0)
    assert position == 40
    assert kept_checkpoints(path) == [10, 20, 30, 40]
    assert dump(cluster) == dump(scratch)


def test_a_rebuild_to_a_time_stops_before_the_first_later_event(tmp_path):
    path = tmp_path / "l.db"
    events = list(generate(60, nodes=5, slots=2, seed=4))
    moment = AsOf.parse(events[24]["at"])
    with Ledger.open(f"sqlite:///{path}") as ledger:
        list(ledger.submit_many(events, batch=7))
        cluster, position = rebuild(ledger.store, moment, every=10)
        scratch, scratch_position = rebuild(ledger.store, moment, every=0)
        reached, _ = rebuild(ledger.store, AsOf(position=position), every=0)
    assert position == scratch_position
    assert 24 <= position < 60
    assert kept_checkpoints(path) == [p for p in (10, 20, 30, 40, 50) if p <= position]
    assert dump(cluster) == dump(scratch) == dump(reached)


def test_a_rebuild_without_a_bound_replays_the_whole_log(tmp_path):
    path = tmp_path / "l.db"
    with Ledger.open(f"sqlite:///{path}") as ledger:
        list(ledger.submit_many(list(generate(35, nodes=5, slots=2, seed=4)), batch=7))
        cluster, position = rebuild(ledger.store, None, every=10)
        scratch, scratch_position = rebuild(ledger.store, None, every=0)
    assert position == scratch_position == 35
    assert kept_checkpoints(path) == [10, 20, 30]
    assert dump(cluster) == dump(scratch)
