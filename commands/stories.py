"""The four stories of ``alloc-ledger demo``, as data: one per source system,
each replaying a real bug report as events, with what the demo says at each
step and the questions it asks on the way.

A story is a list of ``Step`` (an event, what it means, whether a rule must
refuse it and why) and ``Ask`` (a question of SPEC section 3 and what its
answer shows). Every event carries a fixed ``at``, so deadlines and
``--as-of TIMESTAMP`` answers are the same on every run. Each story uses its
own node and allocation names, so the stories can share one store.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Step:
    """One event of a story; ``reason`` is the rejection a rule must give."""

    event: dict[str, Any]
    says: str
    expect: str = "appended"
    reason: str | None = None


@dataclass(frozen=True)
class Ask:
    """One question of SPEC section 3, asked at this point of a story."""

    query: str
    says: str
    now: str | None = None  # needs-reconnect: the time deadlines are judged against
    node: str | None = None  # slots, allocs: only this node
    target: str | None = None  # alloc: the allocation; history: the entity

    def args(self) -> list[str]:
        """The ``alloc-ledger query`` arguments that ask the same question."""
        args = [self.query]
        if self.target is not None:
            args.append(self.target)
        if self.node is not None:
            args += ["--node", self.node]
        if self.now is not None:
            args += ["--now", self.now]
        return args


@dataclass(frozen=True)
class Story:
    key: str
    title: str
    reports: str
    narration: str
    items: tuple[Step | Ask, ...]

    @property
    def steps(self) -> list[Step]:
        return [item for item in self.items if isinstance(item, Step)]

    @property
    def events(self) -> list[dict[str, Any]]:
        return [step.event for step in self.steps]


def _step(at: str, kind: str, says: str, refused: str | None = None, **fields: Any) -> Step:
    """An event at a fixed time; ``refused`` is the reason a rule must give."""
    event = {"type": kind, **fields, "at": at}
    return Step(event, says, "rejected" if refused else "appended", refused)


NOMAD = Story(
    key="nomad",
    title="Nomad: a client disconnects and comes back",
    reports="hashicorp/nomad #15068, #15808 (max_client_disconnect)",
    narration=(
        "Client n1 runs a1 (max_disconnect 300 s) and a2 (none). It misses its\n"
        "heartbeats: a1 becomes unknown and waits to reconnect until its deadline,\n"
        "a2 is lost. While n1 is away it takes no placements and may not update\n"
        "allocations. When it heartbeats again it comes back initializing, not\n"
        "ready, until it has reported its allocations (#15808); a stale report for\n"
        "the lost a2 is refused; a1's report reconnects it and n1 is ready again."
    ),
    items=(
        _step("2026-03-02T09:00:00Z", "node-registered", "client n1 joins", node="n1"),
        _step("2026-03-02T09:00:05Z", "heartbeat", "n1 heartbeats: ready", node="n1"),
        _step(
            "2026-03-02T09:00:10Z", "alloc-placed",
            "a1 (job web) is placed on n1, allowed 300 s disconnected",
            alloc="a1", node="n1", job="web", max_disconnect=300,
        ),
        _step(
            "2026-03-02T09:00:15Z", "alloc-placed", "a2 (job cron) is placed on n1",
            alloc="a2", node="n1", job="cron",
        ),
        _step(
            "2026-03-02T09:00:20Z", "alloc-updated", "n1 reports a1 running",
            alloc="a1", client_status="running",
        ),
        _step(
            "2026-03-02T09:00:25Z", "alloc-updated", "n1 reports a2 running",
            alloc="a2", client_status="running",
        ),
        _step(
            "2026-03-02T09:01:00Z", "heartbeat-missed",
            "n1 misses its heartbeats: disconnected; a1 unknown, a2 lost",
            node="n1",
        ),
        Ask("nodes", "n1 is disconnected"),
        Ask(
            "needs-reconnect",
            "a1 waits to reconnect until 09:06 (unknown since 09:01 + 300 s); "
            "at 09:03 it has not expired",
            now="2026-03-02T09:03:00Z",
        ),
        Ask(
            "needs-reconnect", "the same question at 09:07: the deadline has passed",
            now="2026-03-02T09:07:00Z",
        ),
        _step(
            "2026-03-02T09:02:00Z", "alloc-placed",
            "the scheduler tries to place a3 on the disconnected n1",
            refused="node n1 is not ready (status disconnected); it takes no placements",
            alloc="a3", node="n1", job="web",
        ),
        _step(
            "2026-03-02T09:02:30Z", "alloc-updated",
            "an update for a1 arrives while n1 is disconnected",
            refused="node n1 is not allowed to update allocs while in status disconnected",
            alloc="a1", client_status="running",
        ),
        _step(
            "2026-03-02T09:04:00Z", "heartbeat",
            "n1 heartbeats again: initializing, since a1 still has to reconnect",
            node="n1",
        ),
        Ask("nodes", "n1 is initializing: no placements until it has reported its allocations"),
        _step(
            "2026-03-02T09:04:05Z", "alloc-placed",
            "the scheduler tries a3 on n1 before n1 has reported its allocations",
            refused="node n1 is not ready (status initializing); it takes no placements",
            alloc="a3", node="n1", job="web",
        ),
        _step(
            "2026-03-02T09:04:10Z", "alloc-updated",
            "a stale report says a2 is running, after the server marked it lost",
            refused="allocation a2 is lost; a terminal status never changes",
            alloc="a2", client_status="running",
        ),
        Ask("needs-reconnect", "before the reconnecting update: a1 still waits",
            now="2026-03-02T09:04:10Z"),
        _step(
            "2026-03-02T09:04:20Z", "alloc-updated",
            "n1 reports a1 running: a1 reconnects (alloc state running), n1 is ready",
            alloc="a1", client_status="running",
        ),
        Ask("needs-reconnect", "after it: nothing waits to reconnect",
            now="2026-03-02T09:04:20Z"),
        Ask("nodes", "n1 is ready again"),
        Ask("allocs", "a1 running again; a2 stays lost, desired stop", node="n1"),
        Ask("alloc", "a1's alloc states: unknown on disconnect, running on reconnect",
            target="a1"),
    ),
)

FLINK = Story(
    key="flink",
    title="Flink: the TaskManager's slot table drifts from the JobMaster's",
    reports="FLINK-14589 (zombie slots)",
    narration=(
        "TaskManager tm1 offers 5 slots. f1 is placed on slot 0; a second\n"
        "allocation for slot 0 is refused, and so is re-placing f1 on another\n"
        "slot (the Flink fix). f1 completes and history frees slot 0, but tm1's\n"
        "heartbeat still reports f1 there: a zombie slot. A later, messier report\n"
        "shows the other kinds of drift: an allocation never placed, one reported\n"
        "away from its slot, one reported on two slots."
    ),
    items=(
        _step("2026-03-02T10:00:00Z", "node-registered", "TaskManager tm1 offers 5 slots",
              node="tm1", slots=5),
        _step("2026-03-02T10:00:05Z", "heartbeat", "tm1 heartbeats: ready", node="tm1"),
        _step(
            "2026-03-02T10:00:10Z", "alloc-placed", "f1 (job wordcount) gets slot tm1#0",
            alloc="f1", node="tm1", job="wordcount", slot=0,
        ),
        _step("2026-03-02T10:00:15Z", "alloc-updated", "tm1 reports f1 running",
              alloc="f1", client_status="running"),
        _step(
            "2026-03-02T10:00:20Z", "alloc-placed", "f2 asks for the same slot tm1#0",
            refused="slot tm1#0 is already held by allocation f1",
            alloc="f2", node="tm1", job="wordcount", slot=0,
        ),
        _step(
            "2026-03-02T10:00:25Z", "alloc-placed", "f1 is placed again, on slot tm1#1",
            refused="allocation f1 already holds slot tm1#0",
            alloc="f1", node="tm1", job="wordcount", slot=1,
        ),
        _step(
            "2026-03-02T10:00:30Z", "alloc-placed", "f2 gets slot tm1#1 instead",
            alloc="f2", node="tm1", job="wordcount", slot=1,
        ),
        _step("2026-03-02T10:00:35Z", "alloc-updated", "tm1 reports f2 running",
              alloc="f2", client_status="running"),
        _step(
            "2026-03-02T10:00:40Z", "alloc-placed", "f3 gets slot tm1#2",
            alloc="f3", node="tm1", job="wordcount", slot=2,
        ),
        _step("2026-03-02T10:00:45Z", "alloc-updated", "tm1 reports f3 running",
              alloc="f3", client_status="running"),
        _step("2026-03-02T10:01:00Z", "alloc-updated",
              "f1 completes: history frees slot tm1#0",
              alloc="f1", client_status="complete"),
        _step(
            "2026-03-02T10:01:05Z", "heartbeat",
            "tm1's heartbeat slot report still shows f1 on slot 0",
            node="tm1",
            slots=[
                {"slot": 0, "alloc": "f1"},
                {"slot": 1, "alloc": "f2"},
                {"slot": 2, "alloc": "f3"},
            ],
        ),
        Ask("zombie-slots", "tm1#0 is a zombie: f1 is complete (released)"),
        _step(
            "2026-03-02T10:02:00Z", "heartbeat",
            "a later report: f9 on slot 2, f3 on slot 3, f2 on slots 1 and 4",
            node="tm1",
            slots=[
                {"slot": 0, "alloc": "f1"},
                {"slot": 1, "alloc": "f2"},
                {"slot": 2, "alloc": "f9"},
                {"slot": 3, "alloc": "f3"},
                {"slot": 4, "alloc": "f2"},
            ],
        ),
        Ask(
            "zombie-slots",
            "released (f1 is complete), unknown-alloc (f9 was never placed), moved "
            "(f3 holds tm1#2), duplicate (f2 on two slots)",
        ),
        Ask("slots", "the ledger's slot table beside tm1's report", node="tm1"),
    ),
)

SWARMKIT = Story(
    key="swarmkit",
    title="Swarmkit: a task's IP address freed before the task shut down",
    reports="docker/swarmkit #2407",
    narration=(
        "Task t1 on worker w1 holds 10.0.0.5. The service is scaled down: t1 is\n"
        "to be removed, so its address is releasing, but it is not free: t1 is\n"
        "still running. Reaping t1 now is refused, and so is a new task t2 asking\n"
        "for 10.0.0.5. Once t1 reports complete the address is free, t1 can be\n"
        "reaped and t2 gets the address."
    ),
    items=(
        _step("2026-03-02T11:00:00Z", "node-registered", "worker w1 joins", node="w1"),
        _step("2026-03-02T11:00:05Z", "heartbeat", "w1 heartbeats: ready", node="w1"),
        _step(
            "2026-03-02T11:00:10Z", "alloc-placed", "task t1 (service api) takes 10.0.0.5",
            alloc="t1", node="w1", job="api", addresses=["10.0.0.5"],
        ),
        _step("2026-03-02T11:00:15Z", "alloc-updated", "w1 reports t1 running",
              alloc="t1", client_status="running"),
        _step("2026-03-02T11:01:00Z", "alloc-remove-requested",
              "the service is scaled down: t1 is to be removed", alloc="t1"),
        Ask("addresses", "10.0.0.5 is releasing, still held by t1"),
        _step(
            "2026-03-02T11:01:05Z", "alloc-removed", "the orchestrator reaps t1 at once",
            refused="allocation t1 is running; removing it now would free 10.0.0.5 "
            "before it shuts down",
            alloc="t1",
        ),
        _step(
            "2026-03-02T11:01:10Z", "alloc-placed", "new task t2 asks for 10.0.0.5",
            refused="address 10.0.0.5 is still held by allocation t1, which has not shut down",
            alloc="t2", node="w1", job="api", addresses=["10.0.0.5"],
        ),
        _step("2026-03-02T11:01:30Z", "alloc-updated",
              "w1 reports t1 complete: 10.0.0.5 is free", alloc="t1", client_status="complete"),
        Ask("addresses", "no address is held"),
        _step("2026-03-02T11:01:35Z", "alloc-removed", "t1 is reaped", alloc="t1"),
        _step(
            "2026-03-02T11:01:40Z", "alloc-placed", "t2 asks again and gets 10.0.0.5",
            alloc="t2", node="w1", job="api", addresses=["10.0.0.5"],
        ),
        _step("2026-03-02T11:01:45Z", "alloc-updated", "w1 reports t2 running",
              alloc="t2", client_status="running"),
        Ask("addresses", "10.0.0.5 is held by t2"),
        Ask("allocs", "t1 is gone from the live tables; its history stays", node="w1"),
    ),
)

DRYDOCK = Story(
    key="drydock",
    title="Drydock: a host vanished and took its working copies and leases",
    reports="Phabricator T8153",
    narration=(
        "Host host1 carries working copy wc1 (parent host1); lease1 is on host1,\n"
        "lease2 on wc1. The host stops answering: it is suspected, and takes no\n"
        "new lease. Its health check fails: host1 goes down, wc1 goes down with\n"
        "it, and both leases are lost. `suspects` shows what went down with it."
    ),
    items=(
        _step("2026-03-02T12:00:00Z", "node-registered", "host host1 is registered",
              node="host1"),
        _step("2026-03-02T12:00:05Z", "heartbeat", "host1 heartbeats: ready", node="host1"),
        _step("2026-03-02T12:00:10Z", "node-registered",
              "working copy wc1 is registered on host1", node="wc1", parent="host1"),
        _step("2026-03-02T12:00:15Z", "heartbeat", "wc1 heartbeats: ready", node="wc1"),
        _step("2026-03-02T12:00:20Z", "alloc-placed", "lease1 is leased on host1",
              alloc="lease1", node="host1", job="build"),
        _step("2026-03-02T12:00:25Z", "alloc-updated", "lease1 is in use",
              alloc="lease1", client_status="running"),
        _step("2026-03-02T12:00:30Z", "alloc-placed", "lease2 is leased on wc1",
              alloc="lease2", node="wc1", job="build"),
        _step("2026-03-02T12:00:35Z", "alloc-updated", "lease2 is in use",
              alloc="lease2", client_status="running"),
        _step("2026-03-02T12:01:00Z", "node-suspected",
              "host1 stops answering: it is suspected",
              node="host1", reason="ssh timed out"),
        Ask("suspects", "host1 is suspect, still ready"),
        _step(
            "2026-03-02T12:01:05Z", "alloc-placed", "lease3 asks for host1",
            refused="node host1 is suspect; it takes no placements",
            alloc="lease3", node="host1", job="build",
        ),
        _step(
            "2026-03-02T12:02:00Z", "health-checked",
            "host1's health check fails: host1 down, wc1 down with it, leases lost",
            node="host1", passed=False,
        ),
        _step(
            "2026-03-02T12:02:05Z", "alloc-placed", "lease3 asks for wc1 instead",
            refused="node wc1 is not ready (status down); it takes no placements",
            alloc="lease3", node="wc1", job="build",
        ),
        Ask("suspects", "what went down with host1: wc1, lease1 and lease2"),
        Ask("allocs", "both leases lost, desired stop", node="wc1"),
    ),
)

STORIES: tuple[Story, ...] = (NOMAD, FLINK, SWARMKIT, DRYDOCK)

EPILOGUE: tuple[Ask, ...] = (
    Ask("rejections", "every refused event, kept with its reason for audits"),
    Ask("history", "the whole life of 10.0.0.5, refusals included", target="10.0.0.5"),
)


def all_events() -> list[dict[str, Any]]:
    """Every event of every story, in the order the demo submits them."""
    return [event for story in STORIES for event in story.events]
