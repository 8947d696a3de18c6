"""Store selection: a URL opens the event log (through eventsourcing's
recorders) together with the tables kept beside it in the same transaction.

``sqlite:///path`` is the embedded default; ``postgresql://…`` is imported
only when asked for, so a SQLite store never loads psycopg.
"""

from __future__ import annotations

import math
import os
import re
import secrets
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from functools import partial
from typing import Any, NamedTuple, Protocol
from urllib.parse import SplitResult, unquote, urlsplit
from uuid import NAMESPACE_URL, UUID, uuid5

from eventsourcing.persistence import StoredEvent

from ledger.errors import StoreUnavailable
from ledger.model import Receipt, not_utf8

DEFAULT_URL = "sqlite:///alloc-ledger.db"
STORE_VARIABLE = "ALLOC_LEDGER_STORE"
LEDGER_STREAM = uuid5(NAMESPACE_URL, "https://alloc-ledger/ledger")
PROJECTIONS = "projections"
# The row of ``tracking`` that counts the repairs that replaced projection
# tables: a writer whose caches were loaded from them before one drops them.
REPAIRS = "repairs"
# A page of the log (``Store.read_log``, one read transaction) ends at this
# many kept events, or once their stored bytes reach ``PAGE_BYTES`` (one event
# at least), whichever comes first: 5,000 events of 1 MiB would be 5 GB held.
PAGE = 5000
PAGE_BYTES = 32 << 20


class LoggedEvent(NamedTuple):
    """A kept event as read back for replays: what an eventsourcing
    ``StoredEvent`` of the ledger stream holds, less the stream's id, as a
    plain tuple (building a frozen dataclass per event was a tenth of a replay)."""

    originator_version: int  # the position
    topic: str
    state: bytes


class Guards(NamedTuple):
    """The state of the log's append-only guards: those that are not as
    made (each ``name: missing``, ``altered`` or ``disabled``; none when all
    are in place), and how to have them made again; and ``exposed``, what
    is wrong if roles besides its owner may create objects in the ledger's
    PostgreSQL schema, the writers' search path ("" if none may)."""

    lacking: tuple[str, ...]
    remedy: str
    exposed: str = ""


Kept = StoredEvent | LoggedEvent  # what decoding accepts
logged = partial(tuple.__new__, LoggedEvent)  # a LoggedEvent from a tuple, without _make's checks


class Decider(Protocol):
    """What decides batches: the application."""

    def decide(
        self, cursor: Any, batch: list[dict[str, Any]], inline: bool | None = None
    ) -> list[Receipt]: ...
    def forget(self) -> None: ...

    def decide_ahead(self, cursor: Any, batch: list[dict[str, Any]]) -> Any | None:
        """Decide a batch after one still committing, writing nothing; None
        when it must wait for that commit and ``decide``."""

    def write_ahead(self, cursor: Any, decided: Any) -> list[Receipt]:
        """Write what ``decide_ahead`` decided (the caller holds the log's lock)."""


def decide_here(store: Store, batch: list[dict[str, Any]], decider: Decider) -> list[Receipt]:
    """``Store.decide`` in this process's own write transaction."""
    try:
        with store.writing() as cursor:
            return decider.decide(cursor, batch)
    except BaseException:
        decider.forget()
        raise


