"""The command line against the letter of the SPEC (``docs/SPEC.md``).

The names below are copied from the SPEC, not taken from the code: the
queries and their minimum columns from section 3's table, the commands from
section 4, the event types from section 2. A query, column or command the
code dropped or renamed fails here even if the code's own lists agree with it.

Commands run through click's ``CliRunner`` as in ``test_cli.py``; every test
names its store with ``--store``.
"""

from __future__ import annotations

import csv
import io
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import click.testing
import pytest
from cli_support import STORY, invoke


def lines(*events: dict[str, Any]) -> str:
    return "".join(json.dumps(e) + "\n" for e in events)


# SPEC section 2, the event table: every `type`.
SPEC_EVENT_TYPES = [
    "node-registered", "heartbeat", "heartbeat-missed", "node-down", "node-removed",
    "node-suspected", "health-checked", "alloc-placed", "alloc-updated",
    "alloc-stop-requested", "alloc-remove-requested", "alloc-removed",
]

# SPEC section 3, the table "query | answers | columns (at least)", as written
# there. `alloc ALLOC` and `history ENTITY` list no columns; `rejections` says
# "position or sequence".
SPEC_QUERIES: dict[str, list[str]] = {
    "needs-reconnect": ["alloc", "node", "job", "desired_status", "unknown_since_position",
                        "unknown_since_at", "deadline", "expired"],
    "zombie-slots": ["node", "slot", "alloc", "reason", "position"],
    "slots": ["node", "slot", "state", "alloc", "reported_alloc", "since_position"],
    "nodes": ["node", "status", "health", "parent", "slots", "slots_used", "allocs",
              "last_heartbeat_at", "last_heartbeat_position"],
    "allocs": ["alloc", "node", "job", "slot", "desired_status", "client_status",
               "needs_reconnect", "addresses"],
    "alloc ALLOC": [],
    "addresses": ["address", "alloc", "node", "state"],
    "suspects": ["node", "health", "status", "reason", "since_position", "lost_allocs"],
    "rejections": ["position or sequence", "type", "entity", "reason", "event"],
    "history ENTITY": [],
}

# SPEC section 3: "--format table|json|jsonl|csv".
SPEC_FORMATS = ["table", "json", "jsonl", "csv"]

# SPEC section 4, the command lines as written there.
SPEC_COMMANDS = [
    "submit TYPE --field value",
    "submit FILE|-",
    "query NAME",
    "project [--follow]",
    "replay [--to POSITION]",
    "verify [--digest POSITION:HASH]",
    "digest",
    "schema",
    "demo",
]

NOW = "2026-01-01T00:01:30Z"  # before a1's deadline (00:02:20)


@pytest.fixture
def url(tmp_path: Path) -> str:
    source = tmp_path / "story.jsonl"
    source.write_text(lines(*STORY))
    url = f"sqlite:///{tmp_path}/ledger.db"
    result = invoke(["--store", url, "submit", str(source), "--quiet"], code=1)  # one rejected
    assert json.loads(result.stdout) == {"appended": 8, "duplicate": 0, "rejected": 1,
                                         "invalid": 0, "duplicate_of_rejected": 0}
    return url


def query_args(spec_name: str) -> list[str]:
    """The command line of a SPEC query, with an argument where it takes one."""
    name = spec_name.split()[0]
    return {
        "needs-reconnect": ["needs-reconnect", "--now", NOW],
        "alloc": ["alloc", "a1"],
        "history": ["history", "n1"],
    }.get(name, [name])


def has_the_columns(row: dict[str, Any], wanted: list[str]) -> list[str]:
    """The SPEC columns a row lacks ("position or sequence": either will do)."""
    missing = []
    for column in wanted:
        choices = column.split(" or ")
        if not any(choice in row for choice in choices):
            missing.append(column)
    return missing


# -- section 3: every query, with at least its columns -----------------------------

