"""A small model of the SPEC's rules, independent of ``ledger.domain``, and a
generator of event streams guided by it, for the property tests
(``tests/unit/test_properties.py``, ``tests/integration/test_properties_pg.py``).

``Model`` is written from SPEC sections 2 and 3 and the README's "Choices
where the SPEC is silent", not from the code: it keeps plain records of
nodes and allocations and *derives* what the ledger keeps incrementally
(who holds a slot or an address, how many allocations a node runs, which
reported slots are zombies), so a bookkeeping slip in the ledger shows up as
a difference. For every submission it says what the receipt must be
(status, position, and for a rejection every rule the event breaks, one of
which the reason must name).

``scenarios()`` draws a stream: registered, ready nodes (some under a parent
chain), then mostly placements, status updates and heartbeats, with kills
rare, slot reports (true and zombie), client ids and retries, ``at`` out of
order, ``source``, shared addresses and slots, disconnects and reconnects,
and a sprinkle of invalid input. Choices lean on the model's state (a
heartbeat goes to a node that is not ready, an update to an allocation that
waits to reconnect), so the rare states are reached, not hoped for.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from hypothesis import HealthCheck, Phase, event, given, seed, settings
from hypothesis import strategies as st

TERMINAL = frozenset({"complete", "failed", "lost"})
DESIRED = ("run", "stop", "remove")
# exclusive names, compared as written: 10.0.0.01 is not 10.0.0.1
ADDRESSES = ("10.0.0.1", "10.0.0.2", "10.0.0.3", "fe80::1", "10.0.0.1:80", "10.0.0.01")
BASE = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
ZONES = (UTC, UTC, UTC, timezone(timedelta(hours=2)), timezone(-timedelta(hours=5, minutes=30)))

# Each rule a rejection can name, and how its reason reads (SPEC section 2).
REASONS: dict[str, re.Pattern[str]] = {
    kind: re.compile(pattern)
    for kind, pattern in {
        "node-not-registered": r"^node .+ is not registered$",
        "node-already-registered": r"^node .+ is already registered$",
        "node-removed": r"^node .+ has been removed$",
        "parent-unavailable": r"^parent node .+ is ",
        "slot-report-invalid": r"^slot report ",
        "node-not-ready": r"^node .+ is not ready",
        "node-suspect": r"^node .+ is suspect",
        "slot-out-of-range": r"^slot .+ is out of range",
        "slot-held": r"^slot .+ is already held by allocation .+$",
        "address-held": r"^address .+ is still held by allocation .+, which has not shut down$",
        "alloc-exists": r"^allocation .+ (already holds slot|is already placed on node|was already placed)",
        "alloc-not-placed": r"^allocation .+ is not placed$",
        "alloc-removed": r"^allocation .+ has been removed$",
        "node-may-not-update": r"^node .+ is not allowed to update allocs while in status \w+$",
        "terminal-final": r"a terminal status never changes$",
        "desired-backwards": r"desired status only moves forward",
        "removed-before-shutdown": r"removing it now would free .* before it shuts down$",
    }.items()
}
INVALID_KINDS = ("unknown-field", "wrong-type", "unknown-type", "missing-field", "bad-json",
                 "bad-value")


def kind_of(reason: str) -> str | None:
    """The rule a rejection's reason names (None: a reason the SPEC has no rule for)."""
    found = [kind for kind, pattern in REASONS.items() if pattern.search(reason)]
    return found[0] if len(found) == 1 else None


RFC3339 = re.compile(
    r"(\d{4})-(\d\d)-(\d\d)[Tt ](\d\d):(\d\d):(\d\d)(?:\.(\d+))?(?:[Zz]|([+-])(\d\d):(\d\d))")


def normal_at(text: str) -> str:
    """An RFC 3339 time in the ledger's one text form: UTC, the fraction kept
    to the microsecond (README: "Times are RFC 3339 with a zone")."""
    found = RFC3339.fullmatch(text)
    assert found is not None, text
    year, month, day, hour, minute, second, fraction, sign, zh, zm = found.groups()
    zone = UTC if sign is None else timezone(
        (1 if sign == "+" else -1) * timedelta(hours=int(zh), minutes=int(zm)))
    micro = int((fraction or "").ljust(6, "0")[:6])
    moment = datetime(int(year), int(month), int(day), int(hour), int(minute), int(second), micro,
                      tzinfo=zone).astimezone(UTC)
    return f"{moment.year:04d}-" + moment.strftime("%m-%dT%H:%M:%S.%fZ")


# -- the model -------------------------------------------------------------------


@dataclass
class MNode:
    name: str
    slots: int
    parent: str | None
    status: str = "initializing"
    health: str = "ok"
    reported: dict[int, str] = field(default_factory=dict)  # the last slot report
    heartbeat: tuple[int, str | None] | None = None  # (position, at) of the last one
    registered: int = 0
    # since_position, "last status or health change": whether a suspicion of a
    # node already suspect is such a change, the README does not say
    since: int = 0  # read strictly: no
    since_suspected: int = 0  # or yes
    seen: tuple[str, str] = ("initializing", "ok")
    reported_since: dict[int, int] = field(default_factory=dict)  # reported_position
    down_reason: Any = None  # why it went down (SOME: a text the README does not fix)
    health_reason: str | None = None  # why it is suspect
    lost: list[str] = field(default_factory=list)  # what it lost since it was last ready

    @property
    def reason(self) -> Any:
        """README: why it is down while down (a removed node: if it was down
        when removed), why it is suspect otherwise."""
        if self.status in ("down", "removed"):
            return self.down_reason
        return self.health_reason if self.health == "suspect" else None


@dataclass
class MAlloc:
    name: str
    node: str
    job: str | None
    slot: int | None
    addresses: tuple[str, ...]  # sorted: a set
    max_disconnect: int | None
    placed: int
    desired: str = "run"
    client: str = "pending"
    waiting: bool = False  # needs to reconnect
    unknown_since: tuple[int, str | None] | None = None
    removed: bool = False
    states: list[tuple[int, str, str | None]] = field(default_factory=list)  # (position, value, at)

    @property
    def terminal(self) -> bool:
        return self.client in TERMINAL

    def placement(self) -> tuple[Any, ...]:
        return (self.node, self.slot, self.job, self.addresses, self.max_disconnect)


@dataclass(frozen=True)
class Outcome:
    status: str  # appended | duplicate | rejected | invalid
    position: int | None = None
    kinds: frozenset[str] = frozenset()  # a rejection: every rule the event breaks


