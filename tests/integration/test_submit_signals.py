"""Ctrl-C (or SIGTERM, SIGHUP) while a batch of a stream is with the store:
the batch is finished and reported first, so the stream's last words say
exactly which lines are kept; a second signal stops at once, and then they
say the batch may be kept or not.

Each store, each way a stream is read: a file (batches decided while the
last commits, where the store can) and a pipe (batch by batch, as lines
arrive). The signal is sent from inside the submit, as a batch is handed to
the store, so it lands where a user's Ctrl-C would be most costly.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import IO, Any

import pytest
from cli_support import invoke

from ledger.application import Ledger

# Six events in batches of two; each with an id, so a resubmission says which were kept.
EVENTS = [{"type": "node-registered", "node": "n1", "id": "e1"}] + [
    {"type": "heartbeat", "node": "n1", "id": f"e{n}"} for n in range(2, 7)]
TEXT = "".join(json.dumps(event) + "\n" for event in EVENTS)
SIGNALS = [(signal.SIGINT, 130, "interrupted", "Ctrl-C"),
           (signal.SIGTERM, 143, "terminated", "the signal")]


def _signal_self(signum: int, times: int) -> None:
    for _ in range(times):
        os.kill(os.getpid(), signum)
        time.sleep(0.01)  # its handler runs before the next is sent (signals do not queue)


def signalled_at_batch(monkeypatch: pytest.MonkeyPatch, signum: int, times: int) -> None:
    """The second batch of a file is signalled ``times`` as it is handed to the store."""
    submitted = Ledger.submit_batches

    def with_signal(ledger: Ledger, batches: Any) -> Iterator[Any]:
        with closing(submitted(ledger, batches)) as decided:  # as a caller would close it
            yield next(decided)
            _signal_self(signum, times)
            yield from decided

    monkeypatch.setattr(Ledger, "submit_batches", with_signal)


def signalled_at_piped_batch(monkeypatch: pytest.MonkeyPatch, signum: int, times: int) -> None:
    """The second batch from a pipe is signalled ``times`` as it is handed to the store."""
    submitted = Ledger.submit_batch
    handed = []

    def with_signal(ledger: Ledger, items: Any) -> Any:
        handed.append(items)
        if len(handed) == 2:
            _signal_self(signum, times)
        return submitted(ledger, items)

    monkeypatch.setattr(Ledger, "submit_batch", with_signal)


@contextmanager
def piped(text: str) -> Iterator[IO[bytes]]:
    """A pipe holding ``text``, its writing end closed: read as a producer's stream."""
    reading, writing = os.pipe()
    with os.fdopen(writing, "wb") as producer:
        producer.write(text.encode())
    with os.fdopen(reading, "rb") as stream:
        yield stream


def submitted(url: str, how: str, tmp_path: Path, code: int) -> Any:
    if how == "file":
        source = tmp_path / "events.jsonl"
        source.write_text(TEXT)
        return invoke(["--store", url, "submit", str(source), "--batch", "2"], code=code)
    with piped(TEXT) as stream:
        return invoke(["--store", url, "submit", "-", "--batch", "2"], code=code, input=stream)


def statuses_on_resubmitting(url: str, tmp_path: Path) -> list[str]:
    """What a resubmission of the whole stream says of each line: kept ones are duplicates."""
    source = tmp_path / "again.jsonl"
    source.write_text(TEXT)
    result = invoke(["--store", url, "submit", str(source)])
    return [json.loads(line)["status"] for line in result.stdout.splitlines()]


@pytest.mark.parametrize("how", ["file", "pipe"])
@pytest.mark.parametrize(("signum", "code", "what", "again"), SIGNALS)
def test_a_signal_while_a_batch_is_with_the_store_waits_for_it_then_says_exactly_what_is_kept(
    store_url, tmp_path, monkeypatch, how, signum, code, what, again
):
    if how == "file":
        signalled_at_batch(monkeypatch, signum, times=1)
    else:
        signalled_at_piped_batch(monkeypatch, signum, times=1)

    result = submitted(store_url, how, tmp_path, code)

    assert [json.loads(line)["line"] for line in result.stdout.splitlines()] == [1, 2, 3, 4]
    assert result.stderr == (
        f"{what}: stopping once the batch with the store is committed; {again} again to stop "
        f"sooner (then whether it is kept is not known)\nError: {what}: every line up to 4 was decided and is kept as decided "
        "(4 appended, 0 duplicate, 0 rejected, 0 invalid); no later line was kept\n")
    monkeypatch.undo()
    assert statuses_on_resubmitting(store_url, tmp_path) == ["duplicate"] * 4 + ["appended"] * 2


