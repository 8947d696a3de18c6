"""``alloc-ledger submit``: one event from flags, or a JSON Lines stream."""

from __future__ import annotations

import json
import os
import select
import stat
import sys
import time
from collections import Counter, deque
from collections.abc import Generator, Iterator
from contextlib import closing, contextmanager, suppress
from typing import IO, Any

import click

from commands.cli import OUT_OF_MEMORY, STORE_GOES_FIRST, store_of
from commands.console import Held, Interrupted, Signalled, signal_of
from commands.output import ClosedStream, json_text, write
from ledger import batches as batching
from ledger.application import Ledger, Receipt
from ledger.errors import InvalidEvent, LedgerError, LogEndsEarly, NotKept, StoreUnavailable
from ledger.events import EVENT_TYPES, TYPES_NAMED, fields_of, from_flags

MAX_LINE = 1 << 20  # a longer line is reported invalid without being held in memory
BATCH = 5000
TOO_LONG = object()
READ = 1 << 16  # bytes asked of a pipe at a time


def _vocabulary() -> str:
    """The event types and their flags, from the models (``ledger.events``)."""
    lines = ["\b", "Event types and their fields ([optional]);",
             "any event also takes [--id] [--at] [--source]:"]
    for event_type in EVENT_TYPES:
        required, optional = fields_of(event_type)
        flags = [f"--{n}" for n in required] + [f"[--{n}]" for n in optional]
        lines.append(f"  {event_type:<24}{' '.join(flags).replace('_', '-')}")
    return "\n".join(lines)


class SubmitCommand(click.Command):
    """``submit``, whose help ends with the event vocabulary (built only when
    the help is shown: every other run would pay for it)."""

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        self.epilog = _vocabulary()
        super().format_epilog(ctx, formatter)


@click.command(
    cls=SubmitCommand,
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
)
@click.argument("source", metavar="TYPE|FILE|-")
@click.option("--quiet", is_flag=True, help="Print only a summary, not one line per event.")
@click.option(
    "--batch", default=BATCH, show_default=True, type=click.IntRange(1, 100_000),
    help=f"Most events committed in one transaction (fewer once their lines reach "
         f"{batching.BATCH_BYTES >> 20} MiB).",
)
@click.pass_context
def submit(ctx: click.Context, source: str, quiet: bool, batch: int) -> None:
    """Submit one event from flags, or a JSON Lines stream from FILE or - (stdin).

    \b
    alloc-ledger submit node-registered --node n1 --slots 2
    alloc-ledger submit alloc-placed --alloc a1 --node n1 --slot 0 --addresses '["10.0.0.5"]'
    alloc-ledger submit events.jsonl
    producer | alloc-ledger submit -

    One result line per event on stdout, printed once the event is durable:
    {"line": n, "status": "appended|duplicate|rejected|invalid", "position": p, "error": "…"}.
    Exit 0 when every event was appended or duplicate, 1 when any was invalid or
    rejected, or was a retry of a rejected event (a duplicate with the rejection
    as its error), 3 when the store cannot be opened. --quiet's summary counts
    those as duplicate and as duplicate_of_rejected.
    """
    if source in EVENT_TYPES:
        counts = _submit_one(ctx, source, quiet)
    else:
        if (source == "--store" or source.startswith("--store=")) and not os.path.exists(source):
            raise click.UsageError(STORE_GOES_FIRST.format("submit"))
        if source.startswith("--") and not os.path.exists(source):
            raise click.UsageError(
                f"an event type comes before its flags: alloc-ledger submit TYPE "
                f"{' '.join([source, *ctx.args])} ({TYPES_NAMED})")
        if ctx.args:
            raise click.UsageError(_extra(source, ctx.args))
        stream = _open(source)
        if source == "-" and stream.isatty():
            with suppress(OSError):
                click.echo("reading events from the terminal, one JSON object per line; "
                           "Ctrl-D ends", err=True)
        # Held outermost: a signal while the store closes on the way out
        # (after another) does not replace what the first one says.
        with (
            Held().installed() as held,
            Ledger.open(store_of(ctx)) as ledger,
            _closed_on_error(_then_closed(ledger, _stream(ledger, stream, batch, held))) as results,
        ):
            counts = _print(results, quiet, sys.stderr.isatty(), held)
        if not any(counts.values()):  # a producer that died before writing looks like this
            click.echo(f"no events in {'stdin' if source == '-' else source}", err=True)
    if quiet:
        _out(json.dumps(dict(counts)) + "\n", None)
    if counts["rejected"] or counts["invalid"] or counts[OF_REJECTED]:
        ctx.exit(1)


