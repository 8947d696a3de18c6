"""PostgreSQL writers with ``?writers=combine`` hand batches to one leader (``ledger.postgres_handoff``):
several writers' batches are decided in one transaction, in order; a batch
whose writer has gone is dropped, never decided later; a writer that no
leader answers withdraws its batch and says so; a leader that stops hands
the lead to a standby of another writer, and its round is ended, so that the
others carry on; no writer waits for a lock past its timeout."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from contextlib import ExitStack, suppress
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pg_support import hand_over_in_turn

from ledger.application import Ledger
from ledger.chain import verify
from ledger.errors import StoreUnavailable
from ledger.postgres_handoff import HAND, LEADER_LOCK, Handoff
from ledger.store import open_store

COMBINE = "&writers=combine"
ROOT = Path(__file__).resolve().parents[2]


def _leader_key(connection: Any, schema: str) -> tuple[int, int]:
    oid = connection.execute(
        "SELECT oid::int4 FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone()[0]
    return LEADER_LOCK, oid


def _register(url: str, *nodes: str) -> None:
    with Ledger.open(url) as ledger:
        for node in nodes:
            assert ledger.submit({"type": "node-registered", "node": node}).status == "appended"


def test_one_leader_decides_the_batches_of_several_writers(pg_url, tables):
    pg_url += COMBINE
    _register(pg_url, "n1")
    writers = [Ledger.open(pg_url) for _ in range(4)]
    results: dict[int, list[str]] = {}

    def write(number: int) -> None:
        batch = [{"type": "heartbeat", "node": "n1", "id": f"w{number}-{i}"} for i in range(50)]
        results[number] = [r.status for r in writers[number].submit_batch(batch)]

    threads = [threading.Thread(target=write, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for writer in writers:
        writer.close()

    assert all(statuses == ["appended"] * 50 for statuses in results.values())
    assert tables(pg_url).head() == 201  # gapless: the registration and 4 x 50
    ids = [row["id"] for row in tables(pg_url).rows("SELECT id FROM event_ids ORDER BY position")]
    for number in range(4):  # each writer's batch stays in its own order
        mine = [i for i in ids if i.startswith(f"w{number}-")]
        assert mine == [f"w{number}-{i}" for i in range(50)]
    assert tables(pg_url).value("SELECT count(*) FROM handoff") == 0
    assert tables(pg_url).value("SELECT count(*) FROM outcomes") == 0


def test_batches_handed_over_while_no_one_leads_are_decided_in_one_round_in_order(
    pg_url, pg_schema, tables
):
    """Three writers hand their batches over while the lead is held elsewhere;
    the next leader decides them in one round, in the order they were handed
    over, tells each writer its own receipts, and projects the round because
    one of its writers keeps the projections inline."""
    pg_url += COMBINE
    _register(pg_url, "n1")
    read = tables(pg_url)
    writers = [Ledger.open(pg_url), Ledger.open(pg_url + "&projections=inline"),
               Ledger.open(pg_url)]
    results: dict[int, list[tuple[str, int | None]]] = {}

    def write(number: int) -> None:
        batch = [{"type": "heartbeat", "node": "n1", "id": f"w{number}-{i}"}
                 for i in range(number + 1)]
        results[number] = [(r.status, r.position) for r in writers[number].submit_batch(batch)]

    blocker = open_store(pg_url).connect()  # type: ignore[attr-defined]
    blocker.execute("SELECT pg_advisory_lock(%s, %s)", _leader_key(blocker, pg_schema))
    threads: list[threading.Thread] = []
    try:
        hand_over_in_turn(read, [partial(write, number) for number in range(3)], threads)
    finally:
        blocker.close()  # the lead is free: one standby takes all three batches
        for thread in threads:
            thread.join(timeout=30)
        for writer in writers:
            writer.close()

    kept = {row["id"]: row["position"] for row in read.rows("SELECT id, position FROM event_ids")}
    assert results == {
        number: [("appended", kept[f"w{number}-{i}"]) for i in range(number + 1)]
        for number in range(3)
    }
    assert sorted(kept, key=kept.get) == ["w0-0", "w1-0", "w1-1", "w2-0", "w2-1", "w2-2"]
    assert read.head() == read.tracked() == 7  # the round that held the inline batch projected


def test_receipts_too_many_for_a_notification_come_through_the_outcomes_table(pg_url, tables):
    pg_url += COMBINE
    _register(pg_url, "n1")
    batch = [{"type": "heartbeat", "node": "n1", "id": f"b{i}"} for i in range(600)]
    with Ledger.open(pg_url) as ledger:
        receipts = ledger.submit_batch(batch)  # ~13 kB of receipts: over 8000 bytes

    assert [(r.status, r.position) for r in receipts] == [
        ("appended", p) for p in range(2, 602)]
    assert tables(pg_url).value("SELECT count(*) FROM outcomes") == 0  # read and removed


def test_a_batch_whose_writer_has_gone_is_dropped_not_decided(pg_url, pg_schema, tables):
    pg_url += COMBINE
    _register(pg_url, "n1")
    store = open_store(pg_url)
    gone = store.connect()  # type: ignore[attr-defined]
    gone.execute(HAND, ("gone", b'[{"type": "heartbeat", "node": "n1", "id": "ghost"}]',
                        False, "nobody-listens"))
    gone.close()  # the writer dies before any leader takes its batch
    store.close()

    _register(pg_url, "n2")  # the next leader's round

    assert tables(pg_url).value("SELECT count(*) FROM event_ids WHERE id = 'ghost'") == 0
    assert tables(pg_url).value("SELECT count(*) FROM handoff") == 0
    assert tables(pg_url).head() == 2


def test_a_batch_whose_writer_s_pid_now_names_a_later_session_is_dropped(
    pg_url, pg_schema, tables
):
    """The writer died and its process id went to a session that started
    later (here: the batch names a live session's pid with another start):
    its batch is dropped, not decided on behalf of that other session."""
    pg_url += COMBINE
    _register(pg_url, "n1")
    with psycopg.connect(os.environ["ALLOC_LEDGER_TEST_PG"], autocommit=True) as later:
        later.execute(
            f"INSERT INTO {pg_schema}.handoff (batch, events, inline, pid, started) "
            "VALUES ('reused', %s, false, pg_backend_pid(), '2000-01-01T00:00:00Z')",
            (b'[{"type": "heartbeat", "node": "n1", "id": "ghost"}]',))

        _register(pg_url, "n2")  # the next leader's round, while that pid is alive

    assert tables(pg_url).value("SELECT count(*) FROM event_ids WHERE id = 'ghost'") == 0
    assert tables(pg_url).value("SELECT count(*) FROM handoff") == 0
    assert tables(pg_url).head() == 2


def test_a_writer_no_leader_answers_withdraws_its_batch(pg_url, pg_schema, tables):
    pg_url += COMBINE
    _register(pg_url, "n1")
    blocker = open_store(pg_url).connect()  # type: ignore[attr-defined]
    blocker.execute(  # a stuck leader
        "SELECT pg_advisory_lock(%s, %s)", _leader_key(blocker, pg_schema))
    try:
        with Ledger.open(f"{pg_url}&timeout=1") as ledger, pytest.raises(
            StoreUnavailable, match="no writer decided the batch within 1 s"
        ):
            ledger.submit({"type": "heartbeat", "node": "n1"})
    finally:
        blocker.close()

    assert tables(pg_url).head() == 1  # nothing of it was written
    assert tables(pg_url).value("SELECT count(*) FROM handoff") == 0


def test_when_the_leader_stops_a_standby_of_another_writer_leads(pg_url, tables):
    pg_url += COMBINE
    _register(pg_url, "n1")
    first, second = Ledger.open(pg_url), Ledger.open(pg_url)
    try:
        assert first.submit({"type": "heartbeat", "node": "n1"}).status == "appended"
        assert second.submit({"type": "heartbeat", "node": "n1"}).status == "appended"
        first.close()  # the leader (the first to stand by) stops

        receipt = second.submit({"type": "heartbeat", "node": "n1"})

        assert (receipt.status, receipt.position) == ("appended", 4)
    finally:
        second.close()


# -- rounds that overlap: a round is decided while the one before it commits ------


def _register_with_slots(url: str) -> None:
    with Ledger.open(url) as ledger:
        assert ledger.submit({"type": "node-registered", "node": "n1", "slots": 2}).ok


def _place(alloc: str, slot: int = 0, **more: object) -> dict:
    return {"type": "alloc-placed", "alloc": alloc, "node": "n1", "slot": slot, **more}


def test_a_round_decided_ahead_sees_what_the_round_still_committing_decided(pg_url, tables):
    pg_url += COMBINE
    _register_with_slots(pg_url)
    with Ledger.open(pg_url) as leader:
        store: Any = leader.store
        with store.connect(idle=60) as one, store.connect(idle=60) as other:
            first = ExitStack()
            committing = first.enter_context(store.combining(one))
            store.lock_log(committing)
            placed = leader.decide(
                committing, [{"type": "heartbeat", "node": "n1"}, _place("a1", id="x")])
            assert [r.status for r in placed] == ["appended", "appended"]
            with store.combining(other) as cursor:
                decided = leader.decide_ahead(cursor, [
                    _place("a2"),  # the slot a1 holds, though a1 is not committed yet
                    _place("a1", id="x"),  # a retry of a1's placement, by its client id
                ])
                assert decided is not None
                first.close()  # the first round commits
                store.lock_log(cursor)
                receipts = leader.write_ahead(cursor, decided)
        assert verify(store).problem is None

    assert (receipts[0].status, receipts[0].error) == (
        "rejected", "slot n1#0 is already held by allocation a1")
    assert (receipts[1].status, receipts[1].position) == ("duplicate", 3)
    assert tables(pg_url).head() == 4  # registration, heartbeat, a1, the rejection of a2


def test_a_round_decided_ahead_is_decided_again_when_another_writer_appended(pg_url, tables):
    _register_with_slots(pg_url)
    with Ledger.open(pg_url + COMBINE) as leader:
        store: Any = leader.store
        with store.connect(idle=60) as one, store.connect(idle=60) as other:
            with store.combining(one) as cursor:
                store.lock_log(cursor)
                leader.decide(cursor, [{"type": "heartbeat", "node": "n1"}])
            with store.combining(other) as cursor:
                decided = leader.decide_ahead(cursor, [_place("a2")])
                assert decided is not None and decided.receipts[0].status == "appended"
                with Ledger.open(pg_url) as rival:  # takes the log's lock in its own transaction
                    assert rival.submit(_place("a1")).status == "appended"
                store.lock_log(cursor)
                receipts = leader.write_ahead(cursor, decided)
        assert verify(store).problem is None

    assert (receipts[0].status, receipts[0].error) == (
        "rejected", "slot n1#0 is already held by allocation a1")
    assert receipts[0].position == 4
    assert tables(pg_url).head() == 4


def test_a_round_decided_ahead_and_again_is_not_projected_by_an_inline_leader(pg_url, tables):
    """A round decided ahead holds the log's lock without the tracking row's:
    decided again, it leaves the projections to whoever holds that row, even
    when the leader's own batches would have them inline."""
    _register_with_slots(pg_url)
    with Ledger.open(pg_url + COMBINE + "&projections=inline") as leader:
        store: Any = leader.store
        with store.connect(idle=60) as one, store.connect(idle=60) as other:
            with store.combining(one) as cursor:
                store.lock_log(cursor)
                leader.decide(cursor, [{"type": "heartbeat", "node": "n1"}])
                projected = store.tracked(cursor)
            with store.combining(other) as cursor:
                decided = leader.decide_ahead(cursor, [_place("a2")])
                assert decided is not None
                with Ledger.open(pg_url) as rival:  # appends; its projections are not inline
                    assert rival.submit(_place("a1")).status == "appended"
                store.lock_log(cursor, tracking=False)  # as a round decided ahead locks
                receipts = leader.write_ahead(cursor, decided)
                assert store.tracked(cursor) == projected

    assert receipts[0].status == "rejected" and receipts[0].position == 4
    assert tables(pg_url).head() == 4


def test_an_inline_batch_taken_while_the_round_before_commits_is_projected(
    pg_url, pg_schema, monkeypatch
):
    """Rounds overlap: the next is taken while the last commits. One that
    holds an inline writer's batch is not decided ahead but after that commit,
    with the tracking row: the writer's tables are current once it is told."""
    pg_url += COMBINE
    _register(pg_url, "n1")
    leader = Ledger.open(pg_url)
    take_round = Handoff._round
    held = threading.Event()
    rounds: list[int] = []  # the rounds that had batches

    def overlapping(self: Handoff, connection: Any, committing: Any) -> Any:
        """The second round with batches returns (to commit) only once the
        inline batch is waiting: the next round is taken while it commits."""
        written = take_round(self, connection, committing)
        if written is not None:
            rounds.append(len(rounds) + 1)
        if rounds == [1, 2] and not held.is_set():
            held.set()
            with psycopg.connect(os.environ["ALLOC_LEDGER_TEST_PG"], autocommit=True) as look:
                deadline = time.monotonic() + 10
                while not look.execute(f"SELECT count(*) FROM {pg_schema}.handoff").fetchone()[0]:
                    assert time.monotonic() < deadline
                    time.sleep(0.02)
        return written

    # set before the leader's loop starts, so that no round in flight misses it
    monkeypatch.setattr(Handoff, "_round", overlapping)
    try:
        assert leader.submit({"type": "heartbeat", "node": "n1"}).position == 2  # it leads
        first = threading.Thread(
            target=leader.submit, args=({"type": "heartbeat", "node": "n1"},))
        first.start()
        assert held.wait(10)
        with Ledger.open(pg_url + "&projections=inline") as writer:
            receipt = writer.submit({"type": "heartbeat", "node": "n1"})
            assert (receipt.status, receipt.position, writer.lag()) == ("appended", 4, 0)
        first.join(timeout=30)
    finally:
        leader.close()


def test_a_round_whose_commit_fails_goes_back_and_another_leader_decides_it(pg_url, tables):
    pg_url += COMBINE
    _register(pg_url, "n1")
    leader = Ledger.open(pg_url)
    assert leader.submit({"type": "heartbeat", "node": "n1"}).position == 2  # it leads now
    handoff: Any = leader.store.handoff  # type: ignore[attr-defined]
    decide_round = handoff._round

    def round_that_cannot_commit(connection: Any, committing: Any) -> Any:
        written = decide_round(connection, committing)
        if written is not None:
            connection.close()  # before its COMMIT is sent: the server rolls the round back
        return written

    handoff._round = round_that_cannot_commit
    # The round's COMMIT is sent when it ends, not before: after the close.
    leader.store.send_commit = lambda: None  # type: ignore[attr-defined]
    try:
        with Ledger.open(pg_url) as writer:  # its standby leads once the first has failed
            receipt = writer.submit({"type": "heartbeat", "node": "n1", "id": "again"})
        assert handoff.failure is not None
    finally:
        leader.close()

    assert (receipt.status, receipt.position) == ("appended", 3)  # decided again, once
    assert tables(pg_url).head() == 3
    assert tables(pg_url).value("SELECT position FROM event_ids WHERE id = 'again'") == 3
    with Ledger.open(pg_url) as ledger:
        assert verify(ledger.store).ok


def test_a_lone_writer_whose_leader_stalled_stands_by_again_and_decides_its_batch(
    pg_url, tables
):
    """Ctrl-Z and fg on the only writer: its own standby leads, stalls longer
    than the lease, and the server ends its lead and its round. The writer
    waiting in the same process stands by again, and its batch (back in
    ``handoff``) is decided once, within the writer's timeout."""
    pg_url += COMBINE + "&timeout=6"  # the lease: 2 s
    _register(pg_url, "n1")
    with Ledger.open(pg_url) as ledger:
        assert ledger.submit({"type": "heartbeat", "node": "n1"}).position == 2  # it leads now
        handoff: Any = ledger.store.handoff  # type: ignore[attr-defined]
        decide_round = handoff._round
        stalls = [3.0]

        def round_that_stalls(connection: Any, committing: Any) -> Any:
            if stalls:
                connection.execute("BEGIN")
                time.sleep(stalls.pop())  # idle in a transaction past the lease
            return decide_round(connection, committing)

        handoff._round = round_that_stalls
        receipt = ledger.submit({"type": "heartbeat", "node": "n1", "id": "after-the-stall"})

    assert (receipt.status, receipt.position) == ("appended", 3)
    assert tables(pg_url).value(
        "SELECT position FROM event_ids WHERE id = 'after-the-stall'") == 3
    assert tables(pg_url).head() == 3


def test_a_lead_is_lost_when_the_session_ends_not_when_the_work_fails() -> None:
    import psycopg

    from ledger.postgres_handoff import lost_lead

    def wrapped(error: Exception) -> StoreUnavailable:
        try:
            raise StoreUnavailable("store …") from error
        except StoreUnavailable as unavailable:
            return unavailable

    ended = [psycopg.OperationalError("server closed the connection unexpectedly"),
             psycopg.errors.IdleInTransactionSessionTimeout("idle-in-transaction timeout"),
             psycopg.errors.AdminShutdown("terminating connection"),
             psycopg.errors.LockNotAvailable("canceling statement due to lock timeout")]
    failed = [psycopg.errors.InsufficientPrivilege("permission denied"),
              psycopg.errors.DiskFull("could not extend file"),
              psycopg.errors.UniqueViolation("duplicate key"), RuntimeError("a bug")]
    assert [lost_lead(e) for e in ended] == [True] * 4
    assert [lost_lead(wrapped(e)) for e in ended] == [True] * 4
    assert [lost_lead(e) for e in failed] == [False] * 4
    assert [lost_lead(wrapped(e)) for e in failed] == [False] * 4


def test_a_leader_whose_work_fails_is_reported_at_once_not_stood_by_again(pg_url, tables):
    """Only a lead lost is waited out: a round that fails in the database
    ends the writer's wait with that failure, with nothing written."""
    import psycopg

    pg_url += COMBINE + "&timeout=6"
    _register(pg_url, "n1")
    with Ledger.open(pg_url) as ledger:
        handoff: Any = ledger.store.handoff  # type: ignore[attr-defined]

        def round_that_is_refused(connection: Any, committing: Any) -> Any:
            raise psycopg.errors.InsufficientPrivilege("permission denied for table nodes")

        handoff._round = round_that_is_refused
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match="permission denied for table nodes"):
            ledger.submit({"type": "heartbeat", "node": "n1"})

    assert time.monotonic() - started < 3  # not the writer's timeout (6 s)
    assert tables(pg_url).head() == 1