@pytest.mark.parametrize("how", ["file", "pipe"])
def test_a_second_signal_stops_at_once_and_says_the_batch_may_be_kept(
    store_url, tmp_path, monkeypatch, how
):
    if how == "file":
        signalled_at_batch(monkeypatch, signal.SIGINT, times=2)
    else:
        signalled_at_piped_batch(monkeypatch, signal.SIGINT, times=2)

    result = submitted(store_url, how, tmp_path, 130)

    assert [json.loads(line)["line"] for line in result.stdout.splitlines()] == [1, 2]
    assert result.stderr == (
        "interrupted: stopping once the batch with the store is committed; Ctrl-C again to "
        "stop sooner (then whether it is kept is not known)\nError: interrupted: every line up to 2 was decided and is kept as "
        "decided (2 appended, 0 duplicate, 0 rejected, 0 invalid); later ones may be kept too "
        "(resubmit with ids to learn which: kept ones answer duplicate)\n")
    monkeypatch.undo()
    # Stopped before the batch was handed over: here none of it is kept.
    assert statuses_on_resubmitting(store_url, tmp_path) == ["duplicate"] * 2 + ["appended"] * 4


def test_a_signal_while_waiting_for_input_is_raised_at_once_as_settled(store_url, tmp_path):
    """Nothing is with the store while a pipe is read: no wait, and the exact words."""
    from commands import submit as submitting

    arrived = submitting.Arrivals.take
    calls = []

    def interrupted_on_the_second_wait(arrivals: Any, most: int) -> Any:
        calls.append(most)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)  # the handler raises here: it does not wait
            raise AssertionError("the signal waited")
        return arrived(arrivals, most)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(submitting.Arrivals, "take", interrupted_on_the_second_wait)
        result = submitted(store_url, "pipe", tmp_path, 130)

    assert result.stderr == (
        "Error: interrupted: every line up to 2 was decided and is kept as decided "
        "(2 appended, 0 duplicate, 0 rejected, 0 invalid); no later line was kept\n")


@pytest.mark.parametrize("how", ["file", "pipe"])
def test_a_signal_just_after_a_batch_came_back_from_the_store_is_not_told_as_nothing_later_kept(
    store_url, tmp_path, monkeypatch, how
):
    """A signal that lands once a batch's receipts are back (``holding`` has
    ended) but before ``_print`` has tallied them (``_paired``, ``yield``, the
    tally loop: all per-line Python work) must not make the last words say
    "no later line was kept" of that batch, which is kept."""
    from commands import console

    holding = console.Held.holding
    calls = []

    @contextmanager
    def signalled_after_the_second(held: Any) -> Iterator[None]:
        with holding(held):
            yield
        calls.append(1)
        if len(calls) == 2:  # the second batch (lines 3 and 4) is committed
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.01)

    monkeypatch.setattr(console.Held, "holding", signalled_after_the_second)
    result = submitted(store_url, how, tmp_path, 130)
    monkeypatch.undo()
    kept = statuses_on_resubmitting(store_url, tmp_path).count("duplicate")
    assert f"every line up to {kept} was decided" in result.stderr, (result.stderr, kept)


def signalled_at_one_event(monkeypatch: pytest.MonkeyPatch, signum: int, times: int) -> None:
    """A one-shot submit is signalled ``times`` as its event is handed to the store."""
    submitted = Ledger.submit

    def with_signal(ledger: Ledger, event: Any) -> Any:
        _signal_self(signum, times)
        return submitted(ledger, event)

    monkeypatch.setattr(Ledger, "submit", with_signal)


ONE_SHOT = ["heartbeat", "--node", "n1", "--id", "h1"]


