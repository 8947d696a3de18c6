"""The demo's four stories (``commands.stories``) told to a SQLite ledger, and
every question of SPEC section 3 asked of them through ``Queries``.

Each test builds a fresh store holding the stories' events up to one point
(a question of a story, or the end), so the answers are exact rows.
Positions are global: Nomad is 1-13, Flink 14-26, Swarmkit 27-37, Drydock 38-49.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from cli_support import without_received

from commands.stories import DRYDOCK, FLINK, NOMAD, STORIES, SWARMKIT, Ask, Step, Story, all_events
from ledger.application import Ledger
from projections.asof import AsOf, state_at
from projections.history import history
from projections.queries import Queries

EVENTS = all_events()
FIRST = {story.key: 1 + sum(len(s.steps) for s in STORIES[:n]) for n, story in enumerate(STORIES)}


def position_of(story: Story, question: int) -> int:
    """The head of the log when a story asks its ``question``-th question (1-based)."""
    asked = 0
    head = FIRST[story.key] - 1
    for item in story.items:
        if isinstance(item, Step):
            head += 1
        else:
            asked += 1
            if asked == question:
                return head
    raise AssertionError(f"{story.key} asks fewer than {question} questions")


def ask_of(story: Story, question: int) -> Ask:
    return [item for item in story.items if isinstance(item, Ask)][question - 1]


class Told:
    """A store that received the stories' first ``upto`` events, and its answers."""

    def __init__(self, ledger: Ledger, queries: Queries) -> None:
        self.ledger = ledger
        self.q = queries

    def history(self, entity: str) -> list[tuple[int, str, str, str | None]]:
        rows = history(self.ledger.store, entity)
        return [(r["position"], r["type"], r["status"], r["reason"]) for r in rows]


@pytest.fixture
def told(tmp_path: Path) -> Iterator[Any]:
    ledgers: list[Ledger] = []

    @contextmanager
    def tell(upto: int = len(EVENTS)) -> Iterator[Told]:
        ledger = Ledger.open(f"sqlite:///{tmp_path}/stories-{upto}.db")
        ledgers.append(ledger)
        receipts = ledger.submit_batch([json.dumps(e) for e in EVENTS[:upto]])
        assert [r.status for r in receipts if r.status not in ("appended", "rejected")] == []
        with ledger.store.reading() as cursor:
            yield Told(ledger, Queries(cursor))

    yield tell
    for ledger in ledgers:
        ledger.close()


# -- the stories go as written ----------------------------------------------

@pytest.mark.parametrize("story", STORIES, ids=[s.key for s in STORIES])
def test_each_event_is_decided_as_the_story_says(tmp_path, story):
    with Ledger.open(f"sqlite:///{tmp_path}/one.db") as ledger:
        receipts = [ledger.submit(json.dumps(step.event)) for step in story.steps]

    decided = [(r.status, r.position, r.error) for r in receipts]
    expected = [(s.expect, n, s.reason) for n, s in enumerate(story.steps, 1)]
    assert decided == expected


def test_the_stories_use_names_of_their_own():
    def names(story: Story) -> set[str]:
        return {
            str(e.get(key)) for e in story.events for key in ("node", "alloc") if key in e
        }

    for n, story in enumerate(STORIES):
        for other in STORIES[n + 1 :]:
            assert names(story) & names(other) == set(), (story.key, other.key)


def test_told_together_or_alone_a_story_ends_the_same(told, tmp_path):
    with Ledger.open(f"sqlite:///{tmp_path}/flink.db") as alone:
        alone.submit_batch([json.dumps(e) for e in FLINK.events])
        with alone.store.reading() as cursor:
            by_itself = Queries(cursor).slots("tm1")
    with told() as t:
        together = t.q.slots("tm1")
    shift = FIRST["flink"] - 1
    assert [r | {"since_position": r["since_position"] + shift} for r in by_itself] == together


# -- Nomad: needs-reconnect, nodes, allocs, alloc ------------------------------

DISCONNECTED = position_of(NOMAD, 1)
NEEDS_A1 = {
    "alloc": "a1",
    "node": "n1",
    "job": "web",
    "desired_status": "run",
    "unknown_since_position": 7,
    "unknown_since_at": "2026-03-02T09:01:00.000000Z",
    "deadline": "2026-03-02T09:06:00.000000Z",
}


