"""The command line as a user runs it: ``CliRunner().invoke(cli, [...])``,
the exit code (with the output as the failure message), then the exact output.

Every test names its store with ``--store`` (never the working directory).
"""

from __future__ import annotations

import csv
import io
import json
import os
import pty
import re
import select
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import click
import pytest
from cli_support import bound_by_file_modes, invoke
from click.testing import CliRunner, Result
from signal_support import as_at_a_terminal

from commands.cli import cli
from commands.console import Held
from commands.stories import all_events
from ledger.application import Ledger, Receipt
from ledger.errors import StoreUnavailable
from ledger.events import EVENT_TYPES, TYPES_NAMED, schemas_by_type
from ledger.sqlite_store import SCHEMA_VERSION, sqlite_missing
from projections.queries import COLUMNS

FORMATS = ("table", "json", "jsonl", "csv")


def lines(*events: dict[str, Any]) -> str:
    return "".join(json.dumps(e) + "\n" for e in events)


def result_line(line: int, status: str, position: int | None, error: str | None = None) -> str:
    found: dict[str, Any] = {"line": line, "status": status, "position": position, "error": error}
    return json.dumps(found) + "\n"


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/ledger.db"


def store(url: str, *args: str) -> list[str]:
    return ["--store", url, *args]


# A small story with fixed times: n1 runs a1 (slot 0, two addresses, 60 s), then disconnects.
SMALL = [
    {"type": "node-registered", "node": "n1", "slots": 2, "at": "2026-01-01T00:00:00Z"},
    {"type": "heartbeat", "node": "n1", "at": "2026-01-01T00:00:10Z"},
    {"type": "alloc-placed", "alloc": "a1", "node": "n1", "job": "web", "slot": 0,
     "addresses": ["10.0.0.5", "10.0.0.6"], "max_disconnect": 60, "at": "2026-01-01T00:00:20Z"},
    {"type": "alloc-updated", "alloc": "a1", "client_status": "running",
     "at": "2026-01-01T00:00:30Z"},
    {"type": "heartbeat-missed", "node": "n1", "at": "2026-01-01T00:01:00Z"},
]


@pytest.fixture
def small(tmp_path: Path, url: str) -> str:
    source = tmp_path / "small.jsonl"
    source.write_text(lines(*SMALL))
    invoke(store(url, "submit", str(source), "--quiet"))
    return url


@pytest.fixture(scope="module")
def stories(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A store holding the demo's four stories (49 events, 10 of them rejected)."""
    folder = tmp_path_factory.mktemp("stories")
    source = folder / "stories.jsonl"
    source.write_text(lines(*all_events()))
    url = f"sqlite:///{folder}/stories.db"
    result = invoke(store(url, "submit", str(source), "--quiet"), code=1)
    assert result.stdout == '{"appended": 39, "duplicate": 0, "rejected": 10, "invalid": 0, "duplicate_of_rejected": 0}\n'
    return url


# -- submit: one event from flags -------------------------------------------------

def test_submit_one_event_from_flags(url):
    result = invoke(store(url, "submit", "node-registered", "--node", "n1", "--slots", "2"))

    assert result.stdout == result_line(1, "appended", 1)
    assert result.stderr == ""
    nodes = json.loads(invoke(store(url, "query", "nodes")).stdout)
    assert [(n["node"], n["slots"], n["status"]) for n in nodes] == [("n1", 2, "initializing")]


def test_submit_flags_read_numbers_and_lists_as_json_and_dashes_as_underscores(url):
    invoke(store(url, "submit", "node-registered", "--node=n1", "--slots=2"))
    invoke(store(url, "submit", "heartbeat", "--node", "n1"))

    result = invoke(store(
        url, "submit", "alloc-placed", "--alloc", "a1", "--node", "n1", "--slot", "1",
        "--addresses", '["10.0.0.5"]', "--max-disconnect", "60", "--job", "42",
    ))

    assert result.stdout == result_line(1, "appended", 3)
    a1 = json.loads(invoke(store(url, "query", "alloc", "a1")).stdout)
    assert (a1["slot"], a1["addresses"], a1["max_disconnect"], a1["job"]) == (
        1, ["10.0.0.5"], 60, "42"
    )


@pytest.mark.parametrize(("event", "message"), [
    (["heartbeat", "--node", "n1", "--slots", '[{"slot": 0, "alloc": "b1"}'],
     ("field 'slots': not a JSON list (Expecting ',' delimiter at column 28); "
      """e.g. --slots '[{"slot": 0, "alloc": "a1"}]'""")),
    (["alloc-placed", "--alloc", "a1", "--node", "n1", "--addresses", "10.0.0.7"],
     ("field 'addresses': not a JSON list (Extra data at column 5); "
      """e.g. --addresses '["10.0.0.5"]'""")),
    (["heartbeat", "--node", "n1", "--at", "2026-01-01T00:00:00"],
     "field 'at': needs a time zone (Z or +hh:mm)"),
])
def test_a_list_flag_that_is_not_json_is_named_with_an_example(url, event, message):
    result = invoke(store(url, "submit", *event), code=1)
    assert result.stdout == result_line(1, "invalid", None, message)


def test_submit_help_lists_every_event_type_with_its_flags():
    """As SPEC section 2's table has them (fields with a default are optional)."""
    shown = invoke(["submit", "--help"]).stdout
    vocabulary = shown[shown.index("Event types and their fields"):].splitlines()[2:]
    assert [line.split() for line in vocabulary] == [
        ["node-registered", "--node", "[--slots]", "[--parent]"],
        ["heartbeat", "--node", "[--slots]"],
        ["heartbeat-missed", "--node"],
        ["node-down", "--node", "[--reason]"],
        ["node-removed", "--node"],
        ["node-suspected", "--node", "--reason"],
        ["health-checked", "--node", "--passed"],
        ["alloc-placed", "--alloc", "--node", "[--job]", "[--slot]", "[--addresses]",
         "[--max-disconnect]"],
        ["alloc-updated", "--alloc", "--client-status", "[--blame]"],
        ["alloc-stop-requested", "--alloc"],
        ["alloc-remove-requested", "--alloc"],
        ["alloc-removed", "--alloc"],
    ]
    assert [line.split()[0] for line in vocabulary] == list(EVENT_TYPES)


@pytest.mark.parametrize(("args", "error"), [
    (["query", "nodes", "--store", "sqlite:///x.db"],
     ("No such option '--store'. (--store goes before the command: alloc-ledger --store URL "
     "COMMAND …) (see 'alloc-ledger query nodes --help')")),
    (["submit", "heartbeat", "--node", "n1", "--store", "sqlite:///x.db"],
     ("--store goes before the command: alloc-ledger --store URL submit TYPE … "
     "(see 'alloc-ledger submit --help')")),
])
def test_store_after_the_command_says_where_it_goes(tmp_path, monkeypatch, args, error):
    monkeypatch.chdir(tmp_path)
    result = invoke(args, code=2)
    assert (result.stdout, result.stderr) == ("", f"Error: {error}\n")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args", [
    ["submit", "--store", "sqlite:///x.db", "heartbeat", "--node", "n1"],
    ["submit", "--store", "sqlite:///x.db", "events.jsonl"],
    ["submit", "--store=sqlite:///x.db", "events.jsonl"],
])
def test_store_between_submit_and_its_type_or_file_says_where_it_goes(tmp_path, monkeypatch, args):
    """Given before the TYPE or FILE, --store is told to go before the command, as
    after it (not that 'an event type comes before its flags', quoting --store
    as if it were a field of the event)."""
    monkeypatch.chdir(tmp_path)
    result = invoke(args, code=2)
    assert result.stdout == ""
    assert "--store goes before the command: alloc-ledger --store URL submit" in result.stderr
    assert "an event type comes before its flags" not in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_help_names_the_store_environment_variable():
    assert "[env var: ALLOC_LEDGER_STORE;" in " ".join(invoke(["--help"]).stdout.split())


def test_submit_from_flags_takes_the_at_time(url):
    result = invoke(store(
        url, "submit", "node-registered", "--node", "n1", "--at", "2026-03-02T09:00:00Z"
    ))
    assert result.stdout == result_line(1, "appended", 1)
    history = json.loads(invoke(store(url, "query", "history", "n1")).stdout)
    assert history[0]["at"] == "2026-03-02T09:00:00.000000Z"


@pytest.mark.parametrize(("flags", "message"), [
    (["--node", "n1", "--type", "node-down"], "--type: the event type is the first argument"),
    (["--node", "n1", "--node", "n2"], "--node is given twice"),
    (["--node=n1", "--node", "n2"], "--node is given twice"),
])
def test_submit_flags_that_would_change_the_event_silently_are_usage_errors(url, flags, message):
    result = invoke(store(url, "submit", "heartbeat", *flags), code=2)

    assert message in result.stderr
    assert not Path(url.removeprefix("sqlite:///")).exists()  # nothing opened, nothing written


def test_submit_a_rejected_event_exits_1_with_the_reason(url):
    result = invoke(store(url, "submit", "heartbeat", "--node", "n1"), code=1)
    assert result.stdout == result_line(1, "rejected", 1, "node n1 is not registered")
    assert result.stderr == ""


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["heartbeat", "--node", "n1", "--bogus", "1"], "unknown field 'bogus'"),
        (["heartbeat"], "missing field 'node'"),
        (["node-registered", "--node", "n1", "--slots", "two"],
         "field 'slots': Input should be a valid integer"),
        (["health-checked", "--node", "n1", "--passed", "maybe"],
         "field 'passed': must be true or false (JSON), not \"maybe\""),
    ],
    ids=["unknown-field", "missing-field", "wrong-type", "not-a-bool"],
)
def test_submit_an_invalid_event_exits_1_and_appends_nothing(url, args, error):
    result = invoke(store(url, "submit", *args), code=1)

    assert result.stdout == result_line(1, "invalid", None, error)
    assert not Path(url.removeprefix("sqlite:///")).exists()  # the store is not even opened


@pytest.mark.parametrize(("line", "error"), [
    (b'{"type": "heartbeat", "node": "n1"\n', "EOF while parsing an object at column 34"),
    (b'{"type": "heartbeat", "node": "n1"', "EOF while parsing an object at column 34"),
    (b'\xef\xbb\xbf{"type": "heartbeat", "node": "n1"}\n',
     "the line starts with a byte order mark (BOM); write UTF-8 without one"),
])
def test_a_line_that_is_not_json_is_placed_by_column_within_it(url, tmp_path, line, error):
    source = tmp_path / "in.jsonl"
    source.write_bytes(b'{"type": "node-registered", "node": "n1"}\n' + line)

    result = invoke(store(url, "submit", str(source)), code=1)

    assert result.stdout.splitlines()[1] == result_line(
        2, "invalid", None, f"not valid JSON: {error}").strip()


def test_submit_the_same_id_twice_is_a_duplicate_and_exits_0(url):
    first = invoke(store(url, "submit", "node-registered", "--node", "n1", "--id", "k1"))
    again = invoke(store(url, "submit", "node-registered", "--node", "n1", "--id", "k1"))

    assert first.stdout == result_line(1, "appended", 1)
    assert again.stdout == result_line(1, "duplicate", 1)


def test_a_retry_of_a_rejected_event_is_a_duplicate_carrying_it_and_exits_1(url):
    """A retry loop (``until alloc-ledger submit …``) must not take an event
    that never took effect for a success."""
    rejected = invoke(store(url, "submit", "heartbeat", "--node", "n9", "--id", "h"), code=1)
    again = invoke(store(url, "submit", "heartbeat", "--node", "n9", "--id", "h"), code=1)
    quiet = invoke(store(url, "submit", "heartbeat", "--node", "n9", "--id", "h", "--quiet"),
                   code=1)

    assert rejected.stdout == result_line(1, "rejected", 1, "node n9 is not registered")
    assert again.stdout == result_line(
        1, "duplicate", 1, "rejected at position 1: node n9 is not registered")
    assert json.loads(quiet.stdout) == {
        "appended": 0, "duplicate": 1, "rejected": 0, "invalid": 0, "duplicate_of_rejected": 1}


