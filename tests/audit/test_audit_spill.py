"""An audit keeps on disk what would grow with history in memory (its
findings, and the allocations its replay is done with): a long history no
longer decides whether it can be audited. The findings come back in each
section's order, a removed allocation comes back as it was kept, the
report is the one an audit holding everything in memory makes, and a disk
too full to keep them is one line."""

from __future__ import annotations

import json
import subprocess
import tempfile
import tracemalloc
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any
from unittest.mock import patch

import pytest
from audit_support import CLI, StoreUnderTest, history, texts
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from model_support import Scenario, scenarios

import projections.audit
import projections.replay
import projections.spill
from commands.cli import cli
from ledger.application import Ledger
from ledger.domain import Changes, Cluster
from ledger.errors import SpillFailed
from ledger.model import RULES, Allocation
from ledger.records import Record
from ledger.store import open_store
from projections.audit import Auditor, AuditReport, audit
from projections.replay import replay
from projections.spill import HELD, DoneWith, Findings, Spill


def test_a_section_lists_its_rows_by_start_then_name_then_as_added() -> None:
    found = Findings(Spill(), ("a", "b"))
    found.add("a", {"n": 1}, 5, "x")
    found.add("b", {"n": 2}, 1, "z")
    found.add("a", {"n": 3}, 2, "y")
    found.add("a", {"n": 4}, 5, "w")
    found.add("a", {"n": 5}, 5, "x")
    found.finish()
    assert [row["n"] for row in found.rows("a")] == [3, 4, 1, 5]
    assert [row["n"] for row in found.rows("b")] == [2]
    assert found.counts == {"a": 4, "b": 1}
    found.spill.close()


def test_rows_come_back_as_they_went_in_past_what_is_held_at_once() -> None:
    found = Findings(Spill(), ("s",))
    rows = [{"position": i, "at": f"t{i}", "cascade": ["n1", "é"], "seconds": i / 3,
             "ongoing": i % 2 == 0, "reason": None} for i in range(2 * HELD + 7)]
    for row in rows:
        found.add("s", row)  # all at the same key: as added
    found.finish()
    assert list(found.rows("s")) == rows
    assert list(found.rows("s")) == rows  # read again (a table reads its rows twice)
    found.spill.close()


def test_a_disk_too_full_for_the_findings_is_a_named_error() -> None:
    found = Findings(Spill(max_pages=4), ("s",))  # its tables take 3 pages: 1 left
    with pytest.raises(SpillFailed, match="database or disk is full"):
        for i in range(10 * HELD):
            found.add("s", {"reason": "x" * 100, "i": i})
        found.finish()
    found.spill.close()


def flapping(episodes: int) -> Iterator[dict[str, Any]]:
    """A node that reports a slot held by an allocation never placed, then
    not, again and again: one zombie slot episode each time, and nothing
    else the cluster keeps grows."""
    yield {"type": "node-registered", "node": "n1", "slots": 1}
    for _ in range(episodes):
        yield {"type": "heartbeat", "node": "n1", "slots": [{"slot": 0, "alloc": "ghost"}]}
        yield {"type": "heartbeat", "node": "n1", "slots": []}


def audit_peak(
    path: Path, events: Iterator[dict[str, Any]], forget: bool = True,
) -> tuple[dict[str, Any], int]:
    """An audit's summary, and the peak of Python's memory while it ran
    (``tracemalloc``); the events submitted first unless the store is there."""
    url = f"sqlite:///{path}"
    if not path.exists():
        with Ledger.open(url) as ledger:
            for _ in ledger.submit_many(events, batch=1000):
                pass
    store = open_store(url, create=False)
    tracemalloc.start()
    try:
        report = audit(store, forget=forget)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        store.close()
    summary = report.summary()
    report.close()
    return summary, peak


def test_an_audits_memory_does_not_grow_with_what_it_finds(tmp_path: Path) -> None:
    small_found, small_peak = audit_peak(tmp_path / "small.db", flapping(4000))
    large_found, large_peak = audit_peak(tmp_path / "large.db", flapping(16000))
    small, large = small_found["zombie_slots_count"], large_found["zombie_slots_count"]
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
    monkeypatch.setattr(projections.audit, "Spill", partial(Spill, max_pages=4))  # 1 page free
    shown = CliRunner().invoke(cli, ["--store", url, "audit", "--format", "json"])
    assert shown.exit_code == 1
    assert shown.stdout == ""
    assert shown.stderr.splitlines() == [
        ("Error: cannot keep the replay's work in a temporary file (database or disk is "
         "full): give it room, or set TMPDIR (or SQLITE_TMPDIR) to a directory with room; "
         "nothing was changed")]


