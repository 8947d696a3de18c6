"""Store faults: a read-only file, a locked database, a full disk, PostgreSQL
going away mid-stream. Each ends with exit 3 and one clear line, and no
event that ``submit`` acknowledged is lost (nor any batch half-written)."""

from __future__ import annotations

import json
import os
import resource
import shutil
import sqlite3
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import pytest
from audit_support import (
    CLI,
    PG,
    StoreUnderTest,
    history,
    jsonl,
    one_line_error,
    results,
    run,
    sqlite_store,
    texts,
)
from cli_support import bound_by_file_modes

from ledger.application import Ledger
from ledger.chain import verify
from ledger.store import open_store
from projections.replay import replay


def acknowledged_are_kept(
    target: StoreUnderTest, events: list[dict[str, Any]], reports: list[dict[str, Any]]
) -> int:
    """Every appended or rejected report names the position its event is kept
    at; the log holds nothing else. Returns the head."""
    stored = dict(target.sql("SELECT originator_version, state FROM stored_events"))
    kept = [r for r in reports if r["status"] in ("appended", "rejected")]
    for report in kept:
        state = json.loads(bytes(stored[report["position"]]))
        assert state["event"]["id"] == events[report["line"] - 1]["id"], report
    assert sorted(stored) == [r["position"] for r in kept], "nothing but acknowledged events"
    return len(stored)


def resubmitted_cleanly(target: StoreUnderTest, stream: Path, acked: int, total: int) -> None:
    """Once the fault is gone, the whole stream again: the acknowledged events
    are duplicates, the rest appended, and the tables prove out."""
    again = run("submit", str(stream), "--quiet", url=target.url)
    assert again.returncode in (0, 1), again.stderr
    counts = json.loads(again.stdout)
    assert counts["duplicate"] == acked
    assert counts["appended"] + counts["rejected"] == total - acked
    store = open_store(target.url)
    try:
        assert verify(store).ok
        assert replay(store).ok
    finally:
        store.close()


# -- a read-only file -----------------------------------------------------------


@contextmanager
def unchangeable(path: Path) -> Iterator[None]:
    """Make a file or folder immutable (``chattr +i``): no process may change it."""
    if os.geteuid() != 0 or not shutil.which("chattr"):
        pytest.skip("only root can make a file immutable (chattr +i)")
    if subprocess.run(["chattr", "+i", str(path)], capture_output=True, check=False).returncode:
        pytest.skip("chattr +i is not available on this file system")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)


@contextmanager
def read_only(path: Path) -> Iterator[None]:
    """Make a file read-only, even for root (immutable when running as root)."""
    if os.geteuid() != 0:
        path.chmod(0o444)
        try:
            yield
        finally:
            path.chmod(0o644)
        return
    if not shutil.which("chattr") or subprocess.run(
        ["chattr", "+i", str(path)], capture_output=True, check=False
    ).returncode:
        pytest.skip("running as root where chattr +i is not available: cannot make a file read-only")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)


def test_a_read_only_store_exits_3_and_keeps_its_log(tmp_path: Path) -> None:
    target = sqlite_store(tmp_path)
    events = history(60)
    with Ledger.open(target.url) as ledger:
        list(ledger.submit_many(texts(events[:30])))
    stream = tmp_path / "stream.jsonl"
    stream.write_bytes(jsonl(events))

    with read_only(target.path):  # type: ignore[arg-type]
        refused = run("submit", str(stream), url=target.url)

    assert refused.returncode == 3
    assert "not writable" in one_line_error(refused.stderr)
    assert refused.stdout == b""
    assert target.sql("SELECT COUNT(*) FROM stored_events")[0][0] == 30
    resubmitted_cleanly(target, stream, 30, 60)