@pytest.mark.parametrize(
    ("now", "expired"),
    [
        ("2026-03-02T09:03:00.000000Z", False),
        ("2026-03-02T09:05:59.999999Z", False),
        ("2026-03-02T09:06:00.000000Z", True),
        ("2026-03-02T09:07:00.000000Z", True),
    ],
)
def test_nomad_a1_needs_to_reconnect_until_its_deadline(told, now, expired):
    with told(DISCONNECTED) as t:
        assert DISCONNECTED == 7
        assert t.q.needs_reconnect(now) == [NEEDS_A1 | {"expired": expired}]


def test_nomad_a1_still_needs_to_reconnect_after_the_refused_and_stale_updates(told):
    before = position_of(NOMAD, 5)
    assert ask_of(NOMAD, 5).query == "needs-reconnect"
    with told(before) as t:
        assert before == 12
        assert t.q.needs_reconnect("2026-03-02T09:04:10.000000Z") == [
            NEEDS_A1 | {"expired": False}
        ]


def test_nomad_nothing_needs_to_reconnect_once_a1_reported(told):
    with told(position_of(NOMAD, 6)) as t:
        assert t.q.needs_reconnect("2026-03-02T09:04:20.000000Z") == []


def n1(status: str, since: int, heartbeat: tuple[str, int], allocs: int = 1) -> dict[str, Any]:
    return {
        "node": "n1", "status": status, "health": "ok", "parent": None, "slots": 0,
        "slots_used": 0, "allocs": allocs, "last_heartbeat_at": heartbeat[0],
        "last_heartbeat_position": heartbeat[1],
        "reason": None, "since_position": since,  # README: after the SPEC's columns
    }


def test_nomad_n1_disconnected_then_initializing_then_ready(told):
    first = ("2026-03-02T09:00:05.000000Z", 2)
    again = ("2026-03-02T09:04:00.000000Z", 10)
    with told(position_of(NOMAD, 1)) as t:
        assert t.q.nodes() == [n1("disconnected", 7, first)]
    with told(position_of(NOMAD, 4)) as t:
        assert t.q.nodes() == [n1("initializing", 10, again)]
    with told(position_of(NOMAD, 7)) as t:
        assert t.q.nodes() == [n1("ready", 13, again)]  # a1's report made it ready


def test_nomad_a1_is_running_again_and_a2_stays_lost(told):
    a1 = {
        "alloc": "a1", "node": "n1", "job": "web", "slot": None, "desired_status": "run",
        "client_status": "running", "needs_reconnect": False, "addresses": [],
    }
    a2 = a1 | {"alloc": "a2", "job": "cron", "desired_status": "stop", "client_status": "lost"}
    with told(position_of(NOMAD, 8)) as t:
        assert t.q.allocs(node="n1") == [a1, a2]
        assert t.q.allocs(status="lost", node="n1") == [a2]
        assert t.q.allocs(job="web") == [a1]
        assert t.q.allocs(node="nobody") == []


def test_nomad_a1_alloc_states_unknown_then_running(told):
    with told(position_of(NOMAD, 9)) as t:
        a1 = t.q.alloc("a1")
        a2 = t.q.alloc("a2")
        assert t.q.alloc("a3") is None  # both placements of a3 were refused

    assert a1 == {
        "alloc": "a1", "node": "n1", "job": "web", "slot": None, "desired_status": "run",
        "client_status": "running", "needs_reconnect": False, "addresses": [],
        "max_disconnect": 300, "unknown_since_position": None,  # it has reconnected
        "unknown_since_at": None, "deadline": None,
        "placed_position": 3, "updated_position": 13, "removed": False,
        "alloc_states": [
            {"value": "unknown", "position": 7, "at": "2026-03-02T09:01:00.000000Z"},
            {"value": "running", "position": 13, "at": "2026-03-02T09:04:20.000000Z"},
        ],
    }
    assert (a2["client_status"], a2["desired_status"], a2["alloc_states"]) == (
        "lost", "stop", [{"value": "lost", "position": 7, "at": "2026-03-02T09:01:00.000000Z"}]
    )


