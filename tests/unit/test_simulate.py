"""The simulator (scripts/simulate.py): its histories are valid, the ledger
accepts them but for the intended races of the four source systems, each
rejected or flagged as the SPEC says, and they are deterministic streams."""

from __future__ import annotations

import hashlib
import json
import os
import re
import sqlite3
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from ledger.application import Ledger
from ledger.domain import Cluster
from ledger.errors import RuleViolation
from ledger.events import EVENT_TYPES, received
from ledger.model import Fact, Receipt
from projections.audit import audit
from scripts import simulate
from scripts.simulate import generate, generate_lines

ROOT = Path(__file__).resolve().parents[2]

# Every rejection of a simulated history is one of these races (SPEC section 2).
RACES = {
    "Flink: a placement on a held slot":
        r"slot (\S+)#\d+ is already held by allocation \S+",
    "Flink: an allocation placed again on another slot":
        r"allocation \S+ already holds slot \S+#\d+",
    "Swarmkit: an address still held":
        r"address \S+ is still held by allocation \S+, which has not shut down",
    "Swarmkit: a running task removed":
        r"allocation \S+ is running; removing it now would free .+ before it shuts down",
    "Nomad: an update from a disconnected node":
        r"node \S+ is not allowed to update allocs while in status disconnected",
    "Nomad #15808: a placement on an initializing node":
        r"node \S+ is not ready \(status initializing\); it takes no placements",
    "Drydock: a placement on a suspect node":
        r"node \S+ is suspect; it takes no placements",
    "Drydock: a placement on a working copy down with its host":
        r"node \S+-wc\d+ is not ready \(status down\); it takes no placements",
}
FLINK = [kind for kind in RACES if kind.startswith("Flink")]
ZOMBIE_REASONS = {"released", "unknown-alloc", "duplicate", "moved"}

# A few sizes: slots 0 (no Flink at all), few nodes, more nodes; every one of
# them has working copies (a tenth of the nodes registered at the start).
HISTORIES = {
    "60 nodes x 4 slots": {"events": 50_000, "nodes": 60, "slots": 4, "seed": 1},
    "25 nodes x 2 slots": {"events": 30_000, "nodes": 25, "slots": 2, "seed": 2},
    "200 nodes x 0 slots": {"events": 30_000, "nodes": 200, "slots": 0, "seed": 3},
}


def race_of(error: str | None) -> str | None:
    for kind, pattern in RACES.items():
        if error is not None and re.fullmatch(pattern, error):
            return kind
    return None


@dataclass
class Submitted:
    events: list[dict[str, Any]]
    receipts: list[Receipt]
    zombies: list[dict[str, Any]]  # the audit's zombie_slots episodes

    def races(self) -> Counter[str | None]:
        return Counter(race_of(r.error) for r in self.receipts if r.status == "rejected")


@pytest.fixture(scope="module")
def submitted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Submitted]:
    """Each history submitted into a fresh SQLite ledger, and audited."""
    found = {}
    for name, params in HISTORIES.items():
        events = list(generate(**params))
        path = tmp_path_factory.mktemp("simulated") / "l.db"
        with Ledger.open(f"sqlite:///{path}") as ledger:
            receipts = list(ledger.submit_many(events, batch=1000))
            zombies = audit(ledger.store).sections["zombie_slots"]
        found[name] = Submitted(events, receipts, zombies)
    return found


def test_every_event_is_valid_and_every_rejection_an_intended_race(
    submitted: dict[str, Submitted],
) -> None:
    for name, history in submitted.items():
        assert len(history.receipts) == len(history.events), name
        statuses = Counter(r.status for r in history.receipts)
        assert set(statuses) <= {"appended", "rejected"}, (name, statuses)
        # every event kept, in order: position k is the k-th event
        assert [r.position for r in history.receipts] == list(range(1, len(history.events) + 1))
        unintended = [
            (r.position, r.error, history.events[r.position - 1])
            for r in history.receipts if r.status == "rejected" and race_of(r.error) is None
        ]
        assert unintended == [], name
        assert 0 < statuses["rejected"] < 0.005 * len(history.events), (name, statuses)


