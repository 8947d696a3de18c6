"""A PostgreSQL ledger restored from ``pg_dump`` (into another schema or
database of the same server) is a ledger of its own: it holds what the dump
held and what is submitted to it, nothing that was on its way into the
original when the dump was taken."""

from __future__ import annotations

import threading
import time
import uuid
from urllib.parse import urlsplit

from ledger.application import Ledger
from ledger.postgres_handoff import LEADER_LOCK
from ledger.store import open_store

COMBINE = "&writers=combine"


def _register(url: str, *nodes: str) -> None:
    with Ledger.open(url) as ledger:
        for node in nodes:
            assert ledger.submit({"type": "node-registered", "node": node}).status == "appended"


def test_a_batch_in_flight_in_the_original_is_not_decided_by_a_restored_copy(
    pg_url, pg_schema, tables, pg_admin
):
    """``pg_dump -n ledger`` taken while a writer's batch waits in ``handoff``
    carries that row (pid and backend start of a session that is still
    alive, writing to the original), and a restore under another schema name
    brings it back. The copy's first leader must not append the original's
    batch to the copy's log: nobody submitted it there, and its writer is
    answered by the original."""
    original = pg_url + COMBINE
    copy_schema = f"t_{uuid.uuid4().hex[:16]}"
    copy = original.replace(f"schema={pg_schema}", f"schema={copy_schema}")
    try:
        _register(original, "n1")
        _register(copy, "n1")  # stands for the restored copy's tables
        blocker = open_store(original).connect()  # type: ignore[attr-defined]
        oid = blocker.execute(
            "SELECT oid::int4 FROM pg_namespace WHERE nspname = %s", (pg_schema,)).fetchone()[0]
        blocker.execute("SELECT pg_advisory_lock(%s, %s)", (LEADER_LOCK, oid))  # no leader yet
        answered: list[str] = []

        def write() -> None:
            with Ledger.open(f"{original}&timeout=20") as ledger:
                answered.append(ledger.submit(
                    {"type": "heartbeat", "node": "n1", "id": "in-flight"}).status)

        writer = threading.Thread(target=write)
        writer.start()
        try:
            deadline = time.monotonic() + 10
            while tables(original).value("SELECT count(*) FROM handoff") < 1:
                assert time.monotonic() < deadline, "the batch was not handed over"
                time.sleep(0.02)
            # what pg_dump of the original, restored as the copy, brings back
            pg_admin(f"INSERT INTO {copy_schema}.handoff SELECT * FROM {pg_schema}.handoff")
            pg_admin(f"SELECT setval('{copy_schema}.handoff_id_seq', "
                     f"(SELECT last_value FROM {pg_schema}.handoff_id_seq))")

            _register(copy, "n2")  # the operator's first write to the restored copy
        finally:
            blocker.close()  # the original's own leader may now decide its batch
            writer.join(30)

        assert answered == ["appended"]
        assert tables(original).value(
            "SELECT count(*) FROM event_ids WHERE id = 'in-flight'") == 1
        assert tables(copy).value("SELECT count(*) FROM event_ids WHERE id = 'in-flight'") == 0
        assert tables(copy).head() == 2
    finally:
        pg_admin(f"DROP SCHEMA IF EXISTS {copy_schema} CASCADE")


def test_a_restore_without_comments_is_not_called_a_schema_nothing_was_submitted_to(
    pg_url, pg_schema, alloc_ledger, pg_admin
):
    """``pg_dump --no-comments`` (or ``pg_restore --no-comments``) leaves out
    the schema version mark on ``event_hashes``. The writers take such a
    schema for a ledger (``submit`` appends at the next position and marks
    it again), but the reading commands said `there is no ledger in schema
    … (nothing has been submitted to it; check --store)` of a log holding
    events: an operator checking the restore is sent after a wrong URL."""
    _register(pg_url, "n1", "n2")
    pg_admin(f"COMMENT ON TABLE {pg_schema}.event_hashes IS NULL")  # as restored

    for command in (["verify"], ["digest"], ["query", "nodes"]):
        result = alloc_ledger(*command, url=pg_url)
        assert "nothing has been submitted" not in result.stderr, (command, result.stderr)
        assert result.returncode == 0, (command, result.stderr)