def test_another_event_under_a_kept_id_is_invalid_and_exits_1(url, tmp_path):
    invoke(store(url, "submit", "node-registered", "--node", "n1", "--id", "k1"))
    source = tmp_path / "events.jsonl"
    source.write_text(lines(
        {"type": "node-registered", "node": "n1", "id": "k1"},
        {"type": "node-registered", "node": "n2", "id": "k1"},
    ))

    result = invoke(store(url, "submit", str(source)), code=1)

    assert result.stdout.splitlines() == [
        result_line(1, "duplicate", 1).strip(),
        result_line(2, "invalid", None,
                    "id 'k1' is already used by another event (node-registered at position 1; "
                    "node differs): a retry must repeat the event, a new event needs a new id"
                    ).strip(),
    ]


# -- submit: a JSON Lines stream from a file or stdin -------------------------------

MIXED = (
    lines(
        {"type": "node-registered", "node": "n1", "slots": 1},
        {"type": "heartbeat", "node": "n1"},
    )
    + "\n"  # a blank line is skipped, but counted
    + lines({"type": "nope"})
    + "not json\n"
    + lines(
        {"type": "heartbeat", "node": "zz"},
        {"type": "heartbeat", "node": "n1", "extra": 1},
        {"type": "node-registered", "node": "n1", "id": "again"},
        {"type": "node-registered", "node": "n1", "id": "again"},  # a retry of a rejection
    )
)
MIXED_RESULTS = (
    result_line(1, "appended", 1)
    + result_line(2, "appended", 2)
    + result_line(4, "invalid", None, f"unknown type 'nope' (the types: {TYPES_NAMED})")
    + result_line(5, "invalid", None, "not valid JSON: expected ident at column 2")
    + result_line(6, "rejected", 3, "node zz is not registered")
    + result_line(7, "invalid", None, "unknown field 'extra'")
    + result_line(8, "rejected", 4, "node n1 is already registered")
    + result_line(9, "duplicate", 4, "rejected at position 4: node n1 is already registered")
)


def test_submit_a_file_one_result_line_per_event(tmp_path, url):
    source = tmp_path / "events.jsonl"
    source.write_text(MIXED)

    result = invoke(store(url, "submit", str(source)), code=1)

    assert result.stdout == MIXED_RESULTS


def test_submit_a_file_in_small_batches_gives_the_same_results(tmp_path, url):
    source = tmp_path / "events.jsonl"
    source.write_text(MIXED)

    result = invoke(store(url, "submit", str(source), "--batch", "2"), code=1)

    assert result.stdout == MIXED_RESULTS


def test_submit_stdin(url):
    result = invoke(store(url, "submit", "-"), code=1, input=MIXED)
    assert result.stdout == MIXED_RESULTS


def test_every_command_is_found_in_its_own_module_alone():
    """``HOME`` names each command's module, so running one imports no other."""
    import importlib

    from commands.cli import HOME, MODULES

    homes = {
        command.name: name
        for name in MODULES
        for command in importlib.import_module(f"commands.{name}").COMMANDS
    }
    assert HOME == homes


IMPORTED = """
import sys
from commands import console
sys.argv = ["alloc-ledger", *sys.argv[1:]]
try:
    console.main()
except SystemExit:
    pass
print(sorted(m for m in sys.modules if m.startswith("commands.")), file=sys.stderr)
"""