@pytest.mark.parametrize("where", ["the file", "the file and its folder"])
def test_reading_commands_read_a_ledger_no_process_may_change(tmp_path: Path, where: str) -> None:
    """An auditor's copy that no process may change (read-only media)."""
    folder, target, expected = evidence(tmp_path)
    kept = target.path.read_bytes()  # type: ignore[union-attr]

    with unchangeable(target.path), (  # type: ignore[arg-type]
            unchangeable(folder) if where != "the file" else nullcontext()):
        answered = {args: run(*args, url=target.url) for args in READING}
        replayed = run("replay", url=target.url)
        submitted = run("submit", "heartbeat", "--node", "n1", url=target.url)

    answered_as_before(answered, expected)
    assert replayed.returncode == 3
    assert one_line_error(replayed.stderr).endswith(
        "is not writable, and this command writes into the store "
        "(copy the file somewhere writable first)")
    assert submitted.returncode == 3 and "is not writable" in one_line_error(submitted.stderr)
    assert target.path.read_bytes() == kept  # type: ignore[union-attr]
    if where != "the file":  # and nothing made beside it, where nothing may be
        assert [p.name for p in folder.iterdir()] == ["ledger.db"]


Answers = dict[tuple[str, ...], Any]


def evidence(tmp_path: Path) -> tuple[Path, StoreUnderTest, Answers]:
    """A folder holding a ledger of 60 events, the ledger, and what each
    reading command answers while it may still be written."""
    folder = tmp_path / "evidence"
    folder.mkdir()
    target = sqlite_store(folder)
    with Ledger.open(target.url) as ledger:
        list(ledger.submit_many(texts(history(60))))
    expected = {args: run(*args, url=target.url) for args in READING}
    assert all(done.returncode == 0 for done in expected.values())
    return folder, target, expected


def answered_as_before(answered: Answers, expected: Answers) -> None:
    """Each reading command answered, and as it did before the file was locked."""
    for args, done in answered.items():
        assert done.returncode == 0, (args, done.stderr)
        assert timeless(done.stdout) == timeless(expected[args].stdout), args


def timeless(printed: bytes) -> Any:
    """An answer without how long it took (verify's seconds and rate)."""
    if not printed.startswith(b"{"):
        return printed
    answer = json.loads(printed)
    return {k: v for k, v in answer.items() if k not in ("seconds", "events_per_second")}


def as_another_user(*args: str, url: str) -> subprocess.CompletedProcess[bytes]:
    """A reading command as a user who may read the file but not write it
    (root without the capability to override file modes)."""
    if os.geteuid() != 0:
        return run(*args, url=url)
    return subprocess.run(  # noqa: PLW1510 - the exit code is what the test judges
        bound_by_file_modes([*CLI, "--store", url, *args]), capture_output=True, timeout=60)


def test_another_user_s_ledger_is_read_through_its_writer_s_wal_or_refused(
    tmp_path: Path,
) -> None:
    """A reader that made the WAL files itself would shut the owner out."""
    if os.geteuid() != 0:
        pytest.skip("only root can give a file to another user")
    target = sqlite_store(tmp_path)
    with Ledger.open(target.url) as ledger:
        list(ledger.submit_many(texts(history(60))))
    assert target.path is not None
    os.chown(target.path, NOBODY, NOBODY)  # its owner may write it (0644); the reader not
    try:
        refused = as_another_user("query", "nodes", url=target.url)
        assert refused.returncode == 3
        assert one_line_error(refused.stderr).endswith(
            "is not writable by this user, and no writer has it open: reading it would leave "
            "files beside it that its owner could not write; read it as its owner, or read "
            "a copy")
        assert sorted(p.name for p in tmp_path.iterdir()) == ["ledger.db"]

        writer = sqlite3.connect(target.path)  # the owner has it open: its WAL is there
        try:
            writer.execute("SELECT COUNT(*) FROM nodes").fetchone()
            read = as_another_user("verify", "--format", "json", url=target.url)
            assert read.returncode == 0, read.stderr
            assert json.loads(read.stdout)["verified"] == 60
            # Through a symbolic link in another folder: the WAL is beside the file it leads to.
            (tmp_path / "links").mkdir()
            (tmp_path / "links" / "link.db").symlink_to(target.path)
            linked = as_another_user("verify", "--format", "json",
                                     url=f"sqlite:///{tmp_path / 'links' / 'link.db'}")
            assert linked.returncode == 0, linked.stderr
            assert json.loads(linked.stdout)["verified"] == 60
        finally:
            writer.close()
    finally:
        os.chown(target.path, 0, 0)


NOBODY = 65534


