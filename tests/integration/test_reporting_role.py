"""Who may do what (PostgreSQL): ``alloc-ledger grant-reporting ROLE`` lets a
reporting role read the projection tables and views, and nothing else; the
event log is append-only even for the ledger's own role.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest

from ledger.application import Ledger

PROJECTIONS = ["nodes", "slots", "allocations", "alloc_states", "addresses", "rejections"]
VIEWS = ["needs_reconnect", "zombie_slots", "projection_status", "log_positions"]
HIDDEN = ["stored_events", "event_ids", "event_hashes", "tracking", "state_nodes",
          "state_slots", "state_allocations", "state_addresses"]


@pytest.fixture
def role(login_role: str) -> str:
    return login_role


@pytest.fixture
def ledger_url(pg_url, project) -> str:
    with Ledger.open(pg_url) as ledger:
        for event in (
            {"type": "node-registered", "node": "n1", "slots": 1},
            {"type": "heartbeat", "node": "n1"},
            {"type": "alloc-placed", "alloc": "a1", "node": "n1", "slot": 0, "id": "e1"},
            {"type": "alloc-placed", "alloc": "a2", "node": "n1", "slot": 0},
        ):
            ledger.submit(event)
    project(pg_url)
    return str(pg_url)


@pytest.fixture
def as_role(pg_dsn, pg_schema, role) -> Iterator[Any]:
    """Run one statement as the reporting role, in its own transaction."""
    parts = urlsplit(pg_dsn)
    connection = psycopg.connect(
        host=parts.hostname, port=parts.port or 5432, dbname=parts.path.lstrip("/"), user=role,
        autocommit=True, options=f"-c search_path={pg_schema}",
    )

    def run(statement: str) -> list[tuple[Any, ...]]:
        cursor = connection.execute(statement)
        return cursor.fetchall() if cursor.description else []

    yield run
    connection.close()


@pytest.fixture
def granted(ledger_url, role, alloc_ledger, pg_schema) -> str:
    result = alloc_ledger("grant-reporting", role, url=ledger_url)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {
        "role": role, "schema": pg_schema, "select": PROJECTIONS + VIEWS}
    return role


@pytest.mark.parametrize("name", PROJECTIONS + VIEWS)
def test_the_reporting_role_reads_the_projection_tables_and_views(granted, as_role, name):
    as_role(f"SELECT * FROM {name}")


def test_the_reporting_role_sees_the_answers(granted, as_role):
    assert as_role("SELECT node, slot, state, alloc FROM slots") == [("n1", 0, "allocated", "a1")]
    assert as_role("SELECT position, entity FROM rejections") == [(4, "a2")]


def test_the_reporting_role_sees_how_far_behind_the_tables_are(
    granted, as_role, ledger_url, project
):
    """It may not read the log or tracking; the status view may, as its owner."""
    status = "SELECT head_position, projected_position, lag FROM projection_status"
    assert as_role(status) == [(4, 4, 0)]
    with Ledger.open(ledger_url) as ledger:
        ledger.submit({"type": "heartbeat", "node": "n1"})
        ledger.submit({"type": "heartbeat", "node": "n1"})

    assert as_role(status) == [(6, 4, 2)]  # the follower has not run
    project(ledger_url)
    assert as_role(status) == [(6, 6, 0)]


@pytest.mark.parametrize("name", HIDDEN)
def test_the_reporting_role_cannot_read_the_log_or_the_writers_tables(granted, as_role, name):
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        as_role(f"SELECT * FROM {name}")


@pytest.mark.parametrize("statement", [
    (
        "INSERT INTO nodes (node, status, health, slots, slots_used, allocs, since_position, "
        "lost_allocs, registered_position) VALUES ('x', 'ready', 'ok', 0, 0, 0, 1, '[]', 1)"
    ),
    "UPDATE slots SET alloc = NULL",
    "DELETE FROM allocations",
    "TRUNCATE addresses",
    (
        "INSERT INTO stored_events (originator_id, originator_version, topic, state) "
        "VALUES (gen_random_uuid(), 1, 'forged', '')"
    ),
    "UPDATE stored_events SET topic = 'forged'",
    "DELETE FROM stored_events",
    "INSERT INTO event_ids VALUES ('forged', 1)",
    "UPDATE tracking SET notification_id = 0",
    "UPDATE state_slots SET alloc = NULL",
    "CREATE TABLE sneaky (x int)",
    "CREATE VIEW sneaky AS SELECT 1",
    "DROP TABLE nodes",
    "ALTER TABLE nodes ADD COLUMN sneaky int",
])
def test_the_reporting_role_cannot_write_anywhere(granted, as_role, statement):
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        as_role(statement)


@pytest.mark.parametrize(("args", "table"), [
    (["query", "nodes"], "stored_events"),
    (["verify"], "stored_events"),
    (["submit", "heartbeat", "--node", "n1"], "handoff"),
    (["project"], "tracking"),
])
def test_the_commands_tell_a_reporting_role_what_it_is_for(
    granted, alloc_ledger, ledger_url, args, table
):
    """A reporting role reads with SQL: a command run as it says so in one
    line, not only that a table it never heard of is denied."""
    parts = urlsplit(ledger_url)
    url = parts._replace(netloc=f"{granted}@{parts.hostname}:{parts.port or 5432}").geturl()

    result = alloc_ledger(*args, url=url)

    assert result.returncode == 3 and result.stdout == ""
    assert result.stderr == (
        f"Error: store {url}: permission denied for table {table} (alloc-ledger's commands "
        "need a role that may use the ledger's own tables, such as their owner; a role from "
        "grant-reporting reads the projection tables with SQL only)\n")


def test_before_the_grant_the_role_reads_nothing(ledger_url, role, as_role, pg_schema):
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        as_role(f"SELECT * FROM {pg_schema}.nodes")


def test_granting_twice_is_harmless(granted, alloc_ledger, ledger_url, as_role):
    again = alloc_ledger("grant-reporting", granted, url=ledger_url)

    assert again.returncode == 0, again.stderr
    assert as_role("SELECT COUNT(*) FROM nodes") == [(1,)]


def test_an_unknown_role_is_one_clear_line(ledger_url, alloc_ledger):
    result = alloc_ledger("grant-reporting", "no_such_role_here", url=ledger_url)

    assert result.returncode == 1
    assert result.stderr == (
        'Error: cannot grant reporting to no_such_role_here: role "no_such_role_here" does not exist\n'
    )


def test_a_role_that_may_not_grant_is_told_so_not_told_it_granted(
    granted, ledger_url, alloc_ledger, pg_admin
):
    other = f"{granted}_b"
    pg_admin(f"CREATE ROLE {other} LOGIN")
    try:
        parts = urlsplit(ledger_url)
        as_reporter = parts._replace(netloc=f"{granted}@{parts.hostname}:{parts.port or 5432}")
        result = alloc_ledger("grant-reporting", other, url=as_reporter.geturl())
    finally:
        pg_admin(f"DROP OWNED BY {other}")
        pg_admin(f"DROP ROLE {other}")

    assert result.returncode == 1, result.stderr
    assert result.stderr.startswith(
        f"Error: cannot grant reporting to {other}: this connection's role may not grant "
        "SELECT on nodes, slots, allocations"
    ), result.stderr
    assert result.stderr.count("\n") == 1


def test_an_empty_role_is_a_usage_error(ledger_url, alloc_ledger):
    result = alloc_ledger("grant-reporting", "", url=ledger_url)

    assert result.returncode == 2
    assert "a role name is needed" in result.stderr


def test_sqlite_has_no_roles(tmp_path, alloc_ledger):
    result = alloc_ledger("grant-reporting", "grafana", url=f"sqlite:///{tmp_path}/l.db")

    assert result.returncode == 2  # a command for another kind of store: a usage error
    assert result.stderr.startswith(
        "Error: Invalid value for '--store': grant-reporting needs a PostgreSQL store")
    assert result.stderr.endswith("(see 'alloc-ledger grant-reporting --help')\n")
    assert list(tmp_path.iterdir()) == []  # no store made to refuse


@pytest.mark.parametrize("statement", [
    "UPDATE stored_events SET topic = 'forged'",
    "DELETE FROM stored_events",
    "TRUNCATE stored_events",
    "UPDATE event_hashes SET hash = 'forged'",
    "DELETE FROM event_hashes WHERE position = 1",
    "UPDATE event_ids SET position = 99",
    "DELETE FROM event_ids",
    "TRUNCATE event_ids",
])
def test_even_the_ledger_owner_cannot_change_the_log(ledger_url, pg_schema, pg_admin, statement):
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="append-only"):
        pg_admin(f"SET search_path = {pg_schema}; {statement}")
    assert pg_admin(f"SELECT COUNT(*) FROM {pg_schema}.stored_events") == [(4,)]


def test_a_role_that_may_not_add_the_ids_guards_opens_the_store_without_them(
    granted, ledger_url, pg_dsn, pg_schema, pg_admin
):
    """A store made before the client ids were guarded gets the guards from
    its owner's next open; another role's open leaves that to the owner."""
    from ledger.store import open_store

    guards = (f"SELECT COUNT(*) FROM pg_trigger WHERE NOT tgisinternal "
              f"AND tgrelid = to_regclass('{pg_schema}.event_ids')")
    pg_admin(f"DROP TRIGGER event_ids_append_only ON {pg_schema}.event_ids; "
             f"DROP TRIGGER event_ids_no_truncate ON {pg_schema}.event_ids")
    parts = urlsplit(pg_dsn)
    as_reporter = f"postgresql://{granted}@{parts.hostname}:{parts.port or 5432}{parts.path}"

    open_store(f"{as_reporter}?schema={pg_schema}", create=False).close()
    assert pg_admin(guards) == [(0,)]

    open_store(ledger_url, create=False).close()
    assert pg_admin(guards) == [(2,)]


def refused_as(role: str, dsn: str, schema: str, alloc_ledger: Any, why: str) -> None:
    """``query nodes`` as ``role`` refused in one line, exit 3, saying ``why``
    (its start) after the store's URL."""
    parts = urlsplit(dsn)
    url = f"postgresql://{role}@{parts.hostname}:{parts.port or 5432}{parts.path}?schema={schema}"
    refused = alloc_ledger("query", "nodes", url=url)
    assert refused.returncode == 3
    assert refused.stderr.startswith(f"Error: cannot open store {url}: {why}"), refused.stderr
    assert refused.stderr.count("\n") == 1


