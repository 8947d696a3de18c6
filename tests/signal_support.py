"""Commands that tests stop with a signal start as they would at a terminal,
with the signals the tests send at their defaults.

A test run started in the background by a shell without job control
inherits SIGINT ignored (and one under ``nohup``, SIGHUP). A command started
from it would inherit that too, and rightly keep it ignored, as ``nohup``
asks, so a test of what Ctrl-C or a hang-up does would see nothing happen.
"""

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

SENT = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextmanager
def as_at_a_terminal() -> Iterator[None]:
    """Processes started within the block get every signal the tests send at
    its default: for the moment, the test run catches them itself (and does
    nothing), and a caught signal is back at its default in a program it runs."""
    before = {signum: signal.signal(signum, _caught) for signum in SENT}
    try:
        yield
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


def _caught(*_: Any) -> None:
    pass
