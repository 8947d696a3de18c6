"""PostgreSQL writers when the server lets them down: a connection lost
around a lock writer's COMMIT, schemas whose names hash alike, a low
``statement_timeout``, and the sessions named in ``pg_stat_activity``."""

from __future__ import annotations

import contextlib
import os
import select
import socket
import threading
import time
import zlib
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest

from ledger.application import Ledger
from ledger.errors import StoreUnavailable
from ledger.postgres_store import PostgresStore, _Pipelined

LOCK = "&writers=lock"
DECISION_TABLES = ("nodes", "slots", "allocations", "addresses")


def _register(url: str, *nodes: str) -> None:
    with Ledger.open(url) as ledger:
        for node in nodes:
            assert ledger.submit({"type": "node-registered", "node": node}).status == "appended"


def _wait_for(pg_admin: Any, statement: str, expected: Any) -> None:
    deadline = time.monotonic() + 5
    while pg_admin(statement)[0][0] != expected:
        assert time.monotonic() < deadline, f"{statement} never gave {expected!r}"
        time.sleep(0.01)


def _terminate(pg_admin: Any, pid: int) -> None:
    pg_admin(f"SELECT pg_terminate_backend({pid})")
    _wait_for(pg_admin, f"SELECT count(*) FROM pg_stat_activity WHERE pid = {pid}", 0)


def test_a_lock_writer_cut_off_after_its_commit_says_its_events_may_be_kept(
    pg_url, pg_schema, pg_admin, tables, monkeypatch
):
    url = pg_url + LOCK
    _register(url, "n1")
    send_commit = _Pipelined.commit

    def committed_then_cut(transaction: _Pipelined) -> None:
        send_commit(transaction)
        # The server commits; its answer is lost with the connection.
        _wait_for(pg_admin, f"SELECT count(*) FROM {pg_schema}.stored_events", 2)
        _terminate(pg_admin, transaction.connection.info.backend_pid)

    monkeypatch.setattr(_Pipelined, "commit", committed_then_cut)
    with Ledger.open(url) as writer, pytest.raises(StoreUnavailable) as lost:
        writer.submit({"type": "heartbeat", "node": "n1"})

    assert str(lost.value).endswith(
        "(after its COMMIT was sent: the batch's events may or may not be kept)"), lost.value
    assert "\n" not in str(lost.value)
    assert tables(url).head() == 2  # it was kept


def test_a_lock_writer_cut_off_before_its_commit_does_not_say_its_events_may_be_kept(
    pg_url, pg_admin, tables, monkeypatch
):
    url = pg_url + LOCK
    _register(url, "n1")

    def cut(transaction: _Pipelined) -> None:
        _terminate(pg_admin, transaction.connection.info.backend_pid)
        raise psycopg.OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(_Pipelined, "commit", cut)
    with Ledger.open(url) as writer, pytest.raises(StoreUnavailable) as lost:
        writer.submit({"type": "heartbeat", "node": "n1"})

    assert str(lost.value).endswith(": server closed the connection unexpectedly"), lost.value
    assert tables(url).head() == 1


@pytest.fixture
def schemas_hashed_alike(pg_schema: str, pg_admin: Any) -> Any:
    """Two schema names whose CRC-32s are one (and so were the leaders' locks
    of releases that hashed the name), dropped afterwards."""
    names = [f"{pg_schema}_ezlydttmodth", f"{pg_schema}_ffrejfwtpwrj"]
    assert len({zlib.crc32(f"alloc-ledger:leader:{n}".encode()) for n in names}) == 1
    yield names
    for name in names:
        pg_admin(f"DROP SCHEMA IF EXISTS {name} CASCADE")


def test_writers_of_two_schemas_whose_names_hash_alike_each_have_a_leader(
    schemas_hashed_alike, tables
):
    dsn = os.environ["ALLOC_LEDGER_TEST_PG"]
    first, second = (f"{dsn}?schema={name}&timeout=2" for name in schemas_hashed_alike)
    with Ledger.open(first) as leading:  # it keeps the lead of its schema while open
        assert leading.submit({"type": "node-registered", "node": "n1"}).position == 1
        assert leading.store.handoff.leading  # type: ignore[attr-defined]
        with Ledger.open(second) as writer:
            receipt = writer.submit({"type": "node-registered", "node": "n1"})

    assert (receipt.status, receipt.position) == ("appended", 1)
    assert tables(second).head() == 1


