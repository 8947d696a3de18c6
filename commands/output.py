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
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import chain
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


CHUNK = 1 << 16  # characters written at once when an output comes in pieces


def write_pieces(pieces: Iterable[str]) -> None:
    """``write`` an output made as it is printed, about ``CHUNK`` at a time:
    what is read for it is printed before the rest is read."""
    held: list[str] = []
    size = 0
    for piece in pieces:
        held.append(piece)
        size += len(piece)
        if size >= CHUNK:
            write("".join(held))
            held, size = [], 0
    if held:
        write("".join(held))


class Rows:
    """Rows too many to hold (a long history): printed as they are read.
    ``read()`` gives them from the first each time: a table reads them
    twice, its widths first."""

    def __init__(self, read: Callable[[], Iterator[dict[str, Any]]]) -> None:
        self._read = read
        self._begun: Iterator[dict[str, Any]] | None = None

    def peek(self) -> dict[str, Any] | None:
        """The first row (None: there are none); the next reading starts with it."""
        begun = self._read()
        first = next(begun, None)
        self._begun = begun if first is None else chain([first], begun)
        return first

    def __iter__(self) -> Iterator[dict[str, Any]]:
        begun, self._begun = self._begun, None
        return begun if begun is not None else self._read()


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
    return "\n".join([_line(columns, widths)] + [_line(r, widths) for r in cells])


def _line(cells: Sequence[str], widths: Sequence[int]) -> str:
    return "  ".join(v.ljust(w) for v, w in zip(cells, widths, strict=True)).rstrip()


def _read_table(rows: Rows, columns: Sequence[str] | None) -> Iterator[str] | None:
    """The lines of a table of ``rows`` (``columns``: those of the first
    row), read twice: for the widths, then as printed. The last column is
    not padded, so its cells are not measured. None if there are no rows."""
    shown: list[str] = []
    widths: list[int] = []
    for row in rows:
        if not shown:
            shown = list(columns or row)
            widths = [len(c) for c in shown[:-1]] + [0]
        for i, c in enumerate(shown[:-1]):
            widths[i] = max(widths[i], len(printable(_cell(row.get(c)))))
    if not shown:
        return None

    def lines() -> Iterator[str]:
        yield _line(shown, widths) + "\n"
        for row in rows:
            yield _line([printable(_cell(row.get(c))) for c in shown], widths) + "\n"

    return lines()


def _csv_row(cells: Sequence[str]) -> str:
    text = io.StringIO()
    csv.writer(text, lineterminator="\n").writerow(cells)
    return text.getvalue()


def _csv(header: Sequence[str], rows: Iterable[Sequence[str]]) -> Iterator[str]:
    yield _csv_row(header)
    yield from map(_csv_row, rows)


def _csv_rows_cell(rows: Rows) -> Iterator[str]:
    """``_csv_cell`` of rows, as CSV writes that cell (quoted unless
    ``[]``), made as they are read."""
    first = True
    for row in rows:
        yield '"[' if first else ","
        first = False
        yield json.dumps(row, separators=(",", ":"), ensure_ascii=False).replace('"', '""')
    yield "[]" if first else ']"'


def _json_pieces(value: Any, indent: int | None, level: int = 0) -> Iterator[str]:
    """``json_text(value, indent)`` nested ``level`` deep, in pieces: Rows
    (in a dict too) read as they are written."""
    if isinstance(value, Rows):
        yield from _json_list(value, indent, level)
    elif isinstance(value, dict) and any(isinstance(v, Rows) for v in value.values()):
        yield from _json_list(value.items(), indent, level, pairs=True)
    else:
        text = json_text(value, indent)
        yield text.replace("\n", "\n" + " " * (indent * level)) if indent and level else text


def _json_list(
    items: Iterable[Any], indent: int | None, level: int, pairs: bool = False
) -> Iterator[str]:
    """A JSON array of ``items``, or an object of their (key, value)
    ``pairs``, as ``json.dumps`` spaces them."""
    opening, closing = "{}" if pairs else "[]"
    if indent is None:
        start, between, end = opening, ", ", closing
    else:
        inner = "\n" + " " * (indent * (level + 1))
        start, between = opening + inner, "," + inner
        end = "\n" + " " * (indent * level) + closing
    first = True
    for item in items:
        yield start if first else between
        first = False
        if pairs:
            key, item = item
            yield json_text(key) + ": "
        yield from _json_pieces(item, indent, level + 1)
    yield opening + closing if first else end


def emit(rows: Iterable[dict[str, Any]], columns: Sequence[str], fmt: str | None) -> None:
    """Print rows in the chosen format, columns in the given order; Rows
    are printed as they are read."""
    fmt = chosen(fmt)
    if fmt == "table":
        _emit_table(rows, columns)
        return
    ordered = ({c: row.get(c) for c in columns} | row for row in rows)
    if fmt == "json":
        write_pieces(chain(_json_list(ordered, 2, 0), ["\n"]))
    elif fmt == "jsonl":
        write_pieces(json_text(row) + "\n" for row in ordered)
    elif fmt == "csv":
        write_pieces(_csv(columns, ([_csv_cell(row.get(c)) for c in columns] for row in ordered)))


def _emit_table(rows: Iterable[dict[str, Any]], columns: Sequence[str]) -> None:
    if isinstance(rows, Rows):
        lines = _read_table(rows, columns)
        write_pieces(["(none)\n"] if lines is None else lines)
    else:
        held = list(rows)
        echo(table(held, columns) if held else "(none)")


def emit_object(obj: dict[str, Any], fmt: str | None) -> None:
    """Print one object: JSON as an object, a table as field/value lines;
    a value of Rows is printed as they are read."""
    fmt = chosen(fmt)
    if fmt == "json":
        write_pieces(chain(_json_pieces(obj, 2), ["\n"]))
    elif fmt == "jsonl":
        write_pieces(chain(_json_pieces(obj, None), ["\n"]))
    elif fmt == "csv":
        write_pieces(_csv_object(obj))
    else:
        # Rows that turn out to be none are a field without a value, as an empty list is.
        empty = {k for k, v in obj.items() if isinstance(v, Rows) and v.peek() is None}
        scalars = [{"field": k, "value": [] if k in empty else v}
                   for k, v in obj.items() if k in empty or not _is_rows(v)]
        echo(table(scalars, ("field", "value")))
        for key, value in obj.items():
            if key in empty or not _is_rows(value):
                continue
            if isinstance(value, Rows):
                write_pieces(chain([f"\n{key}:\n"], _read_table(value, None) or ()))
            else:
                echo(f"\n{key}:")
                echo(table(value, list(value[0].keys())))


def _csv_object(obj: dict[str, Any]) -> Iterator[str]:
    yield _csv_row(("field", "value"))
    for key, value in obj.items():
        if isinstance(value, Rows):
            yield _csv_row([key, ""])[:-1]  # the key, and the comma before its value
            yield from _csv_rows_cell(value)
            yield "\n"
        else:
            yield _csv_row([key, _csv_cell(value)])


def line(obj: dict[str, Any]) -> None:
    """One JSON object on one line: the progress and summary lines of commands
    that write rather than read."""
    echo(json.dumps(obj))


def _is_rows(value: Any) -> bool:
    return isinstance(value, Rows) or (
        isinstance(value, list) and bool(value) and isinstance(value[0], dict))
