"""A replay whose server goes away mid-replay (helper-203): the error it
reports is why it stopped, not the later failure to drop its scratch tables.

Seen against a private PostgreSQL 15 stopped with ``pg_ctl -m immediate``
while ``alloc-ledger replay`` ran: exit 3
after 5 s more with ``Error: store …: pool initialization incomplete after
5.0 sec`` (psycopg_pool's words from the ``finally`` that drops the scratch
tables), where the read had failed with ``server closed the connection
unexpectedly``. Simulated here on SQLite: the read fails, then so does the drop.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from audit_support import StoreUnderTest
from test_replay import replayed_here, scratch_tables, told

from ledger.errors import StoreUnavailable
from ledger.store import open_store
from projections import replay as replaying

LOST = "server closed the connection unexpectedly"


def test_a_replay_cut_off_reports_why_it_stopped_not_the_failed_cleanup(
    sqlite_under_test: StoreUnderTest,
) -> None:
    told(sqlite_under_test, events=300)
    store = open_store(sqlite_under_test.url, create=False)
    gone = {"yes": False}
    projecting = store.projecting

    def read_log(after: int, upto: int | None = None) -> Iterator[Any]:
        gone["yes"] = True
        raise StoreUnavailable(f"store {sqlite_under_test.url}: consuming input failed: {LOST}")
        yield  # pragma: no cover

    @contextmanager
    def projecting_while_gone(*args: Any, **kwargs: Any) -> Iterator[Any]:
        if gone["yes"]:  # what the pool says once the server is gone
            raise StoreUnavailable(
                f"store {sqlite_under_test.url}: pool initialization incomplete after 5.0 sec")
        with projecting(*args, **kwargs) as cursor:
            yield cursor

    store.read_log = read_log  # type: ignore[method-assign]
    store.projecting = projecting_while_gone  # type: ignore[method-assign]
    try:
        with pytest.raises(StoreUnavailable) as raised:
            replaying.replay(store)
    finally:
        store.projecting = projecting  # type: ignore[method-assign]
        store.close()
    assert LOST in str(raised.value), str(raised.value)


@pytest.mark.parametrize("error", [RuntimeError("a bug mid-way"), KeyboardInterrupt()])
def test_a_replay_stopped_otherwise_still_drops_its_scratch_tables(
    under_test: StoreUnderTest, monkeypatch: pytest.MonkeyPatch, error: BaseException,
) -> None:
    """Only a failed drop is left to the next replay: a replay stopped by an
    error of its own or Ctrl-C, with its store still there, drops them."""
    told(under_test, events=300)
    made: list[list[str]] = []

    def stopped(store: Any, scratch: Any) -> Any:
        made.append(scratch_tables(under_test))
        raise error

    monkeypatch.setattr(replaying, "_against_live", stopped)
    with pytest.raises(type(error)):
        replayed_here(under_test)
    assert made and made[0], "the replay made no scratch tables to drop"
    assert scratch_tables(under_test) == []
