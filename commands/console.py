"""The console script ``alloc-ledger``: Ctrl-C while the command line is
still loading (its imports take a tenth of a second) ends it as Ctrl-C ends
a running command, ``Error: interrupted`` and exit 130, not a traceback.

It loads no pydantic plugins unless ``PYDANTIC_DISABLE_PLUGINS`` is set:
finding them reads the metadata of every installed package, 45 ms of each
one-shot command, for plugins that would only watch events being validated."""

from __future__ import annotations

import os
import sys

PLUGINS = "PYDANTIC_DISABLE_PLUGINS"


class Interrupted(KeyboardInterrupt):
    """Ctrl-C, with what a command had done by then (``detail``)."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


def interrupted(detail: str = "") -> SystemExit:
    """Ctrl-C: one line, exit 130, while loading and in a command alike."""
    sys.stderr.write(f"Error: interrupted{': ' + detail if detail else ''}\n")
    return SystemExit(130)


def main() -> None:
    os.environ.setdefault(PLUGINS, "__all__")
    try:
        from commands.cli import main as run
    except KeyboardInterrupt:
        raise interrupted() from None
    run()