class Model:
    """The cluster as SPEC section 2 and the README's choices say it evolves."""

    def __init__(self) -> None:
        self.nodes: dict[str, MNode] = {}
        self.allocs: dict[str, MAlloc] = {}
        self.ids: dict[str, tuple[int, dict[str, Any], frozenset[str]]] = {}  # id -> first
        self.head = 0
        self.kept: list[tuple[int, str | None]] = []  # (position, normalized at or None: now)
        self.rejections: dict[int, tuple[str, str | None]] = {}  # position -> (type, at)
        self.reached: Counter[str] = Counter()  # what the stream got to, for coverage
        self.latest_at = ""
        # since_position of slots and addresses: when what the row says last changed
        self.slot_since: dict[tuple[str, int], tuple[tuple[str, str | None], int]] = {}
        self.address_since: dict[str, tuple[tuple[str, str], int]] = {}

    # -- derived state ----------------------------------------------------------

    def live(self, node: str | None = None) -> list[MAlloc]:
        return [a for a in self.allocs.values()
                if not a.terminal and (node is None or a.node == node)]

    def holder(self, node: str, slot: int) -> MAlloc | None:
        found = [a for a in self.live(node) if a.slot == slot]
        assert len(found) <= 1, f"the model let two allocations hold {node}#{slot}: {found}"
        return found[0] if found else None

    def address_holder(self, address: str) -> MAlloc | None:
        found = [a for a in self.live() if address in a.addresses]
        assert len(found) <= 1, f"the model let two allocations hold {address}"
        return found[0] if found else None

    def chain_gone(self, node: MNode) -> bool:
        """Whether a node of its parent chain is down or removed."""
        name = node.parent
        while name is not None:
            parent = self.nodes[name]
            if parent.status in ("down", "removed"):
                return True
            name = parent.parent
        return False

    def zombies(self) -> dict[tuple[str, int], tuple[str, str]]:
        """(node, slot) -> (alloc, reason): the README's zombie reasons, in order."""
        found = {}
        for node in self.nodes.values():
            if node.status == "removed":
                continue  # its last report is no zombie: the node is gone
            counts = Counter(node.reported.values())
            for slot, name in node.reported.items():
                alloc = self.allocs.get(name)
                bound = alloc is not None and alloc.node == node.name and alloc.slot == slot
                if alloc is None:
                    reason = "unknown-alloc"
                elif alloc.removed or alloc.terminal:
                    reason = "released"
                elif counts[name] > 1 and not bound:
                    reason = "duplicate"
                elif not bound:
                    reason = "moved"
                else:
                    continue
                found[(node.name, slot)] = (name, reason)
        return found

    def as_of_time(self, moment: str) -> int:
        """The position ``--as-of TIMESTAMP`` answers: the longest prefix of the
        log whose every ``at`` is at or before it (no ``at``: the time received,
        before now)."""
        now = normal_at(datetime.now(UTC).isoformat())
        position = 0
        for kept, at in self.kept:
            if (at or now) > moment:
                break
            position = kept
        return position

    # -- deciding ----------------------------------------------------------------

    def submit(self, event: dict[str, Any] | None) -> Outcome:
        """What the ledger must answer to one submission (None: invalid input)."""
        if event is None:
            self.reached["invalid"] += 1
            return Outcome("invalid")
        event = {k: v for k, v in event.items() if v is not None}
        ident = event.get("id")
        if ident is not None and ident in self.ids:
            position, first, broken_first = self.ids[ident]
            if not same_event(event, first):  # README: another event under a kept id
                self.reached["invalid:id used again"] += 1
                return Outcome("invalid")
            self.reached["duplicate:id of a rejection" if broken_first else "duplicate:id"] += 1
            return Outcome("duplicate", position, broken_first)  # kinds: it was rejected
        kind = event["type"]
        if kind == "alloc-placed" and (same := self.same_placement(event)) is not None:
            # A retry of an accepted placement; its own id is not recorded (README).
            self.reached["duplicate:placement"] += 1
            return Outcome("duplicate", same)
        broken = self.broken(event)
        self.head += 1
        position = self.head
        at = normal_at(event["at"]) if "at" in event else None
        if at is not None:
            if at < self.latest_at:
                self.reached["at out of order"] += 1
            self.latest_at = max(self.latest_at, at)
        self.kept.append((position, at))
        if ident is not None:
            self.ids[ident] = (position, event, frozenset(broken))
        if broken:
            self.rejections[position] = (kind, at)
            for rule in broken:
                self.reached[f"rejected:{rule}"] += 1
            return Outcome("rejected", position, frozenset(broken))
        getattr(self, "on_" + kind.replace("-", "_"))(event, position, at)
        self.track(position)
        self.note()
        return Outcome("appended", position)

    def same_placement(self, event: dict[str, Any]) -> int | None:
        existing = self.allocs.get(event["alloc"])
        wanted = (event["node"], event.get("slot"), event.get("job"),
                  tuple(sorted(event.get("addresses") or ())), event.get("max_disconnect"))
        if existing is not None and existing.placement() == wanted:
            return existing.placed
        return None

    def broken(self, event: dict[str, Any]) -> list[str]:
        """Every rule of SPEC section 2 the event breaks (empty: it is appended)."""
        kind = event["type"]
        if kind == "node-registered":
            found = ["node-already-registered"] if event["node"] in self.nodes else []
            parent = self.nodes.get(event.get("parent", ""))
            if "parent" in event and (parent is None or parent.status in ("down", "removed")):
                found.append("parent-unavailable")
            return found
        if kind in ("heartbeat", "heartbeat-missed", "node-down", "node-removed",
                    "node-suspected", "health-checked"):
            node = self.nodes.get(event["node"])
            if node is None:
                return ["node-not-registered"]
            if node.status == "removed":
                return ["node-removed"]
            if kind == "heartbeat" and "slots" in event:
                indexes = [entry["slot"] for entry in event["slots"]]
                if len(set(indexes)) < len(indexes) or any(
                        not 0 <= i < node.slots for i in indexes):
                    return ["slot-report-invalid"]
            return []
        if kind == "alloc-placed":
            return self.placement_broken(event)
        alloc = self.allocs.get(event["alloc"])
        if alloc is None:
            return ["alloc-not-placed"]
        if alloc.removed:
            return ["alloc-removed"]
        found = []
        if kind == "alloc-updated":
            if self.nodes[alloc.node].status in ("disconnected", "down", "removed"):
                found.append("node-may-not-update")
            if alloc.terminal:
                found.append("terminal-final")
        elif kind == "alloc-stop-requested" and alloc.desired == "remove":
            found.append("desired-backwards")
        elif kind == "alloc-removed" and not alloc.terminal:
            found.append("removed-before-shutdown")
        return found

    def placement_broken(self, event: dict[str, Any]) -> list[str]:
        found = ["alloc-exists"] if event["alloc"] in self.allocs else []
        node = self.nodes.get(event["node"])
        if node is None:
            return [*found, "node-not-registered"]
        if node.status == "removed":
            found.append("node-removed")
        if node.status != "ready":
            found.append("node-not-ready")
        if node.health == "suspect":
            found.append("node-suspect")
        slot = event.get("slot")
        if slot is not None and not 0 <= slot < node.slots:
            found.append("slot-out-of-range")
        elif slot is not None and self.holder(node.name, slot) is not None:
            found.append("slot-held")
        if any(self.address_holder(a) is not None for a in event.get("addresses") or ()):
            found.append("address-held")
        return found

    # -- effects of appended events ------------------------------------------------

    def on_node_registered(self, event: dict[str, Any], position: int, at: str | None) -> None:
        self.nodes[event["node"]] = MNode(
            event["node"], event.get("slots", 0), event.get("parent"), registered=position,
            since=position, since_suspected=position)

    def on_heartbeat(self, event: dict[str, Any], position: int, at: str | None) -> None:
        node = self.nodes[event["node"]]
        if node.status in ("initializing", "disconnected"):
            waiting = any(a.waiting for a in self.live(node.name))
            if node.status == "disconnected":
                self.reached["heartbeat after a disconnect"] += 1
                if waiting:
                    self.reached["node initializing, allocations to reconnect"] += 1
            self.set_status(node, "initializing" if waiting else "ready")
        elif node.status == "down":
            if self.chain_gone(node):
                self.reached["heartbeat of a node whose parent is gone"] += 1
            else:
                self.set_status(node, "ready")
                self.reached["down node back"] += 1
        node.heartbeat = (position, at)
        if "slots" in event:
            reported = {e["slot"]: e["alloc"] for e in event["slots"] if e["alloc"] is not None}
            for index in range(node.slots):  # since when it reports what it reports
                if index not in node.reported_since or (
                        reported.get(index) != node.reported.get(index)):
                    node.reported_since[index] = position
            node.reported = reported

    def on_heartbeat_missed(self, event: dict[str, Any], position: int, at: str | None) -> None:
        node = self.nodes[event["node"]]
        if node.status not in ("ready", "initializing"):
            return
        live = self.live(node.name)
        if not any(a.max_disconnect is not None and a.desired == "run" for a in live):
            self.take_down(node, position, at, reason=SOME)  # as node-down
            return
        node.status = "disconnected"
        self.reached["node disconnected"] += 1
        for alloc in live:
            if alloc.waiting:  # README: already unknown allocations stay unknown
                self.reached["still unknown at a second disconnect"] += 1
            elif alloc.client == "running" and alloc.max_disconnect is not None:
                alloc.client = "unknown"
                alloc.waiting = True
                alloc.unknown_since = (position, at)
                alloc.states.append((position, "unknown", at))
                self.reached["alloc unknown"] += 1
            else:
                self.lose(alloc, position, at)
                node.lost.append(alloc.name)
                self.reached["lost at a disconnect"] += 1

    def on_node_down(self, event: dict[str, Any], position: int, at: str | None) -> None:
        node = self.nodes[event["node"]]
        if node.status != "down":
            self.take_down(node, position, at, reason=event.get("reason"))

    def on_node_removed(self, event: dict[str, Any], position: int, at: str | None) -> None:
        node = self.nodes[event["node"]]
        # README: it keeps the reason it went down for if it was down, else none
        reason = node.down_reason if node.status == "down" else None
        self.take_down(node, position, at, "removed", reason)

    def on_node_suspected(self, event: dict[str, Any], position: int, at: str | None) -> None:
        node = self.nodes[event["node"]]
        node.since_suspected = position
        node.health = "suspect"
        node.health_reason = event["reason"]

    def on_health_checked(self, event: dict[str, Any], position: int, at: str | None) -> None:
        node = self.nodes[event["node"]]
        if event["passed"]:
            node.health = "ok"
            node.health_reason = None
        elif node.status != "down":  # recycled: as node-down
            self.take_down(node, position, at, reason="health check failed")

    def on_alloc_placed(self, event: dict[str, Any], position: int, at: str | None) -> None:
        alloc = MAlloc(
            event["alloc"], event["node"], event.get("job"), event.get("slot"),
            tuple(sorted(event.get("addresses") or ())), event.get("max_disconnect"), position,
        )
        self.allocs[alloc.name] = alloc

    def on_alloc_updated(self, event: dict[str, Any], position: int, at: str | None) -> None:
        alloc = self.allocs[event["alloc"]]
        node = self.nodes[alloc.node]
        status = event["client_status"]
        if alloc.waiting:
            alloc.waiting = False
            alloc.unknown_since = None
            alloc.states.append((position, status, at))
            self.reached["reconnected"] += 1
        if node.status == "initializing":
            self.set_status(node, "ready")
        alloc.client = status
        if status == "failed" and event.get("blame", "node") == "node":
            node.since_suspected = position
            node.health = "suspect"
            node.health_reason = SOME  # the README does not word it
            self.reached["suspect by a failed allocation"] += 1

    def on_alloc_stop_requested(self, event: dict[str, Any], position: int, at: str | None) -> None:
        self.desire(self.allocs[event["alloc"]], "stop")

    def on_alloc_remove_requested(self, event: dict[str, Any], position: int,
                                  at: str | None) -> None:
        self.desire(self.allocs[event["alloc"]], "remove")

    def on_alloc_removed(self, event: dict[str, Any], position: int, at: str | None) -> None:
        self.allocs[event["alloc"]].removed = True
        self.reached["alloc removed"] += 1

    # -- helpers -------------------------------------------------------------------

    @staticmethod
    def desire(alloc: MAlloc, desired: str) -> None:
        """Desired status only moves forward (run -> stop -> remove)."""
        if DESIRED.index(desired) > DESIRED.index(alloc.desired):
            alloc.desired = desired

    def lose(self, alloc: MAlloc, position: int, at: str | None) -> None:
        alloc.client = "lost"
        alloc.waiting = False
        alloc.unknown_since = None
        self.desire(alloc, "stop")
        alloc.states.append((position, "lost", at))

    @staticmethod
    def set_status(node: MNode, status: str) -> None:
        if status == "ready":
            node.lost = []  # README: ready again, the list starts over
        node.status = status

    def take_down(self, node: MNode, position: int, at: str | None, status: str = "down",
                  reason: Any = None) -> None:
        """node-down (or node-removed): lose what it runs, then every descendant."""
        for alloc in self.live(node.name):
            self.lose(alloc, position, at)
            node.lost.append(alloc.name)
        node.status = status
        node.down_reason = reason
        self.cascade(node.name, position, at, status == "removed")

    def cascade(self, name: str, position: int, at: str | None, removed: bool) -> None:
        for child in [n for n in self.nodes.values() if n.parent == name]:
            if child.status in ("down", "removed"):
                self.cascade(child.name, position, at, removed)  # README: behind a down child too
            else:
                self.reached["cascade"] += 1
                # README: children of a removed node go down (reason `parent n1 was
                # removed`), not removed themselves.
                why = f"parent {name} was removed" if removed and child.parent == name else SOME
                self.take_down(child, position, at, reason=why)

    def track(self, position: int) -> None:
        """since_position: where each node's status or health, each slot's state
        or holder, each address's holder or state last changed."""
        for node in self.nodes.values():
            if (node.status, node.health) != node.seen:
                node.seen = (node.status, node.health)
                node.since = node.since_suspected = position
        slots = self.slot_rows()
        for key, row in slots.items():
            if self.slot_since.get(key, (None,))[0] != row:
                self.slot_since[key] = (row, position)
        addresses = self.address_rows()
        self.address_since = {
            address: (row, position if self.address_since.get(address, (None,))[0] != row
                      else self.address_since[address][1])
            for address, row in addresses.items()
        }

    def slot_rows(self) -> dict[tuple[str, int], tuple[str, str | None]]:
        """(node, slot) -> (state, holder), as history says."""
        rows = {}
        for node in self.nodes.values():
            for index in range(node.slots):
                holder = self.holder(node.name, index)
                state = "free" if holder is None else (
                    "active" if holder.client in ("running", "unknown") else "allocated")
                rows[(node.name, index)] = (state, holder and holder.name)
        return rows

    def address_rows(self) -> dict[str, tuple[str, str]]:
        """address -> (holder, held or releasing): held from placement until terminal."""
        return {
            address: (alloc.name, "held" if alloc.desired == "run" else "releasing")
            for alloc in self.live() for address in alloc.addresses
        }

    def note(self) -> None:
        """Count the states the stream has reached (for coverage)."""
        for alloc in self.allocs.values():
            self.reached[f"alloc {alloc.client}"] += 1
            if alloc.desired != "run" and not alloc.terminal and alloc.addresses:
                self.reached["address releasing"] += 1
        for node in self.nodes.values():
            self.reached[f"node {node.status}"] += 1
            if node.health == "suspect":
                self.reached["node suspect"] += 1
        for _, reason in self.zombies().values():
            self.reached[f"zombie {reason}"] += 1
        if any(len(a.addresses) > 1 for a in self.live()):
            self.reached["two addresses held"] += 1

    # -- what the tables must hold ---------------------------------------------------

    def tables(self) -> dict[str, dict[Any, Any]]:
        """The projection rows the model implies, keyed as ``read_tables`` reads them."""
        nodes = {}
        for node in self.nodes.values():
            live = self.live(node.name)
            beat = node.heartbeat or (None, None)
            nodes[node.name] = {
                "status": node.status, "health": node.health, "parent": node.parent,
                "slots": node.slots, "allocs": len(live),
                "slots_used": sum(1 for a in live if a.slot is not None),
                "last_heartbeat_position": beat[0], "last_heartbeat_at": None if node.heartbeat is None else beat[1] or ANY,
                "reason": node.reason, "health_reason": node.health_reason,
                "lost_allocs": sorted(node.lost), "registered_position": node.registered,
                "since_position": OneOf(node.since, node.since_suspected),
            }
        slots = {}
        for (name, index), (state, holder) in self.slot_rows().items():
            node = self.nodes[name]
            slots[(name, index)] = {
                "state": state, "alloc": holder, "since_position": self.slot_since[(name, index)][1],
                "reported_alloc": node.reported.get(index),
                "reported_position": node.reported_since.get(index),
            }
        allocs = {}
        for alloc in self.allocs.values():
            since = alloc.unknown_since or (None, None)
            deadline: Any = None  # unknown_since_at + max_disconnect, while it waits
            if since[0] is not None and since[1] is None:
                deadline = ANY
            elif since[1] is not None:
                moment = datetime.strptime(since[1], "%Y-%m-%dT%H:%M:%S.%fZ")
                try:
                    moment += timedelta(seconds=alloc.max_disconnect or 0)
                    deadline = f"{moment.year:04d}-" + moment.strftime("%m-%dT%H:%M:%S.%fZ")
                except OverflowError:
                    deadline = SOME  # past the year 9999: the SPEC has no such time
            allocs[alloc.name] = {
                "node": alloc.node, "job": alloc.job, "slot": alloc.slot,
                "addresses": list(alloc.addresses), "max_disconnect": alloc.max_disconnect,
                "desired_status": alloc.desired, "client_status": alloc.client,
                "needs_reconnect": alloc.waiting, "removed": alloc.removed,
                "placed_position": alloc.placed,
                "unknown_since_position": since[0],
                "unknown_since_at": ANY if since[0] is not None and since[1] is None else since[1],
                "deadline": deadline,
            }
        addresses = {
            address: {"alloc": holder, "node": self.allocs[holder].node, "state": state,
                      "since_position": self.address_since[address][1]}
            for address, (holder, state) in self.address_rows().items()
        }
        states = {
            (alloc.name, position): {"value": value, "at": at or ANY}
            for alloc in self.allocs.values() for position, value, at in alloc.states
        }
        rejections = {p: {"type": t, "at": at or ANY} for p, (t, at) in self.rejections.items()}
        zombies = {key: {"alloc": a, "reason": r, "position": self.nodes[key[0]].reported_since[key[1]]}
                   for key, (a, r) in self.zombies().items()}
        reconnect = {a.name: {"node": a.node} for a in self.allocs.values() if a.waiting}
        return {
            "nodes": nodes, "slots": slots, "allocations": allocs, "addresses": addresses,
            "alloc_states": states, "rejections": rejections, "zombie_slots": zombies,
            "needs_reconnect": reconnect,
        }