@pytest.mark.parametrize("creates_schemas", [False, True], ids=["reader", "may-create-schemas"])
def test_a_role_that_may_not_upgrade_a_store_of_the_last_version_is_told_who_may(
    granted, ledger_url, pg_dsn, pg_schema, pg_admin, alloc_ledger, as_role, creates_schemas
):
    """Refused at ``CREATE SCHEMA`` or, for a role that may create schemas
    in the database but not tables in this one, by the event recorder."""
    if creates_schemas:
        database = urlsplit(pg_dsn).path.lstrip("/")
        pg_admin(f"GRANT CREATE ON DATABASE {database} TO {granted}")
    pg_admin(f"COMMENT ON TABLE {pg_schema}.event_hashes IS 'alloc-ledger schema 3'")
    pg_admin(f"ALTER TABLE {pg_schema}.nodes DROP COLUMN health_reason")

    refused_as(granted, pg_dsn, pg_schema, alloc_ledger, (
        "it was made by an earlier alloc-ledger (schema version 3): open it once as a role "
        "that may change its tables (their owner) to upgrade it ("))

    assert alloc_ledger("query", "nodes", url=ledger_url).returncode == 0  # the owner upgrades it
    assert as_role("SELECT node, health_reason FROM nodes") == [("n1", None)]


