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

THREADS, EACH = 6, 20


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


# -- helper-205's review ------------------------------------------------------------


def test_a_closed_ledger_says_so_for_its_reads_too(store_url: str) -> None:
    """README: exceptions are all LedgerErrors, ``LedgerClosed`` for a ledger
    used after ``close()``. Its reads (lag, project) raised eventsourcing's
    ConnectionPoolClosedError, with no text, on SQLite, and on PostgreSQL a
    StoreUnavailable ('pool has already been opened/closed') that reads as a
    store to retry."""
    ledger = Ledger.open(store_url)
    assert ledger.submit({"type": "node-registered", "node": "n1"}).ok
    ledger.close()
    for attempt in (ledger.lag, ledger.project):
        with pytest.raises(LedgerClosed, match="this ledger was closed"):
            attempt()


def test_a_ledger_closed_by_another_thread_mid_submit_lets_its_batch_end(
    store_url: str,
) -> None:
    """Another thread closes the ledger while this one's submit parses its
    batch (helper-205): the close waits for that batch, which is kept, and
    the next submit is told the ledger is closed at once. Before, on
    PostgreSQL, the hand-over opened its writer connection again after
    close(), waited its whole ``timeout`` for a leader no one would start
    ('no writer decided the batch within 3 s') and left that connection open."""
    url = f"{store_url}&timeout=3" if store_url.startswith("postgres") else store_url
    ledger = Ledger.open(url)
    assert ledger.submit({"type": "node-registered", "node": "n1"}).ok
    parse_all = ledger.parse_all
    closer = threading.Thread(target=ledger.close)

    def parsed_while_closing(items: Any) -> Any:
        closer.start()
        time.sleep(0.3)  # the closer waits for this batch
        assert closer.is_alive()
        return parse_all(items)

    ledger.parse_all = parsed_while_closing  # type: ignore[method-assign]
    started = time.monotonic()
    receipt = ledger.submit({"type": "heartbeat", "node": "n1"})
    closer.join(10)
    assert (receipt.status, receipt.position, closer.is_alive()) == ("appended", 2, False)
    with pytest.raises(LedgerClosed):
        ledger.submit({"type": "heartbeat", "node": "n1"})
    assert time.monotonic() - started < 2.5
    handoff = getattr(ledger.store, "handoff", None)
    if handoff is not None:
        assert handoff.connection is None or handoff.connection.closed, \
            "a connection made after close() was left open"
    with Ledger.open(url) as reopened:  # the batch in flight was kept, nothing after it
        assert reopened.submit({"type": "heartbeat", "node": "n1"}).position == 3


def test_a_stream_closed_by_another_thread_ends_with_ledger_closed(store_url: str) -> None:
    """``submit_many`` read a batch ahead (SQLite decides the next batch while
    the last commits): a close from another thread between two batches ends
    the stream with ``LedgerClosed``, after the receipts of what was kept."""
    ledger = Ledger.open(store_url)
    assert ledger.submit({"type": "node-registered", "node": "n1"}).ok
    events = ({"type": "heartbeat", "node": "n1", "id": f"h{k}"} for k in range(200))
    receipts: list[Any] = []
    closer = threading.Thread(target=ledger.close)
    with pytest.raises(LedgerClosed):
        for receipt in ledger.submit_many(events, batch=10):
            receipts.append(receipt)
            if len(receipts) == 10:
                closer.start()
                closer.join(10)
    assert not closer.is_alive()
    assert [(r.status, r.position) for r in receipts] == [
        ("appended", p) for p in range(2, 2 + len(receipts))]
    with Ledger.open(store_url) as reopened:  # what was reported is what was kept
        assert reopened.submit({"type": "heartbeat", "node": "n1"}).position == 2 + len(receipts)