class _Any:
    """A value the model does not know (an ``at`` left to the time received)."""

    def __repr__(self) -> str:
        return "ANY"


class _Some(_Any):
    """Some text, worded as the ledger likes (the README does not fix it)."""

    def __repr__(self) -> str:
        return "SOME"


class OneOf(_Any):
    """One of a few values (where the README allows more than one reading)."""

    def __init__(self, *values: Any) -> None:
        self.values = set(values)

    def __repr__(self) -> str:
        return " or ".join(map(repr, sorted(self.values))) if len(self.values) > 1 else repr(
            next(iter(self.values)))


ANY: Any = _Any()
SOME: Any = _Some()


# -- reading a store -------------------------------------------------------------


COLUMNS = (  # (table or view, its columns read, how many of them make the key)
    ("nodes", ("node, status, health, parent, slots, allocs, slots_used,"
               " last_heartbeat_position, last_heartbeat_at, reason, health_reason, lost_allocs,"
               " registered_position, since_position"), 1),
    ("slots", "node, slot, state, alloc, since_position, reported_alloc, reported_position", 2),
    ("allocations", ("alloc, node, job, slot, addresses, max_disconnect, desired_status,"
                     " client_status, needs_reconnect, removed, placed_position,"
                     " unknown_since_position, unknown_since_at, deadline"), 1),
    ("addresses", "address, alloc, node, state, since_position", 1),
    ("alloc_states", "alloc, position, value, at", 2),
    ("rejections", "position, type, at", 1),
    ("zombie_slots", "node, slot, alloc, reason, position", 2),
    ("needs_reconnect", "alloc, node", 1),
)


