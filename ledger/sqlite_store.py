"""The embedded default: one SQLite file holds the log and the projections.

The log is eventsourcing's ``SQLiteProcessRecorder`` (events and tracking);
writes run in ``BEGIN IMMEDIATE`` transactions so that one writer at a time
decides against the current state, across processes.
"""

from __future__ import annotations

import array
import errno
import fcntl
import glob
import hashlib
import os
import sqlite3
import stat
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager, nullcontext, suppress
from functools import cache, partial
from typing import Any
from urllib.parse import quote

from eventsourcing.persistence import (
    ConnectionPoolClosedError,
    IntegrityError,
    PersistenceError,
    Tracking,
)
from eventsourcing.sqlite import SQLiteConnectionPool, SQLiteDatastore, SQLiteProcessRecorder

from ledger import sqlite_writes
from ledger.errors import MadeByNewer, NotKept, StoreUnavailable, first_few
from ledger.store import (
    LEDGER_STREAM,
    PAGE,
    PAGE_BYTES,
    PROJECTIONS,
    REPAIRS,
    SCRATCH,
    Abandoned,
    Decider,
    Guards,
    LoggedEvent,
    decide_here,
    logged,
    not_a_ledger_yet,
    seconds,
)
from projections import tables

# 2: nodes.health_reason, zombie_slots; 3: needs_reconnect.expired, no
# zombie slots on removed nodes (``projections.tables.upgrade``)
SCHEMA_VERSION = 3
# The size a writer cuts the write-ahead log back to when it starts it again
# (SQLite's ``journal_size_limit``): a reader that kept a transaction open
# for long (a dashboard) lets it grow with everything written meanwhile,
# and SQLite would otherwise keep the file at its largest for as long as any
# connection stays open. Above what a batch of 16 MiB of lines writes, so
# an ordinary stream never cuts it.
WAL_LIMIT = 64 * 1024 * 1024
FOLD_WAIT = 1000  # ms a writer waits for readers to start the write-ahead log again
MIN_SQLITE = (3, 33, 0)

LOG_TABLES = [
    """CREATE TABLE IF NOT EXISTS event_ids (id TEXT PRIMARY KEY, position INTEGER NOT NULL)
       WITHOUT ROWID""",
    "CREATE TABLE IF NOT EXISTS event_hashes (position INTEGER PRIMARY KEY, hash TEXT NOT NULL)",
]
# The log, its hash chain and its client ids are append-only (a lost id would
# let a retry append its event again). A store made before the ids were
# guarded, or whose guards were dropped by hand (to "fix a row"), is guarded
# again when next opened.
GUARDED = [
    (table, operation)
    for table in ("stored_events", "event_hashes", "event_ids")
    for operation in ("UPDATE", "DELETE")
]
GUARD_NAMES = tuple(f"{table}_append_only_{operation.lower()}" for table, operation in GUARDED)
GUARDS = [
    f"""CREATE TRIGGER IF NOT EXISTS {name} BEFORE {operation} ON {table}
       BEGIN SELECT RAISE(ABORT, 'the event log is append-only'); END"""
    for name, (table, operation) in zip(GUARD_NAMES, GUARDED, strict=True)
]
# Each guard as SQLite keeps its text (``IF NOT EXISTS`` left out): one whose
# text is another (replaced by hand with one that refuses nothing) is no guard.
GUARD_TEXTS = [g.replace(" IF NOT EXISTS", "", 1) for g in GUARDS]


def _named(cursor: sqlite3.Cursor, names: tuple[str, ...]) -> dict[str, str | None]:
    """The SQL kept for each of some names in ``sqlite_master`` (a trigger's,
    a view's, or what else holds the name), of those there."""
    cursor.execute(
        f"SELECT name, sql FROM sqlite_master WHERE name IN ({', '.join('?' * len(names))})",
        names)
    return {row[0]: row[1] for row in cursor.fetchall()}


def _unguarded(found: dict[str, str | None]) -> tuple[str, ...]:
    """The guards that are not as made, of ``_named``'s: ``name: missing``, or
    ``name: altered`` (replaced by hand by one of other text; its spacing
    aside: releases before 529a1b8 wrote a line break where this one does not)."""
    return tuple(
        f"{name}: {'missing' if name not in found else 'altered'}"
        for name, text in zip(GUARD_NAMES, GUARD_TEXTS, strict=True)
        if _words(found.get(name)) != _words(text))


def _words(text: str | None) -> str:
    """SQL text with its runs of white space as one space."""
    return " ".join((text or "").split())