def _extra(source: str, args: list[str]) -> str:
    """What is wrong with words after a source: a stream takes none, and
    flags follow an event type (a mistyped one, when no such file is there)."""
    words = " ".join(args)
    if source == "-" or os.path.exists(source) or not args[0].startswith("--"):
        what = "stdin (-)" if source == "-" else f"the file {source!r}"
        return (f"unexpected extra argument{'s' if len(args) > 1 else ''} ({words}): "
                f"submit reads one stream at a time, here {what}")
    return (f"{source!r} is not an event type ({TYPES_NAMED}); flags "
            f"({words}) follow an event type: alloc-ledger submit TYPE --field value")


def _submit_one(ctx: click.Context, event_type: str, quiet: bool) -> Counter[str]:
    """One event from flags, through ``_print`` as a stream's batch goes: a
    signal while it is with the store waits for its result (``Held``), and
    one while the store closes after it says what became of it."""
    flags = _pairs(ctx.args)
    decided: list[Receipt] = []
    with (
        Held("the event").installed() as held,
        _closed_on_error(_one_result(ctx, event_type, flags, held, decided)) as results,
    ):
        try:
            return _print(results, quiet, False, held, nothing="the event was not kept")
        except Interrupted as stop:
            raise Interrupted(_became(decided, stop.settled), stop.terminated) from None


# Batches of numbered receipts, printed as they come; closed if not read to the end.
Results = Generator[list[tuple[int, Receipt]], None, None]


@contextmanager
def _closed_on_error(results: Results) -> Iterator[Results]:
    """``results``, closed at once if the command stops before it is read to
    the end (a signal, a failure): what it holds open (the one-shot's store,
    a stream's writer thread and the collector's settings) ends with the
    command, not whenever the cyclic garbage collector gets to it. A second
    signal while it closes does not replace what the first one says, nor
    does a failure to close (the store lost, say) replace the error."""
    try:
        yield results
    except BaseException:
        with suppress(Exception, KeyboardInterrupt):
            results.close()
        raise


def _became(decided: list[Receipt], settled: bool) -> str:
    """What became of a one-shot event stopped by a signal."""
    if decided:
        at = "" if decided[0].position is None else f" at position {decided[0].position}"
        return f"the event was decided before it: {decided[0].status}{at}"
    if settled:
        return "the event was not submitted"
    return ("whether the event is kept is not known (submitted again with the same --id, "
            "a kept one answers duplicate)")


def _one_result(
    ctx: click.Context, event_type: str, flags: dict[str, str], held: Held,
    decided: list[Receipt],
) -> Results:
    """The event's result (kept in ``decided`` too), then the store closed
    while it is printed, as ``_then_closed`` closes a stream's."""
    try:
        event = from_flags(event_type, flags)
    except InvalidEvent as error:
        decided.append(Receipt("invalid", error=str(error)))
        yield [(1, decided[0])]
        return
    with Ledger.open(store_of(ctx)) as ledger:
        with held.holding():
            decided.append(ledger.submit(event))
        yield [(1, decided[0])]
        ledger.close()


def _pairs(args: list[str]) -> dict[str, str]:
    flags: dict[str, str] = {}
    items = iter(args)
    for arg in items:
        if not arg.startswith("--") or len(arg) < 3:
            raise click.UsageError(f"expected --field value, got {arg!r}")
        name, eq, value = arg[2:].partition("=")
        if not eq:
            value = next(items, None)  # type: ignore[assignment]
            if value is None:
                raise click.UsageError(f"--{name} needs a value")
            if value.startswith("--") and len(value) > 2:
                raise click.UsageError(
                    f"--{name} needs a value, not the flag {value} (a value that starts "
                    f"with -- is written --{name}={value})")
        field = name.replace("-", "_")
        if field == "store":
            raise click.UsageError(STORE_GOES_FIRST.format("submit TYPE"))
        if field == "type":
            raise click.UsageError("--type: the event type is the first argument (submit TYPE --field value)")
        if field in flags:
            raise click.UsageError(f"--{name} is given twice")
        flags[field] = value
    return flags


