"""An event edited in the log is named by the follower that reaches it, as
before the follower loaded each page's names at once: the load skips what
does not read as an event, and the replay names it (PostgreSQL; SQLite has
no follower)."""

from __future__ import annotations

import orjson
import pytest
from audit_support import Attacker, StoreUnderTest, run

from ledger.application import Ledger


def placement_edited(under_test: StoreUnderTest, edit: dict[str, object]) -> Attacker:
    """A placement (position 3) among heartbeats, then its kept event edited
    by an attacker; the follower has applied nothing yet."""
    with Ledger.open(under_test.url) as ledger:
        ledger.submit_batch([
            {"type": "node-registered", "node": "n1", "slots": 2},
            {"type": "heartbeat", "node": "n1"},
            {"type": "alloc-placed", "alloc": "a1", "node": "n1", "slot": 0,
             "addresses": ["10.0.0.1"]},
            {"type": "heartbeat", "node": "n1"},
        ])
    attacker = Attacker(under_test)
    attacker.drop_guards()
    _, state = attacker.event(3)
    kept = orjson.loads(state)
    kept["event"] |= edit
    attacker.sql(f"UPDATE {attacker.events} SET state = ? WHERE originator_version = 3",
                 (orjson.dumps(kept),))
    return attacker


@pytest.mark.parametrize("edit", [
    {"addresses": 5},
    {"addresses": [{"not": "an address"}]},
    {"alloc": ["a", "list"]},
    {"node": None, "alloc": None},
])
def test_a_follower_names_an_event_edited_in_the_log(
    pg_under_test: StoreUnderTest, edit: dict[str, object]
) -> None:
    attacker = placement_edited(pg_under_test, edit)

    done = run("project", url=pg_under_test.url)

    assert done.returncode != 0
    lines = done.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in lines[0], done.stderr
    assert "the kept event at position 3 cannot be read" in lines[0], lines[0]
    assert attacker.sql("SELECT COUNT(*) FROM allocations") == [(0,)]


@pytest.mark.parametrize("addresses", [[1], [1.5], [True]])
def test_a_follower_does_not_project_an_event_edited_to_hold_addresses_not_texts(
    pg_under_test: StoreUnderTest, addresses: list[object]
) -> None:
    """Addresses edited into numbers: a single load of one fails the
    follower, as before the page preload. The preload takes only texts: it
    cast the numbers to text and cached their absence under the number, and
    the follower projected the edited event (exit 0, address '1' held)."""
    attacker = placement_edited(pg_under_test, {"addresses": addresses})

    done = run("project", url=pg_under_test.url)

    assert done.returncode != 0, done.stderr
    assert "Traceback" not in done.stderr.decode()
    assert attacker.sql("SELECT COUNT(*) FROM allocations") == [(0,)]