class Scratch:
    """An in-memory SQLite database of projection tables (``asof.materialize``),
    read as a store is."""

    def __init__(self, connection: Any) -> None:
        self.connection = connection

    @contextmanager
    def reading(self) -> Iterator[Any]:
        yield self.connection.cursor()


def read_tables(store: Any) -> dict[str, dict[Any, Any]]:
    """The projection tables of a store, in ``Model.tables`` form, by plain SQL."""
    found: dict[str, dict[Any, Any]] = {}
    with store.reading() as cursor:
        for table, columns, width in COLUMNS:
            cursor.execute(f"SELECT {columns} FROM {table}")
            names = [d[0] for d in cursor.description]
            rows = {}
            fetched = cursor.fetchall()
            for row in fetched:
                values = dict(zip(names, row, strict=True))
                key = tuple(values.pop(n) for n in names[:width])
                rows[key[0] if width == 1 else key] = values
            assert len(rows) == len(fetched), f"{table} has two rows under one key"
            found[table] = rows
    for row in found["nodes"].values():
        row["lost_allocs"] = sorted(json.loads(row["lost_allocs"]))
    for row in found["allocations"].values():
        row["addresses"] = sorted(json.loads(row["addresses"]))
        row["needs_reconnect"] = bool(row["needs_reconnect"])
        row["removed"] = bool(row["removed"])
    return found


def differences(expected: dict[str, dict[Any, Any]], found: dict[str, dict[Any, Any]],
                ) -> list[str]:
    """Each way the tables differ from the model, one line each (ANY matches anything)."""
    lines = []
    for table, rows in expected.items():
        got = found[table]
        for key in sorted(rows.keys() - got.keys(), key=repr):
            lines.append(f"{table} {key}: missing (the model has {rows[key]})")
        for key in sorted(got.keys() - rows.keys(), key=repr):
            lines.append(f"{table} {key}: unexpected {got[key]}")
        for key in sorted(rows.keys() & got.keys(), key=repr):
            for column, value in rows[key].items():
                if value is SOME and isinstance(got[key][column], str) and got[key][column]:
                    continue
                if isinstance(value, OneOf):
                    if got[key][column] not in value.values:
                        lines.append(f"{table} {key}: {column} is {got[key][column]!r}, "
                                     f"the model says {value!r}")
                    continue
                if value is not ANY and got[key][column] != value:
                    lines.append(f"{table} {key}: {column} is {got[key][column]!r}, "
                                 f"the model says {value!r}")
    return lines


DEFAULTS = {"node-registered": {"slots": 0}, "alloc-updated": {"blame": "node"}}


