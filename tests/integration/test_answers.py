"""The questions asked from Python (``projections.answers.ask``), of either
store: the same answers as ``alloc-ledger query``, live or as of a point."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest
from cli_support import invoke
from pg_support import postgres_or_skip

from ledger.application import Ledger
from ledger.errors import BadOption, LogEndsEarly, StoreUnavailable
from projections.answers import NotInLedger, ask


def disconnected_with_a1(cluster) -> int:
    """n1 runs a1 (max_disconnect 60 s) and misses a heartbeat at 12:00Z;
    return the position of the miss."""
    early = "2026-01-01T11:59:00Z"
    cluster.happens("node-registered", node="n1", slots=1, at=early)
    cluster.happens("heartbeat", node="n1", at=early)
    cluster.place("a1", "n1", slot=0, job="web", max_disconnect=60, at=early)
    cluster.report("a1", "running", at=early)
    return cluster.happens("heartbeat-missed", node="n1", at="2026-01-01T12:00:00Z")


def test_live_answers_are_the_command_lines(cluster) -> None:
    disconnected_with_a1(cluster)
    with ask(cluster.url) as answers:
        assert answers.behind == 0 and answers.position is None
        found = answers.needs_reconnect(now="2026-01-01T12:00:30Z")
        nodes = answers.nodes()
        allocs = answers.allocs(job="web")
    printed = invoke(["--store", cluster.url, "query", "needs-reconnect",
                      "--now", "2026-01-01T12:00:30Z", "--format", "json"])
    assert printed.exit_code == 0, printed.output
    assert found == json.loads(printed.output)
    assert [(n["node"], n["status"]) for n in nodes] == [("n1", "disconnected")]
    assert [(a["alloc"], a["client_status"], a["needs_reconnect"]) for a in allocs] == [
        ("a1", "unknown", True)]


def test_now_is_read_as_an_instant_whatever_its_offset(cluster) -> None:
    """The deadline is 12:01:00Z: 13:00:59+01:00 is before it, 13:01:00+01:00 at it."""
    disconnected_with_a1(cluster)
    with ask(cluster.url) as answers:
        before = answers.needs_reconnect(now="2026-01-01T13:00:59+01:00")
        at = answers.needs_reconnect(now="2026-01-01T13:01:00+01:00")
        with pytest.raises(BadOption, match="needs a time zone"):
            answers.needs_reconnect(now="2026-01-01T13:01:00")
    assert [row["expired"] for row in before] == [False]
    assert [row["expired"] for row in at] == [True]


def test_as_of_a_position_or_a_time(cluster) -> None:
    missed = disconnected_with_a1(cluster)
    cluster.happens("heartbeat", node="n1", at="2026-01-01T12:00:10Z")
    cluster.report("a1", "running", at="2026-01-01T12:00:11Z")
    with ask(cluster.url) as answers:
        assert answers.needs_reconnect() == []
    with ask(cluster.url, as_of=missed) as answers:
        assert answers.position == missed
        # with no now, expired is judged at the point's time: the miss, 12:00Z
        assert [(r["alloc"], r["expired"]) for r in answers.needs_reconnect()] == [("a1", False)]
    with ask(cluster.url, as_of="2026-01-01T12:00:05Z") as answers:
        assert answers.position == missed
        assert [n["status"] for n in answers.nodes()] == ["disconnected"]


def test_a_filter_naming_what_the_ledger_never_held_is_an_error(cluster) -> None:
    disconnected_with_a1(cluster)
    with ask(cluster.url) as answers:
        with pytest.raises(NotInLedger, match="^node n9 is not in the ledger$"):
            answers.slots(node="n9")
        with pytest.raises(NotInLedger, match="^no allocation of job db is in the ledger$"):
            answers.allocs(job="db")
        assert answers.alloc("a9") is None
        assert answers.allocs(node="n1", status="complete") == []  # known node: empty
    with ask(cluster.url, as_of=1) as answers, pytest.raises(  # a1 is placed at 3
        NotInLedger, match="^no allocation of job web .* at position 1$"
    ):
        answers.allocs(job="web")


def test_a_position_past_the_head_is_refused(cluster) -> None:
    head = disconnected_with_a1(cluster)
    with pytest.raises(BadOption, match=f"beyond the head of the log \\({head}\\)"), ask(
        cluster.url, as_of=head + 1
    ):
        pass


def test_no_ledger_is_made_by_asking(tmp_path) -> None:
    url = f"sqlite:///{tmp_path}/none.db"
    with pytest.raises(StoreUnavailable, match="no ledger"), ask(url):
        pass


@pytest.fixture
def followed() -> Iterator[tuple[str, str, str]]:
    """A PostgreSQL store whose tables a follower keeps (not inline): the
    DSN, the schema, the store's URL; the schema dropped after."""
    dsn = postgres_or_skip()
    schema = f"t_{uuid.uuid4().hex[:16]}"
    yield dsn, schema, f"{dsn}{'&' if '?' in dsn else '?'}schema={schema}"
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as connection:
        connection.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def test_lagging_postgresql_tables_say_how_far_behind_they_are(followed) -> None:
    """Without inline projection, the tables are as far as a follower brought
    them; ``wait`` catches them up first."""
    _, _, url = followed
    with Ledger.open(url) as ledger:
        ledger.submit({"type": "node-registered", "node": "n1"})
        ledger.submit({"type": "heartbeat", "node": "n1"})
    with ask(url) as answers:
        assert (answers.behind, answers.position) == (2, 0)
        with pytest.raises(NotInLedger, match="^node n1 is not in the ledger at position 0$"):
            answers.slots(node="n1")
    with ask(url, wait=True) as answers:
        assert (answers.behind, answers.position) == (0, None)
        assert [(n["node"], n["status"]) for n in answers.nodes()] == [("n1", "ready")]


def test_tables_ahead_of_the_log_are_refused_as_on_sqlite(followed) -> None:
    """The tracking row past the log's head (its last events deleted by a
    TRUNCATE the guards do not see, the row raised by hand, or tables restored
    from a later dump than the log): refused with one line, as SQLite's
    queries and ``wait`` refuse them, not answered from the tables (helper-406:
    an internal error; then the tables' answer with no word of it; helper-502:
    a restore that mixed two dumps answered positions the log lacks)."""
    import psycopg

    dsn, schema, url = followed
    with Ledger.open(url) as ledger:
        ledger.submit({"type": "node-registered", "node": "n1"})
        ledger.project()
    with psycopg.connect(dsn, autocommit=True) as connection:
        connection.execute(f"UPDATE {schema}.tracking SET notification_id = 5 "
                           "WHERE application_name = 'projections'")
    refusal = ("the log ends at position 1, before position 5, which the projection tables "
               "have applied: its last events were deleted (or the tracking row was raised "
               "by hand: alloc-ledger replay --repair sets it to the log's head); "
               "alloc-ledger verify checks whether the log was edited")
    result = invoke(["--store", url, "query", "nodes", "--format", "json"], code=1)
    assert result.stderr == f"Error: {refusal}\n"
    assert result.stdout == ""
    with pytest.raises(LogEndsEarly) as refused, ask(url):
        pass
    assert str(refused.value) == refusal