def test_a_restore_without_the_handoff_tables_can_be_written_again(
    pg_url, pg_schema, alloc_ledger, pg_admin
):
    """``pg_dump -T ledger.handoff -T ledger.outcomes`` (leaving out the
    UNLOGGED hand-over tables, whose rows name sessions of the original)
    restores a schema that `verify`, `replay` and every query pass, but where
    every default writer exits 3 with `relation "handoff" does not exist`,
    and `replay --repair` does not make them. An open makes the guards and
    views again; it should make these, empty, too (or a repair should)."""
    _register(pg_url, "n1")
    pg_admin(f"DROP TABLE {pg_schema}.handoff, {pg_schema}.outcomes")  # as restored

    assert alloc_ledger("replay", "--repair", url=pg_url).returncode == 0
    result = alloc_ledger("submit", "heartbeat", "--node", "n1", url=pg_url)
    assert result.returncode == 0, result.stderr


def test_a_reading_command_leaves_another_applications_event_hashes_alone(
    pg_url, pg_schema, alloc_ledger, pg_admin
):
    """An unmarked schema is taken for a ledger by its ``event_hashes`` table
    alone: a reading command with a mistyped ``?schema=`` that names another
    application's schema holding a table of that name made the ledger's
    tables there and put the append-only triggers on that application's
    table, refusing its own UPDATEs (helper-505). Before, it was told there
    is no ledger there, and nothing was changed."""
    pg_admin(f"CREATE SCHEMA IF NOT EXISTS {pg_schema}")
    pg_admin(f"CREATE TABLE {pg_schema}.event_hashes (id serial, payload text)")
    pg_admin(f"INSERT INTO {pg_schema}.event_hashes (payload) VALUES ('theirs')")

    result = alloc_ledger("query", "nodes", url=pg_url)

    assert result.returncode == 3, result.stderr
    assert "there is no ledger in schema" in result.stderr, result.stderr
    pg_admin(f"UPDATE {pg_schema}.event_hashes SET payload = 'still theirs'")  # no trigger


def test_hand_over_tables_made_again_are_owned_as_the_log_is(
    pg_dsn, pg_schema, alloc_ledger, pg_admin
):
    """Made again by whichever role opens the store first (a reading
    command of a member of the owning role), the tables went to that member,
    and a writer logged in as another member was refused ``permission denied
    for table handoff`` from then on (helper-505). They go to the log's owner."""
    owner, first, second = (f"{pg_schema}_{who}" for who in ("owner", "w1", "w2"))
    pg_admin(f"CREATE ROLE {owner}")
    for member in (first, second):
        pg_admin(f"CREATE ROLE {member} LOGIN IN ROLE {owner}")
    pg_admin(f"CREATE SCHEMA {pg_schema} AUTHORIZATION {owner}")
    parts = urlsplit(pg_dsn)

    def as_role(role: str) -> str:
        return (f"postgresql://{role}@{parts.hostname}:{parts.port or 5432}{parts.path}"
                f"?schema={pg_schema}")

    try:
        pg_admin(f"ALTER ROLE {first} SET role = {owner}")  # makes the ledger as the owner
        made = alloc_ledger("submit", "node-registered", "--node", "n1", url=as_role(first))
        assert made.returncode == 0, made.stderr
        pg_admin(f"ALTER ROLE {first} RESET role")
        pg_admin(f"DROP TABLE {pg_schema}.handoff, {pg_schema}.outcomes")  # as restored

        assert alloc_ledger("digest", url=as_role(first)).returncode == 0  # mends them

        assert pg_admin(
            "SELECT pg_catalog.pg_get_userbyid(relowner) FROM pg_class WHERE relnamespace = "
            f"'{pg_schema}'::regnamespace AND relname IN ('handoff', 'outcomes')"
        ) == [(owner,), (owner,)]
        written = alloc_ledger("submit", "heartbeat", "--node", "n1", url=as_role(second))
        assert written.returncode == 0, written.stderr
    finally:
        pg_admin(f"DROP SCHEMA IF EXISTS {pg_schema} CASCADE")
        for role in (first, second, owner):
            pg_admin(f"DROP OWNED BY {role}")
            pg_admin(f"DROP ROLE {role}")