def test_a_role_that_may_not_mark_a_restored_store_again_is_told_who_may(
    granted, ledger_url, pg_dsn, pg_schema, pg_admin, alloc_ledger, as_role
):
    """A restore without comments leaves out the version mark; a reporting
    role cannot put it back, and is told why and who can (helper-502)."""
    pg_admin(f"COMMENT ON TABLE {pg_schema}.event_hashes IS NULL")  # --no-comments

    refused_as(granted, pg_dsn, pg_schema, alloc_ledger, (
        "its schema version mark is missing (a COMMENT on event_hashes, which a dump or "
        "restore with --no-comments leaves out): open it once as a role that may change its "
        "tables (their owner) to mark it again ("))

    assert alloc_ledger("query", "nodes", url=ledger_url).returncode == 0  # the owner marks it
    assert as_role("SELECT node FROM nodes") == [("n1",)]


def test_what_the_role_had_beyond_reading_the_projections_is_revoked(
    ledger_url, role, as_role, alloc_ledger, pg_schema, pg_admin
):
    """"Nothing else" holds for a role that had more: SELECT on the log,
    writing a projection table, creating in the schema."""
    pg_admin(f"GRANT USAGE, CREATE ON SCHEMA {pg_schema} TO {role}")
    pg_admin(f"GRANT SELECT ON {pg_schema}.stored_events, {pg_schema}.tracking TO {role}")
    pg_admin(f"GRANT INSERT, UPDATE, DELETE ON {pg_schema}.nodes TO {role}")
    pg_admin(f"GRANT UPDATE (state) ON {pg_schema}.slots TO {role}")
    pg_admin(f"GRANT USAGE, UPDATE ON ALL SEQUENCES IN SCHEMA {pg_schema} TO {role}")
    sequence = pg_admin(  # the log's own: setting it back would break every writer
        f"SELECT pg_get_serial_sequence('{pg_schema}.stored_events', 'notification_id')")[0][0]
    assert sequence

    result = alloc_ledger("grant-reporting", role, url=ledger_url)

    assert result.returncode == 0, result.stderr
    assert as_role("SELECT node FROM nodes") == [("n1",)]
    for statement in ("SELECT * FROM stored_events", "SELECT * FROM tracking",
                      "DELETE FROM nodes", "UPDATE slots SET state = 'x'",
                      f"SELECT setval('{sequence}', 1)", "CREATE TABLE sneaky (x int)"):
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            as_role(statement)


