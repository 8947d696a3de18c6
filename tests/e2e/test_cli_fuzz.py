"""Fuzzing the command line (SPEC section 4): whatever the words and stdin,
the exit code is 0, 1, 2 or 3 (the right one where the cause is clear), and
an error is one line on stderr, never a traceback nor an internal error.

The words come from the real command tree (``cli``'s commands, their
options and choices, ``submit``'s event types and fields), with values a
user may mistype: empty, huge, negative, unicode, NUL, ``-``, ``--``,
bytes that are not UTF-8 (as Python reads them from argv), an option given
twice, an unknown one, one of another command. ``submit -`` reads random
bytes, invalid UTF-8, a BOM, CRLF, long lines, JSON that is not an object.

A NUL in a word can only come in process (no argv or environment holds
one). Derandomized with a fixed number of examples, so CI runs the same ones
(under 10 s); ALLOC_LEDGER_FUZZ_EXAMPLES=5000 runs more by hand. No
PostgreSQL server is reached: its URLs name a port nothing listens on.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import pytest
from cli_support import STORY
from click.testing import CliRunner, Result
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from commands.cli import cli
from ledger.events import EVENT_TYPES, fields_of

EXAMPLES = int(os.environ.get("ALLOC_LEDGER_FUZZ_EXAMPLES", "0")) or None
FUZZ = settings(
    max_examples=EXAMPLES or 300,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

BEYOND = 10**9  # a position past the head, however many events the fuzz appends


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> str:
    here = tmp_path_factory.mktemp("fuzz")
    url = f"sqlite:///{here}/ledger.db"
    events = "".join(json.dumps(e) + "\n" for e in STORY)
    done = CliRunner().invoke(cli, ["--store", url, "submit", "-", "--quiet"], input=events)
    assert done.exit_code == 1, done.output  # the story's one rejection
    return url


@pytest.fixture(autouse=True)
def elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run where a relative store or file names nothing of the project's."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ALLOC_LEDGER_STORE", raising=False)
    monkeypatch.delenv("ALLOC_LEDGER_DEBUG", raising=False)


def run(url: str, args: list[str], input: bytes | None = None) -> Result:
    if DIGEST in args:
        head = CliRunner().invoke(cli, ["--store", url, "digest"]).stdout.strip()
        args = [head if a == DIGEST else a for a in args]
    return CliRunner().invoke(cli, ["--store", url, *args], input=input, prog_name="alloc-ledger")


# -- the command tree ------------------------------------------------------------------

def _tree() -> dict[str, click.Command]:
    """Every leaf command by its words (``query nodes``), from ``cli`` itself."""
    ctx = click.Context(cli)
    leaves: dict[str, click.Command] = {}
    for name in cli.list_commands(ctx):
        command = cli.get_command(ctx, name)
        assert command is not None
        if isinstance(command, click.Group):
            for sub in command.list_commands(ctx):
                leaves[f"{name} {sub}"] = command.get_command(ctx, sub)  # type: ignore[assignment]
        else:
            leaves[name] = command
    return leaves


TREE = _tree()
# ``demo`` runs four stories (seconds): the fuzz runs it only with a word that
# makes it a usage error (``_wrong``). ``project --follow`` never ends: never drawn.
SLOW = {"demo"}
ALL_OPTIONS = sorted({o for c in TREE.values() for p in c.params if isinstance(p, click.Option)
                      for o in p.opts + p.secondary_opts} - {"--follow"})

HEX = "4a00321660b1d827da47f203d192ddcfd43bfdb7f71ee4dae74101950bdfbcfe"
ODD = [
    "", " ", "-", "--", "-1", "0", "1", "5", str(BEYOND), "9" * 40, "-" + "9" * 40, "1e3", "1.5",
    "nan", "inf", "0x10", "ñ", "𝄞", "n\x00", "\x00", "n\udcff1", "a\nb", "a\rb", "\t", "'", '"',
    "null", "true", "[]", "{}", '["10.0.0.5"]', "[1, 2]", '[{"slot": 0, "alloc": null}]',
    "2026-01-01T00:00:00Z", "2026-01-01T00:00:00", "2026-13-40T25:61:61Z", "9999-12-31T23:59:59Z",
    "0001-01-01T00:00:00Z", "2026-01-01T00:00:00+25:00", "x" * 300,
    f"5:{HEX}", f"1:{HEX}", f"{BEYOND}:{HEX}", f"0:{HEX}", f"-1:{HEX}", f"5:{HEX.upper()}",
    f"5:{HEX[:-1]}", f"5:{HEX}0", f"5:{'g' * 64}", f":{HEX}", "5:", ":", f"5:{HEX}:1", f" 5:{HEX}",
    "sqlite:///x.db", "--store", "--help=1", "--format",
]
values = st.one_of(
    st.sampled_from(ODD),
    st.text(max_size=20),
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.text(alphabet=st.characters(codec="utf-8"), max_size=8).map(lambda t: t + "\udce9"),
)


@dataclass
class Line:
    """An argv, with what its words make certain of its exit code."""

    args: list[str]
    stdin: bytes | None = None
    expect: set[int] = field(default_factory=lambda: {0, 1, 2, 3})
    why: str = ""


# Values each option takes, so that most lines get past the parser (the rest
# of a value is drawn from ``values``). DIGEST is the store's head, set by ``run``.
DIGEST = "@digest@"
GOOD = {
    "as_of": ["1", "3", "5", "2026-01-01T00:00:30Z", "2030-01-01T00:00:00Z",
              "2020-01-01T00:00:00Z"],
    "now": ["2026-01-01T00:00:30Z", "2026-01-01T01:00:00+01:00"],
    "node": ["n1", "n9"], "job": ["web", "db"], "to": ["1", "3", "5"], "from_": ["1", "2"],
    "from": ["1", "2"], "digest": [DIGEST, f"1:{HEX}"], "batch": ["1", "100"], "poll": ["0.5"],
}


def _option_words(draw: Any, command: click.Command) -> list[str]:
    words: list[str] = []
    for param in command.params:
        if not isinstance(param, click.Option) or param.name == "help" or not draw(st.booleans()):
            continue
        name = draw(st.sampled_from(param.opts + param.secondary_opts))
        if param.is_flag:
            if name != "--follow":  # never ends
                words.append(name)
            continue
        good = list(param.type.choices) if isinstance(param.type, click.Choice) else []
        good += GOOD.get(param.name or "", [])
        value = draw(st.sampled_from(good)) if good and draw(st.integers(0, 3)) else draw(values)
        words += draw(st.sampled_from([[name, value], [f"{name}={value}"]]))
    return words


def _wrong(draw: Any) -> tuple[list[str], str]:
    """A word that is a usage error wherever it goes before ``--``."""
    return draw(st.sampled_from([
        (["--zz-bogus"], "an unknown option"),
        (["--zz-bogus=1"], "an unknown option"),
        (["--as-of", str(BEYOND)], "--as-of past the head, or an option this command lacks"),
        (["--batch", "0"], "--batch 0, or an option this command lacks"),
        (["--digest", "nope"], "a malformed digest, or an option this command lacks"),
        (["--format", "yaml"], "an unknown format, or an option this command lacks"),
    ]))


@st.composite
def lines(draw: Any) -> Line:
    words = draw(st.sampled_from(sorted(TREE)))
    command = TREE[words]
    args = words.split()
    if words == "submit":
        return draw(submit_lines())
    arguments = [p for p in command.params if isinstance(p, click.Argument)]
    for _ in arguments:
        args.append(draw(st.sampled_from(["n1", "a1", "n1#0", "10.0.0.5", "a9"]))
                    if draw(st.integers(0, 3)) else draw(values))
    args += _option_words(draw, command)
    shape = draw(st.sampled_from(["plain"] * 6 + ["wrong", "repeat", "foreign", "extra", "dashes"]))
    if words in SLOW and shape not in ("wrong", "repeat"):
        shape = "wrong"
    if shape == "wrong":
        wrong, why = _wrong(draw)
        at = len(words.split())  # where no option waits for its value
        return Line(args[:at] + wrong + args[at:], expect={2}, why=why)
    if shape == "repeat":
        options = [p for p in command.params if isinstance(p, click.Option)
                   and not (p.is_flag or p.count or p.multiple) and p.name != "help"]
        if options:
            name = draw(st.sampled_from(options)).opts[-1]
            return Line(args + [name, "1", name, "2"], expect={2}, why=f"{name} given twice")
        return Line(args + ["--zz-bogus"], expect={2}, why="an unknown option")
    if shape == "foreign":
        return Line(args + [draw(st.sampled_from(ALL_OPTIONS)), draw(values)])
    if shape == "extra":
        return Line(args + [draw(values)])
    if shape == "dashes":
        return Line(args + ["--", draw(values)])
    return Line(args)


FIELD_VALUES = {
    "node": ["n1", "n2"], "alloc": ["a1", "a2"], "parent": ["n1", "n9"], "slots": ["0", "2", "[]",
    '[{"slot": 0, "alloc": "a1"}]', '[{"slot": 1, "alloc": null}]'], "slot": ["0", "1", "7"],
    "addresses": ['["10.0.0.5"]', "[]"], "max_disconnect": ["60", "0"], "passed": ["true", "false"],
    "client_status": ["running", "complete", "failed", "pending"], "blame": ["node", "alloc"],
    "reason": ["gone"], "job": ["web"], "id": ["e1", "e2"], "at": ["2026-01-01T00:02:00Z"],
    "source": ["fuzz"],
}


@st.composite
def submit_lines(draw: Any) -> Line:
    how = draw(st.sampled_from(["type", "stream", "path"]))
    if how == "type":
        event_type = draw(st.sampled_from(sorted(EVENT_TYPES)))
        required, optional = fields_of(event_type)
        names = required + optional + ["id", "at", "source"]
        args = ["submit", event_type]
        chosen = (required if draw(st.integers(0, 3)) else []) + draw(st.lists(
            st.sampled_from(names + ["zz-bogus", "type", "store"]), max_size=4))
        for name in chosen:
            flag = "--" + name.replace("_", "-")
            good = FIELD_VALUES.get(name, ["n1", "a1", "n2"])
            value = draw(st.sampled_from(good)) if draw(st.integers(0, 3)) else draw(values)
            args += (draw(st.sampled_from([[flag, value], [f"{flag}={value}"]]))
                     if draw(st.integers(0, 9)) else [flag])
        if draw(st.booleans()):
            args.append(draw(st.sampled_from(["--quiet", "--batch", "--", "-", "x"])))
        return Line(args)
    if how == "path":
        path = draw(st.sampled_from(["/", "/nonexistent/x.jsonl", "/dev/null", "/etc/hostname",
                                     "x.jsonl", ".", "n\udcff.jsonl"]) | values)
        return Line(["submit", path])
    stdin = draw(streams())
    args = ["submit", "-", *draw(st.sampled_from([[], ["--quiet"], ["--batch", "1"],
                                                  ["--batch=2", "--quiet"]]))]
    expect = {0, 1}
    why = "a stream: appended, duplicate, rejected or invalid events"
    if not stdin.strip():
        expect, why = {0}, "a stream without events"
    elif _not_an_object(stdin):
        expect, why = {1}, "a stream with a line that is not a JSON object"
    return Line(args, stdin=stdin, expect=expect, why=why)


def _not_an_object(stdin: bytes) -> bool:
    stdin = stdin.removeprefix(b"\xef\xbb\xbf")
    for line in stdin.split(b"\n"):
        if not line.strip():
            continue
        try:
            if not isinstance(json.loads(line), dict):
                return True
        except (ValueError, RecursionError):
            return True
    return False


def _deep(depth: int) -> bytes:
    return b'{"type": "heartbeat", "node": ' + b"[" * depth + b"]" * depth + b"}"


event_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                max_size=3),
    max_leaves=8,
)
events = st.fixed_dictionaries(
    {"type": st.sampled_from([*EVENT_TYPES, "bogus", ""])},
    optional={n: st.sampled_from(["n1", "a1", "n9", "running"]) | event_values
              for n in ["node", "alloc", "slots", "slot", "client_status", "id", "at", "source",
                        "reason", "passed", "addresses", "max_disconnect", "parent", "zz"]},
).map(lambda e: json.dumps(e).encode())


@st.composite
def streams(draw: Any) -> bytes:
    pieces = draw(st.lists(st.one_of(
        events,
        st.binary(max_size=40),
        st.sampled_from([
            b"", b"\xef\xbb\xbf", b"\xff\xfe", b"\x00", b"[]", b"1", b"null", b'"x"', b"{",
            b'{"type": "heartbeat", "node": "n1"}\r', b"\xed\xa0\x80", b"\xc3", b"NaN",
            b'{"type": "heartbeat", "node": "n1", "node": "n2"}', _deep(5000), _deep(100),
            b"[" * 100_000, b'{"type": "heartbeat", "node": "' + b"x" * (1 << 20) + b'"}',
            b"x" * ((1 << 20) + 7), b"{}" * 1000, b"\t \x0b\x0c",
        ]),
    ), max_size=6))
    ends = draw(st.sampled_from([b"\n", b"\r\n", b"\r", b"\n\n"]))
    stdin = ends.join(pieces)
    return stdin + draw(st.sampled_from([b"", ends]))


# -- the properties --------------------------------------------------------------------

def check(result: Result, line: Line) -> None:
    shown = f"argv={line.args!r} stdin={line.stdin[:200]!r}..." if line.stdin else \
        f"argv={line.args!r}"
    said = f"{shown}\nexit {result.exit_code}\nstdout {result.stdout[:500]!r}\n" \
           f"stderr {result.stderr[:500]!r}"
    assert result.exception is None or isinstance(result.exception, SystemExit), \
        f"{said}\n{result.exc_info}"
    assert result.exit_code in {0, 1, 2, 3}, said
    for text in (result.stdout, result.stderr):
        assert "Traceback" not in text, said
        assert "internal error" not in text, said
    assert result.exit_code in line.expect, f"expected {line.expect} ({line.why}): {said}"
    if result.exit_code == 0:  # stderr may say more: "no events in stdin", a warning
        return
    if result.stderr.startswith("Usage: ") and "Error" not in result.stderr:
        # a group without its command shows its help (test_cli.py's
        # test_a_group_without_its_command_shows_its_help)
        assert result.exit_code in (0, 2), said
        return
    if result.exit_code in (2, 3) or not result.stdout:
        # one line, as test_cli.py's tests read it: "Error: …\n" and nothing else
        assert result.stderr.startswith("Error: "), said
        assert result.stderr.count("\n") == 1 and result.stderr.endswith("\n"), said


@FUZZ
@given(line=lines())
def test_any_command_line_exits_0_to_3_with_one_line_errors(url: str, line: Line) -> None:
    check(run(url, line.args, line.stdin), line)


@FUZZ
@example(line=Line(["submit", "n\x00"]))  # a NUL: only in process (argv cannot hold one)
@given(line=submit_lines())
def test_any_submission_exits_0_to_3_with_one_line_errors(url: str, line: Line) -> None:
    check(run(url, line.args, line.stdin), line)


@settings(FUZZ, max_examples=(EXAMPLES or 300) // 4)
@given(line=lines())
def test_a_store_that_cannot_be_opened_is_exit_3_or_a_usage_error(line: Line) -> None:
    missing = "sqlite:////nonexistent-alloc-ledger-dir/ledger.db"
    if line.args[:1] in (["demo"], ["schema"]):
        line.expect = {0, 2}  # they open no store of the global --store's
    elif line.args[:1] == ["submit"]:
        line.expect = {1, 2, 3}  # 1: an event invalid from its flags, before any store
    else:
        line.expect = {2, 3}
    result = run(missing, line.args, line.stdin)
    line.why += " (the store's directory is missing: 3 unless the words are wrong)"
    check(result, line)


# -- the store URL ---------------------------------------------------------------------

# Commands that read the store (one that writes it makes it first).
READERS = [["query", "nodes"], ["query", "history", "n1"], ["query", "nodes", "--as-of", "1"],
           ["digest"], ["verify"], ["project"], ["replay"], ["audit"], ["grant-reporting", "r"]]
# Malformed PostgreSQL URLs, on a port nothing listens on (no database is ever made).
POSTGRES = [
    "postgresql://postgres@[::1/test", "postgresql://postgres@127.0.0.1]/test",
    "postgresql://postgres@127.0.0.1:abc/test", "postgresql://postgres@127.0.0.1:99999/test",
    "postgresql://postgres@127.0.0.1:-1/test", "postgresql://%zz@127.0.0.1:1/test",
    "postgresql://postgres@127.0.0.1:1/test?schema=",
    "postgresql://postgres@127.0.0.1:1/test?bogus=1",
    "postgresql://postgres@127.0.0.1:1/test?schema=a&schema=b", "postgres://postgres@127.0.0.1:1/t",
    "postgresql://postgres@127.0.0.1:1/te\udcffst",  # bytes not UTF-8, as Python reads argv
    "postgresql://postgres@127.0.0.1:1/test?schema=\udcff", "postgresql://p\udcff@127.0.0.1:1/test",
    "postgresql://postgres@127.0.0.1:1/test?application_name=\udcff",
]


@st.composite
def stores(draw: Any) -> tuple[str, bool]:
    """A store URL, and whether it is a SQLite file the test makes first."""
    if draw(st.booleans()):
        return draw(st.sampled_from(POSTGRES)), False
    name = draw(st.text(st.characters(codec="utf-8", exclude_characters="/\x00"), min_size=1,
                        max_size=12) | st.sampled_from(["\udcff", "n\udce9.db", "é.db", "a b.db",
                                                        "%41.db", "a?b.db", "a#b.db", "x.db?"]))
    return f"sqlite:///{name}", True


@FUZZ
@example(store=("sqlite:///b\udcff.db", True), args=["digest"])
@example(store=("postgresql://postgres@[::1/test", False), args=["grant-reporting", "r"])
@example(store=("postgresql://postgres@127.0.0.1:1/te\udcffst", False), args=["query", "nodes"])
@given(store=stores(), args=st.sampled_from(READERS))
def test_any_store_url_exits_0_to_3_with_one_line_errors(
    store: tuple[str, bool], args: list[str]
) -> None:
    url, made = store
    if made:  # the submit may refuse the URL (exit 3), as every reader then must
        submit = ["submit", "node-registered", "--node", "n1"]
        made_by = Line(["--store", url, *submit], expect={0, 1, 3}, why="a new store")
        check(run(url, submit), made_by)
    check(run(url, args), Line(["--store", url, *args]))
