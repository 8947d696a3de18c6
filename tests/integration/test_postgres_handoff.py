"""PostgreSQL writers with ``?writers=combine`` hand batches to one leader (``ledger.postgres_handoff``):
several writers' batches are decided in one transaction, in order; a batch
whose writer has gone is dropped, never decided later; a writer that no
leader answers withdraws its batch and says so; a leader that stops hands
the lead to a standby of another writer."""

from __future__ import annotations

import threading
import zlib

import pytest

from ledger.application import Ledger
from ledger.errors import StoreUnavailable
from ledger.postgres_handoff import HAND
from ledger.store import open_store

COMBINE = "&writers=combine"


def _leader_key(schema: str) -> int:
    return zlib.crc32(f"alloc-ledger:leader:{schema}".encode())


def _register(url: str, *nodes: str) -> None:
    with Ledger.open(url) as ledger:
        for node in nodes:
            assert ledger.submit({"type": "node-registered", "node": node}).status == "appended"


def test_one_leader_decides_the_batches_of_several_writers(pg_url, tables):
    pg_url += COMBINE
    _register(pg_url, "n1")
    writers = [Ledger.open(pg_url) for _ in range(4)]
    results: dict[int, list[str]] = {}

    def write(number: int) -> None:
        batch = [{"type": "heartbeat", "node": "n1", "id": f"w{number}-{i}"} for i in range(50)]
        results[number] = [r.status for r in writers[number].submit_batch(batch)]

    threads = [threading.Thread(target=write, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for writer in writers:
        writer.close()

    assert all(statuses == ["appended"] * 50 for statuses in results.values())
    assert tables(pg_url).head() == 201  # gapless: the registration and 4 x 50
    ids = [row["id"] for row in tables(pg_url).rows("SELECT id FROM event_ids ORDER BY position")]
    for number in range(4):  # each writer's batch stays in its own order
        mine = [i for i in ids if i.startswith(f"w{number}-")]
        assert mine == [f"w{number}-{i}" for i in range(50)]
    assert tables(pg_url).value("SELECT count(*) FROM handoff") == 0
    assert tables(pg_url).value("SELECT count(*) FROM outcomes") == 0


def test_a_batch_whose_writer_has_gone_is_dropped_not_decided(pg_url, pg_schema, tables):
    pg_url += COMBINE
    _register(pg_url, "n1")
    store = open_store(pg_url)
    gone = store.connect()  # type: ignore[attr-defined]
    gone.execute(HAND, ("gone", b'[{"type": "heartbeat", "node": "n1", "id": "ghost"}]',
                        "nobody-listens"))
    gone.close()  # the writer dies before any leader takes its batch
    store.close()

    _register(pg_url, "n2")  # the next leader's round

    assert tables(pg_url).value("SELECT count(*) FROM event_ids WHERE id = 'ghost'") == 0
    assert tables(pg_url).value("SELECT count(*) FROM handoff") == 0
    assert tables(pg_url).head() == 2


def test_a_writer_no_leader_answers_withdraws_its_batch(pg_url, pg_schema, tables):
    pg_url += COMBINE
    _register(pg_url, "n1")
    blocker = open_store(pg_url).connect()  # type: ignore[attr-defined]
    blocker.execute("SELECT pg_advisory_lock(%s)", (_leader_key(pg_schema),))  # a stuck leader
    try:
        with Ledger.open(f"{pg_url}&timeout=1") as ledger, pytest.raises(
            StoreUnavailable, match="no writer decided the batch within 1 s"
        ):
            ledger.submit({"type": "heartbeat", "node": "n1"})
    finally:
        blocker.close()

    assert tables(pg_url).head() == 1  # nothing of it was written
    assert tables(pg_url).value("SELECT count(*) FROM handoff") == 0


def test_when_the_leader_stops_a_standby_of_another_writer_leads(pg_url, tables):
    pg_url += COMBINE
    _register(pg_url, "n1")
    first, second = Ledger.open(pg_url), Ledger.open(pg_url)
    try:
        assert first.submit({"type": "heartbeat", "node": "n1"}).status == "appended"
        assert second.submit({"type": "heartbeat", "node": "n1"}).status == "appended"
        first.close()  # the leader (the first to stand by) stops

        receipt = second.submit({"type": "heartbeat", "node": "n1"})

        assert (receipt.status, receipt.position) == ("appended", 4)
    finally:
        second.close()
