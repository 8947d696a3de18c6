"""Properties over streams that interleave the four stories and lean on the
rare paths, and over the same stream cut into batches in different places.

``story_scenarios`` draws streams like ``model_support.scenarios`` (the same
generator and model), with actions that the plain streams reach in only a
few examples of hundreds: kills of nodes already disconnected or down,
cascades through a parent chain several nodes deep and through a child
already down, health checks failing on a disconnected node, stop and remove
requests while an allocation waits to reconnect, a slot or an address taken
again after its holder finished or was removed, a failed allocation blamed on
a node already suspect.

For every such stream:

- every receipt and, after every batch, every projection table agree with
  ``model_support.Model`` (an oracle written apart from ``ledger.domain``);
  ``replay`` finds no difference, a rebuild from scratch equals the live
  tables (every column of every table, the rejection log included), and
  ``--as-of P`` holds what the model held after P; each row of the rejection
  log keeps the refused event as sent and names its allocation or node;
- the same stream submitted in one batch, one event at a time, in batches cut
  at random points (the ledger opened again after some), and as a file to
  ``alloc-ledger submit FILE --batch N`` gives the same answers (status,
  position, error; the CLI's line numbers) and the same rows, every column
  of every table, including those the model leaves open (``updated_position``,
  the wording of reasons, the rejection log's ``entity`` and ``reason``).

``ALLOC_LEDGER_PROPERTY_EXAMPLES=2000`` (with ``--timeout=0``) runs more
examples by hand.
"""

from __future__ import annotations

import json
import os
import sqlite3
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any, cast

from cli_support import invoke
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from model_support import (
    DEFAULTS,
    Model,
    Scenario,
    check_as_of,
    check_history,
    label,
    require_reached,
    run_checked,
)
from story_support import STORY_REACH, rare, story_scenarios

from ledger.application import Ledger
from projections.asof import AsOf, state_at

TABLES = ("nodes", "slots", "allocations", "alloc_states", "addresses", "rejections")
SLOW = [HealthCheck.too_slow, HealthCheck.data_too_large]
EXAMPLES = int(os.environ.get("ALLOC_LEDGER_PROPERTY_EXAMPLES", "0")) or None


