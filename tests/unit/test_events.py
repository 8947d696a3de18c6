"""Validation of one event: a dict (the Python API, flags) is read exactly as
the same JSON line would be, and a line that is not JSON is placed by column."""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import math
import re
from datetime import datetime, timedelta, timezone
from typing import Any

import jsonschema  # a test dependency: its absence is a broken install, not a skip
import orjson
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from ledger.errors import InvalidEvent
from ledger.events import EVENT_TYPES, TYPES_NAMED, json_schema, received, schemas_by_type
from ledger.model import OUT_OF_YEARS, kept_time, moment_of_form, timestamp

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


def nested(depth: int) -> list[Any]:
    """A list of lists ``depth`` deep."""
    inner: list[Any] = []
    for _ in range(depth - 1):
        inner = [inner]
    return inner


def outcome(data: Any) -> tuple[str, Any]:
    try:
        return "valid", received(data)
    except InvalidEvent as error:
        return "invalid", str(error)


@settings(max_examples=400, deadline=None)
@given(EVENTS)
def test_a_dict_is_read_exactly_as_the_same_json_line(event: dict[str, Any]) -> None:
    assert outcome(dict(event)) == outcome(orjson.dumps(event))


# Numbers orjson writes as null (NaN, the infinities) or not at all (past 64
# bits), in fields where null is a value (an optional left out, a free slot).
NUMBERS = st.one_of(st.floats(), st.integers(2**63 - 2, 2**70), st.integers(-1, 1025))
NUMBERED = st.one_of(
    st.fixed_dictionaries(
        {"type": st.just("node-registered"), "node": st.just("n1")},
        optional={"slots": NUMBERS, "parent": NUMBERS, "source": NUMBERS}),
    st.fixed_dictionaries(
        {"type": st.just("alloc-placed"), "alloc": st.just("a1"), "node": st.just("n1")},
        optional={"slot": NUMBERS, "max_disconnect": NUMBERS, "job": NUMBERS,
                  "addresses": st.lists(NUMBERS, max_size=2)}),
    st.fixed_dictionaries(
        {"type": st.just("heartbeat"), "node": st.just("n1")},
        optional={"slots": st.lists(st.fixed_dictionaries(
            {"slot": NUMBERS}, optional={"alloc": NUMBERS}), max_size=2)}),
)


@settings(max_examples=300, deadline=None)
@given(NUMBERED)
@example({"type": "node-registered", "node": "n1", "slots": math.nan})
@example({"type": "heartbeat", "node": "n1", "slots": [{"slot": 0, "alloc": math.nan}]})
@example({"type": "heartbeat", "node": "n1", "slots": [{"slot": math.inf}]})
def test_a_dict_with_any_number_is_read_as_the_json_line_that_writes_it(event: dict) -> None:
    """The standard library writes NaN, Infinity and every digit, and a line
    may hold them: a dict's NaN must not become the null orjson writes."""
    assert outcome(dict(event)) == outcome(json.dumps(event))


@pytest.mark.parametrize(("event", "error"), [
    ({"type": "node-registered", "node": "q3", "slots": math.nan},
     "field 'slots': Input should be a valid integer"),
    ({"type": "alloc-placed", "alloc": "a1", "node": "n1", "slot": math.inf},
     "field 'slot': Input should be a valid integer"),
    ({"type": "alloc-placed", "alloc": "a1", "node": "n1", "max_disconnect": -math.inf},
     "field 'max_disconnect': Input should be a valid integer"),
    ({"type": "heartbeat", "node": "n1", "slots": [{"slot": 0, "alloc": math.nan}]},
     "field 'slots.0.alloc': Input should be a valid string"),
    ({"type": "node-registered", "node": "q3", "slots": 2**70},
     "field 'slots': Input should be less than or equal to 1024"),
    ({"type": "node-registered", "node": "q3", "slots": 10**5000},
     "field 'slots': number out of range"),
    ({"type": "heartbeat", "node": "n1", "slots": nested(300)},
     "field 'slots': recursion limit exceeded"),
    ({"type": "alloc-placed", "alloc": "a1", "node": "n1", "addresses": {"10.0.0.5"}},
     "field 'addresses': Type is not JSON serializable: set"),
    ({"type": "heartbeat", "node": "\ud800"},
     "field 'node': str is not valid UTF-8: surrogates not allowed"),
])
def test_a_dict_json_cannot_hold_is_invalid_naming_the_field(event: dict, error: str) -> None:
    assert outcome(event) == ("invalid", error)


