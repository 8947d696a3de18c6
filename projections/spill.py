"""What a replay of the whole log keeps on disk rather than in memory.

An audit, or ``alloc-ledger replay``, replays the whole log, and what it
held grew with history: every allocation ever placed, removed ones included
(a later event may name one again), and an audit's findings (every
rejection, every reconnect, every zombie slot's episode): most of an
audit's 1.9 GB at 10 million events. Both are kept in a private temporary
SQLite database instead (``Spill``: made in ``SQLITE_TMPDIR``, ``TMPDIR`` or
``/var/tmp``; SQLite deletes it when it is closed, or when the process ends,
however it ends):

* ``DoneWith``: allocations that can no longer change (removed), and names
  never placed, moved out of the cluster's memory after each event (an
  audit) or chunk (a replay) and loaded again when an event names them;
* ``Findings``: an audit's, written as they are found, read back a section
  at a time, in the section's order, as the report is printed.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, is_dataclass
from itertools import chain
from typing import Any

import orjson

from ledger.domain import Changes, Cluster, EmptySource
from ledger.errors import SpillFailed
from ledger.model import Allocation
from ledger.records import dumped

HELD = 1000  # findings gathered before they are written at once
# Removed allocations held in memory before they are moved to the file at
# once: about 8 MB of them (50,000 held took 40 MB more, in the simulated
# histories). Until the first move no lookup reads the file, so a replay of
# a history with fewer is as fast as one that holds everything (a lookup
# per allocation placed cost ``alloc-ledger replay`` about 5% at 1M events).
KEEP = 10_000


def packed(value: Any) -> bytes:
    """``dumped`` (a thousand are held at once); a value nested deeper than
    orjson writes (254 levels; the log's reader takes 1024: an edited log's)
    written by ``json``, as the report itself is printed."""
    try:
        return dumped(value)
    except TypeError:
        plain = asdict(value) if is_dataclass(value) and not isinstance(value, type) else value
        return json.dumps(plain, ensure_ascii=False).encode()


@contextmanager
def _kept() -> Iterator[None]:
    try:
        yield
    except sqlite3.Error as error:
        raise SpillFailed(str(error)) from None


# The file's tables, made with it: a ``Findings`` or ``DoneWith`` on it
# then makes nothing that could fail half made.
TABLES = (
    "CREATE TABLE found (section INTEGER, started INTEGER, name TEXT, row BLOB)",
    "CREATE TABLE done_with (alloc TEXT PRIMARY KEY, kept BLOB) WITHOUT ROWID",
)


class Spill:
    """A private temporary SQLite database, with its tables (``max_pages``:
    its size limit, in pages: a disk that fills, for tests)."""

    def __init__(self, max_pages: int | None = None) -> None:
        with _kept():
            # "": a private temporary database, on disk once it outgrows its cache
            self.db = sqlite3.connect("", isolation_level=None)
            try:
                self.db.execute("PRAGMA journal_mode = OFF")  # nothing to roll back to
                if max_pages is not None:
                    self.db.execute(f"PRAGMA max_page_count = {int(max_pages)}")
                for table in TABLES:
                    self.db.execute(table)
            except sqlite3.Error:
                self.db.close()
                raise

    def run(self, sql: str, parameters: Sequence[Any] = ()) -> list[Any]:
        try:  # (run for every allocation placed: no context manager's cost)
            return self.db.execute(sql, parameters).fetchall()
        except sqlite3.Error as error:
            raise SpillFailed(str(error)) from None

    def rows(self, sql: str, parameters: Sequence[Any] = ()) -> Iterator[Any]:
        """The rows of a query, read a page at a time as they are taken. (Not
        ``yield from`` the cursor: a reading left unfinished, its reader gone
        (``| head``), would close the cursor when collected, after the
        database, and Python print what that raised.)"""
        with _kept():
            cursor = self.db.execute(sql, parameters)
        while True:
            with _kept():
                page = cursor.fetchmany(HELD)
            if not page:
                return
            yield from page

    def write(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        """``executemany`` in one transaction."""
        with _kept(), self.db:
            self.db.execute("BEGIN")
            self.db.executemany(sql, rows)

    def close(self) -> None:
        self.db.close()


class Findings:
    """Rows of some sections, each row with the key it is listed by in its
    section (its start, then a name); rows of equal keys are listed in the
    order they were added."""

    def __init__(self, spill: Spill, sections: Sequence[str]) -> None:
        self.spill = spill
        self.sections = {name: index for index, name in enumerate(sections)}
        self.counts = dict.fromkeys(sections, 0)
        self._held: list[tuple[int, int, str, bytes]] = []
        self._ordered = False

    def add(self, section: str, row: dict[str, Any], started: int = 0, name: str = "") -> None:
        self._held.append((self.sections[section], started, name, packed(row)))
        self.counts[section] += 1
        if len(self._held) >= HELD:
            self._write()

    def finish(self) -> None:
        """Write what is held, and index the rows in their sections' order."""
        self._write()
        self.spill.run("CREATE INDEX found_order ON found (section, started, name)")
        self._ordered = True

    def rows(self, section: str) -> Iterator[dict[str, Any]]:
        """A section's rows in its order, read as they are taken."""
        assert self._ordered, "finish() first"
        found = self.spill.rows(
            "SELECT row FROM found WHERE section = ? ORDER BY started, name, rowid",
            (self.sections[section],))
        for (row,) in found:
            yield orjson.loads(row)

    def _write(self) -> None:
        if self._held:
            self.spill.write("INSERT INTO found VALUES (?, ?, ?, ?)", self._held)
            self._held = []


