"""Streams that interleave the four stories and lean on the rare paths, for
the property tests (``tests/unit/test_properties_stories.py``,
``tests/integration/test_properties_stories_pg.py``).

``story_scenarios`` draws streams as ``model_support.scenarios`` does (the
same generator, decided by the same model), with more actions: kills of
nodes already disconnected or down, cascades through parent chains several
nodes deep and through children already down, health checks failing on a
disconnected node, stop and remove requests while an allocation waits to
reconnect, a slot or an address taken again after its holder finished or
was removed, a failed allocation blamed on a node already suspect.
``rare`` says which of those paths an event takes.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st
from model_support import ACTIONS, Generator, Model, Scenario, drawn_scenario


class StoryGenerator(Generator):
    """``model_support.Generator`` with actions aimed at the rare paths."""

    def _live(self) -> list[str]:
        return [a.name for a in self.model.live()]

    def storm(self) -> None:
        """A kill or a miss for a node that is not simply ready: disconnected,
        initializing with allocations to reconnect, down, or above one down."""
        m = self.model
        if not self.node_names("disconnected") and self.pct(75):
            if not self.exposed():  # Nomad's story up to the disconnect, first
                self.place(max_disconnect=self.pick([60, 3600]))
                placed = self.steps[-1].event or {}
                if placed.get("alloc") in m.allocs:
                    self.update(placed["alloc"], "running")
            exposed = self.exposed()
            if exposed:
                self.emit({"type": "heartbeat-missed", "node": self.pick(exposed).node}, "miss")
        gone = self.node_names("disconnected")
        odd = gone if gone and self.pct(60) else [
            n.name for n in m.nodes.values() if n.status in ("disconnected", "initializing", "down")]
        above = [n.name for n in m.nodes.values() if n.status != "removed"
                 and any(c.parent == n.name and c.status == "down" for c in m.nodes.values())]
        node = self.a_node(above if above and self.pct(40) else odd, 90)
        kind = self.pick(["node-down", "node-removed", "health-checked", "health-checked",
                          "heartbeat-missed"])
        event: dict[str, Any] = {"type": kind, "node": node}
        if kind == "health-checked":
            event["passed"] = self.pct(15)
        elif kind == "node-down" and self.pct(50):
            event["reason"] = "resource vanished"
        self.emit(event, "storm")

    def deepen(self) -> None:
        """A node under the deepest node there is, ready (Drydock's working copies)."""
        m = self.model

        def depth(name: str) -> int:
            count, parent = 0, m.nodes[name].parent
            while parent is not None:
                count, parent = count + 1, m.nodes[parent].parent
            return count

        up = [n.name for n in m.nodes.values() if n.status in ("ready", "initializing")]
        if not up:
            self.register()
            return
        parent = max(up, key=lambda n: (depth(n), self.draw(st.integers(0, 3))))
        self.names += 1
        name = f"n{self.names}"
        self.register(name, parent, self.pick([1, 2]))
        self.emit({"type": "heartbeat", "node": name}, "heartbeat")

    def desire_waiting(self) -> None:
        """A stop or remove request for an allocation that waits to reconnect,
        then maybe its node back and another miss (Nomad)."""
        m = self.model
        waiting = [a.name for a in m.allocs.values() if a.waiting]
        if not waiting:
            self.reconnect()
            return
        name = self.pick(waiting)
        kind = self.pick(["alloc-stop-requested", "alloc-remove-requested"])
        self.emit({"type": kind, "alloc": name}, kind)
        node = m.allocs[name].node
        if self.pct(60):
            self.emit({"type": "heartbeat", "node": node}, "heartbeat")
        if self.pct(50):
            self.emit({"type": "heartbeat-missed", "node": node}, "miss")
        if self.pct(50):
            self.update(name)

    def reuse(self) -> None:
        """A new allocation on the slot or the address of one that finished or
        was removed (Flink, Swarmkit); sometimes first finish and reap one."""
        m = self.model
        live = [a for a in m.live() if a.slot is not None or a.addresses]
        if live and self.pct(50):
            alloc = self.pick(live)
            self.update(alloc.name, self.pick(["complete", "failed"]))
            if self.pct(60):
                self.emit({"type": "alloc-removed", "alloc": alloc.name}, "alloc-removed")
        done = [a for a in m.allocs.values() if a.terminal and (a.slot is not None or a.addresses)]
        if not done:
            self.place()
            return
        old = self.pick(done)
        self.allocs += 1
        event: dict[str, Any] = {"type": "alloc-placed", "alloc": f"a{self.allocs}",
                                 "node": old.node}
        if old.slot is not None and self.pct(80):
            event["slot"] = old.slot
        if old.addresses and self.pct(80):
            event["addresses"] = list(old.addresses)
        if self.pct(50):
            event["max_disconnect"] = self.pick([0, 60])
        self.emit(event, "place again after the end")

    def blame(self) -> None:
        """Two allocations of one node fail, the first blamed on the node: the
        second fails on a node already suspect."""
        m = self.model
        suspect = [a.name for a in m.live() if m.nodes[a.node].health == "suspect"
                   and m.nodes[a.node].status in ("ready", "initializing")]
        if not suspect:
            ready = [n.name for n in m.nodes.values() if n.status == "ready" and n.health == "ok"]
            node = self.a_node(ready, 95)
            names = []
            for _ in range(2):
                self.allocs += 1
                names.append(f"a{self.allocs}")
                self.emit({"type": "alloc-placed", "alloc": names[-1], "node": node}, "place")
            self.emit({"type": "alloc-updated", "alloc": names[0], "client_status": "failed",
                       **({"blame": "node"} if self.pct(50) else {})}, "update")
            suspect = [names[1]]
        self.emit({"type": "alloc-updated", "alloc": self.pick(suspect),
                   "client_status": self.pick(["failed", "failed", "running", "complete"]),
                   **({"blame": self.pick(["node", "alloc"])} if self.pct(40) else {})}, "update")


STORY_ACTIONS = (
    list(ACTIONS) + ["storm"] * 8 + ["deepen"] * 3 + ["desire_waiting"] * 4 + ["reuse"] * 5
    + ["blame"] * 3 + ["reconnect"] * 4 + ["kill"] * 3
)


@st.composite
def story_scenarios(draw: st.DrawFn, max_steps: int = 50) -> Scenario:
    """Ready nodes, mostly in a chain or two, then the four stories interleaved."""
    gen = StoryGenerator(draw)

    def parent() -> str | None:  # mostly the last node: chains several deep
        if not (gen.names and gen.pct(70)):
            return None
        return f"n{gen.names}" if gen.pct(60) else gen.pick(gen.node_names())

    return drawn_scenario(draw, gen, draw(st.integers(2, 6)), parent, [2, 1, 3, 0],
                          STORY_ACTIONS, max_steps)


# The rare paths the plain streams reach in a few examples of hundreds.
STORY_REACH = (
    "node-down of a disconnected node", "node-removed of a disconnected node",
    "health failed on a disconnected node", "cascade through a down child",
    "cascade two levels down", "stop or remove while waiting to reconnect",
    "failed, blamed on a node already suspect", "slot taken again after its end",
    "address taken again after its end", "node-down of a down node",
)


def rare(model: Model, event: dict[str, Any]) -> list[str]:
    """Which rare paths one event (about to be submitted) takes."""
    found: list[str] = []
    kind = event["type"]
    node = model.nodes.get(event.get("node", "")) if "alloc" not in event else None
    alloc = model.allocs.get(event.get("alloc", ""))
    if node is not None and kind in ("node-down", "node-removed", "health-checked"):
        children = [c for c in model.nodes.values() if c.parent == node.name]
        if kind == "health-checked" and event.get("passed") is False:
            if node.status == "disconnected":
                found.append("health failed on a disconnected node")
        elif node.status == "disconnected":
            found.append(f"{kind} of a disconnected node")
        if kind == "node-down" and node.status == "down":
            found.append("node-down of a down node")
        if kind != "health-checked" or event.get("passed") is False:
            names = {c.name for c in children}
            if any(g.parent in names for g in model.nodes.values()):
                found.append("cascade two levels down")
                if any(c.status == "down" for c in children):
                    found.append("cascade through a down child")
    if alloc is not None and not alloc.removed:
        if kind in ("alloc-stop-requested", "alloc-remove-requested") and alloc.waiting:
            found.append("stop or remove while waiting to reconnect")
        if (kind == "alloc-updated" and event["client_status"] == "failed"
                and event.get("blame", "node") == "node" and not alloc.terminal
                and model.nodes[alloc.node].status in ("ready", "initializing")
                and model.nodes[alloc.node].health == "suspect"):
            found.append("failed, blamed on a node already suspect")
    if kind == "alloc-placed" and alloc is None and not model.broken(event):
        slot = event.get("slot")
        if slot is not None and any(a.node == event["node"] and a.slot == slot
                                    for a in model.allocs.values()):
            found.append("slot taken again after its end")
        if any(set(event.get("addresses") or ()) & set(a.addresses)
               for a in model.allocs.values()):
            found.append("address taken again after its end")
    return found