@pytest.mark.parametrize(("event", "name", "field"), [
    ({"alloc": "n1#0"}, "n1#0", "alloc"),
    ({"alloc": "web#1023"}, "web#1023", "alloc"),
    ({"addresses": ["10.0.0.5", "pool#12"]}, "pool#12", "addresses.1"),
])
def test_a_new_allocation_or_address_that_reads_as_a_slot_is_invalid(
    event: dict, name: str, field: str
) -> None:
    node, index = name.split("#")
    error = (f"field '{field}': must not read as a slot (node#index): "
             f"history {name} names slot {index} of node {node}")
    assert outcome(PLACED | event) == ("invalid", error)


@pytest.mark.parametrize(
    "name", ["web#blue", "#1", "a#1#2", "a#1b", "svc#", "port#8080", "a#1024", "a#01", "a#-1"])
def test_a_new_allocation_or_address_may_hold_a_hash_elsewhere(name: str) -> None:
    assert outcome(PLACED | {"alloc": name, "addresses": [name]})[0] == "valid"


@pytest.mark.parametrize("kind", [None, 5, True, 1.5, ["heartbeat"], {}])
def test_a_type_that_is_not_text_is_named_as_the_field_type(kind: Any) -> None:
    error = f"field 'type': must be a string (the types: {TYPES_NAMED})"

    assert outcome({"type": kind, "node": "n1"}) == ("invalid", error)
    assert outcome(json.dumps({"type": kind, "node": "n1"})) == ("invalid", error)
    assert outcome({"type": "5"}) == ("invalid", f"unknown type '5' (the types: {TYPES_NAMED})")


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


@pytest.mark.parametrize(("line", "error"), [
    ('{"type": "heartbeat", "node": "caf\u00e9"}\n'.encode("latin-1"),
     ("the line is not UTF-8 (byte 0xe9 at column 35, Latin-1 or another encoding?); "
      "write events as UTF-8")),
    ('{"type": "heartbeat", "node": "n1"}\n'.encode("utf-16"),
     "the line is not UTF-8 (it looks like UTF-16); write events as UTF-8"),
    # a UTF-16 file's second line, split at the newline's byte: it decodes as UTF-8
    (b"\x00" + '{"type": "heartbeat", "node": "n1"}'.encode("utf-16-le") + b"\n",
     "the line is not UTF-8 (it looks like UTF-16); write events as UTF-8"),
    ('{"type": "heartbeat", "node": "n1"}\n'.encode("utf-16-be"),
     "the line is not UTF-8 (it looks like UTF-16); write events as UTF-8"),
    (b"", "EOF while parsing a value at column 0"),  # nothing at all: no NUL beside anything
])
def test_a_line_in_another_encoding_is_named_as_not_utf8(line: bytes, error: str) -> None:
    assert outcome(line) == ("invalid", f"not valid JSON: {error}")


def test_events_ended_by_a_carriage_return_alone_are_told_so() -> None:
    """Classic Mac OS line ends: the whole stream reads as one line."""
    line = b'{"type": "heartbeat", "node": "n1"}\r{"type": "heartbeat", "node": "n1"}\r\n'
    assert outcome(line) == ("invalid", (
        "not valid JSON: trailing characters at column 37; events are ended by a carriage "
        "return alone: end each with a newline (LF)"))
    assert outcome(b'{"type": "heartbeat", "node": "n1"} x\n') == (
        "invalid", "not valid JSON: trailing characters at column 37")


@pytest.mark.parametrize(("line", "problem"), [
    (rb'{"type": "heartbeat", "node": "\ud800"}', "unexpected end of hex escape at column 38"),
    (rb'{"type": "heartbeat", "node": "\ud800\u0041"}',
     "lone leading surrogate in hex escape at column 43"),
    (rb'{"type": "heartbeat", "node": "\udc00x"}', "lone leading surrogate in hex escape at column 37"),
])
def test_half_a_character_escaped_is_told_so(line: bytes, problem: str) -> None:
    assert outcome(line) == ("invalid", (
        f"not valid JSON: {problem}; escapes from \\ud800 to \\udfff are halves of a "
        "character, in pairs: one from \\ud800 to \\udbff, then one from \\udc00 to \\udfff"))