@pytest.mark.parametrize(("signum", "code", "what", "again"), SIGNALS)
def test_a_signal_while_one_event_is_with_the_store_waits_for_its_result_and_names_it(
    store_url, monkeypatch, signum, code, what, again
):
    invoke(["--store", store_url, "submit", "node-registered", "--node", "n1"])
    signalled_at_one_event(monkeypatch, signum, times=1)

    result = invoke(["--store", store_url, "submit", *ONE_SHOT], code=code)

    assert json.loads(result.stdout) == {
        "line": 1, "status": "appended", "position": 2, "error": None}
    assert result.stderr == (
        f"{what}: stopping once the event with the store is committed; {again} again to stop "
        "sooner (then whether it is kept is not known)\n"
        f"Error: {what}: the event was decided before it: appended at position 2\n")
    monkeypatch.undo()
    again_result = invoke(["--store", store_url, "submit", *ONE_SHOT])
    assert json.loads(again_result.stdout)["status"] == "duplicate"


@contextmanager
def collected_only_by_reference() -> Iterator[None]:
    """The cyclic garbage collector off: what a command leaves to it stays as
    it was left (it would run at a moment nobody chose, in a later command)."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def test_a_one_shot_stopped_after_its_result_has_closed_its_store_when_it_returns(
    store_url, monkeypatch
):
    """The event is committed, the signal raised once its result is printed:
    the store is closed as the command ends, not left open to the collector
    (which closed it inside whatever ran next; with that command's handlers)."""
    invoke(["--store", store_url, "submit", "node-registered", "--node", "n1"])
    opened: list[Ledger] = []
    opening = Ledger.open

    def recorded(*args: Any, **kwargs: Any) -> Ledger:
        opened.append(opening(*args, **kwargs))
        return opened[-1]

    monkeypatch.setattr(Ledger, "open", recorded)
    signalled_at_one_event(monkeypatch, signal.SIGINT, times=1)

    with collected_only_by_reference():
        result = invoke(["--store", store_url, "submit", *ONE_SHOT], code=130)
        closed = [ledger._closed for ledger in opened]

    assert json.loads(result.stdout)["status"] == "appended"
    assert closed == [True]


def test_a_stream_stopped_by_a_signal_leaves_no_writer_thread_nor_collector_settings(
    store_url, tmp_path, monkeypatch
):
    """Where the store decides a batch while the last commits, a writer thread
    runs and the collector runs less often; a stream stopped between two
    batches ends both as the command ends."""
    signalled_at_batch(monkeypatch, signal.SIGINT, times=1)
    source = tmp_path / "events.jsonl"
    source.write_text(TEXT)
    before = (gc.get_threshold(), set(threading.enumerate()))

    with collected_only_by_reference():
        result = invoke(["--store", store_url, "submit", str(source), "--batch", "2"], code=130)
        threads = {t.name for t in set(threading.enumerate()) - before[1]}
        after = (gc.get_threshold(), threads)

    assert "every line up to 4 was decided" in result.stderr, result.stderr
    assert after == (before[0], set())


def test_a_second_signal_leaves_one_event_kept_or_not_and_says_so(store_url, monkeypatch):
    invoke(["--store", store_url, "submit", "node-registered", "--node", "n1"])
    signalled_at_one_event(monkeypatch, signal.SIGINT, times=2)

    result = invoke(["--store", store_url, "submit", *ONE_SHOT], code=130)

    assert result.stdout == ""
    assert result.stderr.splitlines()[1:] == [
        ("Error: interrupted: whether the event is kept is not known (submitted again with "
         "the same --id, a kept one answers duplicate)")]
    monkeypatch.undo()
    # Stopped before the event was handed over: here it is not kept.
    again_result = invoke(["--store", store_url, "submit", *ONE_SHOT])
    assert json.loads(again_result.stdout)["status"] == "appended"


@pytest.mark.parametrize("how", ["file", "pipe"])
def test_a_signal_while_the_store_closes_after_the_last_batch_still_says_what_is_kept(
    store_url, tmp_path, monkeypatch, how
):
    """Every batch is committed; Ctrl-C lands while the store is closed (on
    SQLite the WAL is folded back then, which takes a while after a large
    stream). With --quiet nothing else tells the user how far the stream got,
    so the last words must: README says a submit of a stream says how far,
    also with --quiet."""
    closing = Ledger.close

    def signalled_while_closing(ledger: Ledger) -> None:
        store_closing = ledger.store.close

        def signalled() -> None:  # closing it again does nothing: it is not signalled there
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.01)
            store_closing()

        ledger.store.close = signalled  # type: ignore[method-assign]
        closing(ledger)

    monkeypatch.setattr(Ledger, "close", signalled_while_closing)
    if how == "file":
        source = tmp_path / "events.jsonl"
        source.write_text(TEXT)
        result = invoke(["--store", store_url, "submit", str(source), "--quiet"], code=130)
    else:
        with piped(TEXT) as stream:
            result = invoke(["--store", store_url, "submit", "-", "--quiet"], code=130, input=stream)
    monkeypatch.undo()
    assert statuses_on_resubmitting(store_url, tmp_path) == ["duplicate"] * 6
    assert result.stderr == (
        "Error: interrupted: every line up to 6 was decided and is kept as decided "
        "(6 appended, 0 duplicate, 0 rejected, 0 invalid); no later line was kept\n")


