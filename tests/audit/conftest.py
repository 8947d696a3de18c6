"""Fixtures for the audit tests: a fresh store on each database, and one
holding a few hundred events whose guards an attacker dropped (see
``audit_support`` for the helpers)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from audit_support import (
    PG,
    Attack,
    Attacker,
    StoreUnderTest,
    history,
    pg_url,
    sqlite_store,
    texts,
)
from pg_support import postgres_or_skip

from ledger.application import Ledger
from ledger.chain import current_digest
from ledger.store import Store, open_store


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


@pytest.fixture
def ledger_log(under_test: StoreUnderTest) -> Iterator[tuple[StoreUnderTest, Store]]:
    """A store holding a few hundred events, committed in several transactions."""
    with Ledger.open(under_test.url) as ledger:
        receipts = list(ledger.submit_many(texts(history(240, nodes=8)), batch=40))
    assert all(r.status in ("appended", "rejected") for r in receipts)
    store = open_store(under_test.url)
    try:
        yield under_test, store
    finally:
        store.close()


@pytest.fixture
def attack(ledger_log: tuple[StoreUnderTest, Store]) -> Attack:
    target, store = ledger_log
    attacker = Attacker(target)
    attacker.drop_guards()
    return Attack(target, store, current_digest(store), attacker)