def same_event(retry: dict[str, Any], first: dict[str, Any]) -> bool:
    """README: a retry repeats the event kept under its id, defaults spelled
    out or not; leaving ``at`` out repeats whatever time it was kept with."""
    def fields(event: dict[str, Any]) -> dict[str, Any]:
        full = DEFAULTS.get(event["type"], {}) | event
        if "at" in full:
            full["at"] = normal_at(full["at"])
        return full
    mine, kept = fields(retry), fields(first)
    if "at" not in mine:
        kept.pop("at", None)
    elif "at" not in kept:
        return False  # stamped with the time it was received, never a given one
    return mine == kept


def check_receipt(outcome: Outcome, receipt: Any, what: str) -> None:
    """A receipt agrees with the model's outcome (the reason names a broken rule)."""
    assert receipt.status == outcome.status, (
        f"{what}: {receipt.status} ({receipt.error}), the model says {outcome.status} "
        f"{sorted(outcome.kinds)}")
    if outcome.status == "invalid":
        assert receipt.position is None and receipt.error, what
        return
    assert receipt.position == outcome.position, (
        f"{what}: position {receipt.position}, the model says {outcome.position}")
    if outcome.status == "duplicate":  # of a rejection (kinds): carrying it
        assert (receipt.error is not None) == bool(outcome.kinds), (
            f"{what}: duplicate with error {receipt.error!r}, the model says {outcome.kinds}")
    if outcome.kinds:
        assert receipt.error is not None
        reason = re.sub(r"^rejected at position \d+: ", "", receipt.error)
        assert kind_of(reason) in outcome.kinds, (
            f"{what}: rejected for {receipt.error!r} ({kind_of(receipt.error)}), "
            f"the model says {sorted(outcome.kinds)}")


# -- the generator -----------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """One submission: what is sent, and the event the model reads (None: invalid)."""

    submission: Any  # a dict, or JSON text
    event: dict[str, Any] | None
    label: str  # the action that made it (or the kind of invalid input)


class Scenario:
    """A stream of steps, submitted in batches of ``sizes`` (repeated as needed)
    by one ledger, or by a new one (``Ledger.open`` again, its caches cold)
    after each batch whose index is in ``reopen``."""

    def __init__(self, steps: list[Step], sizes: list[int],
                 reopen: frozenset[int] = frozenset()) -> None:
        self.steps = steps
        self.sizes = sizes
        self.reopen = reopen

    def batches(self) -> Iterator[list[Step]]:
        steps = iter(self.steps)
        for index in range(len(self.steps)):
            batch = [s for _, s in zip(range(self.sizes[index % len(self.sizes)]), steps,
                                       strict=False)]
            if not batch:
                return
            yield batch

    def __repr__(self) -> str:  # what a failing example prints: the stream, one a line
        lines = [f"{s.submission!r},  # {s.label}" for s in self.steps]
        return "Scenario(sizes={}, reopen={}, steps=[\n  {}\n])".format(
            self.sizes, sorted(self.reopen), "\n  ".join(lines))


