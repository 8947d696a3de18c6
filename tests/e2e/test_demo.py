"""``alloc-ledger demo`` as a user runs it: four stories, each answer printed."""

from __future__ import annotations

import json
import re

import pytest
from cli_support import invoke, without_received

from commands.stories import EPILOGUE, STORIES, Ask, all_events

WIDE = ("alloc", "rejections", "history")


def squeezed(text: str) -> set[str]:
    """Every output line with its runs of spaces squeezed to one, without
    the history's recorded_at (when this run received each event)."""
    lines = {" ".join(line.split()) for line in text.splitlines()}
    return {without_received(line) for line in lines}


@pytest.fixture(scope="module")
def told(tmp_path_factory) -> tuple[str, str]:
    """The demo told once into a kept store: (store URL, output)."""
    url = f"sqlite:///{tmp_path_factory.mktemp('demo')}/demo.db"
    return url, invoke(["demo", "--store", url]).output


def test_demo_exits_0_on_a_temporary_store(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = invoke(["demo"])
    assert list(tmp_path.iterdir()) == []  # nothing written where it runs
    assert result.output.startswith(
        "alloc-ledger demo: four bug reports replayed as events (store: a temporary file)\n"
    )
    assert "UNEXPECTED" not in result.output


def test_demo_on_a_temporary_store_says_how_to_keep_one_as_it_is_typed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    hint = invoke(["demo"]).output.splitlines()[-1]
    typed = re.findall(r"alloc-ledger ((?:(?!, then).)*)", hint)
    assert len(typed) == 2, hint  # the demo into a kept store, then a query of it
    demo, query = (command.split() for command in typed)
    assert "(store: sqlite:///demo.db)" in invoke(demo).output
    nodes = json.loads(invoke([*query, "--format", "json"]).output)
    assert {"n1", "host1", "wc1"} <= {n["node"] for n in nodes}  # the stories' nodes


def test_demo_names_each_bug_report(told):
    _, output = told
    for story in STORIES:
        assert f"Reproduces {story.reports}." in output
    for report in ("hashicorp/nomad #15068, #15808", "FLINK-14589", "docker/swarmkit #2407",
                   "Phabricator T8153"):
        assert report in output


KEY_ANSWERS = {
    "nomad": [
        "n1 disconnected ok 0 0 1 2026-03-02T09:00:05.000000Z 2 7",
        "n1 initializing ok 0 0 1 2026-03-02T09:04:00.000000Z 10 10",
        "n1 ready ok 0 0 1 2026-03-02T09:04:00.000000Z 10 13",
        "a1 n1 web run 7 2026-03-02T09:01:00.000000Z 2026-03-02T09:06:00.000000Z false",
        "a1 n1 web run 7 2026-03-02T09:01:00.000000Z 2026-03-02T09:06:00.000000Z true",
        "-> node n1 is not ready (status disconnected); it takes no placements",
        "-> node n1 is not allowed to update allocs while in status disconnected",
        "-> node n1 is not ready (status initializing); it takes no placements",
        "-> allocation a2 is lost; a terminal status never changes",
        "a2 n1 cron stop lost false",
        "unknown 7 2026-03-02T09:01:00.000000Z",
        "running 13 2026-03-02T09:04:20.000000Z",
    ],
    "flink": [
        "-> slot tm1#0 is already held by allocation f1",
        "-> allocation f1 already holds slot tm1#0",
        "tm1 0 f1 released 25",
        "tm1 2 f9 unknown-alloc 26",
        "tm1 3 f3 moved 26",
        "tm1 4 f2 duplicate 26",
    ],
    "swarmkit": [
        "10.0.0.5 t1 w1 releasing",
        "-> allocation t1 is running; removing it now would free 10.0.0.5 before it shuts down",
        "-> address 10.0.0.5 is still held by allocation t1, which has not shut down",
        "35 appended alloc-removed t1 is reaped",
        "10.0.0.5 t2 w1 held",
    ],
    "drydock": [
        "host1 suspect ready ssh timed out 46",
        "-> node host1 is suspect; it takes no placements",
        "host1 suspect down health check failed 48 lease1",
        "wc1 ok down parent host1 went down 48 lease2",
        "lease2 wc1 build stop lost false",
    ],
    "after": [
        "== After the stories ==",
        "$ alloc-ledger query rejections --as-of 49",
        "49 alloc-placed lease3 node wc1 is not ready (status down); it takes no placements",
        "$ alloc-ledger query history 10.0.0.5 --as-of 49",
        ("33 alloc-placed rejected 2026-03-02T11:01:10.000000Z address 10.0.0.5 is still held "
         "by allocation t1, which has not shut down"),
        "36 alloc-placed appended 2026-03-02T11:01:40.000000Z",
    ],
}


@pytest.mark.parametrize("part", KEY_ANSWERS)
def test_demo_prints_each_story_key_answers(told, part):
    lines = squeezed(told[1])
    assert [line for line in KEY_ANSWERS[part] if line not in lines] == []


def test_demo_prints_the_stories_in_order(told):
    output = told[1]
    starts = [output.index(f"== {n}/4 {story.title} ==") for n, story in enumerate(STORIES, 1)]
    assert starts == sorted(starts)
    kept = f"The store is kept: alloc-ledger --store {told[0]} query nodes"
    assert output.rstrip().endswith(kept)


def test_demo_keeps_the_store_it_was_given(told):
    url, _ = told
    nodes = json.loads(invoke(["--store", url, "query", "nodes", "--format", "json"]).output)
    assert [n["node"] for n in nodes] == ["host1", "n1", "tm1", "w1", "wc1"]
    head = json.loads(invoke(["--store", url, "query", "rejections", "--format", "json"]).output)
    assert head[-1]["position"] == len(all_events()) == 49


def shown_answers(output: str) -> list[tuple[list[str], str]]:
    """Each ``$ alloc-ledger query …`` the demo shows, with the table under it."""
    found = []
    blocks = re.findall(r"^  \$ alloc-ledger query (.*)\n  # .*\n((?:.+\n)+)", output, re.MULTILINE)
    for args, table in blocks:
        found.append((args.split(" "), table))
    return found


def test_every_answer_shown_is_what_the_query_command_prints(told):
    """The demo prints each question with --as-of its position: asking the kept
    store the same question gives the same table (wide columns aside)."""
    url, output = told
    shown = shown_answers(output)
    assert len(shown) == sum(1 for line in output.splitlines() if line.startswith("  $ "))
    compared = 0
    for args, table in shown:
        if args[0] in WIDE:  # the demo leaves out their wide columns
            continue
        printed = invoke(["--store", url, "query", *args, "--format", "table"]).output
        assert printed == table, args
        compared += 1
    asked = [i for s in STORIES for i in s.items if isinstance(i, Ask)] + list(EPILOGUE)
    assert compared == len([a for a in asked if a.query not in WIDE]) == 18


def test_demo_refuses_a_store_that_holds_events(tmp_path):
    url = f"sqlite:///{tmp_path}/used.db"
    invoke(["--store", url, "submit", "node-registered", "--node", "mine"])

    result = invoke(["demo", "--store", url], code=2)

    assert result.stdout == ""
    assert result.stderr.startswith(
        f"Error: Invalid value for --store: store {url} already holds 1 event; the demo "
        "needs an empty store (omit --store for a temporary one) (see '"
    )
    assert result.stderr.endswith(" demo --help')\n")
    assert result.stderr.count("\n") == 1
    nodes = json.loads(invoke(["--store", url, "query", "nodes"]).output)
    assert [n["node"] for n in nodes] == ["mine"]


def test_demo_takes_the_store_given_before_the_command(tmp_path):
    url = f"sqlite:///{tmp_path}/before.db"
    result = invoke(["--store", url, "demo"])
    assert f"(store: {url})" in result.output
    assert (tmp_path / "before.db").exists()


def test_demo_leaves_the_store_of_the_environment_alone(tmp_path):
    url = f"sqlite:///{tmp_path}/env.db"
    invoke(["demo"], env={"ALLOC_LEDGER_STORE": url})
    assert not (tmp_path / "env.db").exists()


def test_demo_on_a_store_that_cannot_be_opened_exits_3(tmp_path):
    url = f"sqlite:///{tmp_path}/missing/demo.db"
    result = invoke(["demo", "--store", url], code=3)
    assert result.stdout == ""
    assert result.stderr == (
        f"Error: cannot open store {url}: directory {tmp_path}/missing does not exist\n"
    )


def test_demo_help():
    result = invoke(["demo", "--help"])
    assert "FLINK-14589" in result.output
    assert "--store URL" in result.output
