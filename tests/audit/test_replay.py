"""Replay proves the projection tables: it rebuilds them from the log into
scratch tables, names every row that differs, and never touches the live
tables."""

from __future__ import annotations

import fcntl
import json
import subprocess
import sys
import textwrap
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from audit_support import StoreUnderTest, history, one_line_error, run, sqlite_store, texts

from ledger.application import Ledger
from ledger.store import open_store, scratch_prefix
from projections import replay as replaying
from projections.asof import AsOf
from projections.replay import KEYS
from projections.tables import TABLES

EVENTS = 1500


def told(target: StoreUnderTest, events: int = EVENTS, project: bool = True) -> None:
    """A simulated history submitted in batches, the projections brought up to date."""
    with Ledger.open(target.url) as ledger:
        receipts = list(ledger.submit_many(texts(history(events, nodes=30)), batch=200))
        assert {r.status for r in receipts} <= {"appended", "rejected"}
        if project:
            ledger.project()


def live_tables(target: StoreUnderTest) -> dict[str, list[tuple[Any, ...]]]:
    return {t: sorted(target.sql(f"SELECT * FROM {t}"), key=repr) for t in TABLES}


def scratch_tables(target: StoreUnderTest) -> list[str]:
    if target.dialect == "sqlite":
        found = target.sql("SELECT name FROM sqlite_master WHERE name LIKE 'replay%'")
    else:
        found = target.sql(
            "SELECT table_name FROM information_schema.tables "
            "WHERE table_schema = current_schema() AND table_name LIKE 'replay%'"
        )
    return [row[0] for row in found]


def replayed(target: StoreUnderTest, *args: str) -> tuple[int, dict[str, Any], bytes]:
    done = run("replay", "--format", "json", *args, url=target.url)
    return done.returncode, json.loads(done.stdout), done.stderr


def replayed_here(target: StoreUnderTest) -> replaying.ReplayReport:
    """A replay in this process (where a test patched what it calls)."""
    store = open_store(target.url, create=False)
    try:
        return replaying.replay(store)
    finally:
        store.close()


def test_replay_of_untouched_tables_finds_no_difference_and_leaves_them_alone(
    under_test: StoreUnderTest,
) -> None:
    told(under_test)
    before = live_tables(under_test)

    code, report, stderr = replayed(under_test)

    assert code == 0, stderr
    assert report["ok"] and report["differences"] == []
    assert report["position"] == report["head"] == report["events"] == EVENTS
    assert report["events_per_second"] > 0
    assert live_tables(under_test) == before
    assert scratch_tables(under_test) == []


def test_replay_names_every_corrupted_row_and_exits_1(under_test: StoreUnderTest) -> None:
    told(under_test)
    sql = under_test.sql
    (removed,) = sql("SELECT alloc FROM allocations WHERE removed = 1 ORDER BY alloc LIMIT 1")[0]
    (gone,) = sql("SELECT node FROM nodes ORDER BY node LIMIT 1")[0]
    alloc, position = sql("SELECT alloc, position FROM alloc_states ORDER BY position LIMIT 1")[0]
    (refused,) = sql("SELECT position FROM rejections ORDER BY position LIMIT 1")[0]
    sql("UPDATE allocations SET job = 'forged' WHERE alloc = ?", (removed,))
    sql("DELETE FROM nodes WHERE node = ?", (gone,))
    sql("INSERT INTO addresses (address, alloc, node, state, since_position) "
        "VALUES ('203.0.113.9', 'a-ghost', 'n-ghost', 'held', 3)")
    sql("UPDATE alloc_states SET value = 'forged' WHERE alloc = ? AND position = ?",
        (alloc, position))
    sql("UPDATE rejections SET reason = 'nothing to see' WHERE position = ?", (refused,))

    code, report, stderr = replayed(under_test)

    assert code == 1
    assert "replay found 5 differences with the live tables" in one_line_error(stderr)
    named = {(d["table"], d["key"], d["problem"], d["column"]) for d in report["differences"]}
    assert named == {
        ("allocations", removed, "differs", "job"),
        ("nodes", gone, "missing", None),
        ("addresses", "203.0.113.9", "unexpected", None),
        ("alloc_states", f"{alloc}@{position}", "differs", "value"),
        ("rejections", str(refused), "differs", "reason"),
    }
    job = next(d for d in report["differences"] if d["table"] == "allocations")
    assert job["found"] == "forged" and job["expected"] != "forged"
    missing = next(d for d in report["differences"] if d["table"] == "nodes")
    assert missing["expected"]["node"] == gone and missing["found"] is None
    assert scratch_tables(under_test) == []


