#!/usr/bin/env python3
"""Measure concurrent ``alloc-ledger submit`` streams against pgbench, side by side.

On one PostgreSQL server, in one run:

1. pgbench: ``pgbench -n -c 8 -j 2 -T 10 -f insert.sql`` where insert.sql is a
   single-row INSERT into a scratch table: the server's own rate of durable
   single-row commits from 8 clients (synchronous_commit as configured: on).
   It runs again after the ledger, to show how much the machine drifted.
2. the ledger: 8 ``alloc-ledger submit -`` processes on one fresh store, each
   fed its own simulated history (scripts/simulate.py, names prefixed per
   stream) through a pipe, interactively: by default paced at 0.8 x the rate
   pgbench just measured (open loop, as independent clients send; keeping up
   clears 0.75 after the final drain), or with ``--rate max`` as fast as
   answers come back with at most ``--window`` lines unacknowledged per stream
   (closed loop). Each stream's first line is answered before the clock starts
   (imports and connections are not measured). The acknowledgement latency of
   an event is the time from when its line was due (paced; from writing it,
   closed loop) to reading its result line.

Each measured phase starts after a ``CHECKPOINT`` (when the role may run
one), so that pgbench and the ledger meet the server in the same state: no
dirty buffers left from the phase before, and WAL segments recycled for
reuse. A server that has never checkpointed creates (and zero-fills) a new
16 MB WAL segment every ~16 MB written, inside some commit: at the ledger's
~1.2 kB of WAL per event that stalls a commit for tens of ms about once a
second, which a server in steady state does not do. The WAL written per
event and the segments created during the run are printed.

Prints events/s, the ratio to pgbench's rate, p50/p99 latency and the CPU
the machine spent per event, and exits 1 when the goal (ratio >= 0.75 and
p99 < 50 ms) is missed (with --report-only, only when an event is
invalid or something crashed).

Example:

    python scripts/bench_pg.py --dsn postgresql://postgres@127.0.0.1:5432/test
    python scripts/bench_pg.py --rate max --window 16
"""

from __future__ import annotations

import argparse
import json
import os
import re
import selectors
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scripts.simulate import generate

GOAL_RATIO = 0.75
GOAL_P99_MS = 50.0
OFFERED = 0.8  # --rate goal offers 0.8 x pgbench, so that keeping up clears 0.75 after the drain


def renamed(event: dict[str, Any], prefix: str) -> dict[str, Any]:
    """The same event in a stream of its own: every name gets the stream's prefix."""
    for key in ("node", "parent", "alloc", "id", "job"):
        if isinstance(event.get(key), str):
            event[key] = prefix + event[key]
    if isinstance(event.get("addresses"), list):
        event["addresses"] = [prefix + a for a in event["addresses"]]
    if isinstance(event.get("slots"), list):
        for entry in event["slots"]:
            if isinstance(entry.get("alloc"), str):
                entry["alloc"] = prefix + entry["alloc"]
    return event


def write_streams(directory: Path, streams: int, events: int, nodes: int) -> list[Path]:
    paths = []
    for number in range(streams):
        path = directory / f"stream-{number}.jsonl"
        with path.open("w") as out:
            for event in generate(events, nodes=nodes, slots=4, seed=100 + number):
                out.write(json.dumps(renamed(event, f"s{number}-"), separators=(",", ":")) + "\n")
        paths.append(path)
    return paths


# -- pgbench ----------------------------------------------------------------------


def pg_environment(dsn: str) -> dict[str, str]:
    parts = urlsplit(dsn)
    env = dict(os.environ)
    env.update(
        PGHOST=parts.hostname or "", PGPORT=str(parts.port or 5432),
        PGUSER=parts.username or "", PGDATABASE=parts.path.lstrip("/"),
    )
    if parts.password:
        env["PGPASSWORD"] = parts.password
    return env


def psql(dsn: str, statement: str) -> str:
    result = subprocess.run(
        ["psql", "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", statement],
        env=pg_environment(dsn), capture_output=True, text=True, check=True,
    )
    return result.stdout.strip()