@pytest.mark.parametrize(("event", "field"), [
    ({"type": "node-registered", "node": "n1 "}, "node"),
    ({"type": "node-registered", "node": "\u2003n1"}, "node"),  # an em space
    ({"type": "node-registered", "node": "n1\u205f"}, "node"),  # a medium mathematical space
    ({"type": "node-registered", "node": "\u3000n1"}, "node"),  # an ideographic space
    *[({"type": "node-registered", "node": name}, "node")  # invisible, drawn blank: \s to none
      for c in "\u034f\u115f\u1160\u2800\u3164\ufe0f\uffa0" for name in (f"{c}n1", f"n1{c}")],
    ({"type": "alloc-placed", "alloc": "a1\u180b", "node": "n1"}, "alloc"),
    ({"type": "alloc-placed", "alloc": " a1", "node": "n1"}, "alloc"),
    ({"type": "alloc-placed", "alloc": "a#1 ", "node": "n1"}, "alloc"),
    ({"type": "alloc-placed", "alloc": "a1", "node": "n1", "job": "web\u00a0"}, "job"),
    ({"type": "alloc-placed", "alloc": "a1", "node": "n1", "addresses": ["10.0.0.5\u3000"]},
     "addresses.0"),
    ({"type": "heartbeat", "node": "n1", "id": "k1 "}, "id"),
])
def test_a_new_name_that_starts_or_ends_with_white_space_is_invalid(
    event: dict, field: str
) -> None:
    """"n1 " would be another node than "n1", and no message could show it;
    the JSON Schema says the same, whatever a validator takes for white space."""
    assert outcome(event) == (
        "invalid", f"field '{field}': must not start or end with white space or an invisible character")
    assert not schema_validator().is_valid(event)


@pytest.mark.parametrize(("event", "field", "char"), [
    ({"type": "node-registered", "node": "\u202eq"}, "node", "U+202E (RIGHT-TO-LEFT OVERRIDE)"),
    ({"type": "node-registered", "node": "n\u2066x\u2069"}, "node",
     "U+2066 (LEFT-TO-RIGHT ISOLATE)"),
    ({"type": "node-registered", "node": "n\u200b1"}, "node", "U+200B (ZERO WIDTH SPACE)"),
    ({"type": "node-registered", "node": "\ufeffn1"}, "node", "U+FEFF (ZERO WIDTH NO-BREAK SPACE)"),
    ({"type": "node-registered", "node": "n1\u2060"}, "node", "U+2060 (WORD JOINER)"),
    ({"type": "alloc-placed", "alloc": "a\u00ad1", "node": "n1"}, "alloc", "U+00AD (SOFT HYPHEN)"),
    ({"type": "alloc-placed", "alloc": "a1", "node": "n1", "job": "w\u200eb"}, "job",
     "U+200E (LEFT-TO-RIGHT MARK)"),
    ({"type": "alloc-placed", "alloc": "a1", "node": "n1", "addresses": ["10.0.\u202e5.0"]},
     "addresses.0", "U+202E (RIGHT-TO-LEFT OVERRIDE)"),
    ({"type": "heartbeat", "node": "n1", "id": "k\u061c1"}, "id", "U+061C (ARABIC LETTER MARK)"),
])
def test_a_new_name_with_a_character_that_does_not_show_anywhere_is_invalid(
    event: dict, field: str, char: str
) -> None:
    """n\u200b1 would show as n1, \u202eq as q turned around ("Trojan Source")."""
    assert outcome(event) == (
        "invalid", f"field '{field}': must not contain {char}, which does not show as itself")
    assert not schema_validator().is_valid(event)


CONTROL, LINE_BREAK = "a control character", "a line break"


