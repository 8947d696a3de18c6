"""The published JSON Schema (``alloc-ledger schema``) and submit agree, read
by the validators tools use: ``jsonschema`` (a test dependency) here, Ajv's
strict mode through the keywords the schema may use."""

from __future__ import annotations

from typing import Any

import jsonschema  # a test dependency: its absence is a broken install, not a skip
import pytest

from ledger.errors import InvalidEvent
from ledger.events import EVENT_TYPES, json_schema, received, schemas_by_type

PLACED = {"type": "alloc-placed", "alloc": "a1", "node": "n1"}


def submitted(event: dict[str, Any]) -> str:
    """'valid', or the error submit gives."""
    try:
        received(event)
    except InvalidEvent as error:
        return str(error)
    return "valid"


def validator() -> Any:
    schema = json_schema()
    return jsonschema.validators.validator_for(schema)(schema)


def schema_of(event_type: str) -> dict[str, Any]:
    """A type's schema, found by its ``type`` constant (no OpenAPI keyword)."""
    return schemas_by_type(json_schema())[event_type]


@pytest.mark.parametrize("event", [
    {"type": "node-registered", "node": "n1\n"},
    {"type": "heartbeat", "node": "n1", "id": "k1\n"},
    {"type": "heartbeat", "node": "n1", "at": "2026-01-01T00:00:00Z\n"},
    PLACED | {"alloc": "a1\n"},
    PLACED | {"job": "web\n"},
    PLACED | {"addresses": ["10.0.0.5\n"]},
])
def test_a_name_or_time_ending_in_a_line_feed_is_refused_by_the_schema_too(event: dict) -> None:
    """ECMA-262's $ (the schema's dialect, and pydantic's Rust regex) matches
    only at the end; Python's re, which jsonschema and hypothesis-jsonschema
    use, also before a final line feed: "n1\\n" passed the schema there."""
    assert submitted(event) != "valid"
    assert not validator().is_valid(event)


# Every keyword of JSON Schema 2020-12 (core, applicator, validation,
# unevaluated, meta-data, format, content vocabularies).
KEYWORDS_2020_12 = {
    "$schema", "$id", "$ref", "$anchor", "$dynamicRef", "$dynamicAnchor", "$vocabulary",
    "$comment", "$defs", "allOf", "anyOf", "oneOf", "not", "if", "then", "else",
    "dependentSchemas", "prefixItems", "items", "contains", "properties",
    "patternProperties", "additionalProperties", "propertyNames", "unevaluatedItems",
    "unevaluatedProperties", "type", "const", "enum", "multipleOf", "maximum",
    "exclusiveMaximum", "minimum", "exclusiveMinimum", "maxLength", "minLength", "pattern",
    "maxItems", "minItems", "uniqueItems", "maxContains", "minContains", "maxProperties",
    "minProperties", "required", "dependentRequired", "title", "description", "default",
    "deprecated", "readOnly", "writeOnly", "examples", "format", "contentEncoding",
    "contentMediaType", "contentSchema",
}


def _keywords(node: Any) -> set[str]:
    found: set[str] = set()
    if isinstance(node, dict):
        for key, value in node.items():
            found.add(key)
            if key in ("properties", "$defs", "patternProperties", "dependentSchemas"):
                for sub in value.values():
                    found |= _keywords(sub)
            elif key not in ("const", "enum", "default", "examples"):
                found |= _keywords(value)
    elif isinstance(node, list):
        for item in node:
            found |= _keywords(item)
    return found


def test_the_schema_uses_only_keywords_of_its_draft() -> None:
    """Ajv (Ajv2020, its default strict mode) refuses to compile a schema
    with an unknown keyword: 'strict mode: unknown keyword: "discriminator"'
    (OpenAPI's; with Ajv's discriminator option: "mapping is not
    supported"). The oneOf of type constants already picks the type."""
    assert _keywords(json_schema()) - KEYWORDS_2020_12 == set()


@pytest.mark.parametrize(("event_type", "field", "default"), [
    ("node-registered", "slots", 0),
    ("alloc-updated", "blame", "node"),
])
def test_the_defaults_submit_applies_are_published(event_type: str, field: str, default: Any) -> None:
    required = {"node-registered": {"node": "n1"},
                "alloc-updated": {"alloc": "a1", "client_status": "failed"}}[event_type]
    assert received({"type": event_type, **required})[field] == default
    assert schema_of(event_type)["properties"][field].get("default") == default


@pytest.mark.parametrize("event_type", list(EVENT_TYPES))
def test_each_event_type_is_described(event_type: str) -> None:
    """A tool building events from the schema reads what each one records."""
    assert schema_of(event_type).get("description"), event_type


@pytest.mark.parametrize("at", ["0001-01-01T00:00:00+00:01", "9999-12-31T23:59:59-00:01"])
def test_a_time_the_pattern_takes_but_submit_refuses_is_said_in_the_schema(at: str) -> None:
    """An offset may move a time the pattern takes outside the years 1 to
    9999 in UTC: submit refuses it, the schema cannot (and says so)."""
    event = {"type": "heartbeat", "node": "n1", "at": at}
    assert submitted(event) == "field 'at': the time is outside the years 1 to 9999 in UTC"
    assert validator().is_valid(event)
    described = json_schema()["description"] + schema_of("heartbeat")["properties"]["at"][
        "anyOf"][0]["description"]
    assert "9999" in described
