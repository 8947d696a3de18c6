"""Events and times as a user types them: ``submit TYPE --field value`` reads
numbers and lists as JSON, as the same JSON line would hold them, and
``query --now``/``--as-of`` read a time as an event's ``at`` is read.

The CLI is run as a user runs it: ``CliRunner().invoke(cli, [...])``, the exit
code (with the output as the failure message), then the exact output."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cli_support import invoke

from ledger.errors import InvalidEvent
from ledger.events import from_flags, received

PLACED = {"alloc": "a1", "node": "n1"}
NOT_AN_INTEGER = "Input should be a valid integer"


def flag_outcome(event_type: str, flags: dict[str, str]) -> tuple[str, Any]:
    try:
        return "valid", from_flags(event_type, flags)
    except InvalidEvent as error:
        return "invalid", str(error)


@pytest.mark.parametrize(("event_type", "flags", "error"), [
    ("node-registered", {"node": "q3", "slots": "NaN"}, f"field 'slots': {NOT_AN_INTEGER}"),
    ("node-registered", {"node": "q3", "slots": "Infinity"}, f"field 'slots': {NOT_AN_INTEGER}"),
    ("node-registered", {"node": "q3", "slots": "1e400"}, f"field 'slots': {NOT_AN_INTEGER}"),
    ("alloc-placed", PLACED | {"slot": "Infinity"}, f"field 'slot': {NOT_AN_INTEGER}"),
    ("alloc-placed", PLACED | {"slot": "-Infinity"}, f"field 'slot': {NOT_AN_INTEGER}"),
    ("alloc-placed", PLACED | {"max_disconnect": "NaN"},
     f"field 'max_disconnect': {NOT_AN_INTEGER}"),
    ("heartbeat", {"node": "n1", "slots": '[{"slot": 0, "alloc": NaN}]'},
     "field 'slots.0.alloc': Input should be a valid string"),
    ("node-registered", {"node": "q3", "slots": "99999999999999999999999"},
     "field 'slots': Input should be less than or equal to 1024"),
])
def test_a_flag_json_reads_as_a_number_no_event_holds_is_invalid_as_in_a_line(
    event_type: str, flags: dict[str, str], error: str
) -> None:
    """NaN and the infinities were kept as a field left out (slots 0)."""
    assert flag_outcome(event_type, flags) == ("invalid", error)
    with pytest.raises(InvalidEvent) as raised:
        received(line_of(event_type, flags))
    assert str(raised.value) == error


def line_of(event_type: str, flags: dict[str, str]) -> str:
    """The JSON line of the same event: names quoted, the other values as typed."""
    fields = [f'"type": "{event_type}"'] + [
        f'"{name}": {json.dumps(value) if name in ("node", "alloc") else value}'
        for name, value in flags.items()
    ]
    return "{" + ", ".join(fields) + "}"


@pytest.mark.parametrize(("event_type", "flags", "error"), [
    ("node-registered", {"node": "q3", "slots": "9" * 5000}, "field 'slots': number out of range"),
    ("alloc-placed", PLACED | {"max_disconnect": "9" * 4301},
     "field 'max_disconnect': number out of range"),
    ("node-registered", {"node": "q3", "slots": "[" * 100_000},
     "field 'slots': recursion limit exceeded"),
    ("heartbeat", {"node": "n1", "slots": "[" * 100_000},
     "field 'slots': recursion limit exceeded"),
    ("alloc-placed", PLACED | {"addresses": "[" * 300 + "]" * 300},
     "field 'addresses': recursion limit exceeded"),  # JSON, deeper than a line may nest
])
def test_a_flag_too_long_or_deep_to_read_is_invalid_naming_the_field(
    event_type: str, flags: dict[str, str], error: str
) -> None:
    assert flag_outcome(event_type, flags) == ("invalid", error)


@pytest.fixture
def url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path}/ledger.db"
    invoke(["--store", url, "submit", "node-registered", "--node", "n1"])
    return url


@pytest.mark.parametrize(("flags", "error"), [
    (["--slots", "NaN"], f"field 'slots': {NOT_AN_INTEGER}"),
    (["--slots", "9" * 5000], "field 'slots': number out of range"),
    (["--slots", "[" * 100_000], "field 'slots': recursion limit exceeded"),
    (["--slots", "99999999999999999999999"],
     "field 'slots': Input should be less than or equal to 1024"),
])
def test_submit_refuses_such_a_flag_in_one_line_and_appends_nothing(
    url: str, flags: list[str], error: str
) -> None:
    result = invoke(["--store", url, "submit", "node-registered", "--node", "q3", *flags], code=1)

    found = {"line": 1, "status": "invalid", "position": None, "error": error}
    assert (result.stdout, result.stderr) == (json.dumps(found) + "\n", "")
    nodes = json.loads(invoke(["--store", url, "query", "nodes"]).stdout)
    assert [n["node"] for n in nodes] == ["n1"]


@pytest.mark.parametrize(("args", "error"), [
    (["needs-reconnect", "--now", "2026-01-01T00:00:00+05:60"],
     ("Invalid value for '--now': '2026-01-01T00:00:00+05:60' is not an RFC 3339 time "
      "(e.g. 2026-01-01T12:00:00Z)")),
    (["needs-reconnect", "--now", "2026-01-01T00:00:00+24:00"],
     ("Invalid value for '--now': '2026-01-01T00:00:00+24:00' is not an RFC 3339 time "
      "(e.g. 2026-01-01T12:00:00Z)")),
    (["nodes", "--as-of", "2026-01-01T00:00:00-99:00"],
     ("Invalid value for '--as-of': '2026-01-01T00:00:00-99:00' is neither a position nor "
      "an RFC 3339 timestamp (e.g. 2026-01-01T12:00:00Z)")),
    (["nodes", "--as-of", "\uff12\uff10\uff12\uff16-01-01T00:00:00Z"],  # FULLWIDTH DIGITs
     ("Invalid value for '--as-of': '\uff12\uff10\uff12\uff16-01-01T00:00:00Z' is neither a "
      "position nor an RFC 3339 timestamp (e.g. 2026-01-01T12:00:00Z)")),
    (["needs-reconnect", "--now", "2026-01-01T00:00:00Z\n"],
     ("Invalid value for '--now': '2026-01-01T00:00:00Z\\n' is not an RFC 3339 time "
      "(e.g. 2026-01-01T12:00:00Z)")),
])
def test_query_times_out_of_rfc_3339_get_its_usual_message(
    url: str, args: list[str], error: str
) -> None:
    result = invoke(["--store", url, "query", *args], code=2)

    assert result.stdout == ""
    assert result.stderr == f"Error: {error} (see 'alloc-ledger query {args[0]} --help')\n"


def test_submit_takes_the_widest_offsets_rfc_3339_allows(url: str) -> None:
    for at in ("2026-01-01T23:59:00+23:59", "2025-12-31T00:01:00-23:59"):
        invoke(["--store", url, "submit", "heartbeat", "--node", "n1", "--at", at])

    history = json.loads(invoke(["--store", url, "query", "history", "n1"]).stdout)
    assert [e["at"] for e in history[1:]] == ["2026-01-01T00:00:00.000000Z"] * 2
