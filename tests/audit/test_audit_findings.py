"""An audit keeps what it finds on disk, not in memory: a long history's
findings (1.5 GB of them at 10 million events) no longer decide whether it
can be audited. They come back in each section's order, and a disk too full
to keep them is one line."""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import projections.audit
from commands.cli import cli
from ledger.application import Ledger
from ledger.errors import FindingsNotKept
from ledger.store import open_store
from projections.audit import audit
from projections.findings import HELD, Findings


def test_a_section_lists_its_rows_by_start_then_name_then_as_added() -> None:
    found = Findings(("a", "b"))
    found.add("a", {"n": 1}, 5, "x")
    found.add("b", {"n": 2}, 1, "z")
    found.add("a", {"n": 3}, 2, "y")
    found.add("a", {"n": 4}, 5, "w")
    found.add("a", {"n": 5}, 5, "x")
    found.finish()
    assert [row["n"] for row in found.rows("a")] == [3, 4, 1, 5]
    assert [row["n"] for row in found.rows("b")] == [2]
    assert found.counts == {"a": 4, "b": 1}
    found.close()


def test_rows_come_back_as_they_went_in_past_what_is_held_at_once() -> None:
    found = Findings(("s",))
    rows = [{"position": i, "at": f"t{i}", "cascade": ["n1", "é"], "seconds": i / 3,
             "ongoing": i % 2 == 0, "reason": None} for i in range(2 * HELD + 7)]
    for row in rows:
        found.add("s", row)  # all at the same key: as added
    found.finish()
    assert list(found.rows("s")) == rows
    assert list(found.rows("s")) == rows  # read again (a table reads its rows twice)
    found.close()


def test_a_disk_too_full_for_the_findings_is_a_named_error() -> None:
    found = Findings(("s",), max_pages=2)
    with pytest.raises(FindingsNotKept, match="database or disk is full"):
        for i in range(10 * HELD):
            found.add("s", {"reason": "x" * 100, "i": i})
        found.finish()
    found.close()


def flapping(episodes: int) -> Iterator[dict[str, Any]]:
    """A node that reports a slot held by an allocation never placed, then
    not, again and again: one zombie slot episode each time, and nothing
    else the cluster keeps grows."""
    yield {"type": "node-registered", "node": "n1", "slots": 1}
    for _ in range(episodes):
        yield {"type": "heartbeat", "node": "n1", "slots": [{"slot": 0, "alloc": "ghost"}]}
        yield {"type": "heartbeat", "node": "n1", "slots": []}


def audit_peak(path: Path, episodes: int) -> tuple[int, int]:
    """The audit's zombie slot count and the peak of Python's memory while
    it ran (``tracemalloc``)."""
    url = f"sqlite:///{path}"
    with Ledger.open(url) as ledger:
        for _ in ledger.submit_many(flapping(episodes), batch=1000):
            pass
    store = open_store(url, create=False)
    tracemalloc.start()
    try:
        report = audit(store)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        store.close()
    count = report.summary()["zombie_slots_count"]
    report.close()
    return count, peak


def test_an_audits_memory_does_not_grow_with_what_it_finds(tmp_path: Path) -> None:
    small, small_peak = audit_peak(tmp_path / "small.db", 4000)
    large, large_peak = audit_peak(tmp_path / "large.db", 16000)
    assert (small, large) == (4000, 16000)
    # Held in memory, each finding took about 1,300 bytes: 12,000 more, 16 MB.
    grown = large_peak - small_peak
    assert grown < 100 * (large - small), f"peak {small_peak} then {large_peak} bytes"


def test_the_command_prints_what_was_kept_on_disk(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/l.db"
    with Ledger.open(url) as ledger:
        for _ in ledger.submit_many(flapping(2 * HELD + 5), batch=1000):
            pass
    runner = CliRunner()
    shown = runner.invoke(cli, ["--store", url, "audit", "--format", "json"])
    assert shown.exit_code == 0, shown.output
    report = json.loads(shown.output)
    assert report["zombie_slots_count"] == len(report["zombie_slots"]) == 2 * HELD + 5
    assert [z["appeared_position"] for z in report["zombie_slots"]] == list(
        range(2, 2 * (2 * HELD + 5) + 2, 2))
    lines = runner.invoke(cli, ["--store", url, "audit", "--format", "jsonl"])
    assert [json.loads(line) for line in lines.output.splitlines()] == [
        {"section": "zombie_slots"} | z for z in report["zombie_slots"]]
    table = runner.invoke(cli, ["--store", url, "audit", "--format", "table"])
    assert f"zombie slots ({2 * HELD + 5}):" in table.output
    assert len([line for line in table.output.splitlines() if "ghost" in line]) == 2 * HELD + 5


def test_the_command_says_in_one_line_when_the_disk_is_too_full(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = f"sqlite:///{tmp_path}/l.db"
    with Ledger.open(url) as ledger:
        for _ in ledger.submit_many(flapping(HELD), batch=1000):
            pass
    monkeypatch.setattr(projections.audit, "Findings", partial(Findings, max_pages=2))
    shown = CliRunner().invoke(cli, ["--store", url, "audit", "--format", "json"])
    assert shown.exit_code == 1
    assert shown.stdout == ""
    assert shown.stderr.splitlines() == [
        ("Error: cannot keep the audit's findings in a temporary file (database or disk is "
         "full): give it room, or set TMPDIR (or SQLITE_TMPDIR) to a directory with room; "
         "nothing was changed")]
