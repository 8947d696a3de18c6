"""A stream of batches: decide the next batch while the last one commits.

On SQLite, writing and committing a batch takes about as long as deciding
it (validation, rules, encoding, hashing). ``sqlite_writes`` steps each
table's rows in one statement, which runs without the GIL, so a writer
thread can write and commit batch k while this thread decides batch k+1
against the caches (``Ledger.decide_ahead``), which hold everything k
changed; what is loaded from the tables, no batch in flight changed. The
writer then appends k+1 after k, or decides it again if another process
appended in between (``Ledger.write_ahead``).

At most one batch is in flight, and its receipts are yielded only once it is
committed, so a reported append is durable, as without the pipeline. If a
batch fails, the batch decided ahead of it is forgotten, never written, and
the error ends the stream.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ledger.collection import fewer_collections
from ledger.model import Event, Receipt

if TYPE_CHECKING:
    from ledger.application import Decided, Ledger

# The writer thread takes the GIL back after each statement; with CPython's
# default 5 ms switch interval it would wait that long each time, behind the
# deciding thread.
SWITCH_INTERVAL = 0.0005


@contextmanager
def prompt_switches() -> Iterator[None]:
    """Hand the GIL between threads more often until the block ends."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(min(before, SWITCH_INTERVAL))
    try:
        yield
    finally:
        sys.setswitchinterval(before)


class InFlight:
    """A batch handed to the writer thread: its parsed items and the future
    of its receipts (for the valid ones)."""

    def __init__(self, parsed: list[Event | Receipt], receipts: Future[list[Receipt]] | None) -> None:
        self.parsed = parsed
        self.receipts = receipts

    def result(self) -> list[Receipt]:
        """Every item's receipt, once the batch is committed (raise if it failed)."""
        answers = iter(self.receipts.result() if self.receipts is not None else ())
        return [p if isinstance(p, Receipt) else next(answers) for p in self.parsed]


def overlapped(ledger: Ledger, batches: Iterable[list[Any]]) -> Iterator[list[Receipt]]:
    """Each batch's receipts, in order, each once its batch is committed;
    every batch but the first is decided while the one before it commits."""
    finished = False
    try:
        with (
            fewer_collections(),
            prompt_switches(),
            ThreadPoolExecutor(1, thread_name_prefix="alloc-ledger-writer") as writer,
        ):
            flying: InFlight | None = None
            try:
                for items in batches:
                    parsed = [ledger.parse(item) for item in items]
                    valid = [p for p in parsed if not isinstance(p, Receipt)]
                    ahead = None
                    if valid and flying is not None:
                        with ledger.store.reading() as cursor:
                            ahead = ledger.decide_ahead(cursor, valid)
                    if flying is not None:
                        yield flying.result()
                    flying = InFlight(
                        parsed, writer.submit(_write, ledger, valid, ahead) if valid else None)
                if flying is not None:
                    yield flying.result()
                    flying = None
                finished = True
            finally:
                if flying is not None and flying.receipts is not None:
                    flying.receipts.cancel()  # if it runs already, the executor waits for it
    finally:
        if not finished:
            ledger.forget()  # what was decided ahead of a failure, or of an unread stream


def _write(ledger: Ledger, batch: list[Event], ahead: Decided | None) -> list[Receipt]:
    """In the writer thread: write a batch decided ahead (or decide it now)
    and commit."""
    store = ledger.store
    try:
        with store.writing() as cursor:
            if ahead is None:
                return ledger.decide(cursor, batch)
            return ledger.write_ahead(cursor, ahead)
    except BaseException:
        ledger.forget()
        raise