def test_two_leaders_at_once_keep_one_gapless_order_and_one_winner_each(
    pg_url, tables, replayed
):
    """As a leader of an earlier release (another lock key) beside one of this."""
    with Ledger.open(pg_url) as ledger:
        assert ledger.submit({"type": "node-registered", "node": "shared", "slots": 20}).ok
        assert ledger.submit({"type": "heartbeat", "node": "shared"}).ok
    receipts: dict[int, list[Any]] = {}
    with Ledger.open(pg_url) as one, Ledger.open(pg_url) as other:
        other.store.schema_oid = -1  # type: ignore[attr-defined]  # its lead is another lock
        for ledger in (one, other):
            assert ledger.submit({"type": "heartbeat", "node": "shared"}).ok
            handoff: Any = ledger.store.handoff  # type: ignore[attr-defined]
            deadline = time.monotonic() + 5
            while not handoff.leading:  # its standby may yet be connecting
                assert time.monotonic() < deadline
                time.sleep(0.01)
        start = threading.Barrier(2)

        def race(number: int, ledger: Ledger) -> None:
            start.wait()
            receipts[number] = [ledger.submit({
                "type": "alloc-placed", "alloc": f"a{slot}-w{number}", "node": "shared",
                "slot": slot}) for slot in range(20)]

        racers = [threading.Thread(target=race, args=pair) for pair in enumerate((one, other))]
        for racer in racers:
            racer.start()
        for racer in racers:
            racer.join(60)

    for slot in range(20):
        tries = [receipts[number][slot] for number in (0, 1)]
        assert sorted(r.status for r in tries) == ["appended", "rejected"], tries
    positions = sorted(r.position for rs in receipts.values() for r in rs)
    assert positions == list(range(5, 45))
    read = tables(pg_url)
    assert read.head() == 44
    assert read.snapshot("state_", DECISION_TABLES) == replayed(pg_url, only=DECISION_TABLES)


def _names(ledger: Ledger) -> dict[str, str]:
    """What each of a writer's sessions is called in pg_stat_activity."""
    store: Any = ledger.store
    handoff = store.handoff
    deadline = time.monotonic() + 5
    while handoff.lease_connection is None:  # its standby may yet be connecting
        assert time.monotonic() < deadline
        time.sleep(0.01)
    with store.reading() as cursor:
        cursor.execute("SHOW application_name")
        pooled = cursor.fetchone()[0]
    sessions = {"pooled": pooled}
    for what, connection in [("writer", handoff.connection), ("standby", handoff.lease_connection)]:
        sessions[what] = connection.execute("SHOW application_name").fetchone()[0]
    return sessions


def _follower_name(ledger: Ledger, monkeypatch: Any) -> str:
    store: Any = ledger.store
    opened: list[Any] = []
    connect = store._connect
    monkeypatch.setattr(store, "_connect", lambda *a: opened.append(connect(*a)) or opened[-1])
    with store.appends():
        (listening,) = opened
        return str(listening.execute("SHOW application_name").fetchone()[0])


def test_sessions_are_named_alloc_ledger_in_pg_stat_activity(pg_url, monkeypatch):
    with Ledger.open(pg_url) as ledger:
        assert ledger.submit({"type": "node-registered", "node": "n1"}).ok
        assert _names(ledger) == {
            "pooled": "alloc-ledger", "writer": "alloc-ledger writer",
            "standby": "alloc-ledger standby"}
        assert _follower_name(ledger, monkeypatch) == "alloc-ledger follower"


def test_sessions_take_the_name_the_url_gives(pg_url, monkeypatch):
    with Ledger.open(f"{pg_url}&application_name=scheduler-7") as ledger:
        assert ledger.submit({"type": "node-registered", "node": "n1"}).ok
        assert set(_names(ledger).values()) == {"scheduler-7"}
        assert _follower_name(ledger, monkeypatch) == "scheduler-7"


@pytest.mark.parametrize("writers", ["lock", "combine"])
def test_a_statement_timeout_too_short_for_a_batch_says_what_to_do(pg_url, monkeypatch, writers):
    url = f"{pg_url}&writers={writers}&timeout=3"
    _register(url, "n1")
    bounded = PostgresStore._bounded

    def outlasting(store: PostgresStore, waits: float, cursor: Any) -> None:
        bounded(store, waits, cursor)
        cursor.execute("SELECT set_config('statement_timeout', '50ms', true)")
        cursor.execute("SELECT pg_sleep(1)")  # as a batch's statements outlast a low setting

    monkeypatch.setattr(PostgresStore, "_bounded", outlasting)
    with Ledger.open(url) as writer, pytest.raises(StoreUnavailable) as cut:
        writer.submit({"type": "heartbeat", "node": "n1"})

    assert str(cut.value).endswith(
        ": canceling statement due to statement timeout (the server's statement_timeout cut it "
        "short: use smaller batches (--batch), or raise it for this role, e.g. ALTER ROLE name "
        "SET statement_timeout = '5min')"), cut.value


