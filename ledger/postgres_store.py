"""PostgreSQL: many writers on many machines share one log.

The log is eventsourcing's ``PostgresProcessRecorder`` (``stored_events`` and
``tracking``) in the schema the URL names (``?schema=name``, created when
missing). Beside it:

* ``event_ids`` and ``event_hashes`` (append-only, like ``stored_events``:
  a trigger refuses UPDATE, DELETE and TRUNCATE);
* the decision tables ``state_*``, which are decided against and updated in
  the transaction that appends, after taking the library's EXCLUSIVE lock on
  ``stored_events`` first: rules are race-free and positions gapless across
  processes and machines. By default writers hand their batches to one
  leader that decides them all (``ledger.postgres_handoff``); with
  ``?writers=lock`` each writer takes the lock in its own transaction;
* the public projection tables (``nodes``, ``slots``, …), kept by
  ``alloc-ledger project [--follow]`` in transactions that lock the tracking
  row (never the log), or by the writers themselves with ``?projections=inline``.

The store combines its jobs, each a class in a module of its own:
``postgres_connections`` (the URL's sessions), ``postgres_schema`` (made,
upgraded and mended on open; the log's guards: ``postgres_guards``),
``postgres_transactions`` (in pipeline mode: ``postgres_pipeline``),
``postgres_log`` and ``postgres_reporting``; ``postgres_errors`` tells a
database error in a line.

Only the ``ledger.postgres_*`` modules import psycopg, and only this one is
imported from outside them, when a PostgreSQL store is opened
(``ledger.store.open_store``); every cursor it hands out yields tuples.
"""

from __future__ import annotations

import os
import threading
from typing import Any
from urllib.parse import SplitResult, unquote

import psycopg
from eventsourcing.persistence import PersistenceError
from eventsourcing.postgres import PostgresDatastore

from ledger.postgres_connections import (
    APPLICATION,
    IDLE_IN_TRANSACTION,
    LIBPQ_OPTIONS,
    OPTIONS,
    SCHEMA_NAME,
    host_of,
)
from ledger.postgres_errors import describe
from ledger.postgres_handoff import Handoff, home_of
from ledger.postgres_log import PostgresLog
from ledger.postgres_pipeline import SyncingCursor, _Pipelined
from ledger.postgres_preload import Preload
from ledger.postgres_reporting import PostgresReporting
from ledger.postgres_schema import SCHEMA_VERSION, STATE_PREFIX, TRACKING, PostgresSchema
from ledger.postgres_writes import LogRecorder
from ledger.store import LEDGER_STREAM, Decider, decide_here, redacted

# The store; and, of the modules it combines, what tests import from here.
__all__ = ["SCHEMA_VERSION", "PostgresStore", "SyncingCursor", "_Pipelined"]


