"""Shared fixtures: a fresh ledger per test, told a cluster story, read with plain SQL.

``cluster`` opens a new ledger, once on SQLite (a file in the test's
``tmp_path``) and once on PostgreSQL (a fresh schema in the database named by
``ALLOC_LEDGER_TEST_PG``, projections kept inline so they are current; skipped
with a reason when the variable is unset, failed when ``ALLOC_LEDGER_REQUIRE_PG``
says PostgreSQL must be tested). Events are submitted the way a tool does
(``Ledger.submit`` with a dict); state is read back from the documented
projection tables with plain SQL, as a reporting tool would (the standard
``sqlite3`` module, or psycopg).
"""

from __future__ import annotations

import sqlite3
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pg_support import postgres_or_skip

from ledger.application import Ledger, Receipt

PROJECTIONS = ("nodes", "slots", "allocations", "alloc_states", "addresses")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Say why tests were skipped, one line a reason, even under ``-q``."""
    reasons: Counter[str] = Counter()
    for report in terminalreporter.stats.get("skipped", []):
        longrepr = report.longrepr
        text = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        reasons[text.removeprefix("Skipped: ")] += 1
    for reason, count in sorted(reasons.items(), key=lambda item: -item[1]):
        terminalreporter.write_line(f"skipped {count}: {reason}")


class SQLiteReader:
    def __init__(self, path: Path) -> None:
        self.path = path

    def rows(self, sql: str, params: tuple[Any, ...]) -> list[dict[str, Any]]:
        connection = sqlite3.connect(self.path)
        connection.row_factory = sqlite3.Row
        try:
            return [dict(row) for row in connection.execute(sql, params)]
        finally:
            connection.close()

    def drop(self) -> None:
        pass


class PostgresReader:
    def __init__(self, dsn: str, schema: str) -> None:
        import psycopg
        from psycopg.rows import dict_row

        self.connection = psycopg.connect(dsn, autocommit=True, row_factory=dict_row)
        self.schema = schema

    def rows(self, sql: str, params: tuple[Any, ...]) -> list[dict[str, Any]]:
        self.connection.execute(f"SET search_path TO {self.schema}")
        return list(self.connection.execute(sql.replace("?", "%s"), params).fetchall())

    def drop(self) -> None:
        self.connection.execute(f"DROP SCHEMA IF EXISTS {self.schema} CASCADE")
        self.connection.close()


class ClusterStory:
    """A cluster story told event by event to one fresh ledger."""

    def __init__(self, url: str, reader: SQLiteReader | PostgresReader) -> None:
        self.url = url
        self.reader = reader
        self.ledger = Ledger.open(self.url)

    def close(self) -> None:
        self.ledger.close()
        self.reader.drop()

    def reopen(self) -> None:
        """Close the store and open a new ledger on the same file."""
        self.ledger.close()
        self.ledger = Ledger.open(self.url)

    # -- telling -------------------------------------------------------------

    def submit(self, kind: str, **fields: Any) -> Receipt:
        return self.ledger.submit({"type": kind, **fields})

    def happens(self, kind: str, **fields: Any) -> int:
        """Submit an event that must be appended; return its position."""
        receipt = self.submit(kind, **fields)
        assert receipt.status == "appended", receipt
        assert receipt.position is not None
        return receipt.position

    def refused(self, kind: str, **fields: Any) -> str:
        """Submit an event a rule must reject; return the reason."""
        receipt = self.submit(kind, **fields)
        assert receipt.status == "rejected", receipt
        assert receipt.error is not None
        return receipt.error

    def ready_node(self, node: str, slots: int = 0, parent: str | None = None) -> int:
        """Register a node and hear its first heartbeat: it takes placements."""
        extra = {} if parent is None else {"parent": parent}
        self.happens("node-registered", node=node, slots=slots, **extra)
        return self.happens("heartbeat", node=node)

    def place(self, alloc: str, node: str, **fields: Any) -> int:
        return self.happens("alloc-placed", alloc=alloc, node=node, **fields)

    def report(self, alloc: str, client_status: str, **fields: Any) -> int:
        return self.happens("alloc-updated", alloc=alloc, client_status=client_status, **fields)

    def running(self, alloc: str, node: str, **fields: Any) -> int:
        """Place an allocation and hear it is running; return the report's position."""
        self.place(alloc, node, **fields)
        return self.report(alloc, "running")

    # -- reading -------------------------------------------------------------

    def rows(self, sql: str, *params: Any) -> list[dict[str, Any]]:
        return self.reader.rows(sql, params)

    def one(self, sql: str, *params: Any) -> dict[str, Any]:
        found = self.rows(sql, *params)
        assert len(found) == 1, found
        return found[0]

    def node(self, node: str) -> dict[str, Any]:
        return self.one("SELECT * FROM nodes WHERE node = ?", node)

    def status(self, node: str) -> str:
        return str(self.node(node)["status"])

    def alloc(self, alloc: str) -> dict[str, Any]:
        return self.one("SELECT * FROM allocations WHERE alloc = ?", alloc)

    def slot(self, node: str, index: int) -> dict[str, Any]:
        return self.one("SELECT * FROM slots WHERE node = ? AND slot = ?", node, index)

    def slot_state(self, node: str, index: int) -> tuple[str, str | None]:
        found = self.slot(node, index)
        return found["state"], found["alloc"]

    def holder(self, address: str) -> tuple[str, str] | None:
        """Which allocation holds an address, and in what state; None when free."""
        found = self.rows("SELECT alloc, state FROM addresses WHERE address = ?", address)
        return None if not found else (found[0]["alloc"], found[0]["state"])

    def states(self, alloc: str) -> list[tuple[str, int]]:
        """An allocation's alloc states, in order: (value, position)."""
        found = self.rows(
            "SELECT value, position FROM alloc_states WHERE alloc = ? ORDER BY position", alloc
        )
        return [(row["value"], row["position"]) for row in found]

    def needing_reconnect(self) -> list[str]:
        found = self.rows("SELECT alloc FROM needs_reconnect ORDER BY alloc")
        return [row["alloc"] for row in found]

    def rejections(self) -> list[dict[str, Any]]:
        return self.rows("SELECT * FROM rejections ORDER BY position")

    def snapshot(self) -> dict[str, list[tuple[Any, ...]]]:
        """Every projection row except the rejection log, in a stable order."""
        ordered = "SELECT * FROM {} ORDER BY 1, 2"
        return {
            table: [tuple(row.values()) for row in self.rows(ordered.format(table))]
            for table in PROJECTIONS
        }

    def head(self) -> int:
        """The position of the last event in the log (0 when empty)."""
        with self.ledger.store.reading() as cursor:
            return self.ledger.store.head(cursor)


@pytest.fixture(scope="session")
def pg_dsn() -> str:
    """The DSN of the test database (skip, or fail, as ``postgres_or_skip``)."""
    return postgres_or_skip()


@pytest.fixture(params=["sqlite", "postgresql"])
def cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ClusterStory]:
    if request.param == "sqlite":
        story = ClusterStory(f"sqlite:///{tmp_path}/l.db", SQLiteReader(tmp_path / "l.db"))
    else:
        dsn = postgres_or_skip()
        schema = f"t_{uuid.uuid4().hex[:16]}"
        separator = "&" if "?" in dsn else "?"
        url = f"{dsn}{separator}schema={schema}&projections=inline"
        story = ClusterStory(url, PostgresReader(dsn, schema))
    yield story
    story.close()
