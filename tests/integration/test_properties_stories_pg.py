"""The story streams of ``tests/unit/test_properties_stories.py`` on
PostgreSQL: kills of disconnected and down nodes, cascades through parent
chains several nodes deep and through children already down (which the
PostgreSQL writer loads a level at a time, ``Store.load_nodes``, a path
SQLite never takes), with the ledger opened again after some batches so that
a cascade starts from cold caches. Every receipt and, after every batch,
every projection table agree with the model; ``replay`` finds no difference.
Skipped without ``ALLOC_LEDGER_TEST_PG``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from model_support import Model, Scenario, check_history, label, run_checked_on_postgresql
from story_support import story_scenarios

pytestmark = pytest.mark.postgres
EXAMPLES = int(os.environ.get("ALLOC_LEDGER_PROPERTY_EXAMPLES", "0")) or None


@settings(max_examples=EXAMPLES or 25, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture])
@given(scenario=story_scenarios(max_steps=50), inline=st.booleans())
def test_story_streams_agree_with_the_model_on_postgresql(
    pg_dsn: str, pg_admin: Callable[[str], list[tuple[Any, ...]]],
    scenario: Scenario, inline: bool,
) -> None:
    def finish(ledger: Any, model: Model) -> None:
        check_history(ledger, model, 0)

    model = run_checked_on_postgresql(pg_dsn, pg_admin, scenario, inline, finish)
    label(model)
