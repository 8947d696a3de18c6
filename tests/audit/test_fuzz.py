"""Bad input: ``submit`` is fed arbitrary bytes, broken UTF-8, deeply nested
JSON, wrong types, unknown fields and huge lines. It never shows a
traceback, prints one result line per non-blank input line (an ``invalid``
one with a clear error), appends nothing for invalid lines, and reads a
huge line in bounded memory."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from audit_support import CLI, history, jsonl, no_traceback, results
from click.testing import CliRunner
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from commands.cli import cli
from ledger.store import open_store

MAX_LINE = 1 << 20
STATUSES = {"appended", "duplicate", "rejected", "invalid"}

# -- what to feed ----------------------------------------------------------------

names = st.text("abcn0123456789-", min_size=1, max_size=6)
valid_events = st.one_of(
    st.builds(lambda n, s: {"type": "node-registered", "node": n, "slots": s},
              names, st.integers(0, 4)),
    st.builds(lambda n: {"type": "heartbeat", "node": n}, names),
    st.builds(lambda n: {"type": "heartbeat-missed", "node": n}, names),
    st.builds(lambda a, n, s: {"type": "alloc-placed", "alloc": a, "node": n, "slot": s},
              names, names, st.integers(0, 3)),
    st.builds(lambda a, c: {"type": "alloc-updated", "alloc": a, "client_status": c},
              names, st.sampled_from(["pending", "running", "complete", "failed"])),
    st.builds(lambda a: {"type": "alloc-remove-requested", "alloc": a}, names),
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                  max_size=3),
    max_leaves=8,
)


def dumped(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass")


@st.composite
def wrong_type(draw: st.DrawFn) -> bytes:
    event = dict(draw(valid_events))
    field = draw(st.sampled_from(sorted(event)))
    event[field] = draw(json_values.filter(lambda v: not isinstance(v, str)))
    return dumped(event)


@st.composite
def unknown_field(draw: st.DrawFn) -> bytes:
    event = dict(draw(valid_events))
    name = draw(st.text(min_size=1, max_size=10).filter(
        lambda k: k not in {"type", "id", "at", "source", "node", "alloc", "slots", "slot",
                            "parent", "reason", "passed", "job", "addresses",
                            "max_disconnect", "client_status", "blame"}))
    event[name] = draw(json_values)
    return dumped(event)


@st.composite
def broken_utf8(draw: st.DrawFn) -> bytes:
    junk = draw(st.sampled_from([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf0\x28\x8c\x28",
                                 b"\x80", b"\xe2\x82"]))
    return b'{"type":"heartbeat","node":"n' + junk + b'"}'


@st.composite
def deeply_nested(draw: st.DrawFn) -> bytes:
    depth = draw(st.integers(100, 20_000))
    opening, closing = draw(st.sampled_from([(b"[", b"]"), (b'{"a":', b"}")]))
    nest = opening * depth + b"1" + closing * depth
    if draw(st.booleans()):
        return b'{"type":"heartbeat","node":"n1","slots":' + nest + b"}"
    return nest


def no_newline(data: bytes) -> bytes:
    return data.replace(b"\n", b" ")


lines = st.one_of(
    valid_events.map(dumped),
    st.binary(max_size=120).map(no_newline),
    broken_utf8(),
    deeply_nested(),
    wrong_type(),
    unknown_field(),
    json_values.map(dumped).map(no_newline),
    st.sampled_from([b"", b"   ", b"\t", b"\r", b"\x0c"]),
)
streams = st.lists(lines, min_size=1, max_size=12).map(
    lambda parts: b"\n".join(parts)
) | st.binary(max_size=300)


# -- what must come out ------------------------------------------------------------


def numbered(data: bytes) -> list[tuple[int, bytes]]:
    """The input lines a result is owed for: (line number, content), blank ones
    skipped (the first after the byte order mark it may start with)."""
    parts = data.split(b"\n")
    if data.endswith(b"\n"):
        parts.pop()
    text = [part[3:] if n == 1 and part.startswith(b"\xef\xbb\xbf") else part
            for n, part in enumerate(parts, 1)]
    return [(n, part) for n, (part, shown) in enumerate(zip(parts, text, strict=True), 1)
            if shown.strip() or len(part) > MAX_LINE]


def check_results(data: bytes, stdout: bytes, head_before: int, head_after: int) -> list[dict]:
    owed = numbered(data)
    found = results(stdout)
    assert [r["line"] for r in found] == [n for n, _ in owed], (found, owed)
    kept = []
    for report in found:
        assert report["status"] in STATUSES, report
        if report["status"] == "invalid":
            assert report["position"] is None, report
            assert isinstance(report.get("error"), str) and report["error"].strip(), report
            assert "Traceback" not in report["error"], report
        else:
            assert isinstance(report["position"], int), report
        if report["status"] in ("appended", "rejected"):
            kept.append(report["position"])
    assert kept == list(range(head_before + 1, head_after + 1)), "only kept lines appended"
    return found


def head(url: str) -> int:
    store = open_store(url)
    try:
        with store.reading() as cursor:
            return store.head(cursor)
    finally:
        store.close()


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    folder = tmp_path_factory.mktemp("fuzz")
    url = f"sqlite:///{folder}/ledger.db"
    open_store(url).close()
    yield url, folder


@settings(max_examples=60, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=streams)
@example(data=b"\xef\xbb\xbf")  # a byte order mark alone: a blank first line
@example(data=b"\xef\xbb\xbf{}\n\xef\xbb\xbf{}\n")  # ignored before the first line only
def test_submit_answers_every_line_of_any_input_without_a_traceback(
    fuzzed: tuple[str, Path], data: bytes
) -> None:
    url, folder = fuzzed
    source = folder / "input.jsonl"
    source.write_bytes(data)
    before = head(url)

    result = CliRunner().invoke(cli, ["--store", url, "submit", str(source)])

    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    no_traceback(result.output)
    no_traceback(result.stderr)
    found = check_results(data, result.stdout_bytes, before, head(url))
    failed = any(r["status"] in ("invalid", "rejected") for r in found)
    assert result.exit_code == (1 if failed else 0), (result.exit_code, result.stderr)


def test_errors_name_the_field_that_is_wrong(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/ledger.db"
    source = tmp_path / "bad.jsonl"
    source.write_bytes(b"\n".join([
        b'{"type":"node-registered","node":"n1","slots":"two"}',
        b'{"type":"node-registered","node":"n1","colour":"red"}',
        b'{"type":"teleported","node":"n1"}',
        b'{"type":"heartbeat","node":"n\xff"}',
        b"[" * 10_000 + b"]" * 10_000,
        b"not json at all",
    ]))
    result = CliRunner().invoke(cli, ["--store", url, "submit", str(source)])
    errors = [r["error"] for r in results(result.stdout_bytes)]
    assert result.exit_code == 1
    assert "slots" in errors[0]
    assert "unknown field 'colour'" in errors[1]
    assert "unknown type 'teleported'" in errors[2]
    assert all(errors), errors
    assert head(url) == 0


def feed(process: subprocess.Popen[bytes], chunks: Iterator[bytes]) -> threading.Thread:
    def write() -> None:
        assert process.stdin is not None
        try:
            for chunk in chunks:
                process.stdin.write(chunk)
        except BrokenPipeError:
            pass
        finally:
            process.stdin.close()

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    return thread


def submit_stdin(url: str, chunks: Iterator[bytes]) -> tuple[int, bytes, bytes, int]:
    """``submit -`` fed through a pipe; returns (exit code, stdout, stderr, peak RSS in KiB)."""
    process = subprocess.Popen(
        [*CLI, "--store", url, "submit", "-"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    writer = feed(process, chunks)
    assert process.stdout is not None and process.stderr is not None
    stdout, stderr = process.stdout.read(), process.stderr.read()
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    writer.join()
    return process.returncode, stdout, stderr, usage.ru_maxrss


def huge_stream(total: int, piece: int = 1 << 20) -> Iterator[bytes]:
    """One valid event, one line of ``total`` bytes (a JSON string, valid but
    for its length), one valid event, sent a piece at a time."""
    yield b'{"type":"node-registered","node":"h1"}\n{"type":"node-registered","node":"h2","source":"'
    sent = 0
    while sent < total:
        yield b"x" * min(piece, total - sent)
        sent += piece
    yield b'"}\n{"type":"heartbeat","node":"h1"}\n'


def test_huge_lines_are_invalid_and_read_in_bounded_memory(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/ledger.db"
    small = submit_stdin(url, iter([jsonl(history(3))]))
    assert small[0] == 0, small[2]

    code, stdout, stderr, peak = submit_stdin(url, huge_stream(64 << 20))

    no_traceback(stderr)
    found = results(stdout)
    assert [(r["line"], r["status"]) for r in found] == [
        (1, "appended"), (2, "invalid"), (3, "appended")]
    assert "longer than" in found[1]["error"]
    assert code == 1
    assert peak < small[3] + 32 * 1024, f"peak RSS {peak} KiB vs {small[3]} KiB for 3 events"
    assert head(url) == 5


def test_a_line_just_over_the_limit_is_invalid_and_one_at_the_limit_is_read(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path}/ledger.db"
    prefix = b'{"type":"node-registered","node":"n1","source":"'
    at_limit = prefix + b"y" * (MAX_LINE - len(prefix) - 2) + b'"}'
    over = prefix + b"y" * (MAX_LINE - len(prefix) - 1) + b'"}'
    assert (len(at_limit), len(over)) == (MAX_LINE, MAX_LINE + 1)
    source = tmp_path / "edge.jsonl"
    source.write_bytes(at_limit + b"\n" + over + b"\n\n" + b"z" * (2 * MAX_LINE))

    result = CliRunner().invoke(cli, ["--store", url, "submit", str(source)])

    found = results(result.stdout_bytes)
    assert [(r["line"], r["status"]) for r in found] == [
        (1, "invalid"), (2, "invalid"), (4, "invalid")]
    assert "source" in found[0]["error"]  # read whole and judged on its fields
    assert "longer than" in found[1]["error"] and "longer than" in found[2]["error"]
    assert head(url) == 0


def test_submit_reads_standard_input_under_the_click_test_runner(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/ledger.db"
    result = CliRunner().invoke(cli, ["--store", url, "submit", "-"],
                                input=b'{"type":"node-registered","node":"n1"}\n')
    assert result.exit_code == 0, result.output
    assert [r["status"] for r in results(result.stdout_bytes)] == ["appended"]