def test_replay_compares_every_column_of_every_table(under_test: StoreUnderTest) -> None:
    """One row of each table forged in every column but its key: each
    column is named, none is left out of the comparison. ('-7' is taken as
    text or as a number, as the column is: no real value is either.)"""
    told(under_test)
    forged: set[tuple[str, str]] = set()
    for table in TABLES:
        key = KEYS[table]
        ident = under_test.sql(
            f"SELECT {', '.join(key)} FROM {table} ORDER BY {', '.join(key)} LIMIT 1")[0]
        changed = [column for column in under_test.columns(table) if column not in key]
        under_test.sql(
            f"UPDATE {table} SET {', '.join(f'{c} = ?' for c in changed)} "
            f"WHERE {' AND '.join(f'{k} = ?' for k in key)}",
            (*("-7" for _ in changed), *ident),
        )
        forged |= {(table, column) for column in changed}

    code, report, _ = replayed(under_test)

    assert code == 1
    named = {(d["table"], d["column"]) for d in report["differences"] if d["problem"] == "differs"}
    assert forged - named == set()
    assert {table for table, _ in forged} == set(TABLES)


def test_replay_to_a_position_names_what_the_as_of_state_has_otherwise(
    under_test: StoreUnderTest, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An as-of state one event short (as a bad checkpoint would give) is a
    difference with the replay to that position."""
    told(under_test, 900)
    rebuild = replaying.rebuild
    monkeypatch.setattr(replaying, "rebuild", lambda store, point: rebuild(
        store, AsOf(position=point.position - 1)))
    store = open_store(under_test.url)
    try:
        report = replaying.replay(store, 700)
    finally:
        store.close()

    assert (report.ok, report.position) == (False, 700)
    expected = [d.expected for d in report.differences]
    values = [v for e in expected for v in (e.values() if isinstance(e, dict) else [e])]
    assert 700 in values  # what event 700 did, which the state one event short lacks


def test_a_corrupted_row_is_named_in_the_readable_report(
    sqlite_under_test: StoreUnderTest,
) -> None:
    told(sqlite_under_test, 400)
    (node,) = sqlite_under_test.sql("SELECT node FROM nodes ORDER BY node LIMIT 1")[0]
    sqlite_under_test.sql("UPDATE nodes SET health = 'suspect' WHERE node = ?", (node,))
    done = run("replay", "--format", "table", url=sqlite_under_test.url)
    assert done.returncode == 1
    text = done.stdout.decode()
    assert "differences:" in text
    row = next(line for line in text.splitlines() if line.startswith("nodes "))
    assert row.split()[:4] == ["nodes", node, "differs", "health"], row


def test_replay_to_a_position_compares_with_the_as_of_state(
    under_test: StoreUnderTest,
) -> None:
    told(under_test, 900)
    code, report, stderr = replayed(under_test, "--to", "700")
    assert code == 0, stderr
    assert (report["position"], report["events"], report["head"]) == (700, 700, 900)
    assert report["compared_with"] == "the as-of state at position 700"
    assert scratch_tables(under_test) == []

    beyond = run("replay", "--to", "901", url=under_test.url)
    assert beyond.returncode == 2
    assert "beyond the head of the log (900)" in beyond.stderr.decode()


@pytest.mark.postgres
def test_on_postgresql_replay_checks_lagging_tables_where_they_are(
    pg_under_test: StoreUnderTest,
) -> None:
    told(pg_under_test, 800, project=False)
    with Ledger.open(pg_under_test.url) as ledger:
        ledger.project(limit=300)

    code, report, stderr = replayed(pg_under_test)

    assert code == 0, stderr
    assert (report["position"], report["head"]) == (300, 800)
    assert "the decision tables at position 800" in report["compared_with"]


@pytest.mark.postgres
def test_on_postgresql_replay_names_a_corrupted_decision_row(
    pg_under_test: StoreUnderTest,
) -> None:
    told(pg_under_test, 600)
    (alloc,) = pg_under_test.sql(
        "SELECT alloc FROM state_allocations ORDER BY removed DESC, alloc LIMIT 1")[0]
    pg_under_test.sql("UPDATE state_allocations SET job = 'forged' WHERE alloc = ?",
                      (alloc,))
    code, report, _ = replayed(pg_under_test)
    assert code == 1
    assert [(d["table"], d["key"], d["column"]) for d in report["differences"]] == [
        ("state_allocations", alloc, "job")
    ]


def test_a_log_longer_than_a_page_is_read_and_replayed_whole(
    sqlite_under_test: StoreUnderTest, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The log is read a page at a time: a replay reads every page, the last
    one full or not."""
    from ledger import sqlite_store

    monkeypatch.setattr(sqlite_store, "PAGE", 50)
    told(sqlite_under_test, events=200, project=False)  # four full pages, none after
    with Ledger.open(sqlite_under_test.url) as ledger:
        positions = [e.originator_version for e in ledger.store.read_log(0)]
        report = replaying.replay(ledger.store)
    assert positions == list(range(1, 201))
    assert report.ok and report.position == 200, report.differences[:3]


def redefine_zombie_slots(target: StoreUnderTest, prefix: str = "") -> None:
    """The view made again by hand with the same columns and no rows: what
    it holds now may even be right (no zombie at this moment), but it no
    longer answers from the tables."""
    view = prefix + "zombie_slots"
    if target.dialect == "sqlite":
        (definition,) = target.sql(
            "SELECT sql FROM sqlite_master WHERE type = 'view' AND name = ?", (view,))[0]
        body = definition.split(" AS", 1)[1]
        target.sql(f"DROP VIEW {view}")
        target.sql(f"CREATE VIEW {view} AS SELECT * FROM ({body}) WHERE 0 = 1")
    else:
        (body,) = target.sql(f"SELECT pg_get_viewdef('{view}'::regclass)")[0]
        target.sql(f"CREATE OR REPLACE VIEW {view} AS SELECT * FROM ({body.rstrip(';')}) z2 "
                   "WHERE 0 = 1")


def test_a_view_redefined_by_hand_is_named_whatever_it_holds_now(
    under_test: StoreUnderTest,
) -> None:
    told(under_test)
    redefine_zombie_slots(under_test)

    code, report, stderr = replayed(under_test)

    assert code == 1, stderr
    assert report["differences"] == [{
        "table": "zombie_slots", "key": "(definition)", "problem": "redefined", "column": None,
        "expected": replaying.OWN_DEFINITION, "found": report["differences"][0]["found"],
    }]
    assert report["differences"][0]["found"].rstrip(";").endswith(("WHERE 0 = 1", "WHERE (0 = 1)"))
    assert "\n" not in report["differences"][0]["found"]


def test_on_postgresql_replay_names_a_redefined_decision_view(
    pg_under_test: StoreUnderTest,
) -> None:
    told(pg_under_test)
    redefine_zombie_slots(pg_under_test, "state_")

    code, report, stderr = replayed(pg_under_test)

    assert code == 1, stderr
    assert [(d["table"], d["problem"]) for d in report["differences"]] == [
        ("state_zombie_slots", "redefined")]


def test_a_connection_handed_back_in_its_transaction_stops_neither_replay_nor_its_cleanup(
    sqlite_under_test: StoreUnderTest,
) -> None:
    """Ctrl-C between a ``BEGIN`` and the code that ends its transaction
    handed the SQLite connection back to the pool still in it. The next
    transaction on that connection failed ("Safety level may not be changed
    inside a transaction"), so an interrupted ``replay --repair`` ended with
    exit 3 instead of "interrupted", and left its scratch tables behind."""
    told(sqlite_under_test, events=300)
    store = open_store(sqlite_under_test.url, create=False)
    try:
        with ExitStack() as held:  # every connection the pool keeps idle, left in a transaction
            for _ in range(6):
                held.enter_context(store.datastore.get_connection(commit=False)).cursor().execute(
                    "BEGIN")
        report = replaying.replay(store)
    finally:
        store.close()

    assert (report.differences, report.events) == ([], 300)
    assert scratch_tables(sqlite_under_test) == []


def test_transactions_a_signal_left_entered_end_quietly_when_the_store_closes(
    sqlite_under_test: StoreUnderTest,
) -> None:
    """Where a signal stops a command between taking a connection and the
    ``with`` that gives it back, the transaction is finalized only after the
    store closed: that printed a traceback ("Exception ignored in: <generator
    object SQLiteStore.reading>", "Pool is closed") after "interrupted"."""
    told(sqlite_under_test, events=30)
    script = textwrap.dedent(f"""
        from ledger.store import open_store
        store = open_store({sqlite_under_test.url!r}, create=False)
        reading = store.reading()  # entered as a signal leaves them: never left
        reading.__enter__()
        writing = store.writing()
        writing.__enter__()
        store.close()
    """)
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, cwd=root,
                          timeout=60, check=False)

    assert (done.returncode, done.stderr.decode()) == (0, "")