@pytest.mark.parametrize("where", ["the file", "the file and its folder"])
def test_a_ledger_no_one_may_write_is_read_as_it_is(tmp_path: Path, where: str) -> None:
    """``chmod a-w``: an auditor's read-only copy, read by its owner (who
    may not write it either), with nothing made beside it."""
    folder, target, expected = evidence(tmp_path)
    assert target.path is not None
    target.path.chmod(0o444)
    if where != "the file":
        folder.chmod(0o555)
    try:
        answered = {args: as_another_user(*args, url=target.url) for args in READING}
        submitted = as_another_user("submit", "heartbeat", "--node", "n1", url=target.url)
    finally:
        folder.chmod(0o755)
        target.path.chmod(0o644)

    answered_as_before(answered, expected)
    assert submitted.returncode == 3 and "is not writable" in one_line_error(submitted.stderr)
    assert sorted(p.name for p in folder.iterdir()) == ["ledger.db"]


READING = [
    ("query", "nodes", "--format", "json"),
    ("query", "nodes", "--as-of", "30", "--format", "json"),
    ("verify", "--format", "json"),
    ("digest",),
    ("audit", "--format", "json"),
]


def test_a_writable_ledger_in_a_folder_this_user_may_not_write_is_named_so(
    tmp_path: Path,
) -> None:
    """``chmod 555`` on the folder, the file still writable: SQLite can make
    no WAL file beside it, and says ``attempt to write a readonly database``
    of a file this user may write (helper-403). The line should point at the
    folder, as it does for ``chattr +i`` (docs/sqlite.md)."""
    folder = tmp_path / "shut"
    folder.mkdir()
    target = sqlite_store(folder)
    with Ledger.open(target.url) as ledger:
        list(ledger.submit_many(texts(history(20))))
    folder.chmod(0o555)
    try:
        for args in (("query", "nodes"), ("submit", "heartbeat", "--node", "n1")):
            refused = as_another_user(*args, url=target.url)
            assert refused.returncode == 3, refused.stderr
            line = one_line_error(refused.stderr)
            assert f"may this user create files in {folder}?" in line, line
    finally:
        folder.chmod(0o755)