class Generator:
    """Draws one stream, step by step, asking the model where things stand."""

    def __init__(self, draw: st.DrawFn) -> None:
        self.draw = draw
        self.model = Model()
        self.steps: list[Step] = []
        self.ids = 0
        self.names = 0  # nodes registered (n1, n2, ...)
        self.allocs = 0  # allocations named (a1, a2, ...)
        self.clock = 0
        self.force_id: str | None = None

    # -- choosing --------------------------------------------------------------

    def pct(self, percent: int) -> bool:
        """True with this chance (shrinks to False)."""
        return self.draw(st.integers(0, 99)) >= 100 - percent

    def pick(self, items: list[Any] | tuple[Any, ...]) -> Any:
        return self.draw(st.sampled_from(list(items)))

    def node_names(self, *statuses: str) -> list[str]:
        return [n.name for n in self.model.nodes.values() if not statuses or n.status in statuses]

    def a_node(self, prefer: list[str] | None = None, percent: int = 70) -> str:
        """A node: mostly one of ``prefer``, else any registered one, rarely none at all."""
        if prefer and self.pct(percent):
            return str(self.pick(prefer))
        known = self.node_names()
        if known and not self.pct(4):
            return str(self.pick(known))
        return "nx"

    def an_alloc(self, prefer: list[str], percent: int = 70) -> str:
        if prefer and self.pct(percent):
            return str(self.pick(prefer))
        removed = [a.name for a in self.model.allocs.values() if a.removed]
        if removed and self.pct(15):
            return str(self.pick(removed))  # every later event for it is rejected
        known = list(self.model.allocs)
        if known and not self.pct(5):
            return str(self.pick(known))
        return "ghost"

    def at(self) -> str:
        if self.pct(2):
            return self.pick(["9999-12-31T23:59:59Z", "1970-01-01T00:00:00Z",
                              "0001-01-01T00:00:00Z"])  # far off, either way
        if self.clock and self.pct(12):
            offset = self.clock - self.draw(st.integers(1, 900))  # reported late
        else:
            self.clock += self.draw(st.integers(1, 30))
            offset = self.clock
        moment = BASE + timedelta(seconds=offset)
        if self.pct(15):
            moment += timedelta(microseconds=self.draw(st.integers(1, 999_999)))
        text = moment.astimezone(self.pick(ZONES)).isoformat()
        text = text.replace("+00:00", "Z")
        if self.pct(10):  # the other spellings RFC 3339 (and the README) allow
            how = self.pick(["t", "z", " ", "nanoseconds", "-00:00"])
            if how in ("t", " "):
                text = text[:10] + how + text[11:]
            elif how == "z":
                text = text.replace("Z", "z")
            elif how == "nanoseconds":  # kept to the microsecond
                rest = text[19:]
                text = text[:19] + ".123456789" + (rest[7:] if rest.startswith(".") else rest)
            else:
                text = text.replace("Z", "-00:00")
        return text

    # -- emitting --------------------------------------------------------------

    def emit(self, event: dict[str, Any], label: str) -> None:
        """Add the envelope (id, at, source), maybe nulls or JSON text; let the model decide."""
        event = dict(event)
        if self.force_id is not None:
            event["id"], self.force_id = self.force_id, None
        elif self.pct(30):
            self.ids += 1
            event["id"] = f"e{self.ids}"
        if self.pct(80):
            event["at"] = self.at()
        if self.pct(15):
            event["source"] = self.pick(["nomad", "flink-tm", "swarm", "drydock", ""])
        if self.pct(5):
            event[self.pick(["source", "at", "id"])] = None  # optional, given as null
        submission: Any = event
        if self.pct(12):  # as a line of JSON text, as ``submit FILE`` reads it
            submission = self.as_text(event)
        self.model.submit(event)
        self.steps.append(Step(submission, event, label))

    def as_text(self, event: dict[str, Any]) -> Any:
        """JSON text of an event: maybe padded, maybe bytes, maybe with a key
        given twice (README: the last value wins)."""
        text = json.dumps(event, ensure_ascii=self.pct(50))
        if self.pct(30):
            key = self.pick(sorted(event))
            decoy = self.pick(['"n1"', "7", "null", '"heartbeat-missed"', "[]"])
            text = "{" + json.dumps(key) + ": " + decoy + ", " + text[1:]
        if self.pct(20):
            text = self.pick([" ", "\t", ""]) + text + self.pick(["\n", "\r\n", "  "])
        return text.encode() if self.pct(30) else text

    def invalid(self, submission: Any, label: str) -> None:
        self.model.submit(None)
        self.steps.append(Step(submission, None, label))

    # -- actions -----------------------------------------------------------------

    def register(self, name: str | None = None, parent: str | None = None,
                 slots: int | None = None) -> None:
        if name is None:
            if not self.pct(40) or not self.model.nodes:
                self.names += 1
                name = f"n{self.names}"
                if self.pct(15):  # names that differ from n1 only in case, quoting, script
                    name = self.pick(["N1", "n'1", 'n"1', "n 1", "nœud-ü", "n1\u00a01"])
                gone = self.node_names("down", "removed")
                if gone and self.pct(30):
                    parent = self.pick(gone)  # rejected
                elif self.pct(40) and self.model.nodes:
                    parent = self.pick(self.node_names())
                elif self.pct(15):
                    parent = "nx"
            else:
                name = self.pick(self.node_names())  # registered again: rejected
        event: dict[str, Any] = {"type": "node-registered", "node": name}
        count = self.draw(st.integers(0, 3)) if slots is None else slots
        if count or self.pct(50):
            event["slots"] = count
        if parent is not None:
            event["parent"] = parent
        self.emit(event, "register")

    def heartbeat(self) -> None:
        m = self.model
        if self.pct(50):  # bring a node back: a disconnected one first
            back = self.node_names("disconnected") if self.pct(70) else []
            name = self.a_node(back or self.node_names("initializing", "disconnected", "down"), 75)
            report = 25
        else:  # a node that runs something reports its slots
            busy = [n for n in self.node_names("ready", "initializing") if m.live(n)]
            wide = [n for n in busy if m.nodes[n].slots > 1]  # room for a duplicate
            name = self.a_node(wide if wide and self.pct(60) else busy, 80)
            report = 75
        event: dict[str, Any] = {"type": "heartbeat", "node": name}
        node = m.nodes.get(name)
        if node is not None and self.pct(report):
            event["slots"] = self.report(node)
        self.emit(event, "heartbeat")

    def report(self, node: Any) -> list[dict[str, Any]]:
        """A slot report: what history says, sometimes with a zombie or a mistake."""
        m = self.model
        table: dict[int, str | None] = {}
        for index in range(node.slots):
            holder = m.holder(node.name, index)
            if holder is not None or self.pct(30):
                table[index] = holder and holder.name
        entries = [{"slot": i, "alloc": a} for i, a in table.items()]
        if not self.pct(65):
            return entries
        twist = self.pick(["moved", "duplicate", "released", "unknown", "moved", "duplicate",
                           "out of range", "twice"])
        if twist in ("out of range", "twice") or not node.slots:
            if twist == "twice" and entries:
                entries.append(dict(entries[0]))
            else:
                index = self.pick([node.slots, node.slots + 1, -1])  # below 0 is out of range too
                entries.append({"slot": index, "alloc": None})
            return entries
        index = self.draw(st.integers(0, node.slots - 1))
        if twist == "released":
            gone = [a.name for a in m.allocs.values() if a.terminal or a.removed]
            alloc = self.pick(gone) if gone else "ghost"
        elif twist == "unknown":
            alloc = "ghost"
        elif twist == "moved":  # bound elsewhere: on another node, mostly
            others = [a.name for a in m.live() if a.node != node.name] if self.pct(75) else []
            others = others or [a.name for a in m.live() if (a.node, a.slot) != (node.name, index)]
            alloc = self.pick(others) if others else "ghost"
        else:  # duplicate: one allocation on two slots
            here = [a.name for a in m.live(node.name)] if self.pct(50) else []
            here = here or [a.name for a in m.live()]
            alloc = self.pick(here) if here else "ghost"
        entries = [e for e in entries if e["slot"] != index] + [{"slot": index, "alloc": alloc}]
        if twist == "duplicate" and node.slots > 1:
            other = (index + 1) % node.slots
            entries = [e for e in entries if e["slot"] != other] + [{"slot": other, "alloc": alloc}]
        return entries

    def place(self, max_disconnect: int | None = None) -> None:
        m = self.model
        how = self.pick(["new"] * 16 + ["again"] * 3 + ["elsewhere"] * 1)
        if how != "new" and m.allocs and max_disconnect is None:
            existing = m.allocs[self.pick(list(m.allocs))]
            if how == "again":  # a retry of the same placement: duplicate
                event: dict[str, Any] = {"type": "alloc-placed", "alloc": existing.name,
                                         "node": existing.node}
                for key, value in (("job", existing.job), ("slot", existing.slot),
                                   ("max_disconnect", existing.max_disconnect)):
                    if value is not None:
                        event[key] = value
                if existing.addresses:
                    event["addresses"] = list(reversed(existing.addresses))  # a set
                self.emit(event, "place again")
                return
            name = existing.name  # the same id elsewhere (Flink): rejected
        else:
            self.allocs += 1
            name = f"a{self.allocs}"
            if self.pct(8):
                name = self.pick(["A1", "a'1", "a 1", "ä1", "a1\\"])
        ready = [n.name for n in m.nodes.values() if n.status == "ready" and n.health == "ok"]
        node = self.a_node(ready, 88)
        event = {"type": "alloc-placed", "alloc": name, "node": node}
        slots = m.nodes[node].slots if node in m.nodes else 1
        how = self.pick(["free"] * 13 + ["none"] * 3 + ["any"] * 3 + ["out of range"])
        if how == "out of range":
            event["slot"] = self.pick([slots, -1])
        elif slots and how == "free":
            free = [i for i in range(slots) if m.holder(node, i) is None]
            event["slot"] = self.pick(free) if free else self.draw(st.integers(0, slots - 1))
        elif slots and how == "any":
            event["slot"] = self.draw(st.integers(0, slots - 1))  # maybe held: Flink
        if self.pct(45):
            free = [a for a in ADDRESSES if m.address_holder(a) is None]
            pool = free if free and self.pct(75) else list(ADDRESSES)  # else: Swarmkit
            count = self.draw(st.integers(1, min(2, len(pool))))
            event["addresses"] = list(self.draw(st.permutations(pool)))[:count]
        if max_disconnect is not None or self.pct(55):
            event["max_disconnect"] = max_disconnect or self.pick([0, 30, 300, 86400, 2**31 - 1])
        if self.pct(50):
            event["job"] = self.pick(["web", "db", "batch"])
        self.emit(event, "place")

    def update(self, name: str | None = None, status: str | None = None) -> None:
        m = self.model
        waiting = [a.name for a in m.allocs.values() if a.waiting
                   and m.nodes[a.node].status in ("initializing", "ready")]
        live = [a.name for a in m.live()]
        pending = [a.name for a in m.live() if a.client == "pending"]
        if name is None and not live and self.pct(80):
            self.place()  # nothing runs: place something first
            return
        if name is not None:
            pass
        elif waiting and self.pct(70):
            name = self.pick(waiting)  # it reconnects
        elif pending and self.pct(55):
            name = self.pick(pending)
        else:
            name = self.an_alloc(live, 85)
        if status is None:
            status = self.pick(["running"] * 6 + ["complete"] * 2 + ["failed"] * 2 + ["pending"])
        event = {"type": "alloc-updated", "alloc": name, "client_status": status}
        if self.pct(65):
            event["blame"] = self.pick(["alloc", "alloc", "node"])
        self.emit(event, "update")

    def exposed(self) -> list[Any]:
        """Running allocations with a max_disconnect, desired run, on a node that is up."""
        m = self.model
        return [a for a in m.live() if a.client == "running" and a.max_disconnect is not None
                and a.desired == "run" and m.nodes[a.node].status in ("ready", "initializing")]

    def miss(self) -> None:
        m = self.model
        exposed = sorted({a.node for a in self.exposed()})
        if not exposed:  # a node where a pending one with a max_disconnect would be lost
            exposed = [n.name for n in m.nodes.values() if n.status in ("ready", "initializing")
                       and any(a.max_disconnect is not None and a.desired == "run"
                               for a in m.live(n.name))]
        if not exposed and self.pct(60):
            self.update()  # nothing would wait to reconnect: the node would just go down
            return
        self.emit({"type": "heartbeat-missed", "node": self.a_node(exposed, 90)}, "miss")

    def reconnect(self) -> None:
        """Nomad's story: a running allocation with a max_disconnect, its node
        misses a heartbeat, comes back, and the allocation reports again."""
        if not self.exposed():
            self.place(max_disconnect=self.pick([0, 60, 3600]))
            placed = self.steps[-1].event or {}
            if placed.get("alloc") in self.model.allocs:
                self.update(placed["alloc"], "running")
        exposed = self.exposed()
        if not exposed:
            return
        alloc = self.pick(exposed)
        self.emit({"type": "heartbeat-missed", "node": alloc.node}, "miss")
        if self.pct(85):
            self.emit({"type": "heartbeat", "node": alloc.node}, "heartbeat")
            if self.pct(25):  # gone again before it reported: it still waits
                self.emit({"type": "heartbeat-missed", "node": alloc.node}, "miss")
                self.emit({"type": "heartbeat", "node": alloc.node}, "heartbeat")
        self.update(alloc.name)

    def kill(self) -> None:
        kind = self.pick(["node-down", "node-down", "node-removed", "node-removed",
                          "health-checked"])
        m = self.model
        parents = [n.name for n in m.nodes.values() if n.status == "ready"
                   and any(c.parent == n.name for c in m.nodes.values())]
        if parents and self.pct(50):
            node = self.pick(parents)  # it takes its children down with it
        else:
            node = self.a_node(self.node_names("ready"), 50)
        event: dict[str, Any] = {"type": kind, "node": node}
        if kind == "health-checked":
            event["passed"] = False
        elif kind == "node-down" and self.pct(50):
            event["reason"] = "instance gone"
        self.emit(event, kind)

    def health(self) -> None:
        suspect = [n.name for n in self.model.nodes.values() if n.health == "suspect"]
        if self.pct(50):
            event = {"type": "health-checked", "node": self.a_node(suspect, 85), "passed": True}
        else:
            event = {"type": "node-suspected", "node": self.a_node(suspect, 20),
                     "reason": self.pick(["flaky disk", "ECC errors"])}
        self.emit(event, event["type"])

    def desire(self) -> None:
        m = self.model
        kind = self.pick(["alloc-stop-requested", "alloc-remove-requested", "alloc-removed",
                          "alloc-removed"])
        if kind == "alloc-removed":
            done = [a.name for a in m.allocs.values() if a.terminal and not a.removed]
            name = self.an_alloc(done, 65)
        elif kind == "alloc-stop-requested":
            removing = [a.name for a in m.allocs.values() if a.desired == "remove"]
            name = self.an_alloc(removing if self.pct(40) else [a.name for a in m.live()], 75)
        else:
            name = self.an_alloc([a.name for a in m.live()], 75)
        self.emit({"type": kind, "alloc": name}, kind)
        if kind == "alloc-remove-requested" and self.pct(25):  # a scheduler behind: too late
            self.emit({"type": "alloc-stop-requested", "alloc": name}, "alloc-stop-requested")

    def retry(self) -> None:
        """Send an earlier submission again, as it was (an id makes it a duplicate)."""
        if not self.steps:
            return
        step = self.pick(self.steps[-12:])
        self.model.submit(step.event)
        self.steps.append(Step(step.submission, step.event, "retry"))

    def reuse_id(self) -> None:
        """Another event under an id already used: invalid (README), unless it
        happens to repeat the first."""
        used = list(self.model.ids)
        if not used:
            return
        self.force_id = self.pick(used)
        self.pick([self.heartbeat, self.update, self.miss])()
        self.force_id = None

    def garbage(self) -> None:
        """Input that is not a valid event: each kind named by the SPEC, and a few more."""
        kind = self.pick(INVALID_KINDS)
        node = self.a_node(self.node_names(), 90)
        base: dict[str, Any] = self.pick([
            {"type": "heartbeat", "node": node},
            {"type": "alloc-placed", "alloc": "a99", "node": node, "slot": 0},
            {"type": "alloc-updated", "alloc": "a1", "client_status": "running"},
            {"type": "node-registered", "node": "n99", "slots": 1},
            {"type": "health-checked", "node": node, "passed": True},
        ])
        if kind == "unknown-field":
            base[self.pick(["colour", "nodes", "Type", "alloc_id"])] = "x"
        elif kind == "unknown-type":
            base["type"] = self.pick(["node-exploded", "Heartbeat", "alloc-placed ", ""])
        elif kind == "missing-field":
            del base[self.pick([k for k in base if k not in ("slot", "slots")])]
        elif kind == "wrong-type":
            key, value = self.pick([
                ("node", 7), ("id", 5), ("source", ["x"]), ("at", 1714564800),
                ("node", None) if base["type"] != "alloc-updated" else ("alloc", None),
            ] + {
                "heartbeat": [("slots", 3), ("slots", [{"slot": "0", "alloc": None}]),
                              ("slots", [{"slot": 0}]),
                              ("slots", [{"slot": 0, "alloc": None, "state": "x"}])],
                "alloc-placed": [("slot", "0"), ("slot", 1.0), ("addresses", "10.0.0.1"),
                                 ("max_disconnect", "60"), ("job", 3)],
                "alloc-updated": [("client_status", "unknown"), ("client_status", "lost"),
                                  ("blame", "both"), ("alloc", ["a1"])],
                "node-registered": [("slots", "two"), ("slots", True), ("parent", 1)],
                "health-checked": [("passed", "yes"), ("passed", 1)],
            }[base["type"]])
            base[key] = value
        elif kind == "bad-value":
            key, value = self.pick([
                ("id", ""), ("id", "x" * 129), ("at", "2024-05-01T12:00:00"),
                ("at", "yesterday"), ("source", "a\x00b"), ("at", "0001-01-01T00:00:00+10:00"),
                ("id", "k1 "),
            ] + {
                "heartbeat": [("node", "n1#0"), ("slots", [{"slot": 2**31, "alloc": None}])],
                "alloc-placed": [("slot", -(2**31) - 1), ("addresses", ["10.0.0.1", "10.0.0.1"]),
                                 ("alloc", "n1#0"), ("addresses", ["pool#1"]),
                                 ("addresses", ["10.0.0.1 "]),
                                 ("max_disconnect", -1), ("alloc", "")],
                "alloc-updated": [("alloc", "y" * 129)],
                "node-registered": [("slots", -1), ("slots", 2000), ("node", ""), ("node", " n1")],
                "health-checked": [("node", "n1#1")],
            }[base["type"]])
            base[key] = value
        else:  # bad-json
            text = json.dumps(base)
            self.invalid(self.pick([
                text[: self.draw(st.integers(1, len(text) - 1))],
                text + "}", text.replace('"', "'"), "[" + text + "]", "null", '"heartbeat"',
                "42", "", b"\xff\xfe{}", text.replace("}", ",}"),
            ]), kind)
            return
        self.invalid(base if self.pct(75) else json.dumps(base), kind)