@pytest.mark.parametrize(("event", "field", "code", "what"), [
    ({"type": "node-registered", "node": "\tn1"}, "node", "0009", CONTROL),
    ({"type": "node-registered", "node": "n1\nn2"}, "node", "000A", CONTROL),
    ({"type": "node-registered", "node": "n1\x1c"}, "node", "001C", CONTROL),
    ({"type": "node-registered", "node": "n\x011"}, "node", "0001", CONTROL),
    ({"type": "alloc-placed", "alloc": "a\x7f1", "node": "n1"}, "alloc", "007F", CONTROL),
    ({"type": "alloc-placed", "alloc": "a1", "node": "n1", "job": "web\tblue"}, "job", "0009",
     CONTROL),
    ({"type": "alloc-placed", "alloc": "a1", "node": "n1", "addresses": ["10.0.0.5\u0085"]},
     "addresses.0", "0085", CONTROL),
    ({"type": "alloc-placed", "alloc": "a1", "node": "n1", "job": "w\x9f"}, "job", "009F", CONTROL),
    ({"type": "heartbeat", "node": "n1", "id": "k\r1"}, "id", "000D", CONTROL),
    ({"type": "node-registered", "node": "n1\u2028n2"}, "node", "2028", LINE_BREAK),
    ({"type": "alloc-placed", "alloc": "a1\u2029", "node": "n1"}, "alloc", "2029", LINE_BREAK),
])
def test_a_new_name_with_a_control_character_or_line_break_anywhere_is_invalid(
    event: dict, field: str, code: str, what: str
) -> None:
    """A tab or a line break inside a name would split it over two lines of
    a table or a CSV file; DEL and U+0080 to U+009F show as nothing."""
    assert outcome(event) == ("invalid", f"field '{field}': must not contain U+{code} ({what})")
    assert not schema_validator().is_valid(event)


def test_a_joiner_inside_a_new_name_is_taken() -> None:
    """U+200C and U+200D join letters in Persian or Devanagari words."""
    event = {"type": "node-registered", "node": "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645"}
    assert outcome(event)[0] == "valid"
    assert schema_validator().is_valid(event)


def test_a_node_name_with_a_hash_and_white_space_is_named_for_the_hash() -> None:
    assert outcome({"type": "node-registered", "node": "n#1 "}) == (
        "invalid", "field 'node': must not contain '#' (it separates node and slot)")


@pytest.mark.parametrize("event", [
    {"type": "heartbeat", "node": "n1 "},
    {"type": "node-registered", "node": "n2", "parent": " n1"},
    {"type": "alloc-updated", "alloc": "a1 ", "client_status": "running"},
    {"type": "heartbeat", "node": "n1", "slots": [{"slot": 0, "alloc": "a1\r"}]},
])
def test_a_name_of_what_is_already_there_is_taken_as_written(event: dict) -> None:
    """What an earlier release let in can still be updated, stopped, removed."""
    assert outcome(event)[0] == "valid"


@pytest.mark.parametrize("name", ["a b", "x", "n-1.2_3", "caf\u00e9"])
def test_white_space_inside_a_name_is_kept(name: str) -> None:
    assert received({"type": "heartbeat", "node": name})["node"] == name


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


FIELDS_OF_A_TIME = st.tuples(
    st.integers(0, 9999), st.integers(0, 13), st.integers(0, 32), st.integers(0, 25),
    st.integers(0, 61), st.integers(0, 61), st.text("0123456789", max_size=9))


@settings(max_examples=500, deadline=None)
@given(FIELDS_OF_A_TIME)
@example((2024, 2, 29, 23, 59, 59, "9999999"))  # digits past the sixth are dropped, not rounded
@example((2023, 2, 29, 0, 0, 0, ""))  # not a leap year
@example((2026, 4, 31, 0, 0, 0, "5"))
@example((9999, 12, 31, 23, 59, 59, "999999"))
def test_a_utc_time_is_kept_as_reading_and_writing_it_would_keep_it(fields):
    """``kept_time`` pads a ``T``/``Z`` time as text: the same text as
    reading it into a datetime and writing that, and the same refusal of a
    field out of range."""
    year, month, day, hour, minute, second, fraction = fields
    text = f"{year:04d}-{month:02d}-{day:02d}T{hour:02d}:{minute:02d}:{second:02d}"
    text += f".{fraction}Z" if fraction else "Z"
    try:
        expected = timestamp(moment_of_form(text))
    except ValueError as error:
        with pytest.raises(ValueError, match=re.escape(str(error))):
            kept_time(text)
    else:
        assert kept_time(text) == expected