MORE_THAN_READING = {  # how a role may have more, how that is undone, what it is told
    "superuser": (
        ["ALTER ROLE {role} SUPERUSER"], ["ALTER ROLE {role} NOSUPERUSER"], "it is a superuser"),
    "owner": (  # revoking its own privileges would lock the writers out
        ["ALTER TABLE {schema}.nodes OWNER TO {role}"],
        ["ALTER TABLE {schema}.nodes OWNER TO CURRENT_USER"],
        "it owns nodes (or is a member of their owner)"),
    "member of a writer": (
        ["CREATE ROLE {role}_w", "GRANT USAGE ON SCHEMA {schema} TO {role}_w",
         "GRANT INSERT ON {schema}.nodes TO {role}_w", "GRANT {role}_w TO {role}"],
        ["REVOKE {role}_w FROM {role}", "DROP OWNED BY {role}_w", "DROP ROLE {role}_w"],
        "it may still INSERT on nodes (as a member"),
    "member of a role with a column's UPDATE and TRIGGER": (
        ["CREATE ROLE {role}_w", "GRANT USAGE ON SCHEMA {schema} TO {role}_w",
         "GRANT UPDATE (status) ON {schema}.nodes TO {role}_w",
         "GRANT TRIGGER ON {schema}.stored_events TO {role}_w", "GRANT {role}_w TO {role}"],
        ["REVOKE {role}_w FROM {role}", "DROP OWNED BY {role}_w", "DROP ROLE {role}_w"],
        "it may still UPDATE on nodes, TRIGGER on stored_events (as a member"),
}


@pytest.mark.parametrize("how", list(MORE_THAN_READING))
def test_a_role_that_would_still_have_more_is_refused_and_nothing_changes(
    ledger_url, role, alloc_ledger, pg_schema, pg_admin, how
):
    given, undone, told = MORE_THAN_READING[how]
    # something a grant-reporting that went on would revoke, so "nothing was changed" shows
    pg_admin(f"GRANT SELECT ON {pg_schema}.stored_events TO {role}")
    for statement in given:
        pg_admin(statement.format(role=role, schema=pg_schema))
    grants = ("SELECT table_name, privilege_type FROM information_schema.role_table_grants "
              f"WHERE grantee = '{role}' AND table_schema = '{pg_schema}' ORDER BY 1, 2")
    try:
        before = pg_admin(grants)
        result = alloc_ledger("grant-reporting", role, url=ledger_url)
        after = pg_admin(grants)
    finally:
        for statement in undone:
            pg_admin(statement.format(role=role, schema=pg_schema))

    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.startswith(f"Error: cannot make {role} a reporting role: it ")
    assert result.stderr.count("\n") == 1
    assert told in result.stderr
    assert result.stderr.endswith("nothing was changed: grant to a role of its own\n")
    assert ("stored_events", "SELECT") in before and after == before


def test_a_role_that_may_not_create_a_ledger_is_not_told_about_reporting(
    pg_dsn, role, alloc_ledger
):
    """The hint is for a table refused, not for a database: creating a ledger
    asks for CREATE on it, which is another matter."""
    parts = urlsplit(pg_dsn)
    url = parts._replace(netloc=f"{role}@{parts.hostname}:{parts.port or 5432}",
                         query=f"schema={role}_new").geturl()

    result = alloc_ledger("submit", "node-registered", "--node", "n1", url=url)

    assert result.returncode == 3
    assert result.stderr.startswith(f"Error: cannot open store {url}: permission denied for ")
    assert "grant-reporting" not in result.stderr and result.stderr.count("\n") == 1


