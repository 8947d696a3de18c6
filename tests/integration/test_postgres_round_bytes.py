"""A leader's round takes the oldest batches waiting in ``handoff`` whose
events hold at most ``ROUND_BYTES`` (``ledger.postgres_handoff``; the oldest
alone when it holds more); the rest wait for the next round. Each batch is
decided once, in the order handed over, and each writer gets its own
receipts, as when one round took them all."""

from __future__ import annotations

import os
import threading
from functools import partial
from typing import Any

import psycopg
import pytest
from pg_support import hand_over_in_turn

from ledger import postgres_handoff
from ledger.application import Ledger
from ledger.postgres_handoff import LEADER_LOCK, Handoff
from ledger.store import open_store

COMBINE = "&writers=combine"
# Events per writer's batch, in the order they are handed over; the fourth
# holds more than the budget alone. The second writer projects inline.
EVENTS = [2, 2, 2, 12, 1, 2]
INLINE = 1


def rounds_of(sizes: list[int], budget: int) -> list[list[int]]:
    """The rule: the oldest batch first, then the next while the round holds
    at most ``budget`` (indexes into ``sizes``)."""
    rounds: list[list[int]] = []
    held = budget + 1
    for index, size in enumerate(sizes):
        if held + size > budget:
            rounds.append([])
            held = 0
        rounds[-1].append(index)
        held += size
    return rounds


def test_a_round_takes_the_oldest_batches_up_to_its_byte_budget(
    pg_url, pg_schema, tables, monkeypatch
):
    pg_url += COMBINE
    with Ledger.open(pg_url) as ledger:
        assert ledger.submit({"type": "node-registered", "node": "n1"}).status == "appended"
    read = tables(pg_url)
    writers = [Ledger.open(pg_url + ("&projections=inline" if n == INLINE else ""))
               for n in range(len(EVENTS))]
    results: dict[int, list[tuple[str, int | None]]] = {}
    decided: list[list[str]] = []  # the batches (keys) of each round, as told to the writers
    give = Handoff._give

    def told(self: Handoff, cursor: Any, batches: Any, receipts: Any) -> None:
        decided.append([key for key, _, _ in batches])
        give(self, cursor, batches, receipts)

    monkeypatch.setattr(Handoff, "_give", told)

    def write(number: int) -> None:
        batch = [{"type": "heartbeat", "node": "n1", "id": f"w{number}-{i}"}
                 for i in range(EVENTS[number])]
        results[number] = [(r.status, r.position) for r in writers[number].submit_batch(batch)]

    blocker = open_store(pg_url).connect()  # type: ignore[attr-defined]
    oid = blocker.execute(
        "SELECT oid::int4 FROM pg_namespace WHERE nspname = %s", (pg_schema,)).fetchone()[0]
    blocker.execute("SELECT pg_advisory_lock(%s, %s)", (LEADER_LOCK, oid))
    threads: list[threading.Thread] = []
    try:
        hand_over_in_turn(read, [partial(write, number) for number in range(len(EVENTS))], threads)
        # A batch whose writer's pid now names a later session, handed over last.
        with psycopg.connect(os.environ["ALLOC_LEDGER_TEST_PG"], autocommit=True) as later:
            later.execute(
                f"INSERT INTO {pg_schema}.handoff (batch, events, inline, pid, started) "
                "VALUES ('reused', %s, false, pg_backend_pid(), '2000-01-01T00:00:00Z')",
                (b'[{"type": "heartbeat", "node": "n1", "id": "ghost"}]',))
            waiting = read.rows(
                "SELECT batch, octet_length(events) AS size FROM handoff ORDER BY id")
            keys = [row["batch"] for row in waiting]
            sizes = [row["size"] for row in waiting]
            budget = sizes[0] + sizes[1] + sizes[2] // 2
            assert sizes[3] > budget
            monkeypatch.setattr(postgres_handoff, "ROUND_BYTES", budget)
            blocker.close()  # the lead is free: one standby takes them, round by round
            for thread in threads:
                thread.join(timeout=30)
    finally:
        blocker.close()
        for thread in threads:
            thread.join(timeout=30)
        for writer in writers:
            writer.close()

    expected = rounds_of(sizes, budget)
    assert expected == [[0, 1], [2], [3], [4, 5, 6]]  # the ghost (6) counts in the last
    by_key = dict(zip(keys, sizes, strict=True))
    assert decided == [[keys[i] for i in r if keys[i] != "reused"] for r in expected]
    for taken in decided:  # a round holds the budget at most, or one batch alone
        assert len(taken) == 1 or sum(by_key[key] for key in taken) <= budget, taken
    kept = {row["id"]: row["position"] for row in read.rows("SELECT id, position FROM event_ids")}
    handed = [f"w{n}-{i}" for n in range(len(EVENTS)) for i in range(EVENTS[n])]
    assert sorted(kept, key=kept.get) == handed  # each once, in the order handed over
    assert read.head() == 1 + len(handed)
    assert results == {
        number: [("appended", kept[f"w{number}-{i}"]) for i in range(EVENTS[number])]
        for number in range(len(EVENTS))
    }
    # The round that held the inline batch projected the log up to its end; later ones not.
    assert read.tracked() == kept[f"w{INLINE}-{EVENTS[INLINE] - 1}"] == 5
    assert read.value("SELECT count(*) FROM handoff") == 0


@pytest.mark.parametrize("budget", [10**9, 1])
def test_rounds_of_any_budget_decide_concurrent_writers_once_each_in_order(
    pg_url, tables, monkeypatch, budget
):
    """Writers handing batches over while rounds run: all in one round each
    time (a large budget) or one batch a round (the smallest)."""
    pg_url += COMBINE
    monkeypatch.setattr(postgres_handoff, "ROUND_BYTES", budget)
    with Ledger.open(pg_url) as ledger:
        assert ledger.submit({"type": "node-registered", "node": "n1"}).status == "appended"
    writers = [Ledger.open(pg_url) for _ in range(4)]
    results: dict[int, list[list[str]]] = {}

    def write(number: int) -> None:
        results[number] = []
        for start in range(0, 60, 20):
            batch = [{"type": "heartbeat", "node": "n1", "id": f"w{number}-{i}"}
                     for i in range(start, start + 20)]
            results[number].append([r.status for r in writers[number].submit_batch(batch)])

    threads = [threading.Thread(target=write, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    for writer in writers:
        writer.close()

    assert results == {n: [["appended"] * 20] * 3 for n in range(4)}
    read = tables(pg_url)
    assert read.head() == 241
    ids = [row["id"] for row in read.rows("SELECT id FROM event_ids ORDER BY position")]
    for number in range(4):
        assert [i for i in ids if i.startswith(f"w{number}-")] == [
            f"w{number}-{i}" for i in range(60)]
    assert read.value("SELECT count(*) FROM handoff") == 0