def _killed_with_scratch_tables(target: StoreUnderTest) -> str:
    """A process that made scratch tables as a replay does, then ended without
    dropping them (as ``kill -9`` ends a replay); their prefix."""
    script = textwrap.dedent(f"""
        import os
        from ledger.store import open_store, scratch_prefix
        from projections.replay import Scratch
        store = open_store({target.url!r}, create=False)
        prefix = scratch_prefix()
        claim = store.claimed(prefix)  # held: not finalized (its claim let go) before the exit
        claim.__enter__()
        Scratch(store, prefix).create()
        print(prefix, flush=True)
        os._exit(0)
    """)
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, cwd=root,
                          timeout=60, check=True)
    return done.stdout.decode().strip()


def _replayed_beside(
    target: StoreUnderTest, prefix: str
) -> tuple[list[str], tuple[int, dict[str, Any], bytes], list[str]]:
    """A replay run while this process claims scratch tables of ``prefix``
    (as a running replay does): the scratch tables before, the replay's
    outcome, the scratch tables after (then this process's dropped)."""
    store = open_store(target.url, create=False)
    try:
        with store.claimed(prefix):
            replaying.Scratch(store, prefix).create()
            before = scratch_tables(target)
            outcome = replayed(target)
            after = scratch_tables(target)
            replaying._drop(store, prefix)
    finally:
        store.close()
    return before, outcome, after


