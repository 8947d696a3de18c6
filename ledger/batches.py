"""A stream of submissions cut into batches, one transaction each.

A batch ends at its most events, or once the input it holds reaches
``BATCH_BYTES``, whichever comes first. A count alone let memory grow with
the lines' length: a batch is held several times over while it is decided
and written (the events its lines hold, their kept JSON, the JSON the
statements carry), and a 1 MiB line of small slot reports takes some 15 MB
by then: 400 such lines in one batch took 6.3 GB. Ended at 16 MiB of input,
a stream of them peaks at about 620 MB (a batch commits while the next is
decided), and batches of ordinary events (a few hundred bytes each) end at
their count as before (``docs/performance.md``, "Memory of a batch").
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

BATCH_BYTES = 16 << 20  # the input a batch ends at, in bytes (or characters of text)

Item = TypeVar("Item")


def batched(
    items: Iterable[Item], most: int, size: Callable[[Item], int],
    budget: int | None = None,
) -> Iterator[list[Item]]:
    """``items`` in lists of at most ``most``, each ending once the ``size``
    of its items reaches ``budget`` (``BATCH_BYTES`` unless given). A batch
    is handed on as soon as it is full: nothing after it is read first."""
    budget = BATCH_BYTES if budget is None else budget
    batch: list[Item] = []
    held = 0
    for item in items:
        batch.append(item)
        held += size(item)
        if len(batch) >= most or held >= budget:
            yield batch
            batch, held = [], 0
    if batch:
        yield batch


def input_size(item: object) -> int:
    """How much input a submission holds: a line's length; a dict is the
    caller's already, and counts for nothing."""
    return len(item) if isinstance(item, (str, bytes)) else 0
