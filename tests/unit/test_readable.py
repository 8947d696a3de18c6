"""A kept event that cannot be read is named in the ledger's words, the same
by every reader: what is wrong with its stored JSON or the event in it,
never a Python exception's name. The shapes it is judged by are the
vocabulary's (``ledger/events.py``), less what a release's rules judge."""

from __future__ import annotations

from functools import cache
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from ledger.domain import Cluster
from ledger.errors import LedgerError, Refused, RulesTooNew, Unreadable
from ledger.events import DEFAULTS, EVENT_TYPES, _adapter, field_types, received
from ledger.model import MAX_SLOTS
from ledger.readable import CANNOT_APPLY, ENVELOPE, SHAPES, event_problem, state_problem
from ledger.records import Progress, Record, decode, encode, read, replay, replay_log
from ledger.store import LoggedEvent
from scripts.simulate import generate

AT = "2026-01-01T00:00:00.000000Z"
RECORDED = {"recorded_at": AT}


def kept(event: dict[str, Any], **state: Any) -> bytes:
    return orjson.dumps({"event": event} | RECORDED | state)


def test_the_shapes_are_of_every_event_type_and_field_the_vocabulary_has() -> None:
    assert set(SHAPES) == set(EVENT_TYPES)
    for kind, shape in SHAPES.items():
        assert set(ENVELOPE | shape) == set(field_types(kind)), kind


@pytest.mark.parametrize(("state", "problem"), [
    (b"", "its stored state is empty"),
    (b'{"event": {"type": "heart', "its stored JSON is not valid: unexpected end of data at character 26"),
    (b'{"event": {}} x', "its stored JSON is not valid: unexpected content after document at character 15"),
    (b'{"event": "caf\xe9"}', "its stored state is not UTF-8 (byte 0xe9 at byte 15)"),
    (b"[]", "its stored JSON is not an object"),
    (b"{}", "its stored JSON holds no event"),
    (b'{"event": {}}', "its stored JSON holds no time it was recorded ('recorded_at')"),
    (kept({}, touches="n1"), "what it touched ('touches') is not a list of names"),
    (kept({}, reason=3), "its reason of rejection is not a text"),
    (kept({}, rules="3"), "the version of the rules that decided it ('rules') is not a whole number from 1"),
    (kept([]), "its stored event is not an object"),
    (kept({"node": "n1", "at": AT}), "field 'type' is missing"),
    (kept({"type": 7, "at": AT}), "field 'type' is not a text"),
    (kept({"type": "hearbeat", "node": "n1", "at": AT}), "unknown event type 'hearbeat'"),
    (kept({"type": "heartbeat", "nod": "n1", "at": AT}), "field 'node' is missing"),
    (kept({"type": "heartbeat", "node": "n1"}), "field 'at' is missing"),
    (kept({"type": "heartbeat", "node": None, "at": AT}), "field 'node' is not a text"),
    (kept({"type": "heartbeat", "node": "n1", "at": AT, "slots": [{"slot": 0}]}),
     "field 'slots' is not a list of slot reports"),
    (kept({"type": "node-registered", "node": "n1", "at": AT}), "field 'slots' is missing"),
    (kept({"type": "node-registered", "node": "n1", "slots": "4", "at": AT}),
     "field 'slots' is not a whole number"),
    (kept({"type": "health-checked", "node": "n1", "passed": 1, "at": AT}),
     "field 'passed' is not true or false"),
    (kept({"type": "alloc-updated", "alloc": "a1", "client_status": "lost", "blame": "node",
           "at": AT}), "field 'client_status' is not pending, running, complete or failed"),
    (kept({"type": "alloc-placed", "alloc": "a1", "node": "n1", "addresses": "10.0.0.5",
           "at": AT}), "field 'addresses' is not a list of texts"),
])
def test_what_is_wrong_with_a_kept_event_is_said_in_the_ledgers_words(
    state: bytes, problem: str
) -> None:
    assert state_problem(state) == problem


def test_a_kept_event_as_the_ledger_keeps_one_has_nothing_wrong() -> None:
    for event in generate(400, nodes=5, slots=4, seed=3):
        event = {"at": AT} | DEFAULTS.get(event["type"], {}) | event
        assert state_problem(kept(event, touches=["n1#0"], rules=3)) is None, event


# One kept event of each type, with every field its type has.
ENVELOPE_KEPT = {"at": AT, "id": "e1", "source": "sim"}
EXAMPLES: dict[str, dict[str, Any]] = {
    "node-registered": {"node": "n1", "slots": 2, "parent": "h1"},
    "heartbeat": {"node": "n1", "slots": [{"slot": 0, "alloc": "a1"}, {"slot": 1, "alloc": None}]},
    "heartbeat-missed": {"node": "n1"},
    "node-down": {"node": "n1", "reason": "instance gone"},
    "node-removed": {"node": "n1"},
    "node-suspected": {"node": "n1", "reason": "disk errors"},
    "health-checked": {"node": "n1", "passed": False},
    "alloc-placed": {"alloc": "a1", "node": "n1", "job": "web", "slot": 0,
                     "addresses": ["10.0.0.5"], "max_disconnect": 60},
    "alloc-updated": {"alloc": "a1", "client_status": "running", "blame": "node"},
    "alloc-stop-requested": {"alloc": "a1"},
    "alloc-remove-requested": {"alloc": "a1"},
    "alloc-removed": {"alloc": "a1"},
}


