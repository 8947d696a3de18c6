"""A rebuild keeps checkpoints only at multiples of ``every`` it passes:
each one while the state is small, further apart once the state has more
records than ``every``, and always the last before the position asked for;
whether it stops at a position, a time or the head. It starts from one
only if it is bound to this log."""

from __future__ import annotations

import sqlite3
import zlib
from datetime import datetime

import pytest

from ledger.application import Ledger
from ledger.errors import StoreUnavailable, Unreadable
from projections import checkpoints
from projections.asof import AsOf, materialize, rebuild
from scripts.simulate import generate


def kept_checkpoints(path) -> list[int]:
    connection = sqlite3.connect(path)
    try:
        return [r[0] for r in connection.execute("SELECT position FROM checkpoints ORDER BY 1")]
    finally:
        connection.close()


def dump(cluster) -> list[tuple]:
    connection = materialize(cluster)
    return [
        row
        for table in ("nodes", "slots", "allocations", "alloc_states", "addresses", "rejections")
        for row in connection.execute(f"SELECT * FROM {table} ORDER BY 1, 2")
    ]


def log_reads(store, monkeypatch) -> list[int]:
    """The positions the store's log is read after, from now on."""
    starts: list[int] = []
    read_log = type(store).read_log

    def reading(self, after, *args, **kwargs):
        starts.append(after)
        return read_log(self, after, *args, **kwargs)

    monkeypatch.setattr(type(store), "read_log", reading)
    return starts


def keeps(monkeypatch) -> list[int]:
    """The positions checkpoints are kept at, from now on."""
    kept: list[int] = []
    keep = checkpoints.keep
    monkeypatch.setattr(checkpoints, "keep", lambda store, cluster, position, max_at: (
        kept.append(position), keep(store, cluster, position, max_at)))
    return kept


def test_a_rebuild_to_a_position_keeps_checkpoints_at_the_multiples_it_passes(tmp_path):
    path = tmp_path / "l.db"
    with Ledger.open(f"sqlite:///{path}") as ledger:
        list(ledger.submit_many(list(generate(60, nodes=5, slots=2, seed=4)), batch=7))
        cluster, position = rebuild(ledger.store, AsOf(position=40), every=10)
        scratch, _ = rebuild(ledger.store, AsOf(position=40), every=0)
    assert position == 40
    assert kept_checkpoints(path) == [10, 20, 30, 40]
    assert dump(cluster) == dump(scratch)


def test_a_rebuild_to_a_time_stops_before_the_first_later_event(tmp_path):
    path = tmp_path / "l.db"
    events = list(generate(60, nodes=5, slots=2, seed=4))
    moment = AsOf.parse(events[24]["at"])
    with Ledger.open(f"sqlite:///{path}") as ledger:
        kept = list(ledger.submit_many(events, batch=7))
        cluster, position = rebuild(ledger.store, moment, every=10)
        scratch, scratch_position = rebuild(ledger.store, moment, every=0)
        reached, _ = rebuild(ledger.store, AsOf(position=position), every=0)
    assert [r.position for r in kept] == list(range(1, 61))  # event i at position i + 1
    limit = _moment(events[24]["at"])
    first_later = next(i for i, e in enumerate(events) if _moment(e["at"]) > limit)
    assert position == scratch_position == first_later  # the events before it, no more
    assert kept_checkpoints(path) == [p for p in (10, 20, 30, 40, 50) if p <= position]
    assert dump(cluster) == dump(scratch) == dump(reached)


def _moment(text: str) -> datetime:
    return datetime.fromisoformat(text)  # Python 3.11 reads Z


def test_a_rebuild_without_a_bound_replays_the_whole_log(tmp_path):
    path = tmp_path / "l.db"
    with Ledger.open(f"sqlite:///{path}") as ledger:
        list(ledger.submit_many(list(generate(35, nodes=5, slots=2, seed=4)), batch=7))
        cluster, position = rebuild(ledger.store, None, every=10)
        scratch, scratch_position = rebuild(ledger.store, None, every=0)
    assert position == scratch_position == 35
    assert kept_checkpoints(path) == [10, 20, 30]
    assert dump(cluster) == dump(scratch)


def checkpointed(path, events: int = 60, seed: int = 4) -> Ledger:
    """A ledger with checkpoints at 10, 20, 30 and 40 (close it after)."""
    ledger = Ledger.open(f"sqlite:///{path}")
    list(ledger.submit_many(list(generate(events, nodes=5, slots=2, seed=seed)), batch=7))
    rebuild(ledger.store, AsOf(position=40), every=10)
    assert kept_checkpoints(path) == [10, 20, 30, 40]
    return ledger


def edit(path, statement: str, *params) -> None:
    connection = sqlite3.connect(path)
    try:
        connection.execute(statement, params)
        connection.commit()
    finally:
        connection.close()


