"""``alloc-ledger demo``: the four stories of ``commands.stories`` told to a
fresh store, each question answered on the way, printed as tables."""

from __future__ import annotations

import json
import shlex
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import click
from click.core import ParameterSource

from commands.output import echo, emit, emit_object
from commands.stories import EPILOGUE, STORIES, Ask, Step, Story
from ledger.application import Ledger, Receipt
from ledger.model import timestamp
from ledger.store import Store
from projections.history import history
from projections.projector import Projector
from projections.queries import COLUMNS, Queries

WIDE = ("event",)  # columns too wide for the demo's tables (the query commands print them)


def answer(store: Store, ask: Ask) -> list[dict[str, Any]] | dict[str, Any]:
    """Ask one question of the live projection tables (rows, or one object for
    alloc), brought up to date first (on PostgreSQL a follower would)."""
    Projector(store).update()
    if ask.query == "history":
        assert ask.target is not None
        return history(store, ask.target)
    with store.reading() as cursor:
        queries = Queries.of(store, cursor)
        if ask.query == "needs-reconnect":
            assert ask.now is not None, "the demo judges deadlines at a fixed time"
            return queries.needs_reconnect(timestamp(datetime.fromisoformat(ask.now)))
        if ask.query == "zombie-slots":
            return queries.zombie_slots()
        if ask.query == "slots":
            return queries.slots(ask.node)
        if ask.query == "nodes":
            return queries.nodes()
        if ask.query == "allocs":
            return queries.allocs(node=ask.node)
        if ask.query == "alloc":
            assert ask.target is not None
            found = queries.alloc(ask.target)
            assert found is not None, f"the story never placed {ask.target}"
            return found
        if ask.query == "addresses":
            return queries.addresses()
        if ask.query == "suspects":
            return queries.suspects()
        if ask.query == "rejections":
            return queries.rejections()
    raise ValueError(f"no such question: {ask.query}")


def columns(query: str) -> list[str]:
    return [c for c in COLUMNS[query] if c not in WIDE]


def show_step(step: Step, receipt: Receipt) -> bool:
    """Print what one event did; return whether it went as the story says."""
    status = receipt.status
    where = "" if receipt.position is None else str(receipt.position)
    echo(f"  {where:>3} {status:<9} {step.event['type']:<22} {step.says}")
    if receipt.error:
        echo(f"      {'':<9} {'':<22} -> {receipt.error}")
    if (status, receipt.error) == (step.expect, step.reason):
        return True
    expected = step.expect + (f" ({step.reason})" if step.reason else "")
    echo(f"      UNEXPECTED: the story expects {expected}")
    return False


def show_answer(ledger: Ledger, ask: Ask) -> None:
    """Print a question as the query command that asks it of this point of
    history, then its answer from the live tables."""
    echo(f"\n  $ alloc-ledger query {' '.join(ask.args())} --as-of {head_of(ledger)}")
    echo(f"  # {ask.says}")
    found = answer(ledger.store, ask)
    if isinstance(found, dict):
        emit_object(found, "table")
    else:
        emit(found, columns(ask.query), "table")


def tell(ledger: Ledger, story: Story, number: int) -> int:
    """Submit a story event by event, answering its questions on the way;
    return how many events did not go as the story says."""
    echo(f"== {number}/{len(STORIES)} {story.title} ==")
    echo(f"Reproduces {story.reports}.")
    echo(story.narration)
    echo()
    astray = 0
    answered = False
    for item in story.items:
        if isinstance(item, Step):
            if answered:
                echo()
            receipt = ledger.submit(json.dumps(item.event))  # as a JSON Lines producer sends it
            astray += not show_step(item, receipt)
        else:
            show_answer(ledger, item)
        answered = isinstance(item, Ask)
    echo()
    return astray


@contextmanager
def demo_store(url: str | None) -> Iterator[str]:
    """The store the demo writes: the one given (which must be empty), or a temporary file."""
    if url is not None:
        yield url
        return
    with tempfile.TemporaryDirectory(prefix="alloc-ledger-demo-") as folder:
        yield f"sqlite:///{folder}/demo.db"


def given_store(ctx: click.Context, store: str | None) -> str | None:
    """``demo --store``, or ``alloc-ledger --store … demo`` when typed on the command line."""
    if store is not None:
        return store
    root = ctx.find_root()
    if root.get_parameter_source("store") == ParameterSource.COMMANDLINE:
        return str(root.params["store"])
    return None


@click.command()
@click.option(
    "--store",
    "store",
    metavar="URL",
    default=None,
    help="Build the stories in this (empty) store and keep it; default: a temporary file.",
)
@click.pass_context
def demo(ctx: click.Context, store: str | None) -> None:
    """Run the built-in stories on a fresh store and print each answer.

    Four stories, one per source system, each replaying a real bug report:
    Nomad client disconnect/reconnect (#15068, #15808), Flink zombie slots
    (FLINK-14589), Swarmkit addresses freed too early (#2407), Drydock hosts
    taking their working copies and leases with them (T8153). Refused events
    are part of each story. The store is a temporary file unless --store names
    an empty one, which is kept so you can query it afterwards.

    Example: alloc-ledger --store sqlite:///demo.db demo
    """
    url = given_store(ctx, store)
    with demo_store(url) as target, Ledger.open(target) as ledger:
        check_empty(ledger, target)
        where = "a temporary file" if url is None else target
        echo(f"alloc-ledger demo: four bug reports replayed as events (store: {where})\n")
        astray = sum(tell(ledger, story, n) for n, story in enumerate(STORIES, 1))
        echo("== After the stories ==")
        for ask in EPILOGUE:
            show_answer(ledger, ask)
    echo()
    if url is not None:
        echo(f"The store is kept: alloc-ledger --store {shlex.quote(url)} query nodes")
    else:
        echo("To keep the store and query it: alloc-ledger --store sqlite:///demo.db demo, "
             "then alloc-ledger --store sqlite:///demo.db query nodes")
    if astray:
        raise click.ClickException(f"{astray} events did not go as the stories say")


def head_of(ledger: Ledger) -> int:
    with ledger.store.reading() as cursor:
        return ledger.store.head(cursor)


def check_empty(ledger: Ledger, url: str) -> None:
    """The stories need a fresh log: their positions and rules assume it."""
    held = head_of(ledger)
    if held:
        events = "1 event" if held == 1 else f"{held} events"
        raise click.BadParameter(
            f"store {url} already holds {events}; the demo needs an empty store "
            "(omit --store for a temporary one)", param_hint="--store",
        )


COMMANDS = [demo]
