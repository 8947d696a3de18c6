"""Settings of the whole process changed during bulk work are put back once
the last block that wanted them ends, in whatever order blocks in several
threads end."""

from __future__ import annotations

import gc
import sys
import threading

import pytest

from ledger.application import Ledger
from ledger.collection import BULK, fewer_collections
from ledger.pipeline import SWITCH_INTERVAL, prompt_switches


def test_blocks_ending_out_of_order_leave_the_collector_as_it_was():
    before = gc.get_threshold()
    first, second = fewer_collections(), fewer_collections()

    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)  # the first to begin ends first: the second still runs
    during = gc.get_threshold()
    second.__exit__(None, None, None)

    assert (during, gc.get_threshold()) == (BULK, before)


def test_blocks_in_two_threads_ending_out_of_order_leave_the_switch_interval_as_it_was():
    before = sys.getswitchinterval()
    entered, first_ended = threading.Event(), threading.Event()
    seen: list[float] = []

    def second() -> None:
        with prompt_switches():
            entered.set()
            first_ended.wait(10)
            seen.append(sys.getswitchinterval())

    other = threading.Thread(target=second)
    with prompt_switches():
        other.start()
        entered.wait(10)
    first_ended.set()
    other.join(10)

    assert (seen, sys.getswitchinterval()) == ([pytest.approx(min(before, SWITCH_INTERVAL))], before)


def test_a_block_that_fails_puts_the_setting_back():
    before = gc.get_threshold()

    @fewer_collections()
    def failing() -> None:
        raise ValueError("bulk work failed")

    try:
        failing()
    except ValueError:
        pass

    assert gc.get_threshold() == before


def test_a_submit_many_stream_holds_the_settings_while_read_and_puts_them_back(tmp_path):
    """As the README's Python API says: the caller's code between receipts
    runs with them; a stream closed early or read to its end puts them back."""
    before = gc.get_threshold(), sys.getswitchinterval()
    with Ledger.open(f"sqlite:///{tmp_path}/l.db") as ledger:
        stream = ledger.submit_many(
            ({"type": "node-registered", "node": f"n{i}"} for i in range(3000)), batch=100)
        next(stream)
        assert gc.get_threshold() == BULK
        assert sys.getswitchinterval() == pytest.approx(SWITCH_INTERVAL)  # as the OS rounds it
        stream.close()
        assert (gc.get_threshold(), sys.getswitchinterval()) == before
        beats = ({"type": "heartbeat", "node": f"n{i}"} for i in range(100))  # first batch
        assert all(receipt.ok for receipt in ledger.submit_many(beats, batch=100))
        assert (gc.get_threshold(), sys.getswitchinterval()) == before
