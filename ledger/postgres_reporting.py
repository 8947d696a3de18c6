"""PostgreSQL: who may read the projection tables and views, and who
holds them: a reporting role granted reading and nothing else, the grants
kept across their being made again, and the sessions holding a lock on them."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import psycopg
from eventsourcing.persistence import PersistenceError
from psycopg import sql
from psycopg.rows import tuple_row

from ledger import postgres_access
from ledger.errors import GrantRefused, first_few
from ledger.postgres_connections import PostgresConnections
from ledger.postgres_errors import denied, describe
from ledger.postgres_schema import OWN_TABLES
from projections import tables

# Who holds a lock on which of the ledger's relations (a repair's error names them).
HOLDERS = """
SELECT DISTINCT c.relname, a.pid, coalesce(a.application_name, ''), coalesce(a.state, '')
FROM pg_locks l
JOIN pg_class c ON c.oid = l.relation
JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.granted AND l.pid <> pg_catalog.pg_backend_pid() AND n.nspname = %s AND c.relname = ANY(%s)
ORDER BY c.relname, a.pid
"""


def _rows(connection: Any, statement: str, params: Any) -> list[Any]:
    return list(connection.execute(statement, params).fetchall())


# The sequences of the ledger's tables (a serial column's), by schema and name.
SEQUENCES_OF = (
    "SELECT DISTINCT ns.nspname AS nsp, s.relname AS rel FROM pg_depend d "
    "JOIN pg_class s ON s.oid = d.objid AND s.relkind = 'S' "
    "JOIN pg_namespace ns ON ns.oid = s.relnamespace "
    "WHERE d.classid = 'pg_class'::regclass AND d.refclassid = 'pg_class'::regclass "
    "AND d.refobjid = ANY(SELECT pg_catalog.to_regclass(t) FROM pg_catalog.unnest(%s::text[]) t) "
    "ORDER BY 1, 2"
)
# What a role may still do on the ledger's tables, sequences and schema
# beyond reading the projections: through a role it belongs to, or PUBLIC.
BEYOND_READING = (
    "SELECT pg_catalog.format('%%s on %%s', p, n) AS what FROM "
    "pg_catalog.unnest(%(ledger)s::text[]) n, "
    "pg_catalog.unnest(array['SELECT', 'INSERT', 'UPDATE', 'REFERENCES']) p "
    "WHERE (p <> 'SELECT' OR n <> ALL(%(names)s::text[])) "  # a column's privilege too
    "AND pg_catalog.has_any_column_privilege(%(role)s::text, pg_catalog.format('%%I.%%I', "
    "%(schema)s::text, n), p) "
    "UNION ALL SELECT pg_catalog.format('%%s on %%s', p, n) FROM "
    "pg_catalog.unnest(%(ledger)s::text[]) n, "
    "pg_catalog.unnest(array['DELETE', 'TRUNCATE', 'TRIGGER']) p "
    "WHERE pg_catalog.has_table_privilege(%(role)s::text, pg_catalog.format('%%I.%%I', "
    "%(schema)s::text, n), p) "
    "UNION ALL SELECT pg_catalog.format('%%s on sequence %%s', p, q) FROM "
    "pg_catalog.unnest(%(sequences)s::text[]) q, "
    "pg_catalog.unnest(array['USAGE', 'SELECT', 'UPDATE']) p "
    "WHERE pg_catalog.has_sequence_privilege(%(role)s::text, q, p) "
    "UNION ALL SELECT pg_catalog.format('CREATE in schema %%s', %(schema)s::text) "
    "WHERE pg_catalog.has_schema_privilege(%(role)s::text, %(schema)s::text, 'CREATE')"
)


def _more_than_granted(run: Callable[..., list[Any]], role: str, schema: str) -> str | None:
    """Why a role would keep more than any grant gives it: it is a superuser,
    or owns (or belongs to the owner of) the ledger's schema or tables; so it
    is refused before anything is revoked (an owner revoking its own
    privileges would lock the ledger's writers out)."""
    found = run(
        "SELECT r.rolsuper AS superuser, (SELECT pg_catalog.array_agg(c.relname::text ORDER BY "
        "c.relname) "
        "FROM pg_class c JOIN pg_namespace ns ON ns.oid = c.relnamespace "
        "WHERE ns.nspname = %s AND c.relname = ANY(%s::text[]) "
        "AND pg_catalog.pg_has_role(r.oid, c.relowner, 'MEMBER')) AS owned "
        "FROM pg_roles r WHERE r.rolname = %s",
        (schema, [*tables.REPORTED, *OWN_TABLES], role))
    if not found:
        return None  # no such role: the grant says so
    if found[0]["superuser"]:
        return "it is a superuser, which reads and writes everything whatever it is granted"
    if found[0]["owned"]:
        return (f"it owns {first_few(found[0]['owned'])} (or is a member of their owner), "
                "and an owner may do anything with them")
    return None


def _may_not_grant(role: str, names: list[str]) -> str:
    return (f"cannot grant reporting to {role}: this connection's role may not grant "
            f"SELECT on {', '.join(names)} (the owner of the ledger's schema can)")


class PostgresReporting(PostgresConnections):
    """The projection tables and views as reporting tools see them."""

    state_prefix: str

    def holders(self, relations: list[str]) -> list[str]:
        """Other sessions holding a lock on these tables or views (none given:
        any projection table or view): which, and who (pid, application,
        state), as ``pg_stat_activity`` says."""
        names = relations or [*tables.REPORTED, *(self.state_prefix + t for t in tables.TABLES)]
        with self.datastore.get_connection() as connection:
            rows = connection.cursor(row_factory=tuple_row).execute(
                HOLDERS, (self.schema, names)).fetchall()
        held: dict[str, list[str]] = {}
        for relation, pid, application, state in rows:
            who = f"pid {pid}" + (f" {application!r}" if application else "") + (
                f", {state}" if state else "")
            if who not in held.setdefault(relation, []):
                held[relation].append(who)
        return [f"{relation} (held by {'; '.join(who)})" for relation, who in held.items()]

    def keeping_grants(self, cursor: Any) -> Any:
        """Projection tables and views made again or redefined inside are
        readable, and owned, as before (``postgres_access``)."""
        return postgres_access.kept(cursor)

    def grant_reporting(self, role: str) -> list[str]:
        """Let a role read the projection tables and views, and nothing else:
        whatever it was granted on the ledger's other tables and sequences,
        or beyond SELECT on these, is revoked; a role that would still have
        more (a superuser, an owner, a member of a role that may write) is
        refused, nothing changed."""
        names = list(tables.REPORTED)
        schema, grantee = sql.Identifier(self.schema), sql.Identifier(role)
        try:
            with self.datastore.get_connection() as connection, connection.transaction():
                run = partial(_rows, connection)
                if (why := _more_than_granted(run, role, self.schema)) is not None:
                    raise GrantRefused(f"cannot make {role} a reporting role: {why}; "
                                      "nothing was changed: grant to a role of its own")
                ledger = [row["n"] for row in run(  # as far as they exist
                    "SELECT n FROM pg_catalog.unnest(%s::text[]) n "
                    "WHERE pg_catalog.to_regclass(pg_catalog.format('%%I.%%I', %s::text, n)) IS "
                    "NOT NULL",
                    ([*names, *OWN_TABLES], self.schema))]
                sequences = [(row["nsp"], row["rel"]) for row in run(SEQUENCES_OF, (
                    [f'"{self.schema}"."{n}"' for n in ledger],))]
                statements = [
                    sql.SQL("REVOKE ALL ON {} FROM {}").format(
                        sql.SQL(", ").join(sql.Identifier(self.schema, n) for n in ledger),
                        grantee),
                    *([sql.SQL("REVOKE ALL ON SEQUENCE {} FROM {}").format(
                        sql.SQL(", ").join(sql.Identifier(*q) for q in sequences), grantee)]
                      if sequences else []),
                    # public is shared: what else the role creates there is not the ledger's
                    *([sql.SQL("REVOKE CREATE ON SCHEMA {} FROM {}").format(schema, grantee)]
                      if self.schema != "public" else []),
                    sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(schema, grantee),
                    sql.SQL("GRANT SELECT ON {} TO {}").format(
                        sql.SQL(", ").join(sql.Identifier(self.schema, n) for n in names),
                        grantee),
                ]
                for statement in statements:
                    connection.execute(statement)
                # A GRANT by a role that may not grant only warns: check what took.
                missing = [row["n"] for row in run(
                    "SELECT n FROM pg_catalog.unnest(%s::text[]) n "
                    "WHERE NOT pg_catalog.has_table_privilege(%s::text, "
                    "pg_catalog.format('%%I.%%I', %s::text, n), "
                    "'SELECT') OR NOT pg_catalog.has_schema_privilege(%s::text, %s::text, 'USAGE')",
                    (names, role, self.schema, role, self.schema))]
                if missing:
                    raise GrantRefused(_may_not_grant(role, missing))
                beyond = [row["what"] for row in run(BEYOND_READING, {
                    "ledger": ledger, "names": names, "role": role, "schema": self.schema,
                    "sequences": [f'"{nsp}"."{rel}"' for nsp, rel in sequences]})]
                if beyond:
                    creates = (
                        f" (one that may create in the ledger's schema may run its code as "
                        f"the ledger's writers: REVOKE CREATE ON SCHEMA {self.schema} FROM "
                        "PUBLIC, as PostgreSQL 15 does for public, or from the role it has it "
                        "from)"
                    ) if any(w.startswith("CREATE in schema") for w in beyond) else ""
                    raise GrantRefused(
                        f"cannot make {role} a reporting role: it may still {first_few(beyond)} "
                        "(as a member of a role that may, or through PUBLIC); nothing was "
                        f"changed: grant to a role of its own{creates}"
                    )
        except (psycopg.Error, PersistenceError) as error:
            if denied(error):  # a REVOKE on what it has no privilege on at all
                raise GrantRefused(_may_not_grant(role, names)) from None
            raise GrantRefused(f"cannot grant reporting to {role}: {describe(error)}") from None
        return names