@pytest.mark.parametrize("name", list(SPEC_QUERIES))
def test_every_query_of_the_spec_answers_json_with_at_least_its_columns(url, name):
    result = invoke(["--store", url, "query", *query_args(name), "--format", "json"])

    answer = json.loads(result.stdout)
    if name == "alloc ALLOC":  # "one object for alloc": with its alloc states and history
        assert isinstance(answer, dict)
        assert answer["alloc"] == "a1"
        assert [s["value"] for s in answer["alloc_states"]] == ["unknown"]
        assert [h["position"] for h in answer["history"]] == [3, 4, 9]
        return
    assert isinstance(answer, list) and answer, "a JSON array, here not empty"
    for row in answer:
        assert isinstance(row, dict)
        assert has_the_columns(row, SPEC_QUERIES[name]) == [], row


@pytest.mark.parametrize("name", [n for n in SPEC_QUERIES if SPEC_QUERIES[n]])
def test_every_query_of_the_spec_has_its_columns_in_csv_and_jsonl(url, name):
    args = ["--store", url, "query", *query_args(name)]

    header = next(csv.reader(io.StringIO(invoke([*args, "--format", "csv"]).stdout)))
    rows = [json.loads(line) for line in invoke([*args, "--format", "jsonl"]).stdout.splitlines()]

    assert has_the_columns(dict.fromkeys(header), SPEC_QUERIES[name]) == [], header
    assert rows and all(has_the_columns(row, SPEC_QUERIES[name]) == [] for row in rows)


@pytest.mark.parametrize("name", list(SPEC_QUERIES))
@pytest.mark.parametrize("fmt", SPEC_FORMATS)
def test_every_query_takes_every_format(url, name, fmt):
    result = invoke(["--store", url, "query", *query_args(name), "--format", fmt])
    assert result.stdout.strip()


FOUR = "2026-01-01T00:00:35Z"  # after the 4th event's at, before the 5th's


def answer(url: str, name: str, *as_of: str) -> Any:
    """A query's JSON answer, without when the store received each event."""
    args = ["--store", url, "query", *query_args(name), *as_of, "--format", "json"]
    found = json.loads(invoke(args).stdout)
    for row in found if isinstance(found, list) else found["history"]:
        row.pop("recorded_at", None)
    return found


@pytest.mark.parametrize("name", list(SPEC_QUERIES))
def test_every_query_takes_as_of_a_position_and_a_timestamp(url, tmp_path, name):
    """SPEC section 3: "Every query takes --as-of POSITION ... or --as-of
    TIMESTAMP": both answer as a store that received only those events does."""
    source = tmp_path / "four.jsonl"
    source.write_text(lines(*STORY[:4]))
    four = f"sqlite:///{tmp_path}/four.db"
    invoke(["--store", four, "submit", str(source), "--quiet"])

    expected = answer(four, name)
    assert answer(url, name, "--as-of", "4") == expected
    assert answer(url, name, "--as-of", FOUR) == expected


def test_as_of_four_events_is_not_the_live_answer(url):
    """The comparisons above are not vacuous: after 4 events, n2, its zombie
    slot, its suspicion and the rejection are not there yet."""
    differ = [name for name in SPEC_QUERIES if answer(url, name, "--as-of", "4") != answer(url, name)]
    assert differ == ["needs-reconnect", "zombie-slots", "slots", "nodes", "allocs",
                      "alloc ALLOC", "suspects", "rejections", "history ENTITY"]


def test_rejections_as_of_a_time_before_the_rejection_are_empty(url):
    args = ["--store", url, "query", "rejections", "--format", "json"]
    assert json.loads(invoke([*args, "--as-of", "2026-01-01T00:01:09Z"]).stdout) == []
    assert [r["entity"] for r in json.loads(
        invoke([*args, "--as-of", "2026-01-01T00:01:10Z"]).stdout)] == ["a2"]