def _open(source: str) -> IO[bytes]:
    if source == "-":
        if sys.stdin is None:  # started with stdin closed (<&-)
            raise ClosedStream("stdin is closed: there is nothing to read from -")
        return sys.stdin.buffer
    try:
        return open(source, "rb")
    except OSError as error:
        also = "" if os.sep in source or "." in source else " (nor is it an event type)"
        raise click.BadParameter(f"cannot read {source}: {error.strerror}{also}") from None
    except ValueError:  # a NUL: no file is named so
        raise click.BadParameter(f"cannot read {source!r}: a file name holds no NUL") from None


def _lines(stream: IO[bytes]) -> Iterator[tuple[int, Any]]:
    """Numbered lines; blank ones are skipped, over-long ones flagged, never held."""
    number = 0
    while True:
        line = stream.readline(MAX_LINE + 1)
        if not line:
            return
        number += 1
        if len(line) > MAX_LINE and not line.endswith(b"\n"):
            while (rest := stream.readline(MAX_LINE)) and not rest.endswith(b"\n"):
                pass
            yield number, TOO_LONG
        elif (line := _without_bom(number, line)).strip():
            yield number, line


BOM = b"\xef\xbb\xbf"


def _without_bom(number: int, line: bytes) -> bytes:
    """A stream's first line without the byte order mark some Windows tools
    write (RFC 8259 lets a parser ignore it)."""
    return line[len(BOM):] if number == 1 and line.startswith(BOM) else line


def _stream(
    ledger: Ledger, stream: IO[bytes], batch: int, held: Held
) -> Iterator[list[tuple[int, Receipt]]]:
    """Commit what has arrived in batches: large when input is waiting, small
    (down to one event) when a producer sends slowly and waits for answers.
    A signal waits while a batch is with the store (``held``), never while
    this waits for input."""
    descriptor = _pipe(stream)
    if descriptor is None:  # a file, or a stream in memory, never makes us wait: full batches
        batches = batching.batched(_lines(stream), batch, _size)
        yield from _decide_all(ledger, batches, held)
        return
    arrivals = Arrivals(descriptor)
    while pending := arrivals.take(batch):
        with held.holding():
            decided = _decide(ledger, pending)
        yield decided


def _size(numbered: tuple[int, Any]) -> int:
    """The bytes a numbered line holds (none for one too long, never held)."""
    line = numbered[1]
    return 0 if line is TOO_LONG else len(line)


def _then_closed(ledger: Ledger, results: Iterator[list[tuple[int, Receipt]]]) -> Results:
    """The results, then the store closed while they are still being
    printed: a signal while it closes (SQLite folds its write-ahead log back
    then, a while after a large stream) says what was kept, as one between
    two batches does."""
    yield from results
    ledger.close()


class Arrivals:
    """Numbered lines from a pipe or terminal as they arrive: every complete
    line already there, waiting only when there is none. Blank lines are
    skipped, over-long ones flagged and never held (as ``_lines`` does)."""

    def __init__(self, descriptor: int) -> None:
        self.descriptor = descriptor
        self.ready: list[tuple[int, Any]] = []
        self.ready_bytes = 0  # the bytes of the lines ready
        self.partial = b""
        self.skipping = False  # inside an over-long line, already flagged
        self.number = 0
        self.ended = False

    def take(self, most: int) -> list[tuple[int, Any]]:
        """The next batch: at most ``most`` lines, ending once they reach
        ``ledger.batches.BATCH_BYTES``, as a file's batches do."""
        while len(self.ready) < most and self.ready_bytes < batching.BATCH_BYTES and not self.ended:
            if self.ready and not select.select([self.descriptor], [], [], 0)[0]:
                break  # something to commit and nothing more waiting
            self._split(os.read(self.descriptor, READ))
        taken = next(batching.batched(self.ready, most, _size), [])
        self.ready = self.ready[len(taken):]
        self.ready_bytes -= sum(map(_size, taken))
        return taken

    def _split(self, chunk: bytes) -> None:
        if not chunk:
            self.ended = True
            if self.partial and not self.skipping:
                self._add(self.partial, b"")
            return
        pieces = chunk.split(b"\n")
        for piece in pieces[:-1]:
            if self.skipping:
                self.skipping = False
            else:
                self._add(self.partial + piece, b"\n")
            self.partial = b""
        if not self.skipping:
            self.partial += pieces[-1]
            if len(self.partial) > MAX_LINE:
                self.number += 1
                self.ready.append((self.number, TOO_LONG))
                self.partial, self.skipping = b"", True

    def _add(self, line: bytes, end: bytes) -> None:
        """A line as ``readline`` gives it, with its newline (``end``) if it had one."""
        self.number += 1
        if len(line) > MAX_LINE:
            self.ready.append((self.number, TOO_LONG))
        elif (line := _without_bom(self.number, line)).strip():
            line += end
            self.ready.append((self.number, line))
            self.ready_bytes += len(line)