class Store(Protocol):
    """What the application needs from a store, whichever the database."""

    url: str
    dialect: str
    param: str
    name_order: str  # after a name in ORDER BY: names in code point order, as Python sorts them
    state_prefix: str  # tables the writer decides against ("" = the projection tables)
    projects_inline: bool  # whether writers also keep the projection tables
    overlaps: bool  # whether ``submit_batches`` decides a batch while the last one commits
    loads_many: bool  # whether ``load_nodes`` saves round trips (else it is never called)

    @property
    def lock_wait(self) -> float:
        """How long a command waits for a lock another holds (the URL's ``timeout``)."""

    @property
    def stream(self) -> UUID | str:
        """The log's one stream: its rows' ``originator_id``, as the store's driver binds it."""

    def decide(self, batch: list[dict[str, Any]], decider: Decider) -> list[Receipt]:
        """Have ``decider.decide(cursor, batch)`` run in a write transaction and
        return the receipts once it is committed (``decider.forget()`` if it is not)."""

    def writing(self) -> AbstractContextManager[Any]:
        """A transaction that no other writer runs beside (the log is one sequence)."""

    def projecting(self, waits: float | None = None) -> AbstractContextManager[Any]:
        """A transaction for catching up the projection tables, waiting for
        another projector at most ``waits`` seconds (None: as long as it takes)
        (``LockWaitedOut``)."""

    def repairing(self) -> AbstractContextManager[Any]:
        """A write transaction in which neither the log nor the projection
        tables move: no writer appends, no projector catches up."""

    def reading(self) -> AbstractContextManager[Any]:
        """A read-only transaction with a consistent view."""

    def changing(self, cursor: Any) -> AbstractContextManager[None]:
        """Tables and views made again in a transaction that holds the log's
        lock (a repair): a lock another session holds on one is waited for
        only briefly, then ``RelationsBusy`` (the caller lets the log go)."""
        ...

    def holders(self, relations: list[str]) -> list[str]:
        """Other sessions holding a lock on these tables or views (none given:
        any projection table or view), described."""
        ...

    def claimed(self, prefix: str) -> AbstractContextManager[Abandoned]:
        """Scratch tables of ``prefix`` claimed by this process while they are
        in use (another's ``Abandoned`` never names them); inside, which of
        the scratch prefixes found no running process claims (a replay killed)."""
        ...

    def keeping_grants(self, cursor: Any) -> AbstractContextManager[None]:
        """Around making projection tables and views again in a transaction:
        each one made again (dropped by hand before, or inside) or redefined
        is readable, and owned, as before (PostgreSQL's grants; SQLite has none)."""

    def guards(self, cursor: Any) -> Guards:
        """Whether the log's append-only guards are in place, each as made."""

    def preload(
        self, cursor: Any, sql: Any, cluster: Any, batch: list[dict[str, Any]], ids: bool = True
    ) -> None:
        """Load what a batch names into the cluster's caches, where a load costs
        a round trip (the domain would otherwise load entities one by one);
        ``ids``: and which of its client ids are known (``known_ids``)."""

    def load_nodes(self, cursor: Any, sql: Any, cluster: Any, nodes: set[str]) -> None:
        """Load nodes with their slot tables, live allocations (and those
        allocations) and children into the cluster's caches, all at once."""

    def head(self, cursor: Any) -> int:
        """The position of the last event in the log (0 when empty)."""

    def head_and_repairs(self, cursor: Any) -> tuple[int, int, int]:
        """The head, how many repairs have replaced projection tables
        (``count_repair``), and the position the projection tables have
        applied, read at once: a writer checks them per batch."""

    def write_kept(
        self, cursor: Any, sql: Any, events: list[LoggedEvent], hashes: list[tuple[int, str]],
        ids: list[tuple[str, int]], changed: Any,
    ) -> None:
        """A decided batch's writes, as this database does them fastest: the
        stored events (through the library's recorder's table) with their chain
        hashes and client ids, and the rows they changed in the tables writers
        decide against (``projections.rows.changed_rows``, built when the
        batch was decided: the entities themselves change on with the next)."""

    def hash_at(self, cursor: Any, position: int) -> str | None:
        """The chain hash kept for a position."""

    def tracked(self, cursor: Any) -> int:
        """How far the projection tables have read."""

    def known_end(self, cursor: Any) -> tuple[int, int]:
        """Where the log is known to have reached: its last chain hash, and
        how far the projection tables have read (0 where this role may not
        read that: an auditor's may read the log's tables alone)."""

    def track(self, cursor: Any, position: int) -> None:
        """Record how far the projection tables have read."""

    def set_tracked(self, cursor: Any, position: int) -> None:
        """Set the tracking position, lower too (``track`` only raises it)."""

    def known_ids(self, cursor: Any, ids: list[str]) -> dict[str, int]:
        """Positions of client ids already in the ledger."""

    def kept_at(self, cursor: Any, positions: list[int]) -> list[LoggedEvent]:
        """The kept events at some positions (those the log has), in order."""

    def write_rows(self, cursor: Any, sql: Any, changed: Any) -> None:
        """Write the rows ``projections.rows.changed_rows`` built of what the
        domain changed (``projections.rows.write_changes`` semantics), into the
        tables of ``sql``'s prefix, in the caller's transaction, as this
        database does it fastest."""

    def read_log(self, after: int, upto: int | None = None) -> Iterator[LoggedEvent]:
        """Stored events after a position, in order, read page by page
        (``PAGE`` events at most per read, or ``PAGE_BYTES`` of them)."""

    def search_log(
        self, cursor: Any, needle: str, after: int, upto: int, limit: int
    ) -> list[tuple[int, int]]:
        """The first ``limit`` events after position ``after`` (to ``upto``)
        whose stored form contains a text (for ``history``), in order: each
        as its position and its stored size in bytes, to be read with
        ``kept_at`` a few at a time."""

    def close(self) -> None: ...


