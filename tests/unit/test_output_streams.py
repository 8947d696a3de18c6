"""Rows too many to hold (a long history) are printed as they are read, in
every format, and printed exactly as the same rows held in a list are."""

from __future__ import annotations

import csv
import io
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from commands import output
from commands.output import Rows, emit, emit_object, json_text, table

COLUMNS = ("position", "type", "event")
VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)
ROWS = st.lists(
    st.fixed_dictionaries({"position": st.integers(), "type": st.text(), "event": VALUES}),
    max_size=4,
)
TEXT = st.sampled_from(["", "a", "x,y", 'say "hi"', "é\u2028\n"])


class Printed(io.StringIO):
    """A stdout in memory that notes, at each write, how many rows had been read."""

    def __init__(self, counted: list[int]) -> None:
        super().__init__()
        self.counted = counted
        self.reads_at_writes: list[int] = []

    def write(self, text: str) -> int:
        self.reads_at_writes.append(self.counted[0])
        return super().write(text)


def printed(monkeypatch: pytest.MonkeyPatch, show: Any, counted: list[int] | None = None) -> Printed:
    stdout = Printed(counted or [0])
    with monkeypatch.context() as patch:
        patch.setattr(sys, "stdout", stdout)
        show()
    return stdout


def rows_of(held: list[dict[str, Any]], counted: list[int] | None = None) -> Rows:
    def read() -> Iterator[dict[str, Any]]:
        for row in held:
            if counted is not None:
                counted[0] += 1
            yield dict(row)
    return Rows(read)


def as_csv(*rows: list[str]) -> str:
    text = io.StringIO()
    csv.writer(text, lineterminator="\n").writerows(rows)
    return text.getvalue()


@given(ROWS, st.sampled_from(["json", "jsonl", "csv", "table"]))
def test_rows_read_as_printed_are_printed_as_a_list_of_them_was(held, fmt):
    monkeypatch = pytest.MonkeyPatch()
    ordered = [{c: row.get(c) for c in COLUMNS} | row for row in held]
    expected = {
        "json": json_text(ordered, indent=2) + "\n",
        "jsonl": "".join(json_text(row) + "\n" for row in ordered),
        "csv": as_csv(list(COLUMNS), *[[output._csv_cell(r[c]) for c in COLUMNS] for r in ordered]),
        "table": (table(ordered, COLUMNS) if held else "(none)") + "\n",
    }[fmt]

    assert printed(monkeypatch, lambda: emit(rows_of(held), COLUMNS, fmt)).getvalue() == expected


FIELDS = st.none() | st.booleans() | st.integers() | TEXT | st.lists(TEXT, max_size=2)


@given(ROWS, st.dictionaries(TEXT, FIELDS, max_size=3), TEXT,
       st.sampled_from(["json", "jsonl", "csv", "table"]))
def test_an_object_with_rows_read_as_printed_is_printed_as_with_a_list_of_them(
    held, fields, key, fmt
):
    monkeypatch = pytest.MonkeyPatch()
    fields.pop(key, None)
    listed = {**fields, key: held}
    expected = {
        "json": json_text(listed, indent=2) + "\n",
        "jsonl": json_text(listed) + "\n",
        "csv": as_csv(["field", "value"], *[[k, output._csv_cell(v)] for k, v in listed.items()]),
        "table": printed(monkeypatch, lambda: emit_object(listed, "table")).getvalue(),
    }[fmt]
    streamed = {**fields, key: rows_of(held)}

    assert printed(monkeypatch, lambda: emit_object(streamed, fmt)).getvalue() == expected


MANY = [{"position": n, "type": "heartbeat", "event": {"slots": ["x" * 50] * 40}} for n in range(200)]


@pytest.mark.parametrize("fmt", ["json", "jsonl", "csv", "table"])
def test_the_first_rows_are_printed_before_the_last_are_read(monkeypatch, fmt):
    counted = [0]
    stdout = printed(monkeypatch, lambda: emit(rows_of(MANY, counted), COLUMNS, fmt), counted)

    reads = len(MANY) * (2 if fmt == "table" else 1)  # a table reads them twice: widths first
    assert counted[0] == reads
    assert len(stdout.reads_at_writes) > 2
    assert stdout.reads_at_writes[0] < reads - len(MANY) / 2, stdout.reads_at_writes
    assert stdout.getvalue().count("heartbeat") == len(MANY)


@pytest.mark.parametrize("fmt", ["json", "jsonl", "csv", "table"])
def test_the_first_rows_of_an_object_are_printed_before_the_last_are_read(monkeypatch, fmt):
    counted = [0]
    answer = {"alloc": "a1", "history": rows_of(MANY, counted)}
    stdout = printed(monkeypatch, lambda: emit_object(answer, fmt), counted)

    reads = len(MANY) * (2 if fmt == "table" else 1)
    assert counted[0] == reads
    assert [n for n in stdout.reads_at_writes if n < reads - len(MANY) / 2], stdout.reads_at_writes


def test_peeking_at_rows_reads_the_first_once():
    counted = [0]
    rows = rows_of(MANY[:3], counted)

    assert rows.peek() == MANY[0]
    assert [row["position"] for row in rows] == [0, 1, 2]
    assert counted[0] == 3  # the row peeked at was not read again
    assert [row["position"] for row in rows] == [0, 1, 2]  # and again, from the first
    assert rows_of([]).peek() is None
