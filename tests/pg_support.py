"""Whether the PostgreSQL half of the tests runs: one gate for every suite.

The tests reach PostgreSQL through the DSN in ``ALLOC_LEDGER_TEST_PG``; when it
is unset they skip with a reason, unless ``ALLOC_LEDGER_REQUIRE_PG`` says they
must run (CI sets both), where they fail instead."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

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


def hand_over_in_turn(read: Any, writes: list[Callable[[], None]], threads: list[threading.Thread]) -> None:
    """Run each write in a thread of its own (appended to ``threads``), the
    next once the last has handed its batch over: with the lead held
    elsewhere, the batches wait in the order of ``writes``."""
    for number, write in enumerate(writes):
        threads.append(threading.Thread(target=write))
        threads[-1].start()
        deadline = time.monotonic() + 10
        while read.value("SELECT count(*) FROM handoff") < number + 1:
            assert time.monotonic() < deadline, "the batch was not handed over"
            time.sleep(0.02)
