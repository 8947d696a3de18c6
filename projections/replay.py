"""Replay: rebuild every projection from the log and prove the tables.

The log is replayed into scratch copies of the projection tables (a unique
``replay_…_`` prefix, in the same database) with the domain's own rules
(``Cluster``, loading entities from the scratch tables as it goes), a chunk
of events per transaction so memory stays bounded and writers are not held
up for long. The scratch tables are then compared row by row, with SQL,
against

* the live tables, at the position they have read up to (read in one
  snapshot with that position), and, where writers decide against tables
  of their own (PostgreSQL's ``state_…``), those at the head of the log; or
* with ``to``, the as-of state (``asof.rebuild``, the in-memory replay that
  answers ``--as-of`` queries), written to a second scratch prefix.

Every difference is named by table, key and column. The live tables are
only ever read (``projections.repair`` replaces them); the scratch tables
are dropped afterwards.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field
from typing import Any

from ledger.collection import fewer_collections
from ledger.domain import Cluster
from ledger.errors import LedgerError, LogEdited
from ledger.pipeline import prompt_switches
from ledger.records import Progress, check_read_whole, replay_log
from ledger.store import SCRATCH, Abandoned, LoggedEvent, Store, scratch_prefix
from projections import tables
from projections.asof import AsOf, head_within, rebuild
from projections.rows import ChangedRows, Statements, changed_rows
from projections.spill import DoneWith, Spill

CHUNK = 50_000  # events replayed per transaction (SQLite writers wait for each)
# ... and about this many bytes of kept events at most: a chunk's changed
# rows are held until it is written, and a rejection's row holds its event
# (400 rejected events of 1 MiB in one chunk took 2.6 GB; a chunk of 50,000
# events as the simulator writes them is about 10 MB).
CHUNK_BYTES = 32 << 20

# The key of each compared relation, in its column order.
KEYS: dict[str, tuple[str, ...]] = {
    "nodes": ("node",),
    "slots": ("node", "slot"),
    "allocations": ("alloc",),
    "alloc_states": ("alloc", "position"),
    "addresses": ("address",),
    "rejections": ("position",),
    "needs_reconnect": ("alloc",),
    "zombie_slots": ("node", "slot"),
}
# Columns that follow the clock, not history: not compared.
CLOCKED = ("expired",)
# A redefined view's expected definition, as a difference names it (the
# statement is in ``projections.tables``).
OWN_DEFINITION = "alloc-ledger's own"
# What writers decide against: everything but the logs kept for reporting.
DECISIONS = ("nodes", "slots", "allocations", "addresses", "needs_reconnect", "zombie_slots")


@dataclass(frozen=True, slots=True)
class Difference:
    """One way the compared tables disagree with the replay."""

    table: str
    key: str
    problem: str  # missing | unexpected | differs
    column: str | None
    expected: Any  # what the replay computed
    found: Any  # what the compared tables hold

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class ReplayReport:
    position: int  # replayed up to here
    head: int  # the log's head when compared
    compared_with: str
    events: int = 0
    seconds: float = 0.0
    differences: list[Difference] = field(default_factory=list)
    repairing: bool = False  # asked to replace the live tables where they differ
    repaired: int | None = None  # the position they were replaced at

    @property
    def ok(self) -> bool:
        return not self.differences

    @property
    def events_per_second(self) -> float:
        return round(self.events / self.seconds, 1) if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "position": self.position,
            "head": self.head,
            "compared_with": self.compared_with,
            "events": self.events,
            "seconds": round(self.seconds, 3),
            "events_per_second": self.events_per_second,
            "differences": [d.as_dict() for d in self.differences],
        } | ({"repaired": self.repaired} if self.repairing else {})


class Scratch:
    """Scratch projection tables replayed from the log, a chunk of events at
    a time: the replayed state stays in memory from chunk to chunk (as an
    as-of replay's does) and everything a chunk changed is written once, at
    its end, in a transaction that reads nothing (which a pipelined
    connection could not answer reliably)."""

    def __init__(self, store: Store, prefix: str) -> None:
        self.store = store
        self.prefix = prefix
        self.sql = Statements(store.param, prefix)
        # Replayed from position 0 into new tables, with every entity kept in
        # memory but what it is done with: removed allocations, moved to a
        # temporary file (``DoneWith``) and loaded from there again when
        # named; names never placed and addresses released, let go. What
        # neither holds, the tables do not either.
        self.spill = Spill()
        self.done_with = DoneWith(self.spill)
        self.cluster = Cluster(self.done_with)
        self.position = 0
        self.seconds = 0.0

    def create(self) -> None:
        # Without the secondary indexes: nothing is looked up in scratch tables
        # (every entity stays in memory, and the comparison reads them whole),
        # and an upsert that keeps no index up to date is a third of the cost.
        with self.store.projecting() as cursor:
            tables.create(cursor, self.store.dialect, self.prefix, indexes=False)

    @fewer_collections()
    def replay_to(self, target: int) -> None:
        """Replay up to ``target``, a chunk at a time: read (a page per read
        transaction) and applied, its rows written in a transaction of their
        own; where the store can (``overlaps``), in a thread while the next
        chunk replays (``ledger.pipeline``). Every entity is kept in memory
        from the first chunk on, so nothing is ever loaded from the scratch
        tables."""
        started = time.perf_counter()
        with (
            prompt_switches(),
            ThreadPoolExecutor(1, thread_name_prefix="alloc-ledger-scratch") as writer,
        ):
            writing: Future[None] | None = None
            try:
                while self.position < target:
                    end = min(target, self.position + CHUNK)
                    progress = Progress(self.position)
                    log = Measured(self.store.read_log(self.position, end), CHUNK_BYTES)
                    replay_log(self.cluster, log, progress)
                    if log.full:  # the chunk ends early, at the bytes it may hold
                        end = progress.position
                    elif progress.position != end:
                        check_read_whole(
                            progress.position, self.store.read_log(progress.position), end)
                    changes = self.cluster.take_changes()
                    self.done_with.forget(self.cluster, changes)
                    changed = changed_rows(changes)
                    if writing is not None:
                        writing.result()
                        writing = None
                    if self.store.overlaps:
                        writing = writer.submit(self._write, changed)
                    else:
                        self._write(changed)
                    self.position = end
                if writing is not None:
                    writing.result()
            finally:
                if writing is not None:
                    writing.cancel()  # if it runs already, the executor waits for it
        self.seconds += time.perf_counter() - started

    def _write(self, changed: ChangedRows) -> None:
        with self.store.projecting() as cursor:
            self.store.write_rows(cursor, self.sql, changed)


class Measured:
    """Kept events of a log, until they come to ``limit`` bytes (then
    ``full``; the one that reached it included)."""

    def __init__(self, log: Iterable[LoggedEvent], limit: int) -> None:
        self.log, self.limit = log, limit
        self.full = False

    def __iter__(self) -> Iterator[LoggedEvent]:
        size = 0
        for stored in self.log:
            yield stored
            size += len(stored.state)
            if size >= self.limit:
                self.full = True
                return


def replay(store: Store, to: int | None = None) -> ReplayReport:
    """Rebuild every projection from the log into scratch tables and compare
    them with the live tables (or, with ``to``, with the as-of state there)."""
    head = head_within(store, to, "--to")
    with scratch_tables(store) as scratch:
        report = _against_as_of(store, scratch, to, head) if to is not None else (
            _against_live(store, scratch)
        )
    report.events, report.seconds = scratch.position, scratch.seconds
    return report


@contextmanager
def scratch_tables(store: Store) -> Iterator[Scratch]:
    """Scratch tables of a prefix of their own, dropped at the end; those a
    replay killed before it dropped them are dropped first."""
    prefix = scratch_prefix()
    with store.claimed(prefix) as abandoned:
        _drop_abandoned(store, abandoned)
        scratch = Scratch(store, prefix)
        try:
            scratch.create()
            yield scratch
        except BaseException:
            # the store gone, why it stopped is what to tell; the next replay
            # drops them, as a killed one's (``Store.claimed``)
            with suppress(LedgerError):
                _drop(store, prefix)
            raise
        finally:
            scratch.spill.close()
        _drop(store, prefix)


def _drop(store: Store, prefix: str) -> None:
    with store.projecting() as cursor:
        tables.drop(cursor, prefix)
        tables.drop(cursor, prefix + "asof_")


def _drop_abandoned(store: Store, abandoned: Abandoned) -> None:
    """Drop the scratch tables no running process claims (``Store.claimed``)."""
    with store.reading() as cursor:
        names = tables.named_like(cursor, store.dialect, "replay_")
    prefixes = sorted({found.group(0) for name in names if (found := SCRATCH.match(name))})
    for prefix in abandoned(prefixes):  # called with none too: it tidies what a claim left
        _drop(store, prefix)


def _against_live(store: Store, scratch: Scratch) -> ReplayReport:
    """Compare with the live tables where they have read up to: one snapshot
    holds both the tables and their position (replay again if they moved on)."""
    while True:
        with store.reading() as cursor:
            live = store.tracked(cursor)
            if live == scratch.position:
                report = ReplayReport(
                    live, store.head(cursor), f"the live tables at position {live}"
                )
                report.differences = compare(
                    cursor, expected=scratch.prefix, found="", dialect=store.dialect)
                break
        scratch.replay_to(ahead(live, scratch, "the live tables' position"))
    if store.state_prefix:
        _against_decisions(store, scratch, report)
    return report


def _against_decisions(store: Store, scratch: Scratch, report: ReplayReport) -> None:
    """Where writers decide against tables of their own (``state_…``), those
    hold the replayed state at the head of the log of the same snapshot."""
    while True:
        with store.reading() as cursor:
            head = store.head(cursor)
            if head == scratch.position:
                report.head = head
                report.compared_with += f" and the decision tables at position {head}"
                report.differences += compare(
                    cursor, expected=scratch.prefix, found=store.state_prefix,
                    relations=DECISIONS, dialect=store.dialect,
                )
                return
        scratch.replay_to(ahead(head, scratch, "the head of the log"))


def ahead(target: int, scratch: Scratch, what: str) -> int:
    if target < scratch.position:
        raise LogEdited(
            f"{what} went back from {scratch.position} to {target} during the replay"
        )
    return target


def _against_as_of(store: Store, scratch: Scratch, to: int, head: int) -> ReplayReport:
    scratch.replay_to(to)
    cluster, _ = rebuild(store, AsOf(position=to))
    as_of = scratch.prefix + "asof_"
    with store.projecting() as cursor:
        tables.create(cursor, store.dialect, as_of)
        store.write_rows(
            cursor, Statements(store.param, as_of), changed_rows(cluster.everything()))
    with store.reading() as cursor:
        report = ReplayReport(to, head, f"the as-of state at position {to}")
        report.differences = compare(cursor, expected=scratch.prefix, found=as_of, label="")
    return report


def compare(
    cursor: Any, expected: str, found: str, relations: tuple[str, ...] = tuple(KEYS),
    label: str | None = None, dialect: str | None = None,
) -> list[Difference]:
    """Every difference between two sets of projection tables, by key; each is
    named by ``label`` (default: ``found``) and the table. Given the
    ``dialect``, a view whose definition is not the one ``expected`` has is
    named too, rows or not: it answers from other rows than this version's
    (redefined by hand), whatever it happens to hold now."""
    differences: list[Difference] = []
    for relation in relations:  # the replay's columns: a DBA's extra one is not compared
        name = (found if label is None else label) + relation
        if relation in tables.VIEWS and any(d.key == "(columns)" for d in differences):
            continue  # reads a table that lost a column: not readable until that is mended
        if dialect is not None and relation in tables.VIEWS:
            wanted = definition(cursor, dialect, expected, relation)
            held = definition(cursor, dialect, found, relation)
            if held != wanted:  # its rows are then no answer of this version's (nor its columns)
                differences.append(Difference(
                    name, "(definition)", "missing" if held is None else "redefined", None,
                    OWN_DEFINITION, None if held is None else " ".join(held.split())))
                continue
        if dialect is not None and relation in tables.TABLES:
            there = tables.index_names(cursor, dialect, found + relation)
            differences += [Difference(name, "(indexes)", "index missing", None, index, None)
                            for index in tables.indexes_of(found, relation) if index not in there]
        columns = [c for c in tables.columns_of(cursor, expected + relation) if c not in CLOCKED]
        if lacking := [c for c in columns if c not in tables.columns_of(cursor, found + relation)]:
            differences += [Difference(name, "(columns)", "column missing", column, None, None)
                            for column in lacking]  # dropped by hand: no row can be compared
            continue
        if dialect == "postgresql" and relation in tables.TABLES:
            kinds = tables.column_types(cursor, expected + relation)
            kept = tables.column_types(cursor, found + relation)
            if retyped := [c for c in columns if kept.get(c) != kinds[c]]:
                differences += [Difference(name, "(columns)", "column type", c, kinds[c],
                                           kept.get(c)) for c in retyped]
                continue
        differences += _compare_relation(
            cursor, relation, KEYS[relation], columns, expected, found, name)
    return differences


def definition(cursor: Any, dialect: str, prefix: str, view: str) -> str | None:
    """The definition of a prefix's view as the database keeps it, the
    prefix taken off the names of the ledger's tables and views it reads
    (so that a scratch copy's compares with the live one's)."""
    if dialect == "sqlite":
        cursor.execute("SELECT sql FROM sqlite_master WHERE type = 'view' AND name = ?",
                       (prefix + view,))
    else:  # as the server prints it back: the same for the same statement
        cursor.execute("SELECT pg_catalog.pg_get_viewdef(pg_catalog.to_regclass(%s))",
                       (prefix + view,))
    row = cursor.fetchone()
    if row is None or row[0] is None:
        return None
    if not prefix:
        return str(row[0])
    named = "|".join((*tables.TABLES, *tables.VIEWS))
    return re.sub(rf"\b{re.escape(prefix)}(?=(?:{named})\b)", "", str(row[0]))


def _compare_relation(
    cursor: Any, relation: str, key: tuple[str, ...], columns: list[str],
    expected: str, found: str, table: str,
) -> list[Difference]:
    listed = ", ".join(columns)
    at = [columns.index(k) for k in key]

    def only_in(left: str, right: str) -> dict[tuple[Any, ...], tuple[Any, ...]]:
        cursor.execute(
            f"SELECT {listed} FROM {left}{relation} EXCEPT SELECT {listed} FROM {right}{relation}"
        )
        return {tuple(row[i] for i in at): tuple(row) for row in cursor.fetchall()}

    wanted, held = only_in(expected, found), only_in(found, expected)
    differences = []
    for ident in sorted(set(wanted) | set(held), key=_sortable):
        name = _key_text(relation, ident)
        mine, theirs = wanted.get(ident), held.get(ident)
        if theirs is None:
            differences.append(
                Difference(table, name, "missing", None, _row(columns, mine), None)
            )
        elif mine is None:
            differences.append(
                Difference(table, name, "unexpected", None, None, _row(columns, theirs))
            )
        else:
            differences += [
                Difference(table, name, "differs", column, a, b)
                for column, a, b in zip(columns, mine, theirs, strict=True)
                if a != b
            ]
    return differences


def _row(columns: list[str], values: tuple[Any, ...] | None) -> dict[str, Any] | None:
    return None if values is None else dict(zip(columns, values, strict=True))


def _sortable(ident: tuple[Any, ...]) -> tuple[tuple[int, Any], ...]:
    """Keys in their natural order, whatever the mix of numbers and text."""
    return tuple((0, v) if isinstance(v, int) else (1, json.dumps(v)) for v in ident)


def _key_text(relation: str, ident: tuple[Any, ...]) -> str:
    if relation in ("slots", "zombie_slots"):
        return f"{ident[0]}#{ident[1]}"
    if relation == "alloc_states":
        return f"{ident[0]}@{ident[1]}"
    return str(ident[0])
