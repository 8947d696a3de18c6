"""``project --follow`` through a lost store (``commands.follower``): it warns,
waits 1 s, then 2, 4, ... at most 30 s between tries to reopen, starts again
from 1 s once a catch-up has committed, and goes on where the tracking
position says. The store is a real SQLite ledger behind fakes of the same
interfaces that lose it on cue; the clock is a fake. The real loss, on
PostgreSQL, is in ``tests/integration/test_follow.py``.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest

from commands import follower
from ledger.application import Ledger
from ledger.errors import MadeByNewer, RulesTooNew, StoreUnavailable
from ledger.store import Store, open_store

LOST = "store sqlite:///x.db: disk I/O error"
REFUSED = "cannot open store sqlite:///x.db: connection refused"


class LosingStore:
    """A real store (``Store``, by delegation) that is lost at one read
    transaction: after ``fine_reads`` of them."""

    def __init__(self, store: Store, fine_reads: int, loss: StoreUnavailable | None = None) -> None:
        self.store = store
        self.fine_reads = fine_reads
        self.loss = StoreUnavailable(LOST) if loss is None else loss

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def reading(self) -> Any:
        if self.fine_reads == 0:
            self.fine_reads = -1
            raise self.loss
        self.fine_reads -= 1
        return self.store.reading()


class Opener:
    """Opens the real ledger as the script says, one entry per try: a number
    opens it, to be lost after that many read transactions; "refuse" is a
    store that does not answer; "newer" a store a newer release made; "rules"
    a store whose next event a newer release decided."""

    def __init__(self, *script: int | str) -> None:
        self.script = list(script)
        self.opened: list[Ledger] = []
        self.created: list[bool] = []  # whether each try may create the store

    def __call__(self, url: str, create: bool) -> Ledger:
        self.created.append(create)
        step = self.script.pop(0)
        if step == "refuse":
            raise StoreUnavailable(REFUSED)
        if step == "newer":  # upgraded meanwhile by a newer release
            raise MadeByNewer("sqlite:///x.db", 9, 2)
        store = open_store(url, create=create)
        losing = LosingStore(store, 1, RulesTooNew(2, 9, 2)) if step == "rules" else LosingStore(
            store, int(step))
        ledger = Ledger(losing)  # type: ignore[arg-type]
        self.opened.append(ledger)
        return ledger


class Clock:
    """The waits between tries; Ctrl-C at the wait after ``waits`` of them."""

    def __init__(self, waits: int) -> None:
        self.waited: list[float] = []
        self.waits = waits

    def sleep(self, seconds: float) -> None:
        if len(self.waited) == self.waits:
            raise KeyboardInterrupt
        self.waited.append(seconds)


@pytest.fixture
def url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path}/ledger.db"
    with Ledger.open(url) as ledger:
        assert ledger.submit({"type": "node-registered", "node": "n1"}).status == "appended"
    return url


def follow(url: str, opener: Opener, clock: Clock, capsys: Any, reconnect: bool = True) -> tuple[
    list[dict[str, Any]], list[str]
]:
    follower.follow(url, batch=100, poll=0.01, reconnect=reconnect, opener=opener, sleep=clock.sleep)
    out, err = capsys.readouterr()
    return [json.loads(line) for line in out.splitlines()], err.splitlines()


def test_a_lost_store_is_reopened_after_waits_that_double_up_to_30_s(url, capsys):
    opener = Opener(2, *["refuse"] * 6, 0)
    clock = Clock(waits=7)

    lines, warnings = follow(url, opener, clock, capsys)

    assert clock.waited == [1, 2, 4, 8, 16, 30, 30]
    assert opener.created == [False] * 8  # neither the first open nor a reopening makes a ledger
    assert warnings == [
        f"warning: {LOST}; reconnecting in 1 s",
        *(f"warning: {REFUSED}; reconnecting in {s} s" for s in (2, 4, 8, 16, 30, 30)),
        f"warning: {LOST}; reconnecting in 30 s",  # the last one never caught up: no reset
    ]
    assert lines == [{"following": True, "lag": 0}, {"stopped": True, "lag": None}]


def test_the_waits_start_again_at_1_s_once_a_catch_up_has_committed(url, capsys):
    opener = Opener(2, "refuse", 2, "refuse", "refuse")
    clock = Clock(waits=4)

    lines, _ = follow(url, opener, clock, capsys)

    assert clock.waited == [1, 2, 1, 2]
    assert lines == [
        {"following": True, "lag": 0},
        {"following": True, "lag": 0, "reconnected": True},
        {"stopped": True, "lag": None},
    ]


def test_the_waits_start_again_at_1_s_after_a_batch_committed_short_of_the_head(
    url, capsys, monkeypatch
):
    """A follower kept behind by writers, its connection lost after each
    batch it applies, never reaches the head: the waits still start again
    from 1 s, as a batch committed each time."""
    applied = iter([(0, 300), StoreUnavailable(LOST)] * 4)

    def project(self: Ledger, limit: int | None = None) -> tuple[int, int]:
        step = next(applied)
        if isinstance(step, Exception):
            raise step
        return step

    monkeypatch.setattr(Ledger, "project", project)
    clock = Clock(waits=3)

    lines, warnings = follow(url, Opener(100, 100, 100, 100), clock, capsys)

    assert clock.waited == [1, 1, 1]  # then Ctrl-C at the fourth wait
    assert warnings == [f"warning: {LOST}; reconnecting in 1 s"] * 4
    assert [line.get("applied") for line in lines if "applied" in line] == [300] * 4


def test_a_store_a_newer_release_made_meanwhile_ends_the_follower_at_once(url, capsys):
    opener = Opener(2, "refuse", "newer")
    clock = Clock(waits=5)

    with pytest.raises(MadeByNewer, match=r"schema version 9, this one knows 2\): upgrade"):
        follow(url, opener, clock, capsys)

    assert clock.waited == [1, 2]  # no wait after it: none would bring the store back


def test_an_event_a_newer_release_decided_ends_the_follower_at_once(url, capsys):
    opener = Opener(2, "rules", 0)
    clock = Clock(waits=5)

    with pytest.raises(RulesTooNew, match=r"decided by rules 9, newer than this alloc-ledger's"):
        follow(url, opener, clock, capsys)

    assert clock.waited == [1]  # the wait after the first loss only: none brings this back
    assert len(opener.script) == 1  # and no reopening after it


def test_no_reconnect_raises_at_the_first_loss(url, capsys):
    with pytest.raises(StoreUnavailable, match="disk I/O error"):
        follow(url, Opener(2), Clock(waits=0), capsys, reconnect=False)


def test_every_ledger_it_opened_is_closed(url, capsys, monkeypatch):
    opener = Opener(2, 2, "refuse")
    closed: list[Ledger] = []
    monkeypatch.setattr(Ledger, "close", lambda self: closed.append(self))

    follow(url, opener, Clock(waits=2), capsys)

    assert closed == opener.opened


def test_the_follower_puts_back_the_sigterm_and_sighup_handlers_it_found(url, capsys):
    before = [signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)]

    follow(url, Opener(2, "refuse"), Clock(waits=1), capsys)

    assert [signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)] == before


class StoppedWhileAskingTheLag:
    """A catch-up whose first batch commits, then a stop (Ctrl-C, SIGTERM)
    lands while the follower asks how far behind it is (a round trip)."""

    def project(self, limit: int) -> tuple[int, int]:
        return 0, limit

    def lag(self) -> int:
        raise KeyboardInterrupt


def test_a_batch_committed_before_a_stop_is_still_reported(capsys):
    """The batch's line is printed before the stop goes on (its lag unknown):
    a tool reading the lines knows every position applied (an integration
    test once saw the last line of two followers' work missing)."""
    with pytest.raises(KeyboardInterrupt):
        follower.catch_up(StoppedWhileAskingTheLag(), 40, report=True)  # type: ignore[arg-type]

    assert [json.loads(line) for line in capsys.readouterr().out.splitlines()] == [
        {"from": 0, "to": 40, "applied": 40, "lag": None}]


class LostWhileAskingTheLag(StoppedWhileAskingTheLag):
    """As above, but the store is lost (not a stop) during the lag's round
    trip, after the batch committed (helper-505)."""

    def lag(self) -> int:
        raise StoreUnavailable("store x: server closed the connection unexpectedly")


def test_a_batch_committed_before_the_store_is_lost_is_still_reported(capsys):
    """A follower that reconnects resumes after the committed batch: unless
    its line was printed, no line ever says positions 1-40 were applied."""
    with pytest.raises(StoreUnavailable):
        follower.catch_up(LostWhileAskingTheLag(), 40, report=True)  # type: ignore[arg-type]

    assert [json.loads(line) for line in capsys.readouterr().out.splitlines()] == [
        {"from": 0, "to": 40, "applied": 40, "lag": None}]