def not_a_ledger_yet(
    columns: dict[str, tuple[str, ...]], recorder: dict[str, tuple[str, ...]],
    log_has_events: Callable[[], bool],
) -> list[str]:
    """What of a place that holds no ledger is another application's, each
    table or view by its name with its ``columns``: all but the event
    recorder's own tables as it makes them (``recorder``), which a ledger
    whose creation was cut short leaves with an empty log; one of those of
    other columns is named so, a log that holds events too."""
    odd = [name for name in recorder if name in columns and columns[name] != recorder[name]]
    others = [f"{name} (of other columns)" for name in odd] + [
        name for name in columns if name not in recorder]
    if "stored_events" in columns and "stored_events" not in odd and log_has_events():
        others.insert(0, "stored_events (with events)")
    return others


MOST_SECONDS = 86_400  # a day: more overflows what the servers and drivers take


def seconds(options: dict[str, str], name: str, default: float) -> float:
    """A store URL parameter in seconds; ``ValueError`` naming it unless it
    is a finite number above 0, and at most a day."""
    try:
        value = float(options.get(name, default))
    except ValueError:
        value = -1
    if not 0 < value < math.inf:
        raise ValueError(f"{name}={options[name]} must be a finite number of seconds above 0")
    if value > MOST_SECONDS:
        raise ValueError(f"{name}={options[name]} must be at most {MOST_SECONDS} seconds (a day)")
    return value


def store_url(url: str | None) -> str:
    """The URL given, else ``ALLOC_LEDGER_STORE``'s, else the default; an
    empty one (given, or the variable set to nothing) is refused, not read
    as the default: a script's ``$UNSET`` must not open ./alloc-ledger.db."""
    if url is None:
        url = os.environ.get(STORE_VARIABLE, DEFAULT_URL)
        if not url:
            raise StoreUnavailable(
                f"cannot open store '': the store URL is empty ({STORE_VARIABLE} is set but "
                "empty; unset it for the default)")
    if not url:
        raise StoreUnavailable("cannot open store '': the store URL is empty")
    return url


DRIVER = ("psycopg", "psycopg_pool")  # a plain install leaves them out: an extra


def without_driver(error: ImportError) -> str:
    """Why a PostgreSQL store cannot be opened without its driver, or the
    error again if it is not about the driver."""
    if (error.name or "").partition(".")[0] in DRIVER:
        return (f"a PostgreSQL store needs the {error.name} package, not installed here: "
                "pip install 'alloc-ledger[postgres]'")
    if str(error).startswith("no pq wrapper available"):  # psycopg without libpq
        return ("psycopg finds no libpq here (no pq wrapper available): "
                "pip install 'psycopg[binary]', or install libpq")
    raise error


def redacted(url: str) -> str:
    """The URL as given, its password masked (``user:***@``, ``password=***``),
    for messages."""
    password = urlsplit(url).password
    shown = url if password is None else url.replace(f":{password}@", ":***@", 1)
    return PARAMETER.sub(_masked, shown)


PARAMETER = re.compile(r"([?&])([^=&#]*)=([^&#]*)")
SECRETS = ("password", "sslpassword")  # libpq's: the server's, and the client key's


def _masked(parameter: re.Match[str]) -> str:
    """A URL parameter, its value masked if it is a secret (its name as libpq
    reads it: ``pass%77ord`` is ``password``)."""
    separator, name, _ = parameter.groups()
    return f"{separator}{name}=***" if unquote(name).lower() in SECRETS else parameter[0]