def test_each_race_happens(submitted: dict[str, Submitted]) -> None:
    seen = sum((history.races() for history in submitted.values()), Counter())
    assert set(seen) == set(RACES), seen
    assert not set(submitted["200 nodes x 0 slots"].races()) & set(FLINK)


def test_the_races_are_what_they_tell(submitted: dict[str, Submitted]) -> None:
    """Replayed in memory, each race's event meets the state it tells of: a
    working copy is down because a node it runs on is; a task removed while
    running was asked to stop; and exactly the rejected events are refused."""
    copy_down = "Drydock: a placement on a working copy down with its host"
    removed_running = "Swarmkit: a running task removed"
    checked: Counter[str] = Counter()
    for history in submitted.values():
        races = {r.position: race_of(r.error) for r in history.receipts if r.status == "rejected"}
        cluster = Cluster()
        for position, event in enumerate(history.events, 1):
            race = races.get(position)
            if race == copy_down:
                node = cluster.node(event["node"])
                assert node is not None and node.parent is not None
                assert cluster.down_ancestor(node) is not None, event
                checked[race] += 1
            elif race == removed_running:
                alloc = cluster.alloc(event["alloc"])
                assert alloc is not None and alloc.client_status == "running"
                assert alloc.desired_status in ("stop", "remove"), event
                checked[race] += 1
            try:
                cluster.apply(received(event), Fact(position, event["at"]))
            except RuleViolation:
                assert race is not None, event
            else:
                assert race is None, event
            cluster.take_changes()
    assert set(checked) == {copy_down, removed_running}


def test_each_zombie_reason_is_flagged(submitted: dict[str, Submitted]) -> None:
    reasons = Counter(z["reason"] for h in submitted.values() for z in h.zombies)
    assert set(reasons) == ZOMBIE_REASONS, reasons
    assert not submitted["200 nodes x 0 slots"].zombies
    for history in submitted.values():
        for zombie in history.zombies:
            if zombie["reason"] != "unknown-alloc" or zombie["ongoing"]:
                continue
            # an id never placed stays so: only the node's next report clears it
            cleared = history.events[zombie["cleared_position"] - 1]
            assert cleared["type"] == "heartbeat" and cleared["node"] == zombie["node"]
            assert "slots" in cleared


def zombie_view(path: Path) -> set[tuple[str, int, str, str]]:
    connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return set(connection.execute("SELECT node, slot, alloc, reason FROM zombie_slots"))
    finally:
        connection.close()


def test_a_zombie_is_in_the_view_until_the_node_reports_again(
    submitted: dict[str, Submitted], tmp_path: Path
) -> None:
    """The view at several points: where each race zombie appears, just
    before it clears, and where it clears."""
    history = submitted["60 nodes x 4 slots"]
    firsts = {}
    for zombie in history.zombies:
        if zombie["reason"] != "released" and not zombie["ongoing"]:
            firsts.setdefault(zombie["reason"], zombie)
    assert set(firsts) == ZOMBIE_REASONS - {"released"}
    checks: dict[int, list[tuple[tuple[str, int, str, str], bool]]] = {}
    for zombie in firsts.values():
        row = (zombie["node"], zombie["slot"], zombie["alloc"], zombie["reason"])
        checks.setdefault(zombie["appeared_position"], []).append((row, True))
        checks.setdefault(zombie["cleared_position"] - 1, []).append((row, True))
        checks.setdefault(zombie["cleared_position"], []).append((row, False))
    path = tmp_path / "l.db"
    done = 0
    with Ledger.open(f"sqlite:///{path}") as ledger:
        for position in sorted(checks):
            list(ledger.submit_many(history.events[done:position], batch=1000))
            done = position
            view = zombie_view(path)
            for row, shown in checks[position]:
                assert (row in view) == shown, (position, row, shown)


