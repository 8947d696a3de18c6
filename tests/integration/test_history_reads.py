"""A history is read from the log a few events at a time, as its rows are
printed: never the whole of a long history at once (a node that reports
every one of its slots in each of thousands of heartbeats has a history of
gigabytes in memory). On SQLite and on PostgreSQL."""

from __future__ import annotations

import json
from typing import Any

import pytest
from cli_support import invoke

from commands import output
from projections import history as histories
from projections.history import history, search

SLOTS = 16
BEATS = 40


def reporting_node(cluster: Any) -> None:
    """n1 with every slot held, and BEATS heartbeats reporting all of them."""
    cluster.ready_node("n1", slots=SLOTS)
    for slot in range(SLOTS):
        cluster.place(f"a{slot}", "n1", slot=slot)
    report = [{"slot": slot, "alloc": f"a{slot}"} for slot in range(SLOTS)]
    receipts = cluster.ledger.submit_batch([{"type": "heartbeat", "node": "n1", "slots": report}] * BEATS)
    assert {receipt.status for receipt in receipts} == {"appended"}


class Reads:
    """Counts what a store reads of the log for a history."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, store: Any) -> None:
        self.searches: list[int] = []  # events found, per search
        self.reads: list[int] = []  # kept events, per read
        self.sizes: list[list[int]] = []  # their stored sizes, per read
        kind = type(store)
        search_log, kept_at = kind.search_log, kind.kept_at

        def searching(own: Any, cursor: Any, needle: str, after: int, upto: int, limit: int) -> Any:
            found = search_log(own, cursor, needle, after, upto, limit)
            self.searches.append(len(found))
            return found

        def reading(own: Any, cursor: Any, positions: list[int]) -> Any:
            kept = kept_at(own, cursor, positions)
            self.reads.append(len(kept))
            self.sizes.append([len(stored.state) for stored in kept])
            return kept

        monkeypatch.setattr(kind, "search_log", searching)
        monkeypatch.setattr(kind, "kept_at", reading)


def test_a_history_is_read_a_page_of_positions_and_a_few_events_at_a_time(cluster, monkeypatch):
    reporting_node(cluster)
    store = cluster.ledger.store
    whole = history(store, "n1#0")  # read as it comes: its pages larger than this history
    assert [row["type"] for row in whole] == (
        ["node-registered", "alloc-placed"] + ["heartbeat"] * BEATS)

    monkeypatch.setattr(histories, "PAGE", 7)
    monkeypatch.setattr(histories, "READ_BYTES", 1)  # one event per read
    reads = Reads(monkeypatch, store)
    found = search(store, "n1#0")
    rows = found.rows()

    assert next(rows) == whole[0]
    assert (reads.searches, reads.reads) == ([7], [1])  # the first row: one page, one event
    assert [next(rows)] + list(rows) == whole[1:]
    assert found.whole
    # every event naming "n1" was read once, one at a time, a page of 7 found at a time
    assert set(reads.reads) == {1}
    assert sum(reads.reads) == sum(reads.searches) == cluster.head()
    assert reads.searches == [7] * (cluster.head() // 7) + [cluster.head() % 7]


def test_the_events_read_at_once_are_bounded_by_their_size(cluster, monkeypatch):
    reporting_node(cluster)
    store = cluster.ledger.store
    last = cluster.head()
    with store.reading() as cursor:
        beat = len(store.kept_at(cursor, [last])[0].state)  # one stored heartbeat
    monkeypatch.setattr(histories, "READ_BYTES", 3 * beat)
    reads = Reads(monkeypatch, store)

    rows = history(store, "a3")

    assert [row["type"] for row in rows] == ["alloc-placed"] + ["heartbeat"] * BEATS
    # a read ends with the event that brings it to the budget (as a submit's
    # batch does): the placement (smaller) and three heartbeats, then threes
    assert reads.reads[:2] == [4, 3]
    assert all(sum(sizes[:-1]) < 3 * beat <= sum(sizes) for sizes in reads.sizes[:-1])
    assert sum(reads.sizes[-1]) <= 3 * beat
    assert sum(reads.reads) == 1 + BEATS  # the events that name a3 (found by the search)


class Decoded:
    """Counts the kept events a history decodes, and how many it had at
    each write to stdout."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.events = 0
        self.at_writes: list[int] = []
        read, write = histories.read, output.write

        def decoding(stored: Any) -> Any:
            self.events += 1
            return read(stored)

        def noting(text: str, *args: Any) -> None:
            self.at_writes.append(self.events)
            write(text, *args)

        monkeypatch.setattr(histories, "read", decoding)
        monkeypatch.setattr(output, "write", noting)
        monkeypatch.setattr(histories, "READ_BYTES", 1, raising=False)  # an event per read
        monkeypatch.setattr(output, "CHUNK", 1, raising=False)  # every row written as made


def test_query_history_prints_its_first_rows_before_it_reads_the_last(cluster, monkeypatch):
    """As a user runs it: the rows read so far go out before the next events
    are read, in every format (a table reads them twice, for its widths)."""
    reporting_node(cluster)
    decoded = Decoded(monkeypatch)
    for fmt, reading in [("json", 1), ("jsonl", 1), ("csv", 1), ("table", 2)]:
        decoded.events = 0
        decoded.at_writes.clear()
        printed = invoke(["--store", cluster.url, "query", "history", "n1#0", "--format", fmt])

        assert decoded.events == reading * cluster.head(), fmt  # all name "n1": the needle
        assert decoded.at_writes[0] < decoded.events - BEATS, (fmt, decoded.at_writes)
        if fmt == "json":
            assert [row["position"] for row in json.loads(printed.stdout)] == [
                1, 3] + list(range(3 + SLOTS, 3 + SLOTS + BEATS))


def test_query_alloc_prints_its_history_as_it_reads_it(cluster, monkeypatch):
    reporting_node(cluster)
    decoded = Decoded(monkeypatch)

    printed = invoke(["--store", cluster.url, "query", "alloc", "a5", "--format", "json"])

    assert decoded.events == 1 + BEATS  # its placement and every heartbeat: all name "a5"
    assert decoded.at_writes[0] <= 1, decoded.at_writes
    answer = json.loads(printed.stdout)
    assert (answer["alloc"], answer["slot"]) == ("a5", 5)
    assert [row["type"] for row in answer["history"]] == ["alloc-placed"] + ["heartbeat"] * BEATS
