"""The cluster: every rule of SPEC section 2, decided before anything changes.

``Cluster.apply(event, fact)`` first runs the ``check_*`` methods of the
event's handler (which raise a named ``RuleViolation`` and change nothing),
then evolves the entities. Entities are loaded lazily from a ``StateSource``
(the projection tables of a store, or nothing at all for an in-memory
replay) and every change is remembered until ``take_changes()``, so deciding
an event costs the same whatever the length of history.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from operator import attrgetter
from typing import Any, Protocol, TypeVar

from ledger import errors
from ledger.model import (
    DESIRED_ORDER,
    HEALTH_REASON,
    LIVE,
    LOSSES_AT_DISCONNECT,
    MAX_SLOTS,
    PARENT_HOLDS_NODE,
    RECONNECT_FORGETS_UNKNOWN,
    AddressHold,
    Allocation,
    AllocState,
    Event,
    Fact,
    Node,
    Rejection,
    Slot,
    placement,
    rejected_json,
)

V = TypeVar("V")


class AlreadyPlaced(errors.LedgerError):
    """The same placement again: a no-op, reported ``duplicate``."""

    def __init__(self, position: int) -> None:
        super().__init__("the same placement is already in the ledger")
        self.position = position


class StateSource(Protocol):
    """Where entities not yet in memory come from."""

    def load_node(self, node: str) -> Node | None: ...
    def load_slots(self, node: str) -> list[Slot]: ...
    def load_alloc(self, alloc: str) -> Allocation | None: ...
    def load_address(self, address: str) -> AddressHold | None: ...
    def load_live_allocs(self, node: str) -> set[str]: ...
    def load_children(self, node: str) -> set[str]: ...

    @property
    def loads_many(self) -> bool:
        """Whether ``load_nodes`` loads many nodes at once (else it does nothing)."""

    def load_nodes(self, cluster: Cluster, nodes: set[str]) -> None:
        """Load these nodes, their slot tables, live allocations (and those
        allocations) and children into the cluster's caches, all at once."""


class EmptySource:
    """No stored state: the cluster in memory is all there is (replays)."""

    def load_node(self, node: str) -> Node | None:
        return None

    def load_slots(self, node: str) -> list[Slot]:
        return []

    def load_alloc(self, alloc: str) -> Allocation | None:
        return None

    def load_address(self, address: str) -> AddressHold | None:
        return None

    def load_live_allocs(self, node: str) -> set[str]:
        return set()

    def load_children(self, node: str) -> set[str]:
        return set()

    loads_many = False

    def load_nodes(self, cluster: Cluster, nodes: set[str]) -> None:
        pass


@dataclass
class Changes:
    """What changed since the last ``take_changes()``, ready to be written."""

    nodes: list[Node] = field(default_factory=list)
    beats: set[str] = field(default_factory=set)  # nodes above changed by heartbeats alone
    slots: list[Slot] = field(default_factory=list)
    allocs: list[Allocation] = field(default_factory=list)
    held: list[AddressHold] = field(default_factory=list)
    released: list[str] = field(default_factory=list)
    alloc_states: list[AllocState] = field(default_factory=list)
    rejections: list[Rejection] = field(default_factory=list)


class Cache(dict[str, V]):
    """Entities in memory by name; a name not yet here is loaded once from
    the source on first lookup (absence too), so ``cache[name]`` is the
    entity whether or not it was loaded before."""

    __slots__ = ("load",)

    def __init__(self, load: Callable[[str], V]) -> None:
        super().__init__()
        self.load = load

    def __missing__(self, key: str) -> V:
        if type(key) is not str:  # only an edited log names one so: never a key of the state
            raise TypeError(f"{key!r} is not a name")
        found = self[key] = self.load(key)
        return found


