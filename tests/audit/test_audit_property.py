"""Any stream of events: the zombie episodes the audit leaves open at the head
are the rows of the ``zombie_slots`` view, which SQL derives from the slot
table on its own (the audit keeps its own index of what each node reports)."""

from __future__ import annotations

import sqlite3
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from model_support import Scenario, scenarios

from ledger.application import Ledger
from projections.audit import audit


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(scenarios(max_steps=60))
def test_the_audits_open_zombies_are_the_zombie_slots_view(scenario: Scenario) -> None:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "l.db"
        with Ledger.open(f"sqlite:///{path}") as ledger:
            for _ in ledger.submit_many([step.submission for step in scenario.steps], batch=7):
                pass
            found = audit(ledger.store).sections["zombie_slots"]
        connection = sqlite3.connect(path)
        try:
            view = connection.execute("SELECT node, slot, alloc, reason FROM zombie_slots")
            expected = sorted(view.fetchall())
        finally:
            connection.close()
    ongoing = sorted((z["node"], z["slot"], z["alloc"], z["reason"]) for z in found if z["ongoing"])
    assert ongoing == expected
