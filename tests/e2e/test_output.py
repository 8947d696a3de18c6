"""What every command prints, and a stdout that cannot take it: closed from
the start (``>&-``: exit 2, nothing done), full (``/dev/full``), closed by
its reader (``| head``) or a file at its size limit (exit 1); one line on
stderr each time, never a traceback or Python's "Exception ignored".

Values are printed so a line stays a line: JSON escapes the line breaks it
may leave raw (U+2028, U+2029, U+0085), tables and error lines escape
newlines, tabs and other control characters.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cli_support import invoke

from ledger.application import Ledger

CLI = [sys.executable, "-m", "commands"]

CLOSED = "Error: stdout is closed: the output could not be printed; nothing was done"
FULL = "Error: cannot print the output to stdout (No space left on device)"

PRINTING = [  # every command that prints, with arguments it runs with
    ["query", "nodes"],
    ["query", "nodes", "--format", "table"],
    ["query", "nodes", "--format", "jsonl"],
    ["query", "nodes", "--format", "csv"],
    ["query", "alloc", "a1", "--format", "csv"],
    ["schema"],
    ["verify"],
    ["verify", "--format", "table"],
    ["digest"],
    ["digest", "--format", "json"],
    ["audit"],
    ["audit", "--format", "jsonl"],
    ["replay"],
    ["project"],
    ["demo"],
]


def run(shell: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The command line ``args`` run by ``sh -c shell`` (as ``"$@"``)."""
    return subprocess.run(["sh", "-c", shell, "sh", *CLI, *args],
                          check=False, capture_output=True, text=True, timeout=120)


def one_line_of(stderr: str) -> str:
    assert stderr.count("\n") == 1 and "Traceback" not in stderr, stderr
    return stderr.strip()


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/ledger.db"


def submitted(url: str, *events: dict[str, Any], status: str = "appended") -> str:
    with Ledger.open(url) as ledger:
        assert {r.status for r in ledger.submit_batch(list(events))} == {status}
    return url


@pytest.fixture
def small(url: str) -> str:
    """A node running a1, and a placement refused (so the audit finds something)."""
    submitted(
        url,
        {"type": "node-registered", "node": "n1", "slots": 2},
        {"type": "heartbeat", "node": "n1"},
        {"type": "alloc-placed", "alloc": "a1", "node": "n1", "slot": 0},
    )
    return submitted(url, {"type": "alloc-placed", "alloc": "a2", "node": "n1", "slot": 0},
                     status="rejected")


# -- stdout closed from the start ------------------------------------------------------


@pytest.mark.parametrize(
    "args", [*PRINTING, ["grant-reporting", "grafana"], ["submit", "heartbeat", "--node", "n1"]],
    ids=" ".join)
def test_a_closed_stdout_is_a_usage_error_and_nothing_is_done(url, args):
    done = run('"$@" >&-', "--store", url, *args)

    assert (done.returncode, one_line_of(done.stderr)) == (2, CLOSED)
    assert not Path(url[len("sqlite:///"):]).exists()  # not even opened


@pytest.mark.parametrize("args", [
    ["--help"], ["--version"], [], ["query", "--help"], ["submit", "--help"],
], ids=lambda args: " ".join(args) or "no command")
def test_a_closed_stdout_fails_the_help_and_version_alike(args):
    """The top level's own --help and --version (and its help for no
    command) are refused as every command's help is: not printed into
    nothing with exit 0."""
    done = run('"$@" >&-', *args)

    assert (done.returncode, one_line_of(done.stderr)) == (2, CLOSED)


# -- stdout that cannot take the output ------------------------------------------------


@pytest.mark.parametrize("args", PRINTING, ids=" ".join)
def test_a_full_stdout_is_one_line_and_exit_1(small, args):
    store = [] if args == ["demo"] else ["--store", small]  # the demo needs an empty store
    done = run('"$@" > /dev/full', *store, *args)

    assert (done.returncode, one_line_of(done.stderr)) == (1, FULL)


@pytest.mark.parametrize("args", [
    ["--help"], ["--version"], ["submit", "--help"], ["query", "--help"],
    ["query", "nodes", "--help"], ["verify", "--help"],
], ids=" ".join)
def test_help_or_version_to_a_full_stdout_is_one_line_not_a_traceback(args):
    done = run('"$@" > /dev/full', *args)
    assert (done.returncode, one_line_of(done.stderr)) == (1, FULL)


@pytest.mark.parametrize("args", [["--help"], ["--version"], ["submit", "--help"]], ids=" ".join)
def test_help_to_a_reader_already_gone_ends_quietly_as_sigpipe_ends_a_command(args):
    """click's own text to a pipe whose reader has closed it (EPIPE): not an
    internal error, nor a line about it; exit 141, as ``cat`` shows there."""
    reading, writing = os.pipe()
    os.close(reading)
    try:
        done = subprocess.run([*CLI, *args], stdout=writing, stderr=subprocess.PIPE,
                              check=False, text=True, timeout=120)
    finally:
        os.close(writing)

    assert (done.returncode, done.stderr) == (141, "")