def test_nomad_history_of_a1(told):
    with told(position_of(NOMAD, 9)) as t:
        assert t.history("a1") == [
            (3, "alloc-placed", "appended", None),
            (5, "alloc-updated", "appended", None),
            (7, "heartbeat-missed", "appended", None),
            (9, "alloc-updated", "rejected",
             "node n1 is not allowed to update allocs while in status disconnected"),
            (13, "alloc-updated", "appended", None),
        ]


def test_nomad_history_of_n1(told):
    """SPEC section 3: every event and rejection touching the node, in order:
    those naming it, and the updates and rejections of its allocations."""
    with told(position_of(NOMAD, 9)) as t:
        assert t.history("n1") == [
            (1, "node-registered", "appended", None),
            (2, "heartbeat", "appended", None),
            (3, "alloc-placed", "appended", None),
            (4, "alloc-placed", "appended", None),
            (5, "alloc-updated", "appended", None),
            (6, "alloc-updated", "appended", None),
            (7, "heartbeat-missed", "appended", None),
            (8, "alloc-placed", "rejected",
             "node n1 is not ready (status disconnected); it takes no placements"),
            (9, "alloc-updated", "rejected",
             "node n1 is not allowed to update allocs while in status disconnected"),
            (10, "heartbeat", "appended", None),
            (11, "alloc-placed", "rejected",
             "node n1 is not ready (status initializing); it takes no placements"),
            (12, "alloc-updated", "rejected",
             "allocation a2 is lost; a terminal status never changes"),
            (13, "alloc-updated", "appended", None),
        ]


# -- Flink: zombie-slots, slots --------------------------------------------------

def test_flink_the_completed_f1_is_a_zombie_on_tm1_slot_0(told):
    with told(position_of(FLINK, 1)) as t:
        assert t.q.zombie_slots() == [
            {"node": "tm1", "slot": 0, "alloc": "f1", "reason": "released", "position": 25}
        ]


def test_flink_every_kind_of_zombie(told):
    with told(position_of(FLINK, 2)) as t:
        assert t.q.zombie_slots() == [
            {"node": "tm1", "slot": 0, "alloc": "f1", "reason": "released", "position": 25},
            {"node": "tm1", "slot": 2, "alloc": "f9", "reason": "unknown-alloc", "position": 26},
            {"node": "tm1", "slot": 3, "alloc": "f3", "reason": "moved", "position": 26},
            {"node": "tm1", "slot": 4, "alloc": "f2", "reason": "duplicate", "position": 26},
        ]


def test_flink_slot_table_beside_the_report(told):
    with told(position_of(FLINK, 3)) as t:
        rows = [tuple(r.values()) for r in t.q.slots("tm1")]
        assert t.q.slots() == t.q.slots("tm1")  # no other story has slots
    assert rows == [
        ("tm1", 0, "free", None, "f1", 24),
        ("tm1", 1, "active", "f2", "f2", 21),
        ("tm1", 2, "active", "f3", "f9", 23),
        ("tm1", 3, "free", None, "f3", 14),
        ("tm1", 4, "free", None, "f2", 14),
    ]


def test_flink_no_zombie_before_tm1_reports_its_slots(told):
    with told(position_of(FLINK, 1) - 1) as t:
        assert t.q.zombie_slots() == []
        assert [(r["slot"], r["state"], r["alloc"]) for r in t.q.slots("tm1")] == [
            (0, "free", None), (1, "active", "f2"), (2, "active", "f3"),
            (3, "free", None), (4, "free", None),
        ]


def test_flink_history_of_slot_tm1_0(told):
    with told(position_of(FLINK, 3)) as t:
        assert t.history("tm1#0") == [
            (14, "node-registered", "appended", None),
            (16, "alloc-placed", "appended", None),
            (17, "alloc-updated", "appended", None),
            (18, "alloc-placed", "rejected", "slot tm1#0 is already held by allocation f1"),
            (19, "alloc-placed", "rejected", "allocation f1 already holds slot tm1#0"),
            (24, "alloc-updated", "appended", None),
            (25, "heartbeat", "appended", None),
            (26, "heartbeat", "appended", None),
        ]


