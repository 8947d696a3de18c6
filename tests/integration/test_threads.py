"""One Ledger shared by the threads of a service (helper-204's review): each
thread gets its own receipts, the positions stay gapless, and a ledger used
after ``close()`` says so at once. On PostgreSQL a process's batches go one at
a time (its writer connection and its notifications are shared); before, two
threads took each other's receipts (combining writers: both waited out the
timeout for events that were kept) or tripped psycopg_pool's bare
AssertionError (``writers=lock``)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from ledger.application import Ledger
from ledger.errors import LedgerClosed

THREADS, EACH = 4, 12


def _url(store_url: str, writers: str) -> str:
    if not writers:
        return store_url
    if not store_url.startswith("postgres"):
        pytest.skip("writers= is a PostgreSQL option")
    return f"{store_url}&writers={writers}&timeout=10"


def _hammer(ledger: Ledger) -> tuple[dict[str, Any], list[BaseException]]:
    """THREADS threads submitting EACH heartbeats (half one by one, half as a
    stream), and one reading the lag meanwhile."""
    receipts: dict[str, Any] = {}
    errors: list[BaseException] = []
    done = threading.Event()

    def submit(number: int) -> None:
        ids = [f"t{number}-{k}" for k in range(EACH)]
        events = [{"type": "heartbeat", "node": "n1", "id": i} for i in ids]
        try:
            if number % 2:
                receipts.update(zip(ids, ledger.submit_many(events, batch=3), strict=True))
            else:
                for ident, event in zip(ids, events, strict=True):
                    receipts[ident] = ledger.submit(event)
        except BaseException as error:  # noqa: BLE001 - what the test reports
            errors.append(error)

    def read() -> None:
        try:
            while not done.is_set():
                assert ledger.lag() >= 0
        except BaseException as error:  # noqa: BLE001
            errors.append(error)

    writers = [threading.Thread(target=submit, args=(n,)) for n in range(THREADS)]
    reader = threading.Thread(target=read)
    for thread in (*writers, reader):
        thread.start()
    for thread in writers:
        thread.join(120)
    done.set()
    reader.join(30)
    return receipts, errors


@pytest.mark.parametrize("writers", ["", "lock"])
def test_one_ledger_shared_by_threads_answers_each_thread(store_url: str, writers: str) -> None:
    url = _url(store_url, writers)
    with Ledger.open(url) as ledger:
        assert ledger.submit({"type": "node-registered", "node": "n1"}).status == "appended"
        started = time.monotonic()
        receipts, errors = _hammer(ledger)
        took = time.monotonic() - started

    assert errors == [], [f"{type(e).__name__}: {e}" for e in errors[:3]]
    assert took < 10, f"{THREADS * EACH} heartbeats took {took:.1f} s"
    assert {r.status for r in receipts.values()} == {"appended"}
    positions = sorted(r.position for r in receipts.values())
    assert positions == list(range(2, 2 + THREADS * EACH))  # gapless after the registration
    with Ledger.open(url) as again:  # each id is kept at the position its receipt said
        for ident, receipt in receipts.items():
            retry = again.submit({"type": "heartbeat", "node": "n1", "id": ident})
            assert (retry.status, retry.position) == ("duplicate", receipt.position), ident


def test_a_closed_ledger_says_so_at_once(store_url: str) -> None:
    ledger = Ledger.open(store_url)
    assert ledger.submit({"type": "node-registered", "node": "n1"}).ok
    ledger.close()
    heartbeat = {"type": "heartbeat", "node": "n1"}
    started = time.monotonic()
    for attempt in (
        lambda: ledger.submit(heartbeat),
        lambda: ledger.submit_many([heartbeat]),
        lambda: next(iter(ledger.submit_batches([[heartbeat]]))),
    ):
        with pytest.raises(LedgerClosed, match="this ledger was closed: Ledger.open another"):
            attempt()
    assert time.monotonic() - started < 2
    with Ledger.open(store_url) as reopened:  # nothing was kept
        assert reopened.submit(heartbeat).position == 2


@pytest.mark.parametrize("stream", [
    {"type": "heartbeat", "node": "n1"},  # one event: its keys would be read as two
    '{"type": "heartbeat", "node": "n1"}',  # one text: its characters
    b'{"type": "heartbeat", "node": "n1"}',
])
def test_submit_many_of_one_event_is_told_to_submit_it(tmp_path: Any, stream: Any) -> None:
    with Ledger.open(f"sqlite:///{tmp_path}/l.db") as ledger:
        with pytest.raises(TypeError, match="submit_many takes an iterable of events"):
            ledger.submit_many(stream)  # at the call, not at the first receipt
        assert ledger.lag() == 0


@pytest.mark.parametrize("batch", [0, -1, "3", 2.5, True])
def test_submit_many_takes_a_batch_of_at_least_one(tmp_path: Any, batch: Any) -> None:
    with Ledger.open(f"sqlite:///{tmp_path}/l.db") as ledger, pytest.raises(
            ValueError, match="batch must be a whole number of at least 1"):
        ledger.submit_many([{"type": "node-registered", "node": "n1"}], batch=batch)