def test_an_at_as_validated_is_kept_in_utc_with_its_microseconds():
    event = received('{"type": "heartbeat", "node": "n1", "at": "2026-01-01T05:30:00.12+05:30"}')

    assert event["at"] == "2026-01-01T00:00:00.120000Z"


NOT_RFC3339 = "field 'at': must be an RFC 3339 time with a zone, e.g. 2026-01-01T12:00:00Z"


@pytest.mark.parametrize(("at", "error"), [
    ("20260302", NOT_RFC3339),  # pydantic alone reads digits as Unix seconds: 1970-08-23
    (1767225600, NOT_RFC3339),
    ("2026-01-01T00:00Z", NOT_RFC3339),  # no seconds
    ("2026-01-01T00:00:00+0100", NOT_RFC3339),  # an offset without its colon
    ("2026-01-01", NOT_RFC3339),
    ("2026-01-01T00:00:00", "field 'at': needs a time zone (Z or +hh:mm)"),
    ("2026-13-01T00:00:00Z", "field 'at': month must be in 1..12"),
    ("2026-12-31T23:59:60Z", ("field 'at': second must be in 0..59 (the ledger's times have "
                              "no leap second :60; write :59.999999)")),
    ("2026-12-31T23:59:61+01:00", "field 'at': second must be in 0..59"),
    ("2026-01-01T00:00:00+05:60", NOT_RFC3339),  # fromisoformat reads it as +06:00
    ("2026-01-01T00:00:00+24:00", NOT_RFC3339),
    ("2026-01-01T00:00:00-99:00", NOT_RFC3339),
    ("\uff12\uff10\uff12\uff16-01-01T00:00:00Z", NOT_RFC3339),  # FULLWIDTH DIGITs
    ("2026-01-01T00:00:00.\u0661Z", NOT_RFC3339),  # ARABIC-INDIC DIGIT ONE
    ("2026-01-01T00:00:00Z\n", NOT_RFC3339),
])
def test_an_at_that_is_not_rfc_3339_is_invalid(at: Any, error: str) -> None:
    with pytest.raises(InvalidEvent) as raised:
        received({"type": "heartbeat", "node": "n1", "at": at})
    assert str(raised.value) == error


@pytest.mark.parametrize("at", [
    "2026-01-01T01:00:00+01:00", "2026-01-01t00:00:00z", "2026-01-01 00:00:00Z",
    "2026-01-01T00:00:00.000000999Z", "2026-01-01T00:00:00-00:00",
    "2026-01-01T23:59:00+23:59", "2025-12-31T00:01:00-23:59",
])
def test_every_rfc_3339_form_is_read_as_the_same_moment(at: str) -> None:
    event = received({"type": "heartbeat", "node": "n1", "at": at})
    assert event["at"] == "2026-01-01T00:00:00.000000Z"


# -- the JSON Schema says what submit accepts ------------------------------------------

def two_digits(low: int, high: int) -> st.SearchStrategy[str]:
    return st.integers(low, high).map("{:02d}".format)


AT_TEXTS = st.builds(
    "{}-{}-{}{}{}:{}:{}{}{}".format,
    st.one_of(st.sampled_from(["0000", "0001", "0004", "0100", "0400", "1900", "2000", "2024",
                               "2025", "9999"]), st.integers(0, 9999).map("{:04d}".format)),
    two_digits(0, 13), two_digits(0, 32), st.sampled_from("Tt "),
    two_digits(0, 24), two_digits(0, 60), two_digits(0, 61),
    st.sampled_from(["", ".5", ".123456789"]),
    st.one_of(st.sampled_from(["Z", "z"]), st.builds(
        "{}{}:{}".format, st.sampled_from("+-"), two_digits(0, 25), two_digits(0, 61))),
)


def schema_of(event_type: str) -> dict[str, Any]:
    return schemas_by_type(json_schema())[event_type]


