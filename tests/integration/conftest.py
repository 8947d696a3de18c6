"""Integration fixtures: the same tests against SQLite and PostgreSQL.

``store_url`` is parametrized over both stores. The PostgreSQL half needs
``ALLOC_LEDGER_TEST_PG`` (a DSN such as
``postgresql://postgres@127.0.0.1:5432/test``); each test gets a fresh schema
with a unique name, dropped afterwards. Without the variable the PostgreSQL
half is skipped, saying why.

Helpers come as fixtures (test modules import nothing from here):
``tables(url)`` reads a store's tables with plain SQL (``?`` placeholders for
both stores), ``replayed(url)`` is what a fresh replay of the log builds,
``alloc_ledger(*args, url=…)`` runs the CLI in its own process, ``pg_admin``
runs SQL as the test database's owner.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pg_support import pg_dsn, postgres_or_skip

from ledger.application import Ledger
from ledger.store import open_store
from projections import tables
from projections.asof import materialize, rebuild

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "commands"]
def with_option(url: str, option: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}{option}"


def admin_connection() -> Any:
    """A plain psycopg connection to the test database (autocommit)."""
    import psycopg

    dsn = pg_dsn()
    assert dsn is not None
    return psycopg.connect(dsn, autocommit=True)


@pytest.fixture
def pg_schema() -> Iterator[str]:
    """A fresh, unique schema name in the test database, dropped afterwards."""
    postgres_or_skip()
    name = f"t_{uuid.uuid4().hex[:16]}"
    yield name
    with admin_connection() as connection:
        connection.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")


@pytest.fixture
def pg_url(pg_schema: str) -> str:
    """A PostgreSQL store URL in a fresh schema (projections kept by a follower)."""
    dsn = pg_dsn()
    assert dsn is not None
    return with_option(dsn, f"schema={pg_schema}")


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh store of each kind."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/ledger.db"
    return str(request.getfixturevalue("pg_url"))


def is_pg(url: str) -> bool:
    return url.startswith("postgres")


class Tables:
    """Plain SQL over a store's tables (``?`` placeholders, either store)."""

    def __init__(self, url: str) -> None:
        self.url = url

    def rows(self, statement: str, *params: Any) -> list[dict[str, Any]]:
        store = open_store(self.url)
        try:
            with store.reading() as cursor:
                cursor.execute(statement.replace("?", store.param), params)
                names = [d[0] for d in cursor.description]
                return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
        finally:
            store.close()

    def value(self, statement: str, *params: Any) -> Any:
        found = self.rows(statement, *params)
        assert len(found) == 1, found
        return next(iter(found[0].values()))

    def head(self) -> int:
        return int(self.value("SELECT COALESCE(MAX(originator_version), 0) FROM stored_events"))

    def tracked(self) -> int:
        return int(self.value("SELECT MAX(notification_id) FROM tracking "
                              "WHERE application_name = 'projections'") or 0)

    def snapshot(
        self, prefix: str = "", only: Iterable[str] = tables.TABLES
    ) -> dict[str, list[tuple[Any, ...]]]:
        """Every row of the projection tables (or the ``state_`` copies), in a stable order."""
        return {
            table: ordered(tuple(r.values()) for r in self.rows(f"SELECT * FROM {prefix}{table}"))
            for table in only
        }


def ordered(rows: Iterable[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    return sorted(rows, key=repr)


def replayed(
    url: str, upto: int | None = None, only: Iterable[str] = tables.TABLES
) -> dict[str, list[tuple[Any, ...]]]:
    """The projection tables a fresh replay of the log (up to a position) builds."""
    from projections.asof import AsOf

    store = open_store(url)
    try:
        cluster, _ = rebuild(store, None if upto is None else AsOf(position=upto))
    finally:
        store.close()
    connection = materialize(cluster)
    try:
        result = {}
        for table in only:
            rows = connection.execute(f"SELECT * FROM {table}").fetchall()
            result[table] = ordered(tuple(r) for r in rows)
        return result
    finally:
        connection.close()


def project(url: str) -> None:
    with Ledger.open(url) as ledger:
        ledger.project()


def cli(*args: str, url: str, stdin: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``alloc-ledger`` as a user does, in a separate process."""
    return subprocess.run(
        [*CLI, "--store", url, *args], input=stdin, capture_output=True, text=True,
        timeout=timeout, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False,
    )


def run_admin(statement: str) -> list[tuple[Any, ...]]:
    with admin_connection() as connection:
        cursor = connection.execute(statement)
        return cursor.fetchall() if cursor.description else []


@pytest.fixture
def tables() -> type[Tables]:
    return Tables


@pytest.fixture(name="replayed")
def replayed_fixture() -> Callable[..., dict[str, list[tuple[Any, ...]]]]:
    return replayed


@pytest.fixture
def alloc_ledger() -> Callable[..., subprocess.CompletedProcess[str]]:
    return cli


@pytest.fixture(name="project")
def project_fixture() -> Callable[[str], None]:
    return project


@pytest.fixture
def pg_admin() -> Callable[[str], list[tuple[Any, ...]]]:
    postgres_or_skip()
    return run_admin


@pytest.fixture
def login_role(pg_admin: Callable[[str], list[tuple[Any, ...]]]) -> Iterator[str]:
    """A fresh role that may log in, dropped afterwards with what it owns."""
    name = f"role_{uuid.uuid4().hex[:10]}"
    pg_admin(f"CREATE ROLE {name} LOGIN")
    yield name
    pg_admin(f"DROP OWNED BY {name}")
    pg_admin(f"DROP ROLE {name}")

