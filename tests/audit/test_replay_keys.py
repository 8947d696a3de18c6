"""How replay names a differing row of each kind of key."""

from __future__ import annotations

import sqlite3

from ledger.application import Ledger
from projections.replay import replay


def test_a_differing_slot_is_named_node_hash_slot(tmp_path) -> None:
    """docs/audit.md: every difference named by table, key and column; a slot's key is n1#1."""
    url = f"sqlite:///{tmp_path}/l.db"
    with Ledger.open(url) as ledger:
        for event in ({"type": "node-registered", "node": "n1", "slots": 2},
                      {"type": "heartbeat", "node": "n1"}):
            assert ledger.submit(event).status == "appended"
    with sqlite3.connect(tmp_path / "l.db") as connection:
        connection.execute("UPDATE slots SET state = 'forged' WHERE node = 'n1' AND slot = 1")
    with Ledger.open(url) as ledger:
        report = replay(ledger.store)
    assert [(d.table, d.key, d.problem, d.column) for d in report.differences] == [
        ("slots", "n1#1", "differs", "state")]