def test_a_node_missing_again_keeps_its_unknown_allocations_unknown() -> None:
    """As the ledger: an allocation still unknown from an earlier disconnect
    is not lost by the next one, and keeps its slot and addresses."""
    sim = simulate._Simulation(0, 1, 2, 0, simulate.DEFAULT_START, False, None)
    node = sim.new_node(None)
    node.status = simulate.READY
    waiting = simulate.Alloc("a1", node, "svc-000", 0, ("10.0.0.1",), 60, True)
    running = simulate.Alloc("a2", node, "svc-001", 1, (), 300, True)
    waiting.client, running.client = simulate.UNKNOWN, simulate.RUNNING
    for a in (waiting, running):
        node.allocs[a.id] = a
        node.table[a.slot] = a.id
    sim.held["10.0.0.1"] = waiting
    assert sim.miss() == ("heartbeat-missed", {"node": node.name})
    assert node.status == simulate.DISC
    assert (waiting.client, running.client) == (simulate.UNKNOWN, simulate.UNKNOWN)
    assert node.table == ["a1", "a2"] and sim.held == {"10.0.0.1": waiting}
    # back: still initializing while an allocation has to reconnect
    sim.heartbeat(node)
    sim.heartbeat(node)
    assert node.status == simulate.INIT


def test_a_working_copy_stays_down_while_its_host_is_down() -> None:
    """As the ledger: a heartbeat does not bring back a node whose parent is
    down; once the host is back, the copy's next heartbeat does."""
    sim = simulate._Simulation(0, 1, 0, 0, simulate.DEFAULT_START, False, None)
    host = sim.new_node(None)
    copy = sim.new_node(host)
    cluster = Cluster()
    events = [sim.registered(host), sim.registered(copy), sim.heartbeat(host), sim.heartbeat(copy)]
    sim.cascade(host, simulate.DOWN)
    events += [("node-down", {"node": host.name}), sim.heartbeat(copy)]
    for position, (kind, body) in enumerate(events, 1):
        cluster.apply(received({"type": kind, **body}), Fact(position, simulate.DEFAULT_START))
        cluster.take_changes()
    kept = (cluster.node(copy.name).status, cluster.node(host.name).status)
    assert kept == ("down", "down") == (copy.status, host.status)
    sim.heartbeat(host)
    sim.heartbeat(copy)
    assert (copy.status, host.status) == ("ready", "ready")


def lines_of(events: list[dict[str, Any]]) -> list[str]:
    return [json.dumps(event, separators=(",", ":")) for event in events]


@pytest.mark.parametrize("params", [
    {"events": 20_000, "nodes": 30, "slots": 4, "seed": 5},
    {"events": 5_000, "nodes": 12, "slots": 0, "seed": 6, "ids": False, "source": None},
    {"events": 5_000, "nodes": 50, "slots": 1, "seed": 7, "source": "sïm \"quoted\"",
     "start": "2026-03-01T12:00:00.5+02:00"},
])
def test_dicts_and_lines_are_the_same_bytes(params: dict[str, Any]) -> None:
    assert list(generate_lines(**params)) == lines_of(list(generate(**params)))


def test_a_shorter_run_is_a_prefix_of_a_longer_one() -> None:
    short = list(generate_lines(20_000, nodes=40, slots=3, seed=9))
    longer = list(generate_lines(50_000, nodes=40, slots=3, seed=9))
    assert len(short) == 20_000 and len(longer) == 50_000
    assert longer[:20_000] == short
    assert list(generate_lines(20_000, nodes=40, slots=3, seed=10)) != short


