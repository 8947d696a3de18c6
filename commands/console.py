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
from contextlib import contextmanager, suppress
from typing import Any

PLUGINS = "PYDANTIC_DISABLE_PLUGINS"


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (or a signal that ends it: ``terminated``), with what a
    command had done by then."""

    def __init__(self, detail: str, terminated: int = 0, settled: bool = True) -> None:
        super().__init__(detail)
        self.detail = detail
        self.terminated = terminated
        self.settled = settled  # nothing handed to the store was left unanswered


class Signalled(KeyboardInterrupt):
    """Ctrl-C, SIGTERM (a service manager's stop) or SIGHUP (the terminal or
    ssh session closed), raised by this program's own handler where Ctrl-C
    would be. ``settled``: nothing handed to the store was left unanswered
    (see ``Held``)."""

    def __init__(self, signum: int, settled: bool = True) -> None:
        super().__init__(signum)
        self.signum = signum
        self.settled = settled


# The signals that end a command as Ctrl-C does, and what it then says.
ENDING = {signal.SIGTERM: "terminated", signal.SIGHUP: "hung up"}


def _terminate(signum: int, frame: object) -> None:
    raise Signalled(signum)


def _handled(
    handler: Any, signals: tuple[int, ...]
) -> dict[int, Any]:
    """Set ``handler`` for each of ``signals`` not ignored when it began
    (``nohup``: ignored stays ignored); what each had before."""
    return {signum: signal.signal(signum, handler) for signum in signals
            if signal.getsignal(signum) is not signal.SIG_IGN}


def _restore(before: dict[int, Any]) -> None:
    for signum, handler in before.items():
        signal.signal(signum, handler)


@contextmanager
def terminated_as_interrupted() -> Iterator[None]:
    """Within the block, SIGTERM and SIGHUP raise ``Signalled`` (a
    KeyboardInterrupt) where Ctrl-C would: a command stops as on Ctrl-C
    (what is committed is reported; a follower stops cleanly), and one that
    lets it through says ``terminated`` (exit 143) or ``hung up`` (129). A
    signal ignored when it began stays ignored (``nohup``)."""
    before = _handled(_terminate, tuple(ENDING))
    try:
        yield
    finally:
        _restore(before)


class Held:
    """Ctrl-C, SIGTERM and SIGHUP for a command that hands batches to the
    store (``installed()``): one that comes while a batch is with the store
    or its results are not yet counted (``holding()`` to ``release()``)
    waits for it, and is raised at the next ``settle()``, once the caller
    has reported that batch's results. Then every line up to
    them is kept as reported, and none after (``Signalled.settled``). A
    second one while the batch is still held is raised at once, not settled:
    the batch may be kept or not (a store that hangs can be left, as soon as
    the store hands control back: SQLite's wait for a lock runs to its busy
    timeout). One that comes while no batch is with the store (reading the
    input, printing) is raised at once, settled."""

    def __init__(self, what: str = "the batch") -> None:
        self.what = what  # what is with the store, in what a signal says
        self.pending: int | None = None
        self.held = False

    @contextmanager
    def installed(self) -> Iterator[Held]:
        before = _handled(self._signalled, (signal.SIGINT, *ENDING))
        try:
            yield self
        finally:
            _restore(before)

    @contextmanager
    def holding(self) -> Iterator[None]:
        """A batch is handed to the store: held from here until the caller has
        counted its results (``release()``), or until it fails."""
        self.held = True
        try:
            yield
        except BaseException:
            self.held = False
            raise

    def release(self) -> None:
        """The batch's results are counted: a signal need wait no longer."""
        self.held = False

    def settle(self) -> None:
        """Raise a signal that waited for a batch, now that it is reported."""
        self.release()
        if self.pending is not None:
            signum, self.pending = self.pending, None
            raise Signalled(signum)

    def _signalled(self, signum: int, frame: object) -> None:
        if self.held and self.pending is None:
            self.pending = signum
            again = "Ctrl-C" if signum == signal.SIGINT else "the signal"
            _say(f"{_what(signum)}: stopping once {self.what} with the store is committed; "
                 f"{again} again to stop sooner (then whether it is kept is not known)")
            return
        raise Signalled(signum, settled=not self.held)


def _say(line: str) -> None:
    """One line on stderr from a signal handler. The code it interrupted may
    be writing to stderr itself (a progress counter): then Python refuses the
    reentrant write, and the line is left out rather than break that."""
    with suppress(OSError, RuntimeError, ValueError):
        apart = "\n" if sys.stderr.isatty() else ""  # from a progress counter's line
        sys.stderr.write(f"{apart}{line}\n")
        sys.stderr.flush()


def _what(signum: int) -> str:
    """How a command stopped by ``signum`` (0: Ctrl-C) says so."""
    if not signum or signum == signal.SIGINT:
        return "interrupted"
    return ENDING.get(signal.Signals(signum), "terminated")


def signal_of(stop: KeyboardInterrupt) -> int:
    """The signal that ended a command (0: Ctrl-C)."""
    if isinstance(stop, Signalled) and stop.signum != signal.SIGINT:
        return stop.signum
    return 0


def interrupted(detail: str = "", terminated: int = 0) -> SystemExit:
    """Ctrl-C: one line, exit 130, while loading and in a command alike;
    SIGTERM: ``terminated``, exit 143; SIGHUP: ``hung up``, exit 129."""
    try:
        sys.stderr.write(f"Error: {_what(terminated)}{': ' + detail if detail else ''}\n")
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
