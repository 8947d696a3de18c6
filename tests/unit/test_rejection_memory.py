"""The rejection log is held as the text it is written as: a replay holds
every rejection until it writes them (an as-of answer, all of them), and a
refused slot report of 1 MiB took 8 MB as a dict (400 of them: 3.8 GB)."""

from __future__ import annotations

import gc
import json
import tracemalloc
from dataclasses import astuple
from pathlib import Path

import orjson

from ledger.application import Ledger
from ledger.domain import Changes, Snapshot
from ledger.model import Rejection, rejected_json
from ledger.store import open_store
from projections.asof import rebuild
from projections.rows import changed_rows

AT = "2026-01-01T00:00:00.000000Z"


def refused_report(entries: int) -> dict[str, object]:
    """A heartbeat of a node never registered: refused, kept whole."""
    return {"type": "heartbeat", "node": "gone", "at": AT,
            "slots": [{"slot": n % 4, "alloc": f"a{n}"} for n in range(entries)]}


def test_a_replay_holds_its_rejections_at_about_their_size(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/ledger.db"
    with Ledger.open(url) as ledger:
        receipts = ledger.submit_batch([refused_report(4000) for _ in range(20)])
    assert {receipt.status for receipt in receipts} == {"rejected"}
    store = open_store(url)
    try:
        gc.collect()
        tracemalloc.start()
        try:
            cluster, position = rebuild(store, every=0)
            held = tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
    finally:
        store.close()
    rejections = cluster.everything().rejections
    assert position == 20 and len(rejections) == 20
    text = sum(len(rejected_json(r.event)) for r in rejections)  # what the rejection log writes
    # the text, and what the rest of the cluster holds (little); as dicts
    # the same reports took 8 times their text
    assert held < 2 * text, (held, text)


def test_a_rejection_from_a_checkpoint_of_an_event_is_written_as_one_of_its_text() -> None:
    event = refused_report(3)
    kept_before = Rejection(7, "heartbeat", "gone", "node gone is not in the ledger", event, AT)
    kept_now = Rejection(7, "heartbeat", "gone", "node gone is not in the ledger",
                         json.dumps(event), AT)
    # a checkpoint kept before (``projections.checkpoints``: orjson of the tuples)
    checkpoint = orjson.loads(orjson.dumps(
        {"nodes": [], "slots": [], "allocs": [], "held": [], "alloc_states": [],
         "rejections": [astuple(kept_before)]}))
    restored = Snapshot.restore(checkpoint)
    rows = [dict(changed_rows(Changes(rejections=[r])))["insert_rejection"]
            for r in (kept_before, kept_now, *restored.everything().rejections)]
    assert rows[0] == rows[1] == rows[2]
