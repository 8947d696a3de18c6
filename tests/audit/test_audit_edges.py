"""The audit report at its edges: durations to the millisecond, a range from its first position."""

from __future__ import annotations

from ledger.application import Ledger
from ledger.store import open_store
from projections.audit import audit


def test_a_reconnect_lasts_to_the_millisecond(tmp_path) -> None:
    """docs/audit.md: how long each allocation was unknown, from the `at` of
    the disconnect to the `at` of the reconnect: 60.25 s, not 60."""
    url = f"sqlite:///{tmp_path}/l.db"
    events = [
        {"type": "node-registered", "node": "n1", "slots": 1, "at": "2026-01-01T11:59:00Z"},
        {"type": "heartbeat", "node": "n1", "at": "2026-01-01T11:59:00Z"},
        {"type": "alloc-placed", "alloc": "a1", "node": "n1", "slot": 0, "max_disconnect": 300,
         "at": "2026-01-01T11:59:00Z"},
        {"type": "alloc-updated", "alloc": "a1", "client_status": "running",
         "at": "2026-01-01T11:59:00Z"},
        {"type": "heartbeat-missed", "node": "n1", "at": "2026-01-01T12:00:00Z"},
        {"type": "heartbeat", "node": "n1", "at": "2026-01-01T12:01:00Z"},
        {"type": "alloc-updated", "alloc": "a1", "client_status": "running",
         "at": "2026-01-01T12:01:00.250Z"},
    ]
    with Ledger.open(url) as ledger:
        for event in events:
            assert ledger.submit(event).status == "appended", event
    store = open_store(url, create=False)
    try:
        report = audit(store).as_dict()
    finally:
        store.close()
    assert [(r["alloc"], r["outcome"], r["seconds"], r["past_deadline"])
            for r in report["reconnects"]] == [("a1", "running", 60.25, False)]


def test_a_range_starting_at_a_rejection_or_a_down_keeps_it(tmp_path) -> None:
    """docs/audit.md: `--from P` reports what happened from P on, P included."""
    url = f"sqlite:///{tmp_path}/l.db"
    with Ledger.open(url) as ledger:
        assert ledger.submit({"type": "node-registered", "node": "n1"}).status == "appended"
        refused = ledger.submit({"type": "node-registered", "node": "n1"})
        assert refused.status == "rejected"
        down = ledger.submit({"type": "node-down", "node": "n1", "reason": "gone"})
        assert down.status == "appended"
    store = open_store(url, create=False)
    try:
        from_rejection = audit(store, start=refused.position).as_dict()
        from_down = audit(store, start=down.position).as_dict()
    finally:
        store.close()
    assert [r["position"] for r in from_rejection["rejections"]] == [refused.position]
    assert [r["position"] for r in from_down["downs"]] == [down.position]
