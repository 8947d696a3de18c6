"""Audit commands: replay, verify, digest, audit."""

from __future__ import annotations

import json
from functools import partial
from typing import Any

import click

from commands.cli import opened
from commands.output import Rows, chosen, echo, emit, emit_object, format_option
from ledger.chain import Digest, current_digest, one_of
from ledger.chain import verify as verify_chain
from ledger.errors import NotADigest
from projections.asof import is_position
from projections.audit import COLUMNS as AUDIT_COLUMNS
from projections.audit import SECTIONS, AuditReport
from projections.audit import audit as audit_history
from projections.repair import repair as repair_projections
from projections.replay import replay as replay_projections


class Position(click.IntRange):
    """A position: digits 0-9 only (``int`` would take ``0_3`` and other
    scripts' digits)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not is_position(value):
            self.fail(f"{value!r} is not a position (digits 0-9)", param, ctx)
        return super().convert(value, param, ctx)


class DigestType(click.ParamType):  # type: ignore[type-arg]  # generic from click 8.2 on
    name = "POSITION:HASH"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, Digest):
            return value
        try:
            return Digest.parse(str(value))
        except NotADigest as error:
            self.fail(str(error), param, ctx)


@click.command()
@click.option(
    "--to", "to", type=Position(min=0), metavar="POSITION",
    help="Replay up to this position and compare with the as-of state there "
    "(default: compare with the live tables).",
)
@click.option(
    "--repair", is_flag=True,
    help="Where the live tables differ, replace them with the replay at the head of the log "
    "(tables dropped by hand are made again); exit 0 once repaired.",
)
@format_option
@click.pass_context
def replay(ctx: click.Context, to: int | None, repair: bool, fmt: str | None) -> None:
    """Rebuild every projection from the log into scratch tables and compare
    them row by row with the live tables; report events/s and every difference.

    The live tables are only read, unless --repair is given; the scratch
    tables (replay_…_) are dropped afterwards. Exit 1 on any difference
    left unrepaired.

    \b
    alloc-ledger replay
    alloc-ledger replay --to 1200 --format json
    alloc-ledger replay --repair
    """
    if repair and to is not None:
        raise click.UsageError(
            "--repair replaces the live tables with the replay at the head of the log; "
            "--to compares with the state at a position: give one of them")
    with opened(ctx) as store:
        report = (repair_projections(store, waiting=lambda line: click.echo(line, err=True))
                  if repair else replay_projections(store, to))
    emit_object(report.as_dict(), fmt)
    if report.repaired is not None:
        count = len(report.differences)
        click.echo(f"repaired: {count} difference{'s' if count != 1 else ''} with "
                   f"{report.compared_with}; the live tables now hold the replay of the log up "
                   f"to position {report.repaired} (running writers load what they decide "
                   "against again with their next batch)", err=True)
    elif not report.ok:
        count = len(report.differences)
        raise click.ClickException(
            f"replay found {count} difference{'s' if count != 1 else ''} "
            f"with {report.compared_with}"
        )


@click.command()
@click.option(
    "--digest", "digest", type=DigestType(),
    help="A digest saved earlier (from `alloc-ledger digest`): prove the log still extends it.",
)
@click.option(
    "--since", "since", type=DigestType(), metavar="POSITION:HASH",
    help="A digest saved earlier: check only the events after it (the log must keep its "
    "hash at its position), not the whole log again.",
)
@format_option
@click.pass_context
def verify(
    ctx: click.Context, digest: Digest | None, since: Digest | None, fmt: str | None
) -> None:
    """Recompute the tamper-evident hash chain over the log and name the first
    position that does not match. Exit 1 on any mismatch.

    With --since, only the events appended after a digest kept earlier are
    read: the log must keep that digest's hash at its position, and every
    event after it must chain from there. What lies before it is not read
    again; a whole `verify` checks that.

    Also says whether the triggers that keep the log append-only are in
    place ("guards_lacking": [] when all are); when any is missing or
    altered, a warning on stderr says how to make them again (exit 0 all
    the same: that proves no edit).

    \b
    alloc-ledger verify
    alloc-ledger verify --digest "$(cat ledger.digest)"
    alloc-ledger verify --since "$(cat yesterday.digest)"
    """
    one_of(digest, since)  # before the store is opened: a usage error
    with opened(ctx) as store:
        result = verify_chain(store, digest, since)
    emit_object(result.as_dict(), fmt)
    if result.guards.lacking:
        click.echo(f"warning: the log's append-only guards are not in place "
                   f"({', '.join(result.guards.lacking)}): nothing stops an edit of the log "
                   f"until they are made again; {result.guards.remedy}", err=True)
    if result.guards.exposed:
        click.echo(f"warning: {result.guards.exposed}", err=True)
    if not result.ok:
        where = "" if result.position is None else f" at position {result.position}"
        raise click.ClickException(f"verify failed{where}: {result.problem}")


@click.command()
@click.option(
    "--format", "fmt", type=click.Choice(("text", "json")), default="text", show_default=True,
    help="text: POSITION:HASH alone; json: an object with position, hash and digest.",
)
@click.pass_context
def digest(ctx: click.Context, fmt: str) -> None:
    """Print the head of the hash chain (POSITION:HASH) to keep elsewhere.

    Later, `alloc-ledger verify --digest POSITION:HASH` proves the log still
    extends it: nothing up to that position was changed or removed.

    \b
    alloc-ledger digest > ledger.digest
    """
    with opened(ctx) as store:
        head = current_digest(store)
    if fmt == "json":
        echo(json.dumps({"position": head.position, "hash": head.hash, "digest": str(head)}))
    else:
        echo(str(head))


@click.command()
@click.option("--from", "start", type=Position(min=1), metavar="POSITION",
              help="First position of the range (default: 1).")
@click.option("--to", "end", type=Position(min=0), metavar="POSITION",
              help="Last position of the range (default: the head).")
@click.option(
    "--format", "fmt", type=click.Choice(("table", "json", "jsonl")), default=None,
    help="table: one table per section; json: one object; jsonl: one finding per line "
    "with its section (default: table on a terminal, json when piped).",
)
@click.pass_context
def audit(ctx: click.Context, start: int | None, end: int | None, fmt: str | None) -> None:
    """Report everything unusual in a range of history: rejections, reconnects
    (how long each allocation was unknown), zombie slots (when each appeared
    and cleared), addresses held past a stop or remove request, suspect nodes,
    and nodes going down with what they took with them.

    \b
    alloc-ledger audit
    alloc-ledger audit --from 1000 --to 2000 --format json
    """
    with opened(ctx) as store:
        report = audit_history(store, start, end)
    try:  # the findings are read from their temporary file as they are printed
        _print(report, chosen(fmt))
    finally:
        report.close()


def _print(report: AuditReport, fmt: str) -> None:
    if fmt == "jsonl":
        for section in SECTIONS:
            found = ({"section": section} | row for row in report.rows(section))
            emit(found, ("section",) + AUDIT_COLUMNS[section], "jsonl")
        return
    summary = report.summary()
    sections = {section: Rows(partial(report.rows, section)) for section in SECTIONS}
    if fmt == "json":
        emit_object(summary | sections, "json")
        return
    emit_object(summary, "table")
    for section, rows in sections.items():
        echo(f"\n{section.replace('_', ' ')} ({summary[f'{section}_count']}):")
        emit(rows, AUDIT_COLUMNS[section], "table")


COMMANDS = [replay, verify, digest, audit]