class Cluster:
    """The current state of the cluster, as far as history has been applied."""

    def __init__(self, source: StateSource | None = None) -> None:
        self.source: StateSource = source or EmptySource()
        self.nodes: Cache[Node | None] = Cache(self.source.load_node)
        self.slot_tables: Cache[list[Slot]] = Cache(self.source.load_slots)
        self.allocs: Cache[Allocation | None] = Cache(self.source.load_alloc)
        self.addresses: Cache[AddressHold | None] = Cache(self.source.load_address)
        self.live: Cache[set[str]] = Cache(self.source.load_live_allocs)
        self.children: Cache[set[str]] = Cache(self.source.load_children)
        self._dirty_nodes: dict[str, Node] = {}
        self._beats: set[str] = set()  # dirty nodes whose only change is a heartbeat
        self._dirty_slots: dict[tuple[str, int], Slot] = {}
        self._dirty_allocs: dict[str, Allocation] = {}
        self._dirty_addresses: dict[str, AddressHold | None] = {}
        self._alloc_states: list[AllocState] = []
        self._rejections: list[Rejection] = []
        self._touched: list[str] = []
        self._handlers: dict[str, Callable[[Event, Fact], None]] = {
            "node-registered": self.register_node,
            "heartbeat": self.heartbeat,
            "heartbeat-missed": self.miss_heartbeat,
            "node-down": self.mark_down,
            "node-removed": self.remove_node,
            "node-suspected": self.suspect,
            "health-checked": self.check_health,
            "alloc-placed": self.place,
            "alloc-updated": self.report_status,
            "alloc-stop-requested": self.request_stop,
            "alloc-remove-requested": self.request_remove,
            "alloc-removed": self.reap,
        }

    # -- the one entry point -------------------------------------------------

    def apply(self, event: Event, fact: Fact) -> list[str]:
        """Decide and apply one event; return the entities it touched.

        Raises ``RuleViolation`` (nothing changed) or ``AlreadyPlaced``.
        """
        self._touched = []
        self._handlers[event["type"]](event, fact)
        return self._touched

    def reject(self, event: dict[str, object], reason: str, fact: Fact) -> None:
        """Keep a refused event in the rejection log."""
        entity = str(event.get("alloc") or event.get("node") or "")
        kind = str(event.get("type"))
        self._rejections.append(
            Rejection(fact.position, kind, entity, reason, rejected_json(event), fact.at))

    def related(self, event: dict[str, Any]) -> list[str]:
        """Entities a refused event concerns beyond those it names: the node,
        slot and held addresses of its allocation, the holders of the slot and
        addresses it asks for."""
        found: list[str] = []
        alloc = self.alloc(event["alloc"]) if isinstance(event.get("alloc"), str) else None
        if alloc is not None:
            found.append(alloc.node)
            if alloc.slot is not None:
                found.append(f"{alloc.node}#{alloc.slot}")
            for address in alloc.addresses:  # those it still holds (an early removal's)
                hold = self.address(address)
                if hold is not None and hold.alloc == alloc.alloc:
                    found.append(address)
        node = event.get("node")
        slot = event.get("slot")
        if isinstance(node, str) and isinstance(slot, int) and self.node(node) is not None:
            table = self.slot_table(node)
            if 0 <= slot < len(table) and table[slot].alloc is not None:
                found.append(str(table[slot].alloc))
        for address in event.get("addresses") or ():
            hold = self.address(address)
            if hold is not None:
                found.append(hold.alloc)
        return found

    # -- loading -------------------------------------------------------------

    def node(self, name: str) -> Node | None:
        return self.nodes[name]

    def slot_table(self, name: str) -> list[Slot]:
        return self.slot_tables[name]

    def alloc(self, alloc_id: str) -> Allocation | None:
        return self.allocs[alloc_id]

    def address(self, address: str) -> AddressHold | None:
        return self.addresses[address]

    def live_allocs(self, name: str) -> set[str]:
        """Ids of the allocations on a node that are not terminal."""
        return self.live[name]

    def child_nodes(self, name: str) -> set[str]:
        return self.children[name]

    # -- checks (run before any change) --------------------------------------

    def check_node_exists(self, name: str) -> Node:
        node = self.nodes[name]
        if node is None:
            raise errors.NodeNotRegistered(name)
        if node.status == "removed":
            raise errors.NodeRemoved(name)
        return node

    def check_alloc_exists(self, alloc_id: str) -> Allocation:
        alloc = self.allocs[alloc_id]
        if alloc is None:
            raise errors.AllocationNotPlaced(alloc_id)
        if alloc.removed:
            raise errors.AllocationRemoved(alloc_id)
        return alloc

    def check_slot_report(self, node: Node, report: list[dict[str, Any]]) -> dict[int, str | None]:
        """The report as slot -> alloc, once it names slots in range, each once."""
        reported = {entry["slot"]: entry["alloc"] for entry in report}
        if len(reported) < len(report) or reported and (
            max(reported) >= node.slots or min(reported) < 0
        ):
            self.explain_slot_report(node, report)
        return reported

    def explain_slot_report(self, node: Node, report: list[dict[str, Any]]) -> None:
        """Raise for the first entry of an invalid report that names a slot out of range or again."""
        seen: set[int] = set()
        for entry in report:
            if not 0 <= entry["slot"] < node.slots:
                raise errors.SlotReportInvalid(
                    f"slot report names slot {node.node}#{entry['slot']}, "
                    f"but node {node.node} has {errors.counted(node.slots, 'slot')}"
                )
            if entry["slot"] in seen:
                raise errors.SlotReportInvalid(
                    f"slot report lists slot {node.node}#{entry['slot']} twice"
                )
            seen.add(entry["slot"])

    def check_can_place(self, event: Event) -> Node:
        existing = self.alloc(event["alloc"])
        if existing is not None:
            self.check_new_allocation(existing, event)
        node = self.check_node_exists(event["node"])
        if node.status != "ready":
            raise errors.NodeNotReady(node.node, node.status)
        if node.health == "suspect":
            raise errors.NodeSuspect(node.node)
        index: int | None = event.get("slot")
        if index is not None:
            if not 0 <= index < node.slots:
                raise errors.SlotOutOfRange(node.node, index, node.slots)
            holder = self.slot_table(node.node)[index].alloc
            if holder is not None:
                raise errors.SlotHeld(node.node, index, holder)
        for address in event.get("addresses") or ():
            hold = self.address(address)
            if hold is not None:
                raise errors.AddressHeld(address, hold.alloc)
        return node

    def check_new_allocation(self, existing: Allocation, event: Event) -> None:
        wanted = placement(
            event["node"], event.get("slot"), event.get("job"), event.get("addresses") or [],
            event.get("max_disconnect"),
        )
        if existing.placement() == wanted:
            raise AlreadyPlaced(existing.placed_position)
        name = existing.alloc
        if existing.terminal or existing.removed:
            raise errors.AllocationExists(
                f"allocation {name} was already placed and is {existing.client_status}; "
                "an allocation id is placed once"
            )
        held = (
            f"already holds slot {existing.node}#{existing.slot}" if existing.slot is not None
            else f"is already placed on node {existing.node}"
        )
        # The same place, or the same node for one placed without a slot: other fields.
        if existing.node == wanted[0] and existing.slot in (None, wanted[1]):
            fields = ("slot", "job", "addresses", "max_disconnect")
            differ = [f for f, old, new in zip(fields, existing.placement()[1:], wanted[1:])
                      if old != new]
            raise errors.AllocationExists(
                f"allocation {name} {held}, and its {' and '.join(differ)} "
                f"{errors.differ(differ)}; "
                "placing it again must repeat the same fields"
            )
        raise errors.AllocationExists(f"allocation {name} {held}")

    def check_node_may_update(self, alloc: Allocation) -> Node:
        node = self.node(alloc.node)
        assert node is not None, f"allocation {alloc.alloc} on unknown node {alloc.node}"
        if node.status in ("disconnected", "down", "removed"):
            raise errors.NodeMayNotUpdate(node.node, node.status)
        if alloc.terminal:
            raise errors.TerminalStatusFinal(alloc.alloc, alloc.client_status)
        return node

    def check_may_remove(self, alloc: Allocation) -> None:
        if alloc.terminal:
            return
        held = list(alloc.addresses)
        if alloc.slot is not None:
            held.append(f"slot {alloc.node}#{alloc.slot}")
        holds = (
            f"{', '.join(held[:-1])} and {held[-1]}" if len(held) > 1
            else held[0] if held else f"its place on node {alloc.node}"
        )
        raise errors.RemovedBeforeShutdown(alloc.alloc, alloc.client_status, holds)

    # -- handlers: one per event type ----------------------------------------

    def register_node(self, event: Event, fact: Fact) -> None:
        if event["slots"] > MAX_SLOTS:  # only an edited log holds one: never build its table
            raise ValueError(f"more than {MAX_SLOTS} slots")
        if self.node(event["node"]) is not None:
            raise errors.NodeAlreadyRegistered(event["node"])
        parent_name: str | None = event.get("parent")
        if parent_name is not None:
            parent = self.node(parent_name)
            if parent is None:
                raise errors.ParentUnavailable(parent_name, "not registered")
            if parent.status in ("down", "removed"):
                raise errors.ParentUnavailable(parent_name, parent.status)
            self.child_nodes(parent_name).add(event["node"])
            self._touch(parent_name)
        node = Node(
            event["node"],
            event["slots"],
            event.get("parent"),
            since_position=fact.position,
            registered_position=fact.position,
        )
        self.nodes[node.node] = node
        self.live[node.node] = set()
        self.children[node.node] = set()
        self.slot_tables[node.node] = [
            Slot(node.node, index, since_position=fact.position) for index in range(event["slots"])
        ]
        for slot in self.slot_tables[node.node]:
            self._dirty_slots[(node.node, slot.slot)] = slot
        self._changed_node(node)

    def heartbeat(self, event: Event, fact: Fact) -> None:
        node = self.check_node_exists(event["node"])
        name = node.node
        report = event.get("slots")
        reported = self.check_slot_report(node, report) if report is not None else None
        status = node.status
        if status == "disconnected" or status == "initializing":
            waiting = self.awaits_reconnect(node)
            self._set_status(node, "initializing" if waiting else "ready", fact)
        elif status == "down" and (
            fact.rules < PARENT_HOLDS_NODE or self.down_ancestor(node) is None
        ):
            self._set_status(node, "ready", fact)  # not while what it runs on is gone
        node.last_heartbeat_at = fact.at
        node.last_heartbeat_position = position = fact.position
        if name in self._dirty_nodes:
            self._touch(name)
        else:
            self._changed_node(node)
            self._beats.add(name)  # a row already kept: only its heartbeat changes
        if reported is not None:
            for slot in self.slot_tables[name]:
                value = reported.get(slot.slot)
                # reported_position says since when the node reports this value
                if value != slot.reported_alloc or slot.reported_position is None:
                    slot.reported_alloc = value
                    slot.reported_position = position
                    # a slot the report leaves out, now reported empty, is in its history
                    self._changed_slot(slot)

    def miss_heartbeat(self, event: Event, fact: Fact) -> None:
        node = self.check_node_exists(event["node"])
        if node.status not in ("ready", "initializing"):
            return
        live = [self._live_alloc(alloc_id) for alloc_id in sorted(self.live_allocs(node.node))]
        if not any(a.max_disconnect is not None and a.desired_status == "run" for a in live):
            self._take_down(node, "missed heartbeat", fact)
            return
        self._set_status(node, "disconnected", fact)
        lost = []
        for alloc in live:
            if alloc.needs_reconnect:
                continue
            if alloc.client_status == "running" and alloc.max_disconnect is not None:
                self._mark_unknown(alloc, fact)
            else:
                self._lose(alloc, fact)
                lost.append(alloc.alloc)
        if fact.rules >= LOSSES_AT_DISCONNECT:
            self._took(node, lost)

    def mark_down(self, event: Event, fact: Fact) -> None:
        node = self.check_node_exists(event["node"])
        if node.status != "down":
            self._take_down(node, event.get("reason"), fact)

    def remove_node(self, event: Event, fact: Fact) -> None:
        node = self.check_node_exists(event["node"])
        self._take_down(node, node.reason if node.status == "down" else None, fact, "removed")

    def suspect(self, event: Event, fact: Fact) -> None:
        node = self.check_node_exists(event["node"])
        self._set_suspect(node, event["reason"], fact)

    def check_health(self, event: Event, fact: Fact) -> None:
        node = self.check_node_exists(event["node"])
        if event["passed"]:
            if node.health != "ok":
                node.health = "ok"
                if fact.rules >= HEALTH_REASON:  # rules 2 kept no health_reason to clear
                    node.health_reason = None
                node.since_position = fact.position
                if node.status != "down":
                    node.reason = None
                self._changed_node(node)
        elif node.status != "down":
            self._take_down(node, "health check failed", fact)

    def place(self, event: Event, fact: Fact) -> None:
        node = self.check_can_place(event)
        alloc = Allocation(
            event["alloc"],
            node.node,
            event.get("job"),
            event.get("slot"),
            list(event.get("addresses") or ()),
            event.get("max_disconnect"),
            placed_position=fact.position,
            updated_position=fact.position,
        )
        self.allocs[alloc.alloc] = alloc
        self.live_allocs(node.node).add(alloc.alloc)
        node.allocs += 1
        if alloc.slot is not None:
            slot = self.slot_table(node.node)[alloc.slot]
            slot.alloc = alloc.alloc
            slot.state = "allocated"
            slot.since_position = fact.position
            node.slots_used += 1
            self._changed_slot(slot)
        for address in alloc.addresses:
            hold = AddressHold(address, alloc.alloc, node.node, since_position=fact.position)
            self.addresses[address] = hold
            self._dirty_addresses[address] = hold
            self._touch(address)
        self._changed_node(node)
        self._changed_alloc(alloc)

    def report_status(self, event: Event, fact: Fact) -> None:
        alloc = self.check_alloc_exists(event["alloc"])
        node = self.check_node_may_update(alloc)
        self._touch(node.node)
        if alloc.needs_reconnect:
            self._stops_waiting(alloc, fact)
            self._add_state(alloc, event["client_status"], fact)
        if node.status == "initializing":
            self._set_status(node, "ready", fact)
        alloc.client_status = event["client_status"]
        alloc.updated_position = fact.position
        self._changed_alloc(alloc)
        if alloc.terminal:
            self._release(alloc, fact)
        elif alloc.slot is not None:
            slot = self.slot_table(alloc.node)[alloc.slot]
            state = "active" if event["client_status"] == "running" else "allocated"
            if slot.state != state:
                slot.state = state
                slot.since_position = fact.position
                self._changed_slot(slot)
        if event["client_status"] == "failed" and event["blame"] == "node":
            self._set_suspect(node, f"allocation {alloc.alloc} failed", fact)

    def request_stop(self, event: Event, fact: Fact) -> None:
        alloc = self.check_alloc_exists(event["alloc"])
        if alloc.desired_status == "remove":
            raise errors.DesiredStatusBackwards(alloc.alloc, "remove", "stop")
        self._set_desired(alloc, "stop", fact)

    def request_remove(self, event: Event, fact: Fact) -> None:
        alloc = self.check_alloc_exists(event["alloc"])
        self._set_desired(alloc, "remove", fact)

    def reap(self, event: Event, fact: Fact) -> None:
        alloc = self.check_alloc_exists(event["alloc"])
        self.check_may_remove(alloc)
        alloc.removed = True
        alloc.updated_position = fact.position
        self._changed_alloc(alloc)

    # -- evolution helpers (never raise) -------------------------------------

    def down_ancestor(self, node: Node) -> Node | None:
        """The nearest node of its parent chain that is down or removed, if any."""
        name = node.parent
        while name is not None and (parent := self.node(name)) is not None:
            if parent.status in ("down", "removed"):
                return parent
            name = parent.parent
        return None

    def awaits_reconnect(self, node: Node) -> bool:
        return any(self._live_alloc(a).needs_reconnect for a in self.live_allocs(node.node))

    def _live_alloc(self, alloc_id: str) -> Allocation:
        alloc = self.alloc(alloc_id)
        assert alloc is not None, f"live allocation {alloc_id} is missing"
        return alloc

    def _set_status(self, node: Node, status: str, fact: Fact) -> None:
        if node.status == status:
            return
        node.status = status
        node.since_position = fact.position
        if status == "ready":
            node.lost_allocs = []
            if node.health == "ok":
                node.reason = None
            elif fact.rules >= HEALTH_REASON and node.health_reason is not None:
                node.reason = node.health_reason  # back, still suspect
        self._changed_node(node)

    def _set_suspect(self, node: Node, reason: str, fact: Fact) -> None:
        node.health = "suspect"
        if fact.rules < HEALTH_REASON:
            node.reason = reason
        else:
            node.health_reason = reason
            if node.status != "down":  # while down, its reason says why it went down
                node.reason = reason
        node.since_position = fact.position
        self._changed_node(node)

    def _take_down(
        self, node: Node, reason: str | None, fact: Fact, status: str = "down"
    ) -> None:
        self._bring_down(node, reason, fact, status)
        why = f"parent {node.node} {'went down' if status == 'down' else 'was removed'}"
        self._cascade(node, why, fact)

    def _bring_down(self, node: Node, reason: str | None, fact: Fact, status: str) -> None:
        """A node down (or removed) with what it ran, its children left as they are."""
        lost = []
        for alloc_id in sorted(self.live_allocs(node.node)):
            self._lose(self._live_alloc(alloc_id), fact)
            lost.append(alloc_id)
        node.status = status
        node.reason = reason
        node.since_position = fact.position
        if fact.rules >= LOSSES_AT_DISCONNECT:  # kept with a disconnect's losses
            self._took(node, lost)
        else:
            node.lost_allocs = lost if status == "down" or lost else node.lost_allocs
        self._changed_node(node)

    @staticmethod
    def _took(node: Node, lost: list[str]) -> None:
        """What a node took with it since it was last ready (rules 3)."""
        node.lost_allocs = sorted(node.lost_allocs + lost)

    def _cascade(self, node: Node, why: str, fact: Fact) -> None:
        """Take down every node whose parent chain includes this one: depth
        first, children by name, each told which parent took it down. A
        stack, not a call per level: a chain may be thousands of nodes deep."""
        if self.source.loads_many:
            self._load_below(node.node)
        below = [(name, why) for name in sorted(self.child_nodes(node.node), reverse=True)]
        while below:
            name, why = below.pop()
            child = self.node(name)
            if child is None:
                continue
            if child.status not in ("down", "removed"):
                self._bring_down(child, why, fact, "down")
                why = f"parent {name} went down"
            # (one down already passes the reason on: unless an older ledger let it back)
            below.extend((grandchild, why)
                         for grandchild in sorted(self.child_nodes(name), reverse=True))

    def _load_below(self, name: str) -> None:
        """Load every node under this one a level at a time, before the walk:
        one load per node and table made a down of a node with 10,000
        children take 20 s on PostgreSQL."""
        seen = {name}
        level = self.child_nodes(name) - seen
        while level:
            seen |= level
            self.source.load_nodes(self, level)
            level = {child for parent in level for child in self.child_nodes(parent)} - seen

    def _mark_unknown(self, alloc: Allocation, fact: Fact) -> None:
        alloc.client_status = "unknown"
        alloc.needs_reconnect = True
        alloc.unknown_since_position = fact.position
        alloc.unknown_since_at = fact.at
        alloc.updated_position = fact.position
        self._add_state(alloc, "unknown", fact)
        self._changed_alloc(alloc)

    @staticmethod
    def _stops_waiting(alloc: Allocation, fact: Fact) -> None:
        """It no longer waits for its node to reconnect; when it was unknown,
        its alloc states keep (rules 1 kept it in ``unknown_since`` too)."""
        alloc.needs_reconnect = False
        if fact.rules >= RECONNECT_FORGETS_UNKNOWN:
            alloc.unknown_since_position = None
            alloc.unknown_since_at = None

    def _lose(self, alloc: Allocation, fact: Fact) -> None:
        alloc.client_status = "lost"
        self._stops_waiting(alloc, fact)
        alloc.updated_position = fact.position
        if DESIRED_ORDER[alloc.desired_status] < DESIRED_ORDER["stop"]:
            alloc.desired_status = "stop"
        self._add_state(alloc, "lost", fact)
        self._changed_alloc(alloc)
        self._release(alloc, fact)

    def _release(self, alloc: Allocation, fact: Fact) -> None:
        """A terminal allocation gives back its slot and its addresses."""
        node = self.node(alloc.node)
        assert node is not None
        if alloc.alloc in self.live_allocs(alloc.node):
            self.live_allocs(alloc.node).discard(alloc.alloc)
            node.allocs -= 1
        if alloc.slot is not None:
            slot = self.slot_table(alloc.node)[alloc.slot]
            if slot.alloc == alloc.alloc:
                slot.alloc = None
                slot.state = "free"
                slot.since_position = fact.position
                node.slots_used -= 1
                self._changed_slot(slot)
        for address in alloc.addresses:
            hold = self.address(address)
            if hold is not None and hold.alloc == alloc.alloc:
                self.addresses[address] = None
                self._dirty_addresses[address] = None
                self._touch(address)
        self._changed_node(node)

    def _set_desired(self, alloc: Allocation, desired: str, fact: Fact) -> None:
        if DESIRED_ORDER[desired] <= DESIRED_ORDER[alloc.desired_status]:
            return
        alloc.desired_status = desired
        alloc.updated_position = fact.position
        self._changed_alloc(alloc)
        for address in alloc.addresses:
            hold = self.address(address)
            if hold is not None and hold.alloc == alloc.alloc and hold.state != "releasing":
                hold.state = "releasing"
                hold.since_position = fact.position
                self._dirty_addresses[address] = hold
                self._touch(address)

    def _add_state(self, alloc: Allocation, value: str, fact: Fact) -> None:
        self._alloc_states.append(AllocState(alloc.alloc, value, fact.position, fact.at))

    # -- change tracking -----------------------------------------------------

    def _touch(self, name: str) -> None:
        self._touched.append(name)

    def _changed_node(self, node: Node) -> None:
        self._dirty_nodes[node.node] = node
        self._beats.discard(node.node)
        self._touch(node.node)

    def _changed_slot(self, slot: Slot, touch: bool = True) -> None:
        self._dirty_slots[(slot.node, slot.slot)] = slot
        if touch:
            self._touch(slot.key)

    def _changed_alloc(self, alloc: Allocation) -> None:
        self._dirty_allocs[alloc.alloc] = alloc
        self._touch(alloc.alloc)
        if alloc.slot is not None:
            self._touch(f"{alloc.node}#{alloc.slot}")

    def take_changes(self) -> Changes:
        """Hand over everything changed since the last call, and forget it."""
        released = [a for a, hold in self._dirty_addresses.items() if hold is None]
        changes = Changes(
            nodes=list(self._dirty_nodes.values()),
            beats=self._beats,
            slots=list(self._dirty_slots.values()),
            allocs=list(self._dirty_allocs.values()),
            held=[h for h in self._dirty_addresses.values() if h is not None],
            released=released,
            alloc_states=self._alloc_states,
            rejections=self._rejections,
        )
        self._dirty_nodes = {}
        self._beats = set()
        self._dirty_slots = {}
        self._dirty_allocs = {}
        self._dirty_addresses = {}
        self._alloc_states = []
        self._rejections = []
        return changes

    def size(self) -> int:
        """How many entities are held in memory."""
        return len(self.nodes) + len(self.allocs) + len(self.addresses)

    def forget(self) -> None:
        """Drop everything loaded (another writer may have changed the store)."""
        for cache in (self.nodes, self.slot_tables, self.allocs, self.addresses):
            cache.clear()
        self.live.clear()
        self.children.clear()
        self.take_changes()

    def records(self) -> int:
        """How many records of the state grow with history: nodes,
        allocations (removed ones too), held addresses, alloc states and
        rejections (not the caches' entries for names not found, nor slots,
        which a node's registration bounds)."""
        def held(entries: Cache[Any]) -> int:
            return sum(1 for entry in entries.values() if entry is not None)

        return (held(self.nodes) + held(self.allocs) + held(self.addresses)
                + len(self._alloc_states) + len(self._rejections))

    def everything(self) -> Changes:
        """The whole in-memory state as changes (to materialize a replay)."""
        nodes = [n for n in self.nodes.values() if n is not None]
        return Changes(
            nodes=nodes,
            slots=[s for table in self.slot_tables.values() for s in table],
            allocs=[a for a in self.allocs.values() if a is not None],
            held=[h for h in self.addresses.values() if h is not None],
            alloc_states=list(self._alloc_states),
            rejections=list(self._rejections),
        )


