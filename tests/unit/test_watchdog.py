"""The PostgreSQL writers' watchdog: a server that stops answering is given
up on once a statement's bound runs out, the earliest bound first."""

from __future__ import annotations

import socket
import time

import pytest

from ledger.postgres_handoff import Unanswered, Watchdog  # psycopg: a test dependency


class Connection:
    """What the watchdog reads of a connection: its socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def fileno(self) -> int:
        return self.sock.fileno()


def test_a_bound_earlier_than_the_one_the_watchdog_sleeps_towards_still_runs_out() -> None:
    """It is not woken for every statement, only for a bound that comes
    before the one it sleeps towards (a writer's lease after its timeout)."""
    mine, server = socket.socketpair()
    mine.settimeout(10)  # a watchdog that never fires fails the test, not hangs it
    dog = Watchdog()
    try:
        with dog.within(Connection(mine), 30):  # answered once it sleeps towards 30 s
            deadline = time.monotonic() + 5
            while dog.until is None and time.monotonic() < deadline:
                time.sleep(0.01)
            assert dog.until is not None
        started = time.monotonic()
        with pytest.raises(Unanswered, match="did not answer within 0.2 s"), dog.within(
            Connection(mine), 0.2
        ):
            mine.recv(1)  # the server never answers; the watchdog shuts the socket down
        assert time.monotonic() - started < 5
    finally:
        dog.close()
        mine.close()
        server.close()


def test_a_statement_answered_within_its_bound_is_left_alone() -> None:
    """Even past the bound: the bound went with the answer."""
    mine, server = socket.socketpair()
    dog = Watchdog()
    try:
        server.sendall(b"x")
        with dog.within(Connection(mine), 0.2):
            assert mine.recv(1) == b"x"
        time.sleep(0.6)  # past the bound, the watchdog awake all the while
        server.sendall(b"y")
        assert mine.recv(1) == b"y"
        assert not dog.fired
    finally:
        dog.close()
        mine.close()
        server.close()


def test_a_closed_watchdog_has_ended_its_thread() -> None:
    """A closed store leaves no thread behind (a command's test counts them)."""
    mine, server = socket.socketpair()
    dog = Watchdog()
    try:
        with dog.within(Connection(mine), 30):
            pass
        assert dog.thread is not None
        for _ in range(200):  # the thread sleeping towards its bound, as it is between statements
            dog.close()
            assert not dog.thread.is_alive()
            dog.closed, dog.thread = False, None
            with dog.within(Connection(mine), 30):
                pass
    finally:
        dog.close()
        mine.close()
        server.close()
