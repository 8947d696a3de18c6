"""A stream is cut into batches at ``--batch`` events or once their lines
reach ``ledger.batches.BATCH_BYTES``, whichever comes first: from a list,
from a file through the pipeline (one transaction per batch) and from a pipe."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from commands import submit
from ledger import batches
from ledger.application import Ledger
from ledger.batches import batched, input_size

WIDTH = 100  # every line of ``LINES`` is this long, its newline included


def padded(event: dict[str, Any]) -> str:
    """An event as one line of exactly ``WIDTH`` bytes (its ``source`` pads it)."""
    line = json.dumps({**event, "source": ""}) + "\n"
    return json.dumps({**event, "source": "x" * (WIDTH - len(line))}) + "\n"


LINES = [padded({"type": "node-registered", "node": "n1", "id": "e1"})] + [
    padded({"type": "heartbeat", "node": "n1", "id": f"e{n}"}) for n in range(2, 9)]


def test_the_lines_are_as_long_as_the_tests_say() -> None:
    assert {len(line.encode()) for line in LINES} == {WIDTH}


def test_a_batch_ends_once_its_lines_reach_the_budget() -> None:
    cut = list(batched(LINES, 1000, input_size, budget=3 * WIDTH))
    assert [len(batch) for batch in cut] == [3, 3, 2]
    assert [line for batch in cut for line in batch] == LINES


def test_a_batch_ends_at_its_count_before_its_budget() -> None:
    assert [len(b) for b in batched(LINES, 2, input_size, budget=3 * WIDTH)] == [2, 2, 2, 2]


def test_a_line_longer_than_the_budget_is_a_batch_of_its_own() -> None:
    items = ["a", "b" * 50, "c", "d"]
    assert list(batched(items, 10, input_size, budget=10)) == [["a", "b" * 50], ["c", "d"]]


def test_a_full_batch_is_handed_on_before_the_next_line_is_read() -> None:
    read: list[str] = []

    def reading() -> Iterator[str]:
        for line in LINES:
            read.append(line)
            yield line

    first = next(batched(reading(), 1000, input_size, budget=3 * WIDTH))
    assert first == read == LINES[:3]


def test_dicts_count_for_no_bytes() -> None:
    events = [{"type": "heartbeat", "node": "n1"}] * 5
    assert [len(b) for b in batched(events, 1000, input_size, budget=1)] == [5]


def test_the_default_budget_is_read_when_cutting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(batches, "BATCH_BYTES", 3 * WIDTH)
    assert [len(b) for b in batched(LINES, 1000, input_size)] == [3, 3, 2]


def test_each_transaction_of_a_text_stream_ends_at_the_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through ``Ledger.submit_many`` and the pipeline (SQLite decides each
    batch while the last commits): one transaction per batch cut by bytes."""
    monkeypatch.setattr(batches, "BATCH_BYTES", 3 * WIDTH)
    with Ledger.open(f"sqlite:///{tmp_path / 'ledger.db'}") as ledger:
        assert ledger.store.overlaps
        heads: list[int] = []
        write = ledger.store.write_kept

        def recorded(cursor: Any, sql: Any, events: list[Any], *rest: Any) -> None:
            write(cursor, sql, events, *rest)
            heads.append(events[-1].originator_version)

        ledger.store.write_kept = recorded  # type: ignore[method-assign]
        receipts = list(ledger.submit_many(LINES, batch=1000))

    assert [r.status for r in receipts] == ["appended"] * 8
    assert heads == [3, 6, 8]


def test_lines_waiting_in_a_pipe_come_in_batches_cut_by_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(batches, "BATCH_BYTES", 3 * WIDTH)
    reading, writing = os.pipe()
    os.write(writing, "".join(LINES).encode())
    os.close(writing)
    arrivals = submit.Arrivals(reading)
    taken = []
    while batch := arrivals.take(1000):
        taken.append([n for n, _ in batch])
    os.close(reading)
    assert taken == [[1, 2, 3], [4, 5, 6], [7, 8]]
    assert arrivals.ready_bytes == 0
