"""The private parts of the libraries the ledger leans on, as it calls them
(helper-304): a release that renames one fails here, by name, instead of
silently losing what it was for (pyproject bounds the versions too).

- ``psycopg.Cursor._fetch_pipeline``, replaced by ``SyncingCursor`` so a
  pipeline's reads end with a Sync and a stopped writer's transaction is
  ended by ``idle_in_transaction_session_timeout`` (``ledger/postgres_pipeline.py``);
  it reads the cursor's ``_conn._pipeline`` and ``_execmany_returning``.
- eventsourcing's ``_max_tracking_id`` and ``_insert_tracking``, through which
  both stores read and write the projections' tracking row inside their own
  transactions.
"""

from __future__ import annotations

import inspect

import psycopg
import pytest
from eventsourcing.postgres import PostgresProcessRecorder
from eventsourcing.sqlite import SQLiteProcessRecorder

from ledger.postgres_store import SyncingCursor


def test_psycopg_still_fetches_a_pipelines_results_through_the_step_replaced() -> None:
    assert list(inspect.signature(psycopg.Cursor._fetch_pipeline).parameters) == ["self"]
    assert SyncingCursor._fetch_pipeline is not psycopg.Cursor._fetch_pipeline
    fetching = inspect.getsource(psycopg.cursor)  # its fetch methods
    assert fetching.count("self._fetch_pipeline()") >= 3  # fetchone, fetchmany, fetchall
    assert "_execmany_returning" in inspect.getsource(psycopg._cursor_base)
    assert "self._pipeline" in inspect.getsource(psycopg._connection_base)


@pytest.mark.parametrize("recorder", [SQLiteProcessRecorder, PostgresProcessRecorder])
def test_the_recorders_still_read_and_write_tracking_as_called(recorder: type) -> None:
    assert list(inspect.signature(recorder._max_tracking_id).parameters)[:2] == [
        "self", "application_name"]
    assert len(inspect.signature(recorder._max_tracking_id).parameters) == 3
    assert len(inspect.signature(recorder._insert_tracking).parameters) == 3
