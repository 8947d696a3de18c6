"""SQLite transactions ended after the store closed (``SQLiteStore._connection``):
quiet, but never taken for transactions that ended well."""

from __future__ import annotations

from pathlib import Path

import pytest

from ledger.store import open_store


@pytest.mark.parametrize("transaction", ["writing", "reading"])
def test_a_transaction_a_closed_generator_held_does_not_end_as_if_it_had_ended_well(
    tmp_path: Path, transaction: str
) -> None:
    """A generator (Python API) holding a transaction across a ``yield``,
    closed after the store closed: ``_connection`` swallowed the pool's error and
    with it the ``GeneratorExit``, so the code after the ``with`` runs as if
    the write had committed (it did not), then close() raises "generator
    ignored GeneratorExit". Before (e4fee08): "Pool is closed", nothing run."""
    store = open_store(f"sqlite:///{tmp_path}/l.db")
    with store.writing() as cursor:
        cursor.execute("CREATE TABLE t (x)")
    after: list[str] = []

    def batches():
        with getattr(store, transaction)() as cursor:
            cursor.execute("INSERT INTO t VALUES (1)" if transaction == "writing" else "SELECT 1")
            yield "in the transaction"
        after.append("the transaction taken as ended well (committed)")
        yield "after it"

    held = batches()
    next(held)
    store.close()
    try:
        held.close()
        problem = None
    except RuntimeError as error:
        problem = str(error)

    assert (after, problem) == ([], None)