def _parameters(query: str) -> dict[str, list[str]]:
    """A URL's parameters as libpq reads them: percent-escapes decoded, but a
    '+' kept as it is (``parse_qs`` reads it as a space, as HTML forms do:
    ``?password=a+b`` would send 'a b')."""
    given: dict[str, list[str]] = {}
    for part in query.split("&"):
        if part:
            name, _, value = part.partition("=")
            given.setdefault(unquote(name), []).append(unquote(value))
    return given


def _options(url: str, given: dict[str, list[str]]) -> dict[str, str]:
    """A URL's parameters, each given once and with a value: a repeated or
    empty one (say ``schema=$UNSET``) is refused, not read as the default."""
    for name, values in given.items():
        problem = "is given twice" if len(values) > 1 else "has no value" if not values[0] else ""
        if problem:
            raise StoreUnavailable(
                f"cannot open store {redacted(url)}: parameter {name} {problem}"
            )
    return {name: values[0] for name, values in given.items()}


def url_parts(url: str) -> SplitResult:
    """A store URL's parts; StoreUnavailable for a URL that names nothing
    (malformed, a port out of range, a NUL, which a C library reads as its
    end). The URL is not shown: it may hold a password."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - checks it: out of range raises
    except ValueError as error:
        raise StoreUnavailable(f"cannot open store: the URL is malformed ({error})") from None
    # %00 too, where the parts are read unquoted (not a SQLite path: as written)
    if "\x00" in (url if parts.scheme == "sqlite" else unquote(url)):
        raise StoreUnavailable("cannot open store: the URL is malformed (it holds a NUL character)")
    return parts


def open_store(url: str | None = None, create: bool = True) -> Store:
    """Open the store a URL names; create it if needed, or with ``create``
    false refuse one that holds no ledger yet (a mistyped path or schema
    must not read as an empty, valid ledger)."""
    url = store_url(url)
    parts = url_parts(url)
    options = _options(url, _parameters(parts.query))
    if parts.scheme == "sqlite":
        from ledger.sqlite_store import SQLiteStore

        # sqlite:///relative.db, sqlite:////absolute.db, sqlite:// (in memory), as
        # SQLAlchemy reads them; anything else is a typo, not a file name
        head = url.split("?", 1)[0]
        if head.lower() != "sqlite://" and head[:10].lower() != "sqlite:///":
            raise StoreUnavailable(
                f"cannot open store {url}: a SQLite URL is sqlite:///relative/path.db "
                "or sqlite:////absolute/path.db (three slashes, then the path)"
            )
        return SQLiteStore(url, head[10:], options, create)
    if parts.scheme in ("postgresql", "postgres"):
        if not_utf8(url):
            raise StoreUnavailable("cannot open store: the PostgreSQL URL is not UTF-8 text")
        try:
            from ledger.postgres_store import PostgresStore
        except ImportError as error:
            raise StoreUnavailable(
                f"cannot open store {redacted(url)}: {without_driver(error)}") from None

        return PostgresStore(url, parts, options, create)
    raise StoreUnavailable(
        f"cannot open store {redacted(url)!r}: use sqlite:///path/to/ledger.db or "
        "postgresql://user:password@host:port/db"
    )


def count_repair(cursor: Any, param: str) -> None:
    """One more repair, counted in its transaction: every writer sees it with
    the next batch it decides (``repairs``) and drops what it had loaded from
    the tables before (an entity read while a row was damaged would be
    written back): ``Store.head_and_repairs``."""
    cursor.execute("UPDATE tracking SET notification_id = notification_id + 1 "
                   f"WHERE application_name = {param}", (REPAIRS,))
    if cursor.rowcount == 0:
        cursor.execute("INSERT INTO tracking (application_name, notification_id) "
                       f"VALUES ({param}, 1)", (REPAIRS,))


# Scratch tables (a replay's, a repair's) are named by a prefix of their
# own (with the process's pid, for whoever looks), claimed while in use so
# that those of a process killed before it dropped them can be told from
# those in use (``Store.claimed``).
SCRATCH = re.compile(r"replay_\d+_[0-9a-f]{8}_")
Abandoned = Callable[[list[str]], list[str]]  # of these scratch prefixes, those no one claims


def scratch_prefix() -> str:
    return f"replay_{os.getpid()}_{secrets.token_hex(4)}_"
