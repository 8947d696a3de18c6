"""``Ledger.submit_batches`` on SQLite: the next batch is decided while the
last one is written and committed in a thread (``ledger.pipeline``).

Each test forces the overlap that matters: a write that waits, so that the
next batch is decided before it; a rival writer that appends between two
batches; a stream its reader stops early; a write that fails.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ledger import pipeline
from ledger.application import Ledger
from ledger.chain import verify
from ledger.errors import StoreUnavailable
from projections import replay as replay_module
from projections.replay import replay
from scripts.simulate import generate

SETUP = [
    {"type": "node-registered", "node": "n1", "slots": 2},
    {"type": "heartbeat", "node": "n1"},
    {"type": "alloc-placed", "alloc": "a1", "node": "n1", "slot": 0, "max_disconnect": 60},
]


def open_ledger(tmp_path: Path) -> Ledger:
    ledger = Ledger.open(f"sqlite:///{tmp_path / 'ledger.db'}")
    assert ledger.store.overlaps
    return ledger


def slow_writes(ledger: Ledger, fail_on: int | None = None) -> list[int]:
    """Each batch's write waits 50 ms (the next batch is decided meanwhile);
    the ``fail_on``-th write fails as a full disk would (once). Returns the
    heads written."""
    written: list[int] = []
    calls = iter(range(1, 1 << 30))
    write = ledger.store.write_kept

    def waiting(cursor: Any, sql: Any, events: list[Any], *rest: Any) -> None:
        time.sleep(0.05)
        if next(calls) == fail_on:
            raise StoreUnavailable("store: database or disk is full")
        write(cursor, sql, events, *rest)
        written.append(events[-1].originator_version)

    ledger.store.write_kept = waiting  # type: ignore[method-assign]
    return written


def assert_tables_follow_the_log(ledger: Ledger, position: int) -> None:
    """The tables hold exactly what a replay of the log up to ``position`` gives."""
    report = replay(ledger.store)
    assert report.ok and report.position == position, report.differences[:3]


def statuses(batches: Iterator[list[Any]]) -> list[list[str]]:
    return [[r.status for r in receipts] for receipts in batches]


def test_each_batch_writes_its_rows_as_decided_though_the_next_is_decided_first(
    tmp_path: Path,
) -> None:
    with open_ledger(tmp_path) as ledger:
        written = slow_writes(ledger, fail_on=3)
        batches = [
            SETUP,
            [{"type": "heartbeat", "node": "n1"},
             {"type": "alloc-updated", "alloc": "a1", "client_status": "running"}],
            [{"type": "heartbeat-missed", "node": "n1"},  # a1 goes unknown, n1 disconnected
             {"type": "alloc-updated", "alloc": "a1", "client_status": "complete"}],
        ]
        seen: list[list[str]] = []
        with pytest.raises(StoreUnavailable):
            for receipts in ledger.submit_batches(batches):
                seen.append([r.status for r in receipts])
        assert seen == [["appended"] * 3, ["appended"] * 2]
        assert written == [3, 5]  # the third batch, decided ahead, was never written
        assert_tables_follow_the_log(ledger, 5)
        assert ledger.submit({"type": "heartbeat", "node": "n1"}).position == 6


def test_a_rival_append_between_batches_is_decided_against(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    with open_ledger(tmp_path) as ledger, Ledger.open(url) as rival:
        slow_writes(ledger)
        rival_receipts = []

        def batches() -> Iterator[list[dict[str, Any]]]:
            yield SETUP
            # taken while the first batch commits: once it has, the rival
            # appends, before the next batch (decided ahead on what this
            # process knows) is written
            while True:
                with rival.store.reading() as cursor:
                    if rival.store.head(cursor) == len(SETUP):
                        break
                time.sleep(0.005)
            rival_receipts.append(rival.submit(
                {"type": "alloc-placed", "alloc": "r1", "node": "n1", "slot": 1}))
            yield [{"type": "alloc-placed", "alloc": "b1", "node": "n1", "slot": 1},
                   {"type": "heartbeat", "node": "n1"}]

        seen = statuses(ledger.submit_batches(batches()))
        assert [r.status for r in rival_receipts] == ["appended"], rival_receipts
        assert seen == [["appended"] * 3, ["rejected", "appended"]]
        assert_tables_follow_the_log(ledger, 6)


def test_a_stream_read_no_further_writes_nothing_more_and_forgets_what_was_ahead(
    tmp_path: Path,
) -> None:
    with open_ledger(tmp_path) as ledger:
        slow_writes(ledger)
        stream = ledger.submit_batches([
            SETUP,
            [{"type": "node-registered", "node": "x", "slots": 1}],  # decided ahead only
            [{"type": "heartbeat", "node": "n1"}],
        ])
        assert [r.status for r in next(stream)] == ["appended"] * 3
        stream.close()
        with ledger.store.reading() as cursor:
            assert ledger.store.head(cursor) == 3
        late = ledger.submit({"type": "heartbeat", "node": "x"})
        assert (late.status, late.error) == ("rejected", "node x is not registered")
        assert_tables_follow_the_log(ledger, 4)


def test_receipts_come_only_once_their_batch_is_committed(tmp_path: Path) -> None:
    with open_ledger(tmp_path) as ledger:
        written = slow_writes(ledger)
        committed: list[int] = []
        for receipts in ledger.submit_batches(
            [SETUP, [{"type": "heartbeat", "node": "n1"}] * 3, [{"type": "heartbeat", "node": "n1"}]]
        ):
            committed.append(receipts[-1].position or 0)
            with Ledger.open(ledger.store.url) as reader, reader.store.reading() as cursor:
                assert reader.store.head(cursor) >= committed[-1]  # durable, seen by another
        assert committed == written == [3, 6, 7]


def test_a_replay_writes_each_chunk_while_the_next_replays_and_matches_the_live_tables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(replay_module, "CHUNK", 37)  # many chunks, each written in a thread
    with open_ledger(tmp_path) as ledger:
        receipts = list(ledger.submit_many(generate(600, nodes=6, slots=3, seed=8), batch=50))
        head = max(r.position or 0 for r in receipts)
        write = ledger.store.write_rows
        chunks: list[int] = []

        def waiting(cursor: Any, sql: Any, changed: Any) -> None:
            time.sleep(0.01)  # the next chunk replays meanwhile
            write(cursor, sql, changed)
            chunks.append(sum(len(rows) for _, rows in changed))

        ledger.store.write_rows = waiting  # type: ignore[method-assign]
        report = replay(ledger.store)
        assert report.ok and report.position == head, report.differences[:3]
        assert len(chunks) == -(-head // 37)


def hold_write_lock(path: Path, seconds: float) -> threading.Thread:
    """Another connection holds the write lock for a while (in a thread)."""
    def hold() -> None:
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        time.sleep(seconds)
        holder.execute("COMMIT")
        holder.close()

    thread = threading.Thread(target=hold)
    thread.start()
    return thread


def test_a_batch_decided_again_does_not_let_the_next_land_on_another_history(
    tmp_path: Path,
) -> None:
    """Batch 2 is decided again because a rival appended; it then keeps one
    event less and ends at the same position as first decided. Batch 3,
    decided ahead on batch 2's first decision, must be decided again too."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    with open_ledger(tmp_path) as ledger, Ledger.open(url) as rival:
        ledger.submit_batch(SETUP)
        batches = [
            [{"type": "heartbeat", "node": "n1"}],
            [{"type": "heartbeat", "node": "n1", "id": "X"}, {"type": "heartbeat", "node": "n1"}],
            [{"type": "alloc-placed", "alloc": "a2", "node": "n1", "slot": 1}],
        ]
        seen: list[list[str]] = []
        holder = None
        for receipts in ledger.submit_batches(batches):
            seen.append([r.status for r in receipts])
            if len(seen) == 1:  # batch 2 is decided ahead by now, on position 4
                assert rival.submit({"type": "node-down", "node": "n1", "id": "X"}).position == 5
                holder = hold_write_lock(tmp_path / "ledger.db", 0.3)  # batch 3 decided meanwhile
        assert holder is not None
        holder.join()
        # decided again: X is the rival's (another event under it: invalid)
        assert seen == [["appended"], ["invalid", "appended"], ["appended"]]
        assert verify(ledger.store).ok
        assert_tables_follow_the_log(ledger, 7)


