"""Whether a kept event can be read, and if not, what is wrong with it, in
the ledger's words: the one place a reader (a replay, ``history``, a retry
looking up what an id was kept as) turns a kept event it cannot read into
``Unreadable``.

A kept event's shape, as ``ledger.records.encode`` writes it and the
domain reads it back: its event's type, the fields that type holds (with
the defaults the ledger fills in, so ``slots`` of a registration and
``blame`` of an update are always there) and the kind of each. Only the
shape: what a release let in (a name's characters, a slot's range) is its
rules' to judge, and a later release may judge otherwise. Replays check
nothing per event (they read millions); they ask here only once one fails.
``ledger/events.py`` validates the same fields on the way in (pydantic,
which a query does not load; ``tests/unit/test_readable.py`` keeps the two
in step).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import orjson

from ledger.errors import Unreadable
from ledger.model import MAX_SLOTS

CANNOT_APPLY = "it holds an event this alloc-ledger cannot apply"


class Kind(NamedTuple):
    words: str  # "a text": what the field is not, when it is not one
    holds: Callable[[Any], bool]


def _reports(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(entry, dict) and type(entry.get("slot")) is int and "alloc" in entry
        and (entry["alloc"] is None or isinstance(entry["alloc"], str))
        for entry in value
    )


TEXT = Kind("a text", lambda value: isinstance(value, str))
WHOLE = Kind("a whole number", lambda value: type(value) is int)
FLAG = Kind("true or false", lambda value: type(value) is bool)
TEXTS = Kind("a list of texts", lambda value: isinstance(value, list) and all(
    isinstance(item, str) for item in value))
REPORTS = Kind("a list of slot reports", _reports)
STATUS = Kind("pending, running, complete or failed",
              lambda value: value in ("pending", "running", "complete", "failed"))
BLAME = Kind("node or alloc", lambda value: value in ("node", "alloc"))

REQUIRED, OPTIONAL = True, False
# Every kept event's envelope: the ledger stamps ``at`` on every event it keeps.
ENVELOPE = {"at": (TEXT, REQUIRED), "id": (TEXT, OPTIONAL), "source": (TEXT, OPTIONAL)}
NODE = {"node": (TEXT, REQUIRED)}
ALLOC = {"alloc": (TEXT, REQUIRED)}
SHAPES: dict[str, dict[str, tuple[Kind, bool]]] = {
    "node-registered": NODE | {"slots": (WHOLE, REQUIRED), "parent": (TEXT, OPTIONAL)},
    "heartbeat": NODE | {"slots": (REPORTS, OPTIONAL)},
    "heartbeat-missed": NODE,
    "node-down": NODE | {"reason": (TEXT, OPTIONAL)},
    "node-removed": NODE,
    "node-suspected": NODE | {"reason": (TEXT, REQUIRED)},
    "health-checked": NODE | {"passed": (FLAG, REQUIRED)},
    "alloc-placed": ALLOC | NODE | {
        "job": (TEXT, OPTIONAL), "slot": (WHOLE, OPTIONAL), "addresses": (TEXTS, OPTIONAL),
        "max_disconnect": (WHOLE, OPTIONAL),
    },
    "alloc-updated": ALLOC | {"client_status": (STATUS, REQUIRED), "blame": (BLAME, REQUIRED)},
    "alloc-stop-requested": ALLOC,
    "alloc-remove-requested": ALLOC,
    "alloc-removed": ALLOC,
}


def unreadable(position: int | None, state: bytes | None) -> Unreadable:
    """A kept event a reader failed on, named with what is wrong with its
    stored ``state`` (None: not at hand)."""
    return Unreadable(position, (None if state is None else stored_problem(state)) or CANNOT_APPLY)


def stored_problem(state: bytes) -> str | None:
    """What is wrong with a kept event's stored bytes, its limits included;
    None if nothing: a reader that failed on it failed for a reason of its own."""
    # its shape right, is it beyond a limit?
    return state_problem(state) or beyond_limits(orjson.loads(state)["event"])


def inapplicable(position: int, event: Any) -> Unreadable | None:
    """A kept event, read already, that the domain failed to apply, named
    with what is wrong with it; None if nothing is (the failure is the
    domain's own, a bug to surface, not an edited log)."""
    problem = event_problem(event) or beyond_limits(event)
    return None if problem is None else Unreadable(position, problem)


def beyond_limits(event: dict[str, Any]) -> str | None:
    """What in a kept event of the right shape is more than the domain will
    apply: a registration's slots (its table would be built in memory)."""
    slots = event.get("slots")
    if event["type"] == "node-registered" and type(slots) is int and slots > MAX_SLOTS:
        return f"field 'slots' is {slots}: a node has at most {MAX_SLOTS} slots"
    return None


def state_problem(state: bytes) -> str | None:
    """What is wrong with a kept event's stored bytes; None if nothing."""
    if not state:
        return "its stored state is empty"
    try:
        kept = orjson.loads(state)
    except orjson.JSONDecodeError as error:
        try:
            bytes(state).decode()
        except UnicodeDecodeError as undecodable:
            return (f"its stored state is not UTF-8 (byte 0x{state[undecodable.start]:02x} at "
                    f"byte {undecodable.start + 1})")
        return f"its stored JSON is not valid: {error.msg} at character {error.pos + 1}"
    return kept_problem(kept)


def kept_problem(kept: Any) -> str | None:
    """What is wrong with a kept event's stored JSON, once parsed."""
    if not isinstance(kept, dict):
        return "its stored JSON is not an object"
    if "event" not in kept:
        return "its stored JSON holds no event"
    if not isinstance(kept.get("recorded_at"), str):
        return "its stored JSON holds no time it was recorded ('recorded_at')"
    touches = kept.get("touches", [])
    if not isinstance(touches, list) or not all(isinstance(name, str) for name in touches):
        return "what it touched ('touches') is not a list of names"
    if not isinstance(kept.get("reason", ""), str):
        return "its reason of rejection is not a text"
    rules = kept.get("rules", 1)
    if type(rules) is not int or rules < 1:
        return "the version of the rules that decided it ('rules') is not a whole number from 1"
    return event_problem(kept["event"])


def event_problem(event: Any) -> str | None:
    """What is wrong with a kept event's event; None if it is as the ledger keeps one."""
    if not isinstance(event, dict):
        return "its stored event is not an object"
    kind = event.get("type")
    if kind is None:
        return "field 'type' is missing"
    if not isinstance(kind, str):
        return "field 'type' is not a text"
    shape = SHAPES.get(kind)
    if shape is None:
        return f"unknown event type '{kind}'"
    for field, (expected, required) in (ENVELOPE | shape).items():
        if field not in event or event[field] is None and not required:
            if required:
                return f"field '{field}' is missing"
        elif not expected.holds(event[field]):
            return f"field '{field}' is not {expected.words}"
    return None


def check(position: int, kept: Any) -> None:
    """Raise ``Unreadable`` for a kept event (its stored JSON, parsed) that
    is not as the ledger keeps one."""
    problem = kept_problem(kept)
    if problem is not None:
        raise Unreadable(position, problem)
