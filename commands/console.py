"""The console script ``alloc-ledger``: Ctrl-C while the command line is
still loading (its imports take a tenth of a second) ends it as Ctrl-C ends
a running command, ``Error: interrupted`` and exit 130, not a traceback."""

from __future__ import annotations

import sys


def interrupted() -> SystemExit:
    """Ctrl-C: one line, exit 130, while loading and in a command alike."""
    sys.stderr.write("Error: interrupted\n")
    return SystemExit(130)


def main() -> None:
    try:
        from commands.cli import main as run
    except KeyboardInterrupt:
        raise interrupted() from None
    run()