# -- Swarmkit: addresses -----------------------------------------------------------

def test_swarmkit_the_address_is_releasing_while_t1_runs(told):
    with told(position_of(SWARMKIT, 1)) as t:
        assert t.q.addresses() == [
            {"address": "10.0.0.5", "alloc": "t1", "node": "w1", "state": "releasing"}
        ]


def test_swarmkit_the_address_is_free_once_t1_is_complete(told):
    with told(position_of(SWARMKIT, 2)) as t:
        assert t.q.addresses() == []


def test_swarmkit_t2_holds_the_address_and_t1_is_reaped(told):
    with told(position_of(SWARMKIT, 4)) as t:
        assert t.q.addresses() == [
            {"address": "10.0.0.5", "alloc": "t2", "node": "w1", "state": "held"}
        ]
        assert [a["alloc"] for a in t.q.allocs(node="w1")] == ["t2"]
        t1 = t.q.alloc("t1")
    assert t1 is not None
    assert (t1["removed"], t1["client_status"], t1["desired_status"]) == (
        True, "complete", "remove"
    )


def test_swarmkit_history_of_the_address(told):
    with told(position_of(SWARMKIT, 4)) as t:
        assert t.history("10.0.0.5") == [
            (29, "alloc-placed", "appended", None),
            (31, "alloc-remove-requested", "appended", None),
            (32, "alloc-removed", "rejected",  # the attempt to free it early
             "allocation t1 is running; removing it now would free 10.0.0.5 before it shuts down"),
            (33, "alloc-placed", "rejected",
             "address 10.0.0.5 is still held by allocation t1, which has not shut down"),
            (34, "alloc-updated", "appended", None),
            (36, "alloc-placed", "appended", None),
        ]


# -- Drydock: suspects -------------------------------------------------------------

def test_drydock_host1_is_suspect_but_still_ready(told):
    with told(position_of(DRYDOCK, 1)) as t:
        assert t.q.suspects() == [
            {"node": "host1", "health": "suspect", "status": "ready",
             "reason": "ssh timed out", "since_position": 46, "lost_allocs": []},
        ]


def test_drydock_suspects_show_what_went_down_with_host1(told):
    with told(position_of(DRYDOCK, 2)) as t:
        assert t.q.suspects() == [
            {"node": "host1", "health": "suspect", "status": "down",
             "reason": "health check failed", "since_position": 48, "lost_allocs": ["lease1"]},
            {"node": "wc1", "health": "ok", "status": "down",
             "reason": "parent host1 went down", "since_position": 48,
             "lost_allocs": ["lease2"]},
        ]


def test_drydock_leases_are_lost(told):
    with told(position_of(DRYDOCK, 3)) as t:
        rows = t.q.allocs(job="build")
        statuses = {n["node"]: n["status"] for n in t.q.nodes()}
    assert [(a["alloc"], a["node"], a["desired_status"], a["client_status"]) for a in rows] == [
        ("lease1", "host1", "stop", "lost"),
        ("lease2", "wc1", "stop", "lost"),
    ]
    assert statuses == {"n1": "ready", "tm1": "ready", "w1": "ready", "host1": "down",
                        "wc1": "down"}


def test_drydock_history_of_wc1_has_the_cascade_that_took_it_down(told):
    """README: a node's history has the events that changed it without naming
    it: host1's failed health check (48) took wc1 down."""
    with told(position_of(DRYDOCK, 3)) as t:
        wc1 = t.history("wc1")
        host1 = t.history("host1")
    assert wc1 == [
        (40, "node-registered", "appended", None),
        (41, "heartbeat", "appended", None),
        (44, "alloc-placed", "appended", None),
        (45, "alloc-updated", "appended", None),
        (48, "health-checked", "appended", None),
        (49, "alloc-placed", "rejected",
         "node wc1 is not ready (status down); it takes no placements"),
    ]
    assert host1 == [
        (38, "node-registered", "appended", None),
        (39, "heartbeat", "appended", None),
        (40, "node-registered", "appended", None),  # names host1 as its parent
        (42, "alloc-placed", "appended", None),
        (43, "alloc-updated", "appended", None),
        (46, "node-suspected", "appended", None),
        (47, "alloc-placed", "rejected", "node host1 is suspect; it takes no placements"),
        (48, "health-checked", "appended", None),
    ]


