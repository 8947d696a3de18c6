"""The event vocabulary (SPEC section 2), validated with pydantic v2.

Each event type is a ``TypedDict`` that pydantic validates strictly: unknown
fields, wrong types and unknown ``type`` values are invalid, and the error
names the field. A validated event *is* a dict, which is also how it is
kept and how the domain reads it, so nothing is converted twice. Tools can
build events with the same classes: ``Heartbeat(type="heartbeat", node="n1")``.
Optional fields may be left out or given as ``null``.
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from collections.abc import Iterable
from functools import cache
from typing import Annotated, Any, Literal, NotRequired, Union, get_origin, get_type_hints

import orjson
from pydantic import (
    AfterValidator,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    with_config,
)
from pydantic_core import from_json
from typing_extensions import TypedDict

from ledger.errors import InvalidEvent
from ledger.model import (
    MAX_ADDRESSES,
    MAX_SLOTS,
    OUT_OF_YEARS,
    RFC3339,
    RFC3339_IN_RANGE,
    Event,
    kept_time,
    rfc3339_problem,
)

MAX_SECONDS = 2**31 - 1  # a duration's most seconds: an INTEGER column in both stores
STRICT = ConfigDict(extra="forbid", strict=True)

# No text may hold a NUL character: PostgreSQL's text cannot, and one such
# event must be invalid on its own, not fail the transaction of its batch.
NO_NUL = r"^[^\x00]*$"
# A new name (a node registered, an allocation placed, its job and addresses,
# a client id) neither starts nor ends with white space: "n1 " would be
# another node than "n1", and no message could show the difference. One
# spelled-out class, read alike by pydantic's Rust regex, Python's re (the
# messages) and JSON Schema's ECMA-262 validators: their \s differ (U+001C
# to U+001F, U+0085, U+FEFF). Invisible characters count as white space
# here: zero-width and format characters (the soft hyphen, marks of
# direction, U+200B to U+200F, U+2060 to U+206F, the byte order mark), the
# combining grapheme joiner, variation selectors, and characters drawn
# blank (the Hangul fillers, the Braille blank). A name
# that names what is already there (a heartbeat's node, an update's
# allocation) is taken as written, so what an earlier release let in can
# still be updated, stopped and removed.
SPACE = (
    r"\t\n\x0b\x0c\r \x1c-\x1f\x85\xa0\xad\u034f\u061c\u115f\u1160\u1680\u17b4\u17b5"
    r"\u180b-\u180f\u2000-\u200f\u2028-\u202f\u205f-\u206f\u2800\u3000\u3164"
    r"\ufe00-\ufe0f\ufeff\uffa0\ufff9-\ufffb"
)
# Some are refused anywhere in a new name: control characters and the
# line and paragraph separators (a tab, a line break, U+0001, DEL, U+0080 to
# U+009F, U+2028, U+2029: one would split the name over two lines of a
# table or CSV, or show as nothing), marks of text direction (they make it show
# as another: "Trojan Source"), zero-width spaces, joiners of words and
# invisible operators, the soft hyphen, the byte order mark. Other invisible
# characters may be inside one: U+200C and U+200D join letters in Persian
# or Devanagari, variation selectors and fillers are parts of emoji and Hangul.
NOWHERE = (
    r"\x01-\x1f\x7f-\x9f\xad\u061c\u180e\u200b\u200e\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f"
    r"\ufeff\ufff9-\ufffb"
)
HIDDEN = re.compile(f"[{NOWHERE}]")


def _trimmed(also: str = "") -> str:
    """A name without white space at either end, nor NUL (nor ``also``) anywhere."""
    return rf"^[^{SPACE}{also}\x00](?:[^{also}\x00]*[^{SPACE}{also}\x00])?$"


TRIMMED = _trimmed(NOWHERE)
Name = Annotated[str, Field(min_length=1, max_length=128, pattern=NO_NUL)]
NewName = Annotated[str, Field(min_length=1, max_length=128, pattern=TRIMMED)]
# '#' separates node and slot (n1#0), so a node name may not contain it.
NodeName = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[^#\x00]+$")]
NEW_NODE = _trimmed("#" + NOWHERE)
NewNodeName = Annotated[str, Field(min_length=1, max_length=128, pattern=NEW_NODE)]
Address = Annotated[str, Field(min_length=1, max_length=256, pattern=TRIMMED)]
# A slot index is any integer a column holds: one out of the node's range
# (below 0 too) is a rule's to refuse (SPEC: rejected, kept in the
# rejection log), not the vocabulary's.
SLOT_BOUND = 2**31
SlotIndex = Annotated[int, Field(ge=-SLOT_BOUND, lt=SLOT_BOUND)]
Text = Annotated[str, Field(max_length=1024, pattern=NO_NUL)]


# An ``at`` must be written as RFC 3339 says (pydantic's datetime would read
# "20260302" as Unix seconds and take "2026-01-01T00:00Z" without seconds):
# its form is checked with the other patterns, then ``received`` reads it.
# The schema says it in one pattern, fields in range, and without
# "format": "date-time", which refuses the space RFC 3339 allows for T.
Instant = Annotated[str, Field(pattern=RFC3339, json_schema_extra={
    "pattern": RFC3339_IN_RANGE,
    "description": ("RFC 3339 time with a zone (Z or +hh:mm); T, t or a space before the time; "
                    "no leap second (:60); within the years 1 to 9999 in UTC, which the "
                    "pattern cannot say of an offset (0001-01-01T00:00:00+00:01 is refused)"),
})]


def _unique(values: list[str] | None) -> list[str] | None:
    seen: set[str] = set()
    for value in values or ():
        if value in seen:
            raise ValueError(f"address {value} is listed twice")
        seen.add(value)
    return values


# ``history n1#0`` names slot 0 of node n1: an allocation or address may
# hold '#', but not read as a slot (a name, '#', an index a node may have,
# written as the ledger writes it: 0 to 1023), or its history and the
# slot's would be one.
SLOT_LIKE = r"^[^#]+#(?:[0-9]|[1-9][0-9]|[1-9][0-9][0-9]|10[01][0-9]|102[0-3])$"
_slot_like = re.compile(SLOT_LIKE)


def _not_slot_like(value: str) -> str:
    if _slot_like.match(value):
        node, index = value.rsplit("#", 1)
        raise ValueError(
            f"must not read as a slot (node#index): history {value} names slot {index} of node {node}")
    return value


NotSlotLike = AfterValidator(_not_slot_like)
UNLIKE_A_SLOT = Field(json_schema_extra={"not": {"pattern": SLOT_LIKE}})
AllocName = Annotated[NewName, NotSlotLike, UNLIKE_A_SLOT]
Addresses = Annotated[
    list[Annotated[Address, NotSlotLike, UNLIKE_A_SLOT]],
    AfterValidator(_unique),
    Field(max_length=MAX_ADDRESSES, json_schema_extra={"uniqueItems": True}),
]


@with_config(STRICT)
class SlotReport(TypedDict):
    slot: SlotIndex
    alloc: Name | None


@with_config(STRICT)
class Envelope(TypedDict):
    """What every event may carry besides its own fields."""

    id: NotRequired[NewName | None]
    at: NotRequired[Instant | None]
    source: NotRequired[Text | None]


@with_config(STRICT)
class NodeRegistered(Envelope):
    """A new node, initializing, health ok, with slots 0..slots-1 (default 0). Rejected when the node exists, or its parent is missing, down or removed."""

    type: Literal["node-registered"]
    node: NewNodeName
    slots: NotRequired[Annotated[int, Field(ge=0, le=MAX_SLOTS)] | None]
    parent: NotRequired[NodeName | None]


@with_config(STRICT)
class Heartbeat(Envelope):
    """The node is alive: initializing or down becomes ready; disconnected becomes initializing while an allocation of it needs to reconnect, else ready. A slot report replaces the node's last one. Rejected for a node missing or removed."""

    type: Literal["heartbeat"]
    node: NodeName
    slots: NotRequired[list[SlotReport] | None]