def example(kind: str) -> dict[str, Any]:
    return {"type": kind} | ENVELOPE_KEPT | EXAMPLES[kind]


def test_the_examples_hold_every_field_and_are_valid_events() -> None:
    for kind in EVENT_TYPES:
        event = example(kind)
        assert set(event) - {"type"} == set(field_types(kind)), kind
        assert received(dict(event)) == event
        assert event_problem(event) is None


# What a kept event may hold: the vocabulary's fields and a few others, each
# of any JSON kind.
FIELDS = sorted({name for kind in EVENT_TYPES for name in field_types(kind)} | {"nod", "bogus"})
VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 2**40), st.floats(-2, 2, allow_nan=False),
    st.sampled_from(["n1", "a1", "", "running", "node", "lost", "alloc", AT]),
    st.lists(st.one_of(st.text("ab", max_size=2), st.integers(0, 3)), max_size=2),
    st.lists(st.fixed_dictionaries({"slot": st.one_of(st.integers(-1, 3), st.just("0"))},
                                   optional={"alloc": st.one_of(st.none(), st.just("a1"), st.just(1))}),
             max_size=2),
    st.just({}), st.just([{}]), st.just([1]),
)
# Errors of pydantic's that say a field is missing or of another kind: what
# a kept event must not be. Its others (a name's characters, a number's
# range, an address listed twice) are a release's rules, which change.
SHAPE_ERRORS = ("missing", "literal_error")


def vocabulary_says_shape_is_wrong(event: dict[str, Any]) -> bool:
    """Whether submit's validator names a missing field or one of another
    kind; or one the ledger fills in on the way in (``at``, the defaults) is
    missing or null, which no kept event is."""
    filled = {"at", *DEFAULTS.get(event["type"], {})}
    if any(event.get(name) is None for name in filled):
        return True
    try:
        _adapter(event["type"]).validate_json(orjson.dumps(event))
    except ValidationError as error:
        return any(item["type"] in SHAPE_ERRORS or item["type"].endswith("_type")
                   for item in error.errors(include_url=False))
    return False


DROP = object()


@settings(max_examples=1500, deadline=None)
@given(st.sampled_from(list(EVENT_TYPES)),
       st.dictionaries(st.sampled_from(FIELDS), st.one_of(st.just(DROP), VALUES), max_size=3))
def test_a_kept_event_is_wrong_exactly_where_the_vocabulary_says_its_shape_is(
    kind: str, edits: dict[str, Any]
) -> None:
    event = {name: value for name, value in (example(kind) | edits).items() if value is not DROP}
    assert (event_problem(event) is not None) == vocabulary_says_shape_is_wrong(event), (
        event, event_problem(event))


@cache
def kept_log() -> tuple[LoggedEvent, ...]:
    """A simulated history as the ledger keeps it."""
    cluster, stored = Cluster(), []
    for position, event in enumerate(generate(300, nodes=5, slots=4, seed=3), start=1):
        event = {"at": AT} | DEFAULTS.get(event["type"], {}) | event
        record = Record(position, event["type"], event, AT, [])
        try:
            cluster.apply(event, record.fact)
        except LedgerError as violation:
            record.topic, record.reason = "rejected", str(violation)
            cluster.reject(event, str(violation), record.fact)
        stored.append(encode(record))
    return tuple(stored)


def damaged(position: int, state: bytes) -> list[LoggedEvent]:
    log = kept_log()
    before = log[position - 1]
    return [*log[:position - 1], LoggedEvent(position, before.topic, state), *log[position:]]


def test_every_reader_names_an_unreadable_event_alike() -> None:
    """A replay of the log, a replay of one record, and a reader of a few."""
    log = kept_log()
    event = orjson.loads(log[39].state)["event"]
    assert event["type"] == "heartbeat", event
    state = kept(dict(event, type="hearbeat"), rules=3)
    message = (
        "the kept event at position 40 cannot be read: unknown event type 'hearbeat'; "
        "alloc-ledger verify checks whether the log was edited")

    with pytest.raises(Unreadable, match=f"^{message}$"):
        replay_log(Cluster(), damaged(40, state), Progress(0))
    cluster = Cluster()
    replay_log(cluster, log[:39], Progress(0))
    with pytest.raises(Unreadable, match=f"^{message}$"):
        replay(cluster, decode(LoggedEvent(40, "heartbeat", state)))
    with pytest.raises(Unreadable, match=f"^{message}$"):
        read(LoggedEvent(40, "heartbeat", state))
    with pytest.raises(Unreadable, match="^the kept event at position 40 cannot be read: "
                                         "its stored state is empty;"):
        decode(LoggedEvent(40, "heartbeat", b""))


