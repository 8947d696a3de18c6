"""Fixtures for the audit tests: a fresh store on each database (see
``audit_support`` for the helpers)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from audit_support import PG, StoreUnderTest, pg_url, sqlite_store
from pg_support import postgres_or_skip


@pytest.fixture
def sqlite_under_test(tmp_path: Path) -> StoreUnderTest:
    return sqlite_store(tmp_path)


@pytest.fixture
def pg_under_test() -> Iterator[StoreUnderTest]:
    postgres_or_skip()
    import psycopg

    schema = f"audit_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG.split("?", 1)[0], autocommit=True) as connection:
        connection.execute(f'CREATE SCHEMA "{schema}"')
    try:
        yield StoreUnderTest(pg_url(schema), "postgresql", schema=schema)
    finally:
        with psycopg.connect(PG.split("?", 1)[0], autocommit=True) as connection:
            connection.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def under_test(request: pytest.FixtureRequest, tmp_path: Path) -> StoreUnderTest:
    if request.param == "sqlite":
        return sqlite_store(tmp_path)
    return request.getfixturevalue("pg_under_test")  # type: ignore[no-any-return]
