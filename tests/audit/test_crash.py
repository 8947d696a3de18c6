"""Crash safety: ``submit`` and ``project`` are SIGKILLed at random points.

After every kill, every event ``submit`` reported appended is in the log
exactly once, at the position it was given; no event is half-written (its
chain hash and client id are there, its payload is whole); the log is the
stream's own prefix, in order. Resubmitting the whole stream appends exactly
the rest and reports the others ``duplicate``, and replay shows no
difference. A projection catch-up killed mid-way leaves the tables exactly at
the last position it recorded, and the next run resumes from there.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

from audit_support import StoreUnderTest, history, jsonl, kill, results, run, spawn, texts

from ledger.application import Ledger
from ledger.chain import verify
from ledger.store import Store, open_store
from projections import tables
from projections.replay import replay

STREAM = 2000
KILLS = 20


def kept(target: StoreUnderTest) -> tuple[list[str], dict[str, int]]:
    """The ids of the kept events in log order, after checking every event is
    whole: gapless positions, a payload that parses, a chain hash, its id."""
    events, hashes, id_rows = target.snapshot(
        "SELECT originator_version, state FROM stored_events ORDER BY originator_version",
        "SELECT position FROM event_hashes ORDER BY position",
        "SELECT id, position FROM event_ids",
    )
    positions = [row[0] for row in events]
    assert positions == list(range(1, len(events) + 1)), "positions must be gapless"
    ids = [json.loads(bytes(row[1]))["event"]["id"] for row in events]
    hashed = [row[0] for row in hashes]
    assert hashed == positions, "every event has exactly one chain hash"
    known = dict(id_rows)
    assert known == {event_id: n for n, event_id in enumerate(ids, 1)}, "ids match positions"
    assert len(set(ids)) == len(ids), "no event is in the log twice"
    return ids, known


def submit_killed(
    target: StoreUnderTest, stream: Path, after_lines: int, rng: random.Random
) -> list[dict[str, Any]]:
    """Start ``submit STREAM``, read ``after_lines`` result lines, wait a few
    milliseconds more, SIGKILL it; return every complete result line it printed."""
    batch = rng.choice(["3", "20", "50", "200"])
    pid, stdout = spawn("submit", str(stream), "--batch", batch, url=target.url)
    printed = b""
    for _ in range(after_lines):
        line = stdout.readline()
        if not line:
            break
        printed += line
    time.sleep(rng.uniform(0, 0.004))
    kill(pid)
    printed += stdout.read()
    stdout.close()
    return results(printed)


def check_reports(
    reports: list[dict[str, Any]], ids: list[str], before: dict[str, int], after: dict[str, int]
) -> int:
    """Each reported line agrees with the log; return how many it appended."""
    added = 0
    for report in reports:
        event_id = ids[report["line"] - 1]
        if report["status"] == "duplicate":
            assert before.get(event_id) == report["position"], report
        else:
            assert report["status"] in ("appended", "rejected"), report
            assert event_id not in before, report
            assert after.get(event_id) == report["position"], report
            added += 1
    return added


def test_submit_killed_at_random_points_loses_and_doubles_nothing(
    under_test: StoreUnderTest, tmp_path: Path
) -> None:
    events = history(STREAM, nodes=25, seed=3)
    ids = [e["id"] for e in events]
    stream = tmp_path / "stream.jsonl"
    stream.write_bytes(jsonl(events))
    open_store(under_test.url).close()  # an empty store, ready
    rng = random.Random(99)
    kills = sorted(rng.sample(range(1, STREAM * 4 // 5), KILLS))

    for after_lines in kills:
        _, before = kept(under_test)
        reports = submit_killed(under_test, stream, after_lines, rng)
        order, after = kept(under_test)
        assert order == ids[: len(order)], "the log is the stream's prefix, in order"
        assert all(after[i] == p for i, p in before.items())
        assert len(after) - len(before) >= check_reports(reports, ids, before, after)

    _, before = kept(under_test)
    assert 0 < len(before) < STREAM, "the kills should have left work to do"
    finished = run("submit", str(stream), url=under_test.url)
    assert finished.returncode in (0, 1), finished.stderr
    reports = results(finished.stdout)
    assert [r["line"] for r in reports] == list(range(1, STREAM + 1))
    order, after = kept(under_test)
    assert order == ids
    assert check_reports(reports, ids, before, after) == STREAM - len(before)

    assert run("replay", url=under_test.url).returncode == 0
    assert run("verify", url=under_test.url).returncode == 0


def lagging_ledger(target: StoreUnderTest) -> Ledger:
    """A writer that leaves the projection tables behind (on SQLite, by
    deciding against tables of its own, as writers on PostgreSQL do)."""
    store = open_store(target.url)
    if target.dialect == "sqlite":
        store.state_prefix = "state_"  # type: ignore[misc]
        with store.writing() as cursor:
            tables.create(cursor, store.dialect, "state_")
    store.projects_inline = False  # type: ignore[misc]
    return Ledger(store)


def projected(store: Store) -> tuple[int, int]:
    with store.reading() as cursor:
        return store.tracked(cursor), store.head(cursor)


def test_projection_killed_mid_catch_up_resumes_cleanly(under_test: StoreUnderTest) -> None:
    events = 6000 if under_test.dialect == "sqlite" else 3000  # about as long to project
    with lagging_ledger(under_test) as ledger:
        list(ledger.submit_many(texts(history(events, nodes=40, seed=5)), batch=1000))
    store = open_store(under_test.url)
    rng = random.Random(11)
    stops: list[int] = []
    try:
        assert projected(store) == (0, events)
        wait = 0.03  # grows while kills land before the first commit (a loaded machine)
        for _ in range(12):
            pid, stdout = spawn("project", "--batch", "200", url=under_test.url)
            time.sleep(rng.uniform(wait / 2, wait * 1.5))
            kill(pid)
            stdout.close()
            tracked, head = projected(store)
            if tracked == (stops or [0])[-1]:
                wait *= 1.5
            assert (stops or [0])[-1] <= tracked <= head == events
            stops.append(tracked)
            report = replay(store)  # the tables hold exactly the events tracked
            assert report.ok and report.position == tracked, report.differences[:5]
            if tracked == head:
                break
        assert any(0 < stop < events for stop in stops), f"no kill landed mid-way: {stops}"

        done = run("project", url=under_test.url)
        assert done.returncode == 0, done.stderr
        assert projected(store) == (events, events)
        report = replay(store)
        assert report.ok, report.differences[:5]
        assert report.position == events
        assert verify(store).ok
    finally:
        store.close()


def test_a_sqlite_write_is_synced_before_it_is_acknowledged(
    sqlite_under_test: StoreUnderTest,
) -> None:
    """A reported append survives a power loss, not only a killed process: in
    WAL mode that takes ``synchronous = FULL`` (NORMAL may lose the last
    commits)."""
    with Ledger.open(sqlite_under_test.url) as ledger, ledger.store.writing() as cursor:
        assert cursor.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        assert cursor.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
