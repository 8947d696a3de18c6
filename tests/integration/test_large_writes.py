"""Writes of large events on PostgreSQL: a projector applies and writes the
log a page at a time, a page ending at ``PAGE`` events or once their kept
JSON reaches ``PAGE_BYTES``; and a transaction's statements of tens of
megabytes are sent whole before its end is waited for (psycopg's pipeline
sync left them half sent, and the client and the server waited for each
other for ever: a replay of 40 rejected 1 MiB heartbeats never ended)."""

from __future__ import annotations

from typing import Any

import pytest

from ledger.application import Ledger
from ledger.store import open_store
from projections import projector as projecting
from projections.projector import Projector
from projections.replay import replay

MIB = 1 << 20


def heartbeat(size: int) -> dict[str, Any]:
    """A heartbeat of a node that was never registered (rejected, so kept
    with its event), its slot report about ``size`` bytes of JSON."""
    entries = max(1, size // 27)
    return {"type": "heartbeat", "node": "gone", "slots": [{"slot": 0, "alloc": None}] * entries}


def submit(url: str, sizes: list[int]) -> None:
    with Ledger.open(url) as ledger:
        ledger.submit_batch([{"type": "node-registered", "node": "n1", "slots": 1}])
        for size in sizes:
            receipts = ledger.submit_batch([heartbeat(size), {"type": "heartbeat", "node": "n1"}])
            assert [receipt.status for receipt in receipts] == ["rejected", "appended"]


def test_a_projector_applies_and_writes_a_page_of_its_bytes_at_a_time(
    pg_url: str, monkeypatch: pytest.MonkeyPatch, replayed: Any, tables: Any
) -> None:
    submit(pg_url, [40_000, 4_000, 90_000, 4_000, 60_000, 20_000, 4_000, 70_000])
    budget = 100_000
    monkeypatch.setattr(projecting, "PAGE_BYTES", budget)
    pages: list[list[int]] = []
    replay_log = projecting.replay_log

    def applying(cluster: Any, page: list[Any], progress: Any) -> None:
        pages.append([len(stored.state) for stored in page])
        replay_log(cluster, page, progress)

    monkeypatch.setattr(projecting, "replay_log", applying)
    store = open_store(pg_url)
    try:
        assert Projector(store).update() == (0, 17)
    finally:
        store.close()

    assert sum(len(page) for page in pages) == 17  # every event once
    assert len(pages) > 2
    for page in pages[:-1]:  # each ends with the event that reaches the budget
        assert sum(page[:-1]) < budget <= sum(page), pages
    assert sum(pages[-1][:-1]) < budget
    assert tables(pg_url).snapshot() == replayed(pg_url)


@pytest.mark.timeout(300)
def test_a_replay_and_a_follower_of_large_events_end_on_postgresql(pg_url: str) -> None:
    submit(pg_url, [MIB] * 40)  # 40 rejected heartbeats of 1 MiB: one write of ~50 MB each
    store = open_store(pg_url)
    try:
        assert Projector(store).update() == (0, 81)
        report = replay(store)
    finally:
        store.close()
    assert report.differences == [] and report.events == 81
