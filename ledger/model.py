"""The entities of the ledger: nodes, slots, allocations, address holds.

Plain data; the rules that change them live in ``ledger.domain``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

# A kept event: validated, defaults filled, no nulls at the top, ``at`` as text.
Event = dict[str, Any]

TERMINAL = frozenset({"complete", "failed", "lost"})
LIVE = frozenset({"pending", "running", "unknown"})
DESIRED_ORDER = {"run": 0, "stop": 1, "remove": 2}


# The rules this version decides by. Each kept event records the rules that
# decided it (none recorded: 1), and is applied again under those, so a log
# kept by an earlier version replays to the tables it had. 2 (2026-11-22): a
# heartbeat does not bring a node back while its parent chain is down or
# removed; an allocation that stops waiting to reconnect is no longer
# ``unknown_since`` anything. 3 (2026-11-22): a node's ``reason`` says why
# it is down while it is down, and why it is suspect otherwise: a suspicion
# of a down node keeps the reason it went down, and a node back from down
# that is still suspect shows its suspicion's reason again
# (``health_reason``, kept from rules 3 on); a node's ``lost_allocs`` are
# all it lost since it was last ready, at a disconnect too, not only when
# it went down.
RULES = 3
# What each version changed, named, from the version on which it holds
# (``fact.rules >= HEALTH_REASON``): the next version's changes join these.
PARENT_HOLDS_NODE = 2  # a heartbeat does not bring a node back while its parent chain is down
RECONNECT_FORGETS_UNKNOWN = 2  # an allocation that stops waiting is unknown_since nothing
HEALTH_REASON = 3  # reason: why down while down, why suspect otherwise (kept in health_reason)
LOSSES_AT_DISCONNECT = 3  # lost_allocs: all lost since last ready, at a disconnect too

MAX_SLOTS = 1024  # the most slots a node may have: submit takes no more, a replay applies no more
# The most addresses a placement may list: each is held (a row, an entity)
# while it is decided, so a line of 1 MiB stays a few MB in memory.
MAX_ADDRESSES = 1024

# A deadline past the year 9999, as the one text form writes it: the last
# time there is (``past_the_years`` tells it from a deadline of that time).
NEVER = datetime.max.isoformat(timespec="microseconds") + "Z"
TIME_FORM = "%Y-%m-%dT%H:%M:%S.%fZ"  # the one text form of times (``timestamp``)


def deadline_after(since: str, max_disconnect: int | None) -> datetime | None:
    """``since`` + ``max_disconnect`` seconds; None past the year 9999."""
    try:
        return datetime.strptime(since, TIME_FORM) + timedelta(seconds=max_disconnect or 0)
    except OverflowError:
        return None


def past_the_years(since: str, max_disconnect: int | None) -> bool:
    """Whether a deadline falls past the year 9999: written ``NEVER``, it
    never expires, while a deadline of that very microsecond, written the
    same, expires once --now reaches it."""
    return deadline_after(since, max_disconnect) is None


def not_utf8(text: str) -> bool:
    """Whether a text from the system (argv, the environment) held bytes that
    are not UTF-8: Python keeps each as a lone surrogate."""
    return any("\ud800" <= char <= "\udfff" for char in text)


@dataclass(slots=True)
class Fact:
    """Where an event stands in history: its position, its ``at``, and the
    rules that decide it (or decided it, in a replay)."""

    position: int
    at: str
    rules: int = RULES


@dataclass(slots=True)
class Node:
    node: str
    slots: int
    parent: str | None = None
    status: str = "initializing"
    health: str = "ok"
    reason: str | None = None
    since_position: int = 0
    last_heartbeat_at: str | None = None
    last_heartbeat_position: int | None = None
    slots_used: int = 0
    allocs: int = 0
    lost_allocs: list[str] = field(default_factory=list)
    registered_position: int = 0
    health_reason: str | None = None  # why it is suspect (rules 3 on), down or not


@dataclass(slots=True)
class Slot:
    node: str
    slot: int
    state: str = "free"
    alloc: str | None = None
    since_position: int = 0
    reported_alloc: str | None = None
    reported_position: int | None = None

    @property
    def key(self) -> str:
        return f"{self.node}#{self.slot}"


@dataclass(slots=True)
class Allocation:
    alloc: str
    node: str
    job: str | None = None
    slot: int | None = None
    addresses: list[str] = field(default_factory=list)
    max_disconnect: int | None = None
    desired_status: str = "run"
    client_status: str = "pending"
    needs_reconnect: bool = False
    unknown_since_position: int | None = None
    unknown_since_at: str | None = None
    placed_position: int = 0
    updated_position: int = 0
    removed: bool = False

    @property
    def terminal(self) -> bool:
        return self.client_status in TERMINAL

    @property
    def deadline(self) -> str | None:
        """When the allocation stops waiting for its node: unknown_since_at + max_disconnect."""
        if not self.needs_reconnect or self.unknown_since_at is None:
            return None
        moment = deadline_after(self.unknown_since_at, self.max_disconnect)
        if moment is None:  # never, in the one text form
            return NEVER
        return moment.isoformat(timespec="microseconds") + "Z"

    def placement(self) -> tuple[object, ...]:
        return placement(self.node, self.slot, self.job, self.addresses, self.max_disconnect)


def placement(
    node: str, slot: int | None, job: str | None, addresses: list[str], max_disconnect: int | None
) -> tuple[object, ...]:
    """What placing an allocation fixes, to tell a retry from another
    placement."""
    return (node, slot, job, address_set(addresses), max_disconnect)


def address_set(addresses: list[str]) -> tuple[str, ...]:
    """An allocation's addresses as compared: a set, in any order (README)."""
    return tuple(sorted(addresses))


