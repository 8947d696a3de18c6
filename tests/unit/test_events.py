"""Validation of one event: a dict (the Python API, flags) is read exactly as
the same JSON line would be, and a line that is not JSON is placed by column."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.errors import InvalidEvent
from ledger.events import EVENT_TYPES, received
from ledger.model import timestamp

FIELDS = [
    "type", "id", "at", "source", "node", "slots", "parent", "reason", "passed", "alloc",
    "job", "slot", "addresses", "max_disconnect", "client_status", "blame",
    *EVENT_TYPES,  # unknown fields named like an event type
]
VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 2**40), st.sampled_from(list(EVENT_TYPES)),
    st.text(max_size=6), st.sampled_from(["n1", "a1", "10.0.0.5", "running", "node", "#", "\x00"]),
    st.lists(st.one_of(st.text(max_size=3), st.integers(0, 3)), max_size=3),
    st.lists(st.fixed_dictionaries({"slot": st.integers(-1, 3)},
                                   optional={"alloc": st.one_of(st.none(), st.text(max_size=2))}),
             max_size=2),
)
EVENTS = st.one_of(
    st.dictionaries(st.sampled_from(FIELDS), VALUES, max_size=6),
    st.builds(lambda kind, rest: {"type": kind} | rest, st.sampled_from(list(EVENT_TYPES)),
              st.dictionaries(st.sampled_from(FIELDS[1:]), VALUES, max_size=5)),
)


def outcome(data: Any) -> tuple[str, Any]:
    try:
        return "valid", received(data)
    except InvalidEvent as error:
        return "invalid", str(error)


@settings(max_examples=400, deadline=None)
@given(EVENTS)
def test_a_dict_is_read_exactly_as_the_same_json_line(event: dict[str, Any]) -> None:
    assert outcome(dict(event)) == outcome(orjson.dumps(event))


@pytest.mark.parametrize(("event", "error"), [
    ({"type": "node-registered", "node": "n1", "heartbeat": 1}, "unknown field 'heartbeat'"),
    ({"type": "heartbeat", "node": "n1", "alloc-placed": "x"}, "unknown field 'alloc-placed'"),
    ({"type": "heartbeat"}, "missing field 'node'"),
])
def test_an_unknown_or_missing_field_is_named_alike_as_a_dict_or_a_line(
    event: dict[str, Any], error: str
) -> None:
    assert outcome(event) == outcome(orjson.dumps(event)) == ("invalid", error)


@pytest.mark.parametrize(("line", "error"), [
    (b'{"type": "heartbeat", "node": "n1"}\x0c\n', "trailing characters at column 36"),
    ('{"type": "heartbeat", "node": "n1"}\u00a0\n', "trailing characters at column 36"),
    (b'{"type": "heartbeat"\x0c\n', "expected `,` or `}` at column 21"),
])
def test_whitespace_json_does_not_allow_is_placed_by_column(line: str | bytes, error: str) -> None:
    assert outcome(line) == ("invalid", f"not valid JSON: {error}")


OFFSETS = st.builds(
    lambda minutes: timezone(timedelta(minutes=minutes)), st.integers(-23 * 60 - 59, 23 * 60 + 59))
MOMENTS = st.datetimes(
    min_value=datetime(2, 1, 1), max_value=datetime(9998, 12, 31), timezones=OFFSETS)


@settings(max_examples=300, deadline=None)
@given(MOMENTS, MOMENTS)
def test_an_at_is_kept_in_one_fixed_width_utc_form_whose_text_order_is_time_order(a, b):
    kept_a, kept_b = timestamp(a), timestamp(b)

    assert len(kept_a) == 27 and kept_a.endswith("Z")
    assert datetime.fromisoformat(kept_a) == a
    assert (kept_a < kept_b) == (a < b) and (kept_a == kept_b) == (a == b)


def test_an_at_as_validated_is_kept_in_utc_with_its_microseconds():
    event = received('{"type": "heartbeat", "node": "n1", "at": "2026-01-01T05:30:00.12+05:30"}')

    assert timestamp(event["at"]) == "2026-01-01T00:00:00.120000Z"


NOT_RFC3339 = "field 'at': must be an RFC 3339 time with a zone, e.g. 2026-01-01T12:00:00Z"


@pytest.mark.parametrize(("at", "error"), [
    ("20260302", NOT_RFC3339),  # pydantic alone reads digits as Unix seconds: 1970-08-23
    (1767225600, NOT_RFC3339),
    ("2026-01-01T00:00Z", NOT_RFC3339),  # no seconds
    ("2026-01-01T00:00:00+0100", NOT_RFC3339),  # an offset without its colon
    ("2026-01-01", NOT_RFC3339),
    ("2026-01-01T00:00:00", "field 'at': needs a time zone (Z or +hh:mm)"),
    ("2026-13-01T00:00:00Z", "field 'at': month must be in 1..12"),
])
def test_an_at_that_is_not_rfc_3339_is_invalid(at: Any, error: str) -> None:
    with pytest.raises(InvalidEvent) as raised:
        received({"type": "heartbeat", "node": "n1", "at": at})
    assert str(raised.value) == error


@pytest.mark.parametrize("at", [
    "2026-01-01T01:00:00+01:00", "2026-01-01t00:00:00z", "2026-01-01 00:00:00Z",
    "2026-01-01T00:00:00.000000999Z", "2026-01-01T00:00:00-00:00",
])
def test_every_rfc_3339_form_is_read_as_the_same_moment(at: str) -> None:
    event = received({"type": "heartbeat", "node": "n1", "at": at})
    assert timestamp(event["at"]) == "2026-01-01T00:00:00.000000Z"
