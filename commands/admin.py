"""Commands that look after the store: project, grant-reporting, schema."""

from __future__ import annotations

import json

import click
from click.core import ParameterSource

from commands import follower
from commands.cli import store_of
from commands.output import echo, line
from ledger.application import Ledger
from ledger.errors import BadOption
from ledger.events import json_schema
from ledger.store import open_store, url_parts

BATCH = 1000


@click.command()
@click.option(
    "--follow", is_flag=True,
    help="Keep the tables current as other processes append, until interrupted.",
)
@click.option(
    "--batch", default=BATCH, show_default=True, type=click.IntRange(1, 100_000),
    help="Most events applied in one transaction (with its tracking position).",
)
@click.option(
    "--poll", default=1.0, show_default=True, type=click.FloatRange(0.01, 3600),
    help="With --follow: seconds between checks when no notification arrives.",
)
@click.option(
    "--reconnect/--no-reconnect", default=True, show_default=True,
    help="With --follow: when the store is lost, reopen it (after 1 s, doubling up to "
    "30 s) and go on, or exit 3.",
)
@click.option(
    "--quiet", is_flag=True,
    help="With --follow: print only the lines that start, resume and stop following, not "
    "one per transaction (about one a second for a busy store).",
)
@click.pass_context
def project(
    ctx: click.Context, follow: bool, batch: int, poll: float, reconnect: bool, quiet: bool,
) -> None:
    """Bring the projection tables up to date with the log.

    Events are applied in transactions of at most --batch events, each
    recording how far it got, so an interrupted run (even kill -9) resumes
    where it stopped and never applies an event twice. With --follow, keep
    going: on PostgreSQL each append wakes the follower (LISTEN/NOTIFY); one
    JSON progress line is printed per transaction (none with --quiet), and
    Ctrl-C, SIGTERM or SIGHUP stops it cleanly. Several followers may run at
    once: each transaction locks the tracking row, so no event is applied twice. A follower that loses the
    store (a server restart) warns on stderr and reconnects, unless
    --no-reconnect; a store that cannot be opened at the start is exit 3.

    \b
    Example: alloc-ledger project
    Example: alloc-ledger --store postgresql://ledger@db/ops project --follow
    """
    url = store_of(ctx)
    # A mistyped path or schema must not become an empty ledger that a
    # follower then keeps "current" forever: only submit makes a store.
    if follow:
        follower.follow(url, batch, poll, reconnect, progress=not quiet)
        return
    for name, flag in (("poll", "--poll"), ("reconnect", "--reconnect/--no-reconnect"),
                       ("quiet", "--quiet")):
        if ctx.get_parameter_source(name) is not ParameterSource.DEFAULT:
            raise click.UsageError(f"{flag} goes with --follow")
    with Ledger.open(url, create=False) as ledger:
        first, last = follower.catch_up(ledger, batch)
    line({"from": first, "to": last, "applied": last - first})


@click.command("grant-reporting")
@click.argument("role")
@click.pass_context
def grant_reporting(ctx: click.Context, role: str) -> None:
    """Let a database ROLE read the projection tables and views, and nothing else.

    Grants USAGE on the store's schema and SELECT on the projection tables
    (nodes, slots, allocations, alloc_states, addresses, rejections) and views
    (needs_reconnect, zombie_slots, projection_status, log_positions); never the event log
    (stored_events, event_ids, event_hashes), tracking or the writers'
    state_* tables. Whatever else the role was granted on the ledger's tables
    is revoked; a superuser, or a role that would still write them through
    another role, is refused. The role must exist (CREATE ROLE grafana LOGIN
    PASSWORD '…'). PostgreSQL only.
    Prints the schema: the role names the tables in it (ledger.nodes), or has
    it on its path (ALTER ROLE grafana SET search_path = ledger, public).

    Example: alloc-ledger --store postgresql://ledger@db/ops grant-reporting grafana
    """
    if not role.strip():
        raise click.BadParameter("a role name is needed", param_hint="ROLE")
    url = store_of(ctx)
    if url_parts(url).scheme not in ("postgresql", "postgres"):
        raise BadOption(
            "--store", "grant-reporting needs a PostgreSQL store (SQLite has no roles: give "
            "reporting tools a read-only connection, e.g. sqlite3 'file:ledger.db?mode=ro')"
        )
    store = open_store(url, create=False)
    try:
        granted = getattr(store, "grant_reporting")(role)  # noqa: B009 - PostgreSQL only
    finally:
        store.close()
    if role.lower() == "public":  # PostgreSQL's name for every role, now and later
        click.echo("warning: PUBLIC is every role, those made later too: each of them may "
                   "now read the projection tables", err=True)
    line({"role": role, "schema": getattr(store, "schema"), "select": granted})  # noqa: B009


@click.command()
def schema() -> None:
    """Print the JSON Schema of the event vocabulary.

    Example: alloc-ledger schema > event.schema.json
    """
    echo(json.dumps(json_schema(), indent=2))


COMMANDS = [project, schema, grant_reporting]