def signalled_while_closing(monkeypatch: pytest.MonkeyPatch, times: int) -> None:
    """Ctrl-C ``times`` as the ledger's store is closed (once)."""
    closing = Ledger.close

    def signalled(ledger: Ledger) -> None:
        if not ledger._closed:
            _signal_self(signal.SIGINT, times)
        closing(ledger)

    monkeypatch.setattr(Ledger, "close", signalled)


def test_ctrl_c_again_while_the_store_closes_after_a_stopped_stream_keeps_its_last_words(
    store_url, tmp_path, monkeypatch
):
    """The first Ctrl-C invites a second ("Ctrl-C again to stop sooner");
    one that lands while the store closes (after the Held handlers are
    gone) must not turn the last words into a bare 'interrupted'."""
    signalled_at_batch(monkeypatch, signal.SIGINT, times=1)
    signalled_while_closing(monkeypatch, times=1)
    source = tmp_path / "events.jsonl"
    source.write_text(TEXT)

    result = invoke(["--store", store_url, "submit", str(source), "--batch", "2"], code=130)

    assert result.stderr.splitlines()[1:] == [
        ("Error: interrupted: every line up to 4 was decided and is kept as decided (4 appended, "
        "0 duplicate, 0 rejected, 0 invalid); no later line was kept")], result.stderr


def test_a_second_signal_while_the_store_closes_after_one_event_is_not_told_as_not_known(
    store_url, monkeypatch
):
    """The event is committed and its receipt is in hand when the store is
    closed: it is kept, and the program knows it."""
    invoke(["--store", store_url, "submit", "node-registered", "--node", "n1"])
    signalled_while_closing(monkeypatch, times=2)

    result = invoke(["--store", store_url, "submit", *ONE_SHOT], code=130)

    monkeypatch.undo()
    assert json.loads(invoke(["--store", store_url, "submit", *ONE_SHOT]).stdout)["status"] == (
        "duplicate")
    assert json.loads(result.stdout)["status"] == "appended"
    assert result.stderr == (
        "Error: interrupted: the event was decided before it: appended at position 2\n")


def test_a_signal_while_the_store_opens_says_the_event_was_not_submitted(store_url, monkeypatch):
    invoke(["--store", store_url, "submit", "node-registered", "--node", "n1"])
    opening = Ledger.open

    def signalled(*args: Any, **kwargs: Any) -> Ledger:
        _signal_self(signal.SIGTERM, 1)
        return opening(*args, **kwargs)

    monkeypatch.setattr(Ledger, "open", signalled)

    result = invoke(["--store", store_url, "submit", *ONE_SHOT], code=143)

    monkeypatch.undo()
    assert (result.stdout, result.stderr) == ("", "Error: terminated: the event was not submitted\n")
    assert json.loads(invoke(["--store", store_url, "submit", *ONE_SHOT]).stdout)["status"] == (
        "appended")
