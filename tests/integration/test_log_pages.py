"""The log is read a page per read: a page ends at ``PAGE`` events or once
its kept events reach ``PAGE_BYTES`` (the one that reaches it taken),
whichever comes first, and the next page starts after it. A log of large
events (rejected slot reports of 1 MiB) is so read in bounded memory, every
event once and in order. On SQLite and on PostgreSQL (there through a
follower too, which reads inside its own transaction)."""

from __future__ import annotations

import sys
import tracemalloc
from collections.abc import Iterator
from typing import Any

import pytest

from ledger.application import Ledger
from ledger.chain import verify
from ledger.store import Store, open_store
from projections.replay import replay

SMALL = 3  # the count that ends a page, where a test sets it


def report(slots: int) -> list[dict[str, Any]]:
    """A slot report of about 150 bytes a slot, kept."""
    return [{"slot": 0, "alloc": f"{n:0128d}"} for n in range(slots)]


def sized_log(url: str) -> None:
    """Small events and large ones (rejected heartbeats, kept with their
    event: about 6 to 120 kB), in no order of size."""
    heartbeats = [{"type": "heartbeat", "node": "gone", "slots": report(slots)}
                  for slots in (400, 40, 800, 40, 100, 600, 300, 40, 800, 200)]
    with Ledger.open(url) as ledger:
        ledger.submit_batch([{"type": "node-registered", "node": "n1", "slots": 2},
                             {"type": "heartbeat", "node": "n1"}])
        for heartbeat in heartbeats:
            ledger.submit_batch([heartbeat, {"type": "heartbeat", "node": "n1"}])
        ledger.submit_batch([{"type": "alloc-placed", "alloc": "a1", "node": "n1", "slot": 0}])


@pytest.fixture
def log(store_url: str) -> Iterator[Store]:
    sized_log(store_url)
    store = open_store(store_url)
    try:
        yield store
    finally:
        store.close()


def sizes_of(store: Store) -> dict[int, int]:
    """The stored size of every kept event, by position."""
    with store.reading() as cursor:
        head = store.head(cursor)
        kept = store.kept_at(cursor, list(range(1, head + 1)))
    assert [stored.originator_version for stored in kept] == list(range(1, head + 1))
    return {stored.originator_version: len(stored.state) for stored in kept}


def pages_by_rule(sizes: dict[int, int], after: int, upto: int, budget: int, count: int) -> list[list[int]]:
    """The pages the rule makes of positions after ``after`` up to ``upto``."""
    pages: list[list[int]] = []
    page: list[int] = []
    held = 0
    for position in range(after + 1, upto + 1):
        page.append(position)
        held += sizes[position]
        if held >= budget or len(page) == count:
            pages.append(page)
            page, held = [], 0
    return pages + [page] if page else pages


def budgeted(monkeypatch: pytest.MonkeyPatch, store: Store, budget: int, count: int | None = None) -> None:
    """Set the store's page budget (and count), where its ``read_log`` reads them."""
    module = sys.modules[type(store).read_log.__module__]
    monkeypatch.setattr(module, "PAGE_BYTES", budget, raising=False)  # (raising: the old code had none)
    if count is not None:
        monkeypatch.setattr(module, "PAGE", count)