def test_scratch_tables_a_killed_replay_left_are_dropped_by_the_next_not_those_in_use(
    under_test: StoreUnderTest,
) -> None:
    """A killed replay leaves its scratch tables (seven, each time); the next
    replay drops them, and never those of a replay still running."""
    told(under_test, events=30)
    left = _killed_with_scratch_tables(under_test)
    running = scratch_prefix()
    before, (code, _, stderr), after = _replayed_beside(under_test, running)

    assert code == 0, stderr
    assert {name.startswith(left) for name in before} == {True, False}
    assert after and all(name.startswith(running) for name in after), after
    assert scratch_tables(under_test) == []


def test_scratch_tables_claimed_by_a_process_this_machine_cannot_see_are_left(
    under_test: StoreUnderTest,
) -> None:
    """A replay in another container sharing the store (its own pid
    namespace: its pid means nothing here, or another process) still claims
    its tables: the next replay here leaves them."""
    told(under_test, events=30)
    elsewhere = "replay_999999999_0badcafe_"  # no such pid on this machine
    _, (code, _, stderr), kept = _replayed_beside(under_test, elsewhere)

    assert code == 0, stderr
    assert kept and all(name.startswith(elsewhere) for name in kept), kept
    assert scratch_tables(under_test) == []
    if under_test.path is not None:  # SQLite: its claim file went with its claim
        assert list(under_test.path.parent.glob("*claim")) == []


def test_a_claim_file_a_replay_killed_before_it_made_its_tables_left_is_removed_later(
    sqlite_under_test: StoreUnderTest,
) -> None:
    """A replay killed while it waits to make its scratch tables (a writer
    holds the file) leaves its claim file and no tables: docs/audit.md says
    the next replay removes what a killed one left."""
    told(sqlite_under_test, events=30)
    script = textwrap.dedent(f"""
        import os
        from ledger.store import open_store, scratch_prefix
        store = open_store({sqlite_under_test.url!r}, create=False)
        claim = store.claimed(scratch_prefix())  # held: not finalized before the exit
        claim.__enter__()
        os._exit(0)
    """)
    root = Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-c", script], cwd=root, timeout=60, check=True)
    assert sqlite_under_test.path is not None
    assert list(sqlite_under_test.path.parent.glob("*claim"))

    code, _, stderr = replayed(sqlite_under_test)

    assert code == 0, stderr
    assert list(sqlite_under_test.path.parent.glob("*claim")) == []