class FreezingProxy:
    """A TCP relay to the test server that can stop relaying (``frozen``), as
    a server stopped (SIGSTOP) or cut off without a reset looks to a client."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.frozen = threading.Event()
        self.closing = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closing.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=self._relay, args=(source, sink), daemon=True).start()

    def _relay(self, source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while not self.closing.is_set():
                if self.frozen.is_set() or not select.select([source], [], [], 0.05)[0]:
                    time.sleep(0.01)
                    continue
                data = source.recv(65536)
                if not data:
                    break
                sink.sendall(data)
        for end in (source, sink):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.closing.set()
        self.listener.close()


def test_a_writer_whose_server_stops_answering_gives_up_within_its_bounds(
    pg_url, monkeypatch, tables
):
    parts = urlsplit(pg_url)
    proxy = FreezingProxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    url = f"{parts._replace(netloc=f'{parts.username}@127.0.0.1:{proxy.port}').geturl()}&timeout=2"
    _register(url, "n1")
    thaw = threading.Timer(12, proxy.frozen.clear)  # the server answers again, much later
    try:
        with Ledger.open(url) as writer:
            handoff: Any = writer.store.handoff  # type: ignore[attr-defined]
            wait = handoff._await

            def frozen_once_handed(connection: Any, key: str) -> Any:
                proxy.frozen.set()  # its leader does not answer, nor does the server
                thaw.start()
                return wait(connection, key)

            monkeypatch.setattr(handoff, "_await", frozen_once_handed)
            started = time.monotonic()
            with pytest.raises(StoreUnavailable) as gone:
                writer.submit({"type": "heartbeat", "node": "n1"})
            waited = time.monotonic() - started
            proxy.frozen.clear()
    finally:
        thaw.cancel()
        proxy.frozen.clear()
        proxy.close()

    # the timeout (2 s) for an answer, then the lease (1 s) to take the batch back
    assert str(gone.value).endswith(
        ": the server did not answer within 1 s (after the batch was handed over: its events "
        "may or may not be kept)"), gone.value
    assert 3 <= waited < 5, waited


def test_a_writer_cut_off_while_handing_its_batch_over_says_its_events_may_be_kept(
    pg_url, monkeypatch
):
    """An immediate shutdown may end the session once the hand-over is
    committed and before its answer is read: a leader may yet decide it."""
    from ledger import postgres_handoff

    _register(pg_url, "n1")
    writer_connection = postgres_handoff.Handoff._writer_connection

    class CutWhileHanding:
        def __init__(self, connection: psycopg.Connection[Any]) -> None:
            self.connection = connection

        def __getattr__(self, name: str) -> Any:
            return getattr(self.connection, name)

        def execute(self, statement: Any, *args: Any) -> Any:
            if statement is postgres_handoff.HAND:
                raise psycopg.OperationalError("server closed the connection unexpectedly")
            return self.connection.execute(statement, *args)

    monkeypatch.setattr(postgres_handoff.Handoff, "_writer_connection",
                        lambda self: CutWhileHanding(writer_connection(self)))
    with Ledger.open(pg_url) as writer, pytest.raises(StoreUnavailable) as lost:
        writer.submit({"type": "heartbeat", "node": "n1"})

    assert str(lost.value).endswith(
        "(after the batch was handed over: its events may or may not be kept)"), lost.value


@pytest.mark.parametrize("writers", ["lock", "combine"])
def test_a_server_that_takes_no_writes_is_named_so(pg_url, monkeypatch, writers):
    """A standby in recovery refuses LISTEN and writes with 'cannot execute …
    during recovery' (helper-203, a private server started with standby.signal);
    a role or database with default_transaction_read_only set refuses them the
    same way (SQLSTATE 25006), which this server can show."""
    url = f"{pg_url}&writers={writers}"
    _register(url, "n1")
    connect = psycopg.Connection.connect.__func__  # type: ignore[attr-defined]

    def read_only(cls: Any, *args: Any, **kwargs: Any) -> Any:  # every connection, pools' too
        connection = connect(cls, *args, **kwargs)
        connection.execute("SET default_transaction_read_only = on")
        if not connection.autocommit:
            connection.commit()
        return connection

    monkeypatch.setattr(psycopg.Connection, "connect", classmethod(read_only))
    monkeypatch.setattr(psycopg, "connect", psycopg.Connection.connect)
    with pytest.raises(StoreUnavailable) as refused, Ledger.open(url) as writer:
        writer.submit({"type": "heartbeat", "node": "n1"})

    message = str(refused.value)
    assert "read-only transaction (the server takes no writes: a standby in recovery, or " \
        "default_transaction_read_only set for this role or database; give --store the " \
        "primary)" in message, message
    assert "\n" not in message