@settings(max_examples=1000, deadline=None)
@given(AT_TEXTS)
@example("2024-02-29T00:00:00Z")
@example("2000-02-29T00:00:00Z")
@example("0400-02-29T00:00:00Z")
@example("0004-02-29T00:00:00Z")
@example("0000-02-29T00:00:00Z")
@example("1900-02-29T00:00:00Z")
@example("2025-02-29T00:00:00Z")
@example("2026-04-31T00:00:00Z")
@example("2026-12-31T23:59:59.5-23:59")
@example("0001-01-01T00:00:00+00:01")  # before the year 1 in UTC
@example("9999-12-31T23:59:59-00:01")  # past 9999 in UTC
def test_the_schema_pattern_of_at_takes_exactly_the_times_submit_reads(at: str) -> None:
    """Days of the month and leap years included. (An offset may still move a
    time the pattern takes past the year 9999 in UTC, which submit refuses.)"""
    pattern = schema_of("heartbeat")["properties"]["at"]["anyOf"][0]["pattern"]
    event = {"type": "heartbeat", "node": "n1", "at": at}
    found = outcome(event)

    if found == ("invalid", f"field 'at': the time is {OUT_OF_YEARS}"):  # that exception
        assert re.fullmatch(pattern, at)
        assert at.startswith(("0001-01-01", "9999-12-31")) and at[-6] in "+-"
    else:
        assert bool(re.fullmatch(pattern, at)) == (found[0] == "valid"), found


def test_the_schema_names_its_draft_and_that_addresses_are_unique() -> None:
    schema = json_schema()

    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    addresses = schema_of("alloc-placed")["properties"]["addresses"]["anyOf"][0]
    assert (addresses["type"], addresses["uniqueItems"], addresses["maxItems"]) == (
        "array", True, 1024)
    assert "format" not in schema_of("heartbeat")["properties"]["at"]["anyOf"][0]


PLACED = {"type": "alloc-placed", "alloc": "a1", "node": "n1"}


@pytest.mark.parametrize("event", [
    {"type": "heartbeat", "node": "n1", "at": "2026-01-01 00:00:00Z"},
    {"type": "heartbeat", "node": "n1", "at": "2026-01-01t00:00:00z"},
    {"type": "heartbeat", "node": "n1", "at": "2024-02-29T00:00:00+23:59"},
    {"type": "heartbeat", "node": "n1", "at": "2025-02-29T00:00:00Z"},
    {"type": "heartbeat", "node": "n1", "at": "2026-01-01T00:00:00+24:00"},
    {"type": "heartbeat", "node": "n1", "at": "2026-01-01T00:00:00+05:60"},
    PLACED | {"addresses": ["10.0.0.5", "10.0.0.6"]},
    PLACED | {"addresses": ["10.0.0.5", "10.0.0.5"]},
    PLACED | {"slot": 1023},
    PLACED | {"slot": 1024},
    PLACED | {"slot": -1},
    PLACED | {"slot": 2**31},
    PLACED | {"slot": -(2**31) - 1},
    PLACED | {"alloc": "n1#0"},
    PLACED | {"alloc": "n1#x"},
    PLACED | {"addresses": ["pool#3"]},
    {"type": "heartbeat", "node": "n1", "slots": [{"slot": -5, "alloc": None}]},
    {"type": 5, "node": "n1"},
    {"type": "heartbeat", "node": "n#1"},
])
def test_a_standard_validator_with_format_checking_agrees_with_submit(event: dict) -> None:
    assert schema_validator().is_valid(event) == (outcome(event)[0] == "valid"), outcome(event)


def schema_validator() -> Any:
    """A standard validator of the published schema, its draft's format checks on."""
    schema = json_schema()
    validator = jsonschema.validators.validator_for(schema)
    assert validator is jsonschema.Draft202012Validator
    return validator(schema, format_checker=validator.FORMAT_CHECKER)


def test_the_schema_takes_1_0_for_an_integer_where_submit_refuses_it() -> None:
    """JSON Schema counts 1.0 an integer; submit is strict and says so in
    the schema's description."""
    event = {"type": "node-registered", "node": "n1", "slots": 1.0}

    assert jsonschema.Draft202012Validator(json_schema()).is_valid(event)
    assert outcome(event) == ("invalid", "field 'slots': Input should be a valid integer")
    assert "refuses 1.0" in json_schema()["description"]


