"""Projections that follow (PostgreSQL): ``alloc-ledger project --follow``
keeps the projection tables current while other processes append, applies
every event exactly once, and resumes after ``kill -9``; queries say how far
behind the tables are, and ``--wait`` catches them up first.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import IO, Any

import pytest
from pg_support import pg_dsn
from signal_support import as_at_a_terminal

from ledger.application import Ledger
from ledger.store import open_store
from projections.projector import Projector
from projections.rows import TableSource
from scripts.simulate import generate

ROOT = Path(__file__).resolve().parents[2]


class Follower:
    """``alloc-ledger project --follow`` in its own process, its progress lines read as they come."""

    def __init__(self, url: str, batch: int, *options: str) -> None:
        open_store(url).close()  # a follower follows a ledger a writer has made
        with as_at_a_terminal():
            self.process = subprocess.Popen(
                [sys.executable, "-m", "commands", "--store", url, "project", "--follow",
                 "--batch", str(batch), "--poll", "0.5", *options],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
            )
        self.lines: list[dict[str, Any]] = []
        self._reader = threading.Thread(target=self._read, args=(self.process.stdout,))
        self._reader.start()
        self.wait_for(lambda: bool(self.lines))

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self.lines.append(json.loads(line))

    def wait_for(self, condition: Any, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            assert self.process.poll() is None, self.process.stderr.read()  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "timed out"
            time.sleep(0.05)

    @property
    def batches(self) -> list[tuple[int, int]]:
        return [(line["from"], line["to"]) for line in self.lines if "applied" in line]

    def stop(self, sig: int | None = signal.SIGINT) -> tuple[int, str]:
        """Signal the follower (None: it ends by itself) and wait for it."""
        if sig is not None:
            self.process.send_signal(sig)
        code = self.process.wait(timeout=30)
        self._reader.join()
        return code, self.process.stderr.read()  # type: ignore[union-attr]


def history_file(directory: Path, events: int, seed: int) -> Path:
    path = directory / f"history-{seed}.jsonl"
    # without client ids: every history's ids would be e0000001…, and another
    # event under a kept id is invalid
    events_of = generate(events, 40, 4, seed=seed, ids=False)
    path.write_text("".join(json.dumps(e) + "\n" for e in events_of))
    return path


def submitted(alloc_ledger: Any, url: str, path: Path) -> None:
    result = alloc_ledger("submit", str(path), "--quiet", url=url, timeout=600)
    assert result.returncode in (0, 1), result.stderr
    assert json.loads(result.stdout)["invalid"] == 0


def test_follow_keeps_the_tables_current_as_others_append(
    pg_url, tmp_path, tables, replayed, alloc_ledger
):
    read = tables(pg_url)
    follower = Follower(pg_url, batch=100)
    try:
        assert follower.lines[0] == {"following": True, "lag": 0}
        for seed in (1, 2):
            submitted(alloc_ledger, pg_url, history_file(tmp_path, 1500, seed))
            head = read.head()
            follower.wait_for(lambda: read.tracked() == head)  # noqa: B023

            assert read.snapshot() == replayed(pg_url)
    finally:
        code, errors = follower.stop()

    assert (code, errors) == (0, "")
    assert follower.lines[-1] == {"stopped": True, "lag": 0}
    assert all(to - start <= 100 for start, to in follower.batches)


def test_a_quiet_follower_prints_only_when_it_starts_and_stops(
    pg_url, tmp_path, tables, alloc_ledger
):
    """A follower run as a service printed a line per transaction (about
    110 MB a day at 200 events/s: helper-303); with --quiet, none."""
    read = tables(pg_url)
    follower = Follower(pg_url, 100, "--quiet")
    try:
        submitted(alloc_ledger, pg_url, history_file(tmp_path, 1500, 1))
        head = read.head()
        follower.wait_for(lambda: read.tracked() == head)
    finally:
        code, errors = follower.stop()
    assert (code, errors) == (0, "")
    assert follower.lines == [{"following": True, "lag": 0}, {"stopped": True, "lag": 0}]


def test_quiet_goes_with_follow(pg_url, alloc_ledger):
    refused = alloc_ledger("project", "--quiet", url=pg_url)
    assert refused.returncode == 2
    assert "--quiet goes with --follow" in refused.stderr


def test_kill_9_mid_catch_up_then_resume_applies_every_event_exactly_once(
    pg_url, tmp_path, tables, replayed, alloc_ledger
):
    submitted(alloc_ledger, pg_url, history_file(tmp_path, 20000, 5))
    read = tables(pg_url)
    head = read.head()
    follower = Follower(pg_url, batch=50)
    follower.wait_for(lambda: len(follower.batches) >= 5)

    follower.stop(signal.SIGKILL)

    stopped_at = read.tracked()
    assert 0 < stopped_at < head, "the follower finished before it was killed"
    assert stopped_at % 50 == 0
    # nothing is appended meanwhile: each line's lag is what the log holds beyond it
    assert follower.lines[0] == {"following": True, "lag": head}
    assert [line["lag"] for line in follower.lines[1:]] == [head - to for _, to in follower.batches]
    assert read.snapshot() == replayed(pg_url, upto=stopped_at)

    resumed = alloc_ledger("project", url=pg_url)

    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout) == {
        "from": stopped_at, "to": head, "applied": head - stopped_at
    }
    assert read.tracked() == head
    assert read.snapshot() == replayed(pg_url)


def test_two_followers_share_the_work_without_applying_anything_twice(
    pg_url, tmp_path, tables, replayed, alloc_ledger
):
    read = tables(pg_url)
    followers = [Follower(pg_url, batch=40), Follower(pg_url, batch=70)]
    try:
        submitted(alloc_ledger, pg_url, history_file(tmp_path, 4000, 7))
        head = read.head()
        followers[0].wait_for(lambda: read.tracked() == head)
    finally:
        stopped = [f.stop() for f in followers]

    assert stopped == [(0, ""), (0, "")]
    applied = sorted(batch for f in followers for batch in f.batches)
    assert [start for start, _ in applied] == [0] + [to for _, to in applied[:-1]]
    assert applied[-1][1] == head
    assert read.snapshot() == replayed(pg_url)


def test_a_query_says_how_far_behind_the_tables_are_and_wait_catches_up(
    pg_url, alloc_ledger
):
    for node in ("n1", "n2", "n3"):
        assert alloc_ledger("submit", "node-registered", "--node", node, url=pg_url).returncode == 0

    behind = alloc_ledger("query", "nodes", "--format", "table", url=pg_url)
    as_json = alloc_ledger("query", "nodes", "--format", "json", url=pg_url)
    caught_up = alloc_ledger("query", "nodes", "--format", "table", "--wait", url=pg_url)

    lag = "lag: 3 positions behind the log (the answer is as of position 0 of 3)\n"
    assert (behind.returncode, behind.stderr, behind.stdout) == (0, lag, "(none)\n")
    assert (as_json.stderr, json.loads(as_json.stdout)) == (lag, [])
    assert caught_up.stderr == ""
    assert [line.split()[0] for line in caught_up.stdout.splitlines()] == ["node", "n1", "n2", "n3"]


def test_what_lagging_tables_do_not_hold_yet_is_not_in_the_ledger_at_their_position(
    pg_url, alloc_ledger
):
    """The log names a1 and n1 but the tables have not applied them: a lookup
    says so of the tables' position, which the lag line names, not of the
    ledger as a whole (as if the name were mistyped)."""
    for args in (["node-registered", "--node", "n1"], ["heartbeat", "--node", "n1"],
                 ["alloc-placed", "--alloc", "a1", "--node", "n1", "--job", "web"]):
        assert alloc_ledger("submit", *args, url=pg_url).returncode == 0
    lag = "lag: 3 positions behind the log (the answer is as of position 0 of 3)\n"

    for args, error in [
        (["alloc", "a1"], "allocation a1 is not in the ledger at position 0"),
        (["allocs", "--node", "n1"], "node n1 is not in the ledger at position 0"),
        (["allocs", "--job", "web"], "no allocation of job web is in the ledger at position 0"),
        (["slots", "--node", "n1"], "node n1 is not in the ledger at position 0"),
    ]:
        done = alloc_ledger("query", *args, url=pg_url)
        assert (done.returncode, done.stderr) == (1, f"{lag}Error: {error}\n"), args

    found = alloc_ledger("query", "alloc", "a1", "--wait", url=pg_url)
    assert (found.returncode, found.stderr) == (0, "")
    assert [h["position"] for h in json.loads(found.stdout)["history"]] == [3]


def test_a_query_reads_one_snapshot_so_its_lag_matches_its_rows(pg_url, alloc_ledger, project):
    """A follower that commits while a query reads changes neither the
    position the query reports nor the rows it answers with."""
    for node in ("n1", "n2", "n3"):
        assert alloc_ledger("submit", "node-registered", "--node", node, url=pg_url).returncode == 0
    store = open_store(pg_url)
    try:
        with store.reading() as cursor:
            head, tracked = store.head(cursor), store.tracked(cursor)
            project(pg_url)  # a follower commits meanwhile
            cursor.execute("SELECT count(*) FROM nodes")
            nodes = cursor.fetchone()[0]
    finally:
        store.close()

    assert (head, tracked, nodes) == (3, 0, 0)


def test_sqlite_queries_are_always_current(tmp_path, alloc_ledger):
    url = f"sqlite:///{tmp_path}/l.db"
    alloc_ledger("submit", "node-registered", "--node", "n1", url=url)

    answer = alloc_ledger("query", "nodes", "--format", "table", url=url)

    assert answer.stderr == ""
    assert answer.stdout.splitlines()[1].split()[0] == "n1"


@pytest.mark.parametrize("batch", [1, 1000])
def test_project_applies_in_batches_and_reports_the_span(pg_url, alloc_ledger, tables, batch):
    for node in ("n1", "n2", "n3"):
        alloc_ledger("submit", "node-registered", "--node", node, url=pg_url)

    done = alloc_ledger("project", "--batch", str(batch), url=pg_url)
    again = alloc_ledger("project", url=pg_url)

    assert json.loads(done.stdout) == {"from": 0, "to": 3, "applied": 3}
    assert json.loads(again.stdout) == {"from": 3, "to": 3, "applied": 0}
    assert tables(pg_url).tracked() == 3


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_follow_on_sqlite_polls_and_stops_cleanly(tmp_path, sig):
    url = f"sqlite:///{tmp_path}/l.db"
    follower = Follower(url, batch=10)

    code, errors = follower.stop(sig)

    assert (code, errors) == (0, "")
    assert follower.lines == [{"following": True, "lag": 0}, {"stopped": True, "lag": 0}]


def terminate(pg_admin: Any, application: str) -> int:
    """End every server connection of one application, as a restart would."""
    return len(pg_admin(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        f"WHERE application_name = '{application}'"))


def test_a_follower_whose_connections_are_cut_reconnects_and_goes_on(
    pg_url, pg_schema, pg_admin, tmp_path, tables, replayed, alloc_ledger
):
    application = f"follower_{pg_schema}"
    read = tables(pg_url)
    follower = Follower(f"{pg_url}&application_name={application}", batch=100)
    try:
        submitted(alloc_ledger, pg_url, history_file(tmp_path, 500, 11))
        head = read.head()
        follower.wait_for(lambda: read.tracked() == head)

        assert terminate(pg_admin, application) >= 1  # its listener at least
        submitted(alloc_ledger, pg_url, history_file(tmp_path, 500, 12))  # while it is lost
        follower.wait_for(lambda: any(line.get("reconnected") for line in follower.lines))
        submitted(alloc_ledger, pg_url, history_file(tmp_path, 500, 13))  # once it is back
        head = read.head()
        follower.wait_for(lambda: read.tracked() == head)

        assert read.snapshot() == replayed(pg_url)
    finally:
        code, errors = follower.stop()

    assert code == 0
    warning, = errors.splitlines()
    assert warning.startswith(f"warning: store {pg_url}&application_name={application}: ")
    assert warning.endswith("; reconnecting in 1 s")
    assert sum(1 for line in follower.lines if line.get("reconnected")) == 1
    applied = sorted(follower.batches)
    assert [start for start, _ in applied] == [0] + [to for _, to in applied[:-1]]


def test_a_follower_told_not_to_reconnect_exits_3_when_its_connections_are_cut(
    pg_url, pg_schema, pg_admin, alloc_ledger
):
    application = f"follower_{pg_schema}"
    follower = Follower(f"{pg_url}&application_name={application}", 100, "--no-reconnect")
    assert terminate(pg_admin, application) >= 1
    alloc_ledger("submit", "node-registered", "--node", "n1", url=pg_url)  # wakes it if need be

    code, errors = follower.stop(None)

    assert code == 3
    error, = errors.splitlines()
    assert error.startswith(f"Error: store {pg_url}&application_name={application}: ")


def test_a_follower_on_a_schema_without_a_ledger_exits_3_and_makes_nothing(
    pg_url, pg_schema, pg_admin
):
    """A mistyped schema must not become an empty ledger followed "at lag 0" forever."""
    done = subprocess.run(
        [sys.executable, "-m", "commands", "--store", pg_url, "project", "--follow"],
        capture_output=True, text=True, timeout=60, cwd=ROOT, check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert (done.returncode, done.stdout) == (3, "")
    assert done.stderr.startswith("Error: cannot open store ") and "there is no ledger" in done.stderr
    assert done.stderr.count("\n") == 1
    assert pg_admin(f"SELECT count(*) FROM pg_namespace WHERE nspname = '{pg_schema}'") == [(0,)]


def test_query_wait_behind_a_stuck_follower_gives_up_after_the_timeout(
    pg_url, pg_schema, tmp_path, alloc_ledger
):
    """A follower stopped inside its transaction holds the projection tables:
    --wait waits the URL's timeout for them, then says so (exit 3)."""
    submitted(alloc_ledger, pg_url, history_file(tmp_path, 50, 3))  # the tables lag
    import psycopg

    with psycopg.connect(str(pg_dsn())) as stuck:  # as a follower's transaction, stopped
        stuck.execute(f"SELECT * FROM {pg_schema}.tracking WHERE application_name = "
                      "'projections' FOR UPDATE")
        started = time.monotonic()
        done = alloc_ledger("query", "nodes", "--wait", url=f"{pg_url}&timeout=1")
        waited = time.monotonic() - started
        stuck.rollback()

    assert (done.returncode, done.stdout) == (3, "")
    assert done.stderr == (
        f"Error: store {pg_url}&timeout=1: gave up waiting for a lock after 1 s (the projection "
        "tables', most likely: a projector's transaction holds them, maybe stopped or stuck); "
        "nothing of this transaction was written\n")
    assert waited < 30
    assert alloc_ledger("query", "nodes", "--wait", url=pg_url).returncode == 0  # once it is gone