def _tuples(items: list[Any]) -> list[tuple[object, ...]]:
    """Each item's fields as a tuple, in field order: what ``astuple`` gives
    for these flat records, without its deep copy of every value (which took
    most of a checkpoint's time, and a checkpoint holds the whole state), so
    the tuples share their lists with the items: serialize them at once."""
    if not items:
        return []
    get = attrgetter(*(f.name for f in fields(items[0])))
    return [get(item) for item in items]


class Snapshot:
    """A cluster's whole state as plain tuples (for checkpoints), and back."""

    @staticmethod
    def of(cluster: Cluster) -> dict[str, list[tuple[object, ...]]]:
        everything = cluster.everything()
        return {
            "nodes": _tuples(everything.nodes),
            "slots": _tuples(everything.slots),
            "allocs": _tuples(everything.allocs),
            "held": _tuples(everything.held),
            "alloc_states": _tuples(everything.alloc_states),
            "rejections": _tuples(everything.rejections),
        }

    @staticmethod
    def restore(state: dict[str, list[list[Any]]]) -> Cluster:
        cluster = Cluster()
        for values in state["nodes"]:
            node = Node(*values)
            cluster.nodes[node.node] = node
            cluster.slot_tables[node.node] = []
            cluster.live[node.node] = set()
            cluster.children[node.node] = set()
        for values in state["nodes"]:
            if values[2] is not None:  # parent
                cluster.children[values[2]].add(values[0])
        for values in state["slots"]:
            slot = Slot(*values)
            cluster.slot_tables[slot.node].append(slot)
        for values in state["allocs"]:
            alloc = Allocation(*values)
            cluster.allocs[alloc.alloc] = alloc
            if alloc.client_status in LIVE:
                cluster.live[alloc.node].add(alloc.alloc)
        for values in state["held"]:
            hold = AddressHold(*values)
            cluster.addresses[hold.address] = hold
        cluster._alloc_states = [AllocState(*values) for values in state["alloc_states"]]
        cluster._rejections = [Rejection(*values) for values in state["rejections"]]
        return cluster


def touched_by(event: dict[str, object]) -> Iterable[str]:
    """The entities an event names (for events that were rejected)."""
    for key in ("node", "alloc", "parent"):
        value = event.get(key)
        if isinstance(value, str):
            yield value
    slot = event.get("slot")
    if isinstance(slot, int) and isinstance(event.get("node"), str):
        yield f"{event['node']}#{slot}"
    reports = event.get("slots")
    if isinstance(reports, list):
        for entry in reports:
            if isinstance(entry, dict):
                yield f"{event.get('node')}#{entry.get('slot')}"
                if isinstance(entry.get("alloc"), str):
                    yield entry["alloc"]
    addresses = event.get("addresses")
    if isinstance(addresses, list):
        yield from (a for a in addresses if isinstance(a, str))