def test_an_input_error_with_a_batch_in_flight_reports_that_batch_then_fails(
    tmp_path: Path,
) -> None:
    with open_ledger(tmp_path) as ledger:
        slow_writes(ledger)

        def batches() -> Iterator[list[dict[str, Any]]]:
            yield SETUP
            yield [{"type": "heartbeat", "node": "n1"}]
            raise OSError("the input went away")  # the second batch is in flight

        seen: list[list[str]] = []
        with pytest.raises(OSError, match="went away"):
            for receipts in ledger.submit_batches(batches()):
                seen.append([r.status for r in receipts])
        assert seen == [["appended"] * 3, ["appended"]]  # committed, so reported
        with ledger.store.reading() as cursor:
            assert ledger.store.head(cursor) == 4


def test_ctrl_c_while_a_batch_commits_still_reports_that_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its events are kept: their results are printed before the interrupt ends
    the stream (a producer without ids resumes after the last result line)."""
    waited = pipeline.InFlight.result

    def interrupted(self: pipeline.InFlight) -> list[Any]:
        monkeypatch.setattr(pipeline.InFlight, "result", waited)  # once
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline.InFlight, "result", interrupted)
    with open_ledger(tmp_path) as ledger:
        slow_writes(ledger)
        seen: list[list[str]] = []
        with pytest.raises(KeyboardInterrupt):
            for receipts in ledger.submit_batches([SETUP, [{"type": "heartbeat", "node": "n1"}]]):
                seen.append([r.status for r in receipts])
        with ledger.store.reading() as cursor:
            head = ledger.store.head(cursor)
    assert (seen, head) == ([["appended"] * 3], 3)  # committed, so reported; no more


def two_batches_end(ledger: Ledger) -> list[BaseException]:
    """What a stream of two batches ended with, in a thread that must not
    wait for good (it would if the second waited on a first that failed)."""
    ended: list[BaseException] = []

    def consume() -> None:
        try:
            list(ledger.submit_batches([SETUP, [{"type": "heartbeat", "node": "n1"}]]))
        except BaseException as error:  # noqa: BLE001 - what the stream ended with
            ended.append(error)

    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    thread.join(10)
    assert not thread.is_alive(), "the stream waits for good after its first batch failed"
    return ended


def test_a_batch_the_writer_decides_that_fails_lets_the_stream_end_with_its_error(
    tmp_path: Path,
) -> None:
    """The first batch is decided in the writer thread; its write fails while
    the next batch waits to be decided after it: the stream ends with the
    error (it does not wait for good), and nothing is kept."""
    with open_ledger(tmp_path) as ledger:
        slow_writes(ledger, fail_on=1)
        assert [type(e) for e in two_batches_end(ledger)] == [StoreUnavailable]
        with ledger.store.reading() as cursor:
            assert ledger.store.head(cursor) == 0


def test_a_first_batch_whose_transaction_cannot_begin_lets_the_stream_end_with_its_error(
    tmp_path: Path,
) -> None:
    """The first batch is decided in the writer thread, but its write
    transaction never begins (``BEGIN IMMEDIATE`` past the lock's timeout, a
    ``-shm`` this user may not write): the next batch waits to be decided
    after it, and must not wait for good (helper-403: ``submit FILE`` of more
    than one batch hung, even past SIGTERM, where one batch exits 3)."""
    with open_ledger(tmp_path) as ledger:
        writing = ledger.store.writing
        calls = iter(range(1, 1 << 30))

        def refused() -> Any:
            if next(calls) == 1:
                raise StoreUnavailable("store: database is locked")
            return writing()

        ledger.store.writing = refused  # type: ignore[method-assign]
        assert [type(e) for e in two_batches_end(ledger)] == [StoreUnavailable]
        with ledger.store.reading() as cursor:
            assert ledger.store.head(cursor) == 0


def test_every_batch_after_the_first_is_decided_while_the_one_before_commits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The point of the pipeline: with nothing to trim, each later batch is
    decided ahead and written as it was decided."""
    with open_ledger(tmp_path) as ledger:
        slow_writes(ledger)
        write_ahead = ledger.write_ahead
        ahead: list[int] = []

        def counted(cursor: Any, decided: Any) -> list[Any]:
            receipts = write_ahead(cursor, decided)
            ahead.append(receipts[-1].position or 0)
            return receipts

        monkeypatch.setattr(ledger, "write_ahead", counted)
        batches = [SETUP, [{"type": "heartbeat", "node": "n1"}] * 2,
                   [{"type": "heartbeat", "node": "n1"}]]
        assert statuses(ledger.submit_batches(batches)) == [["appended"] * 3, ["appended"] * 2,
                                                           ["appended"]]
        assert ahead == [5, 6]
        assert_tables_follow_the_log(ledger, 6)
