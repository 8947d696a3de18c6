"""``alloc-ledger query NAME``: the questions, live or as of any point."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import click

from commands.cli import CommandGroup, opened
from commands.output import Rows, emit, emit_object, format_option
from ledger.errors import counted
from ledger.model import LIVE, TERMINAL, not_utf8
from projections.answers import Answers, answering
from projections.asof import AsOf, head_within, moment_of, rebuild
from projections.history import search as history_of
from projections.queries import COLUMNS


@click.group(cls=CommandGroup)
def query() -> None:
    """Ask the ledger a question: alloc-ledger query NAME [--as-of P] [--format F]."""


def query_options(command: Callable[..., Any]) -> Callable[..., Any]:
    command = format_option(command)
    command = click.option(
        "--wait",
        is_flag=True,
        expose_value=False,
        callback=_remember,
        help="Bring the projection tables up to date with the log before answering "
        "(PostgreSQL; on SQLite they are always up to date).",
    )(command)
    return click.option(
        "--as-of",
        "as_of",
        metavar="POSITION|TIMESTAMP",
        help="Answer from history as it was right after a position, or at an RFC 3339 time.",
    )(command)


def _remember(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    ctx.meta[f"query.{param.name}"] = value
    return value


def _point(as_of: str | None) -> AsOf | None:
    return None if as_of is None else AsOf.parse(as_of)


@contextmanager
def answered(ctx: click.Context, as_of: str | None) -> Iterator[Answers]:
    """The answers the command line asks for (``projections.answers``); when
    the live tables lag behind the log, every answer is preceded by ``lag: N
    positions behind the log (…)`` on stderr, so stdout stays the answer."""
    point = _point(as_of)  # a usage error before the store is opened
    with opened(ctx) as store, answering(store, point, bool(ctx.meta.get("query.wait"))) as found:
        if found.behind:
            click.echo(f"lag: {counted(found.behind, 'position')} behind the log (the "
                       f"answer is as of position {found.position} of "
                       f"{found.position + found.behind})", err=True)
        yield found


def _named(name: str, help_text: str) -> Callable[[Callable[..., Any]], click.Command]:
    def decorate(function: Callable[..., Any]) -> click.Command:
        function.__doc__ = help_text
        return query.command(name)(query_options(click.pass_context(function)))

    return decorate


class NameType(click.ParamType):  # type: ignore[type-arg]  # generic from click 8.2 on
    """A name as the ledger keeps it: UTF-8 text (a command line in another
    encoding arrives as undecodable bytes) that is not empty."""

    name = "name"

    def __init__(self, what: str) -> None:
        self.what = what

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        text = str(value)
        if not_utf8(text):
            shown = text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
            self.fail(f"{shown} is not UTF-8 (the ledger's names are UTF-8 text)", param, ctx)
        if not text.strip():
            self.fail(f"{self.what} is needed, not an empty text", param, ctx)
        return text


@_named("needs-reconnect", """Allocations whose last alloc state is unknown (Nomad NeedsToReconnect).

    Example: alloc-ledger query needs-reconnect --now 2026-01-01T00:10:00Z""")
@click.option(
    "--now",
    help="Time to judge deadlines against (RFC 3339). Default: now; with --as-of, "
    "the time of that point (its TIMESTAMP, or the latest event time up to its POSITION).",
)
def needs_reconnect(ctx: click.Context, as_of: str | None, fmt: str | None, now: str | None) -> None:
    given = None if now is None else moment_of(now, "--now")
    with answered(ctx, as_of) as found:
        emit(found.needs_reconnect(given), COLUMNS["needs-reconnect"], fmt)


@_named("zombie-slots", """Slots a node reports as held although history says otherwise.

    Example: alloc-ledger query zombie-slots --format csv""")
def zombie_slots(ctx: click.Context, as_of: str | None, fmt: str | None) -> None:
    with answered(ctx, as_of) as found:
        emit(found.zombie_slots(), COLUMNS["zombie-slots"], fmt)


@_named("slots", """The slot table per node: the ledger's view and the node's last report.

    Example: alloc-ledger query slots --node n1""")
@click.option("--node", type=NameType("a node name"), help="Only this node.")
def slots(ctx: click.Context, as_of: str | None, fmt: str | None, node: str | None) -> None:
    with answered(ctx, as_of) as found:
        emit(found.slots(node), COLUMNS["slots"], fmt)


@_named("nodes", """Nodes with status, health and last heartbeat.

    Example: alloc-ledger query nodes --as-of 120""")
def nodes(ctx: click.Context, as_of: str | None, fmt: str | None) -> None:
    with answered(ctx, as_of) as found:
        emit(found.nodes(), COLUMNS["nodes"], fmt)


@_named("allocs", """Allocations (not yet removed), optionally filtered.

    Example: alloc-ledger query allocs --node n1 --status running""")
@click.option("--node", type=NameType("a node name"), help="Only allocations on this node.")
@click.option("--job", type=NameType("a job name"), help="Only allocations of this job.")
@click.option(
    "--status", type=click.Choice(sorted(LIVE | TERMINAL)),
    help="Only allocations with this client status.",
)
def allocs(
    ctx: click.Context, as_of: str | None, fmt: str | None,
    node: str | None, job: str | None, status: str | None,
) -> None:
    with answered(ctx, as_of) as found:
        emit(found.allocs(node, job, status), COLUMNS["allocs"], fmt)


@_named("alloc", """One allocation with its alloc states and its history.

    Example: alloc-ledger query alloc a1""")
@click.argument("alloc_id", metavar="ALLOC", type=NameType("an allocation id"))
def alloc(ctx: click.Context, as_of: str | None, fmt: str | None, alloc_id: str) -> None:
    with answered(ctx, as_of) as answers:
        found, position = answers.alloc(alloc_id), answers.position
    with opened(ctx) as store:
        history = history_of(store, alloc_id, position)
        rows = Rows(history.rows)  # read from the log as they are printed
        if found is None:
            when = "" if position is None else f" at position {position}"
            also = (f" (events name it: alloc-ledger query history {alloc_id})"
                    if rows.peek() is not None else "")
            raise click.ClickException(f"allocation {alloc_id} is not in the ledger{when}{also}")
        found["history"] = rows
        emit_object(found, fmt)
    history.check_whole()  # after the answer, as a failed check's report comes first


@_named("addresses", """Held addresses: held, or releasing once a stop or removal is requested.

    Example: alloc-ledger query addresses""")
def addresses(ctx: click.Context, as_of: str | None, fmt: str | None) -> None:
    with answered(ctx, as_of) as found:
        emit(found.addresses(), COLUMNS["addresses"], fmt)


@_named("suspects", """Suspect nodes, and down nodes with the allocations they took with them.

    Example: alloc-ledger query suspects""")
def suspects(ctx: click.Context, as_of: str | None, fmt: str | None) -> None:
    with answered(ctx, as_of) as found:
        emit(found.suspects(), COLUMNS["suspects"], fmt)


@_named("rejections", """The rejection log: refused events with their reasons.

    Example: alloc-ledger query rejections --format jsonl""")
def rejections(ctx: click.Context, as_of: str | None, fmt: str | None) -> None:
    with answered(ctx, as_of) as found:
        emit(found.rejections(), COLUMNS["rejections"], fmt)


@_named("history", """Every event and rejection touching a node, allocation, slot (n1#0) or address.

    Positions missing from the log, or events found that cannot be read, are
    named on stderr after the history (exit 1): it may be incomplete.

    Example: alloc-ledger query history n1#0""")
@click.argument(
    "entity", type=NameType("a node, allocation, slot (n1#0) or address"))
def history(ctx: click.Context, as_of: str | None, fmt: str | None, entity: str) -> None:
    point = _point(as_of)
    with opened(ctx) as store:
        upto = None
        if point is not None:
            head_within(store, point.position, "--as-of")
            upto = point.position if point.at is None else rebuild(store, point)[1]
        found = history_of(store, entity, upto)
        rows = Rows(found.rows)  # read from the log as they are printed
        if rows.peek() is None and found.whole:  # a mistyped name must not read as a quiet history
            when = "" if upto is None else f" at position {upto}"
            raise click.ClickException(f"no event or rejection names {entity}{when}")
        emit(rows, COLUMNS["history"], fmt)
    found.check_whole()  # what it lacks, after what it found (exit 1, as a failed check)


COMMANDS = [query]
