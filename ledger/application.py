"""The ledger application: submit events, get receipts.

One batch is one transaction: the events, their client ids, the projection
rows they change and the projection's tracking position commit together,
so a reported append is durable and nothing is ever half-written.
"""

from __future__ import annotations

import threading
from collections.abc import Generator, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Self

from ledger import events, pipeline, retries
from ledger.batches import batched, input_size
from ledger.chain import GENESIS, link
from ledger.collection import fewer_collections
from ledger.domain import AlreadyPlaced, Cluster, touched_by
from ledger.errors import InvalidEvent, LedgerClosed, LogEdited, LogEndsEarly, RuleViolation
from ledger.model import RULES, Event, Fact, Receipt, answered, timestamp, valid_of
from ledger.records import REJECTED, Record, decode, encode
from ledger.retries import First, first
from ledger.store import LoggedEvent, Store, open_store
from projections.projector import Projector
from projections.rows import ChangedRows, Statements, TableSource, changed_rows

__all__ = ["Ledger", "Receipt"]

Submission = dict[str, Any] | str | bytes
CACHE_LIMIT = 200_000  # entities a writer keeps in memory between batches


@dataclass(frozen=True, slots=True)
class Decided:
    """A batch decided in memory and not written yet: after position ``after``
    (whose chain hash is ``base``), up to ``head``."""

    after: int
    base: str
    head: int
    batch: list[Event]
    receipts: list[Receipt]
    kept: list[LoggedEvent]
    hashes: list[tuple[int, str]]
    new_ids: list[tuple[str, int]]
    changed: ChangedRows  # the rows it changed, as decided (the entities change on)


def now() -> datetime:
    return datetime.now(UTC)