def _pipe(stream: IO[bytes]) -> int | None:
    """The descriptor of a stream that can keep us waiting (pipe, socket,
    terminal); None for a regular file or a stream in memory."""
    try:
        descriptor = stream.fileno()
        if stat.S_ISREG(os.fstat(descriptor).st_mode):
            return None
    except (OSError, ValueError, AttributeError):  # io.UnsupportedOperation is an OSError
        return None
    return descriptor  # read below its buffer: nothing has read from it before


TOO_LONG_RECEIPT = Receipt("invalid", error=f"line is longer than {MAX_LINE} bytes")


def _decide(ledger: Ledger, pending: list[tuple[int, Any]]) -> list[tuple[int, Receipt]]:
    return _paired(_numbers(pending), ledger.submit_batch(_submitted(pending)))


def _submitted(pending: list[tuple[int, Any]]) -> list[Any]:
    """The lines of a batch that go to the ledger (not those too long)."""
    return [line for _, line in pending if line is not TOO_LONG]


def _numbers(pending: list[tuple[int, Any]]) -> list[tuple[int, bool]]:
    """The numbers of a batch's lines, each with whether it was too long:
    what pairs them with their receipts, without holding the lines."""
    return [(n, line is TOO_LONG) for n, line in pending]


def _paired(numbers: list[tuple[int, bool]], receipts: list[Receipt]) -> list[tuple[int, Receipt]]:
    """Each numbered line with its receipt (``receipts``: those of ``_submitted``)."""
    decided = iter(receipts)
    return [(n, TOO_LONG_RECEIPT if too_long else next(decided)) for n, too_long in numbers]


def _decide_all(
    ledger: Ledger, batches: Iterator[list[tuple[int, Any]]], held: Held
) -> Iterator[list[tuple[int, Receipt]]]:
    """``_decide`` each batch in turn, through ``Ledger.submit_batches`` (which
    may decide one batch while the last commits: the batches are all there).
    Between two results a batch is with the store: a signal waits (``held``).
    Only the numbers of the lines wait for their receipts: the lines go once
    they are parsed (``map`` holds none of them)."""
    taken: deque[list[tuple[int, bool]]] = deque()

    def handed(pending: list[tuple[int, Any]]) -> list[Any]:
        taken.append(_numbers(pending))
        return _submitted(pending)

    # Closed at once if a signal lands here, between two of its batches: it
    # holds a writer thread and the collector's settings.
    with closing(ledger.submit_batches(map(handed, batches))) as decided:
        while True:
            with held.holding():
                receipts = next(decided, None)
            if receipts is None:
                held.release()  # every batch came back: nothing is with the store
                return
            yield _paired(taken.popleft(), receipts)


def _result_line(number: int, receipt: Receipt) -> str:
    """``json.dumps({"line": number} | receipt.as_dict())`` and a newline, without
    building the dict (a stream prints one per event)."""
    position = "null" if receipt.position is None else receipt.position
    error = "null" if receipt.error is None else json_text(receipt.error)
    return (
        f'{{"line": {number}, "status": "{receipt.status}", '
        f'"position": {position}, "error": {error}}}\n'
    )


# In the summary beside the four statuses: the duplicates that retried a
# rejected event (they did not take effect either: exit 1).
OF_REJECTED = "duplicate_of_rejected"
NO_LINE_KEPT = "no line was kept"  # what a stream stopped before its first result kept