def test_wal_files_this_user_may_not_write_end_a_stream_of_many_batches_with_exit_3(
    tmp_path: Path,
) -> None:
    """WAL files beside the ledger that its owner may not write (made by a
    reader of another user, docs/sqlite.md): a one-shot submit exits 3; a
    stream of more than one batch waited for good (helper-403)."""
    target = sqlite_store(tmp_path)
    with Ledger.open(target.url) as ledger:
        list(ledger.submit_many(texts(history(20))))
    path: Path = target.path  # type: ignore[assignment]
    for end in ("-wal", "-shm"):
        Path(f"{path}{end}").write_bytes(b"")
        Path(f"{path}{end}").chmod(0o444)
    stream = tmp_path / "stream.jsonl"
    stream.write_bytes(jsonl(history(50)))
    argv = bound_by_file_modes(
        [*CLI, "--store", target.url, "submit", str(stream), "--batch", "10"])
    try:
        refused = subprocess.run(argv, capture_output=True, timeout=30, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail("submit of several batches hangs where it may not write the WAL files")
    assert refused.returncode == 3
    one_line_error(refused.stderr)


# -- a locked database --------------------------------------------------------------


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """Another process's write transaction holds the database."""
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        yield
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_a_locked_database_exits_3_after_the_timeout(tmp_path: Path) -> None:
    target = sqlite_store(tmp_path)
    open_store(target.url).close()
    stream = tmp_path / "stream.jsonl"
    stream.write_bytes(jsonl(history(50)))

    with locked(target.path):  # type: ignore[arg-type]
        started = time.monotonic()
        refused = run("submit", str(stream), url=f"{target.url}?timeout=1")
        waited = time.monotonic() - started

    assert refused.returncode == 3
    assert "locked" in one_line_error(refused.stderr)
    assert waited < 8
    assert target.sql("SELECT COUNT(*) FROM stored_events")[0][0] == 0
    resubmitted_cleanly(target, stream, 0, 50)


def test_a_locked_database_ends_a_stream_of_many_batches_with_exit_3(tmp_path: Path) -> None:
    """As above, with more than one batch: the first, decided in the writer
    thread, never begins its transaction, and the next waits to be decided
    after it (helper-403: it waited for good, SIGTERM too, and a second
    SIGTERM was needed)."""
    target = sqlite_store(tmp_path)
    open_store(target.url).close()
    stream = tmp_path / "stream.jsonl"
    stream.write_bytes(jsonl(history(50)))

    with locked(target.path):  # type: ignore[arg-type]
        try:
            refused = run("submit", str(stream), "--batch", "10", url=f"{target.url}?timeout=1",
                          timeout=20)
        except subprocess.TimeoutExpired:
            pytest.fail("submit of several batches hangs on a locked database")

    assert refused.returncode == 3
    assert "locked" in one_line_error(refused.stderr)
    assert target.sql("SELECT COUNT(*) FROM stored_events")[0][0] == 0
    resubmitted_cleanly(target, stream, 0, 50)


class Producer:
    """A slow producer talking to ``submit -``: one line, then its answer."""

    def __init__(self, url: str, env: dict[str, str] | None = None) -> None:
        self.process = subprocess.Popen(
            [*CLI, "--store", url, "submit", "-"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=None if env is None else os.environ | env,
        )
        self.reports: list[dict[str, Any]] = []

    def send(self, event: dict[str, Any]) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps(event).encode() + b"\n")
        self.process.stdin.flush()
        report = json.loads(self.process.stdout.readline())
        self.reports.append(report)
        return report

    def finish(self, events: list[dict[str, Any]]) -> tuple[int, bytes]:
        """Send the rest without waiting; return (exit code, stderr)."""
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(jsonl(events))
            self.process.stdin.close()
        except BrokenPipeError:
            pass
        assert self.process.stdout is not None and self.process.stderr is not None
        stdout, stderr = self.process.stdout.read(), self.process.stderr.read()
        self.reports += results(stdout)
        return self.process.wait(timeout=60), stderr


def test_a_lock_taken_mid_stream_exits_3_and_keeps_what_was_acknowledged(
    tmp_path: Path,
) -> None:
    target = sqlite_store(tmp_path)
    events = history(40)
    producer = Producer(f"{target.url}?timeout=1")
    for event in events[:5]:
        assert producer.send(event)["status"] == "appended"

    with locked(target.path):  # type: ignore[arg-type]
        code, stderr = producer.finish(events[5:])

    assert code == 3
    assert "locked" in one_line_error(stderr)
    assert acknowledged_are_kept(target, events, producer.reports) == 5
    stream = tmp_path / "stream.jsonl"
    stream.write_bytes(jsonl(events))
    resubmitted_cleanly(target, stream, 5, 40)


@pytest.mark.parametrize("how", ["removed", "replaced"])
def test_a_store_file_removed_or_replaced_mid_stream_is_not_written_on(
    tmp_path: Path, how: str,
) -> None:
    """The store's file removed (``rm``) or replaced (a backup moved over it)
    while ``submit -`` runs: later events must not be reported appended into
    a file no path leads to any more, nor through the old file's WAL files
    into the new one (helper-403: they were, exit 0, and lost)."""
    target = sqlite_store(tmp_path)
    events = history(40)
    producer = Producer(target.url)
    for event in events[:5]:
        assert producer.send(event)["status"] == "appended"
    path: Path = target.path  # type: ignore[assignment]
    if how == "removed":
        path.unlink()
    else:
        other = tmp_path / "other.db"
        shutil.copyfile(path, other)  # as a backup taken a moment ago would be
        other.replace(path)

    code, stderr = producer.finish(events[5:])

    assert code == 3, producer.reports[5:7]
    one_line_error(stderr)
    assert [r["status"] for r in producer.reports[5:]] == []


def test_a_ledger_opened_by_a_relative_path_is_written_after_the_process_changes_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``Ledger.open()`` takes ./alloc-ledger.db by default; a service that
    opens it and then changes folder (a daemon's chdir("/")) writes on into
    the file it opened: the path is the one it had when opened, not one
    read again in the new folder (helper-406: "… other/alloc-ledger.db was
    removed while this process had it open", naming a file that never was
    the store; a second connection made an empty one there)."""
    other = tmp_path / "other"
    other.mkdir()
    monkeypatch.chdir(tmp_path)
    with Ledger.open("sqlite:///alloc-ledger.db") as ledger:
        assert ledger.submit({"type": "node-registered", "node": "n1"}).ok
        monkeypatch.chdir(other)
        assert ledger.submit({"type": "heartbeat", "node": "n1"}).ok
        receipts = list(ledger.submit_many([{"type": "heartbeat", "node": "n1"}] * 30, batch=10))
        assert [r.status for r in receipts] == ["appended"] * 30
    assert list(other.iterdir()) == []
    with closing_store(f"sqlite:///{tmp_path}/alloc-ledger.db") as store, store.reading() as cursor:
        assert store.head(cursor) == 32


def test_a_path_through_a_link_then_up_opens_the_file_the_system_names(tmp_path: Path) -> None:
    """``folder/link/../s.db``: the system goes up from where the link leads
    (as SQLite and every other tool do), not lexically from ``folder``; the
    checks and the connections open one file (helper-409: the connections
    opened ``folder/s.db`` while the checks saw the ledger beside the link's
    target: a reading command answered an empty ledger at position 0, and
    left a new empty file)."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b" / "c").mkdir(parents=True)
    (tmp_path / "a" / "lnk").symlink_to(tmp_path / "b" / "c")
    with Ledger.open(f"sqlite:///{tmp_path}/b/s.db") as ledger:
        assert ledger.submit({"type": "node-registered", "node": "n1"}).ok
    with closing_store(f"sqlite:///{tmp_path}/a/lnk/../s.db") as store, store.reading() as cursor:
        assert store.head(cursor) == 1
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["lnk"]


def test_a_file_name_holding_percent_00_is_not_a_nul(tmp_path: Path) -> None:
    """A SQLite URL's path is read as written (not unquoted): ``x%00.db``
    names a file of that name, which holds no NUL character."""
    store = open_store(f"sqlite:///{tmp_path}/x%00.db")
    store.close()
    assert (tmp_path / "x%00.db").exists()


@contextmanager
def closing_store(url: str) -> Iterator[Any]:
    store = open_store(url, create=False)
    try:
        yield store
    finally:
        store.close()


# -- a full disk ---------------------------------------------------------------------


@contextmanager
def tiny_filesystem(folder: Path) -> Iterator[Callable[[], None]]:
    """A 1 MiB tmpfs (root only); yields a function that makes it roomy again."""
    folder.mkdir()
    if os.geteuid() != 0 or subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(folder)],
        capture_output=True, check=False,
    ).returncode:
        pytest.skip("cannot mount a tiny tmpfs here (needs root); the file size limit "
                    "variant of this test still runs")

    def grow() -> None:
        subprocess.run(["mount", "-o", "remount,size=64m", str(folder)], check=True)

    try:
        yield grow
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def file_size_limit(limit: int) -> Callable[[], None]:
    """For a child process: writes past ``limit`` bytes fail (EFBIG), as on a full disk."""
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


