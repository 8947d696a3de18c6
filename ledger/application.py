"""The ledger application: submit events, get receipts.

One batch is one transaction: the events, their client ids, the projection
rows they change and the projection's tracking position commit together,
so a reported append is durable and nothing is ever half-written.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from typing import Any, Self

from eventsourcing.persistence import StoredEvent

from ledger import events
from ledger.chain import GENESIS, link
from ledger.collection import fewer_collections
from ledger.domain import AlreadyPlaced, Cluster, touched_by
from ledger.errors import InvalidEvent, LedgerError, RuleViolation
from ledger.model import Event, Fact, Receipt, timestamp
from ledger.records import REJECTED, Record, encode
from ledger.store import Store, open_store
from projections.projector import Projector
from projections.rows import Statements, TableSource

__all__ = ["Ledger", "Receipt"]

Submission = dict[str, Any] | str | bytes
CACHE_LIMIT = 200_000  # entities a writer keeps in memory between batches


def now() -> datetime:
    return datetime.now(UTC)


class Ledger:
    """Decides events against the current state and appends them in order."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.sql = Statements(store.param, store.state_prefix)
        self.source = TableSource(self.sql)
        self.cluster = Cluster(self.source)
        self.projector = Projector(store)
        self._head: int | None = None
        self._deciding = threading.RLock()  # a PostgreSQL standby thread may decide too

    @classmethod
    def open(cls, url: str | None = None) -> Ledger:
        return cls(open_store(url))

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def submit(self, event: Submission) -> Receipt:
        """Submit one event; the receipt says whether it was appended."""
        return self.submit_batch([event])[0]

    def submit_many(self, stream: Iterable[Submission], batch: int = 1000) -> Iterator[Receipt]:
        """Submit a stream in batches; yield each receipt once its batch is durable."""
        pending: list[Submission] = []
        for item in stream:
            pending.append(item)
            if len(pending) >= batch:
                yield from self.submit_batch(pending)
                pending = []
        if pending:
            yield from self.submit_batch(pending)

    @fewer_collections()
    def submit_batch(self, items: list[Submission]) -> list[Receipt]:
        """Validate, decide and append a batch in one transaction."""
        parsed: list[Event | Receipt] = [self._parse(i) for i in items]
        valid = [p for p in parsed if not isinstance(p, Receipt)]
        if not valid:
            return [p for p in parsed if isinstance(p, Receipt)]
        answers = iter(self.store.decide(valid, self))
        return [p if isinstance(p, Receipt) else next(answers) for p in parsed]

    @staticmethod
    def _parse(item: Submission) -> Event | Receipt:
        try:
            event = events.received(item)
        except InvalidEvent as error:
            return Receipt("invalid", error=str(error))
        if "at" in event:
            event["at"] = timestamp(event["at"])  # one text form from here on
        return event

    def decide(self, cursor: Any, batch: list[Event]) -> list[Receipt]:
        """Decide valid events in order and append what is kept, in the caller's
        write transaction (the store calls this: ``Store.decide``)."""
        with self._deciding:
            return self._decide(cursor, batch)

    def forget(self) -> None:
        """Drop the cached state (a transaction failed: what it decided is not kept)."""
        with self._deciding:
            self.cluster.forget()
            self._head = None

    def _decide(self, cursor: Any, batch: list[Event]) -> list[Receipt]:
        head = self.store.head(cursor)
        self.source.cursor = cursor
        if head != self._head:
            self.cluster.forget()  # another process wrote since we last did
        self.store.preload(cursor, self.sql, self.cluster, batch)
        known = self.store.known_ids(cursor, [e["id"] for e in batch if "id" in e])
        moment = now()
        recorded_at = timestamp(moment)
        receipts: list[Receipt] = []
        kept = []
        new_ids = []
        for event in batch:
            ident = event.get("id")
            if ident is not None and ident in known:
                receipts.append(Receipt("duplicate", known[ident]))
                continue
            if "at" not in event:
                event["at"] = recorded_at
            record = self._record(event, head + 1, recorded_at)
            if isinstance(record, Receipt):
                receipts.append(record)
                continue
            head = record.position
            kept.append(encode(record))
            if ident is not None:
                known[ident] = head
                new_ids.append((ident, head))
            if record.rejected:
                receipts.append(Receipt("rejected", head, record.reason))
            else:
                receipts.append(Receipt("appended", head))
        if kept:
            self.store.append(cursor, kept, self._chain(cursor, kept))
            self.store.remember_ids(cursor, new_ids)
            changes = self.cluster.take_changes()
            self.store.write_changes(cursor, self.sql, changes, decisions_only=True)
            self._project_inline(cursor, head)
        self._head = head
        if self.cluster.size() > CACHE_LIMIT:
            self.cluster.forget()  # memory stays bounded; entities reload on demand
        return receipts

    def _record(self, event: Event, position: int, recorded_at: str) -> Record | Receipt:
        fact = Fact(position, event["at"])
        try:
            touches = self.cluster.apply(event, fact)
        except AlreadyPlaced as same:
            return Receipt("duplicate", same.position)
        except RuleViolation as violation:
            self.cluster.reject(event, str(violation), fact)
            related = self._effects(event, self.cluster.related(event))
            return Record(position, REJECTED, event, recorded_at, related, str(violation))
        own = (event.get("node"), event.get("alloc"))
        effects = [] if all(t in own for t in touches) else self._effects(event, touches)
        return Record(position, event["type"], event, recorded_at, effects)

    @staticmethod
    def _effects(data: dict[str, Any], touches: list[str]) -> list[str]:
        """Entities changed by an event that the event itself does not name."""
        named = set(touched_by(data))
        return sorted({t for t in touches if t not in named})

    def _chain(self, cursor: Any, kept: list[StoredEvent]) -> list[tuple[int, str]]:
        first = kept[0].originator_version
        previous = GENESIS if first == 1 else self.store.hash_at(cursor, first - 1)
        if previous is None:
            raise LedgerError(f"the hash chain has no entry for position {first - 1}")
        hashes = []
        for stored in kept:
            previous = link(previous, stored.originator_version, stored.topic, stored.state)
            hashes.append((stored.originator_version, previous))
        return hashes

    def _project_inline(self, cursor: Any, head: int) -> None:
        """The projection tables follow in the same transaction: on SQLite they
        are the very tables decisions read; elsewhere when asked for."""
        if self.store.state_prefix == "":
            self.store.track(cursor, head)
        elif self.store.projects_inline:
            self.projector.catch_up(cursor, head)

    def lag(self) -> int:
        """How many positions the projection tables are behind the log."""
        with self.store.reading() as cursor:
            return self.store.head(cursor) - self.store.tracked(cursor)

    def project(self, limit: int | None = None) -> tuple[int, int]:
        """Bring the projection tables up to date; return (from, to) positions."""
        start, end = self.projector.update(limit)
        self.forget()
        return start, end