def test_granting_public_is_said_to_reach_every_role_made_later_too(
    ledger_url, alloc_ledger, pg_schema, pg_admin, role, as_role
):
    """PUBLIC is PostgreSQL's every role: the operator's choice, told plainly."""
    pg_admin(f"REVOKE ALL ON SCHEMA {pg_schema} FROM PUBLIC")  # as a fresh schema may be
    result = alloc_ledger("grant-reporting", "public", url=ledger_url)

    assert result.returncode == 0, result.stderr
    assert result.stderr == ("warning: PUBLIC is every role, those made later too: each of "
                             "them may now read the projection tables\n")
    assert as_role("SELECT node FROM nodes") == [("n1",)]  # a role given nothing itself


# -- a repair keeps who may read (and who owns) what it makes again --------------


def access(pg_admin, schema: str) -> list[tuple[Any, ...]]:
    """Every table and view of the schema with its owner and each grant
    beyond the owner's own: (relation, owner, grantee, privilege, grantable)."""
    return pg_admin(
        "SELECT c.relname::text, pg_get_userbyid(c.relowner), "
        "CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE pg_get_userbyid(a.grantee) END, "
        "a.privilege_type, a.is_grantable FROM pg_class c "
        "LEFT JOIN LATERAL aclexplode(c.relacl) a ON a.grantee <> c.relowner "
        f"WHERE c.relnamespace = '{schema}'::regnamespace AND c.relkind IN ('r', 'v') "
        "AND c.relname NOT LIKE 'replay%' ORDER BY 1, 3, 4")


DAMAGES = {  # what a DBA did by hand that a repair makes again
    "a table dropped, and the views over it": ["DROP TABLE allocations CASCADE"],
    "a view redefined": [
        "DROP VIEW zombie_slots",
        ("CREATE VIEW zombie_slots AS SELECT node, slot, alloc, 'moved' AS reason, "
         "since_position AS position FROM slots")],
    "a decision table dropped": ["DROP TABLE state_allocations CASCADE"],
}


@pytest.fixture
def other_roles(pg_admin, pg_schema, ledger_url, granted) -> Iterator[tuple[str, str]]:
    """Besides the reporting role: one a DBA let read nodes alone, and one a
    DBA let write the projection and decision tables (a writer of its own)."""
    one, writer = f"{granted}_one", f"{granted}_w"
    written = ", ".join([*PROJECTIONS, *(f"state_{t}" for t in PROJECTIONS)])
    for statement in (
        f"CREATE ROLE {one} LOGIN", f"CREATE ROLE {writer} LOGIN",
        f"GRANT USAGE ON SCHEMA {pg_schema} TO {one}, {writer}",
        f"GRANT SELECT ON {pg_schema}.nodes TO {one}",
        (f"SET search_path = {pg_schema}; "
         f"GRANT SELECT, INSERT, UPDATE, DELETE ON {written} TO {writer}"),
    ):
        pg_admin(statement)
    yield one, writer
    for role in (one, writer):
        pg_admin(f"DROP OWNED BY {role}")
        pg_admin(f"DROP ROLE {role}")


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_what_a_repair_makes_again_is_readable_by_exactly_whom_it_was_before(
    damage, granted, other_roles, as_role, ledger_url, alloc_ledger, pg_schema, pg_admin
):
    """A relation dropped by hand gets what its siblings all share: the
    reporting role's SELECT and the writer's rights, not the grant on nodes
    alone; a view redefined in place keeps its own and gets theirs."""
    before = access(pg_admin, pg_schema)
    for statement in DAMAGES[damage]:
        pg_admin(f"SET search_path = {pg_schema}; {statement}")

    repaired = alloc_ledger("replay", "--repair", url=ledger_url)

    assert repaired.returncode == 0, repaired.stderr
    assert access(pg_admin, pg_schema) == before
    for name in PROJECTIONS + VIEWS:
        as_role(f"SELECT * FROM {name}")
    for statement in ("DELETE FROM allocations", "SELECT * FROM state_allocations"):
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            as_role(statement)


