"""A stream of batches: decide the next batch while the last one commits.

On SQLite, writing and committing a batch takes about as long as deciding
it (validation, rules, encoding, hashing). ``sqlite_writes`` steps each
table's rows in one statement, which runs without the GIL, so a writer
thread can write and commit batch k while this thread decides batch k+1
against the caches (``Ledger.decide_ahead``), which hold everything k
changed; what is loaded from the tables, no batch in flight changed. The
writer then appends k+1 after k, or decides it again unless the log ends,
by position and chain hash, where k+1 was decided after: another process
appended, or k was itself decided again (``Ledger.write_ahead``). A batch
the writer decides itself (the first, or one after the caches were trimmed)
is decided before the next one is decided ahead.

At most one batch is in flight, and its receipts are yielded only once it is
committed, so a reported append is durable, as without the pipeline. If a
batch fails, the batch decided ahead of it is forgotten, never written, and
the error ends the stream.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from ledger.collection import ProcessSetting, fewer_collections
from ledger.model import Event, Receipt, answered, valid_of

if TYPE_CHECKING:
    from ledger.application import Decided, Ledger

# The writer thread takes the GIL back after each statement; with CPython's
# default 5 ms switch interval it would wait that long each time, behind the
# deciding thread. Measured on a 1,000,000-event submit (2 cores): 0.5 ms
# gave 45,000 events/s, 0.1 ms 50,900, 0.05 ms 50,200-51,300 (and the best
# at 300,000 events), 2 ms 40,400.
SWITCH_INTERVAL = 0.00005


# Hand the GIL between threads more often while a stream is written.
prompt_switches = ProcessSetting(
    sys.getswitchinterval, sys.setswitchinterval, lambda before: min(before, SWITCH_INTERVAL)).held


class InFlight:
    """A batch handed to the writer thread: its parsed items, the future of
    its receipts (for the valid ones) and whether it has been decided."""

    def __init__(self, parsed: list[Event | Receipt]) -> None:
        self.parsed = parsed
        self.receipts: Future[list[Receipt]] | None = None
        self.decided = threading.Event()  # what is decided next builds on it

    def result(self) -> list[Receipt]:
        """Every item's receipt, once the batch is committed (raise if it failed)."""
        return answered(self.parsed, self.receipts.result() if self.receipts is not None else [])

    def outcome(self) -> list[Receipt] | None:
        """``result()``, or None if the batch failed."""
        try:
            return self.result()
        except Exception:  # noqa: BLE001 - the caller raises its own error
            return None


def overlapped(ledger: Ledger, batches: Iterable[list[Any]]) -> Iterator[list[Receipt]]:
    """Each batch's receipts, in order, each once its batch is committed;
    every batch but the first is decided while the one before it commits.
    If this thread fails (the input, a read, an interrupt) while a batch is in
    flight, that batch's receipts still come once it is committed, then the
    error."""
    finished = False
    try:
        with (
            fewer_collections(),
            prompt_switches(),
            ThreadPoolExecutor(1, thread_name_prefix="alloc-ledger-writer") as writer,
        ):
            flying: InFlight | None = None
            reporting: InFlight | None = None  # handed to the writer, its receipts not yielded
            try:
                # Through ``map``, no name holds a batch's lines once they are parsed.
                for parsed in map(ledger.parse_all, batches):
                    valid = valid_of(parsed)
                    ahead = None
                    if valid and flying is not None:
                        flying.decided.wait()
                        ledger.check_open()  # closed by another thread meanwhile
                        with ledger.store.reading() as cursor:
                            ahead = ledger.decide_ahead(cursor, valid)
                    if flying is not None:
                        reporting, flying = flying, None
                        receipts = reporting.result()  # Ctrl-C may come while it commits
                        reporting = None
                        yield receipts
                    flying = InFlight(parsed)
                    if ahead is not None or not valid:
                        flying.decided.set()  # else the writer thread decides it, then sets it
                    if valid:
                        flying.receipts = writer.submit(_write, ledger, valid, ahead, flying)
                if flying is not None:
                    reported, flying = flying, None
                    yield reported.result()
                finished = True
            except BaseException as error:
                # At a ``yield`` nothing is in flight (a reader stopping is not
                # this): the error is this thread's, or the batch in flight's.
                # What is committed is reported, in order, before it.
                for batch in (reporting, flying):
                    if batch is not None and (done := batch.outcome()) is not None:
                        reporting = flying = None
                        yield done
                if isinstance(error, Exception):  # its store closed under a read ahead
                    ledger.check_open()
                raise
    finally:
        if not finished:
            ledger.forget()  # what was decided ahead of a failure, or of an unread stream


def _write(
    ledger: Ledger, batch: list[Event], ahead: Decided | None, flying: InFlight
) -> list[Receipt]:
    """In the writer thread: write a batch decided ahead (or decide it now)
    and commit."""
    store = ledger.store
    try:
        with ledger.in_use():
            with store.writing() as cursor:
                if ahead is None:
                    try:
                        receipts = ledger.decide(cursor, batch)
                    finally:
                        flying.decided.set()
                else:
                    receipts = ledger.write_ahead(cursor, ahead)
            return ledger.committed(receipts)
    except BaseException:
        ledger.forget()
        raise
    finally:  # also when its transaction never began: the stream goes on to the error
        flying.decided.set()
