"""The ``alloc-ledger`` command group: options shared by every command,
and the one place library errors become one-line messages and exit codes."""

from __future__ import annotations

import errno
import importlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click
from click.core import ParameterSource

from commands.console import Interrupted, interrupted, signal_of
from commands.output import output_lost, printable, require_stdout, write
from ledger.errors import BadOption, LedgerError, StoreUnavailable
from ledger.store import DEFAULT_URL, STORE_VARIABLE, Store, store_url


class StoreError(click.ClickException):
    """The store cannot be opened or reached: exit 3."""

    exit_code = 3


MODULES = ("submit", "query", "admin", "audit", "demo")
WORDS = "alloc_ledger.words"
# Where each command lives, so a command imports only its own module (help
# and a mistyped command load them all).
HOME = {
    "submit": "submit",
    "query": "query",
    "project": "admin",
    "schema": "admin",
    "grant-reporting": "admin",
    "replay": "audit",
    "verify": "audit",
    "digest": "audit",
    "audit": "audit",
    "demo": "demo",
}


class CommandGroup(click.Group):
    """A group of commands: an option that takes one value, given twice to
    one of them, is refused (``refuse_repeats``)."""

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        resolved = super().resolve_command(ctx, args)
        _, command, rest = resolved
        if command is not None and not isinstance(command, click.Group):
            refuse_repeats(command, rest)
        return resolved


class LedgerGroup(CommandGroup):
    """Loads command modules on first use (each lists its commands in
    ``COMMANDS``), so ``submit heartbeat`` does not import the audit or demo."""

    def _load(self, modules: tuple[str, ...]) -> None:
        for name in modules:
            module = importlib.import_module(f"commands.{name}")
            for command in module.COMMANDS:
                self.add_command(command)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands:
            self._load((HOME[cmd_name],) if cmd_name in HOME else MODULES)
        return self.commands.get(cmd_name)

    def _named(self, ctx: click.Context, words: list[str]) -> str:
        """The path of the deepest command the words name (``alloc-ledger
        query nodes``): a usage error's own context may be missing or an outer one."""
        path: list[str] = [ctx.command_path]
        command: click.Group = self
        for word in words:
            found = command.get_command(ctx, word)
            if found is None:
                break
            path.append(word)
            if not isinstance(found, click.Group):
                break
            command = found
        return " ".join(path)

    def list_commands(self, ctx: click.Context) -> list[str]:
        self._load(MODULES)
        return sorted(self.commands)

    def make_context(self, *args: Any, **kwargs: Any) -> click.Context:
        # before the line is read: its own --help and --version print while it is
        require_stdout()
        try:
            return super().make_context(*args, **kwargs)
        except KeyboardInterrupt:  # while reading the command line: as in a command
            raise interrupted() from None
        except click.exceptions.NoArgsIsHelpError:
            raise  # not an error: click shows the help
        except click.UsageError as error:
            raise one_line(error, error.ctx.command_path if error.ctx else "alloc-ledger") from None
        except OSError as error:  # from click printing the help or the version
            raise output_lost(error) from None

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        ctx.meta[WORDS] = list(args)  # the command and its arguments, for ``_named``
        return super().resolve_command(ctx, args)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        refuse_repeats(self, args[:_first_word(args)])
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return self._run(ctx)
        except click.exceptions.NoArgsIsHelpError:
            raise  # its message is the help
        except click.ClickException as error:  # one line, whatever text it names
            error.message = printable(error.message)
            raise

    def _run(self, ctx: click.Context) -> Any:
        try:
            done = super().invoke(ctx)
            write("")  # what is still buffered: a stdout that cannot take it is one line too
            return done
        except click.exceptions.NoArgsIsHelpError:
            raise
        except click.UsageError as error:
            raise one_line(error, self._named(ctx, ctx.meta.get(WORDS, []))) from None
        except StoreUnavailable as error:
            raise StoreError(str(error)) from None
        except BadOption as error:
            wrong = click.BadParameter(str(error), param_hint=f"'{error.option}'")
            raise one_line(wrong, self._named(ctx, ctx.meta.get(WORDS, []))) from None
        except LedgerError as error:
            raise click.ClickException(str(error)) from None
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except KeyboardInterrupt as stop:  # Ctrl-C: what was reported before it is kept
            if isinstance(stop, Interrupted):
                raise interrupted(stop.detail, stop.terminated) from None
            raise interrupted(terminated=signal_of(stop)) from None
        except OSError as error:
            if error.errno in STDOUT_FAILURES:  # click's own text (a command's --help)
                raise output_lost(error) from None
            raise _internal(error) from None
        except MemoryError:  # where Python says so: a library may crash instead (SIGSEGV)
            raise click.ClickException(OUT_OF_MEMORY) from None
        except Exception as error:  # noqa: BLE001 - never a traceback for users
            raise _internal(error) from None


