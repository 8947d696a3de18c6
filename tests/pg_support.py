"""Whether the PostgreSQL half of the tests runs: one gate for every suite.

The tests reach PostgreSQL through the DSN in ``ALLOC_LEDGER_TEST_PG``; when it
is unset they skip with a reason, unless ``ALLOC_LEDGER_REQUIRE_PG`` says they
must run (CI sets both), where they fail instead."""

from __future__ import annotations

import os

import pytest

PG_ENV = "ALLOC_LEDGER_TEST_PG"
NO_PG = f"{PG_ENV} is not set (e.g. postgresql://postgres@127.0.0.1:5432/test)"


def pg_dsn() -> str | None:
    return os.environ.get(PG_ENV) or None


def postgres_or_skip() -> str:
    """The DSN of the test database; skip without one, or fail where it is required."""
    dsn = pg_dsn()
    if dsn is None:
        if os.environ.get("ALLOC_LEDGER_REQUIRE_PG"):
            pytest.fail(f"{PG_ENV} is not set, and ALLOC_LEDGER_REQUIRE_PG says it must be")
        pytest.skip(NO_PG)
    return dsn
