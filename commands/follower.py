"""``project`` and ``project --follow``: apply the log to the projection
tables, and keep doing it through lost connections.

A follower is a service: a server restart or a dropped connection should not
end it. When the store becomes unreachable it says so on stderr, closes the
ledger, and opens it again after 1 s, then 2, 4, ... up to 30 s between
tries, until the store answers; then it goes on from the tracking position,
which its last committed transaction recorded, so nothing is applied twice
or skipped. Only the first open fails at once (exit 3): a mistyped URL is
not an outage. ``--no-reconnect`` exits 3 on the first loss instead, for a
supervisor that restarts it.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import click

from ledger.application import Ledger
from ledger.errors import StoreUnavailable
from ledger.store import Store

RETRY_FIRST = 1.0  # seconds before the first try to reopen a lost store
RETRY_MOST = 30.0  # and at most between tries, doubling until then


def catch_up(ledger: Ledger, batch: int, report: bool = False) -> tuple[int, int]:
    """Apply everything appended so far, one transaction per batch."""
    first: int | None = None
    while True:
        start, end = ledger.project(limit=batch)
        if first is None:
            first = start
        if end <= start:
            return first, end
        if report:
            progress({"from": start, "to": end, "applied": end - start, "lag": ledger.lag()})


def follow(url: str, batch: int, poll: float, reconnect: bool = True) -> None:
    """Keep the tables current until interrupted (Ctrl-C or SIGTERM)."""
    stopping = signal.signal(signal.SIGTERM, _interrupt)  # a service manager's stop too
    try:
        _keep_following(url, batch, poll, reconnect)
    finally:
        signal.signal(signal.SIGTERM, stopping)


def _keep_following(url: str, batch: int, poll: float, reconnect: bool) -> None:
    opened = Ledger.open(url)
    ledger: Ledger | None = opened  # None while the store is lost
    resumed = False
    try:
        while True:
            try:
                _follow_while_connected(opened, batch, poll, resumed)
            except StoreUnavailable as lost:
                if not reconnect:
                    raise
                ledger = None
                _close(opened)
                ledger = opened = _reopened(url, lost)
                resumed = True
    except KeyboardInterrupt:
        progress({"stopped": True, "lag": _lag(ledger)})
    finally:
        if ledger is not None:
            _close(ledger)


def _follow_while_connected(ledger: Ledger, batch: int, poll: float, resumed: bool) -> None:
    with _appends(ledger.store) as wait:
        line: dict[str, object] = {"following": True, "lag": ledger.lag()}
        progress(line | {"reconnected": True} if resumed else line)
        while True:
            catch_up(ledger, batch, report=True)
            wait(poll)


def _reopened(url: str, lost: StoreUnavailable) -> Ledger:
    """The ledger opened again, once the store answers; each wait said on stderr."""
    error: StoreUnavailable = lost
    delay = RETRY_FIRST
    while True:
        click.echo(f"warning: {error}; reconnecting in {delay:g} s", err=True)
        time.sleep(delay)
        try:
            return Ledger.open(url)
        except StoreUnavailable as failed:
            error = failed
            delay = min(delay * 2, RETRY_MOST)


def _close(ledger: Ledger) -> None:
    """Close a ledger whose connections may be gone: what is lost is lost."""
    try:
        ledger.close()
    except Exception:  # noqa: BLE001, S110 - a broken connection has nothing left to close
        pass


def _lag(ledger: Ledger | None) -> int | None:
    """How far behind the tables are, or None while the store cannot say."""
    if ledger is None:
        return None
    try:
        return ledger.lag()
    except StoreUnavailable:
        return None


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


@contextmanager
def _appends(store: Store) -> Iterator[Callable[[float], bool]]:
    """Wake on appends: the store's notifications, or polling (SQLite)."""
    listen = getattr(store, "appends", None)
    if listen is not None:
        with listen() as wait:
            yield wait
        return

    def sleep(timeout: float) -> bool:
        time.sleep(timeout)
        return False

    yield sleep


def progress(line: dict[str, object]) -> None:
    click.echo(json.dumps(line))
