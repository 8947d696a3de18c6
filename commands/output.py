"""The one output helper: every command prints through ``write`` (read
commands through ``emit``), so a stdout that cannot take the output (full,
or closed by its reader: ``| head``) ends the command with one line, as a
stdout closed from the start (``>&-``) does (``require_stdout``)."""

from __future__ import annotations

import codecs
import csv
import errno
import io
import json
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any

import click

FORMATS = ("table", "json", "jsonl", "csv")


class ClosedStream(click.ClickException):
    """The command was started without the stream it reads or writes: exit 2."""

    exit_code = 2


def require_stdout() -> None:
    """Refuse to start a command whose output would be lost (``>&-``)."""
    if sys.stdout is None:
        raise ClosedStream("stdout is closed: the output could not be printed; nothing was done")


def cannot_print(why: str) -> click.ClickException:
    return click.ClickException(f"cannot print the output to stdout ({why})")


def write(text: str, lost: Callable[[str], click.ClickException] = cannot_print) -> None:
    """Put ``text`` on stdout at once. A stdout that cannot take it all (full,
    closed by its reader, a file at its size limit) raises ``lost(why)``,
    one line for the user, and what is still buffered goes nowhere (not into
    a warning at exit)."""
    stream = sys.stdout
    try:
        stream.flush()  # what others wrote first (click's own text)
        buffer = getattr(stream, "buffer", None)
        if buffer is None:  # a text stream alone (in memory)
            stream.write(text)
            stream.flush()
        elif text:  # (an empty write reaches a full device, an empty flush does not)
            try:
                data = text.encode(stream.encoding, stream.errors or "strict")
            except UnicodeEncodeError:  # (surrogateescape, say, fails on them as strict does)
                data = text.encode(stream.encoding, ESCAPED)
            _write_all(buffer, data)
            buffer.flush()
    except OSError as error:
        raise output_lost(error, lost) from None


def _as_json_escapes(error: UnicodeError) -> tuple[str, int]:
    """Characters stdout's encoding lacks (``PYTHONIOENCODING=ascii``) as JSON
    escapes them (``\\u00e9``, a pair past U+FFFF): the same value for a JSON
    reader, as they only ever stand inside JSON strings, and readable in a
    table or CSV, as ``printable`` escapes control characters."""
    if not isinstance(error, UnicodeEncodeError):
        raise error
    escaped = json.dumps(error.object[error.start:error.end])[1:-1]  # ensure_ascii
    return escaped, error.end


ESCAPED = "alloc-ledger-json-escapes"
codecs.register_error(ESCAPED, _as_json_escapes)


def output_lost(
    error: OSError, lost: Callable[[str], click.ClickException] = cannot_print
) -> click.ClickException:
    """The line ``lost(why)`` for output stdout could not take; what it
    still holds goes nowhere (not into a warning at exit). A reader that
    closed the pipe (``| head``) had what it wanted: the command ends
    quietly, as one ended by SIGPIPE does (``ReaderGone``), unless its
    ``lost`` has more to say (``submit``: what was kept)."""
    _discard_stdout()
    if error.errno == errno.EPIPE and lost is cannot_print:
        return ReaderGone("")
    return lost(error.strerror or type(error).__name__)


class ReaderGone(click.ClickException):
    """stdout's reader closed it early (``| head``): no line, exit 141, the
    status a shell shows for a command ended by SIGPIPE, as ``seq`` or
    ``cat`` end there (so ``set -o pipefail`` sees it as it sees theirs)."""

    exit_code = 141

    def show(self, file: Any = None) -> None:
        """Nothing: the reader has what it read."""


def _write_all(buffer: Any, data: bytes) -> None:
    """Write all of ``data``: a write cut short (the reader went away, the
    file reached its limit) reports how much it wrote, not why it stopped;
    writing the rest raises why."""
    view = memoryview(data)
    while view:
        written = buffer.write(view)
        if not written:
            raise OSError(errno.EIO, "nothing was written")
        view = view[written:]


