"""The projector applies the log exactly once: a position is tracked only
once the event at it is applied."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from ledger.application import Ledger
from ledger.errors import LogEndsEarly
from projections import tables
from projections.projector import Projector


def test_a_log_that_ends_before_its_head_is_an_error_and_nothing_is_tracked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Ledger.open(f"sqlite:///{tmp_path}/l.db") as ledger:
        for node in ("n1", "n2", "n3"):
            assert ledger.submit({"type": "node-registered", "node": node}).status == "appended"
        store = ledger.store
        with store.projecting() as cursor:
            tables.create(cursor, store.dialect, "scratch_")
        projector = Projector(store, prefix="scratch_")
        whole = store.read_log
        tracked: list[int] = []
        monkeypatch.setattr(store, "tracked", lambda cursor: 0)  # as scratch tables are
        monkeypatch.setattr(store, "track", lambda cursor, position: tracked.append(position))
        # the last event deleted once the head was read
        monkeypatch.setattr(store, "read_log", lambda after, upto=None: itertools.islice(
            whole(after, upto), 2))

        with pytest.raises(LogEndsEarly) as ended, store.projecting() as cursor:
            projector.catch_up(cursor)

    assert str(ended.value) == (
        "the log ends at position 2, before its head 3 when this began: its last events "
        "were deleted; alloc-ledger verify checks whether the log was edited")
    assert tracked == []