def test_query_wait_beside_a_follower_mid_catch_up_applies_nothing_twice(
    pg_url, pg_admin, tmp_path, tables, replayed, alloc_ledger
):
    """--wait catches the tables up in a transaction that takes the tracking
    row first: it waits for a follower's catch-up in flight, then goes on from
    where that left them."""
    submitted(alloc_ledger, pg_url, history_file(tmp_path, 1500, 4))
    read = tables(pg_url)
    head = read.head()
    follower = open_store(pg_url)
    try:
        with follower.projecting() as cursor:
            assert Projector(follower).catch_up(cursor, limit=1000) == 1000
            query = subprocess.Popen(
                [sys.executable, "-m", "commands", "--store", pg_url, "query", "nodes",
                 "--wait", "--format", "json"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
            )
            blocks = ("SELECT pid FROM pg_stat_activity WHERE "
                      f"{cursor.connection.info.backend_pid} = ANY(pg_blocking_pids(pid))")
            deadline = time.monotonic() + 30
            while not pg_admin(blocks):  # the query waits for this transaction
                assert query.poll() is None, query.communicate()
                assert time.monotonic() < deadline, "the query did not wait"
                time.sleep(0.05)
    finally:
        follower.close()
    out, err = query.communicate(timeout=60)

    assert (query.returncode, err) == (0, "")
    assert len(json.loads(out)) == read.value("SELECT count(*) FROM nodes")
    assert read.tracked() == head
    assert read.snapshot() == replayed(pg_url)


def test_a_follower_wakes_on_its_own_schemas_appends_not_on_anothers(pg_url):
    """Each schema is a ledger of its own: appends to another schema in the
    same database do not wake this one's followers (the library's channel
    is named after the table alone, the same in every schema)."""
    import psycopg  # only where PostgreSQL is

    dsn = pg_dsn()
    assert dsn is not None
    schema = f"t_{uuid.uuid4().hex[:16]}"
    other = f"{dsn}{'&' if '?' in dsn else '?'}schema={schema}"
    try:
        with Ledger.open(pg_url) as mine, Ledger.open(other) as theirs:
            for ledger in (mine, theirs):
                assert ledger.submit({"type": "node-registered", "node": "n1"}).ok
            with mine.store.appends() as wait:  # type: ignore[attr-defined]
                assert theirs.submit({"type": "heartbeat", "node": "n1"}).ok
                assert wait(1.0) is False
                assert mine.submit({"type": "heartbeat", "node": "n1"}).ok
                assert wait(10.0) is True
    finally:
        with psycopg.connect(dsn, autocommit=True) as connection:
            connection.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def test_a_catch_up_loads_what_a_page_names_at_once_not_one_by_one(
    pg_url, replayed, tables, monkeypatch
):
    """A follower on a cluster of many nodes: what each page of the log names
    is loaded in one round trip, not node by node (a round trip each made
    10,000 nodes' heartbeats project at 1,400 events/s)."""
    nodes = 300
    with Ledger.open(pg_url) as ledger:
        ledger.submit_batch(
            [{"type": "node-registered", "node": f"n{i}", "slots": 1} for i in range(nodes)])
        ledger.project()
        beats = [{"type": "heartbeat", "node": f"n{(i * 7) % nodes}"} for i in range(2 * nodes)]
        beats.append({"type": "alloc-placed", "alloc": "a1", "node": "n1", "slot": 0,
                      "addresses": ["10.0.0.1"]})
        ledger.submit_batch(beats)
    one_by_one = []
    for load in ("load_node", "load_slots", "load_alloc", "load_address",
                 "load_live_allocs", "load_children"):
        original = getattr(TableSource, load)

        def counted(source, key, original=original, load=load):
            one_by_one.append((load, key))
            return original(source, key)

        monkeypatch.setattr(TableSource, load, counted)
    with Ledger.open(pg_url) as ledger:
        assert ledger.project() == (nodes, 3 * nodes + 1)
    assert one_by_one == []
    live = tables(pg_url)
    assert [r["node"] for r in live.rows("SELECT node FROM slots WHERE alloc = ?", "a1")] == ["n1"]
    assert live.rows("SELECT COUNT(*) AS n FROM nodes WHERE status = ?", "ready") == [{"n": nodes}]
    assert live.snapshot() == replayed(pg_url)