@dataclass(slots=True)
class AllocState:
    """One entry of an allocation's alloc states, appended by the ledger."""

    alloc: str
    value: str
    position: int
    at: str


@dataclass(slots=True)
class AddressHold:
    address: str
    alloc: str
    node: str
    state: str = "held"
    since_position: int = 0


@dataclass(slots=True)
class Rejection:
    position: int
    type: str
    entity: str
    reason: str
    # The refused event as the rejection log's ``event`` column holds it
    # (``rejected_json``): a 1 MiB slot report is 1 MB so, 8 MB as a dict,
    # and a replay holds every rejection until it writes them. (A checkpoint
    # kept before 2026-11-28 holds the event itself.)
    event: str | dict[str, object]
    at: str


def rejected_json(event: str | dict[str, object]) -> str:
    """A refused event in the rejection log's text form."""
    return event if isinstance(event, str) else json.dumps(event)


_ZERO = timedelta(0)
OUT_OF_YEARS = "outside the years 1 to 9999 in UTC"  # what ``timestamp`` cannot write


_TEXT_FORM = "%04d-%02d-%02dT%02d:%02d:%02d.%06dZ"
_ZEROS = "000000"


# RFC 3339 (section 5.6): date, T (or t, or a space), time with seconds, an
# optional fraction, and a zone: Z or an offset with a colon, hours 00-23
# and minutes 00-59 (``fromisoformat`` would read +05:60 as +06:00). ASCII
# digits only: ``\d`` also matches other scripts' digits. The date's and the
# time's fields are checked by ``fromisoformat``, which names the one out of
# range (month must be in 1..12).
_DATE_TIME = r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]+)?"
_OFFSET = r"[+-](?:[01][0-9]|2[0-3]):[0-5][0-9]"
RFC3339 = rf"^{_DATE_TIME}(?:[Zz]|{_OFFSET})$"
_WITH_ZONE, _WITHOUT_ZONE = re.compile(RFC3339), re.compile(_DATE_TIME)

# The same times as one pattern with every field in range, days of the month
# and leap years too, for JSON Schema validators (the years 1 to 9999 as
# written: an offset may still move one past 9999 or before 1 in UTC).
_YEAR = r"(?:[0-9]{3}[1-9]|[0-9]{2}[1-9][0-9]|[0-9][1-9][0-9]{2}|[1-9][0-9]{3})"
_LEAP_YEAR = r"(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)"
_MONTH_DAY = (
    r"(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])"
    r"|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)|02-(?:0[1-9]|1[0-9]|2[0-8]))"
)
_TIME = r"(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]+)?"
RFC3339_IN_RANGE = (
    rf"^(?:{_YEAR}-{_MONTH_DAY}|{_LEAP_YEAR}-02-29)[Tt ]{_TIME}(?:[Zz]|{_OFFSET})$"
)
NEEDS_ZONE = "needs a time zone (Z or +hh:mm)"
EXAMPLE_TIME = "2026-01-01T12:00:00Z"
NOT_RFC3339 = f"must be an RFC 3339 time with a zone, e.g. {EXAMPLE_TIME}"


