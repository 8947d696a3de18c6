"""The PostgreSQL store behaves like the SQLite one (SPEC section 5).

Most tests run against both stores through ``store_url``; the parity test
tells one simulated history to both and compares every answer; the rest
cover what only PostgreSQL has (schemas, decision tables, inline
projections, connection errors).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sqlite3
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from ledger.application import Ledger
from ledger.errors import StoreUnavailable
from ledger.postgres_store import SCHEMA_VERSION
from ledger.store import open_store, scratch_prefix
from projections.projector import Projector
from projections.replay import Scratch
from scripts.simulate import generate

QUESTIONS = [
    ["needs-reconnect", "--now", "2026-01-01T01:00:00Z"],
    ["zombie-slots"], ["slots"], ["nodes"], ["allocs"], ["addresses"], ["suspects"],
    ["rejections"],
]
DECISION_TABLES = ("nodes", "slots", "allocations", "addresses")


def option(url: str, extra: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}{extra}"


def story(url: str) -> list[tuple[str, int | None, str | None]]:
    """A short cluster story with every kind of answer: appended, rejected, duplicate."""
    with Ledger.open(url) as ledger:
        events = [
            {"type": "node-registered", "node": "n1", "slots": 2},
            {"type": "heartbeat", "node": "n1"},
            {"type": "alloc-placed", "alloc": "a1", "node": "n1", "slot": 0,
             "addresses": ["10.0.0.5"], "max_disconnect": 60, "id": "p-a1"},
            {"type": "alloc-placed", "alloc": "a2", "node": "n1", "slot": 0},
            {"type": "alloc-placed", "alloc": "a1", "node": "n1", "slot": 1},
            {"type": "alloc-placed", "alloc": "t2", "node": "n1", "addresses": ["10.0.0.5"]},
            {"type": "alloc-placed", "alloc": "a1", "node": "n1", "slot": 0,
             "addresses": ["10.0.0.5"], "max_disconnect": 60, "id": "p-a1"},
            {"type": "alloc-updated", "alloc": "a1", "client_status": "running"},
            {"type": "heartbeat-missed", "node": "n1"},
        ]
        return [(r.status, r.position, r.error) for r in (ledger.submit(e) for e in events)]


def test_the_rules_answer_alike_in_both_stores(store_url, tables, project):
    receipts = story(store_url)

    assert receipts == [
        ("appended", 1, None),
        ("appended", 2, None),
        ("appended", 3, None),
        ("rejected", 4, "slot n1#0 is already held by allocation a1"),
        ("rejected", 5, "allocation a1 already holds slot n1#0"),
        ("rejected", 6, "address 10.0.0.5 is still held by allocation a1, which has not shut down"),
        ("duplicate", 3, None),
        ("appended", 7, None),
        ("appended", 8, None),
    ]
    project(store_url)
    read = tables(store_url)
    assert read.value("SELECT client_status FROM allocations WHERE alloc = ?", "a1") == "unknown"
    assert [r["alloc"] for r in read.rows("SELECT alloc FROM needs_reconnect")] == ["a1"]
    assert read.value("SELECT COUNT(*) FROM rejections") == 3


def test_the_log_positions_view_tells_each_position_s_type_and_times(store_url, tables, project):
    """A reporting role may not read the log: ``log_positions`` turns a
    ``since_position`` into a time (and tells the refused events)."""
    with Ledger.open(store_url) as ledger:
        for event in (
            {"type": "node-registered", "node": "n1", "at": "2026-01-01T12:00:00Z"},
            {"type": "alloc-placed", "alloc": "a1", "node": "n1", "at": "2026-01-01T12:00:05+01:00"},
            {"type": "heartbeat", "node": "n1", "at": "2026-01-01T12:00:10.5Z"},
            {"type": "node-down", "node": "n1", "at": "2026-01-01T12:01:00Z"},
            {"type": "heartbeat-missed", "node": "n1"},
        ):
            ledger.submit(event)
    project(store_url)
    read = tables(store_url)

    rows = read.rows("SELECT * FROM log_positions ORDER BY position")

    assert [(r["position"], r["type"], r["at"], r["rejected"]) for r in rows[:4]] == [
        (1, "node-registered", "2026-01-01T12:00:00.000000Z", 0),
        (2, "alloc-placed", "2026-01-01T11:00:05.000000Z", 1),  # n1 is initializing
        (3, "heartbeat", "2026-01-01T12:00:10.500000Z", 0),
        (4, "node-down", "2026-01-01T12:01:00.000000Z", 0),
    ]
    assert list(rows[0]) == ["position", "type", "at", "recorded_at", "rejected"]
    assert rows[4]["at"] == rows[4]["recorded_at"]  # no at: the time received
    assert all(len(r["recorded_at"]) == 27 and r["recorded_at"].endswith("Z") for r in rows)
    assert read.rows(
        "SELECT n.node, n.status, p.at AS since FROM nodes n "
        "JOIN log_positions p ON p.position = n.since_position"
    ) == [{"node": "n1", "status": "down", "since": "2026-01-01T12:01:00.000000Z"}]


def test_positions_and_ids_survive_reopening(store_url):
    story(store_url)

    with Ledger.open(store_url) as ledger:
        again = ledger.submit({"type": "alloc-placed", "alloc": "zz", "node": "n1", "id": "p-a1"})
        after = ledger.submit({"type": "heartbeat", "node": "n1"})

    assert (again.status, again.position) == ("invalid", None)  # another event under p-a1
    assert "(alloc-placed at position 3; addresses, alloc, max_disconnect, slot differ)" in (
        again.error)
    assert (after.status, after.position) == ("appended", 9)


def test_one_simulated_history_gives_the_same_answers_in_both_stores(
    tmp_path, pg_url, tables, replayed, alloc_ledger
):
    sqlite_url = f"sqlite:///{tmp_path}/l.db"
    history = [json.dumps(e) for e in generate(3000, nodes=30, slots=4, seed=11)] + [
        json.dumps({"at": "2026-01-02T00:00:00Z", **event}) for event in (
            {"type": "alloc-placed", "alloc": "race-1", "node": "n00001", "slot": 0},
            {"type": "alloc-placed", "alloc": "race-2", "node": "n00001", "slot": 0},
            {"type": "heartbeat", "node": "nobody"},
            {"type": "heartbeat", "node": 7},
        )
    ]
    receipts = {}
    for url in (sqlite_url, pg_url):
        with Ledger.open(url) as ledger:
            receipts[url] = [r.as_dict() for r in ledger.submit_many(history, batch=250)]

    assert receipts[sqlite_url] == receipts[pg_url]
    assert {r["status"] for r in receipts[pg_url]} == {"appended", "rejected", "invalid"}
    for question in QUESTIONS:
        answers = [
            alloc_ledger("query", *question, "--wait", "--format", "json", url=url)
            for url in (sqlite_url, pg_url)
        ]
        assert [a.returncode for a in answers] == [0, 0], answers
        assert json.loads(answers[0].stdout) == json.loads(answers[1].stdout), question
    assert tables(pg_url).snapshot() == tables(sqlite_url).snapshot()
    assert tables(pg_url).snapshot() == replayed(pg_url)


def test_as_of_and_history_read_the_log(store_url, alloc_ledger):
    story(store_url)

    slots = alloc_ledger("query", "slots", "--as-of", "2", "--format", "json", url=store_url)
    history = alloc_ledger("query", "history", "10.0.0.5", "--format", "json", url=store_url)

    assert slots.returncode == 0, slots.stderr
    assert [s["state"] for s in json.loads(slots.stdout)] == ["free", "free"]
    assert history.returncode == 0, history.stderr
    assert [(h["position"], h["status"]) for h in json.loads(history.stdout)] == [
        (3, "appended"), (5, "rejected"), (6, "rejected"),  # 5: a1, its holder, again
    ]



def answers(cluster) -> list[tuple]:
    """Every projection row of a replayed cluster, in a stable order."""
    from projections.asof import materialize

    connection = materialize(cluster)
    try:
        return [row for table in sorted(DECISION_TABLES + ("alloc_states", "rejections"))
                for row in connection.execute(f"SELECT * FROM {table} ORDER BY 1, 2")]
    finally:
        connection.close()


@pytest.mark.parametrize("rewritten", ["its bytes", "readable text"])
def test_a_checkpoint_whose_state_was_rewritten_as_text_is_replaced_by_the_next_as_of_query(
    store_url, request, tables, monkeypatch, rewritten
):
    """A DBA or a tool rewrote a checkpoint's state as TEXT (on SQLite one
    row's; on PostgreSQL the column's type, so every row's): the as-of query
    that passes over it answers right from an earlier start, drops it and
    keeps a fresh one, from which the next as-of query starts."""
    from projections.asof import AsOf, rebuild

    with Ledger.open(store_url) as ledger:
        list(ledger.submit_many(list(generate(60, nodes=5, slots=2, seed=4)), batch=7))
        rebuild(ledger.store, AsOf(position=40), every=10)
    if store_url.startswith("postgres"):
        schema = request.getfixturevalue("pg_schema")
        request.getfixturevalue("pg_admin")(
            f"ALTER TABLE {schema}.checkpoints ALTER COLUMN state TYPE text"
            + ("" if rewritten == "its bytes" else " USING encode(state, 'base64')"))
    else:
        with contextlib.closing(sqlite3.connect(urlsplit(store_url).path[1:])) as db, db:
            db.execute("UPDATE checkpoints SET state = "
                       + ("CAST(state AS TEXT)" if rewritten == "its bytes" else "hex(state)")
                       + " WHERE position = 40")
    store = open_store(store_url)
    starts: list[int] = []  # where each stretch of a replay starts reading the log
    read_log = store.read_log
    monkeypatch.setattr(store, "read_log", lambda after, upto=None: (
        starts.append(after), read_log(after, upto))[1])
    try:
        first, _ = rebuild(store, AsOf(position=45), every=10)
        first_start, starts[:] = starts[0], []
        second, _ = rebuild(store, AsOf(position=45), every=10)
        second_start = starts[0]
        scratch, _ = rebuild(store, AsOf(position=45), every=0)
    finally:
        store.close()

    assert first_start == (0 if store_url.startswith("postgres") else 30)  # passed over
    assert second_start == 40  # the fresh one
    assert answers(first) == answers(second) == answers(scratch)
    assert [r["position"] for r in tables(store_url).rows(
        "SELECT position FROM checkpoints ORDER BY 1")] == [10, 20, 30, 40]


GUARDED = [
    "UPDATE stored_events SET topic = 'forged'",
    "DELETE FROM stored_events",
    "UPDATE event_hashes SET hash = 'forged'",
    "DELETE FROM event_hashes",
    "UPDATE event_ids SET position = 99",
    "DELETE FROM event_ids",
]


@pytest.mark.parametrize("statement", GUARDED)
def test_the_event_log_is_append_only_in_the_database(store_url, statement, tables):
    story(store_url)
    store = open_store(store_url)

    try:
        with pytest.raises(StoreUnavailable, match="append-only"), store.writing() as cursor:
            cursor.execute(statement)
    finally:
        store.close()

    assert tables(store_url).head() == 8


def test_a_store_made_before_the_ids_were_guarded_is_guarded_when_next_opened(
    store_url, request, tables
):
    story(store_url)
    if store_url.startswith("postgres"):
        schema = request.getfixturevalue("pg_schema")
        request.getfixturevalue("pg_admin")(
            f"DROP TRIGGER event_ids_append_only ON {schema}.event_ids; "
            f"DROP TRIGGER event_ids_no_truncate ON {schema}.event_ids")
    else:
        with contextlib.closing(sqlite3.connect(urlsplit(store_url).path[1:])) as old, old:
            old.execute("DROP TRIGGER event_ids_append_only_update")
            old.execute("DROP TRIGGER event_ids_append_only_delete")

    store = open_store(store_url, create=False)
    try:
        with pytest.raises(StoreUnavailable, match="append-only"), store.writing() as cursor:
            cursor.execute("DELETE FROM event_ids")
    finally:
        store.close()
    assert tables(store_url).value("SELECT COUNT(*) FROM event_ids") > 0


@pytest.mark.parametrize("table", ["stored_events", "event_hashes", "event_ids"])
def test_even_the_owner_cannot_truncate_the_log(pg_url, pg_schema, pg_admin, table):
    story(pg_url)

    with pytest.raises(Exception, match="append-only"):
        pg_admin(f"TRUNCATE {pg_schema}.{table}")


# -- PostgreSQL only ------------------------------------------------------------


def test_the_schema_is_created_when_missing_and_schemas_are_separate_ledgers(
    pg_url, pg_schema, pg_admin, tables
):
    other_schema = f"{pg_schema}_b"
    other = pg_url.replace(f"schema={pg_schema}", f"schema={other_schema}")
    try:
        story(pg_url)
        with Ledger.open(other) as ledger:
            first = ledger.submit({"type": "node-registered", "node": "solo"})
        assert first.position == 1
        assert tables(pg_url).head() == 8
    finally:
        pg_admin(f"DROP SCHEMA IF EXISTS {other_schema} CASCADE")


def test_writers_decide_against_their_own_tables_and_projections_follow(
    pg_url, tables, replayed, project
):
    story(pg_url)
    read = tables(pg_url)

    assert read.value("SELECT client_status FROM state_allocations WHERE alloc = 'a1'") == "unknown"
    assert read.rows("SELECT * FROM allocations") == []
    assert read.tracked() == 0
    # decisions read neither log: the writers keep them out of their tables
    assert read.rows("SELECT * FROM state_alloc_states") == []
    assert read.rows("SELECT * FROM state_rejections") == []

    project(pg_url)

    assert read.tracked() == 8
    assert read.snapshot() == replayed(pg_url)


def test_inline_projections_keep_the_tables_current_in_the_writers_transaction(
    pg_url, tables, replayed
):
    inline = option(pg_url, "projections=inline")
    story(inline)
    read = tables(inline)

    assert read.tracked() == 8
    assert read.snapshot() == replayed(inline)
    assert read.rows("SELECT value, position FROM alloc_states") == [{"value": "unknown", "position": 8}]


def test_an_inline_writer_waits_for_a_follower_mid_catch_up_and_applies_nothing_twice(
    pg_url, tables, replayed
):
    """A writer that projects inline takes the tracking row with the log's
    lock: while a follower's catch-up is in flight it waits, then goes on
    from where the follower left the tables, applying nothing twice."""
    story(pg_url)  # kept, not projected: a rejection and an alloc state among them
    inline = option(pg_url, "projections=inline&writers=lock")
    receipts = []

    def write() -> None:
        with Ledger.open(inline) as ledger:
            receipts.append(ledger.submit({"type": "node-registered", "node": "n9"}))

    follower = open_store(pg_url)
    try:
        with follower.projecting() as cursor:
            assert Projector(follower).catch_up(cursor) == 8
            writer = threading.Thread(target=write)
            writer.start()
            writer.join(timeout=1)
            assert writer.is_alive()  # waiting for the follower's transaction
    finally:
        follower.close()
    writer.join(timeout=30)

    assert [r.status for r in receipts] == ["appended"]
    read = tables(pg_url)
    assert read.tracked() == read.head() == 9
    assert read.snapshot() == replayed(pg_url)


# -- errors ---------------------------------------------------------------------


@pytest.fixture
def server(pg_dsn) -> dict[str, str]:
    parts = urlsplit(pg_dsn)
    return {
        "where": f"{parts.hostname}:{parts.port or 5432}",
        "database": parts.path.lstrip("/"),
        "user": parts.username or "",
    }


@pytest.fixture
def fails_to_open(alloc_ledger):
    def check(url: str, reason: str, command: tuple[str, ...] = ("query", "nodes")) -> str:
        result = alloc_ledger(*command, url=url)
        assert result.returncode == 3, result
        assert result.stdout == ""
        lines = result.stderr.splitlines()
        assert len(lines) == 1, result.stderr
        assert lines[0].startswith("Error: cannot open store postgresql://"), lines[0]
        assert reason in lines[0], lines[0]
        return lines[0]

    return check


@pytest.mark.parametrize(("host", "named"), [
    ("127.0.0.1:1", "127.0.0.1:1"),
    ("[::1]:1", "::1:1"),  # an IPv6 address, its brackets the URL's, not the host's
    ("%2Fno%2FSuch:1", "/no/Such:1"),  # a socket's folder, escaped, its case kept
])
def test_an_unreachable_server_is_exit_3_in_one_line(server, fails_to_open, host, named):
    fails_to_open(f"postgresql://{server['user']}@{host}/{server['database']}",
                  f"server {named} unreachable")


def test_a_missing_database_is_exit_3_in_one_line(server, fails_to_open):
    fails_to_open(f"postgresql://{server['user']}@{server['where']}/no_such_database_here",
                  'database "no_such_database_here" does not exist')


@pytest.mark.parametrize("path", ["", "/"])
def test_a_url_without_a_database_is_refused_before_connecting(server, monkeypatch, path):
    """libpq would pick a database itself (the user's name): a ledger there
    is not the one meant."""
    import psycopg

    def connect(*args: object, **kwargs: object) -> None:
        raise AssertionError("connected")

    monkeypatch.setattr(psycopg, "connect", connect)
    with pytest.raises(StoreUnavailable, match=(
        r"^cannot open store postgresql://[^ ]+: the URL names no database "
        r"\(postgresql://user@host:port/db\)$"
    )):
        open_store(f"postgresql://{server['user']}@{server['where']}{path}?schema=nowhere")


def test_a_writer_given_a_url_without_a_database_is_exit_3_and_writes_nowhere(
    server, pg_schema, alloc_ledger
):
    import psycopg

    url = f"postgresql://{server['user']}@{server['where']}?schema={pg_schema}"
    default = f"postgresql://{server['user']}@{server['where']}/{server['user'] or 'postgres'}"
    try:
        result = alloc_ledger("submit", "heartbeat", "--node", "x", url=url)
    finally:  # libpq's default database (the user's name) would hold the ledger: drop it
        with psycopg.connect(default, autocommit=True) as connection:
            made = connection.execute(
                "SELECT 1 FROM pg_namespace WHERE nspname = %s", (pg_schema,)).fetchall()
            connection.execute(f"DROP SCHEMA IF EXISTS {pg_schema} CASCADE")

    refused = (f"Error: cannot open store {url}: the URL names no database "
               "(postgresql://user@host:port/db)")
    assert (result.returncode, result.stdout, result.stderr.splitlines()) == (3, "", [refused])
    assert made == []


def test_an_unknown_role_is_exit_3_in_one_line_without_showing_its_password(
    server, fails_to_open
):
    line = fails_to_open(f"postgresql://no_such_role:s3cret@{server['where']}/{server['database']}",
                         'role "no_such_role" does not exist')
    assert "s3cret" not in line
    assert "no_such_role:***@" in line


def _password_ignored(url: str) -> bool:
    """Whether the server lets a wrong password in (pg_hba ``trust``)."""
    import psycopg

    try:
        psycopg.connect(url.split("?", 1)[0], connect_timeout=10).close()
    except psycopg.OperationalError:
        return False
    return True


def test_a_wrong_password_is_exit_3_in_one_line(server, pg_admin, alloc_ledger, fails_to_open):
    role = f"pw_{time.time_ns()}"
    pg_admin(f"CREATE ROLE {role} LOGIN PASSWORD 'right-one'")
    try:
        url = f"postgresql://{role}:wrong-one@{server['where']}/{server['database']}?schema={role}"
        if _password_ignored(url):  # asked of the server, not of the code under test
            pytest.skip("this server trusts the connection (pg_hba trust): passwords are not checked")
        line = fails_to_open(url, f'password authentication failed for user "{role}"')
        assert "wrong-one" not in line
    finally:
        pg_admin(f"DROP SCHEMA IF EXISTS {role} CASCADE")
        pg_admin(f"DROP OWNED BY {role}")
        pg_admin(f"DROP ROLE {role}")


class RefusingServer:
    """Speaks just enough of the PostgreSQL protocol to ask for a password and
    refuse it, as a server with password authentication does (SQLSTATE 28P01)."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.passwords: list[str] = []  # as the clients sent them
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                connection, _ = self.listener.accept()
                with connection:
                    self._refuse(connection)

    @staticmethod
    def _read(connection: socket.socket, size: int) -> bytes:
        data = b""
        while len(data) < size:
            chunk = connection.recv(size - len(data))
            if not chunk:
                raise OSError("client went away")
            data += chunk
        return data

    def _refuse(self, connection: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while True:  # SSL and GSS encryption requests: "N", no
                length, code = struct.unpack("!ii", self._read(connection, 8))
                if code not in (80877103, 80877104):
                    break
                connection.sendall(b"N")
            startup = self._read(connection, length - 8).split(b"\0")
            user = startup[startup.index(b"user") + 1].decode()
            connection.sendall(b"R" + struct.pack("!ii", 8, 3))  # cleartext password, please
            _, length = struct.unpack("!ci", self._read(connection, 5))
            self.passwords.append(self._read(connection, length - 4).rstrip(b"\0").decode())
            fields = [b"SFATAL", b"VFATAL", b"C28P01",
                      f'Mpassword authentication failed for user "{user}"'.encode()]
            body = b"".join(f + b"\0" for f in fields) + b"\0"
            connection.sendall(b"E" + struct.pack("!i", len(body) + 4) + body)

    def close(self) -> None:
        self.listener.close()


@pytest.mark.parametrize(("given", "password"), [
    ("ops:wrong-one@{host}/ledger", "wrong-one"),
    ("ops:p%40ss%3Aw%2Frd@{host}/ledger", "p@ss:w/rd"),
    ("ops@{host}/ledger?password=wrong-one", "wrong-one"),  # as libpq reads it too
    ("ops@{host}/ledger?password=p%40ss%3Aw%2Frd%26x", "p@ss:w/rd&x"),
    ("ops@{host}/ledger?password=a+b%2Bc", "a+b+c"),  # a '+' is no space to libpq
], ids=["in the user part", "escaped in the user part", "as a parameter", "escaped as a parameter",
        "with a plus sign"])
def test_a_refused_password_is_exit_3_in_one_line_without_showing_it(
    fails_to_open, given, password
):
    server = RefusingServer()
    try:
        line = fails_to_open(f"postgresql://{given.format(host=f'127.0.0.1:{server.port}')}",
                             'password authentication failed for user "ops"')
    finally:
        server.close()

    assert server.passwords and set(server.passwords) == {password}  # sent as given
    assert password not in line and "wrong-one" not in line


def test_a_password_given_twice_is_refused(fails_to_open):
    line = fails_to_open("postgresql://ops:s3cret-1@127.0.0.1:1/ledger?password=s3cret-2",
                         "the password is given twice: in the user part and as ?password=")
    assert "s3cret" not in line  # refused before connecting: port 1 is never asked


@pytest.mark.parametrize("extra, reason", [
    ("schema=Bad-Name", "schema name 'Bad-Name'"),
    ("schema=user", "schema name 'user' is an SQL keyword: choose another"),  # was a syntax error
    ("schema=default", "schema name 'default' is an SQL keyword: choose another"),
    *((f"schema={system}", (f"schema name '{system}' is PostgreSQL's own (pg_… and "
       "information_schema are the system's): choose another"))  # a superuser made a ledger
      for system in ("information_schema", "pg_catalog", "pg_toast", "pg_temp_3")),
    ("schema=" + "a" * 64, (f"schema name '{'a' * 64}' is 64 characters long, more than "
     "PostgreSQL's 63")),
    ("projections=sometimes", "projections=sometimes"),
    ("colour=blue", "unknown option 'colour'"),
    ("writers=all", "writers=all must be lock or combine"),
    ("timeout=soon", "timeout=soon must be a finite number of seconds above 0"),
    ("connect_timeout=inf", "connect_timeout=inf must be a finite number of seconds above 0"),
])
def test_a_bad_url_is_exit_3_in_one_line(pg_dsn, fails_to_open, extra, reason):
    fails_to_open(option(pg_dsn, extra), reason)


def test_a_role_whose_connection_limit_a_combining_writer_exceeds_is_told_why(
    pg_dsn, pg_schema, pg_admin, alloc_ledger, fails_to_open
):
    """A default writer opens up to 6 connections; a lock writer one."""
    role = pg_schema  # fresh and unique
    pg_admin(f"CREATE ROLE {role} LOGIN CONNECTION LIMIT 4")
    pg_admin(f"CREATE SCHEMA {pg_schema} AUTHORIZATION {role}")
    try:
        parts = urlsplit(pg_dsn)
        url = f"postgresql://{role}@{parts.hostname}:{parts.port or 5432}{parts.path}?schema={pg_schema}"
        done = alloc_ledger("submit", "node-registered", "--node", "n1", url=f"{url}&timeout=3")
        assert done.returncode == 3, done
        assert done.stderr == (
            f"Error: cannot open store {url}&timeout=3: too many connections for role "
            f'"{role}" (a writer opens up to 6 connections when writers combine (the default), '
            "one with &writers=lock, other commands one (a replay two); raise the role's "
            "CONNECTION LIMIT or use &writers=lock)\n")
        locked = alloc_ledger("submit", "node-registered", "--node", "n1",
                              url=f"{url}&writers=lock")
        assert locked.returncode == 0, locked
    finally:
        pg_admin(f"DROP SCHEMA IF EXISTS {pg_schema} CASCADE")
        pg_admin(f"DROP OWNED BY {role}")
        pg_admin(f"DROP ROLE {role}")


@contextlib.contextmanager
def _own_role_store(pg_dsn, pg_schema, pg_admin, alloc_ledger, *settings: str,
                    told: tuple[str, ...] = ("node-registered", "heartbeat")):
    """A store in a fresh schema owned by a fresh role (``settings``: ALTER
    ROLE clauses), the events ``told`` (of node n1) in it: its URL (``writers=lock``)."""
    role = pg_schema  # fresh and unique
    pg_admin(f"CREATE ROLE {role} LOGIN")
    for setting in settings:
        pg_admin(f"ALTER ROLE {role} {setting}")
    pg_admin(f"CREATE SCHEMA {pg_schema} AUTHORIZATION {role}")
    try:
        parts = urlsplit(pg_dsn)
        url = (f"postgresql://{role}@{parts.hostname}:{parts.port or 5432}{parts.path}"
               f"?schema={pg_schema}&writers=lock")
        for event in told:
            assert alloc_ledger("submit", event, "--node", "n1", url=url).returncode == 0
        yield url
    finally:
        pg_admin(f"DROP SCHEMA IF EXISTS {pg_schema} CASCADE")
        pg_admin(f"DROP OWNED BY {role}")
        pg_admin(f"DROP ROLE {role}")


def test_replay_needs_two_connections_and_says_so_when_the_role_allows_one(
    pg_dsn, pg_schema, pg_admin, alloc_ledger
):
    """A replay holds its pooled connection and the session that claims its
    scratch tables (it tells abandoned ones on that same session): two."""
    role = pg_schema
    with _own_role_store(pg_dsn, pg_schema, pg_admin, alloc_ledger, "CONNECTION LIMIT 2") as url:
        store = open_store(url, create=False)
        try:  # a replay killed: its scratch tables left, told abandoned by the next
            left = scratch_prefix()
            with store.claimed(left):
                Scratch(store, left).create()
        finally:
            store.close()
        replayed = alloc_ledger("replay", url=url)
        assert replayed.returncode == 0, replayed
        assert pg_admin(
            "SELECT count(*) FROM information_schema.tables "
            f"WHERE table_schema = '{pg_schema}' AND table_name LIKE 'replay%'") == [(0,)]
        pg_admin(f"ALTER ROLE {role} CONNECTION LIMIT 1")
        refused = alloc_ledger("replay", url=url)
        assert (refused.returncode, refused.stderr) == (3, (
            f"Error: store {url}: a replay's second connection (its claim on its scratch "
            f'tables) refused: too many connections for role "{role}" (replay and replay '
            "--repair hold two connections (alloc-ledger, and alloc-ledger replay, which claims "
            "their scratch tables): the role's CONNECTION LIMIT must leave two beside its "
            "other sessions)\n")), refused
        pg_admin(f"ALTER ROLE {role} CONNECTION LIMIT 0")
        for command in (("submit", "heartbeat", "--node", "n1"), ("replay",)):
            none_left = alloc_ledger(*command, url=url)
            assert (none_left.returncode, none_left.stderr) == (3, (
                f"Error: cannot open store {url}: too many connections for role "
                f'"{role}" (with &writers=lock a command holds one connection (a replay two): '
                "the role's other sessions leave none (pg_stat_activity names them); raise "
                "the role's CONNECTION LIMIT)\n")), none_left


def test_creating_a_ledger_needs_two_connections_and_says_so_at_once_when_the_role_allows_one(
    pg_dsn, pg_schema, pg_admin, alloc_ledger
):
    """Creating a ledger holds the schema's lock on one connection while the
    library's recorder makes its tables on another: a role allowed one is
    told so at once (was: 'pool initialization incomplete after 10 sec')."""
    role = pg_schema
    with _own_role_store(pg_dsn, pg_schema, pg_admin, alloc_ledger, "CONNECTION LIMIT 1",
                         told=()) as url:
        refused = alloc_ledger("submit", "node-registered", "--node", "n1", url=url)
        assert (refused.returncode, refused.stdout, refused.stderr) == (3, "", (
            f'Error: cannot open store {url}: too many connections for role "{role}" '
            "(creating a ledger holds two connections (its schema's lock, and the one that "
            "makes its tables), whatever its writers: the role's CONNECTION LIMIT must leave "
            "two beside its other sessions, or create it once as a role that may)\n")), refused
        pg_admin(f"ALTER ROLE {role} CONNECTION LIMIT 2")
        made = alloc_ledger("submit", "node-registered", "--node", "n1", url=url)
        assert (made.returncode, made.stdout) == (
            0, '{"line": 1, "status": "appended", "position": 1, "error": null}\n'), made
        pg_admin(f"ALTER ROLE {role} CONNECTION LIMIT 1")  # made: one is enough from now on
        beat = alloc_ledger("submit", "heartbeat", "--node", "n1", url=url)
        assert (beat.returncode, beat.stdout) == (
            0, '{"line": 1, "status": "appended", "position": 2, "error": null}\n'), beat


@pytest.mark.parametrize(("script", "named"), [
    ("CREATE TABLE {s}.foo (x int); CREATE TABLE {s}.nodes (id int PRIMARY KEY, name text)",
     "nodes"),
    ("CREATE VIEW {s}.slots AS SELECT 1 AS one; CREATE TABLE {s}.allocations (x int)",
     "allocations, slots"),
    (("CREATE TABLE {s}.stored_events (originator_id uuid, originator_version int, topic text, "
     "state bytea, notification_id bigserial); "
     "INSERT INTO {s}.stored_events VALUES (gen_random_uuid(), 1, 'x', 'y')"),
     "stored_events (with events)"),
    ("CREATE TABLE {s}.stored_events (id int, body text)", "stored_events (of other columns)"),
    ("CREATE TABLE {s}.tracking (job text)", "tracking (of other columns)"),
], ids=["a table", "a view and a table", "another application's log",
        "another application's empty log", "another application's tracking"])
def test_a_schema_of_something_else_is_refused_and_left_as_it_is(
    pg_dsn, pg_schema, pg_admin, fails_to_open, script, named
):
    """As for a SQLite file of another database: the default schema is
    public, where tables named nodes or slots are plausible."""
    pg_admin(f"CREATE SCHEMA {pg_schema}")
    for statement in script.format(s=pg_schema).split("; "):
        pg_admin(statement)
    listed = f"SELECT relname FROM pg_class WHERE relnamespace = '{pg_schema}'::regnamespace ORDER BY 1"
    before = pg_admin(listed)

    fails_to_open(option(pg_dsn, f"schema={pg_schema}"), (
        f"schema {pg_schema} holds tables of something else ({named}), not a ledger; "
        "name another schema for the ledger (?schema=name)"), command=(
            "submit", "node-registered", "--node", "n1"))

    assert pg_admin(listed) == before


SOCKETS = "/var/run/postgresql"  # Debian's folder of the server's socket


@pytest.mark.parametrize("where", [
    "postgresql://{user}@%2Fvar%2Frun%2Fpostgresql/{db}?schema={schema}",  # escaped, as libpq reads
    "postgresql://{user}@/{db}?schema={schema}&host=/var/run/postgresql",  # libpq's ?host=
], ids=["escaped in the URL", "as ?host="])
def test_a_unix_socket_is_reached_as_libpq_reaches_it(server, pg_schema, alloc_ledger, where):
    if not os.path.exists(f"{SOCKETS}/.s.PGSQL.5432"):
        pytest.skip(f"the server has no socket in {SOCKETS}")
    url = where.format(user=server["user"], db=server["database"], schema=pg_schema)

    done = alloc_ledger("submit", "node-registered", "--node", "n1", url=url)

    assert (done.returncode, done.stderr) == (0, ""), done
    assert json.loads(done.stdout)["status"] == "appended"


def test_libpq_s_tls_and_failover_parameters_are_passed_on(pg_url, alloc_ledger):
    """Refused as unknown options before: TLS checks on managed PostgreSQL,
    the read-write server of several."""
    story(pg_url)
    url = option(pg_url, "sslmode=prefer&sslrootcert=/nonexistent/root.crt"
                 "&target_session_attrs=read-write&channel_binding=prefer")
    done = alloc_ledger("digest", url=url)
    assert done.returncode == 0, done  # TLS preferred, not offered here: plain
    for given, why in [
        ("sslmode=verify-full", ("TLS with server {where}: server does not support SSL, but SSL "
         "was required")),
        ("sslmode=bogus", 'invalid sslmode value: "bogus"'),  # libpq's word, not "unreachable"
    ]:
        refused = alloc_ledger("digest", url=option(pg_url, given))
        where = urlsplit(pg_url).netloc.rpartition("@")[2]
        assert (refused.returncode, refused.stderr) == (
            3, f"Error: cannot open store {option(pg_url, given)}: {why.format(where=where)}\n")


def test_reading_a_schema_without_a_ledger_is_exit_3_and_creates_nothing(
    pg_dsn, pg_schema, pg_admin, fails_to_open
):
    empty = f"{pg_schema}_typo"
    fails_to_open(option(pg_dsn, f"schema={empty}"),
                  f"there is no ledger in schema {empty} (nothing has been submitted to it")
    assert pg_admin(f"SELECT 1 FROM pg_namespace WHERE nspname = '{empty}'") == []


def test_a_schema_of_a_newer_version_is_refused_untouched(pg_url, pg_schema, pg_admin, fails_to_open):
    story(pg_url)
    pg_admin(f"COMMENT ON TABLE {pg_schema}.event_hashes IS 'alloc-ledger schema 99'")

    fails_to_open(pg_url, "it was made by a newer alloc-ledger (schema version 99, this one "
                  f"knows {SCHEMA_VERSION}): upgrade")
    with pytest.raises(StoreUnavailable, match="newer alloc-ledger"):
        Ledger.open(pg_url)  # nor does a writer change it
    assert pg_admin(f"SELECT obj_description('{pg_schema}.event_hashes'::regclass)") == [
        ("alloc-ledger schema 99",)]


def test_a_dropped_connection_mid_stream_leaves_nothing_half_written(
    pg_url, tmp_path: Path, tables, replayed, pg_admin, alloc_ledger
):
    events = tmp_path / "events.jsonl"
    events.write_text("".join(json.dumps(e) + "\n" for e in generate(20000, 50, 4, seed=3)))
    read = tables(pg_url)
    stop = threading.Event()

    def cut_when_halfway() -> None:
        while not stop.is_set() and read.head() < 2000:
            time.sleep(0.02)
        pg_admin("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                 "WHERE application_name = 'cut-me'")

    cutter = threading.Thread(target=cut_when_halfway)
    cutter.start()
    try:
        result = alloc_ledger("submit", str(events), "--batch", "100",
                              url=option(pg_url, "application_name=cut-me"))
    finally:
        stop.set()
        cutter.join()

    acknowledged = [json.loads(line)["position"] for line in result.stdout.splitlines()]
    head = read.head()
    assert result.returncode == 3, result.stderr[-500:]
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert 2000 <= head < 20000
    # every acknowledged event is in the log; at most the batch being committed
    # when the connection dropped is in the log without an answer (a retry with
    # the same ids reports it duplicate)
    assert acknowledged == list(range(1, len(acknowledged) + 1))
    assert 0 <= head - len(acknowledged) <= 100
    assert read.snapshot("state_", DECISION_TABLES) == replayed(pg_url, only=DECISION_TABLES)


@pytest.mark.parametrize("writers", ["lock", "combine"])
def test_text_with_a_nul_character_is_invalid_on_its_own_in_both_stores(store_url, writers):
    url = option(store_url, f"writers={writers}") if store_url.startswith("postgres") else store_url
    batch = [
        '{"type": "node-registered", "node": "n1"}',
        '{"type": "node-registered", "node": "n\\u00002"}',
        '{"type": "node-registered", "node": "n3", "source": "a\\u0000b"}',
        '{"type": "node-registered", "node": "n4"}',
    ]
    with Ledger.open(url) as ledger:
        receipts = ledger.submit_batch(batch)

    assert [(r.status, r.position) for r in receipts] == [
        ("appended", 1), ("invalid", None), ("invalid", None), ("appended", 2)]
    assert receipts[1].error == "field 'node': must not contain a NUL character"
    assert receipts[2].error == "field 'source': must not contain a NUL character"


def test_a_duration_too_long_for_its_column_is_invalid_on_its_own(store_url):
    batch: list[dict | str] = [
        {"type": "node-registered", "node": "n1", "slots": 2},
        {"type": "heartbeat", "node": "n1"},
        ('{"type": "alloc-placed", "alloc": "a1", "node": "n1", "slot": 0, '
         '"max_disconnect": 100000000000000000000}'),  # beyond 64 bits: the log's JSON cannot
        {"type": "alloc-placed", "alloc": "a2", "node": "n1", "slot": 0,
         "max_disconnect": 2**31},  # beyond PostgreSQL's INTEGER
        {"type": "alloc-placed", "alloc": "a3", "node": "n1", "slot": 1,
         "max_disconnect": 2**31 - 1},
    ]
    with Ledger.open(store_url) as ledger:
        receipts = ledger.submit_batch(batch)

    assert [r.status for r in receipts] == [
        "appended", "appended", "invalid", "invalid", "appended"]
    assert receipts[2].error == receipts[3].error == (
        "field 'max_disconnect': Input should be less than or equal to 2147483647")


def test_an_as_of_checkpoint_is_not_worth_waiting_for_a_stuck_follower(pg_url, pg_schema, pg_admin):
    """Keeping a checkpoint takes the projection tables' lock: a follower
    stopped inside its transaction holds it, and the as-of answer must not
    wait for it; the checkpoint is kept next time."""
    import psycopg
    from pg_support import pg_dsn

    from projections import checkpoints
    from projections.asof import rebuild

    story(pg_url)
    store = open_store(pg_url)
    try:
        cluster, position = rebuild(store, None, every=0)
        with psycopg.connect(str(pg_dsn())) as stuck:  # as a follower's transaction, stopped
            stuck.execute(f"SELECT * FROM {pg_schema}.tracking "
                          "WHERE application_name = 'projections' FOR UPDATE")
            started = time.monotonic()
            checkpoints.keep(store, cluster, position, "")
            waited = time.monotonic() - started
            kept_meanwhile = pg_admin(f"SELECT to_regclass('{pg_schema}.checkpoints') IS NOT NULL")
        checkpoints.keep(store, cluster, position, "")  # once it is gone
    finally:
        store.close()

    assert waited < 5  # the lock's wait (0.2 s) and a round trip or two, not for good
    assert kept_meanwhile == [(False,)]
    assert pg_admin(f"SELECT position FROM {pg_schema}.checkpoints") == [(position,)]


def test_a_running_replays_scratch_tables_are_kept_where_idle_sessions_are_ended(
    pg_dsn, pg_schema, pg_admin, alloc_ledger
):
    """The session that claims a replay's scratch tables sits idle while the
    replay runs: where the role (or database, or server) sets
    idle_session_timeout, the server ends it, the claim goes with it, and a
    second replay dropped the first one's tables from under it (which then
    failed: 'relation "replay_…_nodes" does not exist')."""
    with _own_role_store(pg_dsn, pg_schema, pg_admin, alloc_ledger,
                         "SET idle_session_timeout = '500ms'") as url:
        running = scratch_prefix()
        store = open_store(url, create=False)
        try:
            with store.claimed(running):
                Scratch(store, running).create()
                time.sleep(1.5)  # a long replay: its claiming session idle all along
                replayed = alloc_ledger("replay", url=url)
                kept = pg_admin(
                    "SELECT count(*) FROM information_schema.tables "
                    f"WHERE table_schema = '{pg_schema}' AND table_name LIKE '{running}%'")
        finally:
            with contextlib.suppress(Exception):
                store.close()
        assert replayed.returncode == 0, replayed
        assert kept != [(0,)], kept


def test_a_follower_stays_connected_where_idle_sessions_are_ended(
    pg_dsn, pg_schema, pg_admin, alloc_ledger
):
    """A follower listens, idle between events: where idle_session_timeout
    is set, the server ended its session every time, and it said it was
    reconnecting, over and over."""
    with _own_role_store(pg_dsn, pg_schema, pg_admin, alloc_ledger,
                         "SET idle_session_timeout = '300ms'") as url:
        root = Path(__file__).resolve().parents[2]
        follower = subprocess.Popen(
            [sys.executable, "-m", "commands", "--store", url, "project", "--follow"],
            cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            time.sleep(1.5)  # idle, listening
            assert alloc_ledger("submit", "heartbeat", "--node", "n1", url=url).returncode == 0
            time.sleep(1.5)
        finally:
            follower.send_signal(signal.SIGINT)
            out, err = follower.communicate(timeout=30)

    assert "reconnect" not in err + out, err
    assert '"to": 3' in out, out


def test_pgoptions_applies_as_the_readme_says_pg_variables_do(pg_url, monkeypatch):
    """README (PostgreSQL, URL): "libpq's own parameters ... and PG* variables
    apply". PGOPTIONS is libpq's way to set a session's parameters (as psql
    honours it); a store must not drop it when it adds options of its own."""
    with Ledger.open(pg_url) as ledger:
        assert ledger.submit({"type": "node-registered", "node": "n1"}).status == "appended"
    monkeypatch.setenv("PGOPTIONS", "-c default_transaction_read_only=on")
    with pytest.raises(StoreUnavailable, match="takes no writes"), Ledger.open(pg_url) as ledger:
        ledger.submit({"type": "heartbeat", "node": "n1"})