def echo(text: str = "") -> None:
    """One line on stdout, through ``write``."""
    write(text + "\n")


def _discard_stdout() -> None:
    try:
        nowhere = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(nowhere, sys.stdout.fileno())
        finally:
            os.close(nowhere)
    except (OSError, ValueError, AttributeError):  # no descriptor (a stream in memory)
        pass


LINE_BREAKS = str.maketrans({"\u2028": "\\u2028", "\u2029": "\\u2029", "\x85": "\\u0085"})


def json_text(value: Any, indent: int | None = None) -> str:
    """``json.dumps`` as printed: UTF-8 as it is, but the line breaks JSON
    leaves raw (U+2028, U+2029, U+0085) escaped, the same value for a JSON
    reader, one line for a reader that splits lines as Python or JavaScript
    does. Looked for first: most texts have none."""
    text = json.dumps(value, indent=indent, ensure_ascii=False)
    if "\u2028" in text or "\u2029" in text or "\x85" in text:
        return text.translate(LINE_BREAKS)
    return text


UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def printable(text: str) -> str:
    """Text for a human on one line: newlines, tabs, other control characters
    and line separators as escapes (``\\n``, ``\\x1b``, ``\\u2028``)."""
    if UNPRINTABLE.search(text) is None:
        return text
    return UNPRINTABLE.sub(lambda found: _escape(found.group()), text)


def _escape(char: str) -> str:
    code = ord(char)
    return NAMED.get(char) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def format_option(command: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--format",
        "fmt",
        type=click.Choice(FORMATS),
        default=None,
        help="Output format (default: table on a terminal, json when piped).",
    )(command)


def chosen(fmt: str | None) -> str:
    return fmt or ("table" if sys.stdout.isatty() else "json")


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(_cell(v) for v in value)
    if isinstance(value, dict):
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return str(value)


def _csv_cell(value: Any) -> str:
    """A list is JSON text in CSV, as in the tables: ["x,y"] and ["x","y"]
    must not both read x,y."""
    if isinstance(value, list):
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return _cell(value)


def table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    cells = [[printable(_cell(row.get(c))) for c in columns] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(lines)


def _csv(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return text.getvalue()


def emit(rows: Sequence[dict[str, Any]], columns: Sequence[str], fmt: str | None) -> None:
    """Print rows in the chosen format, columns in the given order."""
    fmt = chosen(fmt)
    ordered = [{c: row.get(c) for c in columns} | row for row in rows]
    if fmt == "json":
        echo(json_text(ordered, indent=2))
    elif fmt == "jsonl":
        write("".join(json_text(row) + "\n" for row in ordered))
    elif fmt == "csv":
        write(_csv(columns, [[_csv_cell(row.get(c)) for c in columns] for row in ordered]))
    elif not rows:
        echo("(none)")
    else:
        echo(table(ordered, columns))


def emit_object(obj: dict[str, Any], fmt: str | None) -> None:
    """Print one object: JSON as an object, a table as field/value lines."""
    fmt = chosen(fmt)
    if fmt == "json":
        echo(json_text(obj, indent=2))
    elif fmt == "jsonl":
        echo(json_text(obj))
    elif fmt == "csv":
        write(_csv(("field", "value"), [[key, _csv_cell(value)] for key, value in obj.items()]))
    else:
        scalars = [{"field": k, "value": v} for k, v in obj.items() if not _is_rows(v)]
        echo(table(scalars, ("field", "value")))
        for key, value in obj.items():
            if _is_rows(value) and value:
                echo(f"\n{key}:")
                echo(table(value, list(value[0].keys())))


def line(obj: dict[str, Any]) -> None:
    """One JSON object on one line: the progress and summary lines of commands
    that write rather than read."""
    echo(json.dumps(obj))


def _is_rows(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and isinstance(value[0], dict)
