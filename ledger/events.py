"""The event vocabulary (SPEC section 2) as pydantic v2 models.

Every event is validated strictly: unknown fields, wrong types and unknown
``type`` values are invalid, and the error names the field.
"""

from __future__ import annotations

import json

import orjson
from types import SimpleNamespace
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal, Union

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
)

from ledger.errors import InvalidEvent

MAX_SLOTS = 1024


Name = Annotated[str, Field(min_length=1, max_length=128)]
# '#' separates node and slot (n1#0), so a node name may not contain it.
NodeName = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[^#]+$")]
Address = Annotated[str, Field(min_length=1, max_length=256)]
SlotIndex = Annotated[int, Field(ge=0, lt=MAX_SLOTS)]


def _unique(values: list[str]) -> list[str]:
    seen: set[str] = set()
    for value in values:
        if value in seen:
            raise ValueError(f"address {value} is listed twice")
        seen.add(value)
    return values


class Event(BaseModel):
    """The envelope every event carries."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    id: Name | None = None
    at: AwareDatetime | None = None
    source: Annotated[str, Field(max_length=1024)] | None = None

    @property
    def entity(self) -> str:
        """The entity the event is about: its node or its allocation."""
        return str(getattr(self, "alloc", None) or getattr(self, "node"))


class SlotReport(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    slot: SlotIndex
    alloc: Name | None


class NodeRegistered(Event):
    type: Literal["node-registered"]
    node: NodeName
    slots: Annotated[int, Field(ge=0, le=MAX_SLOTS)] = 0
    parent: NodeName | None = None


class Heartbeat(Event):
    type: Literal["heartbeat"]
    node: NodeName
    slots: list[SlotReport] | None = None


class HeartbeatMissed(Event):
    type: Literal["heartbeat-missed"]
    node: NodeName


class NodeDown(Event):
    type: Literal["node-down"]
    node: NodeName
    reason: Annotated[str, Field(max_length=1024)] | None = None


class NodeRemoved(Event):
    type: Literal["node-removed"]
    node: NodeName


class NodeSuspected(Event):
    type: Literal["node-suspected"]
    node: NodeName
    reason: Annotated[str, Field(min_length=1, max_length=1024)]


class HealthChecked(Event):
    type: Literal["health-checked"]
    node: NodeName
    passed: bool


class AllocPlaced(Event):
    type: Literal["alloc-placed"]
    alloc: Name
    node: NodeName
    job: Name | None = None
    slot: SlotIndex | None = None
    addresses: Annotated[list[Address], AfterValidator(_unique)] | None = None
    max_disconnect: Annotated[int, Field(ge=0)] | None = None


class AllocUpdated(Event):
    type: Literal["alloc-updated"]
    alloc: Name
    client_status: Literal["pending", "running", "complete", "failed"]
    blame: Literal["node", "alloc"] = "node"


class AllocStopRequested(Event):
    type: Literal["alloc-stop-requested"]
    alloc: Name


class AllocRemoveRequested(Event):
    type: Literal["alloc-remove-requested"]
    alloc: Name


class AllocRemoved(Event):
    type: Literal["alloc-removed"]
    alloc: Name


EVENT_TYPES: dict[str, type[Event]] = {
    model.model_fields["type"].annotation.__args__[0]: model  # type: ignore[union-attr]
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

AnyEvent = Annotated[
    Union[tuple(EVENT_TYPES.values())],  # type: ignore[valid-type]  # noqa: UP007
    Field(discriminator="type"),
]
_adapter: TypeAdapter[Event] = TypeAdapter(AnyEvent)


def json_schema() -> dict[str, Any]:
    """The JSON Schema of one event (a discriminated union on ``type``)."""
    schema = _adapter.json_schema()
    schema["title"] = "alloc-ledger event"
    return schema


def describe(error: ValidationError) -> str:
    """One line naming the field(s) that are wrong."""
    parts = []
    for item in error.errors(include_url=False)[:3]:
        loc = [str(p) for p in item["loc"]]
        # Drop the discriminator tag pydantic puts first in the location.
        if loc and loc[0] in EVENT_TYPES:
            loc = loc[1:]
        field = ".".join(loc)
        kind = item["type"]
        if kind == "extra_forbidden":
            parts.append(f"unknown field '{field}'")
        elif kind == "missing":
            parts.append(f"missing field '{field}'")
        elif kind == "union_tag_invalid":
            tag = item.get("input", {}).get("type") if isinstance(item.get("input"), dict) else None
            parts.append(f"unknown type '{tag}'")
        elif kind == "union_tag_not_found":
            parts.append("missing field 'type'")
        elif kind == "string_pattern_mismatch":
            parts.append(f"field '{field}': must not contain '#' (it separates node and slot)")
        elif kind in ("model_type", "model_attributes_type") and not field:
            parts.append("an event must be a JSON object")
        else:
            msg = item["msg"].replace("Value error, ", "")
            parts.append(f"field '{field}': {msg}" if field else msg)
    return "; ".join(parts)


def parse(data: str | bytes | dict[str, Any]) -> Event:
    """Validate one event from a JSON text or a dict; raise InvalidEvent."""
    return received(data)[0]


def received(data: str | bytes | dict[str, Any] | Event) -> tuple[Event, dict[str, Any]]:
    """Validate one event; return it with the fields it will be kept with
    (as given, defaults filled, no top-level nulls, ``at`` still to be set)."""
    if isinstance(data, Event):
        fields = data.model_dump(mode="json")
    else:
        if isinstance(data, dict):
            try:
                # Through JSON, so a dict means what the same JSON line would mean.
                data = orjson.dumps(data)
            except TypeError as error:
                raise InvalidEvent(f"not an event: {error}") from None
        try:
            event = _adapter.validate_json(data)
        except ValidationError as error:
            if error.error_count() == 1 and error.errors()[0]["type"] == "json_invalid":
                raise InvalidEvent(f"not valid JSON: {error.errors()[0]['ctx']['error']}") from None
            raise InvalidEvent(describe(error)) from None
        except (ValueError, RecursionError) as error:  # pragma: no cover - defensive
            raise InvalidEvent(f"not a valid event: {error}") from None
        fields = orjson.loads(data)  # valid JSON: validation just read it
        data = event
    kept = _KEPT_DEFAULTS[fields["type"]] | {k: v for k, v in fields.items() if v is not None}
    return data, kept


def field_types(event_type: str) -> dict[str, Any]:
    """The fields a type accepts (for building an event from CLI flags)."""
    model = EVENT_TYPES[event_type]
    return {name: info.annotation for name, info in model.model_fields.items() if name != "type"}


def from_flags(event_type: str, flags: dict[str, str]) -> Event:
    """Build an event from ``--field value`` strings: text fields stay text,
    others (numbers, booleans, lists) are read as JSON."""
    if event_type not in EVENT_TYPES:
        raise InvalidEvent(f"unknown type '{event_type}'")
    fields = field_types(event_type)
    data: dict[str, Any] = {"type": event_type}
    for name, text in flags.items():
        annotation = fields.get(name)
        if annotation is None or _is_text(annotation):
            data[name] = text
            continue
        try:
            data[name] = json.loads(text)
        except ValueError:
            data[name] = text  # let validation name the field and the type
    return parse(data)


def _is_text(annotation: Any) -> bool:
    text = repr(annotation)
    return ("str" in text or "datetime" in text) and "list" not in text and "bool" not in text


def canonical(event: Event, at: datetime) -> dict[str, Any]:
    """The event as it is kept: defaults filled, ``at`` set, no nulls."""
    data = received(event)[1]
    data["at"] = timestamp(at if event.at is None else event.at)
    return data


def timestamp(moment: datetime) -> str:
    """One fixed-width UTC text form, so text order is time order in SQL."""
    if moment.utcoffset() != _ZERO:
        moment = moment.astimezone(UTC)
    return moment.isoformat(timespec="microseconds")[:26] + "Z"


_ZERO = timedelta(0)


_KEPT_DEFAULTS: dict[str, dict[str, Any]] = {
    name: {
        f: info.default
        for f, info in model.model_fields.items()
        if not info.is_required() and info.default is not None
    }
    for name, model in EVENT_TYPES.items()
}
_DEFAULTS: dict[str, dict[str, Any]] = {
    name: {f: info.default for f, info in model.model_fields.items() if not info.is_required()}
    for name, model in EVENT_TYPES.items()
}


def restore(data: dict[str, Any]) -> Event:
    """Rebuild a stored (already validated) event without validating again.

    Replays run this for every kept event, so it builds a plain namespace with
    the model's attributes and defaults rather than a pydantic model."""
    fields = _DEFAULTS[data["type"]] | data
    if fields.get("slots") and data["type"] == "heartbeat":
        fields["slots"] = [
            SimpleNamespace(slot=item["slot"], alloc=item.get("alloc")) for item in fields["slots"]
        ]
    return SimpleNamespace(**fields)  # type: ignore[return-value]
