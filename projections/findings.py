"""What an audit found, kept on disk rather than in memory.

An audit of a long history finds millions of things (every rejection, every
reconnect, every zombie slot's episode): 1.5 GB of them held in memory at
10 million events. They are written, as they are found, into a private
temporary SQLite database (in ``SQLITE_TMPDIR``, ``TMPDIR`` or ``/var/tmp``;
SQLite deletes it when it is closed, or when the process ends, however it
ends), and read back a section at a time, in the section's order, as the
report is printed.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from typing import Any

import orjson

from ledger.errors import FindingsNotKept

HELD = 1000  # findings gathered before they are written at once


class Findings:
    """Rows of some sections, each row with the key it is listed by in its
    section (``order``: its start, then a name); rows of equal keys are
    listed in the order they were added."""

    def __init__(self, sections: Sequence[str], max_pages: int | None = None) -> None:
        self.sections = {name: index for index, name in enumerate(sections)}
        self.counts = dict.fromkeys(sections, 0)
        self._held: list[tuple[int, int, str, bytes]] = []
        try:
            # "": a private temporary database, on disk once it outgrows its cache
            self._db = sqlite3.connect("", isolation_level=None)
            self._db.execute("PRAGMA journal_mode = OFF")  # nothing to roll back to
            if max_pages is not None:  # (tests: a disk that fills)
                self._db.execute(f"PRAGMA max_page_count = {int(max_pages)}")
            self._db.execute(
                "CREATE TABLE found (section INTEGER, started INTEGER, name TEXT, row BLOB)")
        except sqlite3.Error as error:
            raise FindingsNotKept(str(error)) from None
        self._ordered = False

    def add(self, section: str, row: dict[str, Any], started: int = 0, name: str = "") -> None:
        self._held.append((self.sections[section], started, name, orjson.dumps(row)))
        self.counts[section] += 1
        if len(self._held) >= HELD:
            self._write()

    def finish(self) -> None:
        """Write what is held, and index the rows in their sections' order."""
        self._write()
        try:
            self._db.execute("CREATE INDEX found_order ON found (section, started, name)")
        except sqlite3.Error as error:
            raise FindingsNotKept(str(error)) from None
        self._ordered = True

    def rows(self, section: str) -> Iterator[dict[str, Any]]:
        """A section's rows in its order, read as they are taken."""
        assert self._ordered, "finish() first"
        try:
            found = self._db.execute(
                "SELECT row FROM found WHERE section = ? ORDER BY started, name, rowid",
                (self.sections[section],))
            for (row,) in found:
                yield orjson.loads(row)
        except sqlite3.Error as error:
            raise FindingsNotKept(str(error)) from None

    def close(self) -> None:
        self._db.close()

    def _write(self) -> None:
        if not self._held:
            return
        try:
            with self._db:  # one transaction
                self._db.execute("BEGIN")
                self._db.executemany("INSERT INTO found VALUES (?, ?, ?, ?)", self._held)
        except sqlite3.Error as error:
            raise FindingsNotKept(str(error)) from None
        self._held = []