@with_config(STRICT)
class HeartbeatMissed(Envelope):
    """A ready or initializing node becomes disconnected when an allocation on it may wait (max_disconnect, desired run, not terminal), else down."""

    type: Literal["heartbeat-missed"]
    node: NodeName


@with_config(STRICT)
class NodeDown(Envelope):
    """The node becomes down, and so does every node under it (its parent chain); every non-terminal allocation on them becomes lost, desired stop."""

    type: Literal["node-down"]
    node: NodeName
    reason: NotRequired[Text | None]


@with_config(STRICT)
class NodeRemoved(Envelope):
    """The node is removed, with the cascade of node-down; later events for it are rejected."""

    type: Literal["node-removed"]
    node: NodeName


@with_config(STRICT)
class NodeSuspected(Envelope):
    """The node's health becomes suspect: it takes no placements."""

    type: Literal["node-suspected"]
    node: NodeName
    reason: Annotated[str, Field(min_length=1, max_length=1024, pattern=NO_NUL)]


@with_config(STRICT)
class HealthChecked(Envelope):
    """Passed: health ok. Failed: as node-down with reason 'health check failed'."""

    type: Literal["health-checked"]
    node: NodeName
    passed: bool


@with_config(STRICT)
class AllocPlaced(Envelope):
    """Desired run, client pending; the slot becomes allocated, the addresses held. Rejected unless the node is ready and not suspect, the slot is in range and free, the addresses are free, and the allocation holds no other slot or node; the same placement again is reported duplicate."""

    type: Literal["alloc-placed"]
    alloc: AllocName
    node: NodeName
    job: NotRequired[NewName | None]
    slot: NotRequired[SlotIndex | None]
    addresses: NotRequired[Addresses | None]
    max_disconnect: NotRequired[Annotated[int, Field(ge=0, le=MAX_SECONDS)] | None]


