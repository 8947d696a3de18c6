"""``project`` and ``project --follow``: apply the log to the projection
tables, and keep doing it through lost connections.

A follower is a service: a server restart or a dropped connection should not
end it. When the store becomes unreachable it says so on stderr, closes the
ledger, and opens it again after 1 s, then 2, 4, ... up to 30 s between
tries, until the store answers; then it goes on from the tracking position,
which its last committed transaction recorded, so nothing is applied twice
or skipped; the waits start again from 1 s once a catch-up has committed.
Only the first open fails at once (exit 3): a mistyped URL is not an outage.
Like ``project``, a follower only opens a store that holds a ledger (a
mistyped schema is exit 3, never an empty ledger followed forever): start
it once a submit has made the store.
``--no-reconnect`` exits 3 on the first loss instead, for a supervisor that
restarts it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress

import click

from commands.console import terminated_as_interrupted
from commands.output import line
from ledger.application import Ledger
from ledger.errors import NeedsNewerRelease, StoreUnavailable
from ledger.store import Store

RETRY_FIRST = 1.0  # seconds before the first try to reopen a lost store
RETRY_MOST = 30.0  # and at most between tries, doubling until then


def catch_up(
    ledger: Ledger, batch: int, report: bool = False, committed: Callable[[], None] = lambda: None
) -> tuple[int, int]:
    """Apply everything appended so far, one transaction per batch; call
    ``committed`` after each."""
    first: int | None = None
    while True:
        start, end = ledger.project(limit=batch)
        committed()
        if first is None:
            first = start
        if end <= start:
            return first, end
        if report:
            applied = {"from": start, "to": end, "applied": end - start}
            try:
                lag = ledger.lag()  # a round trip, where a stop most often lands
            except (KeyboardInterrupt, StoreUnavailable):
                line(applied | {"lag": None})  # committed: said before it stops or reconnects
                raise
            line(applied | {"lag": lag})


def follow(
    url: str,
    batch: int,
    poll: float,
    reconnect: bool = True,
    opener: Callable[[str, bool], Ledger] | None = None,
    sleep: Callable[[float], None] = time.sleep,
    progress: bool = True,
) -> None:
    """Keep the tables current until interrupted (Ctrl-C, SIGTERM or SIGHUP).

    ``opener(url, create)`` opens the ledger, never creating it: a store
    that holds no ledger is refused at the start, and after a loss (a schema
    dropped meanwhile is not made anew, empty). ``sleep`` waits between
    tries to reopen it. ``progress``: a line per transaction, else only
    the lines that start, resume and stop following."""
    with terminated_as_interrupted():  # a service manager's stop too
        _keep_following(
            url, batch, poll, reconnect, opener or Ledger.open, Backoff(sleep), progress)


class Backoff:
    """The waits between tries to reopen a lost store: 1 s, doubling to 30 s,
    from 1 s again once a catch-up has committed, whether or not there was
    anything to apply (not merely once it opens: a store that opens and
    fails again is still lost)."""

    def __init__(self, sleep: Callable[[float], None]) -> None:
        self.sleep = sleep
        self.delay = RETRY_FIRST

    def wait(self, error: StoreUnavailable) -> None:
        click.echo(f"warning: {error}; reconnecting in {self.delay:g} s", err=True)
        self.sleep(self.delay)
        self.delay = min(self.delay * 2, RETRY_MOST)

    def reset(self) -> None:
        self.delay = RETRY_FIRST


def _keep_following(
    url: str, batch: int, poll: float, reconnect: bool,
    opener: Callable[[str, bool], Ledger], backoff: Backoff, progress: bool,
) -> None:
    opened = opener(url, False)
    ledger: Ledger | None = opened  # None while the store is lost
    resumed = False
    try:
        while True:
            try:
                _follow_while_connected(opened, batch, poll, resumed, backoff, progress)
            except StoreUnavailable as lost:
                if not reconnect or isinstance(lost, NeedsNewerRelease):
                    raise  # no wait brings back what only an upgrade can read
                ledger = None
                _close(opened)
                ledger = opened = _reopened(url, lost, opener, backoff)
                resumed = True
    except KeyboardInterrupt:
        with suppress(click.ClickException):  # the output lost: a terminal hung up (SIGHUP)
            line({"stopped": True, "lag": _lag(ledger)})  # takes no last line; it stopped
    finally:
        if ledger is not None:
            _close(ledger)


def _follow_while_connected(
    ledger: Ledger, batch: int, poll: float, resumed: bool, backoff: Backoff, progress: bool,
) -> None:
    with _appends(ledger.store) as wait:
        first: dict[str, object] = {"following": True, "lag": ledger.lag()}
        line(first | {"reconnected": True} if resumed else first)
        while True:
            catch_up(ledger, batch, report=progress, committed=backoff.reset)
            wait(poll)


def _reopened(
    url: str, lost: StoreUnavailable, opener: Callable[[str, bool], Ledger], backoff: Backoff
) -> Ledger:
    """The ledger opened again, once the store answers; each wait said on stderr."""
    error = lost
    while True:
        backoff.wait(error)
        try:
            return opener(url, False)
        except NeedsNewerRelease:
            raise  # no wait brings it back: this release cannot read it
        except StoreUnavailable as failed:
            error = failed


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

