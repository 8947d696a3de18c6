"""Deciding an event costs the same whatever the length of history, and
reading a history takes memory bounded whatever its length.

Deciding: builds three SQLite stores in which one node has 10, 10,000 and
1,000,000 prior heartbeats (plus a placement), then times the next events on
that node, in one run:

  - in process: ``Ledger.submit`` of a heartbeat and of a placement
    (median of many, the store opened once), and
  - one-shot: ``alloc-ledger submit heartbeat --node n1`` (median of 5).

Reading: builds stores in which a node of 1,024 slots, each holding an
allocation, reports all of them in each of 200 and 2,000 heartbeats, then
runs ``query history n1#0`` and ``query alloc a0`` (json, jsonl, table) and
prints each one's wall time and peak RSS (measured by GNU time, /usr/bin/time).

Usage: python scripts/bench_history.py [--sizes 10,10000,1000000]
       [--reports 200,2000] [--slots 1024] [--only decide|read] [--workdir DIR]
       [--store postgresql://...?schema=NAME]  (the reading part there, in schemas
       NAME_200 and NAME_2000, dropped after)
"""

from __future__ import annotations

import argparse
import os
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


def build_reports(url: str, slots: int, reports: int) -> None:
    """n1 with ``slots`` slots, each held, and ``reports`` heartbeats reporting all of them."""
    with Ledger.open(url) as ledger:
        ledger.submit({"type": "node-registered", "node": "n1", "slots": slots})
        ledger.submit({"type": "heartbeat", "node": "n1"})
        ledger.submit_batch([{"type": "alloc-placed", "alloc": f"a{i}", "node": "n1", "slot": i}
                             for i in range(slots)])
        beat = {"type": "heartbeat", "node": "n1",
                "slots": [{"slot": i, "alloc": f"a{i}"} for i in range(slots)]}
        for done in range(0, reports, 100):
            receipts = ledger.submit_batch([beat] * min(100, reports - done))
            assert {r.status for r in receipts} == {"appended"}, receipts[0]


TIME = "/usr/bin/time"  # GNU time: a fork of this process would count its size as the child's


def peak(command: list[str]) -> tuple[float, float | None, int]:
    """Wall seconds, peak RSS in MB (GNU time's; None without it), and bytes
    printed of one command."""
    with tempfile.NamedTemporaryFile("r") as measured:
        timed = os.access(TIME, os.X_OK)
        if timed:
            command = [TIME, "-f", "%M", "-o", measured.name, *command]
        started = time.perf_counter()
        with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL) as child:
            assert child.stdout is not None
            printed = 0
            while chunk := child.stdout.read(1 << 20):
                printed += len(chunk)
        seconds = time.perf_counter() - started
        assert child.returncode == 0, command
        rss = int(measured.read().split()[-1]) / 1024 if timed else None
    return seconds, rss, printed


def reading(urls: list[tuple[int, str]]) -> None:
    print(f"{'reports':>8} {'query':>16} {'format':>7} {'seconds':>8} {'peak RSS MB':>12}"
          f" {'printed MB':>11}")
    for reports, url in urls:
        for question in (["history", "n1#0"], ["alloc", "a0"]):
            for fmt in ("json", "jsonl", "table"):
                command = [sys.executable, "-m", "commands", "--store", url, "query",
                           *question, "--format", fmt]
                seconds, rss, printed = peak(command)
                shown = "no GNU time" if rss is None else f"{rss:.0f}"
                print(f"{reports:>8,} {' '.join(question):>16} {fmt:>7} {seconds:>8.1f}"
                      f" {shown:>12} {printed / 1e6:>11.1f}", flush=True)


def schema_of(url: str, reports: int) -> str:
    """The PostgreSQL store URL with a schema of its own for ``reports``."""
    dsn, _, query = url.partition("?")
    options = dict(p.split("=", 1) for p in query.split("&") if p)
    options["schema"] = f"{options.get('schema', 'bench_history')}_{reports}"
    return dsn + "?" + "&".join(f"{k}={v}" for k, v in options.items())


def drop_schema(url: str) -> None:
    import psycopg  # only for a PostgreSQL store

    dsn, _, query = url.partition("?")
    schema = dict(p.split("=", 1) for p in query.split("&"))["schema"]
    with psycopg.connect(dsn, autocommit=True) as connection:
        connection.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10,10000,1000000")
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--reports", default="200,2000")
    parser.add_argument("--slots", type=int, default=1024)
    parser.add_argument("--only", choices=("decide", "read"))
    parser.add_argument("--store", help="a PostgreSQL URL with ?schema=NAME for the reading part")
    parser.add_argument("--workdir")
    args = parser.parse_args()
    if args.only != "read":
        deciding(args)
    if args.only != "decide":
        reports = [int(n) for n in args.reports.split(",")]
        with tempfile.TemporaryDirectory(dir=args.workdir) as directory:
            urls = [(n, schema_of(args.store, n) if args.store else
                     f"sqlite:///{Path(directory) / f'reports-{n}.db'}") for n in reports]
            try:
                for n, url in urls:
                    build_reports(url, args.slots, n)
                    if args.store:
                        subprocess.run([sys.executable, "-m", "commands", "--store", url,
                                        "project"], check=True, capture_output=True)
                reading(urls)
            finally:
                for _, url in urls if args.store else []:
                    drop_schema(url)


def deciding(args: argparse.Namespace) -> None:
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