def refuse_repeats(command: click.Command, args: list[str]) -> None:
    """An option that takes one value, given twice, is a usage error (as a
    field given twice to ``submit``): the last one would win unseen."""
    if "--help" in args:
        return  # the help, whatever else the line says
    if "--" in args:  # what follows is arguments, whatever it looks like
        args = args[:args.index("--")]
    for param in command.params:
        if not isinstance(param, click.Option) or param.multiple or param.count or param.is_flag:
            continue  # a flag twice says the same thing twice
        names = [*param.opts, *param.secondary_opts]
        given = sum(1 for word in args if word in names or (
            word.startswith("--") and word.split("=", 1)[0] in names))
        if given > 1:
            raise click.UsageError(f"{max(names, key=len)} is given twice")


def _first_word(args: list[str]) -> int:
    """Where a group's own options end: at the first word that names a command."""
    return next((i for i, word in enumerate(args) if word in HOME), len(args))


# What writing to stdout fails with (what else the commands write is the
# store, whose errors are the database driver's, not OSError).
STDOUT_FAILURES = (errno.EPIPE, errno.ENOSPC, errno.EFBIG, errno.EDQUOT)


OUT_OF_MEMORY = "out of memory"


def _internal(error: Exception) -> click.ClickException:
    """A failure no rule names: one line (the traceback with ALLOC_LEDGER_DEBUG)."""
    if os.environ.get("ALLOC_LEDGER_DEBUG"):
        raise error
    return click.ClickException(
        f"internal error: {type(error).__name__}: {error} "
        "(set ALLOC_LEDGER_DEBUG=1 for the traceback)"
    )


STORE_GOES_FIRST = "--store goes before the command: alloc-ledger --store URL {} …"


def one_line(error: click.UsageError, where: str) -> click.UsageError:
    """A usage error as one line, which points at the help of the command
    ``where`` (click would print the usage and a hint on lines of their own
    first)."""
    message = error.format_message()
    if isinstance(error, click.NoSuchOption) and error.option_name == "--store":
        message += f" ({STORE_GOES_FIRST.format('COMMAND')})"
    return click.UsageError(printable(f"{message} (see '{where} --help')"))


@click.group(cls=LedgerGroup)
@click.option(
    "--store",
    envvar=STORE_VARIABLE,
    default=DEFAULT_URL,
    show_default=True,
    show_envvar=True,
    help="Store URL: sqlite:///path.db or postgresql://user:pass@host:port/db[?schema=name].",
)
@click.version_option(package_name="alloc-ledger")
@click.pass_context
def cli(ctx: click.Context, store: str) -> None:
    """An event-sourced ledger of cluster allocation lifecycles.

    Submit heartbeats, placements, disconnects, reconnects and removals as
    events; ask which allocations need to reconnect, which slots are
    zombies, which addresses are still held, which nodes are suspect.

    Example: alloc-ledger submit heartbeat --node n1
    """
    # Not given (click reads an empty variable as none): ``store_url`` reads
    # the variable itself, and refuses it empty rather than take the default.
    unset = ctx.get_parameter_source("store") is ParameterSource.DEFAULT
    ctx.obj = {"store": None if unset else store}


def store_of(ctx: click.Context) -> str:
    """The store URL the command line names; an empty one (``--store ''``,
    or ALLOC_LEDGER_STORE set to nothing) is refused (``store_url``)."""
    try:
        return store_url(ctx.find_root().obj["store"])
    except StoreUnavailable as error:
        raise StoreError(str(error)) from None


@contextmanager
def opened(ctx: click.Context) -> Iterator[Store]:
    """The store the command line names, which must hold a ledger already
    (reading commands), closed when the command is done."""
    from ledger.store import open_store

    store = open_store(store_of(ctx), create=False)
    try:
        yield store
    finally:
        store.close()


def main() -> None:
    cli(prog_name="alloc-ledger")