@cache
def sqlite_missing() -> str | None:
    """What this Python's SQLite lacks for the batch writes (``sqlite_writes``:
    UPDATE … FROM from 3.33, and the JSON functions, built in from 3.38 and
    usually compiled in before); None when nothing. Asked once per process."""
    if sqlite3.sqlite_version_info < MIN_SQLITE:
        return (
            f"SQLite {'.'.join(map(str, MIN_SQLITE))} or newer is needed; "
            f"this Python uses SQLite {sqlite3.sqlite_version}"
        )
    try:
        with closing(sqlite3.connect(":memory:")) as probe:
            probe.execute("SELECT json_extract('[1]', '$[0]')")
    except sqlite3.OperationalError:
        return f"this Python's SQLite {sqlite3.sqlite_version} has no JSON functions (JSON1)"
    return None


def _tables_unless_ledger(uri: str) -> list[str] | None:
    """None for a ledger (its schema version set), read through a read-only
    URI of it, else the tables it holds (none: an empty file; some: another
    application's database); a file SQLite cannot read counts as a ledger,
    so that opening it reports why."""
    try:
        with closing(sqlite3.connect(uri, uri=True)) as probe:
            cursor = probe.cursor()
            if _ledger_version(cursor):
                return None
            return _other_tables(cursor)
    except sqlite3.Error:
        return None


# The tables the event recorder makes first, as it makes them: a file that
# holds only these (the log empty) is a ledger whose creation was cut short.
RECORDER_COLUMNS = {
    "stored_events": ("originator_id", "originator_version", "topic", "state"),
    "tracking": ("application_name", "notification_id"),
}


def _columns(cursor: sqlite3.Cursor, table: str) -> tuple[str, ...]:
    cursor.execute(f"SELECT name FROM pragma_table_info('{table}') ORDER BY cid")
    return tuple(row[0] for row in cursor.fetchall())


def _ledger_version(cursor: sqlite3.Cursor) -> int:
    """The schema version of the ledger a file holds (0: none). A ledger is
    known by its log (every release's, as the recorder makes it) beside the
    version: another application's file may set a user_version of its own."""
    version = int(cursor.execute("PRAGMA user_version").fetchone()[0])
    if version and _columns(cursor, "stored_events") == RECORDER_COLUMNS["stored_events"]:
        return version
    return 0


def _other_tables(cursor: sqlite3.Cursor) -> list[str]:
    """The tables and views of a file that is not a ledger yet
    (``not_a_ledger_yet``)."""
    cursor.execute(
        "SELECT name FROM sqlite_master WHERE type IN ('table', 'view') "
        "AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' ORDER BY name"
    )
    names = [row[0] for row in cursor.fetchall()]
    return not_a_ledger_yet(
        {name: _columns(cursor, name) if name in RECORDER_COLUMNS else () for name in names},
        RECORDER_COLUMNS,
        lambda: cursor.execute("SELECT 1 FROM stored_events LIMIT 1").fetchone() is not None)


def not_a_ledger(url: str, path: str, others: list[str], advice: str) -> StoreUnavailable:
    return StoreUnavailable(
        f"cannot open store {url}: {path} is a database of something else "
        f"(tables {first_few(others)}), not a ledger; {advice}"
    )


FS_IOC_GETFLAGS, FS_IMMUTABLE_FL = 0x80086601, 0x10  # linux/fs.h


def _unchangeable(path: str) -> bool:
    """Whether no process can change a file: on a read-only file system, or
    marked immutable (``chattr +i``, Linux)."""
    try:
        if os.statvfs(path).f_flag & os.ST_RDONLY:
            return True
        with open(path, "rb") as file:
            flags = array.array("i", [0, 0])  # the kernel writes an int; room for a long
            fcntl.ioctl(file.fileno(), FS_IOC_GETFLAGS, flags, True)
            return bool(flags[0] & FS_IMMUTABLE_FL)
    except OSError:  # no such flags here (another OS or file system)
        return False


def _writable_by_none(path: str) -> bool:
    """Whether a file's mode lets no one write it (``chmod a-w``: an
    auditor's read-only copy). Only a superuser's process could change it;
    with no WAL file beside it, it holds every committed transaction, so it
    is read as it is, without making WAL files beside it."""
    try:
        return not os.stat(path).st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)
    except OSError:
        return False


def _busy(error: BaseException | None) -> bool:
    """Whether SQLite refused for a lock (SQLITE_BUSY, SQLITE_LOCKED), here or
    in what caused it."""
    while error is not None:
        if isinstance(error, sqlite3.Error) and getattr(error, "sqlite_errorcode", 0) & 0xFF in (
            sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED
        ):
            return True
        error = error.__cause__
    return False


def _claim_files(base: str, prefix: str) -> tuple[str, str]:
    """Where a claim of ``prefix`` may be: ``<file>-<prefix>claim``, or, where
    the store file's name leaves no room for that (the file system refuses a
    name so long), a hidden one named after a hash of its name."""
    return f"{base}-{prefix}claim", f"{_hashed(base)}-{prefix}claim"