@contextmanager
def full_disk(
    tmp_path: Path, fault: str
) -> Iterator[tuple[StoreUnderTest, Any, Callable[[], None]]]:
    """A store whose disk fills up: (the store, a child's preexec_fn, make room)."""
    if fault == "tiny tmpfs":
        with tiny_filesystem(tmp_path / "small") as grow:
            target = sqlite_store(tmp_path / "small")
            open_store(target.url).close()
            yield target, None, grow
        return
    target = sqlite_store(tmp_path)
    open_store(target.url).close()
    size = target.path.stat().st_size  # type: ignore[union-attr]
    yield target, file_size_limit(size + 600_000), lambda: None


LATER_MAY_BE_KEPT = ("later ones may be kept too (resubmit with ids to learn which: kept "
                     "ones answer duplicate)")


@pytest.mark.parametrize(("fault", "error", "later"), [
    # ENOSPC, as SQLite words it: the commit that found no room kept nothing
    ("tiny tmpfs", ("database or disk is full (the file system holding {folder} has 0 "
                    "bytes free)"), "no later line was kept"),
    # EFBIG: an I/O error of a COMMIT may come after its commit frame was written
    ("file size limit", "disk I/O error", LATER_MAY_BE_KEPT),
])
def test_a_full_disk_exits_3_and_keeps_every_acknowledged_batch(
    tmp_path: Path, fault: str, error: str, later: str
) -> None:
    events = history(6000, nodes=60)
    stream = tmp_path / "stream.jsonl"
    stream.write_bytes(jsonl(events))
    with full_disk(tmp_path, fault) as (target, limit, grow):
        full = run("submit", str(stream), "--batch", "100", url=target.url, preexec_fn=limit)
        assert full.returncode == 3, full.stderr
        line = one_line_error(full.stderr)
        reports = results(full.stdout)
        statuses = Counter(report["status"] for report in reports)
        error = error.format(folder=tmp_path / "small")
        assert line == (  # the store's error, then how far the stream got
            f"Error: store {target.url}: {error}; every line up to {reports[-1]['line']} was "
            f"decided and is kept as decided ({statuses['appended']} appended, 0 duplicate, "
            f"{statuses['rejected']} rejected, 0 invalid); {later}")
        acked = acknowledged_are_kept(target, events, reports)
        assert 0 < acked < len(events)
        grow()
        resubmitted_cleanly(target, stream, acked, len(events))


