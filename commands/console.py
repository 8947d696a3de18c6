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
    """Ctrl-C (or SIGTERM: ``terminated``), with what a command had done by then."""

    def __init__(self, detail: str, terminated: bool = False) -> None:
        super().__init__(detail)
        self.detail = detail
        self.terminated = terminated


class Terminated(KeyboardInterrupt):
    """SIGTERM (a service manager's stop), raised where Ctrl-C would be."""


def _terminate(signum: int, frame: object) -> None:
    raise Terminated


@contextmanager
def terminated_as_interrupted() -> Iterator[None]:
    """Within the block, SIGTERM raises ``Terminated`` (a KeyboardInterrupt)
    where Ctrl-C would: a command stops as on Ctrl-C (what is committed is
    reported; a follower stops cleanly), and one that lets it through says
    ``terminated`` and exits 143."""
    before = signal.signal(signal.SIGTERM, _terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def interrupted(detail: str = "", terminated: bool = False) -> SystemExit:
    """Ctrl-C: one line, exit 130, while loading and in a command alike;
    SIGTERM: ``terminated``, exit 143."""
    what = "terminated" if terminated else "interrupted"
    sys.stderr.write(f"Error: {what}{': ' + detail if detail else ''}\n")
    return SystemExit(143 if terminated else 130)


def main() -> None:
    os.environ.setdefault(PLUGINS, "__all__")
    try:
        from commands.cli import main as run
    except KeyboardInterrupt:
        raise interrupted() from None
    run()