@with_config(STRICT)
class AllocUpdated(Envelope):
    """The node reports its allocation (blame: node by default). Rejected while the node is disconnected, down or removed, or the allocation is terminal. An allocation that needs to reconnect is reconnected (an alloc state with the status); the first accepted update from an initializing node makes it ready. running makes the slot active; a terminal status frees slot and addresses; failed with blame node makes the node suspect."""

    type: Literal["alloc-updated"]
    alloc: Name
    client_status: Literal["pending", "running", "complete", "failed"]
    blame: NotRequired[Literal["node", "alloc"] | None]


@with_config(STRICT)
class AllocStopRequested(Envelope):
    """Desired becomes stop; rejected when it is already remove."""

    type: Literal["alloc-stop-requested"]
    alloc: Name


@with_config(STRICT)
class AllocRemoveRequested(Envelope):
    """Desired becomes remove; frees nothing by itself."""

    type: Literal["alloc-remove-requested"]
    alloc: Name


@with_config(STRICT)
class AllocRemoved(Envelope):
    """The allocation is reaped from the live tables; rejected unless it is terminal."""

    type: Literal["alloc-removed"]
    alloc: Name


EVENT_TYPES: dict[str, Any] = {
    get_type_hints(model)["type"].__args__[0]: model
    for model in (
        NodeRegistered,
        Heartbeat,
        HeartbeatMissed,
        NodeDown,
        NodeRemoved,
        NodeSuspected,
        HealthChecked,
        AllocPlaced,
        AllocUpdated,
        AllocStopRequested,
        AllocRemoveRequested,
        AllocRemoved,
    )
}
DEFAULTS: dict[str, dict[str, Any]] = {
    "node-registered": {"slots": 0},
    "alloc-updated": {"blame": "node"},
}


AnyEvent = Annotated[  # type: ignore[valid-type]
    Union[tuple(EVENT_TYPES.values())],  # noqa: UP007
    Field(discriminator="type"),
]


@cache
def _adapter(event_type: str | None) -> TypeAdapter[dict[str, Any]]:
    """The validator of one event type, or of any event (built on first use:
    the whole union costs a one-shot command more than its event's own)."""
    return TypeAdapter(EVENT_TYPES[event_type] if event_type else AnyEvent)  # type: ignore[arg-type]