def filled_up_to(folder: Path, left: int) -> None:
    """Fill ``folder``'s file system until ``left`` bytes stay free."""
    found = os.statvfs(folder)
    free = found.f_bavail * found.f_frsize
    (folder / "filler").write_bytes(b"\0" * (free - left))


def test_a_one_shot_or_a_first_batch_that_finds_no_room_says_nothing_was_kept(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "small"
    with tiny_filesystem(folder):
        target = sqlite_store(folder)
        assert run("submit", "node-registered", "--node", "n1", url=target.url).returncode == 0
        # room for the -shm file (32 KiB), not for the commit's WAL frames
        filled_up_to(folder, 36 << 10)
        no_room = (f"Error: store {target.url}: database or disk is full (the file system "
                   f"holding {folder} has ")

        one = run("submit", "heartbeat", "--node", "n1", url=target.url)
        assert one.returncode == 3, one.stderr
        assert one_line_error(one.stderr).startswith(no_room)
        assert one_line_error(one.stderr).endswith(" bytes free); the event was not kept")

        stream = run("submit", "-", url=target.url, stdin=jsonl(history(50)))
        assert stream.returncode == 3, stream.stderr
        assert stream.stdout == b""
        assert one_line_error(stream.stderr).endswith(" bytes free); no line was kept")

        (folder / "filler").unlink()
        assert run("digest", url=target.url).stdout.startswith(b"1:")  # kept nothing


def test_a_reader_on_a_full_disk_is_told_the_disk_is_full(tmp_path: Path) -> None:
    folder = tmp_path / "small"
    with tiny_filesystem(folder):
        target = sqlite_store(folder)
        assert run("submit", "node-registered", "--node", "n1", url=target.url).returncode == 0
        filled_up_to(folder, 0)  # no room for the -shm file a reader makes too

        digest = run("digest", url=target.url)
        assert digest.returncode == 3
        assert one_line_error(digest.stderr) == (
            f"Error: store {target.url}: disk I/O error (the file system holding {folder} "
            "has 0 bytes free)")


# -- PostgreSQL going away --------------------------------------------------------------


def test_an_unreachable_postgresql_exits_3_with_one_line(tmp_path: Path) -> None:
    stream = tmp_path / "stream.jsonl"
    stream.write_bytes(jsonl(history(3)))
    refused = run("submit", str(stream), url="postgresql://postgres@127.0.0.1:1/test")
    assert refused.returncode == 3
    assert "unreachable" in one_line_error(refused.stderr)


@pytest.mark.postgres
def test_postgresql_going_away_mid_stream_exits_3_and_keeps_what_was_acknowledged(
    pg_under_test: StoreUnderTest, tmp_path: Path
) -> None:
    import psycopg

    name = f"alloc_ledger_audit_{uuid.uuid4().hex[:8]}"
    url = f"{pg_under_test.url}&application_name={name}"
    target = StoreUnderTest(url, "postgresql", schema=pg_under_test.schema)
    events = history(40)
    producer = Producer(url)
    for event in events[:5]:
        assert producer.send(event)["status"] == "appended"

    with psycopg.connect(PG.split("?", 1)[0], autocommit=True) as admin:  # type: ignore[union-attr]
        ended = admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
            (name,),
        ).fetchall()
    assert ended, "the submit's connections should have been found"
    code, stderr = producer.finish(events[5:])

    assert code == 3, stderr
    one_line_error(stderr)
    assert acknowledged_are_kept(target, events, producer.reports) == 5
    stream = tmp_path / "stream.jsonl"
    stream.write_bytes(jsonl(events))
    resubmitted_cleanly(target, stream, 5, 40)