class DoneWith(EmptySource):
    """The cluster's source for an in-memory replay that lets go of what it
    is done with: allocations removed (which no event changes again), names
    looked up but never placed, and addresses released or never held.
    ``forget(cluster, changes)`` after each event (or chunk) lets go of the
    names and addresses at once, and moves removed allocations to the file
    once ``keep`` of them are held (a lookup in the file costs more than
    the memory of a few thousand: until the first move, no name is looked
    up there). A later lookup of one loads it from the file (a removed
    allocation as it was kept; a name never placed, an address not held, as
    none, as an empty source would)."""

    def __init__(self, spill: Spill, keep: int | None = None) -> None:
        self.spill = spill
        self.keep = KEEP if keep is None else keep
        self._removed: list[str] = []  # removed allocations still in memory
        self._moved = False  # some are in the file
        self.looked_up: list[str] = []  # allocations loaded since the last ``forget``
        self.addresses_looked_up: list[str] = []  # addresses loaded since then

    def load_alloc(self, alloc: str) -> Allocation | None:
        self.looked_up.append(alloc)
        if not self._moved:
            return None
        found = self.spill.run("SELECT kept FROM done_with WHERE alloc = ?", (alloc,))
        return Allocation(**orjson.loads(found[0][0])) if found else None

    def load_address(self, address: str) -> None:
        self.addresses_looked_up.append(address)

    def forget(self, cluster: Cluster, changes: Changes) -> None:
        """Let go of what ``cluster`` loaded for the last event that is
        removed or was never placed, and of the addresses it released or
        looked up that none holds; note the allocations it removed, and move
        them to the file once ``keep`` are noted."""
        allocs = cluster.allocs
        self._removed += [alloc.alloc for alloc in changes.allocs if alloc.removed]
        for name in self.looked_up:  # (those loaded from the file: in it already)
            if name in allocs and ((found := allocs[name]) is None or found.removed):
                del allocs[name]
        self.looked_up = []
        addresses = cluster.addresses
        for name in chain(changes.released, self.addresses_looked_up):
            if name in addresses and addresses[name] is None:
                del addresses[name]
        self.addresses_looked_up = []
        if len(self._removed) >= self.keep:
            self.move(cluster)

    def move(self, cluster: Cluster) -> None:
        """Move the removed allocations noted to the file, out of memory."""
        allocs = cluster.allocs
        moved = [(name, packed(allocs.pop(name))) for name in self._removed if name in allocs]
        self.spill.write("INSERT OR REPLACE INTO done_with VALUES (?, ?)", moved)
        self._removed = []
        self._moved = True
