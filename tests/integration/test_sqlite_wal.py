"""SQLite's write-ahead log after a long read: a reader that keeps a
transaction open (a dashboard) keeps the ``-wal`` file from being folded
back, so it grows with what is written meanwhile; once the reader is done
and a writer folds it back, the file is cut back to ``WAL_LIMIT`` (SQLite's
``journal_size_limit``), not left at its largest for as long as any
connection stays open."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from ledger import sqlite_store
from ledger.application import Ledger


def _heartbeats(first: int, count: int) -> list[dict[str, object]]:
    return [{"type": "heartbeat", "node": "n1", "id": f"h{n}"} for n in range(first, first + count)]


def test_the_wal_is_cut_back_once_a_long_read_ends(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(sqlite_store, "WAL_LIMIT", LIMIT)
    path = tmp_path / "ledger.db"
    wal = Path(f"{path}-wal")
    with Ledger.open(f"sqlite:///{path}") as ledger:
        ledger.submit({"type": "node-registered", "node": "n1", "slots": 1})
        dashboard = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        dashboard.execute("BEGIN")
        dashboard.execute("SELECT count(*) FROM nodes").fetchall()  # its snapshot holds the WAL
        for first in range(0, 12_000, 500):
            assert {r.status for r in ledger.submit_batch(_heartbeats(first, 500))} == {"appended"}
        grown = wal.stat().st_size
        dashboard.execute("COMMIT")  # the dashboard stays connected, its read done
        sizes = []
        for first in range(12_000, 16_000, 500):  # writers fold the WAL back and start it again
            ledger.submit_batch(_heartbeats(first, 500))
            sizes.append(wal.stat().st_size)
        dashboard.close()

    # Past SQLite's own checkpoint point (1,000 pages): a WAL it could not fold back.
    assert grown > 4 * 1024 * 1024, grown
    # Started again, cut back to the limit (then a batch's pages written into it).
    assert min(sizes) <= LIMIT + 512 * 1024, (grown, sizes)


LIMIT = 256 * 1024


@pytest.mark.parametrize("through", ["its path", "a symbolic link"])
def test_a_files_stream_keeps_the_wal_near_its_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, through: str
):
    """A file's batches are decided while the last one commits (the
    pipeline): a reader is in the WAL at most commits, so SQLite's own
    checkpoint seldom starts it again; 300,000 simulated events grew it to
    208 MB beside a 128 MB store. Each commit past the limit folds it back.
    SQLite keeps the WAL beside the file a symbolic link leads to."""
    monkeypatch.setattr(sqlite_store, "WAL_LIMIT", 4 * LIMIT)
    path = tmp_path / "ledger.db"
    wal = Path(f"{path}-wal")
    opened = path
    if through == "a symbolic link":
        (tmp_path / "elsewhere").mkdir()
        opened = tmp_path / "elsewhere" / "link.db"
        opened.symlink_to(path)
    sizes = []
    with Ledger.open(f"sqlite:///{opened}") as ledger:
        ledger.submit({"type": "node-registered", "node": "n1", "slots": 1})
        batches = (_heartbeats(first, 500) for first in range(0, 30_000, 500))
        for receipts in ledger.submit_batches(batches):
            assert {r.status for r in receipts} == {"appended"}
            sizes.append(wal.stat().st_size)

    # The limit, and the batch or two written since it was last folded back.
    assert max(sizes) <= 4 * LIMIT + 2 * 512 * 1024, sizes


def test_one_shot_writers_beside_a_long_read_are_not_held_each_for_the_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Beside a dashboard's long read, a WAL past its limit cannot be folded
    back: a one-shot writer (its store's first commit) tries without waiting
    for the reader, or every one of them would hold the write lock for
    ``FOLD_WAIT``, one after another."""
    monkeypatch.setattr(sqlite_store, "WAL_LIMIT", LIMIT)
    monkeypatch.setattr(sqlite_store, "FOLD_WAIT", 5000)
    path = tmp_path / "ledger.db"
    url = f"sqlite:///{path}"
    with Ledger.open(url) as ledger:
        ledger.submit({"type": "node-registered", "node": "n1", "slots": 1})
        dashboard = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        dashboard.execute("BEGIN")
        dashboard.execute("SELECT count(*) FROM nodes").fetchall()
        for first in range(0, 4_000, 500):
            ledger.submit_batch(_heartbeats(first, 500))
    assert Path(f"{path}-wal").stat().st_size > LIMIT
    started = time.monotonic()
    for n in range(3):
        with Ledger.open(url) as one_shot:
            assert one_shot.submit({"type": "heartbeat", "node": "n1", "id": f"o{n}"}).status == (
                "appended")
    took = time.monotonic() - started
    dashboard.close()

    assert took < 5, took  # three waits would be 15 s