def test_replay_of_a_store_whose_file_name_leaves_no_room_for_a_claim_files_name(
    tmp_path: Path,
) -> None:
    """A store file named near the folder's limit on a name (255 bytes here;
    SQLite needs only 4 more for its "-wal"): the claim file named after it
    could not be made and replay exited 3. Its claim is named after a hash
    of the name instead, and a claim file a killed replay left is found."""
    target = sqlite_store(tmp_path, "l" * 240 + ".db")
    told(target, events=30)
    left = _killed_with_scratch_tables(target)
    assert [path.name for path in tmp_path.glob(f"*{left}claim")], "the killed replay's claim"

    code, report, stderr = replayed(target)

    assert (code, report["ok"]) == (0, True), stderr
    assert scratch_tables(target) == []
    assert list(tmp_path.glob("*claim")) == []


def test_a_claim_made_again_is_not_removed_by_a_replay_that_opened_its_first_file(
    sqlite_under_test: StoreUnderTest, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A replay opens a claim file no one holds; before it locks it, another
    replay removes it and a claim of the same prefix is made again (as a
    claim whose file went before it was locked does). The first replay locks
    the file it opened, now removed, and must not remove the claim made
    again by its name, nor tell its tables abandoned."""
    from ledger import sqlite_store

    told(sqlite_under_test, events=30)
    assert sqlite_under_test.path is not None
    store = open_store(sqlite_under_test.url, create=False)
    again = scratch_prefix()
    with store.claimed(again):
        pass  # its claim file let go ...
    first = sqlite_under_test.path.parent / f"{sqlite_under_test.path.name}-{again}claim"
    first.touch()  # ... and one left behind, as a killed claim's
    claims = ExitStack()
    locking = sqlite_store.fcntl.flock
    made: list[Any] = []

    def raced(descriptor: int, operation: int) -> None:
        if operation & fcntl.LOCK_NB and not made:
            first.unlink()  # another replay removed it ...
            made.append(claims.enter_context(store.claimed(again)))  # ... and made again
        locking(descriptor, operation)

    monkeypatch.setattr(sqlite_store.fcntl, "flock", raced)
    try:
        with claims, store.claimed(scratch_prefix()) as abandoned:
            free = abandoned([again])
            assert (free, first.exists()) == ([], True)
    finally:
        store.close()


def test_scratch_tables_of_a_killed_replay_are_dropped_where_flock_needs_a_file_open_to_write(
    sqlite_under_test: StoreUnderTest, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On NFS ``flock`` is a lock on a byte range, which an exclusive lock
    takes only on a file open to write (EBADF otherwise): a claim file opened
    only to read was taken as held, and a killed replay's tables were left
    for ever. The claim file is opened to write where this user may."""
    import errno
    import os

    from ledger import sqlite_store

    told(sqlite_under_test, events=30)
    _killed_with_scratch_tables(sqlite_under_test)
    locking = sqlite_store.fcntl.flock

    def as_on_nfs(descriptor: int, operation: int) -> None:
        if fcntl.fcntl(descriptor, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY:
            raise OSError(errno.EBADF, "Bad file descriptor")
        locking(descriptor, operation)

    monkeypatch.setattr(sqlite_store.fcntl, "flock", as_on_nfs)
    report = replayed_here(sqlite_under_test)

    assert report.ok, report.differences
    assert scratch_tables(sqlite_under_test) == []
    assert sqlite_under_test.path is not None
    assert list(sqlite_under_test.path.parent.glob("*claim")) == []


def test_scratch_tables_of_a_killed_replay_whose_claim_file_is_another_users_are_dropped(
    sqlite_under_test: StoreUnderTest, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A store shared by a group (docs/sqlite.md): a replay killed by one user
    leaves a claim file the others may read but not write (0644). flock needs
    no write access, so the next replay by another user still tells it is
    abandoned (the pid check before this change dropped them)."""
    import os

    told(sqlite_under_test, events=30)
    left = _killed_with_scratch_tables(sqlite_under_test)
    assert sqlite_under_test.path is not None
    claim = next(sqlite_under_test.path.parent.glob(f"*{left}claim"))
    claim.chmod(0o444)
    if os.geteuid() == 0:  # root writes any file: as another user would be refused
        opened = os.open

        def as_another_user(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
            if str(path) == str(claim) and flags & (os.O_WRONLY | os.O_RDWR):
                raise PermissionError(13, "Permission denied", str(path))
            return opened(path, flags, *args, **kwargs)

        monkeypatch.setattr(os, "open", as_another_user)
    report = replayed_here(sqlite_under_test)

    assert report.ok, report.differences
    assert scratch_tables(sqlite_under_test) == []


def test_a_replay_whose_folder_limit_reads_otherwise_leaves_tables_in_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Whether claims are named after a hash hangs on ``pathconf(NAME_MAX)``,
    which processes sharing a store need not answer alike: glibc asks the file
    system (vfat and exfat say 1530), musl always says 255. A replay told 1530
    claims ``<file>-<prefix>claim``; one told 255 looks for ``.<hash>-...``,
    finds none, and drops the tables of the replay still running."""
    from ledger import sqlite_store as sqlite_module

    target = sqlite_store(tmp_path, "l" * 221 + ".db")  # 224 bytes: either answer fits
    told(target, events=30)
    running = scratch_prefix()
    with monkeypatch.context() as patched:
        patched.setattr(sqlite_module.os, "pathconf", lambda path, name: 1530)
        store = open_store(target.url, create=False)
        claim = store.claimed(running)
        claim.__enter__()
    try:
        replaying.Scratch(store, running).create()
        code, _, stderr = replayed(target)  # another process: pathconf answers 255
        kept = scratch_tables(target)
    finally:
        replaying._drop(store, running)
        claim.__exit__(None, None, None)
        store.close()

    assert code == 0, stderr
    assert kept and all(name.startswith(running) for name in kept), kept


def test_replay_of_a_long_store_name_where_pathconf_counts_bytes_of_wide_characters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """vfat and exfat hold names of 255 characters but answer NAME_MAX 1530
    (255 x 6 bytes): a store file of 244 bytes gets no hashed claim name,
    and ``<file>-<prefix>claim`` (over 255) cannot be made: replay exits 3,
    as before the hash."""
    from ledger import sqlite_store as sqlite_module

    target = sqlite_store(tmp_path, "l" * 240 + ".db")
    told(target, events=30)
    monkeypatch.setattr(sqlite_module.os, "pathconf", lambda path, name: 1530)
    report = replayed_here(target)

    assert report.ok, report.differences


def test_a_fifo_named_like_another_users_claim_file_does_not_hang_replay(
    sqlite_under_test: StoreUnderTest,
) -> None:
    """Whatever sits beside the store under a claim file's name is opened to
    tell it: a FIFO this user may not write is opened to read, which waits
    for a writer for ever (open without O_NONBLOCK), and replay hangs."""
    import os

    told(sqlite_under_test, events=30)
    assert sqlite_under_test.path is not None
    fifo = sqlite_under_test.path.parent / f"{sqlite_under_test.path.name}-replay_1_0badf1f0_claim"
    os.mkfifo(fifo, 0o444)
    script = textwrap.dedent(f"""
        import os
        opened = os.open
        def as_another_user(path, flags, *args, **kwargs):  # root may write any file
            if str(path) == {str(fifo)!r} and flags & (os.O_WRONLY | os.O_RDWR):
                raise PermissionError(13, "Permission denied", str(path))
            return opened(path, flags, *args, **kwargs)
        os.open = as_another_user
        from ledger.store import open_store
        from projections import replay
        store = open_store({sqlite_under_test.url!r}, create=False)
        print(replay.replay(store).ok)
        store.close()
    """)
    root = Path(__file__).resolve().parents[2]
    try:
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, cwd=root,
                              timeout=30, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail("replay hung opening a FIFO named like a claim file")
    assert (done.returncode, done.stdout.strip()) == (0, b"True"), done.stderr


def test_a_claim_file_has_the_store_files_permissions_whatever_the_umask(
    sqlite_under_test: StoreUnderTest,
) -> None:
    """A store a group shares (0664): a claim made under umask 077 was 0600,
    which the group may not open at all (nor open to write, which ``flock``
    on NFS needs), so a killed replay's tables were left for its owner
    alone. The claim file takes the store file's permissions."""
    import os

    told(sqlite_under_test, events=30)
    assert sqlite_under_test.path is not None
    sqlite_under_test.path.chmod(0o664)
    store = open_store(sqlite_under_test.url, create=False)
    masked = os.umask(0o077)
    try:
        with store.claimed(scratch_prefix()):
            claim = next(sqlite_under_test.path.parent.glob("*claim"))
            mode = claim.stat().st_mode & 0o777
    finally:
        os.umask(masked)
        store.close()

    assert oct(mode) == oct(0o664)