def test_a_field_edited_to_null_is_unreadable_not_refused() -> None:
    """The domain looks the node None up and does not find it: the rule
    that refuses it is not what is wrong."""
    event = orjson.loads(kept_log()[39].state)["event"]

    with pytest.raises(Unreadable, match="cannot be read: field 'node' is not a text;"):
        replay_log(Cluster(), damaged(40, kept(dict(event, node=None))), Progress(0))


@pytest.mark.parametrize("error", [AttributeError, KeyError, TypeError, ValueError])
def test_a_rule_that_fails_on_a_kept_event_as_the_ledger_keeps_one_is_a_bug_not_an_edit(
    monkeypatch: pytest.MonkeyPatch, error: type[Exception],
) -> None:
    """A handler's own failure (a refactoring's AttributeError) over a kept
    event with nothing wrong with it surfaces as itself: told as "cannot be
    read … verify checks whether the log was edited", it sent users to audit
    a log that is whole (helper-304). Both replays: of the log, of one record."""
    log = kept_log()
    heartbeat = next(kept for kept in log if kept.topic == "heartbeat")

    def failing(self: Cluster, event: Any, fact: Any) -> None:
        raise error("a bug in the heartbeat rule")

    monkeypatch.setattr(Cluster, "heartbeat", failing)
    with pytest.raises(error, match="a bug in the heartbeat rule"):
        replay_log(Cluster(), log, Progress(0))
    with pytest.raises(error, match="a bug in the heartbeat rule"):
        replay(Cluster(), decode(heartbeat))
    edited = orjson.loads(heartbeat.state)
    del edited["event"]["node"]  # the same failure, over an edited event: named
    with pytest.raises(Unreadable, match="cannot be read: field 'node' is missing"):
        replay(Cluster(), decode(heartbeat._replace(state=orjson.dumps(edited))))


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_a_replay_of_a_damaged_log_ends_in_one_of_the_ledgers_errors(data: st.DataObject) -> None:
    """Or in none: a replay applies each event as it reads it (it reads
    millions), so one edited so that it still applies (a name, a slot) is
    verify's to name, as is one that only a later event fails on."""
    log = kept_log()
    position = data.draw(st.integers(1, len(log)))
    state = orjson.loads(log[position - 1].state)
    where = state["event"] if data.draw(st.booleans()) else state
    name = data.draw(st.sampled_from(sorted(where) + ["slots", "node", "type", "event", "rules"]))
    if data.draw(st.booleans()) and name in where:
        del where[name]
    else:
        where[name] = data.draw(VALUES)

    try:
        replay_log(Cluster(), damaged(position, orjson.dumps(state)), Progress(0))
    except (Unreadable, Refused, RulesTooNew) as error:
        if isinstance(error, Unreadable) and error.position == position:
            assert error.problem != CANNOT_APPLY  # what is wrong with it is named


@pytest.mark.parametrize(("kind", "field", "value"), [
    ("alloc-placed", "alloc", None), ("alloc-placed", "alloc", 1),
    ("alloc-placed", "addresses", [1]), ("node-registered", "node", None),
])
def test_a_name_edited_to_no_text_is_named_where_it_is_not_where_it_breaks_later(
    kind: str, field: str, value: Any
) -> None:
    # CI's hypothesis run (2026-11-29): an alloc-placed kept with "alloc":
    # null applied, and the next heartbeat-missed of its node failed on
    # sorting its allocations' names (TypeError, no position named).
    log = kept_log()
    position = next(s.originator_version for s in log if s.topic == kind)
    state = orjson.loads(log[position - 1].state)
    state["event"][field] = value

    with pytest.raises(Unreadable) as raised:
        replay_log(Cluster(), damaged(position, orjson.dumps(state)), Progress(0))

    assert raised.value.position == position


@pytest.mark.parametrize("slots", [MAX_SLOTS + 1, 2**40])
def test_a_registration_edited_to_more_slots_than_a_node_has_is_unreadable(slots: int) -> None:
    """Its slot table is never built: 2**40 slots took the test run's
    24 GB before the kernel killed it (a draw of the property test above)."""
    log = kept_log()
    position = next(i for i, kept in enumerate(log, start=1)
                    if orjson.loads(kept.state)["event"]["type"] == "node-registered")
    state = orjson.loads(log[position - 1].state)
    state["event"]["slots"] = slots
    message = (f"the kept event at position {position} cannot be read: field 'slots' is "
               f"{slots}: a node has at most {MAX_SLOTS} slots; ")

    with pytest.raises(Unreadable) as raised:
        replay_log(Cluster(), damaged(position, orjson.dumps(state)), Progress(0))
    assert str(raised.value).startswith(message)
    with pytest.raises(Unreadable) as raised:
        replay(Cluster(), decode(LoggedEvent(position, "node-registered", orjson.dumps(state))))
    assert str(raised.value).startswith(message)
