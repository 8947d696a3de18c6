"""Commands that look after the store: project, schema."""

from __future__ import annotations

import json

import click

from commands.cli import store_of
from ledger.application import Ledger
from ledger.events import json_schema


@click.command()
@click.pass_context
def project(ctx: click.Context) -> None:
    """Bring the projection tables up to date with the log.

    Example: alloc-ledger project
    """
    with Ledger.open(store_of(ctx)) as ledger:
        start, head = ledger.project()
    click.echo(json.dumps({"from": start, "to": head, "applied": head - start}))


@click.command()
def schema() -> None:
    """Print the JSON Schema of the event vocabulary.

    Example: alloc-ledger schema > event.schema.json
    """
    click.echo(json.dumps(json_schema(), indent=2))


COMMANDS = [project, schema]