def test_a_removed_allocation_leaves_memory_and_comes_back_as_it_was_kept() -> None:
    spill = Spill()
    done = DoneWith(spill, keep=3)
    cluster = Cluster(done)
    removed = [Allocation(f"a{i}", "n1", slot=i, addresses=[f"10.0.0.{i}"],
                          client_status="complete", removed=True) for i in range(3)]
    live = Allocation("b", "n1")
    for alloc in [*removed, live]:
        cluster.allocs[alloc.alloc] = alloc
    done.forget(cluster, Changes(allocs=[removed[0], live]))
    done.forget(cluster, Changes(allocs=[removed[1]]))
    assert list(cluster.allocs) == ["a0", "a1", "a2", "b"]  # fewer than ``keep``: held
    assert spill.run("SELECT COUNT(*) FROM done_with") == [(0,)]
    assert cluster.allocs["never"] is None  # (the file is not read before a move)
    done.forget(cluster, Changes(allocs=[removed[2]]))  # the third: all three moved
    assert list(cluster.allocs) == ["b"]
    assert spill.run("SELECT alloc FROM done_with ORDER BY alloc") == [("a0",), ("a1",), ("a2",)]
    assert [cluster.allocs[f"a{i}"] for i in range(3)] == removed  # loaded again
    assert cluster.allocs["never"] is None
    done.forget(cluster, Changes())  # what was loaded for an event goes again after it
    assert list(cluster.allocs) == ["b"]
    spill.close()


def test_released_addresses_and_names_never_placed_are_let_go_at_once() -> None:
    done = DoneWith(Spill())
    cluster = Cluster(done)
    cluster.addresses["10.0.0.1"] = None  # released by the event
    assert cluster.addresses["10.0.0.2"] is None  # looked up, held by none
    assert cluster.allocs["never"] is None
    done.forget(cluster, Changes(released=["10.0.0.1"]))
    assert (dict(cluster.addresses), dict(cluster.allocs)) == ({}, {})
    done.spill.close()


def the_whole(report: AuditReport) -> dict[str, Any]:
    try:
        return report.as_dict()
    finally:
        report.close()