class Ledger:
    """Decides events against the current state and appends them in order."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.sql = Statements(store.param, store.state_prefix)
        self.source = TableSource(self.sql, store)
        self.cluster = Cluster(self.source)
        self.projector = Projector(store)
        self.rules = RULES  # what it decides by, and records (``ledger.model.RULES``)
        # The last position this process decided, with its chain hash.
        self._last: tuple[int, str] | None = None
        self._closed = False
        self._repairs: int | None = None  # the count of repairs last seen
        # The highest position this ledger's own batches were committed at: a
        # log found shorter lost events it reported (``_head``).
        self._reported = 0
        # client ids of the last batch it decided, with their kept events (as
        # kept: a tenth of the memory of the events they were decided from)
        self._recent_ids: dict[str, LoggedEvent] = {}
        self._deciding = threading.RLock()  # a PostgreSQL standby thread may decide too
        # held by a batch's submission and by ``close``: a process's batches
        # go one at a time (on PostgreSQL its hand-over shares one writer
        # connection and its notifications), and a ledger closed by another
        # thread lets the batch in flight end; the next one is told
        self._using = threading.RLock()

    @classmethod
    def open(cls, url: str | None = None, create: bool = True) -> Ledger:
        return cls(open_store(url, create))

    def close(self) -> None:
        """Close the store (once: again does nothing), once a batch another
        thread submits has ended."""
        with self._using:
            if not self._closed:
                self._closed = True
                self.store.close()

    def check_open(self) -> None:
        """Raise ``LedgerClosed`` once ``close`` was called."""
        if self._closed:
            raise LedgerClosed("this ledger was closed: Ledger.open another to submit")

    @contextmanager
    def in_use(self) -> Iterator[None]:
        """While a batch is submitted or written: ``close`` waits for it to end."""
        with self._using:
            self.check_open()
            yield

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: object, error: object, trace: object) -> None:
        if error is None:
            self.close()
            return
        try:
            self.close()
        except KeyboardInterrupt:  # a second Ctrl-C while leaving on the first's account
            pass  # does not replace its words (the store is left to the process's end)

    def submit(self, event: Submission) -> Receipt:
        """Submit one event; the receipt says whether it was appended."""
        return self.submit_batch([event])[0]

    def submit_many(self, stream: Iterable[Submission], batch: int = 1000) -> Iterator[Receipt]:
        """Submit a stream in batches of at most ``batch`` events, each ending
        sooner once its text reaches ``ledger.batches.BATCH_BYTES``; yield each
        receipt once its batch is durable. The stream is read a batch ahead
        (``submit_batches``): for events that arrive one by one, ``submit``."""
        if isinstance(stream, dict | str | bytes | bytearray):  # its keys, its characters
            raise TypeError(
                "submit_many takes an iterable of events (dicts or JSON texts); "
                "submit takes one event")
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ValueError(f"batch must be a whole number of at least 1, not {batch!r}")
        self.check_open()
        return self._submit_many(stream, batch)

    def _submit_many(self, stream: Iterable[Submission], batch: int) -> Iterator[Receipt]:
        for receipts in self.submit_batches(batched(stream, batch, input_size)):
            yield from receipts

    def submit_batches(
        self, batches: Iterable[list[Submission]]
    ) -> Generator[list[Receipt], None, None]:
        """Submit batches in order, each in one transaction; yield each batch's
        receipts once it is durable. Where the store can, the next batch is
        decided while the last one commits (``ledger.pipeline``): so take the
        next batch only from what is already there (a file, a list), never
        from a producer that waits for these receipts."""
        self.check_open()
        if not self.store.overlaps:
            yield from map(self.submit_batch, batches)
            return
        yield from pipeline.overlapped(self, batches)

    @fewer_collections()
    def submit_batch(self, items: list[Submission]) -> list[Receipt]:
        """Validate, decide and append a batch in one transaction."""
        with self.in_use():
            parsed = self.parse_all(items)
            valid = valid_of(parsed)
            return answered(parsed, self.committed(self.store.decide(valid, self)) if valid else [])

    def committed(self, receipts: list[Receipt]) -> list[Receipt]:
        """``receipts`` of a batch now committed: the log never again ends
        before their positions."""
        highest = max((r.position or 0 for r in receipts), default=0)
        self._reported = max(self._reported, highest)
        return receipts

    @classmethod
    def parse_all(cls, items: list[Submission]) -> list[Event | Receipt]:
        """``parse`` each item of a batch."""
        return [cls.parse(item) for item in items]

    @staticmethod
    def parse(item: Submission) -> Event | Receipt:
        """A valid event (``at`` in its one text form), or the receipt of an invalid one."""
        try:
            return events.received(item)
        except InvalidEvent as error:
            return Receipt("invalid", error=str(error))

    def decide(
        self, cursor: Any, batch: list[Event], inline: bool | None = None
    ) -> list[Receipt]:
        """Decide valid events in order and append what is kept, in the caller's
        write transaction (the store calls this: ``Store.decide``); ``inline``:
        whether the projection tables follow in it (by default as the store says)."""
        with self._deciding:
            return self._decide(cursor, batch, inline)

    def decide_ahead(self, cursor: Any, batch: list[Event]) -> Decided | None:
        """Decide a batch after the last one this process decided, which may
        not be committed yet, without writing it (``write_ahead`` does, under
        the log's lock). ``cursor`` reads what is committed: every entity the
        earlier batch changed is held in memory, so what is loaded is what no
        batch in flight changed. None when it cannot be decided ahead (nothing
        decided yet, or the caches are to be trimmed): ``decide`` it once the
        earlier batch is committed. The projections do not follow in a batch
        decided ahead: one that asks for them is decided with ``decide``."""
        with self._deciding:
            if self._last is None or self.cluster.size() > CACHE_LIMIT:
                return None
            return self._decide_in_memory(cursor, batch, self._last[0])

    def write_ahead(self, cursor: Any, decided: Decided) -> list[Receipt]:
        """Write a batch ``decide_ahead`` decided, in the caller's transaction,
        which holds the log's lock; decide it again unless the log ends where
        it was decided after (another writer appended since, or the batch
        before it was decided again or dropped): its receipts are then those
        of the new decision. The position alone would not tell: a batch
        decided again may end at the same position over other events. Either
        way the projections do not follow: the caller locked the log without
        the tracking row."""
        with self._deciding:
            head, repaired = self._head(cursor)
            if (head != decided.after or repaired
                    or not self._kept_hash_is(cursor, head, decided.base)):
                self.forget()  # decided again: still ahead, so not projected inline
                return self._decide(cursor, decided.batch, inline=False)
        # What it writes was decided and is not changed by what is decided
        # meanwhile (the next batch, ahead of this one's commit).
        self._write(cursor, decided, inline=False)
        return decided.receipts

    def forget(self) -> None:
        """Drop the cached state (a transaction failed: what it decided is not kept)."""
        with self._deciding:
            self.cluster.forget()
            self._last = None
            self._recent_ids = {}

    def _decide(self, cursor: Any, batch: list[Event], inline: bool | None = None) -> list[Receipt]:
        head, repaired = self._head(cursor)
        last = self._last
        if (last is None or last[0] != head or repaired
                or not self._kept_hash_is(cursor, head, last[1])):
            self.forget()  # another process wrote since we last did, or ours went otherwise
        decided = self._decide_in_memory(cursor, batch, head)
        self._write(cursor, decided, inline)
        if self.cluster.size() > CACHE_LIMIT:
            self.forget()  # memory stays bounded; entities reload on demand
        return decided.receipts

    def _decide_in_memory(self, cursor: Any, batch: list[Event], head: int) -> Decided:
        """Decide a batch after position ``head`` against the caches, loading
        what they miss through ``cursor``; nothing is written."""
        after = head
        base = self._hash_at(cursor, after)
        self.source.cursor = cursor
        self.store.preload(cursor, self.sql, self.cluster, batch)
        firsts = self._firsts(cursor, [e["id"] for e in batch if "id" in e])
        moment = now()
        recorded_at = timestamp(moment)
        receipts: list[Receipt] = []
        kept = []
        new_ids = []
        recent = {}
        for event in batch:
            ident = event.get("id")
            if ident is not None and ident in firsts:
                receipts.append(retries.answer(event, firsts[ident]))
                continue
            if "at" not in event:  # stamped on a copy: a batch decided again is stamped again
                event = {**event, "at": recorded_at}
            record = self._record(event, head + 1, recorded_at)
            if isinstance(record, Receipt):
                receipts.append(record)
                continue
            head = record.position
            kept.append(encode(record))
            if ident is not None:
                firsts[ident] = (head, event, record.reason)
                recent[ident] = kept[-1]
                new_ids.append((ident, head))
            if record.rejected:
                receipts.append(Receipt("rejected", head, record.reason))
            else:
                receipts.append(Receipt("appended", head))
        hashes = self._chain(base, kept)
        changed = changed_rows(self.cluster.take_changes()) if kept else []
        self._last = hashes[-1] if hashes else (after, base)
        self._recent_ids = recent
        return Decided(after, base, head, batch, receipts, kept, hashes, new_ids, changed)

    def _firsts(self, cursor: Any, ids: list[str]) -> dict[str, First]:
        """What was kept under those of ``ids`` already in the ledger: decided
        in the last batch (maybe not committed yet), or read from the log."""
        if not ids:
            return {}
        known = self.store.known_ids(cursor, ids)
        firsts = {
            i: first(decode(self._recent_ids[i])) for i in self._recent_ids.keys() & set(ids)}
        unread = {position for ident, position in known.items() if ident not in firsts}
        if unread:
            kept = {r.position: r for r in map(decode, self.store.kept_at(cursor, sorted(unread)))}
            for ident, position in known.items():
                if ident not in firsts:
                    if (record := kept.get(position)) is None:
                        raise LogEdited(
                            f"the client-id index names position {position} for id '{ident}', "
                            "which the log lacks; alloc-ledger verify checks whether the log "
                            "was edited")
                    firsts[ident] = first(record)
        return firsts

    def _write(self, cursor: Any, decided: Decided, inline: bool | None) -> None:
        if decided.kept:
            self.store.write_kept(
                cursor, self.sql, decided.kept, decided.hashes, decided.new_ids, decided.changed)
            self._project_inline(cursor, decided.head, inline)

    def _record(self, event: Event, position: int, recorded_at: str) -> Record | Receipt:
        fact = Fact(position, event["at"], self.rules)
        try:
            touches = self.cluster.apply(event, fact)
        except AlreadyPlaced as same:
            return Receipt("duplicate", same.position)
        except RuleViolation as violation:
            self.cluster.reject(event, str(violation), fact)
            related = self._effects(event, self.cluster.related(event))
            return Record(
                position, REJECTED, event, recorded_at, related, str(violation), rules=self.rules)
        effects = []
        for touched in touches:  # nearly always only what the event names: no effects
            if touched != event.get("node") and touched != event.get("alloc"):
                effects = self._effects(event, touches)
                break
        return Record(position, event["type"], event, recorded_at, effects, rules=self.rules)

    @staticmethod
    def _effects(data: dict[str, Any], touches: list[str]) -> list[str]:
        """Entities changed by an event that the event itself does not name."""
        named = set(touched_by(data))
        return sorted({t for t in touches if t not in named})

    @staticmethod
    def _chain(previous: str, kept: list[LoggedEvent]) -> list[tuple[int, str]]:
        hashes = []
        for stored in kept:
            previous = link(previous, stored.originator_version, stored.topic, stored.state)
            hashes.append((stored.originator_version, previous))
        return hashes

    def _hash_at(self, cursor: Any, position: int) -> str:
        """The chain hash of a position: the last one this process decided, or kept."""
        if position == 0:
            return GENESIS
        if self._last is not None and self._last[0] == position:
            return self._last[1]
        found = self.store.hash_at(cursor, position)
        if found is None:
            raise LogEdited(f"the hash chain has no entry for position {position}")
        return found

    def _head(self, cursor: Any) -> tuple[int, bool]:
        """The head, and whether a repair replaced projection tables since
        this last looked (``ledger.store.count_repair``): what the caches
        loaded from them before may be what it repaired."""
        head, count, applied = self.store.head_and_repairs(cursor)
        if applied > head:  # appended below it, an event would never reach the tables
            raise LogEndsEarly(head, applied, "applied")
        if self._reported > head:  # appended again, positions it reported would change hands
            raise LogEndsEarly(head, self._reported, "reported")
        seen, self._repairs = self._repairs, count
        repaired = seen is not None and seen != count
        if repaired:
            self.forget()  # here, so that no caller can see the count change and keep them
        return head, repaired

    def _kept_hash_is(self, cursor: Any, position: int, chain_hash: str) -> bool:
        """Whether the hash kept for ``position`` (the head just read) is
        ``chain_hash``: the hash covers every event up to it."""
        kept = GENESIS if position == 0 else self.store.hash_at(cursor, position)
        return kept == chain_hash

    def _project_inline(self, cursor: Any, head: int, inline: bool | None) -> None:
        """The projection tables follow in the same transaction: on SQLite they
        are the very tables decisions read; elsewhere when asked for."""
        if self.store.state_prefix == "":
            self.store.track(cursor, head)
        elif self.store.projects_inline if inline is None else inline:
            self.projector.catch_up(cursor, head)

    def lag(self) -> int:
        """How many positions the projection tables are behind the log."""
        self.check_open()
        with self.store.reading() as cursor:
            return self.store.head(cursor) - self.store.tracked(cursor)

    def project(self, limit: int | None = None) -> tuple[int, int]:
        """Bring the projection tables up to date; return (from, to) positions."""
        self.check_open()
        start, end = self.projector.update(limit)
        self.forget()
        return start, end
