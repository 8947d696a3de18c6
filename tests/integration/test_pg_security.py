"""A role that may create objects in the ledger's schema (every role may in
``public`` on PostgreSQL 14 and earlier, or where a DBA granted it) can put a
function there that matches a call of the ledger's sessions better than
PostgreSQL's own, and so runs as the writer with its rights over the log
(helper-305). The ledger's calls of the polymorphic ``unnest`` name
``pg_catalog``; no list of calls is complete, so ``verify`` says when roles
besides the owner may create in the schema, and ``grant-reporting`` refuses
to make such a role a reporting one."""

from __future__ import annotations

import ast
import hashlib
import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import pytest

from ledger.application import Ledger

pytestmark = pytest.mark.postgres

HIJACK = """
CREATE TABLE {schema}.seen (who text);
GRANT INSERT ON {schema}.seen TO PUBLIC;
CREATE FUNCTION {schema}.unnest(a text[]) RETURNS SETOF text LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO {schema}.seen VALUES (current_user);
  RETURN QUERY SELECT pg_catalog.unnest(a);
END $$;
"""


@pytest.fixture
def other_role(login_role: str) -> str:
    return login_role


def test_a_role_that_may_create_in_the_schema_does_not_get_its_unnest_run_by_the_writer(
    pg_url, pg_schema, pg_dsn, pg_admin, other_role, alloc_ledger
):
    with Ledger.open(pg_url) as ledger:
        ledger.submit({"type": "node-registered", "node": "n1", "slots": 1})
    pg_admin(f"GRANT USAGE, CREATE ON SCHEMA {pg_schema} TO {other_role}")
    parts = urlsplit(pg_dsn)
    with psycopg.connect(host=parts.hostname, port=parts.port or 5432,
                         dbname=parts.path.lstrip("/"), user=other_role, autocommit=True) as c:
        c.execute(HIJACK.format(schema=pg_schema))
    for command in (("submit", "heartbeat", "--node", "n1"), ("project",), ("verify",)):
        result = alloc_ledger(*command, url=pg_url)
        assert result.returncode == 0, result.stderr
    assert pg_admin(f"SELECT who FROM {pg_schema}.seen") == [], "the role's unnest() ran"


@pytest.mark.parametrize("grantee", ["PUBLIC", "a role"])
def test_verify_warns_while_roles_besides_the_owner_may_create_in_the_schema(
    pg_url, pg_schema, pg_admin, other_role, alloc_ledger, grantee
):
    assert alloc_ledger("submit", "node-registered", "--node", "n1", url=pg_url).returncode == 0
    quiet = alloc_ledger("verify", url=pg_url)
    assert (quiet.returncode, quiet.stderr) == (0, ""), quiet
    who = "PUBLIC" if grantee == "PUBLIC" else other_role
    pg_admin(f"GRANT CREATE ON SCHEMA {pg_schema} TO {who}")
    warned = alloc_ledger("verify", url=pg_url)
    assert warned.returncode == 0, warned.stderr
    assert json.loads(warned.stdout)["ok"] is True
    named = "every role (PUBLIC)" if grantee == "PUBLIC" else other_role
    revoked = "PUBLIC" if grantee == "PUBLIC" else f'"{other_role}"'  # as SQL names it
    assert warned.stderr == (
        f"warning: {named} may create objects in schema {pg_schema}, which the ledger's "
        "sessions search: a function made there to match a call better than PostgreSQL's own "
        "runs as the writer that calls it, with its rights over the log; REVOKE CREATE ON "
        f"SCHEMA {pg_schema} FROM {revoked}, or keep the ledger in a schema of its own "
        "(docs/postgresql.md, Security)\n"), warned
    pg_admin(f"REVOKE CREATE ON SCHEMA {pg_schema} FROM {who}")
    assert alloc_ledger("verify", url=pg_url).stderr == ""