# -- section 3: table on a terminal, json otherwise ---------------------------------

QUERIES_BY_SHAPE = [
    ["query", "nodes"],
    ["query", "zombie-slots"],
    ["query", "alloc", "a1"],  # one object
    ["query", "history", "n1"],
    ["query", "rejections"],
]


@pytest.mark.parametrize("args", QUERIES_BY_SHAPE, ids=lambda a: " ".join(a[1:]))
def test_the_default_format_is_table_on_a_terminal_and_json_when_piped(url, args, monkeypatch):
    """``commands/output.py`` asks ``sys.stdout.isatty()``; under CliRunner
    stdout is click's ``_NamedTextIOWrapper``, which is not a terminal unless
    told so."""
    def printed(*more: str) -> str:
        return invoke(["--store", url, *args, *more]).stdout

    piped = printed()
    assert piped == printed("--format", "json")
    json.loads(piped)

    monkeypatch.setattr(click.testing._NamedTextIOWrapper, "isatty", lambda self: True,
                        raising=False)
    on_a_terminal = printed()

    assert on_a_terminal == printed("--format", "table")
    assert on_a_terminal != piped
    with pytest.raises(json.JSONDecodeError):
        json.loads(on_a_terminal)
    assert printed("--format", "json") == piped  # asked for, json it is


# -- section 4: every command ------------------------------------------------------

def command_names() -> set[str]:
    """The command names of SPEC_COMMANDS ("submit", "query", ...)."""
    return {line.split()[0] for line in SPEC_COMMANDS}


@pytest.mark.parametrize("name", sorted(command_names()))
def test_every_command_of_the_spec_has_help(name):
    result = invoke([name, "--help"])
    assert result.stdout.startswith(f"Usage: alloc-ledger {name}")


@pytest.mark.parametrize(("name", "option"), [
    ("project", "--follow"), ("replay", "--to"), ("verify", "--digest"), ("submit", "--quiet"),
])
def test_every_option_the_spec_names_is_there(name, option):
    assert re.search(rf"(^|\s){re.escape(option)}\b", invoke([name, "--help"]).stdout)


def test_submit_type_with_flags_appends_one_event_and_prints_its_result_line(tmp_path):
    url = f"sqlite:///{tmp_path}/one.db"

    result = invoke(["--store", url, "submit", "node-registered", "--node", "n1", "--slots", "2"])

    assert json.loads(result.stdout) == {"line": 1, "status": "appended", "position": 1,
                                         "error": None}


@pytest.mark.parametrize("where", ["file", "stdin"])
def test_submit_file_or_stdin_prints_one_result_line_per_event(tmp_path, where):
    """SPEC: ``{"line": n, "status": "appended|duplicate|rejected|invalid",
    "position": p, "error": "…"}``; exit 1 when some event is invalid or rejected."""
    url = f"sqlite:///{tmp_path}/many.db"
    text = lines(
        {"type": "node-registered", "node": "n1", "id": "r1"},
        {"type": "node-registered", "node": "n1", "id": "r1"},
        {"type": "node-registered", "node": "n1"},
        {"type": "heartbeat", "node": "n1", "colour": "red"},
    )
    source = tmp_path / "events.jsonl"
    source.write_text(text)
    args = ["submit", str(source)] if where == "file" else ["submit", "-"]

    result = invoke(["--store", url, *args], code=1, input=None if where == "file" else text)

    found = [json.loads(line) for line in result.stdout.splitlines()]
    assert [list(r) for r in found] == [["line", "status", "position", "error"]] * 4
    assert [(r["line"], r["status"], r["position"]) for r in found] == [
        (1, "appended", 1), (2, "duplicate", 1), (3, "rejected", 2), (4, "invalid", None)]
    assert found[2]["error"] == "node n1 is already registered"
    assert "colour" in found[3]["error"]
    quiet = invoke(["--store", url, "submit", "-", "--quiet"], code=1, input=text)
    assert len(quiet.stdout.splitlines()) == 1  # a summary only