def test_same_parameters_same_bytes_whatever_the_hash_seed() -> None:
    def digest(hash_seed: str) -> str:
        done = subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "simulate.py"), "--events", "30000",
             "--nodes", "50", "--slots", "4", "--seed", "11"],
            capture_output=True, check=True, cwd=ROOT,
            env={**os.environ, "PYTHONHASHSEED": hash_seed},
        )
        assert done.stdout.count(b"\n") == 30_000
        return hashlib.sha256(done.stdout).hexdigest()

    first = digest("0")
    assert digest("4242") == first
    expected = "".join(line + "\n" for line in generate_lines(30_000, nodes=50, slots=4, seed=11))
    assert hashlib.sha256(expected.encode()).hexdigest() == first


def test_the_model_is_the_ledger_event_by_event() -> None:
    """The simulator emits events from its model of the cluster: after each
    event, every node's status and health and every live allocation's
    statuses are the ledger's (a model astray would pass its mistakes off as
    races, rejected with a race's message)."""
    sim = simulate._Simulation(20_000, 30, 3, 8, simulate.DEFAULT_START, True, "sim")
    cluster = Cluster()
    for position, event in enumerate(sim, 1):
        try:
            cluster.apply(received(event), Fact(position, event["at"]))
        except RuleViolation:
            pass
        cluster.take_changes()
        for node in sim.nodes:
            kept = cluster.node(node.name)
            assert (kept.status, kept.health) == (node.status, node.health), (position, event)
            for a in node.allocs.values():
                alloc = cluster.alloc(a.id)
                assert (alloc.client_status, alloc.desired_status) == (a.client, a.desired), (
                    position, event, a.id)


def test_every_event_type_is_appended(submitted: dict[str, Submitted]) -> None:
    for name, history in submitted.items():
        appended = {history.events[r.position - 1]["type"]
                    for r in history.receipts if r.status == "appended"}
        assert appended == set(EVENT_TYPES), name


def test_the_parameters_are_honoured() -> None:
    start, nodes, slots = "2026-03-01T12:00:00.5+02:00", 30, 3
    events = list(generate(3_000, nodes=nodes, slots=slots, seed=4, start=start,
                           ids=False, source=None))
    registered = events[:nodes]
    assert [e["type"] for e in registered] == ["node-registered"] * nodes
    assert {e["slots"] for e in registered} == {slots}
    names = [e["node"] for e in registered]
    assert len(set(names)) == nodes
    assert [(e["type"], e["node"]) for e in events[nodes:2 * nodes]] == [
        ("heartbeat", name) for name in names]
    assert not any("id" in e or "source" in e for e in events)
    # simulated time starts at --start and moves on with every event, never back:
    # each node heartbeats about every HEARTBEAT_SECONDS
    ats = [e["at"] for e in events]
    assert ats[0] == "2026-03-01T10:00:00.500Z"
    assert ats == sorted(ats)
    step = simulate.HEARTBEAT_SECONDS * simulate.HEARTBEAT_SHARE / nodes
    span = datetime.fromisoformat(ats[-1]) - datetime.fromisoformat(ats[0])
    assert abs(span.total_seconds() - step * (len(events) - 1)) < 0.001

    named = list(generate(50, nodes=3, slots=0, seed=4, source="ops"))
    assert [e["id"] for e in named] == [f"e{k:06d}" for k in range(1, 51)]
    assert {e["source"] for e in named} == {"ops"}
    assert {e.get("slots", 0) for e in named if e["type"] == "node-registered"} == {0}


@pytest.mark.parametrize(("args", "error"), [
    (["--nodes", "0"], "argument --nodes: must be >= 1: 0"),
    (["--events", "-1"], "argument --events: must be >= 0: -1"),
    (["--slots", "-1"], "argument --slots: must be >= 0: -1"),
    (["--start", "yesterday"], "argument --start: not an RFC 3339 timestamp: 'yesterday'"),
])
def test_the_command_line_refuses_a_parameter_out_of_range(
    args: list[str], error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        simulate.main(args)
    assert exited.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"simulate.py: error: {error}"
