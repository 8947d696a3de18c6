"""The one output helper: every read command prints through ``emit``."""

from __future__ import annotations

import csv
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

import click

FORMATS = ("table", "json", "jsonl", "csv")


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
    cells = [[_cell(row.get(c)) for c in columns] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(lines)


def emit(rows: Sequence[dict[str, Any]], columns: Sequence[str], fmt: str | None) -> None:
    """Print rows in the chosen format, columns in the given order."""
    fmt = chosen(fmt)
    ordered = [{c: row.get(c) for c in columns} | row for row in rows]
    if fmt == "json":
        click.echo(json.dumps(ordered, indent=2, ensure_ascii=False))
    elif fmt == "jsonl":
        for row in ordered:
            click.echo(json.dumps(row, ensure_ascii=False))
    elif fmt == "csv":
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(columns)
        for row in ordered:
            writer.writerow([_csv_cell(row.get(c)) for c in columns])
    elif not rows:
        click.echo("(none)")
    else:
        click.echo(table(ordered, columns))


def emit_object(obj: dict[str, Any], fmt: str | None) -> None:
    """Print one object: JSON as an object, a table as field/value lines."""
    fmt = chosen(fmt)
    if fmt == "json":
        click.echo(json.dumps(obj, indent=2, ensure_ascii=False))
    elif fmt == "jsonl":
        click.echo(json.dumps(obj, ensure_ascii=False))
    elif fmt == "csv":
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(["field", "value"])
        for key, value in obj.items():
            writer.writerow([key, _csv_cell(value)])
    else:
        scalars = [{"field": k, "value": v} for k, v in obj.items() if not _is_rows(v)]
        click.echo(table(scalars, ("field", "value")))
        for key, value in obj.items():
            if _is_rows(value) and value:
                click.echo(f"\n{key}:")
                click.echo(table(value, list(value[0].keys())))


def line(obj: dict[str, Any]) -> None:
    """One JSON object on one line: the progress and summary lines of commands
    that write rather than read."""
    click.echo(json.dumps(obj))


def _is_rows(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and isinstance(value[0], dict)