def test_project_brings_the_tables_up_to_date(url):
    """On SQLite the writers keep them current: project finds nothing to apply."""
    done = json.loads(invoke(["--store", url, "project"]).stdout)
    assert done == {"from": 9, "to": 9, "applied": 0}


def test_replay_reports_its_rate_and_no_difference(url):
    """SPEC: "report events/s and every difference; exit 1 on any difference"."""
    for args in (["replay"], ["replay", "--to", "4"]):
        report = json.loads(invoke(["--store", url, *args, "--format", "json"]).stdout)
        assert report["differences"] == []
        assert report["events_per_second"] > 0


def test_digest_then_verify_with_it(url):
    digest = invoke(["--store", url, "digest"]).stdout.strip()
    position, _, hash_ = digest.partition(":")
    assert (position, len(hash_)) == (str(len(STORY)), 64), digest

    invoke(["--store", url, "verify"])
    invoke(["--store", url, "verify", "--digest", digest])
    forged = f"{position}:{'0' * 64}"
    invoke(["--store", url, "verify", "--digest", forged], code=1)


def test_schema_covers_every_event_type_of_the_spec():
    schema = json.loads(invoke(["schema"]).stdout)
    kinds = [schema["$defs"][choice["$ref"].rsplit("/", 1)[1]]["properties"]["type"]["const"]
             for choice in schema["oneOf"]]
    assert sorted(kinds) == sorted(SPEC_EVENT_TYPES)


def test_demo_tells_one_story_per_source_system(tmp_path):
    result = invoke(["--store", f"sqlite:///{tmp_path}/demo.db", "demo"])
    for system in ("Nomad", "Flink", "Swarmkit", "Drydock"):
        assert system in result.stdout


