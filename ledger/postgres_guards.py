"""PostgreSQL: the log's append-only guards (triggers that refuse to
change the log, its hash chain and its client ids), how to tell which are
not as made, and what roles that may create in the ledger's schema put at risk."""

from __future__ import annotations

from psycopg import sql

APPEND_ONLY_TABLES = ("stored_events", "event_hashes", "event_ids")
# The body of the function every guard runs, as every store has it (one
# replaced by hand is no guard).
REFUSAL = """
       BEGIN
           RAISE EXCEPTION 'the event log is append-only: % on % refused', TG_OP, TG_TABLE_NAME
               USING ERRCODE = 'insufficient_privilege';
       END """
# The log, its hash chain and its client ids are append-only (a lost id would
# let a retry append its event again): a trigger refuses UPDATE and DELETE,
# another TRUNCATE, on each. A store made before the ids were guarded, or
# whose guards were dropped, disabled or altered by hand (to "fix a row"),
# or whose function was dropped or replaced, is guarded again when next
# opened by a role that may (the tables' owner). Each guard: its table, its
# name, what it refuses, and how it fires (pg_trigger.tgtype: FOR EACH ROW 1,
# BEFORE 2, DELETE 8, UPDATE 16, TRUNCATE 32).
GUARDED = [
    (table, f"{table}_{name}", f"{refused} ON {table} FOR EACH {each}", fires)
    for table in APPEND_ONLY_TABLES
    for name, refused, each, fires in (
        ("append_only", "UPDATE OR DELETE", "ROW", 1 | 2 | 8 | 16),
        ("no_truncate", "TRUNCATE", "STATEMENT", 2 | 32))
]
GUARDS = [
    f"CREATE OR REPLACE FUNCTION refuse_change() RETURNS trigger LANGUAGE plpgsql AS $${REFUSAL}$$",
    *(f"CREATE OR REPLACE TRIGGER {name} BEFORE {refused} EXECUTE FUNCTION refuse_change()"
      for _, name, refused, _ in GUARDED),
]
# Each guard that is not as made, and how (``missing``, ``disabled``:
# disabled or firing only for replicas, ``altered``: another function, other
# events or columns, a condition; the function missing or its body replaced),
# in the order of ``GUARDS``; NULL for one in place.
GUARD_STATES = (
    "SELECT g.name, CASE WHEN t.oid IS NULL THEN 'missing' "
    "WHEN t.tgenabled IN ('D', 'R') THEN 'disabled' "
    "WHEN t.tgfoid IS DISTINCT FROM pg_catalog.to_regprocedure(%(refusal)s) OR t.tgtype <> g.fires "
    "OR t.tgqual IS NOT NULL OR t.tgattr <> ''::int2vector THEN 'altered' END AS how, g.n "
    "FROM ROWS FROM (pg_catalog.unnest(%(guarded)s::text[]), "
    "pg_catalog.unnest(%(guards)s::text[]), pg_catalog.unnest(%(fires)s::int2[])) "
    "WITH ORDINALITY g(relation, name, fires, n) "
    "LEFT JOIN pg_trigger t ON t.tgrelid = pg_catalog.to_regclass(g.relation) AND t.tgname = "
    "g.name "
    "UNION ALL SELECT 'refuse_change()', CASE WHEN p.oid IS NULL THEN 'missing' "
    "WHEN p.prosrc <> %(body)s THEN 'altered' END, 0 "
    "FROM (SELECT pg_catalog.to_regprocedure(%(refusal)s) AS oid) f LEFT JOIN pg_proc p ON p.oid "
    "= f.oid"
)
UNGUARDED = f"SELECT name, how FROM ({GUARD_STATES}) s WHERE how IS NOT NULL ORDER BY n"
# The roles besides the schema's owner and the log's (or a member of theirs:
# the ledger's own writers) that may create in it (PUBLIC: all).
CREATORS = (
    "SELECT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE pg_catalog.pg_get_userbyid(a.grantee) END "
    "FROM pg_catalog.pg_namespace s, pg_catalog.aclexplode(COALESCE(s.nspacl, "
    "pg_catalog.acldefault('n', s.nspowner))) a WHERE s.nspname = %(schema)s "
    "AND a.privilege_type = 'CREATE' AND a.grantee <> s.nspowner AND (a.grantee = 0 OR NOT "
    "COALESCE(pg_catalog.pg_has_role(a.grantee, (SELECT c.relowner FROM pg_catalog.pg_class c "
    "WHERE c.oid = pg_catalog.to_regclass(%(log)s)), 'MEMBER'), false)) ORDER BY 1"
)
OWNER = ("SELECT pg_catalog.pg_get_userbyid(relowner) FROM pg_class "
         "WHERE oid = pg_catalog.to_regclass(%s)")


def exposed(schema: str, creators: list[str]) -> str:
    """What roles besides its owner that may create in the ledger's schema
    put at risk ("" if there are none)."""
    if not creators:
        return ""
    who = ", ".join("every role (PUBLIC)" if role == "PUBLIC" else role for role in creators)
    named = ", ".join(
        role if role == "PUBLIC" else sql.Identifier(role).as_string(None) for role in creators)
    return (
        f"{who} may create objects in schema {schema}, which the ledger's sessions search: "
        "a function made there to match a call better than PostgreSQL's own runs as the "
        "writer that calls it, with its rights over the log; REVOKE CREATE ON SCHEMA "
        f"{schema} FROM {named}, or keep the ledger in a schema of its own "
        "(docs/postgresql.md, Security)"
    )
