"""The property tests of ``tests/unit/test_properties.py`` on PostgreSQL:
for any stream from ``model_support.scenarios``, every receipt and, after
every batch, the projection tables agree with the model of the SPEC's
rules; ``alloc-ledger replay`` finds no difference (the live tables and the
writers' ``state_`` tables); ``verify`` passes; ``--as-of`` a position holds
what the model held there.

Each example gets a fresh schema, and a new ``Ledger`` (cold caches) after
some batches. Writers keep the projection tables inline
(``?projections=inline``) or leave them to ``project`` (the default
``follow``), which then runs after every batch. Skipped without
``ALLOC_LEDGER_TEST_PG`` (failed when ``ALLOC_LEDGER_REQUIRE_PG`` is set).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from model_support import (
    Model,
    Scenario,
    check_as_of,
    check_history,
    label,
    run_checked_on_postgresql,
    scenarios,
)

pytestmark = pytest.mark.postgres


@settings(max_examples=50, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture])
@given(scenario=scenarios(), inline=st.booleans(), moment=st.integers(0, 1000))
def test_every_event_agrees_with_the_model_and_a_replay_on_postgresql(
    pg_dsn: str, pg_admin: Callable[[str], list[tuple[Any, ...]]],
    scenario: Scenario, inline: bool, moment: int,
) -> None:
    def finish(ledger: Any, model: Model) -> None:
        check_history(ledger, model, moment)
        check_as_of(ledger, scenario, moment % (model.head + 1))

    model = run_checked_on_postgresql(pg_dsn, pg_admin, scenario, inline, finish)
    label(model)
