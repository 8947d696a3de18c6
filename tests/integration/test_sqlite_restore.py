"""An older copy restored in place (``sqlite3 ledger.db ".restore
backup.db"``, the counterpart of ``.backup``: the same file, its pages
replaced) under a writer that has the ledger open: as for a backup moved
over the file, the writer must not go on giving out positions it already
reported for other events (helper-502: a stream's later lines took positions
4,000 acknowledged events had, and nothing said so)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pytest
from cli_support import invoke

from ledger.application import Ledger
from ledger.errors import LogEndsEarly

CLI = [sys.executable, "-m", "commands"]
LOST = ("the log ends at position 1, before position 2, which this writer appended and "
        "reported: its last events were deleted (or an older copy of the store was restored "
        "over it while this writer had it open: what it reported since that copy is not "
        "kept); alloc-ledger verify checks whether the log was edited")


def copied(source: Path, target: Path) -> None:
    """``sqlite3 source ".backup target"``; the other way, ``.restore``."""
    with closing(sqlite3.connect(source)) as read, closing(sqlite3.connect(target)) as written:
        read.backup(written)


def test_a_writer_refuses_a_log_restored_below_what_it_reported(tmp_path: Path) -> None:
    path, backup = tmp_path / "ledger.db", tmp_path / "backup.db"
    with Ledger.open(f"sqlite:///{path}") as ledger:
        assert ledger.submit({"type": "node-registered", "node": "n1"}).position == 1
        copied(path, backup)
        kept = ledger.submit({"type": "heartbeat", "node": "n1", "id": "hb-2"})
        assert (kept.status, kept.position) == ("appended", 2)

        copied(backup, path)  # hb-2 is gone

        with pytest.raises(LogEndsEarly) as refused:
            ledger.submit({"type": "heartbeat", "node": "n1", "id": "hb-3"})
        assert str(refused.value) == LOST
    with Ledger.open(f"sqlite:///{path}") as later:  # a writer that never saw position 2
        assert later.submit({"type": "heartbeat", "node": "n1", "id": "hb-3"}).position == 2


def test_a_stream_stops_when_the_log_is_restored_below_its_reported_lines(
    tmp_path: Path,
) -> None:
    """Through the pipeline (a batch decided ahead while the last commits)."""
    path, backup = tmp_path / "ledger.db", tmp_path / "backup.db"
    events = [{"type": "node-registered", "node": "n1"},
              *({"type": "heartbeat", "node": "n1", "id": f"hb-{n}"} for n in range(2, 9))]
    with Ledger.open(f"sqlite:///{path}") as ledger:
        batches = ledger.submit_batches([events[i:i + 1] for i in range(len(events))])
        assert [r.position for r in next(batches)] == [1]
        copied(path, backup)
        assert [r.position for r in next(batches)] == [2]
        copied(backup, path)
        with pytest.raises(LogEndsEarly, match="^the log ends at position 1, before position 2,"):
            list(batches)


def test_the_command_line_says_the_log_lost_what_it_reported(tmp_path: Path) -> None:
    """A producer's stream (a pipe: each line answered as it comes), the copy
    restored between two of its lines: one line, exit 1, and no claim that
    the lines reported before are kept."""
    path, backup = tmp_path / "ledger.db", tmp_path / "backup.db"
    url = f"sqlite:///{path}"
    invoke(["--store", url, "submit", "node-registered", "--node", "n1"])
    copied(path, backup)
    heartbeat = b'{"type": "heartbeat", "node": "n1"}\n'
    stream = subprocess.Popen([*CLI, "--store", url, "submit", "-"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert stream.stdin is not None and stream.stdout is not None
    stream.stdin.write(heartbeat)
    stream.stdin.flush()
    assert json.loads(stream.stdout.readline())["position"] == 2
    copied(backup, path)
    stream.stdin.write(heartbeat)
    out, err = stream.communicate(timeout=60)

    assert stream.returncode == 1
    assert out == b""
    assert err.decode() == f"Error: {LOST}\n"