class Pages:
    """The positions ``read_log`` yields, by the read transaction that read them
    (a store reads a page in a transaction of its own, outside one)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, store: Store) -> None:
        self.store = store
        self.reads: list[list[int]] = []
        reading = store.reading

        def counted() -> Any:
            self.reads.append([])
            return reading()

        monkeypatch.setattr(store, "reading", counted)

    def read(self, after: int, upto: int | None) -> list[list[int]]:
        self.reads.clear()
        for stored in self.store.read_log(after, upto):
            assert self.reads, "an event yielded before any read"
            self.reads[-1].append(stored.originator_version)
        # the last read may find nothing (after a full page), no other
        pages = self.reads[:-1] if len(self.reads) > 1 and not self.reads[-1] else self.reads
        assert all(pages), self.reads
        return list(pages)


def test_a_page_ends_at_its_bytes_or_its_count_and_the_next_starts_after_it(log, monkeypatch):
    sizes = sizes_of(log)
    head = max(sizes)
    largest = max(sizes.values())
    alone = max(sizes, key=lambda position: sizes[position])  # the largest event
    pages = Pages(monkeypatch, log)
    cases = [
        (sum(sizes[p] for p in (1, 2, 3)), None),  # the first page ends exactly on its budget
        (largest - 1, None),  # an event larger than the budget: a page of its own
        (largest // 2, None),
        (1, None),  # an event per page
        (sum(sizes.values()), None),  # the whole log: ended by its count, or by the log
        (sum(sizes.values()), SMALL),
        (3 * sizes[4] // 2, SMALL),
    ]
    for budget, count in cases:
        budgeted(monkeypatch, log, budget, count)
        ranges = [(0, None), (0, head), (1, head - 2), (5, 6), (4, 13), (alone - 1, None), (head - 1, head)]
        for after, upto in ranges:
            expected = pages_by_rule(sizes, after, upto or head, budget, count or 5000)

            read = pages.read(after, upto)

            assert read == expected, (budget, count, after, upto)
    # the pages those budgets make: one of the largest event alone, one ended on its budget
    assert pages_by_rule(sizes, alone - 1, head, largest - 1, 5000)[0] == [alone]
    assert pages_by_rule(sizes, 0, head, sum(sizes[p] for p in (1, 2, 3)), 5000)[0] == [1, 2, 3]


def test_the_bytes_held_while_the_log_is_read_are_bounded_by_the_budget(log, store_url, monkeypatch):
    """What a page holds, as Python objects (SQLite: the rows fetched from
    the cursor, not only those kept): the rest of the page is never read."""
    with Ledger.open(store_url) as ledger:  # more of the largest events
        ledger.submit_batch([{"type": "heartbeat", "node": "gone", "slots": report(800)}] * 10)
    sizes = sizes_of(log)
    total, largest = sum(sizes.values()), max(sizes.values())
    assert total > 12 * largest
    budgeted(monkeypatch, log, largest)
    tracemalloc.start()
    try:
        positions = [stored.originator_version for stored in log.read_log(0)]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert positions == sorted(sizes)
    # a page: the budget and the one event that reaches it, two of the largest
    # at most (5,000 events a page, the whole log was held at once)
    assert peak < 3 * largest, (peak, largest, total)


def test_replay_verify_and_a_follower_read_the_same_log_in_small_pages(store_url, monkeypatch, replayed, tables):
    sized_log(store_url)
    store = open_store(store_url)
    try:
        whole = verify(store)
        sizes = sizes_of(store)
        budgeted(monkeypatch, store, 2 * sorted(sizes.values())[len(sizes) // 2])
        reads = Pages(monkeypatch, store)
        assert len(reads.read(0, None)) > 4  # the budget makes pages of the log

        checked = verify(store)  # (PostgreSQL: through its own transaction)
        replayed_report = replay(store)
    finally:
        store.close()
    assert whole.ok and checked.ok, (whole.as_dict(), checked.as_dict())
    assert (checked.verified, checked.hash) == (whole.verified, whole.hash)
    assert whole.verified == max(sizes)
    assert replayed_report.ok and replayed_report.events == max(sizes), replayed_report.as_dict()

    with Ledger.open(store_url) as ledger:  # the follower's catch-up (PostgreSQL), in small pages
        budgeted(monkeypatch, ledger.store, 2 * sorted(sizes.values())[len(sizes) // 2], SMALL)
        ledger.project()
    assert tables(store_url).tracked() == max(sizes)
    assert tables(store_url).snapshot() == replayed(store_url)
