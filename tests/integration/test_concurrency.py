"""Race-free rules across processes: eight writers hammer the same slots,
addresses, allocation ids and client ids at once.

On PostgreSQL half of them combine (the default) and half take the log's
lock themselves. Each contested entity has exactly one winner; every loser is rejected with
the reason a lone submitter would get (or told ``duplicate`` for a client
id); positions stay one gapless sequence; the tables equal a replay of the
log, and the hash chain holds.
"""

from __future__ import annotations

import multiprocessing
import re
import sqlite3
from collections import defaultdict
from typing import Any

import pytest

from ledger.application import Ledger
from ledger.chain import verify
from ledger.store import open_store

WRITERS = 8
ROUNDS = 12
DECISION_TABLES = ("nodes", "slots", "allocations", "addresses")


def contested(writer: int, round_: int) -> list[tuple[str, dict[str, Any]]]:
    """What one writer submits in one round; every writer races for the same things."""
    return [
        ("slot", {"type": "alloc-placed", "alloc": f"s{round_}-w{writer}", "node": "shared",
                  "slot": round_}),
        ("address", {"type": "alloc-placed", "alloc": f"x{round_}-w{writer}", "node": "shared",
                     "addresses": [f"10.0.{round_}.1"]}),
        ("alloc", {"type": "alloc-placed", "alloc": f"c{round_}", "node": f"own{writer}",
                   "slot": round_}),
        ("id", {"type": "heartbeat", "node": "shared", "id": f"retry-{round_}"}),
    ]


def setup(url: str) -> int:
    with Ledger.open(url) as ledger:
        nodes = [("shared", ROUNDS)] + [(f"own{w}", ROUNDS) for w in range(WRITERS)]
        for node, slots in nodes:
            assert ledger.submit({"type": "node-registered", "node": node, "slots": slots}).ok
            assert ledger.submit({"type": "heartbeat", "node": node}).ok
        return 2 * len(nodes)


def writer_url(url: str, number: int) -> str:
    """On PostgreSQL half the writers take the log's lock themselves, half hand
    their batches to the leader (the default): both race, and race each other."""
    if url.startswith("postgres") and number % 2 == 0:
        return url + ("&" if "?" in url else "?") + "writers=lock"
    return url


def writer(url: str, start: Any, number: int) -> list[tuple[str, int, str, int | None, str | None]]:
    """One process: submit each contested event in its own transaction."""
    results = []
    with Ledger.open(url) as ledger:
        start.wait()
        for round_ in range(ROUNDS):
            for race, event in contested(number, round_):
                receipt = ledger.submit(event)
                results.append((race, round_, receipt.status, receipt.position, receipt.error))
    return results


def race(url: str) -> list[tuple[int, str, int, str, int | None, str | None]]:
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager:
        start = manager.Barrier(WRITERS)
        with context.Pool(WRITERS) as pool:
            runs = [pool.apply_async(writer, (writer_url(url, w), start, w)) for w in range(WRITERS)]
            outcomes = [run.get(timeout=300) for run in runs]
    return [(w, *result) for w, results in enumerate(outcomes) for result in results]


def winners(outcomes: list[Any], kind: str) -> dict[int, list[Any]]:
    by_round: dict[int, list[Any]] = defaultdict(list)
    for outcome in outcomes:
        if outcome[1] == kind:
            by_round[outcome[2]].append(outcome)
    return by_round


def test_eight_writers_racing_for_the_same_things_get_one_winner_each(
    store_url, tables, replayed, project
):
    first = setup(store_url)

    outcomes = race(store_url)

    for round_, tries in winners(outcomes, "slot").items():
        won = [t for t in tries if t[3] == "appended"]
        assert len(won) == 1, tries
        holder = f"s{round_}-w{won[0][0]}"
        assert sorted(t[5] for t in tries if t is not won[0]) == [
            f"slot shared#{round_} is already held by allocation {holder}"
        ] * (WRITERS - 1)
    for round_, tries in winners(outcomes, "address").items():
        won = [t for t in tries if t[3] == "appended"]
        assert len(won) == 1, tries
        holder = f"x{round_}-w{won[0][0]}"
        reason = (
            f"address 10.0.{round_}.1 is still held by allocation {holder}, "
            "which has not shut down"
        )
        assert sorted(t[5] for t in tries if t is not won[0]) == [reason] * (WRITERS - 1)
    for round_, tries in winners(outcomes, "alloc").items():
        won = [t for t in tries if t[3] == "appended"]
        assert len(won) == 1, tries
        assert sorted(t[5] for t in tries if t is not won[0]) == [
            f"allocation c{round_} already holds slot own{won[0][0]}#{round_}"
        ] * (WRITERS - 1)
    for tries in winners(outcomes, "id").values():
        won = [t for t in tries if t[3] == "appended"]
        assert len(won) == 1, tries
        assert {(t[3], t[4]) for t in tries if t is not won[0]} == {("duplicate", won[0][4])}

    read = tables(store_url)
    head = read.head()
    kept = sorted(t[4] for t in outcomes if t[3] in ("appended", "rejected"))
    assert kept == list(range(first + 1, head + 1))
    assert head == first + ROUNDS * (3 * WRITERS + 1)

    if store_url.startswith("postgres"):
        assert read.snapshot("state_", DECISION_TABLES) == replayed(store_url, only=DECISION_TABLES)
    project(store_url)
    assert read.snapshot() == replayed(store_url)
    holders = read.rows("SELECT slot, alloc FROM slots WHERE node = 'shared' ORDER BY slot")
    assert all(h["alloc"] is not None for h in holders) and len(holders) == ROUNDS
    store = open_store(store_url)
    try:
        assert verify(store).ok
    finally:
        store.close()


