"""``project --follow`` through a lost store, as the CLI runs it: it warns,
waits 1 s, then 2, 4, ... at most 30 s between tries, and goes on where the
tracking position says; ``--no-reconnect`` exits 3 instead. The loss and the
clock are stand-ins here (the real loss, on PostgreSQL, is in
``tests/integration/test_follow.py``); everything else is the real ledger.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from commands import follower
from commands.cli import cli
from ledger.application import Ledger
from ledger.errors import StoreUnavailable

POLL = 0.01  # the follower's wait between polls, told apart from its retry waits
LOST = "store sqlite:///x.db: disk I/O error"


class Clock:
    """``time.sleep`` for the follower: records retry waits; the first poll
    after ``polls_left`` runs out is a Ctrl-C."""

    def __init__(self, polls: int = 1, interrupt_retry: bool = False) -> None:
        self.waits: list[float] = []
        self.polls = polls
        self.interrupt_retry = interrupt_retry

    def sleep(self, seconds: float) -> None:
        if seconds == POLL:
            self.polls -= 1
            if self.polls <= 0:
                raise KeyboardInterrupt
            return
        self.waits.append(seconds)
        if self.interrupt_retry:
            raise KeyboardInterrupt


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/ledger.db"


def lose_store(monkeypatch: pytest.MonkeyPatch, times: int, then_unreachable: int = 0) -> list[int]:
    """The store is lost at the first ``times`` projections, and does not
    open again for ``then_unreachable`` tries after each loss; returns the
    positions the follower projected from, in order."""
    projected: list[int] = []
    real_project, real_open = Ledger.project, Ledger.open
    losses = iter(range(times))
    refusals: Iterator[int] = iter(())

    def project(self: Ledger, limit: int | None = None) -> tuple[int, int]:
        nonlocal refusals
        if next(losses, None) is not None:
            refusals = iter(range(then_unreachable))
            raise StoreUnavailable(LOST)
        start, end = real_project(self, limit)
        projected.append(start)
        return start, end

    def reopen(url: str | None = None) -> Ledger:
        if next(refusals, None) is not None:
            raise StoreUnavailable("cannot open store sqlite:///x.db: connection refused")
        return real_open(url)

    monkeypatch.setattr(Ledger, "project", project)
    monkeypatch.setattr(Ledger, "open", staticmethod(reopen))
    return projected


def follow(url: str, clock: Clock, monkeypatch: pytest.MonkeyPatch, *args: str) -> Result:
    monkeypatch.setattr(follower.time, "sleep", clock.sleep)
    return CliRunner().invoke(
        cli, ["--store", url, "project", "--follow", "--poll", str(POLL), *args],
        prog_name="alloc-ledger")


def stdout_lines(result: Result) -> list[dict[str, Any]]:
    return [json.loads(line) for line in result.stdout.splitlines()]


def submitted(url: str, *nodes: str) -> None:
    with Ledger.open(url) as ledger:
        for node in nodes:
            assert ledger.submit({"type": "node-registered", "node": node}).status == "appended"


def test_a_lost_store_is_reopened_after_waits_that_double_up_to_30_s(url, monkeypatch):
    submitted(url, "n1", "n2")
    projected = lose_store(monkeypatch, times=1, then_unreachable=6)
    clock = Clock()

    result = follow(url, clock, monkeypatch)

    assert result.exit_code == 0, result.output
    assert clock.waits == [1, 2, 4, 8, 16, 30, 30]
    assert result.stderr.splitlines() == [
        f"warning: {LOST}; reconnecting in 1 s",
        *(f"warning: cannot open store sqlite:///x.db: connection refused; reconnecting in {s} s"
          for s in (2, 4, 8, 16, 30, 30)),
    ]
    assert stdout_lines(result) == [
        {"following": True, "lag": 0},  # SQLite's tables are current after each submit
        {"following": True, "lag": 0, "reconnected": True},
        {"stopped": True, "lag": 0},
    ]
    assert projected == [2]  # once reopened, from where the tables were


def test_each_loss_starts_the_waits_again_at_1_s(url, monkeypatch):
    submitted(url, "n1")
    lose_store(monkeypatch, times=2, then_unreachable=1)
    clock = Clock()

    result = follow(url, clock, monkeypatch)

    assert result.exit_code == 0, result.output
    assert clock.waits == [1, 2, 1, 2]
    assert [line.get("reconnected") for line in stdout_lines(result)] == [None, True, True, None]


def test_ctrl_c_while_the_store_is_lost_stops_cleanly_without_a_lag(url, monkeypatch):
    lose_store(monkeypatch, times=1, then_unreachable=100)
    clock = Clock(interrupt_retry=True)

    result = follow(url, clock, monkeypatch)

    assert result.exit_code == 0, result.output
    assert clock.waits == [1]
    assert stdout_lines(result) == [{"following": True, "lag": 0}, {"stopped": True, "lag": None}]
    assert result.stderr == f"warning: {LOST}; reconnecting in 1 s\n"


def test_no_reconnect_exits_3_at_the_first_loss(url, monkeypatch):
    lose_store(monkeypatch, times=1)
    clock = Clock()

    result = follow(url, clock, monkeypatch, "--no-reconnect")

    assert result.exit_code == 3, result.output
    assert clock.waits == []
    assert result.stderr == f"Error: {LOST}\n"
    assert stdout_lines(result) == [{"following": True, "lag": 0}]


def test_a_store_that_cannot_be_opened_at_the_start_is_exit_3_at_once(tmp_path, monkeypatch):
    clock = Clock()

    result = follow(f"sqlite:///{tmp_path}/no/such/dir/l.db", clock, monkeypatch)

    assert result.exit_code == 3, result.output
    assert clock.waits == []
    assert result.stdout == ""
    assert result.stderr.startswith("Error: cannot open store sqlite:///")
    assert len(result.stderr.splitlines()) == 1


def test_the_follower_puts_back_the_sigterm_handler_it_found(url, monkeypatch):
    import signal

    before: Callable[..., Any] | int | None = signal.getsignal(signal.SIGTERM)

    result = follow(url, Clock(), monkeypatch)

    assert result.exit_code == 0, result.output
    assert signal.getsignal(signal.SIGTERM) is before
