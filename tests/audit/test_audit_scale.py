"""The audit's work grows with history, not with its square.

Work is counted, not timed: the lines of ``projections/audit.py`` run
(``sys.settrace`` sees each turn of a loop or comprehension as a line), for
a history of n nodes and of 4n. Linear work gives a ratio of about 4; the
index that spanned every node's report gave about 16 (each report was judged
against every other node's, and a removed node scanned every report).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

import projections.audit
from ledger.application import Ledger
from ledger.store import open_store
from projections.audit import audit

AUDIT = projections.audit.__file__
SMALL = 150


def one_alloc_reported_everywhere(nodes: int) -> Iterator[dict[str, Any]]:
    """Every node reports the same allocation id: a zombie on each."""
    for i in range(nodes):
        yield {"type": "node-registered", "node": f"n{i}", "slots": 2}
    for i in range(nodes):
        yield {"type": "heartbeat", "node": f"n{i}", "slots": [{"slot": 0, "alloc": "same"}]}


def nodes_removed_after_reporting(nodes: int) -> Iterator[dict[str, Any]]:
    """Each node reports an allocation of its own, then all are removed."""
    for i in range(nodes):
        yield {"type": "node-registered", "node": f"n{i}", "slots": 2}
        yield {"type": "heartbeat", "node": f"n{i}", "slots": [{"slot": 0, "alloc": f"g{i}"}]}
    for i in range(nodes):
        yield {"type": "node-removed", "node": f"n{i}"}


def audit_lines_run(path: Path, events: Iterator[dict[str, Any]]) -> tuple[int, dict[str, int]]:
    """Lines of the audit module run while auditing ``events``, and the report's counts."""
    url = f"sqlite:///{path}"
    with Ledger.open(url) as ledger:
        for _ in ledger.submit_many(events, batch=500):
            pass
    store = open_store(url, create=False)
    lines = 0

    def local(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal lines
        if event == "line":
            lines += 1
        return local

    def calls(frame: FrameType, event: str, arg: Any) -> Any:
        return local if frame.f_code.co_filename == AUDIT else None

    sys.settrace(calls)
    try:
        report = audit(store).as_dict()
    finally:
        sys.settrace(None)
        store.close()
    return lines, {key: value for key, value in report.items() if key.endswith("_count")}


@pytest.mark.parametrize("history", [one_alloc_reported_everywhere, nodes_removed_after_reporting])
def test_audit_work_grows_linearly_with_the_nodes(tmp_path: Path, history: Any) -> None:
    small, small_counts = audit_lines_run(tmp_path / "small.db", history(SMALL))
    large, large_counts = audit_lines_run(tmp_path / "large.db", history(4 * SMALL))
    # The histories are what they say: every node's report is a zombie.
    assert small_counts["zombie_slots_count"] == SMALL
    assert large_counts["zombie_slots_count"] == 4 * SMALL
    assert large / small < 6, f"{small} lines for {SMALL} nodes, {large} for {4 * SMALL}"
