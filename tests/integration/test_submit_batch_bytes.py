"""``submit`` of a stream ends a batch at ``--batch`` events or once its lines
reach ``ledger.batches.BATCH_BYTES`` (16 MiB; a few hundred bytes here),
whichever comes first, on each store, from a file and from a pipe; a batch
cut by bytes is a transaction as one cut by count is. Running out of memory
is one line saying what was kept."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from cli_support import invoke

from ledger import batches
from ledger.application import Ledger

WIDTH = 100  # every line is this long, its newline included


def padded(event: dict[str, Any]) -> str:
    """An event as one line of exactly ``WIDTH`` bytes (its ``source`` pads it)."""
    line = json.dumps({**event, "source": ""}) + "\n"
    return json.dumps({**event, "source": "x" * (WIDTH - len(line))}) + "\n"


# Eight events with ids (a resubmission says which were kept), in batches of
# three lines, three and two once a batch ends at 300 bytes.
TEXT = padded({"type": "node-registered", "node": "n1", "id": "e1"}) + "".join(
    padded({"type": "heartbeat", "node": "n1", "id": f"e{n}"}) for n in range(2, 9))
ALL_APPENDED = [{"line": n, "status": "appended", "position": n, "error": None}
                for n in range(1, 9)]


@pytest.fixture(autouse=True)
def three_lines_a_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    assert {len(line) for line in TEXT.encode().splitlines(keepends=True)} == {WIDTH}
    monkeypatch.setattr(batches, "BATCH_BYTES", 3 * WIDTH)


def handed_batches(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size of each batch ``submit`` hands the ledger, which parses each
    once (``Ledger.parse_all``), whichever way it is read and decided."""
    sizes: list[int] = []
    parse_all = Ledger.parse_all

    def counted(items: list[Any]) -> list[Any]:
        sizes.append(len(items))
        return parse_all(items)

    monkeypatch.setattr(Ledger, "parse_all", staticmethod(counted))
    return sizes


def submitted(url: str, how: str, tmp_path: Path, code: int = 0) -> Any:
    if how == "file":
        source = tmp_path / "events.jsonl"
        source.write_text(TEXT)
        return invoke(["--store", url, "submit", str(source)], code=code)
    reading, writing = os.pipe()
    with os.fdopen(writing, "wb") as producer:
        producer.write(TEXT.encode())
    with os.fdopen(reading, "rb") as stream:
        return invoke(["--store", url, "submit", "-"], code=code, input=stream)


@pytest.mark.parametrize("how", ["file", "pipe"])
def test_a_batch_ends_once_its_lines_reach_the_byte_budget(
    store_url, tmp_path, monkeypatch, how
):
    sizes = handed_batches(monkeypatch)

    result = submitted(store_url, how, tmp_path)

    assert sizes == [3, 3, 2]
    assert [json.loads(line) for line in result.stdout.splitlines()] == ALL_APPENDED


def test_a_batch_cut_by_bytes_is_one_transaction(store_url, tmp_path, monkeypatch):
    """Ctrl-C while the second batch is with the store: that batch is
    committed and reported, and nothing after it is kept."""
    submit_batches = Ledger.submit_batches

    def interrupted_at_the_second(ledger: Ledger, batches: Any) -> Iterator[Any]:
        with closing(submit_batches(ledger, batches)) as decided:  # as a caller would close it
            yield next(decided)
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.01)  # its handler runs before the second batch's receipts come
            yield from decided

    monkeypatch.setattr(Ledger, "submit_batches", interrupted_at_the_second)
    result = submitted(store_url, "file", tmp_path, code=130)

    assert [json.loads(line) for line in result.stdout.splitlines()] == ALL_APPENDED[:6]
    assert result.stderr.endswith(
        "Error: interrupted: every line up to 6 was decided and is kept as decided "
        "(6 appended, 0 duplicate, 0 rejected, 0 invalid); no later line was kept\n")
    monkeypatch.undo()
    again = submitted(store_url, "file", tmp_path)
    assert [json.loads(line)["status"] for line in again.stdout.splitlines()] == (
        ["duplicate"] * 6 + ["appended"] * 2)


def test_running_out_of_memory_says_what_was_kept(tmp_path, monkeypatch):
    submit_batches = Ledger.submit_batches

    def out_of_memory_at_the_second(ledger: Ledger, batches: Any) -> Iterator[Any]:
        with closing(submit_batches(ledger, batches)) as decided:
            yield next(decided)
            raise MemoryError

    monkeypatch.setattr(Ledger, "submit_batches", out_of_memory_at_the_second)
    result = submitted(f"sqlite:///{tmp_path}/ledger.db", "file", tmp_path, code=1)

    assert [json.loads(line) for line in result.stdout.splitlines()] == ALL_APPENDED[:3]
    assert result.stderr == (
        "Error: out of memory (a batch holds up to --batch events, several times over while "
        "it is decided: a smaller --batch holds fewer); every line up to 3 was decided and is "
        "kept as decided (3 appended, 0 duplicate, 0 rejected, 0 invalid); later ones may be "
        "kept too (resubmit with ids to learn which: kept ones answer duplicate)\n")