def test_every_projection_table_dropped_is_made_again_readable_as_the_views_are(
    granted, as_role, ledger_url, alloc_ledger, pg_schema, pg_admin
):
    """No table left to learn from: the SELECT grants every view left has."""
    pg_admin(f"SET search_path = {pg_schema}; DROP TABLE {', '.join(PROJECTIONS)} CASCADE")

    repaired = alloc_ledger("replay", "--repair", url=ledger_url)

    assert repaired.returncode == 0, repaired.stderr
    assert [row for row in access(pg_admin, pg_schema) if row[0] in PROJECTIONS + VIEWS] == [
        (name, "postgres", granted, "SELECT", False) for name in sorted(PROJECTIONS + VIEWS)]
    assert as_role("SELECT node, slot, state, alloc FROM slots") == [("n1", 0, "allocated", "a1")]


def test_a_table_dropped_and_made_again_inside_gets_its_own_grants_and_no_default_ones(
    granted, other_roles, ledger_url, pg_schema, pg_admin
):
    """Noted before it was dropped: exactly what it had (the grant on nodes
    alone too), not what the schema's default privileges give a new table."""
    from ledger.store import open_store
    from projections import tables

    defaults = f"DEFAULT PRIVILEGES IN SCHEMA {pg_schema}"
    pg_admin(f"ALTER {defaults} GRANT INSERT ON TABLES TO {granted}")
    before = access(pg_admin, pg_schema)
    store = open_store(ledger_url, create=False)
    try:
        with store.repairing() as cursor, store.keeping_grants(cursor):
            cursor.execute("DROP TABLE nodes CASCADE")  # the views over it too
            tables.create(cursor, "postgresql")
    finally:
        store.close()
        pg_admin(f"ALTER {defaults} REVOKE INSERT ON TABLES FROM {granted}")

    assert access(pg_admin, pg_schema) == before


def test_a_log_view_an_open_makes_again_is_readable_by_the_reporting_role(
    granted, as_role, ledger_url, pg_schema, pg_admin
):
    from ledger.store import open_store

    before = access(pg_admin, pg_schema)
    pg_admin(f"DROP VIEW {pg_schema}.log_positions")

    open_store(ledger_url, create=False).close()

    assert access(pg_admin, pg_schema) == before
    assert as_role("SELECT position FROM log_positions ORDER BY 1") == [(1,), (2,), (3,), (4,)]


def test_a_superuser_s_repair_leaves_what_it_makes_again_to_the_ledger_s_owner(
    pg_dsn, pg_schema, pg_admin, role, as_role, alloc_ledger, project
):
    """Made by a superuser, a table would be the superuser's: the ledger's
    own role could no longer write it, nor the reporting role read it."""
    owner = f"{role}_owner"
    database = urlsplit(pg_dsn).path.lstrip("/")
    pg_admin(f"CREATE ROLE {owner} LOGIN")
    try:
        pg_admin(f"GRANT CREATE ON DATABASE {database} TO {owner}")
        parts = urlsplit(pg_dsn)
        owned = parts._replace(netloc=f"{owner}@{parts.hostname}:{parts.port or 5432}",
                               query=f"schema={pg_schema}").geturl()
        with Ledger.open(owned) as ledger:
            ledger.submit({"type": "node-registered", "node": "n1", "slots": 1})
            ledger.submit({"type": "heartbeat", "node": "n1"})
            ledger.submit({"type": "alloc-placed", "alloc": "a1", "node": "n1", "slot": 0})
        project(owned)
        assert alloc_ledger("grant-reporting", role, url=owned).returncode == 0
        before = access(pg_admin, pg_schema)
        pg_admin(f"DROP TABLE {pg_schema}.allocations CASCADE")

        repaired = alloc_ledger("replay", "--repair", url=parts._replace(
            query=f"schema={pg_schema}").geturl())  # as the test database's superuser

        assert repaired.returncode == 0, repaired.stderr
        assert access(pg_admin, pg_schema) == before
        assert as_role("SELECT alloc FROM allocations") == [("a1",)]
        placed = alloc_ledger("submit", "alloc-placed", "--alloc", "a2", "--node", "n1",
                              url=owned)
        assert placed.returncode == 0, placed.stderr
        projected = alloc_ledger("project", url=owned)  # the owner writes the table made again
        assert projected.returncode == 0, projected.stderr
        assert as_role("SELECT alloc FROM allocations ORDER BY 1") == [("a1",), ("a2",)]
    finally:
        pg_admin(f"DROP SCHEMA IF EXISTS {pg_schema} CASCADE")
        pg_admin(f"DROP OWNED BY {owner}")
        pg_admin(f"DROP ROLE {owner}")