def checkpoint(dsn: str) -> bool:
    """Start a phase from a checkpoint; False when the role may not run one."""
    try:
        psql(dsn, "CHECKPOINT")
    except subprocess.CalledProcessError:
        return False
    return True


class WalMeter:
    """WAL bytes written and WAL segment files created over a phase (files
    only when the role may list the WAL directory)."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.position = psql(dsn, "SELECT pg_current_wal_lsn()")
        self.files = self._files()

    def _files(self) -> int | None:
        try:
            return int(psql(self.dsn, "SELECT count(*) FROM pg_ls_waldir()"))
        except subprocess.CalledProcessError:
            return None

    def read(self) -> tuple[int, int | None]:
        """(bytes written, segment files created) since this meter started."""
        written = int(psql(self.dsn, f"SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '{self.position}')"))
        files = self._files()
        created = None if files is None or self.files is None else max(files - self.files, 0)
        return written, created


def pgbench(dsn: str, schema: str, clients: int, seconds: int, directory: Path) -> float:
    table = f"{schema}.pgbench_scratch"
    psql(dsn, f"CREATE TABLE IF NOT EXISTS {table} (id bigserial PRIMARY KEY, v text)")
    script = directory / "insert.sql"
    script.write_text(f"INSERT INTO {table} (v) VALUES ('x');\n")
    command = ["pgbench", "-n", "-c", str(clients), "-j", "2", "-T", str(seconds), "-f", str(script)]
    checkpoint(dsn)
    result = subprocess.run(
        command, env=pg_environment(dsn), capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise SystemExit(f"pgbench failed: {result.stderr.strip()}")
    found = re.search(r"tps = ([\d.]+) \(without initial connection time\)", result.stdout)
    if found is None:
        raise SystemExit(f"cannot read pgbench's rate from: {result.stdout}")
    return float(found.group(1))


# -- the ledger's streams -----------------------------------------------------------


class Stream:
    """One ``alloc-ledger submit -`` process fed its history through a pipe.

    Paced (``rate``): lines are written on a fixed schedule whatever the
    answers, as independent clients would send them (open loop). Otherwise at
    most ``window`` lines are unacknowledged at any time (closed loop)."""

    def __init__(self, url: str, path: Path, window: int, rate: float, batch: int) -> None:
        self.lines = path.read_bytes().splitlines(keepends=True)
        self.sent = [0.0] * len(self.lines)
        self.latencies: list[float] = []
        self.statuses: dict[str, int] = {}
        self.rate = rate
        self.window = threading.Semaphore(window)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "commands", "--store", url, "submit", "-",
             "--batch", str(batch)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, bufsize=0,
        )
        self.done = time.perf_counter()
        self.answered = threading.Event()  # every line measured has its answer

    def warm_up(self) -> None:
        """Send the first line and wait for its answer: the process has started,
        imported and connected (not measured)."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(self.lines[0])
        answer = b""
        while not answer.endswith(b"\n"):  # nothing else comes until the clock starts
            chunk = os.read(self.process.stdout.fileno(), 1 << 16)
            if not chunk:
                raise SystemExit(f"a submit stream failed: {self.process.stderr.read().decode()}")  # type: ignore[union-attr]
            answer += chunk
        self.lines = self.lines[1:]
        self.sent = self.sent[1:]
        self.next = 0  # the next line to send
        self.partial = b""  # an answer not read to its end yet

    def produce(self) -> None:
        """Closed loop: a line whenever fewer than ``window`` wait for answers."""
        stdin = self.process.stdin
        assert stdin is not None
        for index, line in enumerate(self.lines):
            self.window.acquire()
            self.sent[index] = time.perf_counter()
            stdin.write(line)
        stdin.close()

    def send_due(self, began: float, now: float) -> None:
        """Paced: write every line due by now, in one write. A line's latency
        counts from when it was due, not from when this thread got to write it:
        a late pacer must not hide a slow ledger (coordinated omission)."""
        due = min(len(self.lines), int((now - began) * self.rate) + 1)
        if due > self.next:
            for number in range(self.next, due):
                self.sent[number] = began + number / self.rate
            assert self.process.stdin is not None
            self.process.stdin.write(b"".join(self.lines[self.next:due]))
            self.next = due
            if due == len(self.lines):
                self.process.stdin.close()

    def read_answers(self, chunk: bytes, now: float) -> None:
        """Answers as they arrive (``now``: when this chunk of them did)."""
        answers = (self.partial + chunk).split(b"\n")
        self.partial = answers.pop()
        for raw in answers:
            line, status = result_of(raw)
            self.latencies.append(now - self.sent[line - 2])
            self.statuses[status] = self.statuses.get(status, 0) + 1
            self.window.release()
            self.done = now  # the last answer (not the process's exit, which follows)
        if len(self.latencies) == len(self.lines):
            self.answered.set()