def _hashed(base: str) -> str:
    folder, name = os.path.split(base)
    return os.path.join(folder, "." + hashlib.sha1(os.fsencode(name)).hexdigest()[:16])


def _abandoned(base: str, prefixes: list[str]) -> list[str]:
    """Those no process claims: neither claim file is held locked (or there
    is none: its replay gone, or one of an earlier release). Every claim file
    no one holds is removed, those of a replay killed before it made its
    tables too."""
    claims = {prefix: _claim_files(base, prefix) for prefix in prefixes}
    free = [prefix for prefix, paths in claims.items() if all(map(_unclaimed, paths))]
    told = {path for paths in claims.values() for path in paths}
    for stem in (base, _hashed(base)):
        for path in glob.glob(glob.escape(stem) + "-replay_*_claim"):
            if path not in told and SCRATCH.fullmatch(path[len(stem) + 1:-len("claim")]):
                _unclaimed(path)
    return free


_RETRIES = 100  # claim files removed and made again under it before it gives up (held)


def _unclaimed(path: str) -> bool:
    """Whether no process holds the claim file locked (missing: none does);
    one no one holds is removed. Opened to write where this user may (``flock``
    on NFS is a lock on a byte range, which needs it), else to read (a claim
    file another user left in a store a group shares: any open file will do
    for ``flock`` on a local file system). A file it cannot open or lock, or
    that is not a plain file, is taken as held: its tables are left."""
    for _ in range(_RETRIES):
        try:
            descriptor = _opened_to_lock(path)
        except (FileNotFoundError, _NameTooLong):
            return True
        except OSError:
            return False  # not ours to tell
        try:
            if not stat.S_ISREG(os.fstat(descriptor).st_mode):
                return False  # a FIFO, say: not a claim
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if os.fstat(descriptor).st_ino != os.stat(path).st_ino:
                continue  # removed and made again by a claim since it was opened: tell that one
        except FileNotFoundError:
            return True
        except OSError:
            return False  # held (EWOULDBLOCK), or no lock to be had here: left
        else:
            with suppress(OSError):
                os.unlink(path)  # while locked: a claim that opened it finds it gone and makes another
            return True
        finally:
            os.close(descriptor)
    return False


def _identity(path: str) -> tuple[int, int] | None:
    """Which file a path leads to (device, inode); None if none."""
    try:
        found = os.stat(path)
    except OSError:
        return None
    return found.st_dev, found.st_ino


class _NameTooLong(OSError):
    """The file system refuses a name so long (ENAMETOOLONG)."""


def _opened_to_lock(path: str) -> int:
    """Opened without waiting (a FIFO would wait for a writer for ever)."""
    try:
        try:
            return os.open(path, os.O_RDWR | os.O_NONBLOCK)
        except PermissionError:
            return os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as error:
        if error.errno == errno.ENAMETOOLONG:
            raise _NameTooLong(error.errno, error.strerror, path) from None
        raise


def _rolled_back(error: BaseException, committing: bool) -> bool:
    """Whether a write transaction that failed with ``error`` is surely not
    committed: it failed before its ``COMMIT``, or the ``COMMIT`` could not
    write its pages (SQLITE_FULL: the WAL frames end before the commit
    frame). Any other failure of a ``COMMIT`` (an I/O error of its fsync,
    after the commit frame was written) may leave it committed."""
    code = getattr(error.__cause__ or error, "sqlite_errorcode", None)
    return not committing or (code is not None and code & 0xFF == sqlite3.SQLITE_FULL)


def _free_bytes(folder: str) -> int | None:
    """What the file system holding ``folder`` has free for this user."""
    try:
        found = os.statvfs(folder)
    except OSError:
        return None
    return found.f_bavail * found.f_frsize


# SQLite's words for a write that found no room: the file may not grow
# ("full"), or the -shm beside it, which readers write too, may not be made
# or grow (an I/O error; one beside room enough is the disk's own)
DISK_FULL = "database or disk is full"
NO_ROOM = (DISK_FULL, "disk I/O error")
ROOM_ENOUGH = 1 << 20


def describe(error: BaseException, path: str = "") -> str:
    text = (str(error.__cause__ or error) or type(error).__name__).splitlines()[0]
    folder = os.path.dirname(os.path.abspath(path)) if path else ""
    # SQLite's words for any reason; and for a file this user may write in a
    # folder where it may not make the WAL files beside it
    if path and (text == "unable to open database file" or (
        text == "attempt to write a readonly database" and not os.access(folder, os.W_OK)
    )):
        return f"{text} {os.path.abspath(path)} (may this user create files in {folder}?)"
    if text == "database is locked":  # SQLite's busy timeout ran out
        return (f"{text}: another connection held it longer than the URL's timeout (a "
                "writer stopped or stuck, or a tool that opened the file to write, such as "
                "a database browser left in a transaction: open reporting tools with "
                "?mode=ro)")
    free = _free_bytes(folder) if path and text in NO_ROOM else None
    if free is not None and (text == DISK_FULL or free < ROOM_ENOUGH):
        shown = f"{free} bytes" if free < ROOM_ENOUGH else f"{free >> 20} MiB"
        return f"{text} (the file system holding {folder} has {shown} free)"
    return tables.with_repair_hint(text)