def _print(
    results: Any, quiet: bool, progress: bool, held: Held, nothing: str = NO_LINE_KEPT
) -> Counter[str]:
    shown = time.monotonic()
    # The results tallied and the last line among them, replaced whole once a
    # batch is tallied (one assignment: a signal cannot land between the two).
    # A batch whose receipts came back is committed, printed or not.
    done: tuple[Counter[str], int] = (Counter(
        {"appended": 0, "duplicate": 0, "rejected": 0, "invalid": 0, OF_REJECTED: 0}), 0)
    try:
        for batch in results:
            tally = done[0].copy()
            for _, receipt in batch:
                tally[receipt.status] += 1
                if receipt.status == "duplicate" and not receipt.ok:
                    tally[OF_REJECTED] += 1
            done = (tally, batch[-1][0] if batch else done[1])
            held.release()  # counted: a signal now stops at once, and says so
            _out("" if quiet else "".join(_result_line(n, receipt) for n, receipt in batch), batch)
            if progress and time.monotonic() - shown > 0.2:
                shown = time.monotonic()
                total = sum(tally.values()) - tally[OF_REJECTED]
                click.echo(f"\r{total} event{'' if total == 1 else 's'}, {tally['rejected']} rejected, "
                           f"{tally['invalid']} invalid", err=True, nl=False)
            held.settle()  # a signal that waited for this batch: it is reported now
        held.settle()  # one that came as the stream ended: it is not lost
    except KeyboardInterrupt as stop:
        _clear(progress)
        settled = isinstance(stop, Signalled) and stop.settled
        raise Interrupted(
            _kept_until(*done, settled), terminated=signal_of(stop), settled=settled) from None
    except LedgerError as error:  # the store lost mid-stream: say how far it got
        _clear(progress)
        refused = isinstance(error, NotKept)  # the failed batch, and none after it, kept
        if (not done[1] and not refused) or isinstance(error, LogEndsEarly):
            # at the first batch, the store's own words say what became of it;
            # a log that lost what was reported says that itself
            raise
        failed = StoreUnavailable if isinstance(error, StoreUnavailable) else LedgerError
        raise failed(f"{error}; {_kept_until(*done, refused, nothing)}") from None
    except MemoryError:  # where Python says so (a library may crash instead: SIGSEGV)
        _clear(progress)
        raise click.ClickException(
            f"{OUT_OF_MEMORY} (a batch holds up to --batch events, several times over while "
            f"it is decided: a smaller --batch holds fewer); {_kept_until(*done)}") from None
    _clear(progress)
    return done[0]


def _clear(progress: bool) -> None:
    if progress:
        with suppress(OSError):  # a hung-up terminal (SIGHUP): nothing left to clear
            click.echo("\r" + " " * 60 + "\r", err=True, nl=False)


def _kept_until(
    counts: Counter[str], reported: int, settled: bool = False, nothing: str = NO_LINE_KEPT
) -> str:
    """What a submit stopped midway (Ctrl-C, SIGTERM, SIGHUP, a lost store) had
    decided and kept; ``settled``: no batch was left with the store unanswered
    (or the one that was failed before it committed), so no later line is
    kept, and ``nothing`` says so when none was."""
    learn = "resubmit with ids to learn which: kept ones answer duplicate"
    if not reported:
        if settled:
            return nothing
        return f"no result was printed before it, yet some lines may be kept ({learn})"
    tally = ", ".join(f"{n} {status}" for status, n in counts.items() if status != OF_REJECTED)
    later = "no later line was kept" if settled else f"later ones may be kept too ({learn})"
    return f"every line up to {reported} was decided and is kept as decided ({tally}); {later}"


def _out(text: str, batch: list[tuple[int, Receipt]] | None) -> None:
    """Print results at once: those of ``batch``, or (None) the summary."""
    write(text, lambda why: _output_lost(why, batch))


def _output_lost(why: str, batch: list[tuple[int, Receipt]] | None) -> click.ClickException:
    """Results that could not be printed (``batch``; None: the summary of
    them all): what was decided is kept all the same."""
    if batch is None:
        return click.ClickException(
            f"cannot print the summary to stdout ({why}): every line was decided and is "
            "kept as decided")
    kept = [r.position for _, r in batch if r.position is not None]
    where = f", up to position {max(kept)}" if kept else ""
    return click.ClickException(
        f"cannot print the results to stdout ({why}): every line up to {batch[-1][0]} was "
        f"decided and is kept as decided{where}; later ones may be kept too (resubmit with "
        "ids to learn which: kept ones answer duplicate)")


COMMANDS = [submit]
