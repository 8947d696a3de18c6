"""Helpers for the audit tests: stores on both databases, the CLI as a user
runs it, simulated histories, and raw access to the stored log (as an
attacker with file access has it).

PostgreSQL tests run when ``ALLOC_LEDGER_TEST_PG`` names a server
(``postgresql://postgres@127.0.0.1:5432/test``); each gets a schema of its own.
"""

from __future__ import annotations

import io
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import orjson

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # for scripts.simulate

from pg_support import pg_dsn

from ledger.chain import GENESIS, Digest, link
from ledger.model import RULES
from ledger.store import Store
from scripts.simulate import generate

PG = pg_dsn()
SCRIPT = Path(sys.executable).parent / "alloc-ledger"
CLI = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "commands"]


def history(events: int, nodes: int = 20, slots: int = 4, seed: int = 7) -> list[dict[str, Any]]:
    """A realistic cluster history (with ids), as the simulator tells it."""
    return list(generate(events, nodes=nodes, slots=slots, seed=seed))


def texts(events: list[dict[str, Any]]) -> list[str]:
    """Events as the JSON lines a tool sends."""
    return [json.dumps(e, separators=(",", ":")) for e in events]


def jsonl(events: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(e, separators=(",", ":")).encode() + b"\n" for e in events)


def run(*args: str, url: str, stdin: bytes | None = None, timeout: float = 60,
        env: dict[str, str] | None = None, **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
    """``alloc-ledger --store URL ARGS`` in a process of its own."""
    return subprocess.run(  # noqa: PLW1510 - the exit code is what the tests judge
        [*CLI, "--store", url, *args], input=stdin, capture_output=True, timeout=timeout,
        env=None if env is None else os.environ | env, **kwargs,
    )


def spawn(*args: str, url: str) -> tuple[int, BinaryIO]:
    """``alloc-ledger --store URL ARGS`` forked from this process: the command's
    own code with its imports already loaded (a fresh interpreter takes most
    of a second), stdout into a pipe, stderr discarded. Returns (pid, stdout)."""
    readable, writable = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child never returns into the test
        code = 70
        try:
            os.close(readable)
            os.dup2(writable, 1)
            os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
            sys.stdout = io.TextIOWrapper(open(1, "wb", closefd=False), write_through=True)  # noqa: SIM115
            sys.stderr = io.TextIOWrapper(open(2, "wb", closefd=False), write_through=True)  # noqa: SIM115
            from commands.cli import cli

            cli.main(args=["--store", url, *args], prog_name="alloc-ledger")
            code = 0
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else 1
        finally:
            os._exit(code)
    os.close(writable)
    return pid, open(readable, "rb")


def kill(pid: int) -> int:
    """SIGKILL a spawned command and reap it; return its wait status."""
    os.kill(pid, signal.SIGKILL)
    return os.waitpid(pid, 0)[1]


def results(stdout: bytes) -> list[dict[str, Any]]:
    """The complete result lines a submit printed (a line cut by a kill is no result)."""
    return [json.loads(line) for line in stdout.split(b"\n")[:-1] if line.strip()]


def no_traceback(stderr: bytes | str) -> None:
    text = stderr.decode(errors="replace") if isinstance(stderr, bytes) else stderr
    assert "Traceback" not in text, text


def one_line_error(stderr: bytes) -> str:
    """Exactly one clear line on stderr, never a traceback."""
    no_traceback(stderr)
    lines = [line for line in stderr.decode(errors="replace").splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("Error: "), lines
    return lines[0]


# -- stores ------------------------------------------------------------------


def pg_url(schema: str) -> str:
    assert PG is not None
    return f"{PG}{'&' if '?' in PG else '?'}schema={schema}"


@dataclass
class StoreUnderTest:
    """A fresh store and an attacker's raw connection to its database."""

    url: str
    dialect: str
    schema: str | None = None
    path: Path | None = None

    def connect(self) -> Any:
        if self.dialect == "sqlite":
            assert self.path is not None
            return sqlite3.connect(self.path, isolation_level=None, timeout=10)
        import psycopg

        connection = psycopg.connect(PG.split("?", 1)[0], autocommit=True)  # type: ignore[union-attr]
        connection.execute(f'SET search_path TO "{self.schema}"')
        return connection

    @property
    def mark(self) -> str:
        return "?" if self.dialect == "sqlite" else "%s"

    def sql(self, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Run one statement as the attacker (``?`` marks parameters)."""
        connection = self.connect()
        try:
            if params:
                cursor = connection.execute(statement.replace("?", self.mark), params)
            else:
                cursor = connection.execute(statement)
            return list(cursor.fetchall()) if cursor.description else []
        finally:
            connection.close()

    def snapshot(self, *statements: str) -> list[list[tuple[Any, ...]]]:
        """Several statements as of one moment, in one read transaction: a
        killed writer's last COMMIT may still land on the server meanwhile."""
        connection = self.connect()
        try:
            connection.execute("BEGIN" if self.dialect == "sqlite" else
                                "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            found = [list(connection.execute(statement).fetchall()) for statement in statements]
            connection.execute("ROLLBACK")
            return found
        finally:
            connection.close()

    def columns(self, relation: str) -> list[str]:
        """The column names of a table or view, in order."""
        connection = self.connect()
        try:
            cursor = connection.execute(f"SELECT * FROM {relation} WHERE 1 = 0")
            return [d[0] for d in cursor.description]
        finally:
            connection.close()


def sqlite_store(directory: Path, name: str = "ledger.db") -> StoreUnderTest:
    path = directory / name
    return StoreUnderTest(f"sqlite:///{path}", "sqlite", path=path)


# -- an attacker with access to the database ------------------------------------


class Attacker:
    """Raw SQL on the stored log, guards dropped, as someone with file access."""

    def __init__(self, target: StoreUnderTest) -> None:
        self.target = target
        self.sql = target.sql
        self.events = self._events_table()

    def _events_table(self) -> str:
        if self.target.dialect == "sqlite":
            return "stored_events"
        found = self.sql(
            "SELECT table_name FROM information_schema.columns WHERE "
            "table_schema = current_schema() AND column_name = 'originator_version'"
        )
        assert found, "no table of stored events in the schema"
        return str(found[0][0])

    def drop_guards(self) -> None:
        guarded = (self.events, "event_hashes", "event_ids")
        if self.target.dialect == "sqlite":
            for (name,) in self.sql(
                "SELECT name FROM sqlite_master WHERE type = 'trigger' AND tbl_name IN (?, ?, ?)",
                guarded,
            ):
                self.sql(f'DROP TRIGGER "{name}"')
            return
        for name, table in self.sql(
            "SELECT tgname, tgrelid::regclass::text FROM pg_trigger WHERE NOT tgisinternal "
            "AND tgrelid IN (to_regclass(?), to_regclass(?), to_regclass(?))", guarded,
        ):
            self.sql(f'DROP TRIGGER "{name}" ON {table}')
        for name, table in self.sql(
            "SELECT rulename, tablename FROM pg_rules WHERE schemaname = current_schema() "
            "AND tablename IN (?, ?, ?)", guarded,
        ):
            self.sql(f'DROP RULE "{name}" ON {table}')

    def keep(self) -> None:
        self.sql(f"CREATE TABLE kept_events AS SELECT * FROM {self.events}")
        self.sql("CREATE TABLE kept_hashes AS SELECT * FROM event_hashes")
        self.sql("CREATE TABLE kept_ids AS SELECT * FROM event_ids")

    def restore(self) -> None:
        self.drop_guards()
        self.sql(f"DELETE FROM {self.events}")
        self.sql(f"INSERT INTO {self.events} SELECT * FROM kept_events")
        self.sql("DELETE FROM event_hashes")
        self.sql("INSERT INTO event_hashes SELECT * FROM kept_hashes")
        self.sql("DELETE FROM event_ids")
        self.sql("INSERT INTO event_ids SELECT * FROM kept_ids")

    def head(self) -> int:
        return int(self.sql(f"SELECT MAX(originator_version) FROM {self.events}")[0][0] or 0)

    def event(self, position: int) -> tuple[str, bytes]:
        topic, state = self.sql(
            f"SELECT topic, state FROM {self.events} WHERE originator_version = ?", (position,)
        )[0]
        return str(topic), bytes(state)

    # -- tampering ---------------------------------------------------------------

    def edit(self, position: int, rng: random.Random) -> None:
        """Change one byte of an event's stored payload."""
        _, state = self.event(position)
        at = rng.randrange(len(state))
        forged = state[:at] + bytes([(state[at] + rng.randrange(1, 255)) % 256]) + state[at + 1:]
        self.sql(f"UPDATE {self.events} SET state = ? WHERE originator_version = ?",
                 (forged, position))

    def delete(self, position: int) -> None:
        self.sql(f"DELETE FROM {self.events} WHERE originator_version = ?", (position,))

    def insert(self, position: int) -> None:
        """Slip a forged event in at a position, moving the later ones up."""
        self.sql(f"UPDATE {self.events} SET originator_version = -(originator_version + 1) "
                 "WHERE originator_version >= ?", (position,))
        self.sql(f"UPDATE {self.events} SET originator_version = -originator_version "
                 "WHERE originator_version < 0")
        _, state = self.event(position + 1)
        self.sql(
            f"INSERT INTO {self.events} (originator_id, originator_version, topic, state) "
            f"SELECT originator_id, ?, 'node-removed', ? FROM {self.events} "
            "WHERE originator_version = ?",
            (position, state.replace(b'"type":"', b'"type":"x', 1), position + 1),
        )

    def append_unchained(self, event: dict[str, Any]) -> int:
        """Append a well-formed event after the head, kept as the ledger keeps
        one, but without its chain hash."""
        head = self.head()
        topic, _ = self.event(1)  # a node registered: appended
        state = orjson.dumps({"event": event, "recorded_at": event["at"], "rules": RULES})
        self.sql(
            f"INSERT INTO {self.events} (originator_id, originator_version, topic, state) "
            f"SELECT originator_id, ?, ?, ? FROM {self.events} WHERE originator_version = 1",
            (head + 1, topic, state),
        )
        return head + 1

    def swap(self, first: int, second: int) -> None:
        one, two = self.event(first), self.event(second)
        for position, (topic, state) in ((first, two), (second, one)):
            self.sql(f"UPDATE {self.events} SET topic = ?, state = ? WHERE originator_version = ?",
                     (topic, state, position))

    def drop_hash(self, position: int) -> None:
        self.sql("DELETE FROM event_hashes WHERE position = ?", (position,))

    def extra_hash(self, position: int) -> None:
        self.sql("INSERT INTO event_hashes (position, hash) VALUES (?, ?)", (position, "ab" * 32))

    def edit_hash(self, position: int) -> None:
        self.sql("UPDATE event_hashes SET hash = ? WHERE position = ?", ("cd" * 32, position))

    def rewrite(self, position: int, rng: random.Random) -> None:
        """Edit an event and recompute every chain hash after it: the kept
        chain is consistent again; only a digest kept elsewhere tells."""
        self.drop_guards()  # again: opening the store since may have put the ids' back
        self.sql("DELETE FROM event_ids WHERE position = ?", (position,))
        self.edit(position, rng)
        client = readable_id(self.event(position)[1])
        if client is not None:
            self.sql("INSERT INTO event_ids (id, position) VALUES (?, ?)", (client, position))
        previous = GENESIS
        if position > 1:
            previous = str(self.sql("SELECT hash FROM event_hashes WHERE position = ?",
                                    (position - 1,))[0][0])
        for at in range(position, self.head() + 1):
            topic, state = self.event(at)
            previous = link(previous, at, topic, state)
            self.sql("UPDATE event_hashes SET hash = ? WHERE position = ?", (previous, at))

    def truncate(self, count: int) -> None:
        """Cut the last events off, hashes and client ids all."""
        self.drop_guards()
        last = self.head()
        self.sql(f"DELETE FROM {self.events} WHERE originator_version > ?", (last - count,))
        self.sql("DELETE FROM event_hashes WHERE position > ?", (last - count,))
        self.sql("DELETE FROM event_ids WHERE position > ?", (last - count,))


def readable_id(state: bytes) -> str | None:
    """The client id in a kept state, as ``verify`` reads it (None if unreadable)."""
    try:
        found = orjson.loads(state)["event"].get("id")
    except (ValueError, LookupError, TypeError, AttributeError):
        return None
    return found if isinstance(found, str) else None


@dataclass
class Attack:
    """A log with a digest kept elsewhere, and an attacker who dropped its guards."""

    target: StoreUnderTest
    store: Store
    digest: Digest
    attacker: Attacker