class PostgresStore(PostgresLog, PostgresReporting, PostgresSchema):
    dialect = "postgresql"
    param = "%s"
    # not the database's collation (en-US sorts "_z a b B", SQLite "B _z a b"):
    # an answer's order is the same on either store, and as of any position
    name_order = ' COLLATE "C"'
    state_prefix = STATE_PREFIX
    overlaps = False  # writers hand batches to a leader, which overlaps its own rounds
    loads_many = True  # a load is a round trip: a cascade loads its nodes a level at a time

    def __init__(
        self, url: str, parts: SplitResult, options: dict[str, str], create: bool = True
    ) -> None:
        self.url = url
        self.create = create
        self.shown = redacted(url)
        unknown = set(options) - OPTIONS
        if unknown:
            known = ", ".join(sorted(OPTIONS))
            self._fail(f"unknown option {min(unknown)!r} (known: {known})")
        self.schema = options.get("schema", "public")
        if len(self.schema) > 63:  # PostgreSQL's NAMEDATALEN - 1
            self._fail(f"schema name {self.schema!r} is {len(self.schema)} characters long, "
                       "more than PostgreSQL's 63")
        if not SCHEMA_NAME.fullmatch(self.schema):
            self._fail(f"schema name {self.schema!r} must be lower case letters, digits and _")
        if self.schema.startswith("pg_") or self.schema == "information_schema":
            self._fail(f"schema name {self.schema!r} is PostgreSQL's own (pg_… and "
                       "information_schema are the system's): choose another")
        inline = options.get("projections", "follow")
        if inline not in ("inline", "follow"):
            self._fail(f"projections={inline} must be inline or follow")
        self.projects_inline = inline == "inline"
        writers = options.get("writers", "combine")
        if writers not in ("lock", "combine"):
            self._fail(f"writers={writers} must be lock or combine")
        self.combines = writers == "combine"
        self.stream = LEDGER_STREAM
        self._local = threading.local()
        self._preload = Preload()
        self.schema_oid: int | None = None  # known once opened (``_check_and_create``)
        dbname = unquote(parts.path.lstrip("/"))
        if not dbname:  # libpq would pick one (the user's name, PGDATABASE): not the ledger's
            self._fail("the URL names no database (postgresql://user@host:port/db)")
        self.connect_args: dict[str, Any] = {
            "dbname": dbname,
            # as written (a socket's folder may be %2F-escaped: urlsplit would lower its case),
            # or as libpq's ?host= gives it (a socket's folder, several hosts)
            "host": options.get("host") or host_of(parts.netloc),
            "port": parts.port or 5432,
            "user": unquote(parts.username or ""),
            "password": unquote(parts.password or ""),
        }
        if "password" in options:  # as libpq reads it: for one that is awkward to escape
            if parts.password is not None:
                self._fail("the password is given twice: in the user part and as ?password=")
            self.connect_args["password"] = options["password"]
        timeout = self.connect_timeout = self._seconds(options, "connect_timeout", 5)
        self.handoff = Handoff(self, self._seconds(options, "timeout", 30))
        # Sessions are named in pg_stat_activity (the URL's name, if it gives one).
        self.named = "application_name" not in options
        # Added to PGOPTIONS, which libpq reads only when no options are given.
        given = os.environ.get("PGOPTIONS", "")
        extra = {"options": f"{given} -c search_path={self.schema}".strip(),
                 "application_name": APPLICATION}
        extra.update((k, v) for k, v in options.items() if k in LIBPQ_OPTIONS)
        self.extra = extra
        self._check_and_create(timeout, extra)
        self.handoff.home = home_of(self.schema_oid)
        try:
            self.datastore = PostgresDatastore(
                **self.connect_args, schema=self.schema, connect_timeout=timeout,
                # no pool_open_timeout: eventsourcing would call psycopg_pool's
                # open(wait=True) at every use, which asserts (and after its
                # timeout closes the pool for good) once two threads find the
                # pool's one connection taken; it is opened once, below
                pool_size=1, max_overflow=3,
                idle_in_transaction_session_timeout=IDLE_IN_TRANSACTION,
            )
            arguments = self.datastore.pool.kwargs  # every pooled connection's
            arguments.update(extra, cursor_factory=SyncingCursor)  # type: ignore[union-attr]
            # its one connection made before a first use asks for one (which,
            # finding none yet, would have the pool make another: a role's
            # CONNECTION LIMIT counts them)
            self.datastore.pool.open(wait=True, timeout=timeout)
            self.recorder = LogRecorder(self.datastore, tracking_table_name=TRACKING)
            self.datastore.register_type_adapters()
        except (PersistenceError, psycopg.Error) as error:
            self._fail(describe(error))

    def decide(self, batch: list[dict[str, Any]], decider: Decider) -> list[Any]:
        """Hand the batch to the writer that leads, which decides every waiting
        batch in one transaction (``ledger.postgres_handoff``), or
        (``?writers=lock``) take the log's lock and decide in this process's own."""
        if self.combines:
            return self.handoff.decide(batch, decider)
        return decide_here(self, batch, decider)

    def close(self) -> None:
        self.handoff.close()
        self.datastore.close()