def test_verify_does_not_warn_of_the_role_that_owns_the_ledgers_tables(
    pg_dsn, pg_schema, pg_admin, login_role, alloc_ledger
):
    """A DBA made the schema and let the ledger's role create in it, which
    then made the ledger: that role is the writer itself (helper-306), and
    revoking its CREATE, as the warning said, would only stop its replays."""
    pg_admin(f"CREATE SCHEMA {pg_schema}")
    pg_admin(f"GRANT USAGE, CREATE ON SCHEMA {pg_schema} TO {login_role}")
    parts = urlsplit(pg_dsn)
    url = (f"postgresql://{login_role}@{parts.hostname}:{parts.port or 5432}{parts.path}"
           f"?schema={pg_schema}")
    assert alloc_ledger("submit", "node-registered", "--node", "n1", url=url).returncode == 0
    verified = alloc_ledger("verify", url=url)
    assert (verified.returncode, verified.stderr) == (0, ""), verified
    replayed = alloc_ledger("replay", url=url)
    assert replayed.returncode == 0, replayed.stderr


def test_grant_reporting_refuses_a_role_that_may_create_in_the_ledgers_schema_through_public(
    pg_url, pg_schema, pg_admin, other_role, alloc_ledger
):
    """As every role may in ``public`` before PostgreSQL 15 (``public`` was
    left out of this check: nothing is revoked there, it is shared)."""
    assert alloc_ledger("submit", "node-registered", "--node", "n1", url=pg_url).returncode == 0
    pg_admin(f"GRANT CREATE ON SCHEMA {pg_schema} TO PUBLIC")
    refused = alloc_ledger("grant-reporting", other_role, url=pg_url)
    assert refused.returncode != 0
    assert refused.stderr == (
        f"Error: cannot make {other_role} a reporting role: it may still CREATE in schema "
        f"{pg_schema} (as a member of a role that may, or through PUBLIC); nothing was changed: "
        "grant to a role of its own (one that may create in the ledger's schema may run its "
        f"code as the ledger's writers: REVOKE CREATE ON SCHEMA {pg_schema} FROM PUBLIC, as "
        "PostgreSQL 15 does for public, or from the role it has it from)\n"), refused
    assert pg_admin(f"SELECT has_schema_privilege('{other_role}', '{pg_schema}', 'USAGE')") == [
        (False,)], "something was granted"
    pg_admin(f"REVOKE CREATE ON SCHEMA {pg_schema} FROM PUBLIC")
    granted = alloc_ledger("grant-reporting", other_role, url=pg_url)
    assert granted.returncode == 0, granted.stderr