def test_a_good_checkpoint_is_the_start_of_an_as_of_replay(tmp_path):
    with checkpointed(tmp_path / "l.db") as ledger:
        found = checkpoints.nearest(ledger.store, 45, None)
        scratch, _ = rebuild(ledger.store, AsOf(position=40), every=0)
    assert found is not None and found[1] == 40
    assert dump(found[0]) == dump(scratch)


def test_the_nearest_checkpoint_may_be_at_the_very_position_or_time_asked(tmp_path):
    """At or before: a checkpoint at 40 starts an as-of 40, and one whose
    latest ``at`` is the time asked starts that as-of time."""
    with checkpointed(tmp_path / "l.db") as ledger:
        at_40 = checkpoints.nearest(ledger.store, 40, None)
        at_39 = checkpoints.nearest(ledger.store, 39, None)
        max_at = at_40[2] if at_40 is not None else None
        by_time = checkpoints.nearest(ledger.store, None, max_at)
    assert at_40 is not None and at_39 is not None and by_time is not None
    assert (at_40[1], at_39[1], by_time[1]) == (40, 30, 40)


def test_an_as_of_time_starts_from_no_checkpoint_kept_after_that_time(tmp_path):
    """A checkpoint keeps the latest ``at`` it replayed, so that an as-of
    time replays from one wholly before it: with checkpoints up to 40, the
    time of event 25 starts at 20 and stops where a replay from scratch does."""
    events = list(generate(60, nodes=5, slots=2, seed=4))
    moment = AsOf.parse(events[24]["at"])
    with checkpointed(tmp_path / "l.db") as ledger:
        found = checkpoints.nearest(ledger.store, None, moment.at)
        cluster, position = rebuild(ledger.store, moment, every=10)
        scratch, scratch_position = rebuild(ledger.store, moment, every=0)
    assert found is not None and found[1] == 20
    assert moment.at is not None and found[2] <= moment.at  # wholly before the time
    assert position == scratch_position < 40
    assert dump(cluster) == dump(scratch)


@pytest.mark.parametrize("position", [39, 40, 41])  # a checkpoint is kept at 40
def test_an_as_of_replay_starts_from_no_checkpoint_beyond_its_position(tmp_path, position):
    with checkpointed(tmp_path / "l.db") as ledger:
        cluster, reached = rebuild(ledger.store, AsOf(position=position))
        scratch, _ = rebuild(ledger.store, AsOf(position=position), every=0)
        before, _ = rebuild(ledger.store, AsOf(position=position - 1), every=0)
    assert reached == position
    assert dump(cluster) == dump(scratch) != dump(before)


@pytest.mark.parametrize("damage", ["garbage", "another ledger's", "its hash lost", "max_at"])
def test_a_checkpoint_not_bound_to_this_log_is_passed_over_and_replaced(tmp_path, damage):
    path = tmp_path / "l.db"
    with checkpointed(path) as ledger:
        if damage == "garbage":
            edit(path, "UPDATE checkpoints SET state = x'00112233' WHERE position = 40")
        elif damage == "another ledger's":
            with checkpointed(tmp_path / "other.db", seed=5):
                pass
            other = sqlite3.connect(tmp_path / "other.db")
            state, digest = other.execute(
                "SELECT state, hash FROM checkpoints WHERE position = 40").fetchone()
            other.close()
            edit(path, "UPDATE checkpoints SET state = ?, hash = ? WHERE position = 40",
                 state, digest)
        elif damage == "max_at":  # an earlier time: later as-of times would start there
            edit(path, "UPDATE checkpoints SET max_at = '2026-01-01T00:00:00.000000Z' "
                       "WHERE position = 40")
        else:
            edit(path, "UPDATE checkpoints SET hash = NULL WHERE position = 40")

        found = checkpoints.nearest(ledger.store, 45, None)
        assert found is not None and found[1] == 30  # the one before it
        assert kept_checkpoints(path) == [10, 20, 30]  # dropped
        cluster, _ = rebuild(ledger.store, AsOf(position=45), every=10)
        scratch, _ = rebuild(ledger.store, AsOf(position=45), every=0)
        assert dump(cluster) == dump(scratch)
        assert kept_checkpoints(path) == [10, 20, 30, 40]  # kept again
        assert checkpoints.nearest(ledger.store, 45, None)[1] == 40  # type: ignore[index]


@pytest.mark.timeout(60)  # a bad checkpoint that stays is looked at once, not again and again
def test_a_reader_that_may_not_drop_a_bad_checkpoint_passes_over_it_all_the_same(
    tmp_path, monkeypatch
):
    """A role that may not write keeps the bad checkpoint where it is: the
    lookup goes on below it, to the one before, rather than finding it again."""
    path = tmp_path / "l.db"
    with checkpointed(path) as ledger:
        edit(path, "UPDATE checkpoints SET state = x'00112233' WHERE position = 40")

        def may_not_write(*args, **kwargs):
            raise StoreUnavailable("may not write the projection tables")

        monkeypatch.setattr(ledger.store, "projecting", may_not_write)
        found = checkpoints.nearest(ledger.store, 45, None)
    assert found is not None and found[1] == 30
    assert kept_checkpoints(path) == [10, 20, 30, 40]  # not dropped