def all_rows(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every column of every projection row, the rejection log included."""
    connection = sqlite3.connect(path)
    try:
        return {t: sorted(connection.execute(f"SELECT * FROM {t}").fetchall(), key=repr)
                for t in TABLES}
    finally:
        connection.close()


def scratch_rows(connection: sqlite3.Connection) -> dict[str, list[tuple[Any, ...]]]:
    return {t: sorted(connection.execute(f"SELECT * FROM {t}").fetchall(), key=repr)
            for t in TABLES}


@settings(max_examples=EXAMPLES or 30, deadline=None, suppress_health_check=SLOW)
@given(story_scenarios(max_steps=60), st.integers(0, 1000))
def test_story_streams_agree_with_the_model_and_a_replay(scenario: Scenario, moment: int) -> None:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "l.db"

        def finish(ledger: Ledger, model: Model) -> None:
            check_history(ledger, model, moment)
            check_as_of(ledger, scenario, moment % (model.head + 1))
            check_rejection_log(path, scenario)
            rebuilt, position, _ = state_at(ledger.store, AsOf())
            assert position == model.head
            assert scratch_rows(rebuilt) == all_rows(path)

        model = run_checked(f"sqlite:///{path}", scenario, finish=finish)
    label(model)


def check_rejection_log(path: Path, scenario: Scenario) -> None:
    """Each row of the rejection log keeps the refused event as it was sent
    (defaults spelled out) and the entity it names (its allocation, else its node),
    beyond the position, type and time that the model checks."""
    model, refused = Model(), {}
    for step in scenario.steps:
        outcome = model.submit(step.event)
        if outcome.status == "rejected" and step.event is not None:
            refused[outcome.position] = step.event
    connection = sqlite3.connect(path)
    try:
        kept = {p: (entity, json.loads(event)) for p, entity, event in connection.execute(
            "SELECT position, entity, event FROM rejections")}
    finally:
        connection.close()
    assert kept.keys() == refused.keys()
    for position, event in refused.items():
        entity, stored = kept[position]
        defaults = cast(dict[str, Any], DEFAULTS.get(event["type"], {}))
        given = defaults | {k: v for k, v in event.items() if v is not None}
        assert entity == str(given.get("alloc") or given.get("node")), (position, entity, event)
        stored = {k: v for k, v in stored.items() if v is not None}
        assert {k: v for k, v in stored.items() if k != "at"} == {
            k: v for k, v in given.items() if k != "at"}, (position, stored, event)


def stamped(scenario: Scenario) -> list[Any]:
    """Every submission as a dict or text, every valid event with an ``at`` of
    its own in order (the time received would differ from store to store); a
    retry repeats the time of what it retries."""
    out: list[Any] = []
    first: dict[int, dict[str, Any]] = {}
    for i, step in enumerate(scenario.steps):
        if step.event is None:
            out.append(step.submission)
        elif id(step.event) in first:
            out.append(first[id(step.event)])
        else:
            event = {k: v for k, v in step.event.items() if k != "at" or v is not None}
            event["at"] = f"2026-01-01T{i // 3600:02d}:{i // 60 % 60:02d}:{i % 60:02d}Z"
            out.append(first.setdefault(id(step.event), event))
    return out


def as_line(item: Any) -> str | None:
    """One line of a JSON Lines file (None: input a file cannot carry as one line)."""
    if isinstance(item, bytes):
        try:
            item = item.decode()
        except UnicodeDecodeError:
            return None
    if isinstance(item, str):
        text = item.strip()
        return text if text and "\n" not in text and "\r" not in text else None
    return json.dumps(item)


def answers(receipts: Any) -> list[tuple[str, int | None, str | None]]:
    return [(r.status, r.position, r.error) for r in receipts]


@settings(max_examples=EXAMPLES or 15, deadline=None, suppress_health_check=SLOW)
@given(story_scenarios(max_steps=50), st.data())
def test_any_batching_gives_the_same_receipts_and_every_row_alike(
    scenario: Scenario, data: st.DataObject,
) -> None:
    stream = [item for item in stamped(scenario) if as_line(item) is not None]
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(stream) - 1)), max_size=8)))
    reopen = data.draw(st.sets(st.sampled_from(cuts), max_size=2)) if cuts else set()
    file_batch = data.draw(st.integers(1, 9))
    with tempfile.TemporaryDirectory() as directory:
        base = Path(directory)
        with Ledger.open(f"sqlite:///{base / 'one.db'}") as ledger:
            whole = answers(ledger.submit_batch(list(stream)))
        with Ledger.open(f"sqlite:///{base / 'each.db'}") as ledger:
            each = answers(ledger.submit(item) for item in stream)
        split: list[tuple[str, int | None, str | None]] = []
        start = 0
        ledger = Ledger.open(f"sqlite:///{base / 'cut.db'}")
        try:
            for end in [*cuts, len(stream)]:
                split += answers(ledger.submit_batch(list(stream[start:end])))
                start = end
                if end in reopen:
                    ledger.close()
                    ledger = Ledger.open(f"sqlite:///{base / 'cut.db'}")
        finally:
            ledger.close()
        events = base / "events.jsonl"
        events.write_text("".join(f"{as_line(item)}\n" for item in stream))
        result = invoke(["--store", f"sqlite:///{base / 'cli.db'}", "submit", str(events),
                         "--batch", str(file_batch)],
                        code=1 if any(s in ("rejected", "invalid") or (s == "duplicate" and e)
                                      for s, _, e in whole) else 0)
        cli = [json.loads(line) for line in result.stdout.splitlines()]
        assert [c["line"] for c in cli] == list(range(1, len(stream) + 1))
        assert [(c["status"], c.get("position"), c.get("error")) for c in cli] == whole
        assert each == whole
        assert split == whole
        one = all_rows(base / "one.db")
        assert all_rows(base / "each.db") == one
        assert all_rows(base / "cut.db") == one
        assert all_rows(base / "cli.db") == one
        with Ledger.open(f"sqlite:///{base / 'cut.db'}") as ledger:
            rebuilt, _, _ = state_at(ledger.store, AsOf())
            assert scratch_rows(rebuilt) == one


def test_story_streams_reach_the_rare_paths(capsys: Any) -> None:
    """With fixed seeds and the model alone: each rare path in a fair share of examples."""
    seen: Counter[str] = Counter()
    seeds, each = range(4), 25

    def count(scenario: Scenario) -> None:
        model, reached = Model(), set()
        for step in scenario.steps:
            if step.event is not None:
                reached.update(rare(model, {k: v for k, v in step.event.items()
                                            if v is not None}))
            model.submit(step.event)
        seen.update(reached)

    require_reached(story_scenarios(), count, seen, STORY_REACH, capsys, "rare path",
                    seeds=seeds, each=each)