@pytest.mark.parametrize("fmt", ["json", "jsonl", "csv", "table"])
def test_a_reader_that_stops_early_ends_it_quietly_as_sigpipe_would(url, fmt):
    """``query … | head``: the reader has what it wanted. A line saying the
    output could not be printed was noise on the commonest pipe; the exit
    status (141, as a command SIGPIPE ends) still tells a script."""
    submitted(url, *({"type": "node-registered", "node": f"n{i}"} for i in range(5000)))
    reading = subprocess.Popen(
        [*CLI, "--store", url, "query", "nodes", "--format", fmt],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert reading.stdout is not None and reading.stderr is not None
    assert len(reading.stdout.read(10)) == 10
    reading.stdout.close()  # as `| head -c 10` does, far from the end (200 kB on)

    stderr = reading.stderr.read().decode()
    assert (reading.wait(timeout=120), stderr) == (141, "")


def test_output_cut_short_by_a_file_size_limit_is_not_a_success(tmp_path):
    """A write cut short reports how much it wrote, not the error: the rest
    would be dropped and the command exit 0 with half a schema in the file."""
    out = tmp_path / "schema.json"
    done = run(f'trap "" XFSZ; ulimit -f 4; "$@" > {out}', "schema")

    assert (done.returncode, one_line_of(done.stderr)) == (
        1, "Error: cannot print the output to stdout (File too large)")
    assert 0 < out.stat().st_size < len(invoke(["schema"]).stdout)


# -- a line stays a line ---------------------------------------------------------------

SEPARATED = "n\u2028x\u2029y\x85z"  # legal in JSON text as they are, but line breaks to many


def suspected(url: str, reason: str) -> str:
    """A node suspected for a reason: text that may hold any character but
    NUL (a new name may not hold a line break; a reason, a source may)."""
    return submitted(url, {"type": "node-registered", "node": "n1"},
                     {"type": "node-suspected", "node": "n1", "reason": reason})


def test_json_escapes_the_line_breaks_it_may_leave_raw(url):
    suspected(url, SEPARATED)
    for fmt, lines in (("jsonl", 1), ("json", None)):
        printed = invoke(["--store", url, "query", "suspects", "--format", fmt]).stdout

        assert not {"\u2028", "\u2029", "\x85"} & set(printed)
        assert "n\\u2028x\\u2029y\\u0085z" in printed
        assert lines is None or len(printed.splitlines()) == lines
        found = [json.loads(line) for line in printed.splitlines()] if lines else json.loads(printed)
        assert [row["reason"] for row in found] == [SEPARATED]


def test_json_without_line_breaks_keeps_its_text_as_it_is(url):
    submitted(url, {"type": "node-registered", "node": "nœud\\u2028"})
    printed = invoke(["--store", url, "query", "nodes", "--format", "jsonl"]).stdout
    assert '"node": "nœud\\\\u2028"' in printed


def test_table_cells_escape_newlines_tabs_and_control_characters(url):
    suspected(url, "a\nb\tc\x1b[31m\u2028d")
    printed = invoke(["--store", url, "query", "suspects", "--format", "table"]).stdout

    assert printed.splitlines()[1].startswith("n1    suspect  initializing  a\\nb\\tc\\x1b[31m\\u2028d")
    assert len(printed.splitlines()) == 2


def test_csv_keeps_values_as_they_are(url):
    suspected(url, "a\nb\u2028c")
    printed = invoke(["--store", url, "query", "suspects", "--format", "csv"]).stdout
    assert printed.split("\n", 1)[1].startswith('n1,suspect,initializing,"a\nb\u2028c",')


def test_an_error_naming_a_value_is_one_line(small):
    result = invoke(["--store", small, "query", "history", "n\nx\u2028y"], code=1)
    assert result.stderr == "Error: no event or rejection names n\\nx\\u2028y\n"


# -- a stdout whose encoding lacks a character (PYTHONIOENCODING=ascii) ---------------

NON_ASCII = "caf\u00e9\U0001f600"


@pytest.mark.parametrize("encoding", ["ascii", "ascii:surrogateescape"])
@pytest.mark.parametrize("fmt", ["json", "jsonl", "csv", "table"])
def test_characters_stdout_cannot_encode_are_printed_as_json_escapes(url, fmt, encoding):
    """Not an internal error: the same value for a JSON reader, and a
    readable escape in a table or CSV."""
    submitted(url, {"type": "node-registered", "node": NON_ASCII})
    result = subprocess.run(
        [*CLI, "--store", url, "query", "nodes", "--format", fmt], capture_output=True,
        env={**os.environ, "PYTHONIOENCODING": encoding}, check=False,
    )

    assert (result.returncode, result.stderr) == (0, b"")
    printed = result.stdout.decode("ascii")
    assert "caf\\u00e9\\ud83d\\ude00" in printed
    if fmt == "json":
        assert [row["node"] for row in json.loads(printed)] == [NON_ASCII]
    if fmt == "jsonl":
        assert [json.loads(line)["node"] for line in printed.splitlines()] == [NON_ASCII]


def test_a_result_line_naming_what_stdout_cannot_encode_keeps_its_value(url):
    result = subprocess.run(
        [*CLI, "--store", url, "submit", "heartbeat", "--node", NON_ASCII], capture_output=True,
        env={**os.environ, "PYTHONIOENCODING": "ascii"}, check=False,
    )

    assert result.returncode == 1, result.stderr
    assert json.loads(result.stdout)["error"] == f"node {NON_ASCII} is not registered"