def test_a_bound_checkpoint_this_release_cannot_restore_is_passed_over(tmp_path):
    """Its hash matches (kept by a release whose state another shape, say),
    yet its state is no snapshot this release reads: the as-of replay starts
    from the one before, answers as a replay from scratch, and replaces it."""
    path = tmp_path / "l.db"
    with checkpointed(path) as ledger:
        with ledger.store.reading() as cursor:
            chain_hash = ledger.store.hash_at(cursor, 40)
        max_at = checkpoints.nearest(ledger.store, 40, None)[2]  # type: ignore[index]
        for state in (zlib.compress(b'{"nodes": 1}'), zlib.compress(b"[1, 2")):
            edit(path, "UPDATE checkpoints SET state = ?, hash = ? WHERE position = 40",
                 state, checkpoints.bound(chain_hash, max_at, state))

            found = checkpoints.nearest(ledger.store, 45, None)
            assert found is not None and found[1] == 30
            cluster, _ = rebuild(ledger.store, AsOf(position=45), every=10)
            scratch, _ = rebuild(ledger.store, AsOf(position=45), every=0)
            assert dump(cluster) == dump(scratch)
            assert checkpoints.nearest(ledger.store, 45, None)[1] == 40  # type: ignore[index]


def test_checkpoints_an_earlier_release_kept_are_passed_over(tmp_path):
    """Its table has no ``hash`` column: its rows are never used, and the
    next replay past them keeps bound ones."""
    path = tmp_path / "l.db"
    with Ledger.open(f"sqlite:///{path}") as ledger:
        list(ledger.submit_many(list(generate(60, nodes=5, slots=2, seed=4)), batch=7))
    edit(path, "CREATE TABLE checkpoints (position BIGINT PRIMARY KEY, max_at TEXT NOT NULL, "
               "state BLOB NOT NULL)")
    edit(path, "INSERT INTO checkpoints VALUES (40, '2026', x'00')")
    with Ledger.open(f"sqlite:///{path}") as ledger:
        assert checkpoints.nearest(ledger.store, 45, None) is None
        cluster, _ = rebuild(ledger.store, AsOf(position=45), every=10)
        scratch, _ = rebuild(ledger.store, AsOf(position=45), every=0)
        assert dump(cluster) == dump(scratch)
        assert checkpoints.nearest(ledger.store, 45, None)[1] == 40  # type: ignore[index]


def test_dropping_a_bad_checkpoint_leaves_a_good_one_kept_there_since(tmp_path):
    """Another process may have replaced it between the read and the drop."""
    with checkpointed(tmp_path / "l.db") as ledger:
        checkpoints._drop(ledger.store, 40, "the bad one's hash")
        assert kept_checkpoints(tmp_path / "l.db") == [10, 20, 30, 40]


def test_an_as_of_replay_reads_the_log_only_after_its_checkpoint(tmp_path, monkeypatch):
    """docs/queries.md: later as-of questions replay at most EVERY events."""
    with checkpointed(tmp_path / "l.db") as ledger:
        store = ledger.store
        starts = log_reads(store, monkeypatch)
        _, position = rebuild(store, AsOf(position=45), every=10)
    assert position == 45
    assert starts and min(starts) == 40


def test_a_rebuild_from_a_checkpoint_does_not_keep_that_checkpoint_again(tmp_path, monkeypatch):
    # Keeping one serializes the whole state (seconds deep into a long log):
    # an as-of at a checkpoint's own position, asked again, must not pay it.
    path = tmp_path / "l.db"
    with Ledger.open(f"sqlite:///{path}") as ledger:
        list(ledger.submit_many(list(generate(60, nodes=5, slots=2, seed=4)), batch=7))
        rebuild(ledger.store, AsOf(position=40), every=10)
        kept = keeps(monkeypatch)
        cluster, position = rebuild(ledger.store, AsOf(position=40), every=10)
        scratch, _ = rebuild(ledger.store, AsOf(position=40), every=0)
        rebuild(ledger.store, AsOf(position=50), every=10)
    assert position == 40 and dump(cluster) == dump(scratch)
    assert kept == [50]  # not 40 again; 50 is new
    assert kept_checkpoints(path) == [10, 20, 30, 40, 50]


def registrations_then_heartbeats(nodes: int, events: int) -> list[dict]:
    registered = [{"type": "node-registered", "node": f"n{i}"} for i in range(nodes)]
    beats = [{"type": "heartbeat", "node": f"n{i % nodes}"} for i in range(events - nodes)]
    return registered + beats


