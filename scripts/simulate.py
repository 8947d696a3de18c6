#!/usr/bin/env python3
"""Generate a deterministic, realistic cluster history as JSON Lines.

The simulator keeps a model of the cluster as the ledger sees it (node
status and health, slot tables, allocations, held addresses) and emits only
events the SPEC rules accept, except for a sprinkle (well under 1%) of the
four source systems' races, which the ledger rejects or flags. A rejected
event changes nothing, in the ledger as in the model; a flagged one is kept.

* Flink: a placement on a slot another allocation already holds (rejected:
  "slot n1#0 is already held by allocation a2");
* Flink: an allocation that holds a slot placed again on another slot
  (rejected: "allocation a1 already holds slot n1#0");
* Flink zombie slots: a slot report that shows an allocation history
  released (``released``), one never placed (``unknown-alloc``), one
  allocation on two slots (``duplicate``), or an allocation of another
  node or slot (``moved``); flagged in ``zombie_slots`` until the node's
  next correct report;
* Swarmkit: a replacement task placed with an address still held by a task
  that has not shut down (rejected: "address ... is still held by
  allocation ..., which has not shut down");
* Swarmkit: ``alloc-removed`` of a task asked to stop that is still running
  (rejected: "allocation t1 is running; removing it now would free ...");
* Nomad: an alloc-updated from a node that is disconnected (rejected: "node
  n1 is not allowed to update allocs while in status disconnected");
* Nomad #15808: a placement on a node back from a disconnect whose
  allocations have not reconnected yet (rejected: "node n1 is not ready
  (status initializing); it takes no placements");
* Drydock: a placement on a suspect node (rejected: "node n1 is suspect;
  it takes no placements") and on a working copy that went down with its
  host (rejected: "node n1-wc1 is not ready (status down); ...").

Only the simulated cluster state is kept, never the history, so a run of any
length streams in small, bounded memory. Same parameters, same bytes.

Example:

    python scripts/simulate.py --events 100000 --nodes 1000 --slots 4 --seed 7 \\
        | alloc-ledger submit - --quiet

From Python:

    from scripts.simulate import generate
    for event in generate(1000, nodes=20, slots=4, seed=1):
        ...
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import sys
from collections import deque
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from random import Random
from typing import Any, TextIO

DEFAULT_START = "2026-01-01T00:00:00Z"
DEFAULT_SOURCE = "sim"

# Simulated time: each node heartbeats every HEARTBEAT_SECONDS and heartbeats
# are about HEARTBEAT_SHARE of all events, so the time between two events is
# HEARTBEAT_SECONDS * HEARTBEAT_SHARE / nodes (0.75 ms for 10,000 nodes).
HEARTBEAT_SECONDS = 10
HEARTBEAT_SHARE = 0.75
SLOT_REPORT_EVERY = 5  # a full slot report with every 5th heartbeat of a node

# Probabilities of the spontaneous (not scheduled) happenings, per event.
P_PLACE = 0.07
P_MISSED = 0.0105
P_REGISTER = 0.0004
P_DOWN = 0.0002
P_REMOVE = 0.00008
P_SUSPECT = 0.0001
P_FLINK = 0.00015  # a placement on a held slot
P_FLINK_AGAIN = 0.00015  # a live allocation placed again on another slot
P_ZOMBIE = 0.0004  # a slot report with a zombie (ZOMBIE_SHARES says which)

SLOTLESS_SHARE = 0.15  # allocations holding no slot (Swarmkit tasks, Nomad allocs)
SERVICE_SHARE = 0.4  # long-running services; the rest are batch jobs
TARGET_OCCUPANCY = 0.5  # share of slots the services keep busy
MAX_DISCONNECT_CHOICES = (60, 120, 300, 600, 900)
P_MAX_DISCONNECT = 0.35
P_NOMAD_RACE = 0.025  # per disconnect episode with allocations to reconnect
P_SWARM_RACE = 0.03  # per stop/remove request of an allocation with addresses
P_EARLY_REMOVE = 0.03  # the same, alloc-removed before it shut down
P_INIT_RACE = 0.03  # per return of a node with allocations to reconnect
P_SUSPECT_RACE = 0.3  # per suspicion of a ready node
P_COPY_RACE = 0.25  # per node going down that takes working copies with it
# Zombie reasons, by cumulative share: released, unknown-alloc, duplicate, moved.
ZOMBIE_SHARES = ((0.25, "released"), (0.5, "unknown-alloc"), (0.75, "duplicate"), (1.0, "moved"))
ADDRESS_REUSE_AFTER = 32  # released addresses wait in a queue before reuse

DOWN_REASONS = ("instance terminated", "resource vanished", "kernel panic", "network partition")
SUSPECT_REASONS = ("disk pressure", "ECC errors", "slow heartbeats", "image pull failures")

READY = "ready"
INIT = "initializing"
DISC = "disconnected"
DOWN = "down"
REMOVED = "removed"
OK = "ok"
SUSPECT = "suspect"
RUN = "run"
STOP = "stop"
REMOVE = "remove"
PENDING = "pending"
RUNNING = "running"
UNKNOWN = "unknown"
COMPLETE = "complete"
FAILED = "failed"
LOST = "lost"
TERMINAL = frozenset((COMPLETE, FAILED, LOST))
CONNECTED = frozenset((READY, INIT))

# Scheduled follow-ups (kinds of heap entries).
(
    K_RUN,
    K_END,
    K_STOPPED,
    K_REAP,
    K_RETURN,
    K_RECONNECT,
    K_EXPIRE,
    K_HEALTH,
    K_REMOVE,
    K_NOMAD,
    K_SWARM,
    K_EARLY_REMOVE,
    K_INIT_RACE,
    K_SUSPECT_RACE,
    K_COPY_RACE,
) = range(15)

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

Body = tuple[str, dict[str, Any]]


class Node:
    __slots__ = (
        "allocs",
        "beats",
        "children",
        "copies",
        "dirty",
        "epoch",
        "health",
        "name",
        "parent",
        "phase",
        "quoted",
        "slots",
        "status",
        "table",
    )

    def __init__(self, name: str, slots: int, parent: Node | None, phase: int) -> None:
        self.name = name
        self.slots = slots
        self.parent = parent
        self.children: list[Node] = []
        self.status = INIT
        self.health = OK
        self.table: list[str | None] = [None] * slots
        self.allocs: dict[str, Alloc] = {}  # insertion ordered: deterministic
        self.epoch = 0  # bumped on every status change; stale follow-ups check it
        self.beats = 0
        self.phase = phase
        self.copies = 0
        self.dirty = False  # a slot was freed since the last slot report
        self.quoted = json.dumps(name)


class Alloc:
    __slots__ = ("addrs", "client", "desired", "id", "job", "maxdc", "node", "service", "slot", "stage")

    def __init__(
        self,
        alloc_id: str,
        node: Node,
        job: str,
        slot: int | None,
        addrs: tuple[str, ...],
        maxdc: int | None,
        service: bool,
    ) -> None:
        self.id = alloc_id
        self.node = node
        self.job = job
        self.slot = slot
        self.addrs = addrs
        self.desired = RUN
        self.client = PENDING
        self.maxdc = maxdc
        self.stage = 0  # bumped on each lifecycle step; stale follow-ups check it
        self.service = service


def slot_report(table: list[str | None]) -> list[dict[str, Any]]:
    return [{"slot": k, "alloc": a} for k, a in enumerate(table)]


def parse_start(text: str) -> datetime:
    """Parse an RFC 3339 timestamp (a trailing Z allowed); naive means UTC."""
    value = datetime.fromisoformat(text.strip().replace("z", "Z"))
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value


class _Simulation:
    def __init__(
        self,
        events: int,
        nodes: int,
        slots: int,
        seed: int,
        start: str | datetime,
        ids: bool,
        source: str | None,
    ) -> None:
        if events < 0:
            raise ValueError("events must be >= 0")
        if nodes < 1:
            raise ValueError("nodes must be >= 1")
        if slots < 0:
            raise ValueError("slots must be >= 0")
        self.events = events
        self.initial_nodes = nodes
        self.slots = slots
        self.rng = Random(seed)
        self.ids = ids
        self.source = source
        begin = parse_start(start) if isinstance(start, str) else start
        if begin.tzinfo is None:
            begin = begin.replace(tzinfo=UTC)
        self.start_us = (begin - _EPOCH) // timedelta(microseconds=1)
        self.dt_us = max(1, round(HEARTBEAT_SECONDS * 1_000_000 * HEARTBEAT_SHARE / nodes))
        self.per_second = 1_000_000 / self.dt_us  # events per simulated second
        capacity = max(nodes * slots, nodes)
        placements_per_event = P_PLACE * 0.9  # ~10% of events are scheduled follow-ups
        self.service_life = TARGET_OCCUPANCY * capacity / (placements_per_event * SERVICE_SHARE)
        self.jobs = max(8, nodes // 4)

        self.i = 0
        self.heap: list[tuple[int, int, int, Any, int]] = []
        self.seq = 0
        self.nodes: list[Node] = []
        self.hosts: list[Node] = []
        self.rr = 0
        self.node_count = 0
        self.alloc_count = 0
        self.held: dict[str, Alloc] = {}
        self.free_addrs: deque[str] = deque()
        self.addr_count = 0
        self.released: deque[tuple[str, Node, int]] = deque(maxlen=64)
        self.rare: tuple[tuple[float, Callable[[], Body | None]], ...] = (
            (P_MISSED, self.miss),
            (P_REGISTER, self.register),
            (P_DOWN, self.node_down),
            (P_REMOVE, self.node_removed),
            (P_SUSPECT, self.suspect),
            (P_FLINK, self.flink_race),
            (P_FLINK_AGAIN, self.flink_again_race),
            (P_ZOMBIE, self.zombie_race),
        )

    # ----------------------------------------------------------- helpers

    def after(self, low: float, high: float) -> int:
        """A delay in events for a uniform delay in simulated seconds."""
        return 1 + int((low + (high - low) * self.rng.random()) * self.per_second)

    def schedule(self, delay: int, kind: int, target: Any, token: int) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (self.i + max(1, delay), self.seq, kind, target, token))

    def new_node(self, parent: Node | None) -> Node:
        if parent is None:
            self.node_count += 1
            name = f"n{self.node_count:05d}"
        else:
            parent.copies += 1
            name = f"{parent.name}-wc{parent.copies}"
        node = Node(name, self.slots, parent, len(self.nodes) % SLOT_REPORT_EVERY)
        self.nodes.append(node)
        if parent is None:
            self.hosts.append(node)
        else:
            parent.children.append(node)
        return node

    def registered(self, node: Node) -> Body:
        body: dict[str, Any] = {"node": node.name, "slots": node.slots}
        if node.parent is not None:
            body["parent"] = node.parent.name
        return ("node-registered", body)

    def new_address(self) -> str:
        free = self.free_addrs
        while len(free) > ADDRESS_REUSE_AFTER:
            addr = free.popleft()
            if addr not in self.held:
                return addr
        while True:
            k = self.addr_count
            self.addr_count += 1
            addr = f"10.{(k // 65024) % 256}.{(k // 254) % 256}.{k % 254 + 1}"
            if addr not in self.held:
                return addr

    def pick(self, tries: int = 6) -> Node | None:
        """A random ready, healthy node."""
        nodes = self.nodes
        random = self.rng.random
        for _ in range(tries):
            node = nodes[int(random() * len(nodes))]
            if node.status == READY and node.health == OK:
                return node
        return None

    def pick_host(self) -> Node | None:
        for _ in range(6):
            node = self.hosts[self.rng.randrange(len(self.hosts))]
            if node.status == READY:
                return node
        return None

    def has_reconnecting(self, node: Node) -> bool:
        return any(a.client == UNKNOWN for a in node.allocs.values())

    def set_status(self, node: Node, status: str) -> None:
        if node.status != status:
            node.status = status
            node.epoch += 1

    def reported(self, node: Node) -> None:
        """An accepted alloc-updated: the first from an initializing node readies it."""
        if node.status == INIT:
            self.set_status(node, READY)

    def terminate(self, a: Alloc, status: str, reap_low: float = 5, reap_high: float = 60) -> None:
        a.client = status
        a.stage += 1
        node = a.node
        if a.slot is not None and node.table[a.slot] == a.id:
            node.table[a.slot] = None
            node.dirty = True
            self.released.append((a.id, node, a.slot))
        held = self.held
        for addr in a.addrs:
            if held.get(addr) is a:
                del held[addr]
                self.free_addrs.append(addr)
        self.schedule(self.after(reap_low, reap_high), K_REAP, a, a.stage)

    def lose(self, a: Alloc) -> None:
        if a.desired == RUN:
            a.desired = STOP
        self.terminate(a, LOST, 30, 300)

    def cascade(self, node: Node, status: str) -> list[Node]:
        """node-down / node-removed on node; every node below it goes down (the
        ledger removes only the node named). Below a removed node they stay
        down: nothing they were waiting for (a return) happens any more."""
        changed = []
        stack = [node]
        while stack:
            x = stack.pop()
            target = status if x is node else DOWN
            if x.status != REMOVED and x.status != target:
                self.set_status(x, target)
                changed.append(x)
                for a in list(x.allocs.values()):
                    if a.client not in TERMINAL:
                        self.lose(a)
            elif status == REMOVED and x is not node:
                x.epoch += 1  # already down: its scheduled return is off
            stack.extend(reversed(x.children))
        return changed

    def down_fate(
        self, downed: list[Node], low: float = 30, high: float = 300, p_removed: float = 0.25
    ) -> None:
        """Nodes just went down (root first): they come back later, or are removed."""
        if not downed:
            return
        root = downed[0]
        if len(downed) > 1 and self.rng.random() < P_COPY_RACE:
            copy = downed[1 + self.rng.randrange(len(downed) - 1)]
            self.schedule(self.after(0.2, 5), K_COPY_RACE, copy, copy.epoch)
        if self.rng.random() >= p_removed:
            delay = self.after(low, high)
            for x in downed:
                self.schedule(delay, K_RETURN, x, x.epoch)
                delay += self.after(0.5, 5)
        else:
            self.schedule(self.after(5, 60), K_REMOVE, root, root.epoch)

    @staticmethod
    def gone_above(node: Node) -> bool:
        """A node of its parent chain is down or removed: a heartbeat does not
        bring it back (the ledger's rule)."""
        parent = node.parent
        while parent is not None:
            if parent.status == DOWN or parent.status == REMOVED:
                return True
            parent = parent.parent
        return False

    def heartbeat(self, node: Node, zombie: tuple[tuple[int, str | None], ...] = ()) -> Body:
        """A heartbeat of node; zombie: (slot, alloc) entries its slot report
        gets wrong (the report's allocations are not the model's)."""
        status = node.status
        if status != READY and not (status == DOWN and self.gone_above(node)):
            # Back from a disconnect, or still initializing: ready once nothing
            # waits to reconnect (the ledger's rule, Nomad #15808).
            if (status == DISC or status == INIT) and self.has_reconnecting(node):
                self.set_status(node, INIT)
            else:
                self.set_status(node, READY)
        node.beats += 1
        body: dict[str, Any] = {"node": node.name}
        if node.slots and (node.dirty or zombie or node.beats % SLOT_REPORT_EVERY == node.phase):
            node.dirty = False
            report = slot_report(node.table)
            for slot, alloc_id in zombie:
                report[slot]["alloc"] = alloc_id
            body["slots"] = report
        return ("heartbeat", body)

    def next_heartbeat(self) -> Body:
        nodes = self.nodes
        count = len(nodes)
        p = self.rr
        for _ in range(count):
            node = nodes[p]
            p += 1
            if p == count:
                p = 0
            if node.status == READY or node.status == INIT:
                self.rr = p
                return self.heartbeat(node)
        self.rr = p
        return self.register()  # every node is away: a new one joins

    # ------------------------------------------------- spontaneous events

    def register(self) -> Body:
        parent = self.pick_host() if self.rng.random() < 0.3 else None
        node = self.new_node(parent)
        self.schedule(self.after(0.2, 3), K_RETURN, node, node.epoch)
        return self.registered(node)

    def place(self) -> Body | None:
        rng = self.rng
        slotless = self.slots == 0 or rng.random() < SLOTLESS_SHARE
        slot: int | None = None
        for _ in range(6):
            node = self.pick(1)
            if node is None:
                continue
            if slotless:
                break
            table = node.table
            if None in table:
                slot = table.index(None)
                break
        else:
            return None
        if slotless or rng.random() < 0.35:
            addrs: tuple[str, ...] = (self.new_address(),)
            if rng.random() < 0.1:
                addrs += (self.new_address(),)
        else:
            addrs = ()
        maxdc = rng.choice(MAX_DISCONNECT_CHOICES) if rng.random() < P_MAX_DISCONNECT else None
        service = rng.random() < SERVICE_SHARE
        job = f"{'svc' if service else 'batch'}-{rng.randrange(self.jobs):03d}"
        self.alloc_count += 1
        a = Alloc(f"a{self.alloc_count:07d}", node, job, slot, addrs, maxdc, service)
        node.allocs[a.id] = a
        if slot is not None:
            node.table[slot] = a.id
        for addr in addrs:
            self.held[addr] = a
        self.schedule(self.after(0.5, 8), K_RUN, a, a.stage)
        body: dict[str, Any] = {"alloc": a.id, "node": node.name, "job": job}
        if slot is not None:
            body["slot"] = slot
        if addrs:
            body["addresses"] = list(addrs)
        if maxdc is not None:
            body["max_disconnect"] = maxdc
        return ("alloc-placed", body)

    def miss(self) -> Body | None:
        """A missed heartbeat: disconnect (allocs to keep) or down (none)."""
        chosen = None
        for _ in range(5):
            node = self.pick(1)
            if node is None:
                continue
            chosen = node
            if any(a.maxdc and a.client == RUNNING for a in node.allocs.values()):
                break
        if chosen is None:
            return None
        node = chosen
        body = ("heartbeat-missed", {"node": node.name})
        keeps = any(
            a.maxdc and a.desired == RUN and a.client not in TERMINAL for a in node.allocs.values()
        )
        if not keeps:  # nothing to wait for: down, and usually back soon
            self.down_fate(self.cascade(node, DOWN), 10, 60, 0.05)
            return body
        self.set_status(node, DISC)
        unknown = []
        for a in list(node.allocs.values()):
            if a.client in TERMINAL:
                continue
            if a.client == UNKNOWN:  # unknown since an earlier disconnect: stays unknown
                unknown.append(a)
            elif a.client == RUNNING and a.maxdc:
                a.client = UNKNOWN
                unknown.append(a)
            else:
                self.lose(a)
        rng = self.rng
        if unknown and rng.random() < 0.12:
            deadline = min(a.maxdc for a in unknown if a.maxdc)
            self.schedule(int(deadline * self.per_second) + 1, K_EXPIRE, node, node.epoch)
            away = int(deadline * self.per_second)
        else:
            away = self.after(10, 50)
            self.schedule(away, K_RETURN, node, node.epoch)
        if unknown and rng.random() < P_NOMAD_RACE:
            self.schedule(max(1, away // 2), K_NOMAD, unknown[0], node.epoch)
        return body

    def node_down(self) -> Body | None:
        node = self.pick(3)
        if node is None:
            return None
        reason = self.rng.choice(DOWN_REASONS)
        self.down_fate(self.cascade(node, DOWN))
        return ("node-down", {"node": node.name, "reason": reason})

    def node_removed(self) -> Body | None:
        node = self.pick(3)
        if node is None:
            return None
        self.cascade(node, REMOVED)
        return ("node-removed", {"node": node.name})

    def suspect(self) -> Body | None:
        node = self.pick(3)
        if node is None:
            return None
        self.suspected(node, 2, 20)
        return ("node-suspected", {"node": node.name, "reason": self.rng.choice(SUSPECT_REASONS)})

    def suspected(self, node: Node, low: float, high: float) -> None:
        """A ready node turned suspect: a health check follows (Drydock), and
        now and then a placement on it first (the race)."""
        node.health = SUSPECT
        self.schedule(self.after(low, high), K_HEALTH, node, 0)
        if self.rng.random() < P_SUSPECT_RACE:
            self.schedule(self.after(0.1, low / 2), K_SUSPECT_RACE, node, node.epoch)

    def new_placement(self, node: Node) -> Body:
        """A race's placement with a fresh id (on its first free slot, if any),
        which the ledger rejects: the id is never placed, the model keeps nothing."""
        self.alloc_count += 1
        job = f"batch-{self.rng.randrange(self.jobs):03d}"
        body: dict[str, Any] = {"alloc": f"a{self.alloc_count:07d}", "node": node.name, "job": job}
        if None in node.table:
            body["slot"] = node.table.index(None)
        return ("alloc-placed", body)

    def flink_race(self) -> Body | None:
        """Place a new allocation on a slot another allocation holds."""
        for _ in range(8):
            node = self.pick(1)
            if node is None or not node.slots:
                continue
            held = [k for k, a in enumerate(node.table) if a is not None]
            if held:
                placed = self.new_placement(node)
                placed[1]["slot"] = self.rng.choice(held)
                return placed
        return None

    def flink_again_race(self) -> Body | None:
        """Place an allocation that holds a slot again, on another slot."""
        rng = self.rng
        for _ in range(8):
            node = self.pick(1)
            if node is None or not node.slots:
                continue
            held = [alloc_id for alloc_id in node.table if alloc_id is not None]
            if not held:
                continue
            a = node.allocs[rng.choice(held)]
            k = a.slot
            target = self.pick(2)
            if target is None or not target.slots:
                target = node
            if target is not node:
                slot = rng.randrange(target.slots)
            elif node.slots > 1:  # another slot of its own node
                slot = (k + 1 + rng.randrange(node.slots - 1)) % node.slots
            else:
                continue
            return ("alloc-placed", {"alloc": a.id, "node": target.name, "job": a.job, "slot": slot})
        return None

    def zombie_race(self) -> Body | None:
        """A slot report that gets an allocation wrong: one history released,
        one never placed, one allocation on two slots, or one that history
        binds to another slot or node. The node's next report is right."""
        rng = self.rng
        r = rng.random()
        reason = next(name for share, name in ZOMBIE_SHARES if r < share)
        if reason == "released":
            released = self.released
            for _ in range(min(8, len(released))):
                alloc_id, node, slot = released[rng.randrange(len(released))]
                if node.status == READY and node.table[slot] is None:
                    return self.heartbeat(node, ((slot, alloc_id),))
            return None
        for _ in range(8):
            node = self.pick(1)
            if node is None or None not in node.table:
                continue
            table = node.table
            free = [k for k, a in enumerate(table) if a is None]
            held = [k for k, a in enumerate(table) if a is not None]
            j = rng.choice(free)
            if reason == "unknown-alloc":
                self.alloc_count += 1  # an id that is never placed
                return self.heartbeat(node, ((j, f"a{self.alloc_count:07d}"),))
            if reason == "duplicate":
                if held:
                    return self.heartbeat(node, ((j, table[rng.choice(held)]),))
                continue
            if held and rng.random() < 0.5:  # moved to another slot of the node
                k = rng.choice(held)
                return self.heartbeat(node, ((k, None), (j, table[k])))
            other = self.pick(2)  # moved here from another node
            if other is None or other is node:
                continue
            for a in other.allocs.values():
                if a.client not in TERMINAL:
                    return self.heartbeat(node, ((j, a.id),))
        return None

    # ------------------------------------------------ scheduled follow-ups

    def follow_up(self, kind: int, target: Any, token: int) -> Body | None:
        if kind <= K_REAP:
            return self.lifecycle(kind, target, token)
        if kind == K_RETURN:
            node = target
            if node.epoch != token or node.status == REMOVED:
                return None
            body = self.heartbeat(node)
            if node.status == DOWN:  # its parent is not back yet: it tries again later
                self.schedule(self.after(30, 300), K_RETURN, node, node.epoch)
            if node.status == INIT:
                if self.rng.random() < P_INIT_RACE:  # before its allocations reconnect
                    self.schedule(1, K_INIT_RACE, node, node.epoch)
                delay = 0
                for a in node.allocs.values():
                    if a.client == UNKNOWN:
                        delay += self.after(0.1, 1)
                        self.schedule(delay, K_RECONNECT, a, a.stage)
            if node.health == SUSPECT:
                self.schedule(self.after(2, 20), K_HEALTH, node, 0)
            return body
        if kind == K_RECONNECT:
            a = target
            if a.stage != token or a.client != UNKNOWN or a.node.status not in CONNECTED:
                return None
            self.reported(a.node)
            if self.rng.random() < 0.05:  # it finished while the node was away
                self.terminate(a, COMPLETE)
                return ("alloc-updated", {"alloc": a.id, "client_status": COMPLETE})
            a.client = RUNNING
            return ("alloc-updated", {"alloc": a.id, "client_status": RUNNING})
        if kind == K_EXPIRE:
            node = target
            if node.epoch != token or node.status != DISC:
                return None
            self.down_fate(self.cascade(node, DOWN))
            return ("node-down", {"node": node.name, "reason": "max disconnect expired"})
        if kind == K_HEALTH:
            node = target
            if node.health != SUSPECT or node.status not in CONNECTED:
                if node.status == DISC:
                    self.schedule(self.after(5, 20), K_HEALTH, node, 0)
                return None
            passed = self.rng.random() < 0.92
            if passed:
                node.health = OK
            else:
                self.down_fate(self.cascade(node, DOWN))
            return ("health-checked", {"node": node.name, "passed": passed})
        if kind == K_REMOVE:
            node = target
            if node.epoch != token or node.status == REMOVED:
                return None
            self.cascade(node, REMOVED)
            return ("node-removed", {"node": node.name})
        if kind == K_NOMAD:
            a = target
            node = a.node
            if node.epoch != token or node.status != DISC or a.client != UNKNOWN:
                return None
            return ("alloc-updated", {"alloc": a.id, "client_status": RUNNING})
        if kind == K_SWARM:
            a = target
            if a.stage != token or a.client in TERMINAL:
                return None
            node = self.pick(4)
            if node is None:
                return None
            self.alloc_count += 1
            body: dict[str, Any] = {"alloc": f"a{self.alloc_count:07d}", "node": node.name, "job": a.job}
            if None in node.table:
                body["slot"] = node.table.index(None)
            body["addresses"] = [a.addrs[0]]
            return ("alloc-placed", body)
        if kind == K_EARLY_REMOVE:
            a = target
            if a.stage != token or a.client != RUNNING:
                return None
            return ("alloc-removed", {"alloc": a.id})
        if kind == K_INIT_RACE:
            node = target
            if node.epoch != token or node.status != INIT:
                return None
            return self.new_placement(node)
        if kind == K_SUSPECT_RACE:
            node = target
            if node.epoch != token or node.status != READY or node.health != SUSPECT:
                return None
            return self.new_placement(node)
        if kind == K_COPY_RACE:
            node = target
            if node.epoch != token or node.status != DOWN:
                return None
            return self.new_placement(node)
        raise AssertionError(kind)

    def lifecycle(self, kind: int, a: Alloc, token: int) -> Body | None:
        if a.stage != token:
            return None
        node = a.node
        if kind == K_REAP:
            if a.desired != REMOVE and self.rng.random() < 0.3:
                a.desired = REMOVE
                self.schedule(self.after(1, 20), K_REAP, a, a.stage)
                return ("alloc-remove-requested", {"alloc": a.id})
            a.stage += 1
            del node.allocs[a.id]
            return ("alloc-removed", {"alloc": a.id})
        if node.status not in CONNECTED or a.client == UNKNOWN:
            self.schedule(self.after(5, 30), kind, a, token)  # wait for the node
            return None
        rng = self.rng
        if kind == K_RUN:
            a.client = RUNNING
            a.stage += 1
            self.reported(node)
            if a.service:
                life = 1 + int(rng.expovariate(1 / self.service_life))
            else:
                life = self.after(5, 240)
            self.schedule(life, K_END, a, a.stage)
            return ("alloc-updated", {"alloc": a.id, "client_status": RUNNING})
        if kind == K_END:
            r = rng.random()
            if r < 0.45:
                self.reported(node)
                self.terminate(a, COMPLETE)
                return ("alloc-updated", {"alloc": a.id, "client_status": COMPLETE})
            if r < 0.62:
                self.reported(node)
                self.terminate(a, FAILED)
                return ("alloc-updated", {"alloc": a.id, "client_status": FAILED, "blame": "alloc"})
            if r < 0.635 and node.health == OK:
                self.reported(node)
                self.terminate(a, FAILED)
                self.suspected(node, 1, 10)
                return ("alloc-updated", {"alloc": a.id, "client_status": FAILED, "blame": "node"})
            a.stage += 1
            self.schedule(self.after(1, 15), K_STOPPED, a, a.stage)
            if a.addrs:
                if rng.random() < P_SWARM_RACE:
                    self.schedule(self.after(0.1, 0.9), K_SWARM, a, a.stage)
                if rng.random() < P_EARLY_REMOVE:
                    self.schedule(self.after(0.1, 0.9), K_EARLY_REMOVE, a, a.stage)
            if r < 0.82:
                a.desired = STOP
                return ("alloc-stop-requested", {"alloc": a.id})
            a.desired = REMOVE
            return ("alloc-remove-requested", {"alloc": a.id})
        if kind == K_STOPPED:
            self.reported(node)
            if rng.random() < 0.95:
                self.terminate(a, COMPLETE)
                return ("alloc-updated", {"alloc": a.id, "client_status": COMPLETE})
            self.terminate(a, FAILED)
            return ("alloc-updated", {"alloc": a.id, "client_status": FAILED, "blame": "alloc"})
        raise AssertionError(kind)

    # ------------------------------------------------------------ stream

    def bootstrap(self) -> Iterator[Body]:
        """Register the nodes (a tenth are working copies on hosts), then a heartbeat each."""
        rng = self.rng
        for k in range(self.initial_nodes):
            parent = None
            if k >= 4 and rng.random() < 0.1:
                parent = self.hosts[rng.randrange(len(self.hosts))]
            yield self.registered(self.new_node(parent))
        for node in list(self.nodes):
            yield self.heartbeat(node)

    def spontaneous(self, r: float) -> Body | None:
        """The rare happenings, chosen by r in [0, P_RARE)."""
        r -= P_PLACE
        if r < 0:
            return self.place()
        for probability, happen in self.rare:
            r -= probability
            if r < 0:
                return happen()
        return None

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self.stream(False)

    def lines(self) -> Iterator[str]:
        """The same events as compact JSON lines (no newline), faster than encoding dicts."""
        return self.stream(True)

    def stream(self, as_lines: bool) -> Iterator[Any]:
        total = self.events
        ids = self.ids
        source = self.source
        id_template = f"e%0{max(6, len(str(total)))}d"
        t_us = self.start_us
        dt_us = self.dt_us
        last_ms = None
        last_sec = None
        prefix = ""
        at = ""
        boot = self.bootstrap()
        boot_events = 2 * self.initial_nodes
        heap = self.heap
        heappop = heapq.heappop
        random = self.rng.random
        follow_up = self.follow_up
        spontaneous = self.spontaneous
        next_heartbeat = self.next_heartbeat
        nodes = self.nodes
        p_rare = P_PLACE + sum(probability for probability, _ in self.rare)
        both = bool(ids and source)
        encode = _line_encoder()
        quoted_source = f',"source":{json.dumps(source)}' if source else ""
        # Plain heartbeats (and their slot reports; alloc ids are plain ASCII) are
        # formatted here directly; the id placeholder takes "" when ids are off.
        heartbeat_head = '{"type":"heartbeat"' + (',"id":"%s"' if ids else "%s") + ',"at":"%s"' + quoted_source
        heartbeat_line = heartbeat_head + ',"node":%s}'
        report_line = heartbeat_head + ',"node":%s,"slots":[%s]}'
        event_head = '{"type":"%s"' + (',"id":"%s"' if ids else "%s") + ',"at":"%s"' + quoted_source + ","
        report = 0
        rr = 0
        ident = ""
        step: Body | None
        event: dict[str, Any]
        for i in range(total):
            self.i = i
            ms = t_us // 1000
            t_us += dt_us
            if ms != last_ms:
                last_ms = ms
                sec = ms // 1000
                if sec != last_sec:
                    last_sec = sec
                    prefix = (_EPOCH + timedelta(seconds=sec)).strftime("%Y-%m-%dT%H:%M:%S")
                at = f"{prefix}.{ms - sec * 1000:03d}Z"
            if ids:
                ident = id_template % (i + 1)
            if i < boot_events:
                step = next(boot)
            else:
                while True:
                    if heap and heap[0][0] <= i:
                        _, _, action, target, token = heappop(heap)
                        step = follow_up(action, target, token)
                        if step is None:
                            continue
                        break
                    r = random()
                    if r < p_rare:
                        step = spontaneous(r)
                        if step is not None:
                            break
                    # The common case, a plain heartbeat from a ready node, inline.
                    node = nodes[rr]
                    rr += 1
                    if rr >= len(nodes):
                        rr = 0
                    if node.status == READY:
                        beats = node.beats + 1
                        node.beats = beats
                        report = node.slots and (node.dirty or beats % SLOT_REPORT_EVERY == node.phase)
                        step = None
                        break
                    self.rr = rr - 1 if rr else len(nodes) - 1
                    step = next_heartbeat()
                    rr = self.rr
                    break
                if step is None:
                    if report:
                        node.dirty = False
                        if as_lines:
                            entries = ",".join(
                                [
                                    f'{{"slot":{k},"alloc":"{a}"}}' if a else f'{{"slot":{k},"alloc":null}}'
                                    for k, a in enumerate(node.table)
                                ]
                            )
                            yield report_line % (ident, at, node.quoted, entries)
                            continue
                        step = ("heartbeat", {"node": node.name, "slots": slot_report(node.table)})
                    elif as_lines:
                        yield heartbeat_line % (ident, at, node.quoted)
                        continue
                    elif both:
                        yield {"type": "heartbeat", "id": ident, "at": at, "source": source, "node": node.name}
                        continue
                    else:
                        step = ("heartbeat", {"node": node.name})
            kind, body = step
            if as_lines:  # the envelope, then the body's fields (never empty)
                yield event_head % (kind, ident, at) + encode(body)[1:]
                continue
            if both:
                event = {"type": kind, "id": ident, "at": at, "source": source, **body}
            else:
                event = {"type": kind}
                if ids:
                    event["id"] = ident
                event["at"] = at
                if source:
                    event["source"] = source
                event.update(body)
            yield encode(event) if as_lines else event


def generate(
    events: int,
    nodes: int,
    slots: int,
    seed: int,
    start: str | datetime = DEFAULT_START,
    ids: bool = True,
    source: str | None = DEFAULT_SOURCE,
) -> Iterator[dict[str, Any]]:
    """Yield exactly `events` event dicts of a simulated cluster history.

    The first events register `nodes` nodes (some of them working copies
    with a parent host), then each heartbeats once; placements, status
    updates, disconnects and the rest follow. Streams: memory is bounded by
    the cluster's size, not by `events`.
    """
    return iter(_Simulation(events, nodes, slots, seed, start, ids, source))


def generate_lines(
    events: int,
    nodes: int,
    slots: int,
    seed: int,
    start: str | datetime = DEFAULT_START,
    ids: bool = True,
    source: str | None = DEFAULT_SOURCE,
) -> Iterator[str]:
    """The same history as `generate`, as compact JSON lines without newlines.

    Byte for byte `json.dumps(event, separators=(",", ":"))` of each event,
    about twice as fast; this is what the command line writes.
    """
    return _Simulation(events, nodes, slots, seed, start, ids, source).lines()


def _line_encoder() -> Callable[[Any], str]:
    """json.dumps(event, separators=(",", ":")), minus its per-call setup."""
    encoder = json.JSONEncoder(separators=(",", ":"), check_circular=False)
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return encoder.encode
    chunks = make(None, encoder.default, json.encoder.encode_basestring_ascii, None, ":", ",", False, False, True)
    join = "".join

    def encode(event: Any) -> str:
        return join(chunks(event, 0))

    return encode


def _count(minimum: int) -> Callable[[str], int]:
    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}: {value}")
        return value

    return convert


def _timestamp(text: str) -> str:
    try:
        parse_start(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an RFC 3339 timestamp: {text!r}") from None
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="simulate.py",
        description=(
            "Write a deterministic, realistic cluster history as JSON Lines "
            "(alloc-ledger events), with a few races the ledger rejects or flags."
        ),
        epilog="example: python scripts/simulate.py --events 100000 --nodes 1000 --seed 7 > history.jsonl",
    )
    parser.add_argument("--events", type=_count(0), default=1000, help="exact number of events (default 1000)")
    parser.add_argument("--nodes", type=_count(1), default=10, help="nodes registered at the start (default 10)")
    parser.add_argument("--slots", type=_count(0), default=4, help="slots per node (default 4)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument(
        "--start", type=_timestamp, default=DEFAULT_START, help=f"time of the first event, RFC 3339 (default {DEFAULT_START})"
    )
    parser.add_argument(
        "--ids",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="give every event a unique id like e000001 (default: on)",
    )
    parser.add_argument("--source", default=DEFAULT_SOURCE, help=f"source field of every event, '' for none (default {DEFAULT_SOURCE})")
    parser.add_argument("--out", metavar="FILE", help="write to FILE instead of standard output")
    args = parser.parse_args(argv)

    lines = generate_lines(args.events, args.nodes, args.slots, args.seed, args.start, args.ids, args.source or None)
    try:
        if args.out:
            with open(args.out, "w", encoding="utf-8", newline="\n") as out:
                _write(lines, out)
        else:
            _write(lines, sys.stdout)
            sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (| head): stop quietly, like other filters.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except OSError as error:
        print(f"simulate.py: error: {error}", file=sys.stderr)
        return 1
    return 0


def _write(lines: Iterator[str], out: TextIO, batch: int = 8192) -> None:
    buffer: list[str] = []
    append = buffer.append
    for line in lines:
        append(line)
        if len(buffer) >= batch:
            append("")
            out.write("\n".join(buffer))
            buffer.clear()
    if buffer:
        append("")
        out.write("\n".join(buffer))


if __name__ == "__main__":
    sys.exit(main())