class SQLiteStore:
    dialect = "sqlite"
    param = "?"
    name_order = ""  # BINARY: UTF-8 bytes, code point order
    state_prefix = ""  # decisions read the projection tables themselves
    projects_inline = True
    overlaps = True  # a file (never in memory): a reader reads while the writer thread writes
    loads_many = False  # a load is a call in this process, not a round trip

    def __init__(self, url: str, path: str, options: dict[str, str], create: bool = True) -> None:
        self.url = url
        self.path = path  # as the URL names it, in messages
        # what every connection, check and claim opens: the same file after
        # the process changes its working directory (a service's chdir)
        # (joined, not normalized: "link/.." is where the link leads, then up)
        self.file = os.path.join(os.getcwd(), path)
        self.stream = LEDGER_STREAM.hex
        timeout = self.lock_wait = self._timeout(options)
        if not path or SQLiteConnectionPool.detect_memory_mode(path):
            raise StoreUnavailable(
                f"cannot open store {url}: an in-memory store keeps nothing once it is "
                "closed; name a file, e.g. sqlite:///alloc-ledger.db"
            )
        self._check_sqlite()
        # Reading commands read a ledger they may not write (an auditor's
        # copy, another user's file) read-only; whatever writes says so.
        self._check_path()
        self.read_only = not self._may_write()
        if create and self.read_only:
            raise StoreUnavailable(f"cannot open store {url}: {self._target()} is not writable")
        exists = os.path.exists(path)
        # read-only (what a reading command probes, what a reader opens): made once,
        # as it may look at the file system
        reading = self._reading_uri() if exists and (self.read_only or not create) else path
        # (a writer's open creates or checks the schema itself: no probe of its own)
        others = None if create else _tables_unless_ledger(reading) if exists else []
        if others:
            raise not_a_ledger(url, path, others, "check --store")
        if others is not None:
            raise StoreUnavailable(
                f"cannot open store {url}: there is no ledger at {path} (nothing has been "
                "submitted to it; check --store)"
            )
        try:
            self._busy_ms = (int(timeout) or 1) * 1000  # a connection's busy timeout
            self._fold_at = 0  # the WAL's size that is folded back (0: WAL_LIMIT)
            self._commits = 0  # a store's first commit folds back without waiting
            self.datastore = SQLiteDatastore(
                reading if self.read_only else self.file, lock_timeout=int(timeout) or 1)
            self.recorder = SQLiteProcessRecorder(self.datastore)
            self._opened: tuple[int, int] | None = None  # which file (_identity) writes go to
            self._create_schema_waiting(timeout)
            self._opened = self._opened or _identity(self.file)
        except (PersistenceError, sqlite3.Error) as error:
            raise StoreUnavailable(f"cannot open store {url}: {describe(error, path)}") from None

    def _create_schema_waiting(self, timeout: float) -> None:
        """``_create_schema``, again while the file is locked, up to ``timeout``:
        processes that make a new store at once (turning it to WAL, creating
        its tables) can find it locked without SQLite waiting for them."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._create_schema()
                return
            except (StoreUnavailable, PersistenceError, sqlite3.Error) as error:
                if not _busy(error) or time.monotonic() > deadline:
                    raise
            time.sleep(0.05)

    def _timeout(self, options: dict[str, str]) -> float:
        unknown = set(options) - {"timeout"}
        if unknown:
            raise StoreUnavailable(
                f"cannot open store {self.url}: unknown parameter {min(unknown)} "
                "(a SQLite store takes timeout)"
            )
        try:
            return seconds(options, "timeout", 10)
        except ValueError as error:
            raise StoreUnavailable(f"cannot open store {self.url}: {error}") from None

    def _check_sqlite(self) -> None:
        missing = sqlite_missing()
        if missing is not None:
            raise StoreUnavailable(f"cannot open store {self.url}: {missing}")

    def _target(self) -> str:
        """What a write needs: the file, or the folder to make it in."""
        return self.path if os.path.exists(self.path) else os.path.dirname(
            os.path.abspath(self.path))

    def _may_write(self) -> bool:
        return os.access(self._target(), os.R_OK | os.W_OK)

    def _reading_uri(self) -> str:
        """A read-only URI of the file. For a process that may not write it,
        a file no one can write (on a read-only file system, or immutable)
        is read as it is; any other is read through the WAL files its writer
        keeps beside it while it has it open; without them, a reader would
        make them itself, and they would shut out the file's owner (or,
        where it may make none, it could not read the file): refused."""
        name = "file:" + quote(os.fsencode(self.file)) + "?mode=ro"
        if not self.read_only:
            return name
        if _unchangeable(self.path):
            return name + "&immutable=1"
        beside = os.path.realpath(self.path)  # SQLite's WAL files: beside the file a link leads to
        if not os.path.exists(beside + "-wal") and _writable_by_none(self.path):
            return name + "&immutable=1"
        if not all(os.path.exists(beside + end) for end in ("-wal", "-shm")):
            raise StoreUnavailable(
                f"cannot open store {self.url}: {self.path} is not writable by this user, "
                "and no writer has it open: reading it would leave files beside it that "
                "its owner could not write; read it as its owner, or read a copy"
            )
        return name

    def _check_path(self) -> None:
        if self.path.endswith(("/", os.sep)) or os.path.isdir(self.path):
            raise StoreUnavailable(
                f"cannot open store {self.url}: {self.path} names a directory; name a file in it, "
                f"e.g. sqlite:///{os.path.join(self.path, 'alloc-ledger.db')}"
            )
        folder = os.path.dirname(os.path.abspath(self.path))
        if not os.path.isdir(folder):
            raise StoreUnavailable(
                f"cannot open store {self.url}: directory {folder} does not exist"
            )
        if not os.path.exists(self.path):
            return
        if not os.path.isfile(self.path):  # a FIFO would hang
            raise StoreUnavailable(
                f"cannot open store {self.url}: {self.path} is not a regular file"
            )
        if not os.access(self.path, os.R_OK):
            raise StoreUnavailable(
                f"cannot open store {self.url}: {self.path} is not readable by this user"
            )

    def _create_schema(self) -> None:
        with self.reading() as cursor:
            version = _ledger_version(cursor)
            found = _named(cursor, (*GUARD_NAMES, *tables.ALL_VIEWS))
            views = sum(name in found for name in tables.ALL_VIEWS)  # or what else holds its name
            if version > SCHEMA_VERSION:
                raise MadeByNewer(self.url, version, SCHEMA_VERSION)
            if version == 0:
                self._check_no_other_tables(cursor)
        if self.read_only and version != SCHEMA_VERSION:
            raise StoreUnavailable(
                f"cannot open store {self.url}: it was made by an earlier alloc-ledger "
                f"(schema version {version}) and {self.path} is not writable: open it once "
                "where it may be written, to upgrade it"
            )
        if version == SCHEMA_VERSION:
            # Guards (ids: a store made before they were; any dropped or
            # replaced by hand) and a view dropped by hand made again; a table
            # dropped is not made again empty (``replay --repair`` makes it).
            if not self.read_only and (_unguarded(found) or views < len(tables.ALL_VIEWS)):
                with self.writing() as cursor:
                    for name, statement in zip(GUARD_NAMES, GUARDS, strict=True):
                        cursor.execute(f"DROP TRIGGER IF EXISTS {name}")
                        cursor.execute(statement)
                    tables.create_views(cursor, self.dialect)
                    tables.create_log_views(cursor, self.dialect, self.stream, PROJECTIONS)
            return
        try:
            self.recorder.create_table()
        except IntegrityError:
            # Another process made the recorder's tables since this one looked
            # (its migration row is there now): look again, and go on.
            self.recorder = SQLiteProcessRecorder(self.datastore)
            self.recorder.create_table()
        with self.writing() as cursor:
            for statement in LOG_TABLES + GUARDS:
                cursor.execute(statement)
            tables.create(cursor, self.dialect)
            tables.create_log_views(cursor, self.dialect, self.stream, PROJECTIONS)
            tables.upgrade(cursor, self.dialect)  # a store of an earlier version
            cursor.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def _check_no_other_tables(self, cursor: sqlite3.Cursor) -> None:
        """A new ledger goes into a file of its own: one that holds other
        tables (a mistyped path to another database) is left as it is."""
        if others := _other_tables(cursor):
            raise not_a_ledger(self.url, self.path, others, "name a new file for the ledger")

    def decide(self, batch: list[dict[str, Any]], decider: Decider) -> list[Any]:
        """One writer at a time decides in its own transaction (``BEGIN IMMEDIATE``)."""
        return decide_here(self, batch, decider)

    @contextmanager
    def writing(self) -> Iterator[sqlite3.Cursor]:
        self._writable()
        committing = False
        try:
            with self._connection(commit=True) as pooled:
                cursor = pooled.cursor().sqlite_cursor
                cursor.execute("PRAGMA synchronous = FULL")
                cursor.execute("PRAGMA cache_size = -65536")
                cursor.execute(f"PRAGMA journal_size_limit = {int(WAL_LIMIT)}")
                try:
                    cursor.execute("BEGIN IMMEDIATE")
                    self._still_the_file()
                    yield cursor
                except BaseException:
                    cursor.connection.rollback()
                    raise
                committing = True
                cursor.connection.commit()
                self._fold_back(cursor)
        except (sqlite3.Error, PersistenceError) as error:  # the cause kept: see _busy
            failed = NotKept if _rolled_back(error, committing) else StoreUnavailable
            raise failed(f"store {self.url}: {describe(error, self.file)}") from error

    def _still_the_file(self) -> None:
        """Under the write lock: the path leads to the file this store opened.
        Removed, the file's connections would go on writing into a file no
        path leads to; replaced (a backup moved over it), into it through
        the old file's WAL files. Either way, what is reported appended would
        be lost."""
        now = _identity(self.file)
        if self._opened is None and now is not None:  # the store's first write made the file
            self._opened = now
        elif now is None or now != self._opened:
            what = "removed" if now is None else "replaced by another file"
            raise StoreUnavailable(
                f"store {self.url}: {self.file} was {what} while this "
                "process had it open; nothing more is written through it (open the store "
                "again)")

    def _writable(self) -> None:
        if self.read_only:
            raise StoreUnavailable(
                f"store {self.url}: {self.path} is not writable, and this command writes "
                "into the store (copy the file somewhere writable first)"
            )

    def _fold_back(self, cursor: sqlite3.Cursor) -> None:
        """After a commit: a write-ahead log grown past ``WAL_LIMIT`` is folded
        back and started again (SQLite's own checkpoint starts it again only
        when no reader is in it at that moment: a file's stream, decided
        while its last batch commits, or a dashboard polling, leave it
        growing with everything written). A store's first commit does not
        wait for readers (a one-shot writer beside a long read would hold the
        write lock that long, and the next one-shot after it); a stream's
        later commits wait up to ``FOLD_WAIT`` ms for readers' short reads to
        end. If one is still there, not again until the log has grown by
        another ``WAL_LIMIT``. The batch is committed whatever happens here."""
        waits, self._commits = (FOLD_WAIT if self._commits else 0), self._commits + 1
        try:
            size = os.path.getsize(os.path.realpath(self.file) + "-wal")
        except OSError:
            return
        if size <= (self._fold_at or WAL_LIMIT):
            return
        busy = 1
        with suppress(sqlite3.Error):
            try:
                cursor.execute(f"PRAGMA busy_timeout = {waits}")
                busy = cursor.execute("PRAGMA wal_checkpoint(RESTART)").fetchone()[0]
            finally:
                cursor.execute(f"PRAGMA busy_timeout = {self._busy_ms}")
        self._fold_at = size + WAL_LIMIT if busy else 0

    @contextmanager
    def _connection(self, commit: bool) -> Iterator[Any]:
        """A pooled connection, outside any transaction. A signal between a
        ``BEGIN`` and the ``try`` that ends it (Python raises
        ``KeyboardInterrupt`` between any two bytecodes) hands the connection
        back to the pool still in its transaction: rolled back here, or the
        next transaction on it fails (a ``replay`` stopped by Ctrl-C could
        not drop its scratch tables: "Safety level may not be changed inside
        a transaction")."""
        try:
            with self.datastore.get_connection(commit=commit) as pooled:
                raw = pooled.cursor().sqlite_cursor.connection
                if raw.in_transaction:
                    raw.rollback()
                yield pooled
        except (ConnectionPoolClosedError, sqlite3.ProgrammingError, PersistenceError) as error:
            # The same signal, between taking a connection and the ``with``
            # that gives it back, leaves this generator to be finalized after
            # the store closed (its connections closed with it): nothing is
            # left to roll back or give back to, and nothing to say at exit.
            closing = _finalized(error)
            if closing is None:
                raise
            raise closing from None  # still closing: nothing after the ``with`` runs

    def projecting(self, waits: float | None = None) -> Any:
        """A transaction for catching up the projection tables (bounded by the
        store's busy timeout, whatever ``waits`` says)."""
        return self.writing()

    def repairing(self) -> Any:
        """A write transaction: here, the projection tables are written only in
        the writers' own (``BEGIN IMMEDIATE``)."""
        return self.writing()

    def changing(self, cursor: Any) -> Any:
        """Readers never hold a lock a repair waits for (write-ahead log)."""
        return nullcontext()

    def holders(self, relations: list[str]) -> list[str]:
        return []

    @contextmanager
    def claimed(self, prefix: str) -> Iterator[Abandoned]:
        """A claim file beside the store's file (``<file>-<prefix>claim``),
        locked (``flock``) while the scratch tables are in use: the lock ends
        with the process, however it ends, and holds for every process that
        opens the same file (other containers sharing the volume too; SQLite's
        own locks do not hold across machines either)."""
        self._writable()  # nothing made beside a file no one may change
        base = os.path.realpath(self.file)
        path, descriptor = self._claim(base, prefix)
        try:
            yield partial(_abandoned, base)
        finally:
            with suppress(OSError):
                os.unlink(path)
            os.close(descriptor)

    def _claim(self, base: str, prefix: str) -> tuple[str, int]:
        """The claim file made and locked (the hashed name where the file
        system refuses the first as too long), with the store file's
        permissions (whoever may write the store may lock it on NFS); made
        again if another process removed it (telling it unclaimed) between
        the two."""
        plain, hashed = _claim_files(base, prefix)
        path = plain
        while True:
            try:
                descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
            except OSError as error:
                if error.errno == errno.ENAMETOOLONG and path == plain:
                    path = hashed
                    continue
                raise StoreUnavailable(
                    f"store {self.url}: cannot make {path} (a replay's claim on its scratch "
                    f"tables): {error.strerror}") from None
            with suppress(OSError):
                os.fchmod(descriptor, stat.S_IMODE(os.stat(base).st_mode) & 0o666)
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX)
                if os.fstat(descriptor).st_ino == os.stat(path).st_ino:
                    return path, descriptor
            except FileNotFoundError:
                pass
            except OSError as error:
                os.close(descriptor)
                raise StoreUnavailable(
                    f"store {self.url}: cannot lock {path} (a replay's claim on its scratch "
                    f"tables; its file system must support flock): {error.strerror}") from None
            os.close(descriptor)

    def keeping_grants(self, cursor: Any) -> Any:
        """SQLite has no grants: whoever may read the file reads every table."""
        return nullcontext()

    def guards(self, cursor: Any) -> Guards:
        """The guards that are not as made: only an open that may write the
        file makes them again (``_create_schema``)."""
        return Guards(
            _unguarded(_named(cursor, GUARD_NAMES)),
            f"open the store where its file may be written: any alloc-ledger command run by "
            f"a user who may write {self.path} makes them again")

    @contextmanager
    def reading(self) -> Iterator[sqlite3.Cursor]:
        try:
            with self._connection(commit=False) as pooled, pooled.transaction(commit=False) as cursor:
                yield cursor.sqlite_cursor
        except (sqlite3.Error, PersistenceError) as error:  # the cause kept: see _busy
            raise StoreUnavailable(f"store {self.url}: {describe(error, self.file)}") from error

    def load_nodes(self, cursor: Any, sql: Any, cluster: Any, nodes: set[str]) -> None:
        pass  # never called (``loads_many``): the cluster loads them one by one

    def preload(
        self, cursor: Any, sql: Any, cluster: Any, batch: list[dict[str, Any]], ids: bool = True
    ) -> None:
        """The allocations a batch places, and their addresses, that the caches
        miss, one query each: mostly new, so found absent. One lookup at a
        time, each would hand the GIL to the writer thread and wait to take
        it back (``ledger.pipeline``). What else a batch names is mostly
        held already, and loaded on demand."""
        placed = [e for e in batch if e["type"] == "alloc-placed"]
        allocs = {e["alloc"] for e in placed} - cluster.allocs.keys()
        addresses = {a for e in placed for a in e.get("addresses", ())} - cluster.addresses.keys()
        sqlite_writes.preload(cursor, sql.prefix, cluster, allocs, addresses)

    def head(self, cursor: Any) -> int:
        cursor.execute(
            "SELECT MAX(originator_version) FROM stored_events WHERE originator_id = ?",
            (self.stream,),
        )
        return cursor.fetchone()[0] or 0

    def head_and_repairs(self, cursor: Any) -> tuple[int, int, int]:
        cursor.execute(
            "SELECT (SELECT MAX(originator_version) FROM stored_events WHERE originator_id = ?), "
            "(SELECT notification_id FROM tracking WHERE application_name = ?), "
            "(SELECT MAX(notification_id) FROM tracking WHERE application_name = ?)",
            (self.stream, REPAIRS, PROJECTIONS),
        )
        head, repairs, applied = cursor.fetchone()
        return head or 0, repairs or 0, applied or 0

    def hash_at(self, cursor: Any, position: int) -> str | None:
        cursor.execute("SELECT hash FROM event_hashes WHERE position = ?", (position,))
        row = cursor.fetchone()
        return None if row is None else row[0]

    def known_end(self, cursor: Any) -> tuple[int, int]:
        cursor.execute("SELECT MAX(position) FROM event_hashes")
        return cursor.fetchone()[0] or 0, self.tracked(cursor)

    def tracked(self, cursor: Any) -> int:
        return self.recorder._max_tracking_id(PROJECTIONS, cursor) or 0

    def track(self, cursor: Any, position: int) -> None:
        self.recorder._insert_tracking(cursor, Tracking(PROJECTIONS, position))

    def set_tracked(self, cursor: Any, position: int) -> None:
        cursor.execute("UPDATE tracking SET notification_id = ? WHERE application_name = ?",
                       (position, PROJECTIONS))

    def known_ids(self, cursor: Any, ids: list[str]) -> dict[str, int]:
        if not ids:
            return {}
        cursor.execute(sqlite_writes.KNOWN_IDS, (sqlite_writes.as_json(ids),))
        return {row[0]: row[1] for row in cursor.fetchall()}

    def kept_at(self, cursor: Any, positions: list[int]) -> list[LoggedEvent]:
        cursor.execute(
            "SELECT originator_version, topic, COALESCE(CAST(state AS BLOB), x'') FROM stored_events "
            "WHERE originator_id = ? AND originator_version IN (SELECT value FROM json_each(?)) "
            "ORDER BY originator_version",
            (self.stream, sqlite_writes.as_json(positions)),
        )
        return [logged((row[0], row[1], bytes(row[2]))) for row in cursor.fetchall()]

    def write_rows(self, cursor: Any, sql: Any, changed: Any) -> None:
        sqlite_writes.write_rows(cursor, sql.prefix, changed)

    def write_kept(
        self, cursor: Any, sql: Any, events: list[LoggedEvent], hashes: list[tuple[int, str]],
        ids: list[tuple[str, int]], changed: Any,
    ) -> None:
        # Into the recorder's table, a statement per table (``sqlite_writes``):
        # its application recorder loops to fetch row ids the ledger does not
        # need (positions are the stream's versions), and its aggregate
        # recorder formats the stream's UUID again for every row.
        sqlite_writes.write_events(
            cursor, self.recorder.events_table_name, self.stream, events, hashes, ids)
        # the decision tables are the projection tables
        sqlite_writes.write_rows(cursor, sql.prefix, changed)

    def read_log(self, after: int, upto: int | None = None) -> Iterator[LoggedEvent]:
        """Kept events in order, a page per read transaction.

        Written through the library's recorder; read here with one plain
        SELECT on the same table, because replays read every event and the
        recorder's reader builds a UUID per row (a quarter of replay time).
        The library's connections build a ``sqlite3.Row`` per row; this
        cursor (a new one per transaction) fetches plain tuples instead
        (the Rows cost a tenth of a replay). A state is read as a BLOB even
        if it was rewritten as TEXT (tampering with ``replace()`` does), so
        that ``verify`` names the position rather than failing on the type.
        A page ends at ``PAGE`` events or once they reach ``PAGE_BYTES``: the
        rows after it are left unread, and the next page starts after it."""
        statement = (
            "SELECT originator_version, topic, COALESCE(CAST(state AS BLOB), x'') FROM stored_events "
            "WHERE originator_id = ? AND originator_version > ? AND originator_version <= ? "
            "ORDER BY originator_version LIMIT ?"
        )
        last = upto if upto is not None else 2**62
        while after < last:
            with self.reading() as cursor:
                cursor.row_factory = None
                cursor.execute(statement, (self.stream, after, last, PAGE))
                page, full = _page(cursor, PAGE_BYTES)
                cursor.close()  # the rows past a page ended by its bytes: never read
            yield from map(logged, page)
            if not full:
                return
            after = page[-1][0]
            del page  # not held while the next is read

    def search_log(
        self, cursor: Any, needle: str, after: int, upto: int, limit: int
    ) -> list[tuple[int, int]]:
        cursor.execute(
            "SELECT originator_version, length(CAST(state AS BLOB)) FROM stored_events "
            "WHERE originator_id = ? AND originator_version > ? AND originator_version <= ? "
            "AND instr(CAST(state AS BLOB), ?) > 0 ORDER BY originator_version LIMIT ?",
            (self.stream, max(after, 0), upto, needle.encode(), limit),  # (before 1: not the log's)
        )
        return [(row[0], row[1]) for row in cursor.fetchall()]

    def close(self) -> None:
        self.datastore.close()


def _page(cursor: sqlite3.Cursor, budget: int) -> tuple[list[Any], bool]:
    """The rows of a page, taken until their states reach ``budget`` bytes
    (the one that reaches it taken); whether the page is full (ended at its
    bytes or at ``PAGE`` rows), so that more may follow."""
    page: list[Any] = []
    take = page.append
    size = 0
    for row in cursor:
        take(row)
        size += len(row[2])
        if size >= budget:
            return page, True
    return page, len(page) == PAGE


def _finalized(error: BaseException | None) -> GeneratorExit | None:
    """The ``GeneratorExit`` behind ``error`` if it was raised while a
    generator was being closed (by the garbage collector: the exit itself,
    or an error on the way out of it)."""
    while error is not None:
        if isinstance(error, GeneratorExit):
            return error
        error = error.__context__
    return None