ACTIONS = (
    ["place"] * 22 + ["update"] * 22 + ["heartbeat"] * 14 + ["miss"] * 8 + ["desire"] * 8
    + ["health"] * 5 + ["register"] * 5 + ["retry"] * 5 + ["garbage"] * 5 + ["reuse_id"] * 2
    + ["kill"] * 3 + ["reconnect"] * 3
)


def label(model: Model) -> None:
    """What an example reached, for ``--hypothesis-show-statistics``."""
    for reached in sorted(model.reached):
        event(reached)


@st.composite
def scenarios(draw: st.DrawFn, max_steps: int = 50) -> Scenario:
    """A stream that starts with ready nodes (some under a parent chain), then
    mostly placements, updates and heartbeats, with some of everything else."""
    gen = Generator(draw)

    def parent() -> str | None:
        return gen.pick(gen.node_names()) if gen.names and gen.pct(50) else None

    return drawn_scenario(draw, gen, draw(st.integers(2, 5)), parent, [2, 3, 1, 2, 0],
                          ACTIONS, max_steps)


def drawn_scenario(
    draw: st.DrawFn, gen: Any, nodes: int, parent: Callable[[], str | None],
    slot_counts: list[int], actions: Any, max_steps: int,
) -> Scenario:
    """``nodes`` registered (each under ``parent()``) and heartbeating, then
    ``actions`` of ``gen`` drawn, in batches of drawn sizes, the ledger
    reopened after some."""
    for _ in range(nodes):
        above = parent()
        gen.register(f"n{gen.names + 1}", above, gen.pick(slot_counts))
        gen.names += 1
    for name in gen.node_names():
        gen.emit({"type": "heartbeat", "node": name}, "heartbeat")
    for _ in range(draw(st.integers(10, max_steps))):
        getattr(gen, draw(st.sampled_from(actions)))()
    sizes = draw(st.lists(st.integers(1, 8) | st.just(64), min_size=1, max_size=4))
    reopen = draw(st.sets(st.integers(0, 15), max_size=2))
    return Scenario(gen.steps, sizes, frozenset(reopen))


