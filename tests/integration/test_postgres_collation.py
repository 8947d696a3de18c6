"""Answers list names in one order on either store, whatever the PostgreSQL
database's collation (README, Querying: "the others by name"): code point
order, as SQLite and Python sort them. The test database is C.UTF-8; these
run on a database made with an en-US collation, as ``initdb`` makes one on
a machine whose locale is en_US.UTF-8 (found by a newcomer's review: there
`query nodes` listed `_z a b B n-2 n1`, its as-of answer `B _z a b n-2 n1`)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from cli_support import invoke
from pg_support import postgres_or_skip

NAMES = ["b", "B", "a", "_z", "n-2", "n1", "é", "Z"]  # ordered otherwise by en-US
QUERIES = ["nodes", "allocs", "slots", "zombie-slots", "addresses", "suspects"]
NOW = "2026-01-01T00:00:00Z"


@pytest.fixture
def en_us_database() -> Iterator[str]:
    """A database whose default collation is ICU en-US; dropped afterwards."""
    dsn = postgres_or_skip()
    import psycopg

    name = f"t_coll_{uuid.uuid4().hex[:12]}"
    try:
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(
                f"CREATE DATABASE {name} TEMPLATE template0 LOCALE_PROVIDER icu "
                "ICU_LOCALE 'en-US' LOCALE 'C.UTF-8'"
            )
    except psycopg.Error as error:
        pytest.skip(f"cannot make a database with an ICU en-US collation here: {error}")
    try:
        yield urlunsplit(urlsplit(dsn)._replace(path=f"/{name}"))
    finally:
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def history() -> list[dict[str, Any]]:
    """Nodes, allocations and addresses named alike but for case and marks,
    each answer's rows tied on what it orders by first: zombie slots of
    every node, allocations unknown since one disconnect, nodes down in one
    cascade."""
    events: list[dict[str, Any]] = [{"type": "node-registered", "node": "root", "slots": 0}]
    for name in NAMES:
        events.append({"type": "node-registered", "node": name, "slots": 2, "parent": "root"})
        events.append({"type": "heartbeat", "node": name})
    events.append({"type": "node-registered", "node": "host", "slots": len(NAMES)})
    events.append({"type": "heartbeat", "node": "host"})
    for slot, name in enumerate(NAMES):
        events.append({"type": "alloc-placed", "alloc": name, "node": "host", "slot": slot,
                       "addresses": [f"{name}:80"], "max_disconnect": 60})
        events.append({"type": "alloc-updated", "alloc": name, "client_status": "running"})
        events.append({"type": "heartbeat", "node": name,
                       "slots": [{"slot": 0, "alloc": f"ghost-{name}"}]})
    events.append({"type": "heartbeat-missed", "node": "host"})  # every alloc unknown at once
    events.append({"type": "node-down", "node": "root"})  # every named node down at once
    return [{**event, "at": "2025-12-31T23:59:00Z"} for event in events]


def submit(url: str) -> None:
    lines = "".join(json.dumps(event) + "\n" for event in history())
    result = invoke(["--store", url, "submit", "-"], input=lines)
    assert result.exit_code == 0, result.output


def answers(url: str, *extra: str) -> dict[str, list[dict[str, Any]]]:
    found = {}
    for query in [*QUERIES, "needs-reconnect"]:
        now = ["--now", NOW] if query == "needs-reconnect" else []
        result = invoke(["--store", url, "query", query, "--format", "json", *now, *extra])
        assert result.exit_code == 0, result.output
        found[query] = json.loads(result.output)
    return found


def test_the_answers_are_in_one_order_on_sqlite_and_on_an_en_us_postgresql_database(
    en_us_database: str, tmp_path: Any
) -> None:
    sqlite_url = f"sqlite:///{tmp_path}/l.db"
    submit(sqlite_url)
    pg_url = f"{en_us_database}?projections=inline"
    submit(pg_url)

    on_sqlite, on_postgres = answers(sqlite_url), answers(pg_url)

    assert on_postgres == on_sqlite
    # every answer has rows to order, in code point order
    assert [row["node"] for row in on_postgres["nodes"]] == sorted([*NAMES, "host", "root"])
    assert [row["alloc"] for row in on_postgres["needs-reconnect"]] == sorted(NAMES)
    assert [row["node"] for row in on_postgres["zombie-slots"]] == sorted(NAMES)
    assert [row["address"] for row in on_postgres["addresses"]] == sorted(f"{n}:80" for n in NAMES)
    assert [row["node"] for row in on_postgres["suspects"]] == sorted([*NAMES, "root"])


def test_an_answer_on_an_en_us_postgresql_database_is_in_the_order_of_its_as_of_answer(
    en_us_database: str,
) -> None:
    url = f"{en_us_database}?projections=inline"
    submit(url)
    assert answers(url) == answers(url, "--as-of", str(len(history())))