def pace(streams: list[Stream], start: threading.Event, began: list[float]) -> None:
    """One thread writes every paced stream's due lines, every 2 ms (this
    process shares the CPUs with what it measures: few wake-ups)."""
    start.wait()
    while any(s.next < len(s.lines) for s in streams):
        now = time.perf_counter()
        for stream in streams:
            if stream.next < len(stream.lines):
                stream.send_due(began[0], now)
        time.sleep(0.002)


def read(streams: list[Stream]) -> None:
    """One thread reads every stream's answers as they come."""
    with selectors.DefaultSelector() as selector:
        for stream in streams:
            assert stream.process.stdout is not None
            selector.register(stream.process.stdout.fileno(), selectors.EVENT_READ, stream)
        open_ = len(streams)
        while open_:
            for key, _ in selector.select():
                stream = key.data
                chunk = os.read(key.fd, 1 << 16)
                if chunk:
                    stream.read_answers(chunk, time.perf_counter())
                else:
                    selector.unregister(key.fd)
                    stream.answered.set()
                    open_ -= 1


RESULT = re.compile(rb'^\{"line": (\d+), "status": "(\w+)"')


def result_of(raw: bytes) -> tuple[int, str]:
    """The line number and status of a result line, read without decoding all
    of it (this process shares the CPUs with what it measures)."""
    found = RESULT.match(raw)
    if found is None:
        result = json.loads(raw)
        return result["line"], result["status"]
    return int(found.group(1)), found.group(2).decode()


def run_streams(url: str, paths: list[Path], window: int, rate: float, batch: int) -> dict[str, Any]:
    streams = [Stream(url, path, window, rate / len(paths), batch) for path in paths]
    start = threading.Event()
    began = [0.0]
    warming = [threading.Thread(target=stream.warm_up) for stream in streams]
    for thread in warming:
        thread.start()
    for thread in warming:
        thread.join()
    threads = [threading.Thread(target=read, args=(streams,))]
    if rate:
        threads.append(threading.Thread(target=pace, args=(streams, start, began)))
    else:
        for stream in streams:
            threads.append(threading.Thread(target=lambda s=stream: (start.wait(), s.produce())))
    for thread in threads:
        thread.start()
    time.sleep(0.5)
    pids = {stream.process.pid: "submit streams" for stream in streams}
    pids[os.getpid()] = "this script"
    busy_before, harness_before, by_before = cpu_busy(), harness_cpu(), cpu_by_process(pids)
    began[0] = time.perf_counter()
    start.set()
    for stream in streams:
        stream.answered.wait()
    busy_after, harness_after, by_after = cpu_busy(), harness_cpu(), cpu_by_process(pids)
    for thread in threads:
        thread.join()
    elapsed = max(s.done for s in streams) - began[0]
    for stream in streams:
        if stream.process.wait() not in (0, 1):
            raise SystemExit(f"a submit stream failed (exit {stream.process.returncode}): {stream.process.stderr.read().decode()}")
    latencies = sorted(x for s in streams for x in s.latencies)
    statuses: dict[str, int] = {}
    for stream in streams:
        for status, count in stream.statuses.items():
            statuses[status] = statuses.get(status, 0) + count
    cuts = statistics.quantiles(latencies, n=100)
    return {
        "events": len(latencies),
        "seconds": elapsed,
        "events_per_second": len(latencies) / elapsed,
        "p50_ms": 1000 * cuts[49],
        "p99_ms": 1000 * cuts[98],
        "max_ms": 1000 * latencies[-1],
        "statuses": statuses,
        "cpu_busy": busy_after[0] - busy_before[0],
        "cpu_total": busy_after[1] - busy_before[1],
        "cpu_harness": harness_after - harness_before,
        "cpu_by_program": cpu_by_program(by_before, by_after),
    }