# -- after the stories: rejections, and every question as of each question --------

def test_the_rejection_log_of_all_four_stories(told):
    with told() as t:
        rows = t.q.rejections()
    assert [(r["position"], r["type"], r["entity"], r["reason"]) for r in rows] == [
        (8, "alloc-placed", "a3",
         "node n1 is not ready (status disconnected); it takes no placements"),
        (9, "alloc-updated", "a1",
         "node n1 is not allowed to update allocs while in status disconnected"),
        (11, "alloc-placed", "a3",
         "node n1 is not ready (status initializing); it takes no placements"),
        (12, "alloc-updated", "a2", "allocation a2 is lost; a terminal status never changes"),
        (18, "alloc-placed", "f2", "slot tm1#0 is already held by allocation f1"),
        (19, "alloc-placed", "f1", "allocation f1 already holds slot tm1#0"),
        (32, "alloc-removed", "t1",
         "allocation t1 is running; removing it now would free 10.0.0.5 before it shuts down"),
        (33, "alloc-placed", "t2",
         "address 10.0.0.5 is still held by allocation t1, which has not shut down"),
        (47, "alloc-placed", "lease3", "node host1 is suspect; it takes no placements"),
        (49, "alloc-placed", "lease3",
         "node wc1 is not ready (status down); it takes no placements"),
    ]
    assert rows[0]["event"] == EVENTS[7] | {"at": "2026-03-02T09:02:00.000000Z"}


def live_and_replayed(ledger: Ledger, position: int) -> tuple[dict[str, Any], dict[str, Any]]:
    def everything(q: Queries) -> dict[str, Any]:
        return {
            "needs-reconnect": q.needs_reconnect("2026-03-02T09:03:00.000000Z"),
            "zombie-slots": q.zombie_slots(),
            "slots": q.slots(),
            "nodes": q.nodes(),
            "allocs": q.allocs(),
            "alloc": [q.alloc(a) for a in ("a1", "a2", "f1", "t1", "lease2")],
            "addresses": q.addresses(),
            "suspects": q.suspects(),
            "rejections": q.rejections(),
        }

    with ledger.store.reading() as cursor:
        live = everything(Queries(cursor))
    connection, replayed_to, _ = state_at(ledger.store, AsOf(position=position))
    assert replayed_to == position
    return live, everything(Queries(connection.cursor()))


@pytest.mark.parametrize(
    ("story", "question"),
    [(s, n) for s in STORIES for n in range(1, 1 + sum(isinstance(i, Ask) for i in s.items))],
    ids=lambda v: v.key if isinstance(v, Story) else str(v),
)
def test_every_answer_as_of_its_position_equals_the_live_one(told, story, question):
    position = position_of(story, question)
    with told(position) as t:
        live, replayed = live_and_replayed(t.ledger, position)
    assert replayed == live


def test_the_stories_told_as_dicts_are_decided_as_told_as_json(tmp_path):
    with Ledger.open(f"sqlite:///{tmp_path}/dicts.db") as ledger:
        receipts = [ledger.submit(dict(event)) for event in EVENTS]
    assert [(r.status, r.error) for r in receipts] == [
        (step.expect, step.reason) for story in STORIES for step in story.steps
    ]


def test_the_demo_on_postgresql_with_a_follower_answers_as_on_sqlite(
    pg_url: str, tmp_path: Path, alloc_ledger: Any
) -> None:
    """The demo brings the tables up to date before each question: with the
    default projections (kept by a follower) none would run during it."""
    on_pg = alloc_ledger("demo", url=pg_url)
    on_sqlite = alloc_ledger("demo", url=f"sqlite:///{tmp_path}/demo.db")

    assert on_pg.returncode == 0, on_pg.stderr
    assert on_sqlite.returncode == 0, on_sqlite.stderr
    def answers(text: str) -> list[str]:
        """The answers, without when each run received the events (the
        history's recorded_at: a time after another, not on the stories' day)."""
        return [without_received(line) for line in text.splitlines() if "store" not in line]
    assert answers(on_pg.stdout) == answers(on_sqlite.stdout)