def require_reached(
    strategy: Any, count: Callable[[Scenario], None], seen: Counter[str], names: Any,
    capsys: Any, what: str, seeds: range = range(5), each: int = 25,
) -> None:
    """``count`` each example of ``strategy`` drawn with fixed seeds into
    ``seen`` (the model alone decides, so this is quick), print the counts of
    ``names`` and require each in at least 3 examples. Several seeds, as
    Hypothesis draws most examples of a run from a few."""
    for number in seeds:
        seed(number)(settings(
            max_examples=each, database=None, deadline=None, phases=[Phase.generate],
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        )(given(strategy)(count)))()
    examples = len(seeds) * each
    with capsys.disabled():
        print(f"\nexamples reaching each {what}, of {examples}:")
        for name in names:
            print(f"  {seen[name]:4d}  {name}")
    missing = {name: seen[name] for name in names if seen[name] < 3}
    assert not missing, f"reached in fewer than 3 of {examples} examples: {missing}"


def run_checked_on_postgresql(
    dsn: str, admin: Callable[[str], Any], scenario: Scenario, inline: bool,
    finish: Callable[[Any, Model], None],
) -> Model:
    """``run_checked`` in a fresh schema of the PostgreSQL at ``dsn`` (its
    projections inline, or brought up to date by ``project``), dropped after."""
    import uuid

    schema = f"t_{uuid.uuid4().hex[:16]}"
    options = f"schema={schema}" + ("&projections=inline" if inline else "")
    try:
        return run_checked(f"{dsn}{'&' if '?' in dsn else '?'}{options}", scenario,
                           project=not inline, finish=finish)
    finally:
        admin(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def replay_model(scenario: Scenario) -> tuple[Model, list[Outcome]]:
    """The model's answer to every step of a scenario, from a fresh model."""
    model = Model()
    return model, [model.submit(step.event) for step in scenario.steps]


# -- running a scenario against a store ---------------------------------------------

PROJECTED = ("nodes", "slots", "allocations", "alloc_states", "addresses")


def full_rows(store: Any) -> dict[str, list[tuple[Any, ...]]]:
    """Every column of every projection row but the rejection log's."""
    with store.reading() as cursor:
        found = {}
        for table in PROJECTED:
            cursor.execute(f"SELECT * FROM {table}")
            found[table] = sorted((tuple(row) for row in cursor.fetchall()), key=repr)
        return found


def run_checked(url: str, scenario: Scenario, project: bool = False,
                finish: Callable[[Any, Model], None] | None = None) -> Model:
    """Submit a scenario batch by batch to the store at ``url``; after each
    batch the receipts and the projection tables must agree with the model,
    and a batch that appended nothing must leave every projection row as it
    was. ``project``: bring the tables up to date first (a PostgreSQL store
    whose writers leave them to ``project``). ``finish`` gets the last ledger
    and the model before that ledger is closed."""
    from ledger.application import Ledger

    model = Model()
    batches = list(scenario.batches())
    cuts = sorted({i + 1 for i in scenario.reopen if i + 1 < len(batches)} | {len(batches)})
    start = done = 0
    before: dict[str, list[tuple[Any, ...]]] | None = None
    for cut in cuts:
        segment = batches[start:cut]
        start = cut
        with Ledger.open(url) as ledger:
            if before is None:
                before = full_rows(ledger.store)
            answers = ledger.submit_batches([[s.submission for s in batch] for batch in segment])
            for batch, receipts in zip(segment, answers, strict=True):
                assert len(receipts) == len(batch)
                for step, receipt in zip(batch, receipts, strict=True):
                    done += 1
                    check_receipt(model.submit(step.event), receipt, f"step {done} ({step.label})")
                if project:
                    ledger.project()
                wrong = differences(model.tables(), read_tables(ledger.store))
                assert not wrong, f"after step {done}:\n" + "\n".join(wrong)
                after = full_rows(ledger.store)
                if all(r.status != "appended" for r in receipts):
                    assert after == before, f"steps up to {done} appended nothing but changed a row"
                before = after
            if cut == len(batches) and finish is not None:
                finish(ledger, model)
    return model


def check_history(ledger: Any, model: Model, moment: int) -> None:
    """``alloc-ledger replay`` finds no difference and ``verify`` passes, both
    up to the model's head; ``--as-of TIME`` (at one of the stream's times)
    stops after the longest prefix whose every ``at`` is at or before it."""
    from ledger.chain import verify
    from projections.asof import AsOf, rebuild
    from projections.replay import replay

    report = replay(ledger.store)
    assert report.ok, [d.as_dict() for d in report.differences]
    assert report.position == report.head == model.head
    checked = verify(ledger.store)
    assert checked.ok, checked.problem
    assert checked.head == checked.verified == model.head
    known = sorted({at for _, at in model.kept if at is not None})
    if known:
        at = known[moment % len(known)]
        _, position = rebuild(ledger.store, AsOf(at=at), every=0)
        assert position == model.as_of_time(at), at


def check_as_of(ledger: Any, scenario: Scenario, position: int) -> None:
    """``--as-of POSITION`` (the log replayed into scratch tables) holds what
    the model held right after that position."""
    from projections.asof import AsOf, materialize, rebuild

    model = Model()
    for step in scenario.steps:
        if model.head == position:
            break
        model.submit(step.event)
    cluster, reached = rebuild(ledger.store, AsOf(position=position))
    assert reached == position
    connection = materialize(cluster)
    try:
        wrong = differences(model.tables(), read_tables(Scratch(connection)))
    finally:
        connection.close()
    assert not wrong, f"as of position {position}:\n" + "\n".join(wrong)