def cpu_busy() -> tuple[float, float]:
    """Seconds of CPU busy and in total, over all CPUs, since boot (Linux /proc/stat)."""
    try:
        fields = [float(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except OSError:
        return 0.0, 0.0
    ticks = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)
    return (sum(fields[:8]) - idle) / ticks, sum(fields[:8]) / ticks


def harness_cpu() -> float:
    """CPU seconds this measuring process has used (its pacing and reading threads)."""
    times = os.times()
    return times.user + times.system


def cpu_by_process(named: dict[int, str]) -> dict[int, tuple[str, float]]:
    """CPU seconds used so far by each process alive now, with its program name or
    the name ``named`` gives its PID (Linux /proc/PID/stat, every thread)."""
    ticks = os.sysconf("SC_CLK_TCK")
    used: dict[int, tuple[str, float]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        pid = int(entry.name)
        name = named.get(pid) or stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        used[pid] = (name, (float(fields[11]) + float(fields[12])) / ticks)
    return used


def cpu_by_program(before: dict[int, tuple[str, float]],
                   after: dict[int, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds used between two readings, summed by program, over the
    processes alive at the second (one that exits in between drops out: the
    ledger's streams and the server's sessions live through the run)."""
    used: dict[str, float] = {}
    for pid, (name, seconds) in after.items():
        earlier = before.get(pid)
        spent = seconds - (earlier[1] if earlier is not None and earlier[0] == name else 0.0)
        used[name] = used.get(name, 0.0) + spent
    return used


def commits(dsn: str) -> int:
    return int(psql(dsn, "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=os.environ.get(
        "ALLOC_LEDGER_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test"))
    parser.add_argument("--streams", type=int, default=8, help="concurrent submit streams (8)")
    parser.add_argument("--events", type=int, default=6000, help="events per stream (6000)")
    parser.add_argument("--nodes", type=int, default=50, help="nodes per stream (50)")
    parser.add_argument("--rate", default="goal",
                        help="offered events/s over all streams, paced (open loop): a number, "
                        "'goal' (0.8 x pgbench's rate, the default) or 'max' (closed loop, --window)")
    parser.add_argument("--window", type=int, default=16,
                        help="with --rate max: most unacknowledged lines per stream (16)")
    parser.add_argument("--batch", type=int, default=1000, help="submit --batch (1000)")
    parser.add_argument("--seconds", type=int, default=10, help="pgbench -T (10)")
    parser.add_argument("--options", default="", help="extra store URL options, e.g. projections=inline")
    parser.add_argument("--keep", action="store_true", help="keep the scratch schema")
    parser.add_argument("--report-only", action="store_true",
                        help="exit 0 when the goal is missed (CI: a tiny run must only work); "
                        "an invalid event or a crash still exits 1")
    args = parser.parse_args(argv)

    schema = f"bench_{uuid.uuid4().hex[:8]}"
    url = f"{args.dsn}{'&' if '?' in args.dsn else '?'}schema={schema}"
    if args.options:
        url += f"&{args.options}"
    sync = psql(args.dsn, "SHOW synchronous_commit")
    cpus = os.cpu_count()
    print(f"server: {psql(args.dsn, 'SHOW server_version')}, synchronous_commit={sync}, "
          f"fsync={psql(args.dsn, 'SHOW fsync')}, {cpus} CPUs")
    try:
        from ledger.store import open_store

        open_store(url).close()  # create the schema before the clock starts
        with tempfile.TemporaryDirectory() as scratch:
            directory = Path(scratch)
            paths = write_streams(directory, args.streams, args.events, args.nodes)
            pgbench_rate = pgbench(args.dsn, schema, args.streams, args.seconds, directory)
            print(f"pgbench: {pgbench_rate:,.0f} single-row inserts/s "
                  f"({args.streams} clients, -j 2, {args.seconds} s)")
            checkpointed = checkpoint(args.dsn)
            before, wal = commits(args.dsn), WalMeter(args.dsn)
            rate = {"goal": OFFERED * pgbench_rate, "max": 0.0}.get(args.rate) if args.rate in (
                "goal", "max") else float(args.rate)
            assert rate is not None
            if rate:
                print(f"offering {rate:,.0f} events/s, paced, over {args.streams} streams")
            ledger = run_streams(url, paths, args.window, rate, args.batch)
            transactions = commits(args.dsn) - before
            wal_bytes, segments = wal.read()
            psql(args.dsn, f"TRUNCATE {schema}.pgbench_scratch")
            pgbench_after = pgbench(args.dsn, schema, args.streams, args.seconds, directory)
    finally:
        if not args.keep:
            psql(args.dsn, f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    ratio = ledger["events_per_second"] / pgbench_rate
    print(
        f"alloc-ledger: {ledger['events']:,} events in {ledger['seconds']:.2f} s = "
        f"{ledger['events_per_second']:,.0f} events/s from {args.streams} submit streams "
        f"({'paced' if rate else f'window {args.window}'}); {transactions:,} commits in the "
        f"database meanwhile (all sessions), {ledger['events'] / max(transactions, 1):.1f} "
        "events per commit"
    )
    print(f"pgbench again after the ledger: {pgbench_after:,.0f} single-row inserts/s "
          "(the machine's drift; the ratio uses the first figure)")
    print(f"statuses: {json.dumps(ledger['statuses'], sort_keys=True)}")
    print(f"WAL: {wal_bytes / ledger['events']:,.0f} bytes per event (from the run's start to "
          f"the last answer, schema warm-up included); WAL segments created meanwhile: "
          f"{'not visible to this role' if segments is None else segments}; each phase "
          f"{'started after a CHECKPOINT' if checkpointed else 'ran without a CHECKPOINT (the role may not run one)'}")
    if ledger["cpu_total"] > 0:
        busy, events = ledger["cpu_busy"], ledger["events"]
        print(f"CPU: {100 * busy / ledger['cpu_total']:.0f}% busy over {cpus} CPUs from the "
              f"clock's start to the last answer (every process on the machine), "
              f"{1e6 * busy / events:.0f} CPU-us per event, of which this measuring "
              f"process {1e6 * ledger['cpu_harness'] / events:.0f}")
        programs = sorted(ledger["cpu_by_program"].items(), key=lambda item: -item[1])
        print("CPU-us per event by program: " + ", ".join(
            f"{name} {1e6 * seconds / events:.0f}" for name, seconds in programs[:6] if seconds > 0))
    print(f"ratio to pgbench: {ratio:.2f} (goal >= {GOAL_RATIO})")
    print(f"acknowledgement latency: p50 {ledger['p50_ms']:.1f} ms, p99 {ledger['p99_ms']:.1f} ms, "
          f"max {ledger['max_ms']:.1f} ms (goal p99 < {GOAL_P99_MS:.0f} ms)")
    met = ratio >= GOAL_RATIO and ledger["p99_ms"] < GOAL_P99_MS
    print("goal met" if met else "goal NOT met")
    if ledger["statuses"].get("invalid"):
        print(f"check failed: the simulated events are valid: {ledger['statuses']}")
        return 1
    return 0 if met or args.report_only else 1


if __name__ == "__main__":
    sys.exit(main())