def test_an_audit_that_forgets_reports_what_one_holding_everything_does(
    under_test: StoreUnderTest, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(projections.spill, "HELD", 3)  # findings written many times over
    monkeypatch.setattr(projections.spill, "KEEP", 3)  # removed allocations moved as often
    with Ledger.open(under_test.url) as ledger:
        list(ledger.submit_many(texts(history(4000, nodes=30, seed=7)), batch=500))
    store = open_store(under_test.url)
    try:
        forgetting = the_whole(audit(store))
        holding = the_whole(audit(store, forget=False))
        later = the_whole(audit(store, start=2500, end=3500))
        later_holding = the_whole(audit(store, start=2500, end=3500, forget=False))
    finally:
        store.close()
    assert forgetting == holding
    assert later == later_holding
    # The history has what the spill must get right: removed allocations a
    # node still reports (released), and allocations never placed.
    reasons = {row["reason"] for row in holding["zombie_slots"]}
    assert {"released", "unknown-alloc"} <= reasons, reasons
    assert holding["rejections_count"] > 0 and holding["reconnects_count"] > 0


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(scenarios(max_steps=60))
def test_any_stream_audits_alike_forgetting_or_holding(scenario: Scenario) -> None:
    with (
        tempfile.TemporaryDirectory() as directory,
        patch.object(projections.spill, "HELD", 1),
        patch.object(projections.spill, "KEEP", 1),
        Ledger.open(f"sqlite:///{directory}/l.db") as ledger,
    ):
        for _ in ledger.submit_many([step.submission for step in scenario.steps], batch=7):
            pass
        assert the_whole(audit(ledger.store)) == the_whole(audit(ledger.store, forget=False))


def placed_and_removed(allocs: int) -> Iterator[dict[str, Any]]:
    """Allocations placed, run, completed and removed one after another on
    one slot: the cluster's live state stays one allocation."""
    yield {"type": "node-registered", "node": "n1", "slots": 1}
    yield {"type": "heartbeat", "node": "n1"}
    for i in range(allocs):
        alloc = f"job-{i:06d}-with-a-long-name"
        yield {"type": "alloc-placed", "alloc": alloc, "node": "n1", "slot": 0,
               "addresses": [f"10.{i // 65536}.{i // 256 % 256}.{i % 256}"]}
        yield {"type": "alloc-updated", "alloc": alloc, "client_status": "complete"}
        yield {"type": "alloc-removed", "alloc": alloc}


def test_an_audits_memory_does_not_grow_with_the_allocations_it_is_done_with(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(projections.spill, "KEEP", 500)  # at most 500 held at once
    _, small = audit_peak(tmp_path / "small.db", placed_and_removed(2000))
    _, large = audit_peak(tmp_path / "large.db", placed_and_removed(8000))
    _, holding = audit_peak(tmp_path / "large.db", placed_and_removed(8000), forget=False)
    # Held in memory, each allocation took about 700 bytes: 6,000 more, 4 MB.
    assert large - small < 100 * 6000, f"peak {small} then {large} bytes"
    assert holding - large > 300 * 6000, f"{holding} bytes holding them, {large} forgetting"


def nested(levels: int) -> Any:
    value: Any = "x"
    for _ in range(levels):
        value = [value]
    return value


def test_values_nested_deeper_than_orjson_writes_are_kept_all_the_same() -> None:
    """An edited log may hold values 1024 levels deep (its reader's limit);
    orjson writes 254 (helper-h701's review)."""
    spill = Spill()
    found = Findings(spill, ("rejections",))
    found.add("rejections", {"type": nested(300)})
    found.finish()
    assert list(found.rows("rejections")) == [{"type": nested(300)}]
    done = DoneWith(spill, keep=1)
    cluster = Cluster(done)
    alloc = cluster.allocs["a1"] = Allocation(
        "a1", "n1", job=nested(300), client_status="complete", removed=True)
    done.forget(cluster, Changes(allocs=[alloc]))
    assert "a1" not in cluster.allocs
    assert cluster.allocs["a1"] == alloc
    spill.close()


@pytest.mark.parametrize("forget", [True, False])
def test_a_report_naming_an_allocation_by_a_number_is_an_unknown_alloc(forget: bool) -> None:
    """A slot report of an edited log may name an allocation by a number:
    never placed, so a zombie (helper-h701's review: it raised TypeError)."""
    auditor = Auditor(1, forget)
    events = [{"type": "node-registered", "node": "n1", "slots": 1},
              {"type": "heartbeat", "node": "n1", "slots": [{"slot": 0, "alloc": 7}]}]
    for position, event in enumerate(events, 1):
        at = f"2026-01-01T00:00:0{position}.000000Z"
        auditor.see(Record(position, "t", event | {"at": at}, at, [], None, RULES))
    rows = list(auditor.finish().rows("zombie_slots"))
    auditor.spill.close()
    assert [(row["alloc"], row["reason"]) for row in rows] == [(7, "unknown-alloc")]


@pytest.mark.parametrize("fmt", ["json", "table"])
def test_a_reader_gone_before_the_findings_are_printed_leaves_no_word(
    tmp_path: Path, fmt: str,
) -> None:
    """``audit | head``: exit 141 and nothing on stderr, as ``cat`` there;
    the findings left unread in their temporary file said nothing either
    (their cursor, closed when collected after the file, printed an
    "Exception ignored" traceback)."""
    url = f"sqlite:///{tmp_path}/l.db"
    with Ledger.open(url) as ledger:
        for _ in ledger.submit_many(flapping(3 * HELD), batch=1000):
            pass
    audit_cli = subprocess.Popen(
        [*CLI, "--store", url, "audit", "--format", fmt],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert audit_cli.stdout is not None and audit_cli.stderr is not None
    audit_cli.stdout.read(100)
    audit_cli.stdout.close()  # the reader goes, the audit's rows mostly unprinted
    stderr = audit_cli.stderr.read()
    assert (audit_cli.wait(timeout=120), stderr) == (141, b"")


def test_a_replay_that_moves_removed_allocations_to_the_file_finds_no_difference(
    under_test: StoreUnderTest, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``alloc-ledger replay`` lets go of removed allocations a chunk at a
    time (here three at a time, from a chunk of 500 events), and the
    scratch tables it writes still equal the live ones."""
    monkeypatch.setattr(projections.spill, "KEEP", 3)
    monkeypatch.setattr(projections.replay, "CHUNK", 500)
    moves: list[int] = []
    move = DoneWith.move

    def counted(self: DoneWith, cluster: Cluster) -> None:
        moves.append(len(self._removed))
        move(self, cluster)

    monkeypatch.setattr(DoneWith, "move", counted)
    with Ledger.open(under_test.url) as ledger:
        list(ledger.submit_many(texts(history(4000, nodes=30, seed=7)), batch=500))
        ledger.project()
    store = open_store(under_test.url)
    try:
        report = replay(store)
    finally:
        store.close()
    assert report.ok, [difference.as_dict() for difference in report.differences]
    assert report.position == report.head == 4000
    assert len(moves) > 3 and sum(moves) > 20, moves
