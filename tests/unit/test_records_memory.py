"""A kept event held in memory (a batch's, while it is written and the next
is decided) takes about its size, not the buffer its JSON was written in."""

from __future__ import annotations

import gc
import tracemalloc

from ledger.records import Record, encode

AT = "2026-01-01T00:00:00.000000Z"


def test_a_kept_event_takes_about_its_size_in_memory() -> None:
    records = [
        Record(position, "heartbeat", {"type": "heartbeat", "node": f"n{position}", "at": AT}, AT, [])
        for position in range(1, 2001)
    ]
    gc.collect()
    tracemalloc.start()
    try:
        kept = [encode(record) for record in records]
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    stored = sum(len(event.state) for event in kept)
    # its bytes, and per event the headers of its bytes and tuple and a
    # list slot (about 110 bytes); orjson's own buffers took 4 KiB an event
    assert held < stored + 200 * len(kept), (held, stored)