def test_a_stopped_leader_loses_the_lead_and_a_standby_decides(pg_url, tables):
    pg_url += COMBINE + "&timeout=6"  # a leader that stalls 2 s loses the lead
    _register(pg_url, "n1")
    leader = subprocess.Popen(
        [sys.executable, "-m", "commands", "--store", pg_url, "submit", "-"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert leader.stdin is not None and leader.stdout is not None
    try:
        leader.stdin.write(b'{"type": "heartbeat", "node": "n1"}\n')
        leader.stdin.flush()
        assert b'"appended"' in leader.stdout.readline()  # it leads now
        os.kill(leader.pid, signal.SIGSTOP)  # and stops, holding the lead
        started = time.monotonic()

        with Ledger.open(pg_url) as writer:
            receipt = writer.submit({"type": "heartbeat", "node": "n1"})

        assert (receipt.status, receipt.position) == ("appended", 3)
        assert time.monotonic() - started < 6  # within the writer's timeout
    finally:
        os.kill(leader.pid, signal.SIGCONT)
        leader.stdin.close()
        leader.wait(timeout=30)
    assert tables(pg_url).head() == 3


# A leader that stops itself in the middle of a round, once it has read the
# head under the log's lock: it holds that lock and the batches it took.
LEADER_STOPS_MID_ROUND = """
import os, signal, sys
from ledger.application import Ledger

with Ledger.open(sys.argv[1]) as ledger:
    print(ledger.submit({"type": "heartbeat", "node": "n1"}).status, flush=True)  # it leads
    store = ledger.store
    head = store.head_and_repairs  # what a round reads under the log's lock

    def head_then_stop(cursor):
        store.head_and_repairs = head
        position = head(cursor)
        os.kill(os.getpid(), signal.SIGSTOP)
        return position

    store.head_and_repairs = head_then_stop
    receipt = ledger.submit({"type": "heartbeat", "node": "n1", "id": sys.argv[2]})
    print(receipt.status, receipt.position, flush=True)
"""


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] == "T"


def _run(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def _leader_stopped_mid_round(
    pg_url: str, pg_admin: Any, pg_schema: str, ident: str
) -> subprocess.Popen[bytes] | None:
    """A leader stopped mid-round, holding the log's lock; None (and the
    leader let go on to its end) when it stopped where it held no lock: the
    head is read in more places than a round under the lock, and on a busy
    machine the test's stop may land after that round has committed."""
    leader = _run("-c", LEADER_STOPS_MID_ROUND, f"{pg_url}&application_name=stopped", ident)
    assert leader.stdout is not None
    try:
        assert leader.stdout.readline() == b"appended\n"  # it leads now
        deadline = time.monotonic() + 30
        while not _stopped(leader.pid):  # in its next round
            assert leader.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        if _log_lock_held_by(pg_admin, pg_schema, "stopped"):
            return leader
    except BaseException:
        leader.kill()
        leader.wait()
        raise
    os.kill(leader.pid, signal.SIGCONT)
    answer, err = leader.communicate(timeout=30)
    assert (leader.returncode, answer.split()[:1], err) == (0, [b"appended"], b"")
    return None


def _log_lock_held_by(pg_admin: Any, schema: str, application: str) -> list[tuple[Any, ...]]:
    """The state of each session of an application that holds the log's lock."""
    return pg_admin(
        "SELECT a.state FROM pg_locks l JOIN pg_stat_activity a USING (pid) "
        f"WHERE l.relation = to_regclass('{schema}.stored_events') "
        f"AND l.mode = 'ExclusiveLock' AND l.granted AND a.application_name = '{application}'"
    )


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_writers_carry_on_while_the_leader_is_stopped_in_the_middle_of_a_round(
    pg_url, pg_schema, pg_admin, tables
):
    """A leader stopped mid-round (SIGSTOP, a machine cut off) holds the log's
    lock and the batches it took. The server ends its round once it has idled
    for the lease (a third of ``timeout``): the other writers carry on while
    it is still stopped, and its own batch, back in ``handoff``, is decided
    by the next leader and answered when it resumes."""
    timeout = 6  # a lease of 2 s: long enough to see the stopped round on a busy machine
    pg_url += COMBINE + f"&timeout={timeout}"
    _register(pg_url, "n1")
    for tries in range(1, 6):  # the premise: stopped while it holds the log's lock
        if (leader := _leader_stopped_mid_round(
                pg_url, pg_admin, pg_schema, f"stopped{tries}")) is not None:
            break
    else:
        pytest.fail("the leader never stopped holding the log's lock, in 5 tries")
    writers: list[subprocess.Popen[bytes]] = []
    try:
        started = time.monotonic()
        writers = [_run("-m", "commands", "--store", pg_url, "submit", "-") for _ in range(2)]
        ends = [
            writer.communicate(b'{"type": "heartbeat", "node": "n1", "id": "w%d"}\n' % number,
                               timeout=2 * timeout + 2)  # at most: what a writer waits
            for number, writer in enumerate(writers)
        ]
        took = time.monotonic() - started

        assert _stopped(leader.pid)  # all this while
        assert _log_lock_held_by(pg_admin, pg_schema, "stopped") == []
        for writer, (out, err) in zip(writers, ends, strict=True):
            assert (writer.returncode, out.count(b'"appended"')) == (0, 1), err
        assert took < timeout  # the server ended the stopped round after the lease (2 s)
    finally:
        os.kill(leader.pid, signal.SIGCONT)
        for process in writers:
            if process.poll() is None:
                process.kill()
                process.wait()
        try:
            answer, err = leader.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            leader.kill()
            raise

    assert (leader.returncode, answer.split()[:1], err) == (0, [b"appended"], b"")  # decided once
    assert tables(pg_url).head() == 5 + 2 * (tries - 1)  # two events each try before
    assert tables(pg_url).value(
        f"SELECT count(*) FROM event_ids WHERE id = 'stopped{tries}'") == 1
    assert tables(pg_url).value("SELECT count(*) FROM handoff") == 0
    with Ledger.open(pg_url) as ledger:
        assert verify(ledger.store).ok


HELD = (r"the projection tables' tracking row, which a writer that projects inline takes: "
        r"a follower's transaction holds it")


@pytest.mark.parametrize("writers, reason", [
    ("combine", r"no writer decided the batch within 2 s \(nothing of it was written; its "
                r"leader waited 1 s in vain for " + HELD),
    ("lock", r"gave up waiting for a lock after 2 s \(" + HELD),
])
def test_an_inline_writer_held_up_by_a_follower_names_the_tracking_row(
    pg_url, pg_schema, tables, writers, reason
):
    """A follower's transaction that never ends (stopped mid catch-up) holds
    the tracking row an inline writer must take: the error names that row,
    not the log's lock, which nobody holds."""
    _register(pg_url, "n1")
    with psycopg.connect(os.environ["ALLOC_LEDGER_TEST_PG"], autocommit=True) as holder:
        holder.execute("BEGIN")
        holder.execute(f"SELECT * FROM {pg_schema}.tracking FOR UPDATE")
        result = _submit(f"{pg_url}&writers={writers}&timeout=2&projections=inline", 20)

    assert result.returncode == 3, result
    assert len(result.stderr.decode().splitlines()) == 1, result.stderr
    assert re.search(reason, result.stderr.decode()), result.stderr
    assert tables(pg_url).head() == 1  # nothing of it was written


def _submit(url: str, timeout: float) -> subprocess.CompletedProcess[bytes]:
    """``submit -`` of one heartbeat, given at most ``timeout`` seconds."""
    return subprocess.run(
        [sys.executable, "-m", "commands", "--store", url, "submit", "-"],
        input=b'{"type": "heartbeat", "node": "n1", "id": "w"}\n', capture_output=True,
        timeout=timeout, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False,
    )


@pytest.mark.parametrize("writers, reason", [
    ("combine", (r"no writer decided the batch within 2 s \(nothing of it was written; its "
                 r"leader waited 1 s for the log's lock in vain: another session holds it")),
    ("lock", (r"gave up waiting for a lock after 2 s \(the log's, most likely: its holder may "
              r"be a writer stopped or cut off\); nothing of this transaction was written")),
])
def test_a_writer_waits_no_longer_than_its_timeout_for_a_log_lock_never_let_go(
    pg_url, pg_schema, pg_admin, tables, writers, reason
):
    """A session that holds the log's lock and never lets go (idle in its
    transaction, with no timeout: someone's psql) costs a writer its
    ``timeout`` at most (twice, for a batch a leader took): exit 3, one line,
    nothing written."""
    timeout = 2
    _register(pg_url, "n1")
    with psycopg.connect(os.environ["ALLOC_LEDGER_TEST_PG"], autocommit=True,
                         application_name="holder") as holder:
        holder.execute("BEGIN")
        holder.execute(f"LOCK TABLE {pg_schema}.stored_events IN EXCLUSIVE MODE")
        started = time.monotonic()
        result = _submit(f"{pg_url}&writers={writers}&timeout={timeout}", 2 * timeout + 5)
        took = time.monotonic() - started
        assert _log_lock_held_by(pg_admin, pg_schema, "holder") == [("idle in transaction",)]

    assert result.returncode == 3, result
    assert result.stdout == b""
    assert len(result.stderr.decode().splitlines()) == 1, result.stderr
    assert re.search(reason, result.stderr.decode()), result.stderr
    assert took < (2 if writers == "combine" else 1) * timeout + 2  # and its start
    assert tables(pg_url).head() == 1  # nothing of it was written
    assert tables(pg_url).value("SELECT count(*) FROM handoff") == 0


def test_a_leader_ends_a_session_stalled_with_the_log_in_the_middle_of_a_pipeline(
    pg_url, pg_schema, pg_admin, tables
):
    """A session stopped between two statements of a pipeline waits for its
    client "active", where PostgreSQL 15 runs no timer: it would hold the
    log's lock until it resumed. A leader that waited the lease for the lock
    ends it, and the writers carry on."""
    timeout = 3
    _register(pg_url, "n1")
    holder = psycopg.connect(os.environ["ALLOC_LEDGER_TEST_PG"], autocommit=True,
                             application_name="holder")
    try:
        with suppress(psycopg.OperationalError), holder.pipeline():  # the session is ended
            holder.execute("BEGIN")
            holder.execute(f"LOCK TABLE {pg_schema}.stored_events IN EXCLUSIVE MODE")
            holder.execute("SELECT 1").fetchone()  # psycopg's Flush: no Sync
            assert _log_lock_held_by(pg_admin, pg_schema, "holder") == [("active",)]
            started = time.monotonic()
            result = _submit(f"{pg_url}{COMBINE}&timeout={timeout}", 2 * timeout + 5)
            took = time.monotonic() - started
    finally:
        holder.close()

    assert (result.returncode, result.stdout.count(b'"appended"')) == (0, 1), result
    assert took < timeout + 1
    assert _log_lock_held_by(pg_admin, pg_schema, "holder") == []
    assert tables(pg_url).head() == 2


def test_a_writer_with_inline_projections_has_them_followed_by_any_leader(pg_url, tables):
    _register(pg_url, "n1")
    leader = Ledger.open(pg_url + COMBINE)  # its projections follow later (the default)
    try:
        assert leader.submit({"type": "heartbeat", "node": "n1"}).position == 2  # it leads
        assert leader.lag() == 2
        with Ledger.open(pg_url + COMBINE + "&projections=inline") as writer:
            receipt = writer.submit({"type": "heartbeat", "node": "n1"})
            assert leader.store.handoff.leading  # type: ignore[attr-defined]
            assert (receipt.position, writer.lag()) == (3, 0)  # projected in its round
        assert leader.submit({"type": "heartbeat", "node": "n1"}).position == 4
        assert leader.lag() == 1
    finally:
        leader.close()
    assert tables(pg_url).value("SELECT last_heartbeat_position FROM nodes WHERE node = 'n1'") == 3


def _refuse_standing_by(ledger: Ledger, monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer's standby cannot connect (say, too many connections)."""
    store: Any = ledger.store
    connect = store.connect

    def refused(idle: float | None = None, role: str = "") -> Any:
        if role == "standby":  # the standby's lease
            raise StoreUnavailable('cannot open store x: too many connections for role "r"')
        return connect(idle, role)

    monkeypatch.setattr(store, "connect", refused)


def test_a_writer_that_cannot_stand_by_is_answered_by_another_processs_leader(
    pg_url, tables, monkeypatch
):
    pg_url += COMBINE
    _register(pg_url, "n1")
    with Ledger.open(pg_url) as leader:
        assert leader.submit({"type": "heartbeat", "node": "n1"}).position == 2  # it leads
        leading: Any = leader.store.handoff  # type: ignore[attr-defined]
        decide_round = leading._round

        def slow_round(connection: Any, committing: Any) -> Any:
            time.sleep(0.5)  # the batch waits: the writer learns it cannot stand by first
            return decide_round(connection, committing)

        leading._round = slow_round
        with Ledger.open(pg_url) as writer:
            _refuse_standing_by(writer, monkeypatch)
            receipt = writer.submit({"type": "heartbeat", "node": "n1"})

    assert (receipt.status, receipt.position) == ("appended", 3)


def test_a_writer_that_cannot_stand_by_and_is_not_answered_says_why(pg_url, tables, monkeypatch):
    pg_url += COMBINE
    _register(pg_url, "n1")
    with Ledger.open(f"{pg_url}&timeout=1") as writer:
        _refuse_standing_by(writer, monkeypatch)
        with pytest.raises(StoreUnavailable, match=(
            r"no writer decided the batch within 1 s \(nothing of it was written; this process "
            r"could not stand by: cannot open store x: too many connections for role \"r\"\)$"
        )):
            writer.submit({"type": "heartbeat", "node": "n1"})

    assert tables(pg_url).head() == 1
    assert tables(pg_url).value("SELECT count(*) FROM handoff") == 0


def test_a_writer_that_loses_its_connection_after_handing_over_says_its_events_may_be_kept(
    pg_url, tables, monkeypatch
):
    pg_url += COMBINE
    _register(pg_url, "n1")
    with Ledger.open(pg_url) as writer:
        handoff: Any = writer.store.handoff  # type: ignore[attr-defined]

        def cut(connection: Any, key: str) -> Any:
            raise psycopg.OperationalError("server closed the connection unexpectedly")

        monkeypatch.setattr(handoff, "_await", cut)
        with pytest.raises(StoreUnavailable, match=(
            r": server closed the connection unexpectedly \(after the batch was handed over: "
            r"its events may or may not be kept\)$"
        )):
            writer.submit({"type": "heartbeat", "node": "n1"})
