"""Who may read, and who owns, the projection tables and views on
PostgreSQL, kept across their being made again.

A table or view made again (``replay --repair`` makes one dropped by hand,
and a view redefined; an open makes a log view dropped by hand) starts with
no grants, owned by whoever made it: a role from ``grant-reporting`` could
no longer read it, nor the ledger's own role write it when a superuser made
it. ``kept`` notes each relation of the ledger's families before, and then
gives each one made again, or redefined, what it had:

* one there before and made again since: its own owner and grants, as noted;
* one missing before (dropped by hand): its siblings' owner and what all its
  siblings left as they were share (every role from ``grant-reporting``
  reads them all; a grant by hand on one table alone is not copied), and
  nothing more;
* a view redefined in place keeps its grants (PostgreSQL's ``CREATE OR
  REPLACE``) and gets what its siblings share too.

Siblings are of the same family (the reported tables and views, the
writers' ``state_`` copies, or the log's and writers' own tables) and kind
(tables for a table, views for a view).
A table whose family has no table left (every projection table dropped)
gets the SELECT grants its views share: the reporting roles' (a view left
with no view of its family gets none).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import reduce
from typing import Any, NamedTuple

from psycopg import sql

from projections import tables

# The log's tables and the writers' own (an open makes the hand-over tables
# again when a restore left them out: owned as the log is).
LOG_TABLES = (
    "stored_events", "event_ids", "event_hashes", "tracking", "checkpoints", "handoff",
    "outcomes",
)
FAMILIES = (
    tables.REPORTED,
    tuple(tables.STATE_PREFIX + name for name in (*tables.TABLES, *tables.VIEWS)),
    LOG_TABLES,
)
NAMES = tuple(name for family in FAMILIES for name in family)


class Grant(NamedTuple):
    grantee: str  # a role's name, or PUBLIC
    privilege: str  # SELECT, INSERT, …
    grantable: bool


class Relation(NamedTuple):
    oid: int
    kind: str  # pg_class.relkind: r a table, v a view
    owner: str
    definition: str | None  # a view's
    grants: frozenset[Grant]  # beyond what its owner may


# The ledger's relations of some names in the store's schema, each with its
# grants (a NULL ACL is the owner's default: no one else's).
RELATIONS = (
    "SELECT c.relname, c.oid::int8, c.relkind::text, pg_catalog.pg_get_userbyid(c.relowner), "
    "CASE WHEN c.relkind = 'v' THEN pg_catalog.pg_get_viewdef(c.oid) END, "
    "(SELECT COALESCE(pg_catalog.json_agg(pg_catalog.json_build_array(CASE WHEN a.grantee = 0 "
    "THEN 'PUBLIC' "
    "ELSE pg_catalog.pg_get_userbyid(a.grantee) END, a.privilege_type, a.is_grantable)), '[]') "
    "FROM pg_catalog.aclexplode(COALESCE(c.relacl, pg_catalog.acldefault('r', c.relowner))) a "
    "WHERE a.grantee <> c.relowner) "
    "FROM pg_class c WHERE c.relnamespace = "
    "pg_catalog.to_regnamespace(pg_catalog.current_schema()) "
    "AND c.relname = ANY(%s::text[])"
)


def noted(cursor: Any, names: tuple[str, ...] = NAMES) -> dict[str, Relation]:
    cursor.execute(RELATIONS, (list(names),))
    return {
        row[0]: Relation(row[1], row[2], row[3], row[4], frozenset(Grant(*g) for g in row[5]))
        for row in cursor.fetchall()
    }


@contextmanager
def kept(cursor: Any) -> Iterator[None]:
    """Relations of the ledger's families made again or redefined inside get
    the owner and grants they had (see the module's docstring)."""
    before = noted(cursor)
    yield
    after = noted(cursor)
    for family in FAMILIES:
        untouched = [before[n] for n in family if n in before and after.get(n) == before[n]]
        for name in family:
            now, was = after.get(name), before.get(name)
            if now is None or now == was:
                continue
            if was is not None and was.oid != now.oid:
                _give(cursor, name, now, was.owner, was.grants, exact=True)
            elif was is None:
                owner, grants = _shared(untouched, now.kind)
                _give(cursor, name, now, owner, grants, exact=True)
            else:
                _give(cursor, name, now, None, _shared(untouched, now.kind)[1], exact=False)


def _shared(siblings: list[Relation], kind: str) -> tuple[str | None, frozenset[Grant]]:
    """The owner of all of some siblings (None: they have no one owner), and
    the grants all those of the kind given have; for a table with no table
    left, the SELECT grants all views have (a view's, never a table's: a
    role may read every table and not be meant to read a view)."""
    alike = [s.grants for s in siblings if s.kind == kind]
    if not alike and kind == "r":
        alike = [frozenset(g for g in s.grants if g.privilege == "SELECT")
                 for s in siblings if s.kind == "v"]
    owners = {s.owner for s in siblings}
    shared = reduce(frozenset.intersection, alike) if alike else frozenset()
    return (owners.pop() if len(owners) == 1 else None), shared


def _give(
    cursor: Any, name: str, now: Relation, owner: str | None, grants: frozenset[Grant],
    exact: bool,
) -> None:
    """A relation given an owner (None: as it is) and grants; ``exact``: and
    no others (a schema's default privileges may have given some)."""
    relation = sql.SQL("{} {}").format(
        sql.SQL("VIEW" if now.kind == "v" else "TABLE"), sql.Identifier(name))
    if owner is not None and owner != now.owner:
        cursor.execute(sql.SQL("ALTER {} OWNER TO {}").format(relation, sql.Identifier(owner)))
        now = noted(cursor, (name,))[name]
    grants = frozenset(g for g in grants if g.grantee != now.owner)
    has = now.grants
    if exact:
        revoked = {g.grantee for g in has - grants}
        for grantee in sorted(revoked):
            cursor.execute(sql.SQL("REVOKE ALL ON {} FROM {}").format(
                sql.Identifier(name), _role(grantee)))
        has = frozenset(g for g in has if g.grantee not in revoked)
    for grant in sorted(grants - has):
        if not grant.privilege.isalpha():  # as the server names them: SELECT, INSERT, …
            continue
        cursor.execute(sql.SQL("GRANT {} ON {} TO {}{}").format(
            sql.SQL(grant.privilege), sql.Identifier(name), _role(grant.grantee),
            sql.SQL(" WITH GRANT OPTION" if grant.grantable else "")))


def _role(grantee: str) -> sql.Composable:
    return sql.SQL("PUBLIC") if grantee == "PUBLIC" else sql.Identifier(grantee)