def test_checkpoints_grow_further_apart_as_the_state_outgrows_their_spacing(
    tmp_path, monkeypatch
):
    # A checkpoint writes the whole state, which grows with history: at 10M
    # events, one every 100,000 positions made the first as-of at 5M take
    # 468 s (helper-h602). Here the state is 30 nodes past position 30, more
    # than every=10: one is kept once 30 events were replayed since the last.
    path = tmp_path / "l.db"
    with Ledger.open(f"sqlite:///{path}") as ledger:
        list(ledger.submit_many(registrations_then_heartbeats(30, 200), batch=7))
        kept = keeps(monkeypatch)
        cluster, position = rebuild(ledger.store, AsOf(position=195), every=10)
        scratch, _ = rebuild(ledger.store, AsOf(position=195), every=0)
        # by time, to the head: no last pause before a position asked for
        rebuild(ledger.store, AsOf.parse("9999-01-01T00:00:00Z"), every=10)
    assert position == 195 and dump(cluster) == dump(scratch)
    # 10: 10 records; 20 and 30: fewer events since 10 than records;
    # 190: the last pause before 195; then from 190 by time, 200: the last
    # pause before that time (the log ends before the next).
    assert kept == [10, 40, 70, 100, 130, 160, 190, 200]
    assert kept_checkpoints(path) == [10, 40, 70, 100, 130, 160, 190, 200]


def test_a_time_question_asked_again_starts_near_its_point(tmp_path, monkeypatch):
    # A time question keeps its last pause before its point too (helper-h603:
    # it kept none once the state had as many records as events replayed
    # since the last checkpoint, here each event a rejection, so asking it
    # again replayed the whole stretch again).
    beats = [{"type": "heartbeat", "node": f"ghost{i}",
              "at": f"2026-01-01T00:{i // 60:02d}:{i % 60:02d}Z"} for i in range(200)]
    with Ledger.open(f"sqlite:///{tmp_path / 'l.db'}") as ledger:
        store = ledger.store
        list(ledger.submit_many(beats, batch=7))
        point = AsOf.parse("2026-01-01T00:03:15Z")  # up to position 196
        rebuild(store, point, every=10)
        starts = log_reads(store, monkeypatch)
        _, position = rebuild(store, point, every=10)
    assert position == 196
    assert starts and min(starts) >= 186  # not from position 10 again


def test_a_time_question_reads_ahead_only_where_spacing_keeps_no_checkpoint(
    tmp_path, monkeypatch
):
    # Whether a pause is a time question's last needs the next pause's event
    # read; where the spacing already keeps a checkpoint, that read is waste.
    with Ledger.open(f"sqlite:///{tmp_path / 'l.db'}") as ledger:
        store = ledger.store
        list(ledger.submit_many(registrations_then_heartbeats(3, 60), batch=7))
        peeks: list[list[int]] = []
        kept_at = type(store).kept_at
        monkeypatch.setattr(type(store), "kept_at", lambda self, cursor, positions: (
            peeks.append(positions), kept_at(self, cursor, positions))[1])
        kept = keeps(monkeypatch)
        rebuild(store, AsOf.parse("9999-01-01T00:00:00Z"), every=10)
    assert kept == [10, 20, 30, 40, 50, 60]  # 3 records: every pause by spacing
    assert peeks == []


def test_a_time_question_keeps_the_state_before_an_unreadable_event_it_then_names(
    tmp_path, monkeypatch
):
    # The next pause's event cannot be read, so whether this pause is the
    # last cannot be told: the state here is kept, and the replay goes on to
    # name the damaged event (not the look ahead).
    path = tmp_path / "l.db"
    beats = [{"type": "heartbeat", "node": f"ghost{i}",
              "at": f"2026-01-01T00:{i // 60:02d}:{i % 60:02d}Z"} for i in range(200)]
    with Ledger.open(f"sqlite:///{path}") as ledger:
        list(ledger.submit_many(beats, batch=7))
    connection = sqlite3.connect(path)
    with connection:
        for (name,) in connection.execute(
            "SELECT name FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'stored_events'"
        ).fetchall():
            connection.execute(f'DROP TRIGGER "{name}"')
        connection.execute(
            "UPDATE stored_events SET state = x'7b7b' WHERE originator_version = 100")
    connection.close()
    with Ledger.open(f"sqlite:///{path}") as ledger:
        kept = keeps(monkeypatch)
        with pytest.raises(Unreadable) as raised:
            rebuild(ledger.store, AsOf.parse("2026-01-01T00:02:30Z"), every=10)
    assert raised.value.position == 100
    assert kept == [10, 90]  # 10 by spacing (each ghost beat a record), 90 before 100