def test_python_m_commands_works_too(url):
    done = subprocess.run(
        [sys.executable, "-m", "commands", "--store", url, "digest"],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == invoke(["--store", url, "digest"]).stdout


@pytest.mark.parametrize(("args", "code", "status"), [
    (["submit", "heartbeat", "--node", "n1"], 0, "appended"),
    (["submit", "heartbeat", "--node", "n1", "--id", "n1-hb"], 0, "appended"),
    (["submit", "node-registered", "--node", "n1"], 1, "rejected"),
    (["submit", "heartbeat", "--node", "n1", "--colour", "red"], 1, "invalid"),
])
def test_exit_codes_of_submit(url, args, code, status):
    """SPEC section 4: 0 appended or duplicate; 1 some event invalid or rejected."""
    result = invoke(["--store", url, *args], code=code)
    assert json.loads(result.stdout)["status"] == status
    if "--id" in args:
        again = invoke(["--store", url, *args], code=0)
        assert json.loads(again.stdout)["status"] == "duplicate"


@pytest.mark.parametrize("args", [
    ["query", "nodes", "--format", "yaml"],
    ["query", "nodes", "--as-of"],
    ["query", "no-such-question"],
    ["frobnicate"],
])
def test_a_usage_error_exits_2_in_one_line_on_stderr(url, args):
    """SPEC section 4: 2 usage error; errors are one clear line on stderr."""
    result = invoke(["--store", url, *args], code=2)
    assert result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_a_store_that_cannot_be_opened_exits_3(tmp_path):
    missing = f"sqlite:///{tmp_path}/no/such/dir/ledger.db"
    result = invoke(["--store", missing, "submit", "heartbeat", "--node", "n1"], code=3)
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


# -- section 3: query history NODE, exactly ----------------------------------------

def history(cluster, entity: str) -> list[tuple[Any, ...]]:
    result = invoke(["--store", cluster.url, "query", "history", entity, "--format", "json"])
    return [(r["position"], r["type"], r["status"], r["reason"]) for r in json.loads(result.stdout)]


def test_history_of_a_node_lists_what_names_it_and_the_cascade_that_changed_it(cluster):
    """SPEC: every event and rejection touching the node, in order; README:
    those that name it and those that changed it without naming it (a cascade,
    a released address)."""
    cluster.ready_node("host", slots=1)  # 1, 2
    cluster.ready_node("wc1", slots=1, parent="host")  # 3, 4
    cluster.ready_node("other")  # 5, 6
    cluster.place("lease1", "wc1", slot=0, addresses=["10.0.0.5"])  # 7
    cluster.place("lease2", "other")  # 8
    assert cluster.refused("alloc-placed", alloc="lease3", node="wc1", slot=0) == (  # 9
        "slot wc1#0 is already held by allocation lease1")
    cluster.happens("node-down", node="host", reason="instance gone")  # 10: wc1 goes too
    cluster.happens("heartbeat", node="other")  # 11
    cluster.happens("heartbeat", node="wc1")  # 12: stays down, its parent is

    assert history(cluster, "wc1") == [
        (3, "node-registered", "appended", None),
        (4, "heartbeat", "appended", None),
        (7, "alloc-placed", "appended", None),
        (9, "alloc-placed", "rejected", "slot wc1#0 is already held by allocation lease1"),
        (10, "node-down", "appended", None),
        (12, "heartbeat", "appended", None),
    ]
    assert history(cluster, "host") == [
        (1, "node-registered", "appended", None),
        (2, "heartbeat", "appended", None),
        (3, "node-registered", "appended", None),  # names host as its parent
        (10, "node-down", "appended", None),
    ]
    assert history(cluster, "other") == [
        (5, "node-registered", "appended", None),
        (6, "heartbeat", "appended", None),
        (8, "alloc-placed", "appended", None),
        (11, "heartbeat", "appended", None),
    ]
    assert history(cluster, "10.0.0.5") == [
        (7, "alloc-placed", "appended", None),
        (10, "node-down", "appended", None),  # released with lease1
    ]
    rows = json.loads(invoke(["--store", cluster.url, "query", "history", "wc1",
                              "--format", "json"]).stdout)
    cascade = rows[4]
    assert cascade["event"] == {"type": "node-down", "node": "host", "reason": "instance gone",
                                "at": cascade["at"]}
    assert cluster.status("wc1") == "down"


def test_history_of_an_address_lists_a_refused_early_removal_of_its_holder(cluster):
    """SPEC: every event and rejection touching the address: the Swarmkit
    story's attempt to free it before its task shut down."""
    cluster.ready_node("n1", slots=1)  # 1, 2
    cluster.place("t1", "n1", addresses=["10.0.0.5", "10.0.0.6"])  # 3
    cluster.report("t1", "running")  # 4
    removal = ("allocation t1 is running; removing it now would free 10.0.0.5 and 10.0.0.6 "
               "before it shuts down")
    assert cluster.refused("alloc-removed", alloc="t1") == removal  # 5

    assert history(cluster, "10.0.0.5") == history(cluster, "10.0.0.6") == [
        (3, "alloc-placed", "appended", None),
        (5, "alloc-removed", "rejected", removal),
    ]


def query(cluster, *args: str) -> Any:
    result = invoke(["--store", cluster.url, "query", *args, "--format", "json"])
    return json.loads(result.stdout)


def test_suspects_lists_suspect_and_down_nodes_but_not_removed_ones(cluster):
    """SPEC section 3: nodes with health suspect, nodes down; README: a
    removed node leaves it, suspect or not."""
    for node in ("n1", "n2", "n3"):
        cluster.ready_node(node)
    for node in ("n1", "n3"):
        cluster.happens("node-suspected", node=node, reason="disk errors")
    cluster.happens("node-down", node="n2", reason="instance gone")
    cluster.happens("node-removed", node="n3")

    assert [(row["node"], row["health"], row["status"]) for row in query(cluster, "suspects")] == [
        ("n1", "suspect", "ready"), ("n2", "ok", "down")]


def test_allocs_leaves_out_a_reaped_allocation_and_alloc_still_shows_it(cluster):
    """SPEC: alloc-removed reaps the allocation from the live tables; its
    history stays."""
    cluster.ready_node("n1")
    cluster.place("a1", "n1")
    cluster.place("a2", "n1")
    cluster.report("a1", "complete")
    cluster.happens("alloc-removed", alloc="a1")

    assert [row["alloc"] for row in query(cluster, "allocs")] == ["a2"]
    assert [row["alloc"] for row in query(cluster, "allocs", "--node", "n1")] == ["a2"]
    assert query(cluster, "alloc", "a1")["removed"] is True


def test_history_of_an_allocation_and_an_address_whose_names_hold_a_hash_sign(cluster):
    """Only a node's name may not hold '#': an allocation web#blue and an
    address port#8080 have their histories, apart from the slot n1#0's.
    (One that reads as a slot, web#1, is invalid: test_events.)"""
    cluster.ready_node("n1", slots=2)  # 1, 2
    cluster.place("web#blue", "n1", slot=0, addresses=["port#8080"])  # 3
    cluster.place("a2", "n1", slot=1)  # 4
    cluster.report("web#blue", "running")  # 5

    assert history(cluster, "web#blue") == [
        (3, "alloc-placed", "appended", None), (5, "alloc-updated", "appended", None)]
    assert history(cluster, "port#8080") == [(3, "alloc-placed", "appended", None)]
    assert history(cluster, "n1#0") == [
        (1, "node-registered", "appended", None), (3, "alloc-placed", "appended", None),
        (5, "alloc-updated", "appended", None)]
    assert [row[0] for row in history(cluster, "n1#1")] == [1, 4]


# -- section 3: expired is deadline <= --now, also at the last time there is ------

@pytest.mark.parametrize(("unknown_at", "max_disconnect", "expired"), [
    ("9999-12-31T23:59:59.999999Z", 0, True),  # a deadline of the last microsecond there is
    ("9999-12-31T23:54:59.999999Z", 300, True),
    ("9999-12-31T23:55:00Z", 300, False),  # past it: written the same, it never expires
])
def test_a_deadline_of_the_last_microsecond_expires_at_it_and_one_past_it_never(
    tmp_path, unknown_at, max_disconnect, expired,
):
    """SPEC §3: expired = deadline <= --now. A deadline computed to
    9999-12-31T23:59:59.999999Z is a real deadline, and --now of that instant
    reaches it; a deadline past the year 9999 is written the same (NEVER) and
    is told apart by its unknown_since_at and max_disconnect."""
    url = f"sqlite:///{tmp_path}/ledger.db"
    source = tmp_path / "late.jsonl"
    source.write_text(lines(
        {"type": "node-registered", "node": "n1", "slots": 1, "at": "9999-12-31T00:00:00Z"},
        {"type": "heartbeat", "node": "n1", "at": "9999-12-31T00:00:01Z"},
        {"type": "alloc-placed", "alloc": "a1", "node": "n1", "slot": 0,
         "max_disconnect": max_disconnect, "at": "9999-12-31T00:00:02Z"},
        {"type": "alloc-updated", "alloc": "a1", "client_status": "running",
         "at": "9999-12-31T00:00:03Z"},
        {"type": "heartbeat-missed", "node": "n1", "at": unknown_at},
    ))
    invoke(["--store", url, "submit", str(source), "--quiet"])

    result = invoke(["--store", url, "query", "needs-reconnect",
                     "--now", "9999-12-31T23:59:59.999999Z", "--format", "json"])

    [row] = json.loads(result.stdout)
    assert (row["deadline"], row["expired"]) == ("9999-12-31T23:59:59.999999Z", expired), row
