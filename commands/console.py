"""The console script ``alloc-ledger``: Ctrl-C while the command line is
still loading (its imports take a tenth of a second) ends it as Ctrl-C ends
a running command, ``Error: interrupted`` and exit 130, not a traceback.

It loads no pydantic plugins unless ``PYDANTIC_DISABLE_PLUGINS`` is set:
finding them reads the metadata of every installed package, 45 ms of each
one-shot command, for plugins that would only watch events being validated."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager

PLUGINS = "PYDANTIC_DISABLE_PLUGINS"


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (or a signal that ends it: ``terminated``), with what a
    command had done by then."""

    def __init__(self, detail: str, terminated: int = 0) -> None:
        super().__init__(detail)
        self.detail = detail
        self.terminated = terminated


class Terminated(KeyboardInterrupt):
    """SIGTERM (a service manager's stop) or SIGHUP (the terminal or ssh
    session closed), raised where Ctrl-C would be."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


# The signals that end a command as Ctrl-C does, and what it then says.
ENDING = {signal.SIGTERM: "terminated", signal.SIGHUP: "hung up"}


def _terminate(signum: int, frame: object) -> None:
    raise Terminated(signum)


@contextmanager
def terminated_as_interrupted() -> Iterator[None]:
    """Within the block, SIGTERM and SIGHUP raise ``Terminated`` (a
    KeyboardInterrupt) where Ctrl-C would: a command stops as on Ctrl-C
    (what is committed is reported; a follower stops cleanly), and one that
    lets it through says ``terminated`` (exit 143) or ``hung up`` (129). A
    signal ignored when it began stays ignored (``nohup``)."""
    before = {signum: signal.signal(signum, _terminate) for signum in ENDING
              if signal.getsignal(signum) is not signal.SIG_IGN}
    try:
        yield
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


def signal_of(stop: KeyboardInterrupt) -> int:
    """The signal that ended a command (0: Ctrl-C)."""
    return stop.signum if isinstance(stop, Terminated) else 0


def interrupted(detail: str = "", terminated: int = 0) -> SystemExit:
    """Ctrl-C: one line, exit 130, while loading and in a command alike;
    SIGTERM: ``terminated``, exit 143; SIGHUP: ``hung up``, exit 129."""
    what = ENDING.get(signal.Signals(terminated), "terminated") if terminated else "interrupted"
    try:
        sys.stderr.write(f"Error: {what}{': ' + detail if detail else ''}\n")
        sys.stderr.flush()
    except OSError:
        pass  # a closed terminal takes no message: the exit status still says it
    return SystemExit(128 + terminated if terminated else 130)


def main() -> None:
    os.environ.setdefault(PLUGINS, "__all__")
    try:
        from commands.cli import main as run
    except KeyboardInterrupt:
        raise interrupted() from None
    run()
