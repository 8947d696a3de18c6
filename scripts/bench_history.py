"""Deciding an event costs the same whatever the length of history.

Builds three SQLite stores in which one node has 10, 10,000 and 1,000,000
prior heartbeats (plus a placement), then times the next events on that
node, in one run:

  - in process: ``Ledger.submit`` of a heartbeat and of a placement
    (median of many, the store opened once), and
  - one-shot: ``alloc-ledger submit heartbeat --node n1`` (median of 5).

Usage: python scripts/bench_history.py [--sizes 10,10000,1000000] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ledger.application import Ledger


def build(path: Path, prior: int) -> None:
    with Ledger.open(f"sqlite:///{path}") as ledger:
        ledger.submit({"type": "node-registered", "node": "n1", "slots": 2})
        beat = {"type": "heartbeat", "node": "n1"}
        done = 0
        while done < prior:
            step = min(20_000, prior - done)
            ledger.submit_batch([beat] * step)
            done += step


def in_process(path: Path, rounds: int) -> tuple[float, float]:
    with Ledger.open(f"sqlite:///{path}") as ledger:
        beats, places = [], []
        for i in range(rounds):
            started = time.perf_counter()
            receipt = ledger.submit({"type": "heartbeat", "node": "n1"})
            beats.append(time.perf_counter() - started)
            assert receipt.status == "appended", receipt
            alloc = f"bench-{i}"
            started = time.perf_counter()
            receipt = ledger.submit({"type": "alloc-placed", "alloc": alloc, "node": "n1"})
            places.append(time.perf_counter() - started)
            assert receipt.status == "appended", receipt
            ledger.submit({"type": "alloc-updated", "alloc": alloc, "client_status": "complete"})
    return statistics.median(beats), statistics.median(places)


def one_shot(path: Path, rounds: int) -> float:
    times = []
    command = [sys.executable, "-m", "commands", "--store", f"sqlite:///{path}",
               "submit", "heartbeat", "--node", "n1"]
    for _ in range(rounds):
        started = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10,10000,1000000")
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--workdir")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory(dir=args.workdir) as directory:
        rows = []
        for prior in sizes:
            path = Path(directory) / f"history-{prior}.db"
            started = time.perf_counter()
            build(path, prior)
            built = time.perf_counter() - started
            beat, place = in_process(path, args.rounds)
            shot = one_shot(path, 5)
            rows.append((prior, built, beat, place, shot))
        base = rows[0]
        print(f"{'prior heartbeats':>16} {'build s':>8} {'heartbeat ms':>13} {'placement ms':>13}"
              f" {'CLI submit s':>13} {'ratio vs first':>15}")
        for prior, built, beat, place, shot in rows:
            ratio = max(beat / base[2], place / base[3])
            print(f"{prior:>16,} {built:>8.1f} {beat * 1000:>13.2f} {place * 1000:>13.2f}"
                  f" {shot:>13.3f} {ratio:>15.2f}")


if __name__ == "__main__":
    main()