@pytest.mark.parametrize("command", [["digest"], ["verify"], ["query", "nodes"]], ids=" ".join)
def test_a_reading_command_imports_only_its_own_module(small, command):
    done = subprocess.run([sys.executable, "-c", IMPORTED, *store(small, *command)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    home = "commands.audit" if command[0] != "query" else "commands.query"
    assert done.stderr.strip().splitlines()[-1] == str(sorted(
        {"commands.cli", "commands.console", "commands.output", home}))


class InterruptedImport:
    """A finder that is Ctrl-C'd while the command line's module is loading."""

    def find_spec(self, name: str, *_: Any) -> None:
        if name == "commands.cli":
            raise KeyboardInterrupt


def test_ctrl_c_while_the_command_line_loads_exits_130_in_one_line(monkeypatch, capsys):
    from commands import console

    monkeypatch.delitem(sys.modules, "commands.cli")
    monkeypatch.setattr(sys, "meta_path", [InterruptedImport(), *sys.meta_path])
    with pytest.raises(SystemExit) as exited:
        console.main()

    assert (exited.value.code, capsys.readouterr().err) == (130, "Error: interrupted\n")


# A fresh interpreter runs the console script and says, as it exits, whether
# pydantic ever looked for plugins (its loader's cache is filled on the first look).
LOOKED_FOR_PLUGINS = """
import atexit, sys
from pydantic.plugin import _loader
atexit.register(lambda: print("looked:", _loader._plugins is not None, file=sys.stderr))
sys.argv = ["alloc-ledger", "schema"]
from commands import console
console.main()
"""


@pytest.mark.parametrize("chosen, looked", [(None, False), ("", True), ("logfire", True)])
def test_the_command_line_loads_no_pydantic_plugins_unless_told_which(chosen, looked):
    from commands import console

    env = {k: v for k, v in os.environ.items() if k != console.PLUGINS}
    if chosen is not None:
        env[console.PLUGINS] = chosen
    done = subprocess.run(
        [sys.executable, "-c", LOOKED_FOR_PLUGINS], env=env, capture_output=True, text=True,
        timeout=60, check=False,
    )

    assert done.returncode == 0, done.stderr
    assert '"title": "alloc-ledger event"' in done.stdout
    assert done.stderr == f"looked: {looked}\n"


def test_ctrl_c_while_the_arguments_are_read_exits_130_in_one_line(url, monkeypatch):
    def interrupted(*_: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(click.Group, "parse_args", interrupted)
    result = invoke(store(url, "query", "nodes"), code=130)

    assert (result.stdout, result.stderr) == ("", "Error: interrupted\n")


def test_submit_stdin_through_a_pipe(url):
    done = subprocess.run(
        [sys.executable, "-m", "commands", "--store", url, "submit", "-"],
        input=MIXED, capture_output=True, text=True, timeout=60, check=False,
    )
    assert (done.returncode, done.stderr) == (1, "")
    assert done.stdout == MIXED_RESULTS


@pytest.mark.parametrize(("sig", "code", "what"), [
    (signal.SIGINT, 130, "interrupted"),  # Ctrl-C
    (signal.SIGTERM, 143, "terminated"),  # a service manager's stop
    (signal.SIGHUP, 129, "hung up"),  # the terminal or ssh session closed
])
@pytest.mark.parametrize("quiet", [False, True])
def test_ctrl_c_on_a_stream_exits_130_in_one_line_saying_what_was_kept(url, quiet, sig, code, what):
    with as_at_a_terminal():
        writer = subprocess.Popen(
            [sys.executable, "-m", "commands", "--store", url, "submit", "-",
             *(["--quiet"] * quiet)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
    assert writer.stdin is not None and writer.stdout is not None
    writer.stdin.write(lines({"type": "node-registered", "node": "n1"},
                             {"type": "alloc-removed", "alloc": "a1"}))
    writer.stdin.flush()
    if quiet:  # nothing on stdout until the end: wait until the ledger holds both and
        # the command waits for the next line (it has counted what it committed then)
        deadline = time.monotonic() + 60
        while not (_head(url) >= 2 and _reading_stdin(writer.pid)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _head(url) >= 2 and _reading_stdin(writer.pid), "it never came to wait for more"
    else:
        assert writer.stdout.readline() == result_line(1, "appended", 1)
        assert json.loads(writer.stdout.readline())["status"] == "rejected"

    writer.send_signal(sig)
    out, errors = writer.communicate(timeout=60)

    assert (writer.returncode, out, errors) == (code, "", (
        f"Error: {what}: every line up to 2 was decided and is kept as decided "
        "(1 appended, 0 duplicate, 1 rejected, 0 invalid); no later line was kept\n"))
    assert json.loads(invoke(store(url, "query", "nodes")).stdout)[0]["node"] == "n1"


def test_a_stream_started_with_sighup_ignored_goes_on_when_it_comes(url):
    """``nohup alloc-ledger submit …``: a closed terminal does not end it."""
    writer = subprocess.Popen(
        ["nohup", sys.executable, "-m", "commands", "--store", url, "submit", "-"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    assert writer.stdin is not None and writer.stdout is not None
    writer.stdin.write(lines({"type": "node-registered", "node": "n1"}))
    writer.stdin.flush()
    assert writer.stdout.readline() == result_line(1, "appended", 1)

    writer.send_signal(signal.SIGHUP)
    out, errors = writer.communicate(lines({"type": "heartbeat", "node": "n1"}), timeout=60)

    assert (writer.returncode, out, errors) == (0, result_line(2, "appended", 2), "")


def on_a_terminal(*args: str) -> tuple[int, int]:
    """``python -m commands ARGS`` on a new pseudo-terminal: (its pid, the terminal)."""
    with as_at_a_terminal():
        pid, terminal = pty.fork()
        if pid == 0:  # the command, on the terminal's other side (within the block: it
            # never leaves it, which would put back what the test run ignores)
            os.execv(sys.executable, [sys.executable, "-m", "commands", *args])
    return pid, terminal


def read_until(terminal: int, shown: bytes, seen: bytes = b"") -> bytes:
    """What the terminal showed, after ``seen``, once it shows ``shown`` (60 s at most)."""
    deadline = time.monotonic() + 60
    while shown not in seen and time.monotonic() < deadline:
        if select.select([terminal], [], [], 0.5)[0]:
            seen += os.read(terminal, 4096)
    assert shown in seen, seen
    return seen


@pytest.mark.parametrize(("command", "shown", "code"), [
    (["submit", "-"], b'"status": "appended"', 129),  # hung up, saying so where it can
    (["project", "--follow"], b'"following": true', 0),  # a follower stops as on SIGTERM
])
def test_a_terminal_that_hangs_up_ends_a_command_as_sighup_says(url, command, shown, code):
    """The terminal itself goes away (an ssh session closed): SIGHUP, and
    every write to it fails from then on, the last lines included."""
    invoke(store(url, "submit", "node-registered", "--node", "n0"))
    pid, terminal = on_a_terminal("--store", url, *command)
    os.write(terminal, b'{"type": "node-registered", "node": "n1"}\n')
    read_until(terminal, shown)

    os.close(terminal)  # the hang-up

    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == code


def test_flags_after_a_file_that_is_there_are_extra_arguments(url, tmp_path):
    """A file named like an event type is read as the file: flags after it
    are extra, not those of an event type."""
    source = tmp_path / "heartbeat"
    source.write_text(lines({"type": "node-registered", "node": "n1"}))
    result = invoke(store(url, "submit", str(source), "--node", "n1"), code=2)

    assert result.stderr == (
        f"Error: unexpected extra arguments (--node n1): submit reads one stream at a time, "
        f"here the file '{source}' (see 'alloc-ledger submit --help')\n")
    assert not Path(url[len("sqlite:///"):]).exists()


def test_a_stream_typed_at_a_terminal_says_how_to_end_it(url):
    """``submit -`` on a terminal would otherwise wait without a word."""
    pid, terminal = on_a_terminal("--store", url, "submit", "-")
    seen = read_until(terminal, b"reading events from the terminal, one JSON object per line; "
                                b"Ctrl-D ends")
    os.write(terminal, b'{"type": "node-registered", "node": "n1"}\n')
    read_until(terminal, b'"status": "appended"', seen)
    os.write(terminal, b"\x04")  # Ctrl-D: the end of the stream

    _, status = os.waitpid(pid, 0)
    os.close(terminal)
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_piped_stream_says_nothing_on_stderr(url):
    result = invoke(store(url, "submit", "-"), input=lines({"type": "node-registered", "node": "n1"}))
    assert (result.stdout, result.stderr) == (result_line(1, "appended", 1), "")


def failing_submit(monkeypatch: pytest.MonkeyPatch, failure: Exception) -> None:
    """``submit TYPE`` fails with ``failure``, as a bug would: no rule names it."""
    from commands import submit as submitting

    def broken(*args: object) -> Receipt:
        raise failure

    monkeypatch.setattr(submitting, "_one_result", broken)


@pytest.mark.parametrize("failure", [RuntimeError("boom"), OSError(5, "Input/output error")],
                         ids=["a bug", "an OSError not about stdout"])
def test_a_failure_no_rule_names_is_one_line_not_a_traceback(url, monkeypatch, failure):
    failing_submit(monkeypatch, failure)
    monkeypatch.delenv("ALLOC_LEDGER_DEBUG", raising=False)
    result = invoke(store(url, "submit", "heartbeat", "--node", "n1"), code=1)

    assert result.stderr == (
        f"Error: internal error: {type(failure).__name__}: {failure} "
        "(set ALLOC_LEDGER_DEBUG=1 for the traceback)\n")


def test_alloc_ledger_debug_lets_the_traceback_through(url, monkeypatch):
    failing_submit(monkeypatch, RuntimeError("boom"))
    monkeypatch.setenv("ALLOC_LEDGER_DEBUG", "1")
    result = CliRunner().invoke(cli, store(url, "submit", "heartbeat", "--node", "n1"))

    assert isinstance(result.exception, RuntimeError) and str(result.exception) == "boom"


def test_a_store_lost_mid_stream_says_how_far_it_got(tmp_path, url, monkeypatch):
    """A lost server (a restart, a terminated session) ends the stream with
    exit 3, saying which lines were decided and kept before it."""
    from ledger.application import Ledger
    from ledger.errors import StoreUnavailable

    source = tmp_path / "events.jsonl"
    source.write_text(lines(*SMALL))
    submitted = Ledger.submit_batches

    def lost_after_one_batch(ledger, batches):
        with closing(submitted(ledger, batches)) as receipts:  # as a caller would close it
            yield next(receipts)
            raise StoreUnavailable(f"store {url}: server closed the connection unexpectedly")

    monkeypatch.setattr(Ledger, "submit_batches", lost_after_one_batch)
    result = invoke(store(url, "submit", str(source), "--batch", "2"), code=3)

    assert result.stdout == result_line(1, "appended", 1) + result_line(2, "appended", 2)
    assert result.stderr == (
        f"Error: store {url}: server closed the connection unexpectedly; every line up to 2 "
        "was decided and is kept as decided (2 appended, 0 duplicate, 0 rejected, 0 invalid); "
        "later ones may be kept too (resubmit with ids to learn which: kept ones answer "
        "duplicate)\n")


def _reading_stdin(pid: int) -> bool:
    """Whether a process's main thread waits in read(2) on its standard input
    (Linux, x86-64 and arm64 numbers: 0 and 63)."""
    try:
        call = Path(f"/proc/{pid}/syscall").read_text().split()
    except OSError:
        return False
    return len(call) > 1 and call[0] in ("0", "63") and call[1] == "0x0"


def _head(url: str) -> int:
    """The head of the log, read as a reporting tool would; 0 until the
    store and its log exist (the writer may be making them)."""
    path = Path(url[len("sqlite:///"):])
    try:
        with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as reader:
            return int(reader.execute(
                "SELECT COALESCE(MAX(originator_version), 0) FROM stored_events").fetchone()[0])
    except sqlite3.Error:
        return 0


def test_submit_quiet_prints_only_a_summary(tmp_path, url):
    source = tmp_path / "events.jsonl"
    source.write_text(MIXED)

    result = invoke(store(url, "submit", str(source), "--quiet"), code=1)

    assert result.stdout == '{"appended": 2, "duplicate": 1, "rejected": 2, "invalid": 3, "duplicate_of_rejected": 1}\n'


@pytest.mark.parametrize("quiet", [False, True])
@pytest.mark.parametrize("text", ["", "\n  \n"])
def test_a_stream_without_events_says_so_on_stderr(tmp_path, url, quiet, text):
    """A producer that died before writing anything must not look like a
    quiet success: exit 0 (nothing was refused), and one line on stderr."""
    source = tmp_path / "empty.jsonl"
    source.write_text(text)
    flags = ["--quiet"] * quiet
    summary = ('{"appended": 0, "duplicate": 0, "rejected": 0, "invalid": 0, '
               '"duplicate_of_rejected": 0}\n') if quiet else ""

    from_file = invoke(store(url, "submit", str(source), *flags))
    from_stdin = invoke(store(url, "submit", "-", *flags), input=text)

    assert (from_file.stdout, from_file.stderr) == (summary, f"no events in {source}\n")
    assert (from_stdin.stdout, from_stdin.stderr) == (summary, "no events in stdin\n")


def test_submit_quiet_exits_0_when_everything_was_appended(tmp_path, url):
    source = tmp_path / "events.jsonl"
    source.write_text(lines(*SMALL))

    result = invoke(store(url, "submit", str(source), "--quiet"))

    assert result.stdout == '{"appended": 5, "duplicate": 0, "rejected": 0, "invalid": 0, "duplicate_of_rejected": 0}\n'


# -- usage errors: exit 2 -----------------------------------------------------------

COMMAND_NAMES = {"submit", "query", "nodes", "allocs", "alloc", "history", "needs-reconnect", "slots",
                 "replay", "audit"}


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["submit"], "Missing argument 'TYPE|FILE|-'."),
        (["submit", "heartbeat", "node"], "expected --field value, got 'node'"),
        (["submit", "heartbeat", "--node"], "--node needs a value"),
        (["submit", "missing.jsonl"],
         "Invalid value: cannot read missing.jsonl: No such file or directory"),
        (["submit", "nosuch-type", "--node", "x"],
         (f"'nosuch-type' is not an event type ({TYPES_NAMED}); flags (--node x) follow an "
          "event type: alloc-ledger submit TYPE --field value")),
        (["submit", "-", "extra"],
         "unexpected extra argument (extra): submit reads one stream at a time, here stdin (-)"),
        (["submit", "a.jsonl", "b.jsonl", "c.jsonl"],
         ("unexpected extra arguments (b.jsonl c.jsonl): submit reads one stream at a time, "
          "here the file 'a.jsonl'")),
        (["submit", "--node", "n1"],
         f"an event type comes before its flags: alloc-ledger submit TYPE --node n1 ({TYPES_NAMED})"),
        (["submit", "--node"],
         f"an event type comes before its flags: alloc-ledger submit TYPE --node ({TYPES_NAMED})"),
        (["submit", "heartbeet"],
         ("Invalid value: cannot read heartbeet: No such file or directory "
          "(nor is it an event type)")),
        (["submit", "-", "--batch", "0"],
         "Invalid value for '--batch': 0 is not in the range 1<=x<=100000."),
        (["nosuch"], "No such command 'nosuch'."),
        (["--bogus"], "No such option '--bogus'."),
        (["query", "allocs", "--status", "bogus"],
         ("Invalid value for '--status': 'bogus' is not one of 'complete', 'failed', 'lost', "
          "'pending', 'running', 'unknown'.")),
        (["query", "nosuch"], "No such command 'nosuch'."),
        (["query", "nodes", "--format", "xml"],
         "Invalid value for '--format': 'xml' is not one of 'table', 'json', 'jsonl', 'csv'."),
        (["query", "nodes", "--as-of", "yesterday"],
         ("Invalid value for '--as-of': 'yesterday' is neither a position nor an "
          "RFC 3339 timestamp (e.g. 2026-01-01T12:00:00Z)")),
        (["query", "nodes", "--as-of", "2026-01-01T00:00:00"],
         ("Invalid value for '--as-of': '2026-01-01T00:00:00' needs a time zone "
          "(Z or +hh:mm)")),
        (["query", "alloc"], "Missing argument 'ALLOC'."),
        (["query", "history"], "Missing argument 'ENTITY'."),
        (["query", "needs-reconnect", "--now", "12"],
         "Invalid value for '--now': '12' is not an RFC 3339 time (e.g. 2026-01-01T12:00:00Z)"),
        (["query", "needs-reconnect", "--now", "2026-01-01"],
         ("Invalid value for '--now': '2026-01-01' is not an RFC 3339 time "
          "(e.g. 2026-01-01T12:00:00Z)")),
        (["query", "nodes", "--as-of", "2026-01-01T00:00Z"],
         ("Invalid value for '--as-of': '2026-01-01T00:00Z' is neither a position nor an "
          "RFC 3339 timestamp (e.g. 2026-01-01T12:00:00Z)")),
        (["query", "nodes", "--as-of", "0001-01-01T00:00:00+10:00"],
         ("Invalid value for '--as-of': '0001-01-01T00:00:00+10:00' is outside the years 1 to "
          "9999 in UTC")),
        (["query", "nodes", "--as-of"], "Option '--as-of' requires an argument."),
        (["query", "nodes", "--as-of", "\u0663"],  # ARABIC-INDIC DIGIT THREE: int() takes it
         ("Invalid value for '--as-of': '\u0663' is neither a position nor an RFC 3339 "
          "timestamp (e.g. 2026-01-01T12:00:00Z)")),
        (["query", "needs-reconnect", "--now", "2026-12-31T23:59:60Z"],
         ("Invalid value for '--now': '2026-12-31T23:59:60Z': second must be in 0..59 (the "
          "ledger's times have no leap second :60; write :59.999999)")),
        (["query", "nodes", "--as-of", "2026-02-30T00:00:00Z"],
         "Invalid value for '--as-of': '2026-02-30T00:00:00Z': day is out of range for month"),
        (["replay", "--to", "0_3"], "Invalid value for '--to': '0_3' is not a position (digits 0-9)"),
        (["replay", "--to", " 3"], "Invalid value for '--to': ' 3' is not a position (digits 0-9)"),
        (["audit", "--from", "\u0663"],
         "Invalid value for '--from': '\u0663' is not a position (digits 0-9)"),
        (["query", "history", ""], ("Invalid value for 'ENTITY': a node, allocation, slot (n1#0) "
                                    "or address is needed, not an empty text")),
        (["query", "history", "n\udcff1"],  # the byte 0xff, as Python reads it from argv
         "Invalid value for 'ENTITY': n\\xff1 is not UTF-8 (the ledger's names are UTF-8 text)"),
        (["query", "allocs", "--job", "w\udce9b"],
         "Invalid value for '--job': w\\xe9b is not UTF-8 (the ledger's names are UTF-8 text)"),
        (["query", "slots", "--node", ""],
         "Invalid value for '--node': a node name is needed, not an empty text"),
        # an option that takes one value, given twice: the last would win unseen
        (["query", "nodes", "--as-of", "1", "--as-of=2"], "--as-of is given twice"),
        (["query", "nodes", "--format", "json", "--format", "csv"], "--format is given twice"),
        (["replay", "--to", "1", "--to", "2"], "--to is given twice"),
        (["--store", "sqlite:///other.db", "query", "nodes"], "--store is given twice"),
        (["submit", "heartbeat", "--node", "--slots", "[]"],
         ("--node needs a value, not the flag --slots (a value that starts with -- is written "
          "--node=--slots)")),
        (["query", "alloc", " "],
         "Invalid value for 'ALLOC': an allocation id is needed, not an empty text"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else None,
)
def test_usage_errors_exit_2_in_one_line_pointing_at_the_help(url, args, error):
    result = invoke(store(url, *args), code=2)

    assert result.stdout == ""
    named = [a for a in args[:2] if a in COMMAND_NAMES]  # the command the help is of
    where = " ".join(["alloc-ledger", *named])
    assert result.stderr == f"Error: {error} (see '{where} --help')\n"


def test_an_option_s_name_after_dashes_is_an_argument_not_the_option_twice(url):
    """A name may start with --; after ``--`` it is an argument."""
    invoke(store(url, "submit", "node-registered", "--node=--format"))
    result = invoke(store(url, "query", "history", "--format", "json", "--", "--format"))
    assert [row["event"]["node"] for row in json.loads(result.stdout)] == ["--format"]
    assert invoke(store(url, "query", "nodes", "--as-of", "1", "--as-of", "2", "--help")
                  ).stdout.startswith("Usage: alloc-ledger query nodes")


def test_a_group_without_its_command_shows_its_help(url):
    result = invoke(store(url, "query"), code=2)

    assert result.stdout == ""
    assert result.stderr.startswith("Usage: alloc-ledger query [OPTIONS] COMMAND [ARGS]...\n")
    assert "Error" not in result.stderr and "--help')" not in result.stderr


def test_a_bad_now_is_reported_as_now(url):
    result = invoke(store(url, "query", "needs-reconnect", "--now", "soon"), code=2)
    assert "--as-of" not in result.stderr
    assert "Invalid value for '--now': 'soon' is not an RFC 3339 time" in result.stderr


# -- the store cannot be opened or reached: exit 3, one line ------------------------

COMMANDS = [
    ["submit", "heartbeat", "--node", "n1"],
    ["query", "nodes"],
    ["query", "nodes", "--as-of", "1"],
    ["query", "history", "n1"],
]


def one_line_store_error(result: Result, message: str) -> None:
    assert result.stdout == ""
    assert result.stderr == f"Error: {message}\n"


@pytest.mark.parametrize("args", COMMANDS, ids=" ".join)
def test_a_store_in_a_missing_directory_exits_3(tmp_path, args):
    url = f"sqlite:///{tmp_path}/missing/ledger.db"
    result = invoke(store(url, *args), code=3)
    one_line_store_error(
        result, f"cannot open store {url}: directory {tmp_path}/missing does not exist"
    )
    assert not (tmp_path / "missing").exists()


@pytest.mark.parametrize("args", COMMANDS, ids=" ".join)
def test_a_store_that_is_not_a_database_exits_3(tmp_path, args):
    (tmp_path / "junk.db").write_text("this is not a database\n" * 100)
    url = f"sqlite:///{tmp_path}/junk.db"
    result = invoke(store(url, *args), code=3)
    one_line_store_error(result, f"store {url}: file is not a database")


@pytest.mark.parametrize("at", ["0001-01-01T00:00:00+10:00", "9999-12-31T23:59:59-14:00"])
def test_a_time_outside_the_years_1_to_9999_in_utc_is_invalid_and_the_rest_is_kept(url, at):
    result = invoke(store(url, "submit", "-"), input=lines(
        {"type": "node-registered", "node": "n1"},
        {"type": "heartbeat", "node": "n1", "at": at},
        {"type": "heartbeat", "node": "n1", "at": "0001-01-01T00:00:00-10:00"},
    ), code=1)

    assert [json.loads(line) for line in result.stdout.splitlines()][1:] == [
        {"line": 2, "status": "invalid", "position": None,
         "error": "field 'at': the time is outside the years 1 to 9999 in UTC"},
        {"line": 3, "status": "appended", "position": 2, "error": None},
    ]


@pytest.mark.parametrize("name", ["folder/", "new/"])
def test_a_store_url_ending_in_a_slash_exits_3_and_creates_nothing(tmp_path, name):
    (tmp_path / "folder").mkdir()
    url = f"sqlite:///{tmp_path}/{name}"
    result = invoke(store(url, "submit", "heartbeat", "--node", "n1"), code=3)
    one_line_store_error(
        result, f"cannot open store {url}: {tmp_path}/{name} names a directory; name a file in "
        f"it, e.g. sqlite:///{tmp_path}/{name.rstrip('/')}/alloc-ledger.db"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder"]
    assert list((tmp_path / "folder").iterdir()) == []


READING = [
    ["query", "nodes"],
    ["query", "nodes", "--format", "json"],
    ["query", "history", "n1"],
    ["verify"],
    ["digest"],
    ["replay"],
    ["audit"],
    ["project"],  # on SQLite submits keep the tables current: nothing to make
    ["project", "--follow"],
]


@pytest.mark.parametrize(("script", "tables"), [
    ("CREATE TABLE invoices (x); CREATE VIEW totals AS SELECT 1", "invoices, totals"),
    (("CREATE TABLE stored_events (originator_id TEXT, originator_version INTEGER, topic TEXT, "
      "state BLOB, PRIMARY KEY (originator_id, originator_version)); "
      "INSERT INTO stored_events VALUES ('x', 1, 'app:Created', x'7b7d')"),  # another application's
     "stored_events (with events)"),
    ("CREATE TABLE stored_events (id INTEGER, body TEXT)", "stored_events (of other columns)"),
    ("CREATE TABLE tracking (job TEXT)", "tracking (of other columns)"),
    # a schema version of its own: an earlier ledger's (1..3) or a newer one's (99)
    ("CREATE TABLE invoices (x); PRAGMA user_version = 2", "invoices"),
    ("CREATE TABLE nodes (id INTEGER PRIMARY KEY, hostname TEXT); PRAGMA user_version = 3",
     "nodes"),
    ("CREATE TABLE invoices (x); PRAGMA user_version = 99", "invoices"),
    (("CREATE TABLE invoices (x); CREATE TABLE orders (x); CREATE TABLE payments (x); "
      "CREATE TABLE refunds (x)"), "invoices, orders, payments, …"),
], ids=["other tables", "an event store with events", "an empty event store of its own",
        "a tracking table of its own", "a version of its own", "a version and nodes of its own",
        "a version beyond this release's", "more tables than it names"])
@pytest.mark.parametrize(("args", "advice"), [
    (["submit", "node-registered", "--node", "n1"], "name a new file for the ledger"),
    *[(args, "check --store") for args in READING],  # not "nothing has been submitted to it"
], ids=lambda value: " ".join(value) if isinstance(value, list) else None)
def test_a_database_of_something_else_is_left_as_it_is(tmp_path, script, tables, args, advice):
    with closing(sqlite3.connect(tmp_path / "other.db")) as other, other:
        other.executescript(script)
        before = other.execute("SELECT * FROM sqlite_master ORDER BY name").fetchall()
        version = other.execute("PRAGMA user_version").fetchone()
    url = f"sqlite:///{tmp_path}/other.db"
    result = invoke(store(url, *args), code=3)
    one_line_store_error(
        result, f"cannot open store {url}: {tmp_path}/other.db is a database of something "
        f"else (tables {tables}), not a ledger; {advice}"
    )
    with closing(sqlite3.connect(tmp_path / "other.db")) as other:
        after = other.execute("SELECT * FROM sqlite_master ORDER BY name").fetchall()
        assert (after, other.execute("PRAGMA user_version").fetchone()) == (before, version)


def test_a_ledger_missing_a_projection_table_is_still_a_ledger_verify_can_check(tmp_path):
    """A file is a ledger by its log: one whose nodes table was dropped by
    hand is checked by verify, not taken for another application's."""
    url = f"sqlite:///{tmp_path}/ledger.db"
    invoke(store(url, "submit", "node-registered", "--node", "n1"))
    with closing(sqlite3.connect(tmp_path / "ledger.db")) as db, db:
        db.execute("DROP TABLE nodes")

    assert json.loads(invoke(store(url, "verify")).stdout)["ok"] is True
    one_line_store_error(invoke(store(url, "query", "nodes"), code=3),
                         f"store {url}: no such table: nodes (a projection table dropped by "
                         "hand? alloc-ledger replay --repair makes it again from the log)")
    invoke(store(url, "replay", "--repair"))
    assert [n["node"] for n in json.loads(invoke(store(url, "query", "nodes")).stdout)] == ["n1"]


@pytest.mark.skipif(os.geteuid() != 0, reason="as another user /proc is refused as not writable first")
def test_a_folder_that_takes_no_files_even_from_root_is_named(monkeypatch):
    """/proc: root may write the folder, yet SQLite can make no file there."""
    monkeypatch.chdir("/proc")
    result = invoke(["submit", "heartbeat", "--node", "n1"], code=3)
    assert result.stderr == (
        "Error: store sqlite:///alloc-ledger.db: unable to open database file "
        "/proc/alloc-ledger.db (may this user create files in /proc?)\n")


def test_a_store_of_a_newer_schema_is_refused_untouched(tmp_path):
    url = f"sqlite:///{tmp_path}/ledger.db"
    invoke(store(url, "submit", "node-registered", "--node", "n1"))
    with closing(sqlite3.connect(tmp_path / "ledger.db")) as newer, newer:
        newer.execute("PRAGMA user_version = 99")
    result = invoke(store(url, "query", "nodes"), code=3)
    one_line_store_error(
        result, f"cannot open store {url}: it was made by a newer alloc-ledger "
        f"(schema version 99, this one knows {SCHEMA_VERSION}): upgrade"
    )


def test_a_ledger_whose_creation_was_cut_short_is_created_on_the_next_submit(tmp_path):
    url = f"sqlite:///{tmp_path}/ledger.db"
    invoke(store(url, "submit", "node-registered", "--node", "n1"))
    with closing(sqlite3.connect(tmp_path / "ledger.db")) as cut, cut:
        # as if the process had died after the log's table, before the rest
        dropped = [row[0] for row in cut.execute(  # all but what the recorder makes first
            "SELECT name FROM sqlite_master WHERE type IN ('table', 'view') "
            "AND name NOT IN ('stored_events', 'tracking', 'sqlite_sequence')")]
        for name in dropped:
            kind = cut.execute("SELECT type FROM sqlite_master WHERE name = ?", (name,)).fetchone()[0]
            cut.execute(f"DROP {kind} IF EXISTS {name}")
        cut.execute("DROP TRIGGER IF EXISTS stored_events_append_only_delete")
        cut.execute("DELETE FROM stored_events")
        cut.execute("DELETE FROM tracking WHERE application_name != '__migration__'")
        cut.execute("PRAGMA user_version = 0")
    result = invoke(store(url, "submit", "node-registered", "--node", "n1"))
    assert json.loads(result.stdout)["status"] == "appended"


@pytest.fixture
def sqlite_checked_again() -> Iterator[None]:
    """The store checks this Python's SQLite once per process: again here."""
    sqlite_missing.cache_clear()
    yield
    sqlite_missing.cache_clear()


@pytest.mark.usefixtures("sqlite_checked_again")
def test_a_python_whose_sqlite_is_too_old_exits_3(tmp_path, monkeypatch):
    monkeypatch.setattr(sqlite3, "sqlite_version_info", (3, 31, 1))
    monkeypatch.setattr(sqlite3, "sqlite_version", "3.31.1")
    url = f"sqlite:///{tmp_path}/ledger.db"
    result = invoke(store(url, "submit", "node-registered", "--node", "n1"), code=3)
    one_line_store_error(
        result, f"cannot open store {url}: SQLite 3.33.0 or newer is needed; "
        "this Python uses SQLite 3.31.1"
    )
    assert not (tmp_path / "ledger.db").exists()


@pytest.mark.usefixtures("sqlite_checked_again")
def test_a_python_whose_sqlite_has_no_json_functions_exits_3(tmp_path, monkeypatch):
    connect = sqlite3.connect

    def without_json(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        connection = connect(*args, **kwargs)
        connection.create_function("json_extract", -1, None)  # as if not compiled in
        return connection

    monkeypatch.setattr(sqlite3, "connect", without_json)
    url = f"sqlite:///{tmp_path}/ledger.db"
    result = invoke(store(url, "query", "nodes"), code=3)
    one_line_store_error(
        result, f"cannot open store {url}: this Python's SQLite {sqlite3.sqlite_version} "
        "has no JSON functions (JSON1)"
    )


@pytest.mark.parametrize("args", COMMANDS, ids=" ".join)
def test_a_store_that_is_a_directory_exits_3(tmp_path, args):
    url = f"sqlite:///{tmp_path}"
    result = invoke(store(url, *args), code=3)
    one_line_store_error(
        result, f"cannot open store {url}: {tmp_path} names a directory; name a file in it, "
        f"e.g. sqlite:///{tmp_path}/alloc-ledger.db"
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args", [["query", "nodes"], ["submit", "heartbeat", "--node", "n1"]])
def test_a_store_path_that_is_no_regular_file_exits_3_at_once(tmp_path, args):
    """A FIFO (or a device) would hang SQLite's open, or be written over."""
    fifo = tmp_path / "ledger.db"
    os.mkfifo(fifo)
    url = f"sqlite:///{fifo}"
    done = subprocess.run([*CLI, *store(url, *args)], capture_output=True, text=True,
                          timeout=60, check=False)
    assert (done.returncode, done.stdout) == (3, "")
    assert one_line_of(done.stderr) == f"Error: cannot open store {url}: {fifo} is not a regular file"


def test_an_unreadable_store_exits_3(tmp_path, url):
    invoke(store(url, "submit", "node-registered", "--node", "n1"))
    (tmp_path / "ledger.db").chmod(0)
    try:
        done = subprocess.run(bound_by_file_modes([*CLI, *store(url, "query", "nodes")]),
                              capture_output=True, text=True, timeout=60, check=False)
    finally:
        (tmp_path / "ledger.db").chmod(0o600)
    assert (done.returncode, done.stdout) == (3, "")
    assert one_line_of(done.stderr) == (
        f"Error: cannot open store {url}: {tmp_path}/ledger.db is not readable by this user")


def test_an_unknown_kind_of_store_exits_3():
    result = invoke(["--store", "mysql://db/ledger", "query", "nodes"], code=3)
    one_line_store_error(
        result,
        "cannot open store 'mysql://db/ledger': use sqlite:///path/to/ledger.db or "
        "postgresql://user:password@host:port/db",
    )


@pytest.mark.parametrize("there", ["missing", "an empty file"])
@pytest.mark.parametrize("args", READING, ids=" ".join)
def test_reading_where_there_is_no_ledger_exits_3_and_writes_nothing(tmp_path, args, there):
    """A mistyped path must not read as an empty, valid ledger."""
    path = tmp_path / "typo.db"
    if there == "an empty file":
        path.touch()
    before = [(p.name, p.stat().st_size) for p in tmp_path.iterdir()]
    url = f"sqlite:///{path}"
    result = invoke(store(url, *args), code=3)
    one_line_store_error(
        result, f"cannot open store {url}: there is no ledger at {path} "
        "(nothing has been submitted to it; check --store)"
    )
    assert [(p.name, p.stat().st_size) for p in tmp_path.iterdir()] == before


@pytest.mark.parametrize(("flag", "named"), [
    (["--poll", "2"], "--poll"),
    (["--no-reconnect"], "--reconnect/--no-reconnect"),
])
def test_follower_options_without_follow_are_a_usage_error(url, flag, named):
    result = invoke(store(url, "project", *flag), code=2)
    assert result.stdout == ""
    assert result.stderr.startswith(f"Error: {named} goes with --follow")
    assert result.stderr.count("\n") == 1


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:", "sqlite:///file::memory:"])
def test_an_in_memory_store_is_refused(url):
    result = invoke(["--store", url, "submit", "node-registered", "--node", "n1"], code=3)
    one_line_store_error(
        result, f"cannot open store {url}: an in-memory store keeps nothing once it is "
        "closed; name a file, e.g. sqlite:///alloc-ledger.db"
    )


@pytest.mark.parametrize("typed", ["sqlite:/{}", "sqlite:{}", "sqlite://{}", "sqlite:{}/x.db"])
def test_a_sqlite_url_without_its_three_slashes_is_refused_not_read_as_another_file(
    tmp_path, monkeypatch, typed
):
    """``sqlite:/typo.db`` once made a ledger in ``ypo.db``."""
    monkeypatch.chdir(tmp_path)
    url = typed.format("typo.db")
    result = invoke(["--store", url, "submit", "node-registered", "--node", "n1"], code=3)
    one_line_store_error(
        result, f"cannot open store {url}: a SQLite URL is sqlite:///relative/path.db or "
        "sqlite:////absolute/path.db (three slashes, then the path)"
    )
    assert list(tmp_path.iterdir()) == []


def test_a_sqlite_url_scheme_may_be_upper_case(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    invoke(["--store", "SQLite:///ledger.db", "submit", "node-registered", "--node", "n1"])
    assert [p.name for p in tmp_path.iterdir()] == ["ledger.db"]


@pytest.mark.parametrize(("query", "message"), [
    ("timeout=abc", "timeout=abc must be a finite number of seconds above 0"),
    ("timeout=0", "timeout=0 must be a finite number of seconds above 0"),
    ("timeout=inf", "timeout=inf must be a finite number of seconds above 0"),
    ("bogus=1", "unknown parameter bogus (a SQLite store takes timeout)"),
])
def test_a_bad_sqlite_url_parameter_exits_3_naming_it(tmp_path, query, message):
    url = f"sqlite:///{tmp_path}/ledger.db?{query}"
    result = invoke(store(url, "submit", "node-registered", "--node", "n1"), code=3)
    one_line_store_error(result, f"cannot open store {url}: {message}")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("url", "message"), [
    ("", "cannot open store '': the store URL is empty"),
    ("postgresql://ops:secret@127.0.0.1:99999/db",
     "cannot open store: the URL is malformed (Port out of range 0-65535)"),
    ("postgresql://ops:secret@[::1/db", "cannot open store: the URL is malformed (Invalid IPv6 URL)"),
    ("postgresql://ops:secret@127.0.0.1/db?schema=",
     "cannot open store postgresql://ops:***@127.0.0.1/db?schema=: parameter schema has no value"),
    ("postgresql://ops:secret@127.0.0.1/db?writers=lock&writers=combine",
     ("cannot open store postgresql://ops:***@127.0.0.1/db?writers=lock&writers=combine: "
      "parameter writers is given twice")),
    ("sqlite:///x.db?timeout=1&timeout=2",
     "cannot open store sqlite:///x.db?timeout=1&timeout=2: parameter timeout is given twice"),
    ("postgresql://127.0.0.1/db?timeout=100000000",
     ("cannot open store postgresql://127.0.0.1/db?timeout=100000000: timeout=100000000 must be "
      "at most 86400 seconds (a day)")),
    ("postgresql://127.0.0.1/db?connect_timeout=1e300",
     ("cannot open store postgresql://127.0.0.1/db?connect_timeout=1e300: connect_timeout=1e300 "
      "must be at most 86400 seconds (a day)")),
    ("sqlite:///x.db?timeout=1e300",
     ("cannot open store sqlite:///x.db?timeout=1e300: timeout=1e300 must be at most 86400 seconds "
     "(a day)")),
    # a NUL ends a C string: libpq would connect to the database named by the user's name
    ("postgresql://ops:secret@127.0.0.1/db\x00", (
        "cannot open store: the URL is malformed (it holds a NUL character)")),
    ("sqlite:///x\x00.db", "cannot open store: the URL is malformed (it holds a NUL character)"),
    ("postgresql://ops@127.0.0.1/te\udcffst",
     "cannot open store: the PostgreSQL URL is not UTF-8 text"),
    # the same NUL, percent-encoded: unquoted, libpq reads the database "db",
    # the user "ops" (helper-406: a ledger's first tables were made in "test"
    # for postgresql://postgres@…/test%00other)
    ("postgresql://ops:secret@127.0.0.1/db%00other", (
        "cannot open store: the URL is malformed (it holds a NUL character)")),
    ("postgresql://ops%00x:secret@127.0.0.1/db", (
        "cannot open store: the URL is malformed (it holds a NUL character)")),
])
def test_a_malformed_store_url_exits_3_in_one_line_without_its_password(tmp_path, url, message):
    result = invoke(["--store", url, "query", "nodes"], code=3)
    one_line_store_error(result, message)


@pytest.mark.parametrize("args", [
    ["submit", "node-registered", "--node", "n1"], ["query", "nodes"], ["project"],
    ["grant-reporting", "grafana"],
], ids=" ".join)
def test_an_empty_store_variable_is_refused_not_read_as_the_default(tmp_path, monkeypatch, args):
    """ALLOC_LEDGER_STORE="$UNSET" once wrote ./alloc-ledger.db."""
    monkeypatch.chdir(tmp_path)
    result = invoke(args, code=3, env={"ALLOC_LEDGER_STORE": ""})
    one_line_store_error(result, "cannot open store '': the store URL is empty "
                         "(ALLOC_LEDGER_STORE is set but empty; unset it for the default)")
    assert list(tmp_path.iterdir()) == []


def test_the_python_api_refuses_an_empty_store_variable_as_the_command_line_does(
    tmp_path, monkeypatch
):
    """``Ledger.open()`` with ALLOC_LEDGER_STORE="" quietly made ./alloc-ledger.db
    (helper-304): one rule for both, ``ledger.store.store_url``."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ALLOC_LEDGER_STORE", "")
    with pytest.raises(StoreUnavailable) as refused:
        Ledger.open()
    assert str(refused.value) == ("cannot open store '': the store URL is empty "
                                  "(ALLOC_LEDGER_STORE is set but empty; unset it for the default)")
    with pytest.raises(StoreUnavailable, match="^cannot open store '': the store URL is empty$"):
        Ledger.open("")
    assert list(tmp_path.iterdir()) == []
    monkeypatch.delenv("ALLOC_LEDGER_STORE")
    with Ledger.open() as ledger:  # unset: the default, in the working directory
        assert ledger.submit({"type": "node-registered", "node": "n1"}).status == "appended"
    assert [p.name for p in tmp_path.iterdir() if p.suffix == ".db"] == ["alloc-ledger.db"]


def test_the_store_on_the_command_line_needs_no_store_variable(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    url = f"sqlite:///{tmp_path}/given.db"
    invoke(["--store", url, "submit", "node-registered", "--node", "n1"],
           env={"ALLOC_LEDGER_STORE": ""})
    assert [p.name for p in tmp_path.iterdir()] == ["given.db"]


@pytest.mark.parametrize("name", ["password", "pass%77ord", "sslpassword"])
def test_a_password_given_as_a_url_parameter_is_not_shown_either(name):
    """libpq reads ``pass%77ord`` as ``password``; ``sslpassword`` unlocks the
    client's key: both were shown as given (helper-305)."""
    result = invoke(["--store", f"postgresql://127.0.0.1/db?{name}=s3cret&bogus=1", "query",
                     "nodes"], code=3)
    assert result.stderr.startswith(
        f"Error: cannot open store postgresql://127.0.0.1/db?{name}=***&bogus=1: unknown option "
        "'bogus'"), result.stderr
    assert "s3cret" not in result.stderr


# What a writer says when another connection kept the write lock past the timeout.
LOCKED = ("database is locked: another connection held it longer than the URL's timeout (a "
          "writer stopped or stuck, or a tool that opened the file to write, such as a "
          "database browser left in a transaction: open reporting tools with ?mode=ro)")


class Locked:
    """A store another connection holds an exclusive write lock on."""

    def __init__(self, path: Path, url: str) -> None:
        self.url = f"{url}?timeout=1"  # give up on the lock after 1 s
        self.holder: sqlite3.Connection | None = sqlite3.connect(path, isolation_level=None)
        self.holder.execute("BEGIN EXCLUSIVE")

    def release(self) -> None:
        if self.holder is not None:
            self.holder.execute("ROLLBACK")
            self.holder.close()
            self.holder = None


@pytest.fixture
def locked(tmp_path: Path, url: str) -> Iterator[Locked]:
    invoke(store(url, "submit", "node-registered", "--node", "n1"))
    lock = Locked(tmp_path / "ledger.db", url)
    yield lock
    lock.release()


def test_submitting_to_a_locked_store_exits_3_and_appends_nothing(locked, url):
    result = invoke(store(locked.url, "submit", "heartbeat", "--node", "n1"), code=3)
    one_line_store_error(result, f"store {locked.url}: {LOCKED}; the event was not kept")

    locked.release()
    again = invoke(store(url, "submit", "heartbeat", "--node", "n1"))
    assert again.stdout == result_line(1, "appended", 2)


def test_submitting_a_stream_to_a_locked_store_exits_3(tmp_path, locked):
    source = tmp_path / "events.jsonl"
    source.write_text(lines({"type": "heartbeat", "node": "n1"}))
    result = invoke(store(locked.url, "submit", str(source)), code=3)
    one_line_store_error(result, f"store {locked.url}: {LOCKED}; no line was kept")


def test_a_locked_store_can_still_be_read(locked):
    nodes = json.loads(invoke(store(locked.url, "query", "nodes")).stdout)
    assert [n["node"] for n in nodes] == ["n1"]


# -- queries: exact answers in every format ---------------------------------------

def test_nodes_in_every_format(small):
    def nodes(fmt: str) -> str:
        return invoke(store(small, "query", "nodes", "--format", fmt)).stdout

    assert nodes("table") == (
        "node  status        health  parent  slots  slots_used  allocs  last_heartbeat_at"
        "            last_heartbeat_position  reason  since_position\n"
        "n1    disconnected  ok              2      1           1       "
        "2026-01-01T00:00:10.000000Z  2                                5\n"
    )
    row = {
        "node": "n1", "status": "disconnected", "health": "ok", "parent": None, "slots": 2,
        "slots_used": 1, "allocs": 1, "last_heartbeat_at": "2026-01-01T00:00:10.000000Z",
        "last_heartbeat_position": 2, "reason": None, "since_position": 5,
    }
    assert nodes("json") == json.dumps([row], indent=2) + "\n"
    assert nodes("jsonl") == json.dumps(row) + "\n"
    assert nodes("csv") == (
        "node,status,health,parent,slots,slots_used,allocs,last_heartbeat_at,"
        "last_heartbeat_position,reason,since_position\n"
        "n1,disconnected,ok,,2,1,1,2026-01-01T00:00:10.000000Z,2,,5\n"
    )


# -- stdout and stdin that are not there --------------------------------------------

CLI = [sys.executable, "-m", "commands"]


def node_lines(count: int) -> str:
    return lines(*({"type": "node-registered", "node": f"n{i}"} for i in range(count)))


def test_a_summary_stdout_cannot_take_is_one_line_and_every_event_is_kept(tmp_path, url):
    source = tmp_path / "events.jsonl"
    source.write_text(node_lines(30))

    done = subprocess.run(
        ["sh", "-c", '"$@" > /dev/full', "sh", *CLI, "--store", url, "submit", str(source),
         "--quiet"], check=False, capture_output=True, text=True, timeout=120)

    assert (done.returncode, one_line_of(done.stderr)) == (1, (
        "Error: cannot print the summary to stdout (No space left on device): every line "
        "was decided and is kept as decided"))
    with Ledger.open(url) as ledger, ledger.store.reading() as cursor:
        assert ledger.store.head(cursor) == 30


@pytest.mark.parametrize("shell", ['"$@" > /dev/full', '"$@" | head -c 10 > /dev/null'])
def test_results_stdout_cannot_take_are_one_line_and_every_batch_is_kept(
    tmp_path, url, shell
):
    source = tmp_path / "events.jsonl"
    source.write_text(node_lines(3000))

    done = subprocess.run(
        ["sh", "-c", shell, "sh", *CLI, "--store", url,
         "submit", str(source), "--batch", "1000"],
        check=False, capture_output=True, text=True, timeout=120)

    error = one_line_of(done.stderr)
    assert error.startswith("Error: cannot print the results to stdout (")
    up_to = int(re.search(r"every line up to (\d+) was decided", error)[1])  # type: ignore[index]
    assert up_to in (1000, 2000, 3000) and f"up to position {up_to};" in error
    with Ledger.open(url) as ledger, ledger.store.reading() as cursor:
        assert ledger.store.head(cursor) >= up_to  # what it says is kept, is


@pytest.mark.parametrize(("shell", "error"), [
    ('"$@" heartbeat --node n1 >&-',
     "Error: stdout is closed: the output could not be printed; nothing was done"),
    ('"$@" - <&-', "Error: stdin is closed: there is nothing to read from -"),
])
def test_a_closed_stdout_or_stdin_is_a_usage_error_and_nothing_is_submitted(url, shell, error):
    done = subprocess.run(["sh", "-c", shell, "sh", *CLI, "--store", url, "submit"],
                          check=False, capture_output=True, text=True, timeout=60)

    assert (done.returncode, one_line_of(done.stderr)) == (2, error)
    assert not Path(url[len("sqlite:///"):]).exists()


def one_line_of(stderr: str) -> str:
    assert stderr.count("\n") == 1 and "Traceback" not in stderr, stderr
    return stderr.strip()


def test_json_is_the_default_when_piped(small):
    assert invoke(store(small, "query", "nodes")).stdout == invoke(
        store(small, "query", "nodes", "--format", "json")
    ).stdout


def test_needs_reconnect_judges_the_deadline_at_now(small):
    def expired(now: str) -> str:
        args = ["query", "needs-reconnect", "--now", now, "--format", "csv"]
        return invoke(store(small, *args)).stdout

    header = (
        "alloc,node,job,desired_status,unknown_since_position,unknown_since_at,deadline,"
        "expired\n"
    )
    row = "a1,n1,web,run,5,2026-01-01T00:01:00.000000Z,2026-01-01T00:02:00.000000Z,"
    assert expired("2026-01-01T00:01:59Z") == header + row + "false\n"
    assert expired("2026-01-01T00:02:00Z") == header + row + "true\n"
    assert expired("2026-01-01T01:02:00+01:00") == header + row + "true\n"
    now = json.loads(invoke(store(small, "query", "needs-reconnect")).stdout)
    assert [r["expired"] for r in now] == [True]  # the deadline is long gone


def test_needs_reconnect_as_of_a_point_judges_the_deadline_at_that_point(small):
    """An auditor asking what had expired at 00:01:30 gets the answer of
    00:01:30, not of today (the deadline is 00:02:00); --now still decides."""
    def expired(*args: str) -> list[bool]:
        rows = json.loads(invoke(store(small, "query", "needs-reconnect", *args)).stdout)
        assert [r["alloc"] for r in rows] == ["a1"]
        return [r["expired"] for r in rows]

    assert expired("--as-of", "2026-01-01T00:01:30Z") == [False]
    assert expired("--as-of", "2026-01-01T00:02:00Z") == [True]
    assert expired("--as-of", "5") == [False]  # the latest event time up to 5: 00:01:00
    assert expired("--as-of", "5", "--now", "2026-01-01T00:02:00Z") == [True]
    assert expired("--as-of", "2026-01-01T00:01:30Z", "--now", "2026-01-01T00:01:00Z") == [False]


def test_a_deadline_past_the_year_9999_never_expires(tmp_path):
    """It is written as the last time there is; no --now reaches past it."""
    url = f"sqlite:///{tmp_path}/ledger.db"
    last = "9999-12-31T23:59:59Z"
    invoke(store(url, "submit", "-"), input=lines(
        {"type": "node-registered", "node": "n1", "slots": 1, "at": last},
        {"type": "heartbeat", "node": "n1", "at": last},
        {"type": "alloc-placed", "alloc": "a1", "node": "n1", "max_disconnect": 2**31 - 1,
         "at": last},
        {"type": "alloc-updated", "alloc": "a1", "client_status": "running", "at": last},
        {"type": "heartbeat-missed", "node": "n1", "at": last},
    ))

    for now in ("9999-12-31T23:59:59.999999Z", "2026-01-01T00:00:00Z"):
        rows = json.loads(invoke(store(url, "query", "needs-reconnect", "--now", now)).stdout)
        assert [(r["alloc"], r["deadline"], r["expired"]) for r in rows] == [
            ("a1", "9999-12-31T23:59:59.999999Z", False)], now


def test_addresses_and_slots_tables(small):
    assert invoke(store(small, "query", "addresses", "--format", "table")).stdout == (
        "address   alloc  node  state\n"
        "10.0.0.5  a1     n1    held\n"
        "10.0.0.6  a1     n1    held\n"
    )
    assert invoke(store(small, "query", "slots", "--node", "n1", "--format", "csv")).stdout == (
        "node,slot,state,alloc,reported_alloc,since_position\n"
        "n1,0,active,a1,,4\n"
        "n1,1,free,,,1\n"
    )


@pytest.mark.parametrize("args, error", [
    (["slots", "--node", "n9"], "node n9 is not in the ledger"),
    (["allocs", "--node", "n9"], "node n9 is not in the ledger"),
    (["allocs", "--job", "wbe"], "no allocation of job wbe is in the ledger"),
    (["allocs", "--node", "n1", "--as-of", "0"], "node n1 is not in the ledger at position 0"),
    (["allocs", "--job", "web", "--as-of", "2"],
     "no allocation of job web is in the ledger at position 2"),
])
def test_a_filter_naming_what_the_ledger_never_held_is_an_error(small, args, error):
    result = invoke(store(small, "query", *args), code=1)
    assert (result.stdout, result.stderr) == ("", f"Error: {error}\n")


@pytest.mark.parametrize("args, count", [
    (["allocs", "--node", "n1", "--status", "failed"], 0),  # n1 is known: none failed
    (["allocs", "--job", "web", "--status", "complete"], 0),
    (["allocs", "--node", "n1", "--as-of", "2"], 0),  # registered, nothing placed yet
    (["slots", "--node", "n1", "--as-of", "1"], 2),
])
def test_a_filter_on_what_the_ledger_holds_may_answer_nothing(small, args, count):
    assert len(json.loads(invoke(store(small, "query", *args)).stdout)) == count


def test_a_job_whose_allocations_were_all_removed_answers_nothing(url):
    """Its job is one an allocation had: an empty answer, not "no such job"."""
    source = [
        {"type": "node-registered", "node": "n1", "slots": 1},
        {"type": "heartbeat", "node": "n1"},
        {"type": "alloc-placed", "alloc": "a1", "node": "n1", "slot": 0, "job": "web"},
        {"type": "alloc-updated", "alloc": "a1", "client_status": "complete"},
        {"type": "alloc-removed", "alloc": "a1"},
    ]
    invoke(store(url, "submit", "-", "--quiet"), input=lines(*source))

    assert invoke(store(url, "query", "allocs", "--job", "web", "--format", "json")).stdout == "[]\n"


# Two nodes registered out of name order, each running one allocation that
# goes unknown out of name order, and two nodes suspected out of name order.
ORDERED = [
    {"type": "node-registered", "node": "n2", "slots": 1},
    {"type": "node-registered", "node": "n1", "slots": 1},
    {"type": "node-registered", "node": "n4"},
    {"type": "node-registered", "node": "n3"},
    *({"type": "heartbeat", "node": n} for n in ("n1", "n2", "n3", "n4")),
    {"type": "alloc-placed", "alloc": "b", "node": "n1", "slot": 0,
     "addresses": ["10.0.0.1", "10.0.0.2"], "max_disconnect": 300},
    {"type": "alloc-placed", "alloc": "a", "node": "n2", "slot": 0,
     "addresses": ["10.0.0.9"], "max_disconnect": 300},
    {"type": "alloc-updated", "alloc": "b", "client_status": "running"},
    {"type": "alloc-updated", "alloc": "a", "client_status": "running"},
    {"type": "heartbeat-missed", "node": "n1"},
    {"type": "heartbeat-missed", "node": "n2"},
    {"type": "node-suspected", "node": "n4", "reason": "disk"},
    {"type": "node-suspected", "node": "n3", "reason": "disk"},
]


@pytest.fixture
def ordered(url: str) -> str:
    invoke(store(url, "submit", "-", "--quiet"), input=lines(*ORDERED))
    return url


def test_each_query_lists_its_rows_in_the_order_the_readme_gives(ordered):
    def column(name: str, *query: str) -> list[Any]:
        found = json.loads(invoke(store(ordered, "query", *query, "--format", "json")).stdout)
        return [row[name] for row in found]

    assert column("alloc", "needs-reconnect") == ["b", "a"]  # by when each became unknown
    assert column("node", "suspects") == ["n4", "n3"]  # by since_position
    assert column("address", "addresses") == ["10.0.0.1", "10.0.0.2", "10.0.0.9"]
    assert column("alloc", "allocs") == ["a", "b"]
    assert column("node", "nodes") == ["n1", "n2", "n3", "n4"]
    assert column("node", "slots") == ["n1", "n2"]


def test_a_table_joins_a_list_with_commas_and_ends_no_line_with_a_space(ordered):
    printed = invoke(store(ordered, "query", "alloc", "b", "--format", "table")).stdout

    assert "\naddresses               10.0.0.1,10.0.0.2\n" in printed
    assert "\n\nalloc_states:\nvalue    position  at\nunknown  13  " in printed
    assert "\n\nhistory:\nposition  type " in printed
    assert [line for line in printed.splitlines() if line.endswith(" ")] == []


def test_an_empty_answer(small):
    assert invoke(store(small, "query", "zombie-slots", "--format", "table")).stdout == "(none)\n"
    assert invoke(store(small, "query", "zombie-slots", "--format", "json")).stdout == "[]\n"
    assert invoke(store(small, "query", "zombie-slots", "--format", "jsonl")).stdout == ""
    assert invoke(store(small, "query", "zombie-slots", "--format", "csv")).stdout == (
        "node,slot,alloc,reason,position\n"
    )


def test_alloc_is_one_object(small):
    a1 = json.loads(invoke(store(small, "query", "alloc", "a1", "--format", "json")).stdout)

    assert {k: v for k, v in a1.items() if k != "history"} == {
        "alloc": "a1", "node": "n1", "job": "web", "slot": 0, "desired_status": "run",
        "client_status": "unknown", "needs_reconnect": True,
        "addresses": ["10.0.0.5", "10.0.0.6"], "max_disconnect": 60,
        "unknown_since_position": 5, "unknown_since_at": "2026-01-01T00:01:00.000000Z",
        "deadline": "2026-01-01T00:02:00.000000Z", "placed_position": 3,
        "updated_position": 5, "removed": False,
        "alloc_states": [{"value": "unknown", "position": 5, "at": "2026-01-01T00:01:00.000000Z"}],
    }
    assert [(h["position"], h["type"], h["status"]) for h in a1["history"]] == [
        (3, "alloc-placed", "appended"),
        (4, "alloc-updated", "appended"),
        (5, "heartbeat-missed", "appended"),
    ]


def test_an_allocation_never_placed_exits_1(small):
    result = invoke(store(small, "query", "alloc", "a9"), code=1)
    assert (result.stdout, result.stderr) == ("", "Error: allocation a9 is not in the ledger\n")


def test_an_allocation_only_a_rejection_names_points_at_its_history(small):
    invoke(store(small, "submit", "alloc-placed", "--alloc", "a9", "--node", "n9"), code=1)

    result = invoke(store(small, "query", "alloc", "a9"), code=1)

    assert (result.stdout, result.stderr) == ("", ("Error: allocation a9 is not in the ledger "
                                              "(events name it: alloc-ledger query history a9)\n"))
    assert json.loads(invoke(store(small, "query", "history", "a9", "--format", "json")).stdout
                      )[0]["status"] == "rejected"


def test_an_allocation_not_yet_placed_at_a_position_says_so(small):
    result = invoke(store(small, "query", "alloc", "a1", "--as-of", "2"), code=1)
    assert (result.stdout, result.stderr) == (
        "", "Error: allocation a1 is not in the ledger at position 2\n")


@pytest.mark.parametrize("args", [
    ["query", "nodes", "--as-of", "6"],
    ["query", "alloc", "a1", "--as-of", "1000"],
    ["query", "history", "n1", "--as-of", "6"],
])
def test_as_of_a_position_past_the_head_is_a_usage_error(small, args):
    result = invoke(store(small, *args), code=2)
    assert result.stdout == ""
    assert f"Invalid value for '--as-of': position {args[-1]} is beyond the head of the log (5)" in result.stderr


@pytest.mark.parametrize(("args", "error"), [
    (["replay", "--to", "6"], "Invalid value for '--to': position 6 is beyond the head of the log (5)"),
    (["audit", "--to", "6"], "Invalid value for '--to': position 6 is beyond the head of the log (5)"),
    (["audit", "--from", "4", "--to", "3"], "Invalid value for '--from': position 4 is after --to 3"),
    (["audit", "--to", "0"], "Invalid value for '--to': position 0 is before the first position (1)"),
    (["audit", "--from", "6"], "Invalid value for '--from': position 6 is beyond the head of the log (5)"),
])
def test_a_range_the_log_does_not_hold_is_a_usage_error_of_its_option(small, args, error):
    result = invoke(store(small, *args), code=2)

    assert result.stdout == ""
    assert result.stderr == f"Error: {error} (see 'alloc-ledger {args[0]} --help')\n"


def test_as_of_a_moment_past_the_last_event_is_the_current_state(small):
    later = invoke(store(small, "query", "nodes", "--as-of", "2030-01-01T00:00:00Z"))
    now = invoke(store(small, "query", "nodes"))
    assert json.loads(later.stdout) == json.loads(now.stdout) != []


def test_history_of_a_slot(small):
    rows = json.loads(invoke(store(small, "query", "history", "n1#0")).stdout)
    assert [(r["position"], r["type"]) for r in rows] == [
        (1, "node-registered"), (3, "alloc-placed"), (4, "alloc-updated"), (5, "heartbeat-missed"),
    ]
    assert rows[1]["event"] == SMALL[2] | {"at": "2026-01-01T00:00:20.000000Z"}


def test_a_slot_begins_with_the_registration_that_made_it_not_a_refused_one(url):
    invoke(store(url, "submit", "-"), input=lines(
        {"type": "node-registered", "node": "n1", "slots": 1},
        {"type": "node-registered", "node": "n1", "slots": 2},
    ), code=1)

    slot0 = json.loads(invoke(store(url, "query", "history", "n1#0")).stdout)

    assert [(r["position"], r["status"]) for r in slot0] == [(1, "appended")]
    invoke(store(url, "query", "history", "n1#1"), code=1)


@pytest.mark.parametrize(("args", "error"), [
    (["n9"], "no event or rejection names n9"),
    (["n1#2"], "no event or rejection names n1#2"),
    (["a1", "--as-of", "2"], "no event or rejection names a1 at position 2"),
])
def test_the_history_of_what_nothing_names_is_an_error_not_an_empty_list(small, args, error):
    result = invoke(store(small, "query", "history", *args), code=1)

    assert (result.stdout, result.stderr) == ("", f"Error: {error}\n")


def test_a_removed_node_leaves_the_suspects_even_if_it_was_suspect(url):
    invoke(store(url, "submit", "-"), input=lines(
        {"type": "node-registered", "node": "n1"},
        {"type": "node-registered", "node": "n2"},
        {"type": "node-suspected", "node": "n1", "reason": "disk"},
        {"type": "node-suspected", "node": "n2", "reason": "disk"},
        {"type": "node-removed", "node": "n2"},
    ))

    rows = json.loads(invoke(store(url, "query", "suspects")).stdout)

    assert [(r["node"], r["health"], r["status"]) for r in rows] == [("n1", "suspect", "initializing")]


def test_history_of_a_slot_has_the_heartbeat_that_reports_it_empty_again(url):
    """A report replaces the node's table: the slots it leaves out are reported
    empty, and that clears a zombie, so it is in their history."""
    invoke(store(url, "submit", "-"), input=lines(
        {"type": "node-registered", "node": "n1", "slots": 2},
        {"type": "heartbeat", "node": "n1", "slots": [{"slot": 0, "alloc": "zz"}]},
        {"type": "heartbeat", "node": "n1", "slots": [{"slot": 1, "alloc": "yy"}]},
        {"type": "heartbeat", "node": "n1", "slots": [{"slot": 1, "alloc": "yy"}]},
    ))

    slot0 = json.loads(invoke(store(url, "query", "history", "n1#0")).stdout)
    slot1 = json.loads(invoke(store(url, "query", "history", "n1#1")).stdout)

    assert [r["position"] for r in slot0] == [1, 2, 3]  # 4 changes nothing of n1#0
    assert [r["position"] for r in slot1] == [1, 2, 3, 4]  # 2 leaves it out: reported empty


# -- every query, every format, live and as of a position or a time -----------------

QUERIES = [
    ["needs-reconnect", "--now", "2026-03-02T09:03:00Z"],
    ["zombie-slots"],
    ["slots"],
    ["slots", "--node", "tm1"],
    ["nodes"],
    ["allocs"],
    ["allocs", "--node", "n1", "--status", "lost"],
    ["allocs", "--job", "web", "--status", "failed"],
    ["alloc", "a1"],
    ["alloc", "t1"],
    ["addresses"],
    ["suspects"],
    ["rejections"],
    ["history", "n1"],
    ["history", "tm1#0"],
    ["history", "10.0.0.5"],
]
AS_OF = {
    "live": [],
    "position": ["--as-of", "31"],
    "timestamp": ["--as-of", "2026-03-02T11:01:00Z"],
}


def cell(value: Any) -> str:
    """How a value reads in a CSV or table cell."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return ",".join(cell(v) for v in value)
    if isinstance(value, dict):
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return str(value)


def csv_cell(value: Any) -> str:
    """How a value reads in a CSV cell: a list as JSON text."""
    if isinstance(value, list):
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return cell(value)


def test_csv_lists_are_json_so_a_comma_in_an_address_is_not_two_addresses(url, tmp_path):
    source = tmp_path / "in.jsonl"
    source.write_text(lines(
        {"type": "node-registered", "node": "n1"},
        {"type": "heartbeat", "node": "n1"},
        {"type": "alloc-placed", "alloc": "a1", "node": "n1", "addresses": ["x,y"]},
        {"type": "alloc-placed", "alloc": "a2", "node": "n1", "addresses": ["x", "y"]},
    ))
    invoke(store(url, "submit", str(source), "--quiet"))

    rows = list(csv.DictReader(io.StringIO(
        invoke(store(url, "query", "allocs", "--format", "csv")).stdout)))

    assert [(r["alloc"], json.loads(r["addresses"])) for r in rows] == [
        ("a1", ["x,y"]), ("a2", ["x", "y"])]


@pytest.mark.parametrize("when", AS_OF)
@pytest.mark.parametrize("query", QUERIES, ids=" ".join)
def test_every_query_in_every_format_says_the_same(stories, query, when):
    def ask(fmt: str) -> str:
        return invoke(store(stories, "query", *query, *AS_OF[when], "--format", fmt)).stdout

    answer = json.loads(ask("json"))
    jsonl = [json.loads(line) for line in ask("jsonl").splitlines()]
    table = ask("table").splitlines()
    rows = list(csv.reader(io.StringIO(ask("csv"))))
    if query[0] == "alloc":
        assert jsonl == [answer]
        assert rows == [["field", "value"]] + [[k, csv_cell(v)] for k, v in answer.items()]
        assert table[0].split() == ["field", "value"]
        return
    columns = list(COLUMNS[query[0]])
    assert isinstance(answer, list)
    assert jsonl == answer
    assert rows == [columns] + [[csv_cell(r[c]) for c in columns] for r in answer]
    if answer:
        assert table[0].split() == columns
        assert len(table) == 1 + len(answer)
    else:
        assert table == ["(none)"]


def test_the_stories_store_answers_every_question_with_rows(stories):
    """The comparisons below are not vacuous: most questions have answers."""
    empty = [
        q for q in QUERIES if q[0] != "alloc"
        and json.loads(invoke(store(stories, "query", *q, "--as-of", "31")).stdout) == []
    ]
    assert empty == [
        ["needs-reconnect", "--now", "2026-03-02T09:03:00Z"],
        ["allocs", "--job", "web", "--status", "failed"],
        ["suspects"],
    ]


def answers(url: str, *as_of: str) -> dict[str, tuple[int, str]]:
    found = {}
    for query in QUERIES:
        result = CliRunner().invoke(cli, store(url, "query", *query, *as_of, "--format", "json"))
        assert "Traceback" not in result.output
        # "not in the ledger at position P": the position asked for, which a store
        # holding only those events answers without
        # and when each store received an event (recorded_at) is not history
        text = re.sub(r'\n *"recorded_at": "[^"]*",', "", result.output)
        found[" ".join(query)] = (result.exit_code, re.sub(r" at position \d+", "", text))
    return found


# Each point of history, named by position and by time: the state as of it must be
# the state of a store that received only the events up to that position.
POINTS: dict[int, list[str]] = {
    0: ["0", "2026-03-02T08:59:59Z"],
    1: ["1", "2026-03-02T09:00:00Z", "2026-03-02T09:00:04.999999Z"],
    3: ["3"],
    7: ["7"],
    9: ["9", "2026-03-02T09:03:00Z"],
    12: ["12"],
    13: ["13", "2026-03-02T09:30:00Z"],
    24: ["24", "2026-03-02T10:01:04.999999Z"],
    25: ["25", "2026-03-02T10:01:05Z"],
    26: ["26"],
    31: ["31", "2026-03-02T12:01:00+01:00"],
    32: ["32"],
    34: ["34"],
    37: ["37"],
    46: ["46"],
    48: ["48", "2026-03-02T12:02:00Z"],
    49: ["49", "2026-03-02T13:00:00Z", "2030-01-01T00:00:00Z"],
}


def test_as_of_equals_a_store_that_received_only_the_first_events(stories, tmp_path):
    events = [json.dumps(e) for e in all_events()]
    prefix = f"sqlite:///{tmp_path}/prefix.db"
    received = 0
    with Ledger.open(prefix) as ledger:
        for position, names in POINTS.items():
            ledger.submit_batch(events[received:position])
            received = position
            expected = answers(prefix)
            for name in names:
                assert answers(stories, "--as-of", name) == expected, name


def test_as_of_a_time_is_the_longest_prefix_at_or_before_it(tmp_path, url):
    """`at` out of order: the answer stops at the first event after the time,
    even if later events are earlier."""
    source = tmp_path / "events.jsonl"
    source.write_text(lines(
        {"type": "node-registered", "node": "n1", "at": "2026-01-01T10:00:00Z"},
        {"type": "heartbeat", "node": "n1", "at": "2026-01-01T10:05:00Z"},
        {"type": "node-registered", "node": "n2", "at": "2026-01-01T10:02:00Z"},
    ))
    invoke(store(url, "submit", str(source), "--quiet"))

    def nodes(when: str) -> list[tuple[str, str]]:
        rows = json.loads(invoke(store(url, "query", "nodes", "--as-of", when)).stdout)
        return [(r["node"], r["status"]) for r in rows]

    assert nodes("2026-01-01T10:03:00Z") == [("n1", "initializing")]
    assert nodes("2026-01-01T10:05:00Z") == [("n1", "ready"), ("n2", "initializing")]
    assert nodes("2026-01-01T09:59:59Z") == []


def test_as_of_a_time_when_at_defaults_to_the_time_received(url):
    invoke(store(url, "submit", "node-registered", "--node", "n1"))
    def nodes(when: str) -> list[str]:
        rows = json.loads(invoke(store(url, "query", "nodes", "--as-of", when)).stdout)
        return [r["node"] for r in rows]

    assert nodes("2000-01-01T00:00:00Z") == []
    assert nodes("2999-01-01T00:00:00Z") == ["n1"]


# -- help, python -m commands, schema -----------------------------------------------

def walk(command: click.Command, path: list[str]) -> Iterator[tuple[list[str], click.Command]]:
    yield path, command
    if isinstance(command, click.Group):
        for name, sub in sorted(command.commands.items()):
            yield from walk(sub, [*path, name])


def test_every_command_and_option_has_help():
    missing = []
    for path, command in walk(cli, []):
        result = invoke([*path, "--help"])
        assert result.stdout.startswith(f"Usage: alloc-ledger {' '.join(path)}".rstrip())
        if not (command.help or "").strip():
            missing.append(" ".join(path) or "alloc-ledger")
        for param in command.params:
            if isinstance(param, click.Option) and not param.help:
                missing.append(f"{' '.join(path)} {param.opts[0]}")
    assert missing == []


def test_every_command_of_the_spec_is_there():
    names = {" ".join(path) for path, _ in walk(cli, [])}
    spec = {"submit", "query", "project", "replay", "verify", "digest", "schema", "demo"} | {
        f"query {q}" for q in COLUMNS
    } | {"query alloc"}
    assert spec - names == set()


def test_python_m_commands_help():
    done = subprocess.run(
        [sys.executable, "-m", "commands", "--help"], capture_output=True, text=True, timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Usage: alloc-ledger [OPTIONS] COMMAND [ARGS]...\n")
    assert "Traceback" not in done.stderr


def test_schema_prints_the_json_schema_of_every_event():
    schema = json.loads(invoke(["schema"]).stdout)

    assert schema["title"] == "alloc-ledger event"
    assert "discriminator" not in schema  # OpenAPI's: Ajv's strict mode refuses it
    models = schemas_by_type(schema)
    assert len(models) == len(schema["oneOf"])  # one choice per type
    assert sorted(models) == sorted(EVENT_TYPES)
    for kind, model in models.items():
        assert model["additionalProperties"] is False, kind
        assert {"type", "id", "at", "source"} <= set(model["properties"]), kind
    assert schema["$defs"]["AllocUpdated"]["required"] == ["type", "alloc", "client_status"]


# -- a reporting tool reads the file with nothing but sqlite3 ------------------------

SQL = {
    "nodes": "SELECT node, status, health, parent, slots, slots_used, allocs, "
             "last_heartbeat_at, last_heartbeat_position, reason, since_position "
             "FROM nodes ORDER BY node",
    "needs-reconnect": "SELECT alloc, node, job, desired_status, unknown_since_position, "
                       "unknown_since_at, deadline, deadline <= :now AS expired "
                       "FROM needs_reconnect ORDER BY unknown_since_position, alloc",
    "zombie-slots": "SELECT node, slot, alloc, reason, position FROM zombie_slots "
                    "ORDER BY node, slot",
    "addresses": "SELECT address, alloc, node, state FROM addresses ORDER BY address",
}
NOW = "2026-01-01T00:01:30Z"
NOW_TEXT = "2026-01-01T00:01:30.000000Z"  # as the tables keep times


def by_sqlite3(path: Path, query: str) -> list[dict[str, Any]]:
    connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    connection.row_factory = sqlite3.Row
    try:
        rows = [dict(r) for r in connection.execute(SQL[query], {"now": NOW_TEXT})]
    finally:
        connection.close()
    for row in rows:
        if "expired" in row:
            row["expired"] = bool(row["expired"])
    return rows


@pytest.mark.parametrize("query", SQL)
@pytest.mark.parametrize("which", ["small", "stories"])
def test_sqlite3_alone_reads_the_same_answers(request, query, which):
    url = request.getfixturevalue(which)
    path = Path(url[len("sqlite:///"):])
    args = ["--now", NOW] if query == "needs-reconnect" else []

    printed = json.loads(invoke(store(url, "query", query, *args, "--format", "json")).stdout)

    assert printed == by_sqlite3(path, query)
    assert (printed == []) == ((which, query) in {("small", "zombie-slots"),
                                                  ("stories", "needs-reconnect")})


def test_a_view_dropped_by_hand_is_made_again_as_it_was_when_the_store_is_next_opened(tmp_path):
    """The views are derived from the tables: the next command that may write
    the file makes a dropped one again, not 'no such table: needs_reconnect'
    for ever after."""
    url = f"sqlite:///{tmp_path}/ledger.db"
    invoke(store(url, "submit", "node-registered", "--node", "n1", "--slots", "1"))
    views = "SELECT name, sql FROM sqlite_master WHERE type = 'view' ORDER BY name"
    with closing(sqlite3.connect(tmp_path / "ledger.db")) as db, db:
        made = db.execute(views).fetchall()
        for name, _ in made:
            db.execute(f"DROP VIEW {name}")

    assert json.loads(invoke(store(url, "query", "needs-reconnect", "--format", "json")).stdout) == []
    with closing(sqlite3.connect(tmp_path / "ledger.db")) as db:
        assert db.execute(views).fetchall() == made
    assert [name for name, _ in made] == [
        "log_positions", "needs_reconnect", "projection_status", "zombie_slots"]


def test_a_table_dropped_by_hand_is_not_made_again_empty(tmp_path):
    """Only views are derived: an empty table would give wrong answers
    where its absence gives an error."""
    url = f"sqlite:///{tmp_path}/ledger.db"
    invoke(store(url, "submit", "node-registered", "--node", "n1", "--slots", "1"))
    with closing(sqlite3.connect(tmp_path / "ledger.db")) as db, db:
        db.execute("DROP VIEW needs_reconnect")
        db.execute("DROP TABLE alloc_states")

    invoke(store(url, "query", "needs-reconnect"))
    with closing(sqlite3.connect(tmp_path / "ledger.db")) as db:
        names = {row[0] for row in db.execute("SELECT name FROM sqlite_master")}
    assert "needs_reconnect" in names and "alloc_states" not in names


def test_the_store_variable_names_the_store_and_the_default_is_in_the_working_directory(
    tmp_path, monkeypatch
):
    """SPEC section 5: --store URL or ALLOC_LEDGER_STORE; the default is
    sqlite:///alloc-ledger.db in the working directory."""
    monkeypatch.chdir(tmp_path)
    named = f"sqlite:///{tmp_path}/named.db"
    invoke(["submit", "node-registered", "--node", "n1"], env={"ALLOC_LEDGER_STORE": named})
    invoke(["submit", "node-registered", "--node", "n2"], env={"ALLOC_LEDGER_STORE": None})

    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".db") == [
        "alloc-ledger.db", "named.db"]
    for env, node in ((named, "n1"), (None, "n2")):
        found = invoke(["query", "nodes", "--format", "json"], env={"ALLOC_LEDGER_STORE": env})
        assert [row["node"] for row in json.loads(found.stdout)] == [node]


@pytest.fixture
def ticking(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The submit command, its clock a second on at every look: progress at every batch."""
    from commands import submit as submitting

    clock = iter(range(100))
    monkeypatch.setattr(submitting.time, "monotonic", lambda: float(next(clock)))
    return submitting


def test_a_stream_shows_its_progress_on_a_terminal(ticking, capsys):
    """SPEC section 4: a progress bar on a terminal (on stderr, cleared at the end)."""
    submitting = ticking
    batches = [[(1, Receipt("appended", 1)), (2, Receipt("rejected", 2, "no"))],
               [(3, Receipt("invalid", None, "bad"))]]

    counts = submitting._print(iter(batches), quiet=True, progress=True, held=Held())

    shown = capsys.readouterr().err
    assert "\r2 events, 1 rejected, 0 invalid" in shown
    assert "\r3 events, 1 rejected, 1 invalid" in shown
    assert shown.endswith("\r" + " " * 60 + "\r")
    assert (counts["appended"], counts["rejected"], counts["invalid"]) == (1, 1, 1)


def test_the_progress_of_one_event_says_event(ticking, capsys):
    ticking._print(iter([[(1, Receipt("appended", 1))]]), quiet=True, progress=True, held=Held())

    assert "\r1 event, 0 rejected, 0 invalid" in capsys.readouterr().err