def test_grant_reporting_refuses_where_every_role_may_create_in_public(
    pg_dsn, pg_admin, other_role, alloc_ledger
):
    """A ledger in ``public`` of a database whose ``public`` lets every role
    create (PostgreSQL 14's default) was made a reporting role's without a word."""
    database = f"db_{uuid.uuid4().hex[:12]}"
    pg_admin(f"CREATE DATABASE {database}")
    try:
        parts = urlsplit(pg_dsn)
        url = parts._replace(path=f"/{database}").geturl()
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute("GRANT CREATE ON SCHEMA public TO PUBLIC")
        assert alloc_ledger("submit", "node-registered", "--node", "n1", url=url).returncode == 0
        refused = alloc_ledger("grant-reporting", other_role, url=url)
        assert refused.returncode != 0
        assert refused.stderr.startswith(
            f"Error: cannot make {other_role} a reporting role: it may still CREATE in schema "
            "public (as a member of a role that may, or through PUBLIC); nothing was changed"
        ), refused
        assert "REVOKE CREATE ON SCHEMA public FROM PUBLIC" in refused.stderr
        assert "may create objects in schema public" in alloc_ledger("verify", url=url).stderr
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
        granted = alloc_ledger("grant-reporting", other_role, url=url)
        assert granted.returncode == 0, granted.stderr
        assert alloc_ledger("verify", url=url).stderr == ""
    finally:
        pg_admin(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")


HAND = ("INSERT INTO {schema}.handoff (batch, events, inline, pid, started) "
        "SELECT %s, %s, false, pid, backend_start FROM pg_stat_get_activity(pg_backend_pid())")


WRITERS_KEY = "0123456789abcdef" * 2  # as a writer's: 32 hex digits
# A node's name past the vocabulary's 128 characters, and past what a btree
# index entry holds (incompressible): no writer hands it over (helper-307).
LONG_NAME = "".join(hashlib.sha256(str(i).encode()).hexdigest() for i in range(125))


@pytest.mark.parametrize("key, batch", [
    (WRITERS_KEY, b'[{"type": "heartbeat", "node": "n1", "slots": "not a list"}]'),
    (WRITERS_KEY, b'[{"type": "node-registered", "node": "n9", "slots": 5000}]'),
    (WRITERS_KEY, b'{"type": "heartbeat", "node": "n1"}'),
    (WRITERS_KEY, b"[7]"),
    (WRITERS_KEY, b"not json"),  # helper-306: the leader died on it
    (WRITERS_KEY, b'[{"type": "heartbeat", "node": "a\\u0000b"}]'),  # was exit 3, "0x00"
    ("k" * 9000, b'[{"type": "heartbeat", "node": "n1"}]'),  # was "payload string too long"
    # refused by the server, not by Python (helper-307): were exit 3 for every writer
    (WRITERS_KEY, b'[{"type": "node-registered", "node": "n3", "slots": true}]'),
    (WRITERS_KEY, f'[{{"type": "node-registered", "node": "{LONG_NAME}", "slots": 1}}]'.encode()),
], ids=["slot report not a list", "more slots than a node has", "not a list", "not an event",
        "not json", "a NUL", "a key no writer makes", "slots true", "a name too long"])
def test_a_batch_no_writer_made_handed_over_does_not_stop_every_writer(
    pg_url, pg_schema, pg_dsn, pg_admin, alloc_ledger, key, batch
):
    """A session that may write ``handoff`` put a batch there by hand (or a
    writer of another release did): every round failed on it, and every
    writer with it (``internal error: TypeError …``, exit 1), for as long as
    that session stayed (helper-305). The leader now answers that batch
    invalid and decides the others."""
    with Ledger.open(pg_url) as ledger:
        ledger.submit({"type": "node-registered", "node": "n1", "slots": 1})
    with psycopg.connect(pg_dsn, autocommit=True) as session:  # alive while a leader takes it
        session.execute(HAND.format(schema=pg_schema), (key, batch))
        result = alloc_ledger("submit", "heartbeat", "--node", "n1", url=pg_url, timeout=60)
        assert (result.returncode, result.stderr) == (0, ""), result
        assert json.loads(result.stdout)["status"] == "appended"
        assert pg_admin(f"SELECT count(*) FROM {pg_schema}.handoff") == [(0,)]
    states = [bytes(row[0]) for row in pg_admin(
        f"SELECT state FROM {pg_schema}.stored_events ORDER BY originator_version")]
    assert len(states) == 2 and b'"heartbeat"' in states[1]
    assert alloc_ledger("verify", url=pg_url).returncode == 0


def test_a_round_that_fails_on_well_made_batches_still_surfaces_the_failure(
    pg_url, monkeypatch
):
    """The leader looks at each batch after a round fails so; when none is
    malformed the failure is the code's, and the writer is told it, not
    kept waiting while rounds fail again and again."""
    from ledger.domain import Cluster

    def failing(self: Cluster, event: object, fact: object) -> None:
        raise TypeError("a bug in the heartbeat rule")

    monkeypatch.setattr(Cluster, "heartbeat", failing)  # before the ledger's cluster is made
    with Ledger.open(pg_url) as ledger:
        ledger.submit({"type": "node-registered", "node": "n1", "slots": 1})
        with pytest.raises(TypeError, match="a bug in the heartbeat rule"):
            ledger.submit({"type": "heartbeat", "node": "n1"})


ROOT = Path(__file__).resolve().parents[2]
# Calls that are SQL's syntax, not functions looked up by name.
SYNTAX = {"coalesce", "nullif", "greatest", "least", "exists", "any", "all", "in",
          "values", "row", "array", "cast", "extract", "position", "substring", "trim"}


def builtins_of(pg_admin) -> set[str]:
    """The names of PostgreSQL's own functions (``pg_catalog``)."""
    return {row[0] for row in pg_admin(
        "SELECT DISTINCT proname::text FROM pg_proc "
        "WHERE pronamespace = 'pg_catalog'::regnamespace")}


def calls_in(path: Path) -> Iterator[tuple[int, str]]:
    """Each ``name(`` the string literals of a module hold, with its line,
    unless a ``.`` names its schema (or an f-string's ``{…}`` does, as
    ``{builtin}lag(``); docstrings are prose, not SQL."""
    tree = ast.parse(path.read_text())
    prose = {id(node.body[0].value) for node in ast.walk(tree)
             if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef))
             and node.body and isinstance(node.body[0], ast.Expr)}
    parts = {id(part) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr)
             for part in node.values}
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            text = "".join(part.value if isinstance(part, ast.Constant) else "{}"
                           for part in node.values)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and id(node) not in prose and id(node) not in parts:
            text = node.value
        else:
            continue
        for call in re.finditer(r"(?<![\w.}])([A-Za-z_][A-Za-z0-9_]*)\s*\(", text):
            yield node.lineno, call[1]