# -- the limits of the vocabulary, at each edge ---------------------------------------

@pytest.mark.parametrize(("event", "error"), [
    ({"type": "heartbeat", "node": "n1", "id": "i" * 128}, None),
    ({"type": "heartbeat", "node": "n1", "id": "i" * 129},
     "field 'id': String should have at most 128 characters"),
    ({"type": "heartbeat", "node": "n1", "id": ""},
     "field 'id': String should have at least 1 character"),
    ({"type": "alloc-updated", "alloc": "a" * 128, "client_status": "running"}, None),
    ({"type": "alloc-updated", "alloc": "a" * 129, "client_status": "running"},
     "field 'alloc': String should have at most 128 characters"),
    ({"type": "alloc-updated", "alloc": "", "client_status": "running"},
     "field 'alloc': String should have at least 1 character"),
    (PLACED | {"addresses": ["x" * 256]}, None),
    (PLACED | {"addresses": ["x" * 257]},
     "field 'addresses.0': String should have at most 256 characters"),
    (PLACED | {"addresses": [f"10.0.{i // 256}.{i % 256}" for i in range(1024)]}, None),
    (PLACED | {"addresses": [f"10.0.{i // 256}.{i % 256}" for i in range(1025)]},  # helper-305
     "field 'addresses': Value should have at most 1024 items after validation, not 1025"),
    ({"type": "heartbeat", "node": "n1", "source": "s" * 1024}, None),
    ({"type": "heartbeat", "node": "n1", "source": "s" * 1025},
     "field 'source': String should have at most 1024 characters"),
    ({"type": "node-suspected", "node": "n1", "reason": ""},
     "field 'reason': String should have at least 1 character"),
    ({"type": "node-registered", "node": "n1", "slots": 0}, None),
    ({"type": "node-registered", "node": "n1", "slots": -1},
     "field 'slots': Input should be greater than or equal to 0"),
    (PLACED | {"slot": 2**31 - 1}, None),  # out of the node's range: a rule rejects it
    (PLACED | {"slot": -(2**31)}, None),
    (PLACED | {"max_disconnect": 0}, None),
    (PLACED | {"max_disconnect": 2**31 - 1}, None),
    (PLACED | {"max_disconnect": -1},
     "field 'max_disconnect': Input should be greater than or equal to 0"),
    (PLACED | {"max_disconnect": 2**31},
     "field 'max_disconnect': Input should be less than or equal to 2147483647"),
    ({"type": "heartbeat", "node": "n#1"},  # a node named, not registered: '#' all the same
     "field 'node': must not contain '#' (it separates node and slot)"),
])
def test_each_limit_takes_its_edge_and_refuses_past_it(event: dict, error: str | None) -> None:
    found = outcome(event)
    if error is None:
        assert found[0] == "valid", found
    else:
        assert found == ("invalid", error)
    assert schema_validator().is_valid(event) == (error is None)


def test_an_optional_field_given_as_null_is_left_out_or_takes_its_default() -> None:
    assert received({"type": "node-registered", "node": "n1", "slots": None, "parent": None}) == {
        "type": "node-registered", "node": "n1", "slots": 0}
    assert received('{"type": "alloc-updated", "alloc": "a1", "client_status": "failed", '
                    '"blame": null, "id": null, "at": null, "source": null}') == {
        "type": "alloc-updated", "alloc": "a1", "client_status": "failed", "blame": "node"}
    assert received(PLACED | {"job": None, "slot": None, "addresses": None,
                              "max_disconnect": None}) == PLACED


@pytest.mark.parametrize("line", ["null", '"heartbeat"', "42"])
def test_json_that_is_no_object_is_not_an_event(line: str) -> None:
    assert outcome(line) == ("invalid", "an event must be a JSON object")


ARRAY = ("(a JSON array? submit reads JSON Lines, one event object per line: "
         "jq -c '.[]' FILE | alloc-ledger submit -)")
SPREAD = ("(an event spread over several lines? submit reads JSON Lines, one event object "
          "per line: jq -c . FILE | alloc-ledger submit -)")


@pytest.mark.parametrize("line", ["[1]", "[]", '[{"type": "heartbeat", "node": "n1"}]'])
def test_a_json_array_is_told_how_to_submit_its_events(line: str) -> None:
    assert outcome(line) == ("invalid", f"an event must be a JSON object {ARRAY}")