def json_schema() -> dict[str, Any]:
    """The JSON Schema (2020-12) of one event (a discriminated union on
    ``type``). It accepts what submit accepts but for 1.0 where an integer is
    due (an integer to JSON Schema; submit, strict, refuses it) and an ``at``
    whose offset moves it past the year 9999, or before 1, in UTC."""
    schema: dict[str, Any] = {"$schema": "https://json-schema.org/draft/2020-12/schema"}
    schema |= _adapter(None).json_schema()
    # "discriminator" is OpenAPI's, not JSON Schema's: Ajv's strict mode
    # refuses to compile a schema holding it. The oneOf of type constants
    # picks the type all the same.
    schema.pop("discriminator", None)
    defs = schemas_by_type(schema)
    for event_type, defaults in DEFAULTS.items():
        for name, value in defaults.items():
            defs[event_type]["properties"][name]["default"] = value
    _no_final_line_feed(schema)
    schema["title"] = "alloc-ledger event"
    schema["description"] = (
        "One event of alloc-ledger. Integers are written without a fraction or exponent: "
        "submit refuses 1.0 where an integer is due. Text is Unicode: a \\ud800 to "
        "\\udfff escape only in pairs."
    )
    return schema


def schemas_by_type(schema: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each event type's schema in ``json_schema()``'s ``oneOf``, by the
    constant of its ``type``: how a validator picks it."""
    found: dict[str, dict[str, Any]] = {}
    for choice in schema["oneOf"]:
        model = schema["$defs"][choice["$ref"].rsplit("/", 1)[1]]
        found[model["properties"]["type"]["const"]] = model
    return found


# Patterns that take no line feed anywhere. ECMA-262's $ (and pydantic's) matches
# only at the end, Python's re (jsonschema, hypothesis-jsonschema) also before a
# final line feed: a pattern without anchors says it to both.
_LINE_FEED_FREE = {TRIMMED, NEW_NODE, RFC3339_IN_RANGE}


def _no_final_line_feed(node: Any) -> None:
    if isinstance(node, dict):
        if node.get("pattern") in _LINE_FEED_FREE:
            node.setdefault("allOf", []).append({"not": {"pattern": "\\n"}})
        for value in node.values():
            _no_final_line_feed(value)
    elif isinstance(node, list):
        for item in node:
            _no_final_line_feed(item)


def describe(error: ValidationError, tagged: bool = True) -> str:
    """One line naming the field(s) that are wrong; ``tagged``: the error is
    the union's, whose locations start with the event type."""
    parts = []
    for item in error.errors(include_url=False)[:3]:
        loc = [str(p) for p in item["loc"]]
        if tagged and loc and loc[0] in EVENT_TYPES:
            loc = loc[1:]
        field = ".".join(loc)
        kind = item["type"]
        if kind == "extra_forbidden":
            parts.append(f"unknown field '{field}'")
        elif kind == "missing":
            parts.append(f"missing field '{field}'")
        elif kind == "union_tag_invalid":
            tag = item.get("input", {}).get("type") if isinstance(item.get("input"), dict) else None
            if isinstance(tag, str):
                parts.append(f"unknown type '{tag}' (the types: {TYPES_NAMED})")
            else:
                parts.append(f"field 'type': must be a string (the types: {TYPES_NAMED})")
        elif kind == "union_tag_not_found":
            parts.append("missing field 'type'")
        elif kind in ("string_pattern_mismatch", "string_type") and field == "at":
            parts.append(f"field 'at': {rfc3339_problem(item.get('input'))}")
        elif kind == "string_pattern_mismatch" and "\x00" in str(item.get("input")):
            parts.append(f"field '{field}': must not contain a NUL character")
        elif kind == "string_pattern_mismatch" and (
            hidden := HIDDEN.search(str(item.get("input")))
        ):
            char = hidden.group()
            shown = {"Cc": "(a control character)", "Zl": "(a line break)",
                     "Zp": "(a line break)"}.get(
                unicodedata.category(char),
                f"({unicodedata.name(char, 'unnamed')}), which does not show as itself")
            parts.append(f"field '{field}': must not contain U+{ord(char):04X} {shown}")
        elif kind == "string_pattern_mismatch" and (
            "#" not in str(item.get("input")) or field not in ("node", "parent")
        ):  # a node's name may hold neither; '#' is named first
            parts.append(f"field '{field}': must not start or end with white space or an invisible character")
        elif kind == "string_pattern_mismatch":
            parts.append(f"field '{field}': must not contain '#' (it separates node and slot)")
        elif kind in ("bool_type", "bool_parsing"):
            parts.append(f"field '{field}': must be true or false (JSON), not {_shown(item)}")
        elif kind in ("model_type", "dict_type", "model_attributes_type") and not field:
            array = isinstance(item.get("input"), list | tuple)
            parts.append("an event must be a JSON object" + (AN_ARRAY if array else ""))
        else:
            msg = item["msg"].replace("Value error, ", "")
            parts.append(f"field '{field}': {msg}" if field else msg)
    return "; ".join(parts)


def _shown(item: Any) -> str:
    """A wrong value as JSON writes it, cut short."""
    try:
        text = json.dumps(item.get("input"), ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(item.get("input"))
    return text if len(text) <= 40 else text[:37] + "..."


def _json_problem(text: str | bytes) -> str:
    """What is wrong with a line that is not JSON, placed by column within it
    (the parser counts the line's own newline as a second line)."""
    if isinstance(text, bytes) and text.startswith(b"\xef\xbb\xbf") or (
        isinstance(text, str) and text.startswith("\ufeff")
    ):
        return "the line starts with a byte order mark (BOM); write UTF-8 without one"
    if isinstance(text, bytes):
        if packed := _compressed(text):
            return packed
        try:
            text.decode()
        except UnicodeDecodeError as error:
            return _not_utf8(text, error)
        if text and text.count(b"\x00") * 3 >= len(text):  # a later line of UTF-16 text
            return LOOKS_UTF16 if _looks_utf16(text) else NOT_TEXT
    # without its trailing JSON whitespace only: JSON allows no other
    line = text.rstrip(b" \t\r\n") if isinstance(text, bytes) else text.rstrip(" \t\r\n")
    try:
        _adapter(None).validate_json(line)
    except ValidationError as error:
        message = str(error.errors()[0].get("ctx", {}).get("error", error.errors()[0]["msg"]))
        message = re.sub(r" at line 1 column (\d+)$", r" at column \1", message)
        if message.startswith("trailing characters") and (
            b"\r{" in line if isinstance(line, bytes) else "\r{" in line
        ):  # events ended by CR alone (classic Mac OS) read as one line
            message += "; events are ended by a carriage return alone: end each with a newline (LF)"
        elif message.startswith(("unexpected end of hex escape", "lone leading surrogate")):
            message += ("; escapes from \\ud800 to \\udfff are halves of a character, "
                        "in pairs: one from \\ud800 to \\udbff, then one from \\udc00 to \\udfff")
        else:
            message += _spread(line)
        return message
    return "not an event"  # pragma: no cover - JSON allows that whitespace anywhere


LOOKS_UTF16 = "the line is not UTF-8 (it looks like UTF-16); write events as UTF-8"
NOT_TEXT = "the line holds NUL bytes: the input is not text (a binary file?); write events as UTF-8"
AN_ARRAY = (" (a JSON array? submit reads JSON Lines, one event object per line: "
            "jq -c '.[]' FILE | alloc-ledger submit -)")
A_COMMA = (" (a comma after the event? JSON Lines holds one event object per line and nothing "
           "after it; for a JSON array: jq -c '.[]' FILE | alloc-ledger submit -)")
SPREAD = (" (an event spread over several lines? submit reads JSON Lines, one event object "
          "per line: jq -c . FILE | alloc-ledger submit -)")
# How compressed input starts, what it is, and the tool that reads it out.
COMPRESSED = ((b"\x1f\x8b", "gzip", "zcat"), (b"\x28\xb5\x2f\xfd", "zstd", "zstdcat"),
              (b"\xfd7zXZ\x00", "xz", "xzcat"), (b"BZh", "bzip2", "bzcat"))
PRETTY_KEY = re.compile(r'"[^"\\]*"\s*:')  # a line of pretty-printed JSON: "node": …


def _compressed(line: bytes) -> str:
    """What a stream that starts compressed is, and how to read it (else "")."""
    for magic, name, tool in COMPRESSED:
        if line.startswith(magic) and (name != "bzip2" or line[4:10] == b"1AY&SY"):
            return f"the input is {name}-compressed, not text: {tool} FILE | alloc-ledger submit -"
    return ""


def _looks_utf16(line: bytes) -> bool:
    """A byte order mark, or NUL bytes at every other place (ASCII in UTF-16)."""
    if line.startswith((b"\xff\xfe", b"\xfe\xff")):
        return True
    nuls = line.count(b"\x00")
    even = line[::2].count(b"\x00")
    return nuls * 3 >= len(line) and max(even, nuls - even) * 10 >= nuls * 9


def _spread(line: str | bytes) -> str:
    """How to submit a line that is part of a JSON array or of pretty-printed
    JSON (else ""): JSON Lines holds one event per line."""
    text = (line.decode() if isinstance(line, bytes) else line).strip()
    if text.startswith("[") or text in ("]", "],"):
        return AN_ARRAY
    if text.endswith(",") and _whole(text.removesuffix(",")):
        return A_COMMA  # an array of one element per line, or JSON Lines with commas
    if text in ("{", "}", "},") or PRETTY_KEY.match(text) or (
        text.startswith("{") and text.endswith(("{", "["))
    ):
        return SPREAD
    return ""


def _whole(text: str) -> bool:
    """Whether ``text`` is one JSON object: an event with a comma after it
    (a JSON array, one element per line, or JSON Lines written with commas)."""
    try:
        return isinstance(orjson.loads(text), dict)
    except orjson.JSONDecodeError:
        return False


def _not_utf8(line: bytes, error: UnicodeDecodeError) -> str:
    """A line in another encoding: which one it looks like, where it fails."""
    if _looks_utf16(line):
        return LOOKS_UTF16
    if b"\x00" in line:
        return NOT_TEXT
    return (
        f"the line is not UTF-8 (byte 0x{line[error.start]:02x} at column {error.start + 1}, "
        "Latin-1 or another encoding?); write events as UTF-8"
    )


def received(data: str | bytes | dict[str, Any]) -> Event:
    """Validate one event (JSON text, or a dict read as that JSON would be);
    return it as it will be kept: ``at`` in its one text form
    (``ledger.model.timestamp``), or absent until the ledger stamps it.
    Raise ``InvalidEvent``."""
    kind = None
    given: dict[str, Any] | None = None
    if isinstance(data, dict):
        kind = data.get("type")
        kind = kind if isinstance(kind, str) and kind in EVENT_TYPES else None
        given = data
        try:
            data = orjson.dumps(given)
        except TypeError:  # an integer past 64 bits, a type JSON lacks
            data = _standard_json(given)
        else:
            # orjson writes NaN as null (find: `in` first tries bytes for an int)
            if data.find(b"null") >= 0 and not _finite(given):
                data = _standard_json(given)
    try:
        event = _adapter(kind).validate_json(data)
    except ValidationError as error:
        if error.error_count() == 1 and error.errors()[0]["type"] == "json_invalid":
            # a dict's JSON a line may not hold (lists nested hundreds deep)
            problem = _field_at_fault(given) if given is not None else None
            raise InvalidEvent(problem or f"not valid JSON: {_json_problem(data)}") from None
        raise InvalidEvent(describe(error, tagged=kind is None)) from None
    except (ValueError, RecursionError) as error:  # pragma: no cover - defensive
        raise InvalidEvent(f"not a valid event: {error}") from None
    if None in event.values():
        event = {k: v for k, v in event.items() if v is not None}
    if "at" in event:
        try:
            event["at"] = kept_time(event["at"])  # one text form from here on
        except ValueError:  # RFC 3339's form, a field out of range (month 13)
            raise InvalidEvent(f"field 'at': {rfc3339_problem(event['at'])}") from None
        except OverflowError:  # 0001-01-01T00:00:00+10:00 is before the year 1 in UTC
            raise InvalidEvent(f"field 'at': the time is {OUT_OF_YEARS}") from None
    defaults = DEFAULTS.get(event["type"])
    return event if defaults is None else defaults | event


def _finite(event: dict[str, Any]) -> bool:
    """Whether no NaN or infinity stands where the null orjson writes for it
    would read as a value: a field (an optional left out) or a slot report's
    ``alloc`` (a free slot); anywhere else a null is as invalid as the float.
    orjson writes only a float itself so (a subclass of float it refuses)."""
    values = event.values()
    if float in map(type, values) and not _all_finite(values):
        return False
    reports = event.get("slots")
    if isinstance(reports, (list, tuple)):
        allocs = [report.get("alloc") for report in reports if isinstance(report, dict)]
        return float not in map(type, allocs) or _all_finite(allocs)
    return True


def _all_finite(values: Iterable[Any]) -> bool:
    return all(math.isfinite(value) for value in values if type(value) is float)


def _standard_json(event: dict[str, Any]) -> bytes:
    """A dict orjson cannot write as the same line (NaN, which it writes as
    null; integers past 64 bits) as the standard library's JSON, whose NaN,
    Infinity and long integers validation reads as it reads them in a line."""
    try:
        return _json_text(event)
    except (TypeError, ValueError, RecursionError) as error:
        raise InvalidEvent(_field_at_fault(event) or f"not an event: {_unreadable(error)}") from None


def _json_text(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, default=_as_orjson_writes).encode()


def _as_orjson_writes(value: Any) -> Any:
    """What orjson writes a value as (a datetime, a dataclass) that the
    standard library's JSON does not write (TypeError for what neither does)."""
    return orjson.loads(orjson.dumps(value))


def _field_at_fault(event: dict[str, Any]) -> str | None:
    """Name the field whose value JSON cannot hold, or a line's parser cannot
    read back (an integer of thousands of digits, lists nested hundreds deep,
    a set): None if the fault is no field's (a key)."""
    for name, value in event.items():
        try:
            from_json(_json_text(value))
        except (TypeError, ValueError, RecursionError) as problem:
            return f"field '{name}': {_unreadable(problem)}"
    return None


def _unreadable(error: Exception) -> str:
    """Why a value is not JSON an event may hold, as a line's parser says it."""
    if isinstance(error, RecursionError):
        return "recursion limit exceeded"
    if isinstance(error, UnicodeError):
        return "str is not valid UTF-8: surrogates not allowed"
    if isinstance(error, ValueError) and "integer string conversion" in str(error):
        return "number out of range"  # more digits than Python writes (4300)
    return re.sub(r" at line \d+ column \d+$", "", str(error))


TYPES_NAMED = ", ".join(EVENT_TYPES)


def fields_of(event_type: str) -> tuple[list[str], list[str]]:
    """The required and the optional fields of a type, ``type`` and the
    envelope (``id``, ``at``, ``source``) aside: for help texts."""
    own = {n: h for n, h in field_types(event_type).items() if n not in Envelope.__annotations__}
    optional = [n for n, hint in own.items() if get_origin(hint) is NotRequired]
    return [n for n in own if n not in optional], optional


def field_types(event_type: str) -> dict[str, Any]:
    """The fields a type accepts (for building an event from CLI flags)."""
    hints = get_type_hints(EVENT_TYPES[event_type], include_extras=True)
    return {name: hint for name, hint in hints.items() if name != "type"}


def from_flags(event_type: str, flags: dict[str, str]) -> Event:
    """Build an event from ``--field value`` strings: text fields stay text,
    others (numbers, booleans, lists) are read as JSON."""
    if event_type not in EVENT_TYPES:
        raise InvalidEvent(f"unknown type '{event_type}' (the types: {TYPES_NAMED})")
    fields = field_types(event_type)
    data: dict[str, Any] = {"type": event_type}
    for name, text in flags.items():
        annotation = fields.get(name)
        if annotation is None or _is_text(annotation):
            data[name] = text
            continue
        try:
            data[name] = json.loads(text)
        except json.JSONDecodeError as error:
            if "list" in repr(annotation):
                flag = name.replace("_", "-")
                raise InvalidEvent(
                    f"field '{name}': not a JSON list ({error.msg} at column {error.colno}); "
                    f"e.g. --{flag} '{LIST_EXAMPLES.get(name, '[]')}'"
                ) from None
            data[name] = text  # let validation name the field and the type
        except (ValueError, RecursionError) as error:  # thousands of digits, or of brackets
            raise InvalidEvent(f"field '{name}': {_unreadable(error)}") from None
    return received(data)


LIST_EXAMPLES = {"addresses": '["10.0.0.5"]', "slots": '[{"slot": 0, "alloc": "a1"}]'}


def _is_text(annotation: Any) -> bool:
    text = repr(annotation)
    return "str" in text and "list" not in text and "bool" not in text
