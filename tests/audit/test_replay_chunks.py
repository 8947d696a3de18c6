"""A replay holds a chunk of events' changes until it writes them: a chunk
ends at ``CHUNK_BYTES`` of kept events too, not only at ``CHUNK`` events, so
a log of large events (rejected slot reports of 1 MiB) is replayed in bounded
memory. On SQLite and on PostgreSQL."""

from __future__ import annotations

import pytest

from ledger.errors import LogEndsEarly
from projections import replay as replaying
from projections.replay import replay


def test_a_replay_chunk_ends_at_the_bytes_it_may_hold(cluster, monkeypatch):
    cluster.ready_node("n1", slots=4)
    big = [{"slot": 0, "alloc": f"{n:0100d}"} for n in range(200)]  # about 25 kB kept
    for _ in range(6):
        cluster.refused("heartbeat", node="gone", slots=big)  # kept, with its event
    cluster.place("a1", "n1", slot=0)
    head = cluster.head()
    with cluster.ledger.store.reading() as cursor:
        kept = cluster.ledger.store.kept_at(cursor, list(range(1, head + 1)))
    sizes = [len(stored.state) for stored in kept]
    monkeypatch.setattr(replaying, "CHUNK_BYTES", 2 * max(sizes), raising=False)
    written = []
    write = replaying.Scratch._write

    def writing(scratch, changed):
        written.append(changed)
        write(scratch, changed)

    monkeypatch.setattr(replaying.Scratch, "_write", writing)

    report = replay(cluster.ledger.store)

    assert report.ok, report.as_dict()
    assert report.events == head
    # two large events at most per chunk: the six rejections take three chunks at least
    assert len(written) >= 4, len(written)
    assert cluster.rows("SELECT COUNT(*) AS n FROM rejections") == [{"n": 6}]


def test_a_replay_sent_past_the_end_of_the_log_names_where_it_ends(cluster):
    """A replay is sent to where the live tables (or the head) are; a log that
    ends before it there (its last events deleted meanwhile) is named, never
    taken as replayed that far and compared as if it were."""
    cluster.ready_node("n1", slots=1)
    head = cluster.head()

    with replaying.scratch_tables(cluster.ledger.store) as scratch, pytest.raises(
        LogEndsEarly, match=f"the log ends at position {head}, before its head {head + 2}"
    ):
        scratch.replay_to(head + 2)
