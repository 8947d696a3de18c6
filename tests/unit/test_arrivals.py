"""Reading a submit stream from a pipe: the same numbered lines as reading a file."""

from __future__ import annotations

import io
import json
import os
import threading

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from commands import submit
from commands.output import json_text
from ledger.model import Receipt

LIMIT = 16  # a small line limit, so that over-long lines are common


def from_pipe(data: bytes, most: int) -> list[tuple[int, object]]:
    reading, writing = os.pipe()

    def feed() -> None:
        with os.fdopen(writing, "wb") as out:
            for start in range(0, len(data), 7):  # in pieces, as a producer writes
                out.write(data[start : start + 7])
                out.flush()

    feeder = threading.Thread(target=feed)
    feeder.start()
    arrivals = submit.Arrivals(reading)
    found = []
    while taken := arrivals.take(most):
        assert len(taken) <= most
        found.extend(taken)
    feeder.join()
    os.close(reading)
    return found


def from_file(data: bytes) -> list[tuple[int, object]]:
    return list(submit._lines(io.BytesIO(data)))


lines = st.lists(
    st.one_of(
        st.binary(max_size=2 * LIMIT).map(lambda b: b.replace(b"\n", b"")),
        st.sampled_from([b"", b"  ", b"\r", b"x" * LIMIT, b"y" * (LIMIT + 1)]),
    ),
    max_size=12,
)


@settings(max_examples=200, deadline=None)
@given(lines, st.booleans(), st.integers(1, 40), st.integers(1, 5))
def test_a_pipe_gives_the_lines_a_file_gives(
    parts: list[bytes], last_newline: bool, read: int, most: int
) -> None:
    data = b"\n".join(parts) + (b"\n" if last_newline and parts else b"")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(submit, "MAX_LINE", LIMIT)
        patch.setattr(submit, "READ", read)
        assert from_pipe(data, most) == from_file(data)


def test_a_byte_order_mark_before_the_first_line_is_dropped_there_only() -> None:
    data = b"\xef\xbb\xbf{}\n\xef\xbb\xbf{}\n"
    expected = [(1, b"{}\n"), (2, b"\xef\xbb\xbf{}\n")]
    assert from_file(data) == from_pipe(data, 5) == expected
    alone = b"\xef\xbb\xbf\n{}\n"  # a first line of nothing but the mark is blank
    assert from_file(alone) == from_pipe(alone, 5) == [(2, b"{}\n")]


@pytest.mark.timeout(20)  # a take that waits for a full batch would wait here for good
def test_lines_already_waiting_come_in_one_batch_up_to_its_size() -> None:
    reading, writing = os.pipe()
    os.write(writing, b"a\nb\n\nc\n")
    arrivals = submit.Arrivals(reading)
    assert arrivals.take(2) == [(1, b"a\n"), (2, b"b\n")]
    assert arrivals.take(10) == [(4, b"c\n")]  # line 3 is blank; nothing more waits
    os.write(writing, b"d")
    os.close(writing)
    assert arrivals.take(10) == [(5, b"d")]  # the last line needs no newline
    assert arrivals.take(10) == []
    os.close(reading)


@given(
    st.integers(1, 10**12),
    st.sampled_from(["appended", "duplicate", "rejected", "invalid"]),
    st.none() | st.integers(1, 10**12),
    st.none() | st.text(),
)
@example(3, "invalid", None, "node n\u2028x\u2029y\x85z is not registered")
def test_a_result_line_is_the_json_of_its_receipt(
    number: int, status: str, position: int | None, error: str | None
) -> None:
    receipt = Receipt(status, position, error)
    line = submit._result_line(number, receipt)
    assert line == json_text({"line": number} | receipt.as_dict()) + "\n"
    assert json.loads(line) == {"line": number, "status": status, "position": position,
                                "error": error}
    assert line.count("\n") == 1 and len(line.splitlines()) == 1  # one line for any reader
