"""Running the command line in tests through click's ``CliRunner``."""

from __future__ import annotations

import os
import re
import shutil
from typing import Any

import pytest
from click.testing import CliRunner, Result

from commands.cli import cli

# A store in which every question of section 3 has an answer: n1 runs a1
# (address 10.0.0.5, max_disconnect 60) and misses its heartbeat (a1 needs to
# reconnect); n2 reports a slot held by a never-placed allocation (a zombie),
# is suspected, and refuses a placement (a rejection).
STORY = [
    {"type": "node-registered", "node": "n1", "slots": 2, "at": "2026-01-01T00:00:00Z"},
    {"type": "heartbeat", "node": "n1", "at": "2026-01-01T00:00:10Z"},
    {"type": "alloc-placed", "alloc": "a1", "node": "n1", "job": "web", "slot": 0,
     "addresses": ["10.0.0.5"], "max_disconnect": 60, "at": "2026-01-01T00:00:20Z"},
    {"type": "alloc-updated", "alloc": "a1", "client_status": "running",
     "at": "2026-01-01T00:00:30Z"},
    {"type": "node-registered", "node": "n2", "slots": 1, "at": "2026-01-01T00:00:40Z"},
    {"type": "heartbeat", "node": "n2", "slots": [{"slot": 0, "alloc": "ghost"}],
     "at": "2026-01-01T00:00:50Z"},
    {"type": "node-suspected", "node": "n2", "reason": "disk", "at": "2026-01-01T00:01:00Z"},
    {"type": "alloc-placed", "alloc": "a2", "node": "n2", "at": "2026-01-01T00:01:10Z"},
    {"type": "heartbeat-missed", "node": "n1", "at": "2026-01-01T00:01:20Z"},
]


def invoke(args: list[str], code: int = 0, input: str | bytes | None = None, **kw: Any) -> Result:
    """Run the CLI as ``alloc-ledger``; check the exit code, and that nothing
    ever shows a traceback (an error is one line and an exit code)."""
    result = CliRunner().invoke(cli, args, input=input, prog_name="alloc-ledger", **kw)
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exc_info
    return result


# Root without the capabilities that let it read and write any file: a user
# whom file modes bind, for tests of unreadable or read-only stores (CI runs as root).
WITHOUT_OVERRIDE = ["setpriv", "--inh-caps=-dac_override,-dac_read_search",
                    "--bounding-set=-dac_override,-dac_read_search"]


def bound_by_file_modes(argv: list[str]) -> list[str]:
    """A command line run by a user whom file modes bind: this one, or root
    without the capabilities to override them."""
    if os.geteuid() != 0:
        return argv
    if not shutil.which("setpriv"):
        pytest.skip("running as root without setpriv: cannot run as a user file modes bind")
    return [*WITHOUT_OVERRIDE, *argv]


# A time right after another in one of the demo's history rows, on another day
# than the stories' (every ``at`` is on 2026-03-02): the row's recorded_at,
# when this run received the event.
RECEIVED = re.compile(r"(?<=\d{6}Z) +(?!2026-03-02T)\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z")


def without_received(line: str) -> str:
    """A line of the demo's output without the times this run received events."""
    return RECEIVED.sub("", line)