@pytest.mark.parametrize(("line", "error"), [
    ("[\n", f"EOF while parsing a list at column 1 {ARRAY}"),
    ('  [{"type": "heartbeat",\n', f"EOF while parsing a value at column 24 {ARRAY}"),
    ("{\n", f"EOF while parsing an object at column 1 {SPREAD}"),
    ('    "type": "heartbeat",\n', f"trailing characters at column 11 {SPREAD}"),
    ('  "slots": [\n', f"trailing characters at column 10 {SPREAD}"),
    ("  },\n", f"expected value at column 3 {SPREAD}"),
    ("}\n", f"expected value at column 1 {SPREAD}"),
    ("]\n", f"expected value at column 1 {ARRAY}"),
    # an event cut short on its one line (at a comma, too), or not JSON at all: no such guess
    ('{"type": "heartbeat", "node": "n1"\n', "EOF while parsing an object at column 34"),
    ('{"type": "heartbeat",\n', "EOF while parsing a value at column 21"),
    ("not json\n", "expected ident at column 2"),
])
def test_lines_of_pretty_printed_json_are_told_that_an_event_takes_one_line(
    line: str, error: str
) -> None:
    assert outcome(line) == ("invalid", f"not valid JSON: {error}")


@pytest.mark.parametrize("line", [
    '{"type": "heartbeat", "node": "n1"},\n',  # JSON Lines written with commas
    '  {"type": "heartbeat", "node": "n1"},\n',  # an array, one element per line
])
def test_a_whole_event_followed_by_a_comma_is_not_told_it_is_spread_over_lines(
    line: str,
) -> None:
    """The event is whole on its line; what is wrong is the comma after it.
    Told "an event spread over several lines? jq -c . FILE | …", a user
    runs jq, which stops at the first comma ("Expected value before ','",
    exit 4) after printing the first event: piped into submit, that event
    alone is submitted."""
    status, error = outcome(line)
    assert status == "invalid"
    assert SPREAD not in error
    assert error.endswith(
        " (a comma after the event? JSON Lines holds one event object per line and nothing "
        "after it; for a JSON array: jq -c '.[]' FILE | alloc-ledger submit -)")


@pytest.mark.parametrize(("compress", "told"), [
    (gzip.compress, "gzip-compressed, not text: zcat FILE"),
    (bz2.compress, "bzip2-compressed, not text: bzcat FILE"),
    (lzma.compress, "xz-compressed, not text: xzcat FILE"),
])
def test_a_compressed_stream_is_named_with_how_to_read_it(compress: Any, told: str) -> None:
    line = compress(b'{"type": "heartbeat", "node": "n1"}\n').split(b"\n")[0] + b"\n"
    assert outcome(line) == (
        "invalid", f"not valid JSON: the input is {told} | alloc-ledger submit -")


@pytest.mark.parametrize("line", [
    b"\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x03\x00>\x00\x01\x00\x00\x00\n",
    b"\x00\x00\x00\x00\xde\xad\xbe\xef\x00\x00\n",
    b"\x00\x00\x00\x01\x00\x00\n",  # valid UTF-8, but NULs not at every other place
])
def test_a_binary_file_is_named_as_not_text_not_as_utf16(line: bytes) -> None:
    assert outcome(line) == ("invalid", (
        "not valid JSON: the line holds NUL bytes: the input is not text (a binary file?); "
        "write events as UTF-8"))


def test_every_wrong_field_is_named_up_to_three() -> None:
    event = PLACED | {"slot": "0", "max_disconnect": "60", "job": 3, "addresses": "10.0.0.5"}
    assert outcome(event) == ("invalid", (  # the fourth, max_disconnect, goes unsaid
        "field 'job': Input should be a valid string; "
        "field 'slot': Input should be a valid integer; "
        "field 'addresses': Input should be a valid array"))


def test_a_long_wrong_value_is_shown_cut_short() -> None:
    event = {"type": "health-checked", "node": "n1", "passed": "x" * 60}
    assert outcome(event) == (
        "invalid", f"field 'passed': must be true or false (JSON), not \"{'x' * 36}...")