PLACED_BY_ANOTHER = [
    {"type": "node-registered", "node": "n1", "slots": 2},
    {"type": "heartbeat", "node": "n1"},
    {"type": "alloc-placed", "alloc": "a1", "node": "n1", "slot": 0, "addresses": ["10.0.0.5"]},
]


def test_a_writer_that_has_loaded_nothing_decides_a_batch_against_what_another_placed(
    store_url,
):
    """A writer's caches start empty; what a batch places is looked up in the
    tables at once (one query a table), found or found absent."""
    with Ledger.open(store_url) as first:
        for event in PLACED_BY_ANOTHER:
            assert first.submit(event).status == "appended"

    with Ledger.open(store_url) as second:
        receipts = second.submit_batch([
            {"type": "alloc-placed", "alloc": "a1", "node": "n1", "slot": 0,
             "addresses": ["10.0.0.5"]},
            {"type": "alloc-placed", "alloc": "a1", "node": "n1", "slot": 1},
            {"type": "alloc-placed", "alloc": "a2", "node": "n1", "addresses": ["10.0.0.5"]},
            {"type": "alloc-placed", "alloc": "a3", "node": "n1", "slot": 1,
             "addresses": ["10.0.0.6"]},
        ])

    assert [(r.status, r.position, r.error) for r in receipts] == [
        ("duplicate", 3, None),
        ("rejected", 4, "allocation a1 already holds slot n1#0"),
        ("rejected", 5,
         "address 10.0.0.5 is still held by allocation a1, which has not shut down"),
        ("appended", 6, None),
    ]


def test_a_sqlite_writer_looks_up_what_a_batch_places_in_one_query_a_table(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The batch above, on SQLite, with every statement traced: the
    allocations and addresses it places are read in one query each, none of
    them one at a time."""
    url = f"sqlite:///{tmp_path}/ledger.db"
    with Ledger.open(url) as first:
        for event in PLACED_BY_ANOTHER:
            assert first.submit(event).status == "appended"
    traced: list[str] = []
    connect = sqlite3.connect

    def tracing(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        connection = connect(*args, **kwargs)
        connection.set_trace_callback(traced.append)
        return connection

    monkeypatch.setattr(sqlite3, "connect", tracing)
    with Ledger.open(url) as second:
        traced.clear()
        statuses = [r.status for r in second.submit_batch([
            {"type": "alloc-placed", "alloc": "a2", "node": "n1", "addresses": ["10.0.0.5"]},
            {"type": "alloc-placed", "alloc": "a3", "node": "n1", "slot": 1,
             "addresses": ["10.0.0.6", "10.0.0.7"]},
            {"type": "alloc-placed", "alloc": "a4", "node": "n1"},
        ])]

    assert statuses == ["rejected", "appended", "appended"]
    reads = [" ".join(s.split()) for s in traced if s.lstrip().upper().startswith("SELECT")]
    by_id = [s for s in reads if re.search(r"FROM allocations WHERE alloc (=|IN)", s)]
    by_address = [s for s in reads if re.search(r"FROM addresses WHERE address (=|IN)", s)]
    assert len(by_id) == 1 and "json_each" in by_id[0], by_id
    assert len(by_address) == 1 and "json_each" in by_address[0], by_address


def test_writers_making_one_new_sqlite_store_at_once_all_open_it(tmp_path: Any) -> None:
    """Six at once (threads, each with a store of its own, as processes
    have) on a file that does not exist yet, twenty times: the WAL switch and
    the recorder's migration row race; every one opens the store, which is
    one ledger."""
    import threading

    for round_ in range(20):
        url = f"sqlite:///{tmp_path}/new{round_}.db"
        start = threading.Barrier(6)
        failures: list[str] = []

        def opener(url: str = url, start: threading.Barrier = start,
                   failures: list[str] = failures) -> None:
            start.wait()
            try:
                open_store(url).close()
            except Exception as error:  # noqa: BLE001 - the test names it
                failures.append(str(error))

        threads = [threading.Thread(target=opener) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert failures == [], f"round {round_}: {failures[0]}"
        with Ledger.open(url) as ledger:
            receipt = ledger.submit({"type": "node-registered", "node": "n1"})
            assert (receipt.status, receipt.position) == ("appended", 1)
            assert verify(ledger.store).ok