def moment_of_form(text: str) -> datetime:
    """The moment of a text of RFC 3339's form (``RFC3339``); ValueError for
    a field out of range (month 13). ``fromisoformat`` reads every such form
    but lower case ``t`` and ``z``."""
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return datetime.fromisoformat(text.upper())


def kept_time(text: str) -> str:
    """The one text form (``timestamp``) of a text of RFC 3339's form;
    ValueError for a field out of range (month 13), OverflowError for a
    moment outside the years 1 to 9999 in UTC. A UTC time written with ``T``
    and ``Z``, as nearly every event's is, is padded as text once its fields
    are checked: reading it into a datetime and writing it out again took
    three times as long."""
    if text[-1] == "Z" and text[10] == "T" and text[11:13] != "24":  # 24:00 is read from 3.14 on
        datetime.fromisoformat(text[:-1])  # every field in range (a time without a zone)
        digits = len(text) - 21  # of the fraction; -1: none (nor its point)
        if digits >= 6:  # those past the sixth dropped, as fromisoformat drops them
            return text[:26] + "Z"
        if digits < 0:
            return text[:-1] + ".000000Z"
        return text[:-1] + _ZEROS[digits:] + "Z"
    return timestamp(moment_of_form(text))


def rfc3339_problem(text: object) -> str:
    """What keeps a value from being an RFC 3339 time with a zone."""
    if isinstance(text, str) and _WITH_ZONE.fullmatch(text):
        try:
            moment_of_form(text)
        except ValueError as error:
            if str(error) == "second must be in 0..59" and text[17:19] == "60":
                return f"{error} (the ledger's times have no leap second :60; write :59.999999)"
            return str(error)  # month must be in 1..12
    elif isinstance(text, str) and _WITHOUT_ZONE.fullmatch(text):
        return NEEDS_ZONE
    return NOT_RFC3339


def rfc3339(text: object) -> datetime:
    """An RFC 3339 time with a zone; ValueError saying what is wrong otherwise."""
    if isinstance(text, str) and _WITH_ZONE.fullmatch(text):
        try:
            return moment_of_form(text)
        except ValueError:
            pass
    raise ValueError(rfc3339_problem(text))


def timestamp(moment: datetime) -> str:
    """One fixed-width UTC text form, so text order is time order in SQL.
    Written from the fields: ``isoformat`` would ask pydantic's time zone of
    a validated ``at`` for its offset again, and take twice as long."""
    if moment.utcoffset() != _ZERO:
        moment = moment.astimezone(UTC)
    return _TEXT_FORM % (
        moment.year, moment.month, moment.day,
        moment.hour, moment.minute, moment.second, moment.microsecond,
    )


class Receipt(NamedTuple):
    """What became of one submitted event (a tuple: a frozen dataclass took
    twice as long to build, once per event)."""

    status: str  # appended | duplicate | rejected | invalid
    position: int | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        """Whether the event took effect: appended, or a retry of one that was
        (a retry of a rejected event is a duplicate with the rejection as error)."""
        return self.status == "appended" or (self.status == "duplicate" and self.error is None)

    def as_dict(self) -> dict[str, Any]:
        return {"status": self.status, "position": self.position, "error": self.error}


def valid_of(parsed: list[Event | Receipt]) -> list[Event]:
    """The events of a parsed batch that go on to be decided (not the invalid)."""
    return [p for p in parsed if not isinstance(p, Receipt)]


def answered(parsed: list[Event | Receipt], decided: list[Receipt]) -> list[Receipt]:
    """Every item's receipt: an invalid one's own, the others' from ``decided``
    (the receipts of ``valid_of(parsed)``, in order)."""
    answers = iter(decided)
    return [p if isinstance(p, Receipt) else next(answers) for p in parsed]
