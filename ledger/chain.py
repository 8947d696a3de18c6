"""The tamper-evident hash chain over the log.

Each event's hash covers the previous hash, its position, its topic and its
stored bytes, so editing, deleting, inserting or swapping any kept event
changes every hash from there on (as in QLDB journal digests or immudb).

``verify`` recomputes the chain from the log and compares it with the hashes
kept beside it (``event_hashes``), naming the first position that does not
match. The kept hashes only prove the log against careless or partial
tampering: anyone who can write the file can also recompute them. A
``Digest`` (head position and hash) saved elsewhere closes that gap:
``verify(store, digest)`` proves the current log still extends it, and
``verify(store, since=digest)`` checks only what was appended after it (the
log's kept hash at its position must be its hash): a day's events, not the
whole log again.
``verify`` also says whether the triggers that keep the log append-only are
in place: missing ones prove no edit, but nothing stops one.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from hashlib import sha256
from typing import Any

import orjson

from ledger.errors import BadOption, LogEdited, NotADigest, PositionMissing
from ledger.store import Guards, Store

GENESIS = "0" * 64
PAGE = 5000
_DIGEST = re.compile(r"^([0-9]+):([0-9a-f]{64})$")  # [0-9], not \d: no other scripts' digits


def link(previous: str, position: int, topic: str, state: bytes) -> str:
    digest = sha256(previous.encode())
    digest.update(b"\n%d\n" % position)
    digest.update(topic.encode())
    digest.update(b"\n")
    digest.update(state)
    return digest.hexdigest()


@dataclass(frozen=True, slots=True)
class Digest:
    """A head of the chain, kept elsewhere: ``POSITION:HASH``."""

    position: int
    hash: str

    @classmethod
    def parse(cls, text: str) -> Digest:
        found = _DIGEST.match(text.strip().lower())
        if found is None:
            raise NotADigest(
                f"{text!r} is not a digest: expected POSITION:HASH "
                "(a position and 64 hex digits, as printed by `alloc-ledger digest`)"
            )
        return cls(int(found.group(1)), found.group(2))

    def __str__(self) -> str:
        return f"{self.position}:{self.hash}"


IN_PLACE = Guards((), "")


@dataclass(frozen=True, slots=True)
class Verification:
    """What recomputing the chain found."""

    head: int  # the log's head
    verified: int  # up to here every hash and id matches (``head`` when all do)
    hash: str  # the recomputed hash at ``verified``
    seconds: float
    position: int | None = None  # the first position that does not match
    problem: str | None = None
    digest: Digest | None = None
    # the append-only guards not as made (none: in place): nothing proves an
    # edit, but nothing stops one either
    guards: Guards = IN_PLACE
    since: Digest | None = None  # checked only after it (``verified`` counts from 0 all the same)

    @property
    def ok(self) -> bool:
        return self.problem is None

    @property
    def events_per_second(self) -> float:
        """Of the events this check read: those after ``since``, if given."""
        start = 0 if self.since is None else min(self.since.position, self.verified)
        return round((self.verified - start) / self.seconds, 1) if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "head": self.head,
            "verified": self.verified,
            "hash": self.hash,
            "seconds": round(self.seconds, 3),
            "events_per_second": self.events_per_second,
            "digest": None if self.digest is None else str(self.digest),
            "since": None if self.since is None else str(self.since),
            "position": self.position,
            "problem": self.problem,
            "guards_lacking": list(self.guards.lacking),  # [] when every one is in place
        }


@dataclass(frozen=True, slots=True)
class Break:
    position: int | None  # None: no one position is to blame
    problem: str


class IdsCheck:
    """The client-id index (``event_ids``) against the log: the id of each
    kept event maps to its position, and the index holds nothing more. An id
    missing from it would let a retry append the event again."""

    def __init__(self, store: Store, cursor: Any, after: int = 0) -> None:
        self.store = store
        self.cursor = cursor
        self.after = after  # the ids of positions up to here are not checked
        self.pending: list[tuple[int, str]] = []
        self.seen = 0

    def see(self, position: int, state: bytes) -> None:
        """Note the id of a kept event, to be checked by the next ``flush``."""
        if b'"id":' not in state:  # how the kept JSON writes the key, if the event has one
            return
        client = _client_id(state)
        if isinstance(client, str):
            self.pending.append((position, client))

    def flush(self) -> Break | None:
        if not self.pending:
            return None
        kept = self.store.known_ids(self.cursor, [client for _, client in self.pending])
        for position, client in self.pending:
            found = kept.get(client)
            if found != position:
                where = "does not hold it" if found is None else f"holds it for position {found}"
                return Break(
                    position,
                    f"the event at position {position} has id {client!r}, but event_ids "
                    f"{where} (a retry with that id would not be answered duplicate of it)",
                )
        self.seen += len(self.pending)
        self.pending.clear()
        return None

    def extra(self) -> Break | None:
        """Once every kept id was seen: the index holds no others."""
        if self.after:  # (SQLite: a position kept as text is greater than any number)
            self.cursor.execute(  # below 1: no event's position, before the digest or not
                f"SELECT COUNT(*) FROM event_ids WHERE position > {self.store.param} "
                "OR position < 1", (self.after,))
        else:
            self.cursor.execute("SELECT COUNT(*) FROM event_ids")
        extra = int(self.cursor.fetchone()[0]) - self.seen
        if extra > 0:
            return Break(None, f"event_ids holds {extra} id(s) that no kept event has{self._one()}")
        return None

    def _one(self) -> str:
        """The first of those ids, by position, to name (read only once the
        index is known to hold some)."""
        for page in pages(self.store, self.cursor, "event_ids", "position, id", key=2):
            kept = {  # positions as kept: SQLite takes text, which no kept event has
                stored.originator_version: _client_id(stored.state)
                for stored in self.store.kept_at(
                    self.cursor, sorted({row[0] for row in page if type(row[0]) is int}))
            }
            for position, client in page:
                if type(position) is int and 0 < position <= self.after:
                    continue  # before the digest: not counted, so not named
                if kept.get(position) != client:
                    return f" ({client!r} for position {position}, first)"
        return ""


def _client_id(state: bytes) -> object:
    """The ``id`` of a kept event; None if it has none or cannot be read (its
    bytes are what the chain vouches for; replay names it unreadable)."""
    try:
        return orjson.loads(state)["event"].get("id")
    except (ValueError, LookupError, TypeError, AttributeError):
        return None


class ChainCheck:
    """Walks kept events and kept hashes side by side, both in position order."""

    def __init__(
        self, digest: Digest | None = None, ids: IdsCheck | None = None,
        since: Digest | None = None,
    ) -> None:
        self.digest = digest
        self.ids = ids
        # where the walk starts: the genesis, or a digest whose hash the log keeps
        self.previous = GENESIS if since is None else since.hash
        self.checked = 0 if since is None else since.position
        # the hashes of the positions whose ids are not checked yet, and of the one before
        self.unchecked: dict[int, str] = {self.checked: self.previous}

    def run(
        self, events: Iterable[tuple[int, str | None, bytes]],
        hashes: Iterable[tuple[int, str]],
    ) -> Break | None:
        """The first break of the chain or of the id index, by position."""
        found = self._walk(events, hashes)
        if self.ids is None:
            return found
        earlier = self._check_ids()  # ids still pending are at positions the chain verified
        return earlier or found or self.ids.extra()

    def _check_ids(self) -> Break | None:
        """Check the ids seen since the last check; at a break, what is verified
        ends before its position, which the chain had passed."""
        assert self.ids is not None
        broken = self.ids.flush()
        if broken is not None and broken.position is not None:
            self.checked = broken.position - 1
            self.previous = self.unchecked[self.checked]
            return broken
        self.unchecked = {self.checked: self.previous}
        return broken

    def _walk(
        self, events: Iterable[tuple[int, str | None, bytes]],
        hashes: Iterable[tuple[int, str]],
    ) -> Break | None:
        kept = iter(hashes)
        stored = next(kept, None)
        if self.digest is not None and self.digest.position == 0:
            found = self._against_digest(0, GENESIS)
            if found is not None:
                return found
        for position, topic, state in events:
            expected = self.checked + 1
            if position != expected:
                return Break(expected, str(PositionMissing(expected, position)))
            if stored is not None and stored[0] < position:
                return self._orphan_hash(stored[0])
            if stored is None or stored[0] > position:
                return Break(position, f"position {position} has no chain hash")
            if topic is None:  # (a state set to NULL reads as no bytes: no match below)
                return Break(position, f"the event at position {position} has no topic (edited)")
            recomputed = link(self.previous, position, topic, state)
            if recomputed != stored[1]:
                return Break(
                    position,
                    f"the event at position {position} does not match its chain hash "
                    "(edited, inserted, moved, or its hash altered)",
                )
            found = self._against_digest(position, recomputed)
            if found is not None:  # what is verified ends before it, as at any break
                return found
            self.previous = recomputed
            self.checked = position
            if self.ids is not None:
                self.ids.see(position, state)
                self.unchecked[position] = recomputed
                if len(self.unchecked) > PAGE and (broken := self._check_ids()) is not None:
                    return broken
            stored = next(kept, None)
        if stored is not None:
            return self._orphan_hash(stored[0])
        if self.digest is not None and self.digest.position > self.checked:
            return Break(
                self.checked + 1,
                f"the log ends at position {self.checked}, before the digest's position "
                f"{self.digest.position}: events after {self.checked} were removed, or the "
                "digest is of another ledger",
            )
        return None

    def _orphan_hash(self, position: int) -> Break:
        return Break(
            position,
            f"position {position} has a chain hash but no event "
            f"(the log holds positions 1 to {self.checked} in order)",
        )

    def _against_digest(self, position: int, recomputed: str) -> Break | None:
        if self.digest is None or self.digest.position != position:
            return None
        if recomputed == self.digest.hash:
            return None
        return Break(
            position,
            f"the log no longer extends digest {self.digest}: position {position} "
            f"now hashes to {recomputed} (the log was rewritten up to there, or the digest "
            "is of another ledger)",
        )


def pages(
    store: Store, cursor: Any, table: str, columns: str, key: int = 1,
    after: tuple[Any, ...] | None = None,
) -> Iterator[list[Any]]:
    """Every row of a table (after the key ``after``, if given), ``columns``
    of it, a page at a time, in the order of its first ``key`` columns (which
    tell each row apart)."""
    listed = ", ".join(columns.split(", ")[:key])
    marks = ", ".join([store.param] * key)
    while True:
        where = f"WHERE ({listed}) > ({marks}) " if after else ""
        cursor.execute(
            f"SELECT {columns} FROM {table} {where}ORDER BY {listed} LIMIT {PAGE}", after or ())
        page = cursor.fetchall()
        yield page
        if len(page) < PAGE:
            return
        after = tuple(page[-1][:key])


def kept_hashes(store: Store, cursor: Any, after: int = 0) -> Iterator[tuple[int, str]]:
    """Every row of ``event_hashes`` in position order (after ``after``, if
    not 0), page by page; with ``after``, those below position 1 first (no
    event's position, before the digest or not)."""
    if after:
        cursor.execute("SELECT position, hash FROM event_hashes WHERE position < 1 "
                       "ORDER BY position")
        yield from ((int(row[0]), str(row[1])) for row in cursor.fetchall())
    for page in pages(store, cursor, "event_hashes", "position, hash",
                      after=(after,) if after else None):
        yield from ((int(row[0]), str(row[1])) for row in page)


def rows_beside(store: Store, cursor: Any, head: int) -> Break | None:
    """Rows of the log's table besides its positions 1 to ``head``: inserted
    before position 1 (the triggers refuse changes and deletions, not an
    INSERT), or under another stream. Nothing reads them as the log, but
    they were put there."""
    p = store.param
    # Four ranges of the log's primary key (stream, position), not a scan of
    # the whole table (0.1 ms against 111 ms at 300,000 events): ``verify
    # --since`` reads only what was appended since. (SQLite: a position kept
    # as text is greater than any number; a NULL one is in no range.)
    cursor.execute(
        "SELECT COUNT(*), MIN(originator_version) FROM stored_events WHERE "
        f"originator_id < {p} OR originator_id > {p} "
        f"OR (originator_id = {p} AND originator_version < 1) "
        f"OR (originator_id = {p} AND originator_version > {p})",
        (store.stream, store.stream, store.stream, store.stream, head))
    count, lowest = cursor.fetchone()
    if count:
        return Break(
            None,
            f"stored_events holds {count} row(s) besides the log's positions 1 to {head} "
            f"(the lowest at position {lowest}): inserted by hand",
        )
    return None


def applied_beyond(store: Store, cursor: Any, head: int) -> Break | None:
    """The projection tables' tracking row past the head: they applied events
    the log no longer holds, its last ones deleted with their hashes (which
    the chain alone cannot tell from a shorter log). Not checked where the
    role may not read the tracking row."""
    _, applied = store.known_end(cursor)
    if applied > head:
        return Break(
            head + 1,
            f"the log ends at position {head}, but the projection tables have applied it up "
            f"to position {applied}: its last events were deleted (or the tracking row was "
            "raised by hand: alloc-ledger replay --repair sets it to the log's head)",
        )
    return None


def verify(
    store: Store, digest: Digest | None = None, since: Digest | None = None
) -> Verification:
    """Recompute the chain over the whole log; name the first position that
    does not match, or prove the log extends ``digest``. With ``since`` (a
    digest kept earlier), only the events after it: the log must keep its
    hash at its position, and every event after it must chain from there;
    the events up to it are not read again (a whole verify checks them)."""
    one_of(digest, since)
    started = time.perf_counter()
    after = 0 if since is None else since.position
    with store.reading() as cursor:
        check = ChainCheck(digest, IdsCheck(store, cursor, after), since)
        head = store.head(cursor)
        events = (
            (e.originator_version, e.topic, bytes(e.state)) for e in store.read_log(after, head)
        )
        unfounded = _from_since(store, cursor, since, head)
        found = unfounded or (
            check.run(events, kept_hashes(store, cursor, after))
            or rows_beside(store, cursor, head) or applied_beyond(store, cursor, head)
        )
        guards = store.guards(cursor)
    seconds = time.perf_counter() - started
    if found is None:
        return Verification(head, check.checked, check.previous, seconds, digest=digest,
                            guards=guards, since=since)
    if unfounded is not None:  # nothing verified: the log does not hold where it would start
        check.checked, check.previous = 0, GENESIS
    return Verification(
        head, check.checked, check.previous, seconds, found.position, found.problem, digest,
        guards, since,
    )


def one_of(digest: Digest | None, since: Digest | None) -> None:
    """``BadOption`` if both are given: ``since`` proves what ``digest`` would."""
    if digest is not None and since is not None:
        raise BadOption("--since", "give --digest or --since, not both: --since already "
                        "proves the log extends its digest")


def _from_since(store: Store, cursor: Any, since: Digest | None, head: int) -> Break | None:
    """Whether the log keeps ``since``'s hash at its position, as a walk
    from there needs: what a whole walk would have recomputed there."""
    if since is None:
        return None
    if since.position > head:
        return Break(
            head + 1,
            f"the log ends at position {head}, before the digest's position {since.position}: "
            f"events after {head} were removed, or the digest is of another ledger",
        )
    kept = GENESIS if since.position == 0 else store.hash_at(cursor, since.position)
    if kept is None:
        return Break(since.position, f"position {since.position} has no chain hash")
    if kept != since.hash:
        return Break(
            since.position,
            f"the log no longer extends digest {since}: the chain hash kept for position "
            f"{since.position} is {kept} (the log was rewritten up to there, or the digest is "
            "of another ledger)",
        )
    return None if since.position == 0 else _linked(store, cursor, since)


def _linked(store: Store, cursor: Any, since: Digest) -> Break | None:
    """Whether the event at ``since``'s position and the hash kept before it
    still give its hash (as ``current_digest`` checks the head): that event
    is what the digest vouches for, and a rewrite before it that recomputed
    the kept hashes up to it cannot give that hash again."""
    recomputed = _recomputed(store, cursor, since.position)
    if isinstance(recomputed, Break):
        return recomputed
    if recomputed != since.hash:
        return Break(
            since.position,
            f"the event at position {since.position} does not match its chain hash "
            "(edited, inserted, moved, or its hash altered)",
        )
    return None


def _recomputed(store: Store, cursor: Any, position: int) -> str | Break:
    """The chain hash of ``position`` (1 or more) from the hash kept before it
    and its kept event, as a whole walk would compute it there (an event
    without topic gives none: "" matches no hash); a ``Break`` where either
    is missing."""
    before = GENESIS if position == 1 else store.hash_at(cursor, position - 1)
    if before is None:
        return Break(position - 1, f"position {position - 1} has no chain hash")
    event = next(iter(store.kept_at(cursor, [position])), None)
    if event is None:
        return Break(position, f"position {position} is missing from the log")
    return "" if event.topic is None else link(before, position, event.topic, bytes(event.state))


def current_digest(store: Store) -> Digest:
    """The head of the log and its kept chain hash, once the last link
    checks out: the hash before it and the head's event hash to it (a
    digest kept elsewhere must be one the log can match)."""
    with store.reading() as cursor:
        head = store.head(cursor)
        if head == 0:
            return Digest(0, GENESIS)
        kept = store.hash_at(cursor, head)
        recomputed = _recomputed(store, cursor, head)
    advice = "run `alloc-ledger verify` to see where the log was tampered with"
    if kept is None:
        raise LogEdited(f"position {head} has no chain hash; {advice}")
    if isinstance(recomputed, Break):
        raise LogEdited(f"{recomputed.problem}; {advice}")
    if recomputed != kept:
        raise LogEdited(
            f"the chain hash kept for position {head} does not follow from the event there "
            f"and the hash before it; {advice}"
        )
    return Digest(head, kept)
