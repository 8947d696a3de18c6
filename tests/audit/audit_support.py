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
import signal
import sqlite3
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # for scripts.simulate

from pg_support import pg_dsn

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


