"""PostgreSQL: a database error told in one line, with what to do about
the ones a user can act on (a statement timeout, a read-only server, a role
that may not use the ledger's tables)."""

from __future__ import annotations

import re

import psycopg
from eventsourcing.persistence import PersistenceError

from projections import tables

# What to do about a database's (or role's) ``statement_timeout`` that a
# batch's statements outlast: managed PostgreSQL often sets one low.
STATEMENT_TIMEOUT = (
    "the server's statement_timeout cut it short: use smaller batches (--batch), or raise "
    "it for this role, e.g. ALTER ROLE name SET statement_timeout = '5min'"
)

READ_ONLY = (
    "the server takes no writes: a standby in recovery, or default_transaction_read_only "
    "set for this role or database; give --store the primary"
)

ROLE_DENIED = (
    "alloc-ledger's commands need a role that may use the ledger's own tables, such as their "
    "owner; a role from grant-reporting reads the projection tables with SQL only"
)


def describe(error: BaseException, hint: bool = True) -> str:
    """One line for a database error: the server's message, without libpq's
    hints, with ours for a statement timeout, a read-only server or a privilege refused."""
    cause = error.__cause__ if isinstance(error, PersistenceError) and error.__cause__ else error
    diag = getattr(cause, "diag", None)
    primary = getattr(diag, "message_primary", None)
    text = primary or str(cause) or type(cause).__name__
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    line = lines[0] if lines else type(cause).__name__
    if hint and isinstance(cause, psycopg.errors.QueryCanceled) and "statement timeout" in line:
        return f"{line} ({STATEMENT_TIMEOUT})"
    if hint and isinstance(cause, psycopg.errors.ReadOnlySqlTransaction):
        return f"{line} ({READ_ONLY})"  # 'cannot execute LISTEN during recovery' and the like
    if hint and isinstance(cause, psycopg.errors.InsufficientPrivilege) and re.match(
        r"permission denied for (table|view|sequence|relation) ", line
    ):  # not for a database or schema: creating a ledger asks for more
        return f"{line} ({ROLE_DENIED})"
    return tables.with_repair_hint(line) if hint else line


def denied(error: BaseException) -> bool:
    """Whether the server refused a privilege (the event recorder wraps its errors)."""
    cause = error.__cause__ if isinstance(error, PersistenceError) else error
    return isinstance(cause, psycopg.errors.InsufficientPrivilege)