def test_every_function_the_ledgers_own_sql_calls_names_pg_catalog(pg_admin):
    """A function of PostgreSQL's called without ``pg_catalog.`` may be taken
    over by one of a better match in the ledger's schema (helper-306 found
    cardinality, pg_stat_get_activity, obj_description, format and
    pg_terminate_backend after unnest was mended): every call in the SQL of
    the PostgreSQL modules, and of the projection tables' PostgreSQL-only
    SQL, names it."""
    builtins = builtins_of(pg_admin)
    unnamed = [f"{path.name}:{line}: {name}("
               for path in sorted((ROOT / "ledger").glob("postgres_*.py"))
               for line, name in calls_in(path) if name in builtins and name not in SYNTAX]
    from projections import tables
    for postgresql in (tables.NOW_TEXT["postgresql"], tables._KEPT["postgresql"]):
        unnamed += [f"tables.py: {call[1]}(" for call in re.finditer(
            r"(?<![\w.])([a-z_][a-z0-9_]*)\s*\(", postgresql) if call[1] in builtins]
    assert unnamed == []


def test_a_writers_text_with_a_backslash_before_u0000_is_not_taken_for_a_nul(pg_url):
    """The leader looks for JSON's escape of NUL in each batch's bytes: a
    text's own backslash before "u0000" is written \\\\u0000 and is no NUL."""
    with Ledger.open(pg_url) as ledger:
        ledger.submit({"type": "node-registered", "node": "n1"})
        for source in ("C:\\u0000", "\\\\u0000", "x\\\\\\u0000y"):
            receipt = ledger.submit({"type": "heartbeat", "node": "n1", "source": source})
            assert receipt.status == "appended", (source, receipt)


@pytest.mark.parametrize("module", ["projections/history.py", "projections/checkpoints.py"])
def test_the_shared_sql_postgresql_runs_names_pg_catalog_too(pg_admin, module):
    """The scan above reads ledger/postgres_*.py: history's missing positions
    called ``LAG(originator_version, 1, 0)`` and the checkpoints' upgrade
    ``convert_to(state::text, 'UTF8')`` unqualified, which an aggregate
    ``lag(bigint, int, int)`` or a ``convert_to(text, text)`` in the ledger's
    schema matches better (helper-307). SQL both databases run names the
    schema where it runs on PostgreSQL (``{builtin}lag(``); ``COUNT(*)``
    and ``MAX`` of a column have no better match."""
    builtins = builtins_of(pg_admin)
    unnamed = [f"{module}:{line}: {name}(" for line, name in calls_in(ROOT / module)
               if name.lower() in builtins
               and name.lower() not in SYNTAX | {"count", "max", "min"}]
    assert unnamed == []
