"""What the event log costs on the tools/call path, measured before and after.

Two measurements:

1. In process: the cost per call of recording ``tool.start`` + ``tool.complete`` (a list append each)
   and of the flush that formats and writes them, amortized, against a closed log (one attribute
   check). uvloop, 200k calls.
2. End to end: a real daemon, one raw NDJSON connection, sequential ``tools/call`` round trips,
   client, daemon and worker pinned to one core. Three daemons, interleaved over several rounds:
   ``base`` (a source tree without the event log, e.g. ``git archive main``), this tree with
   ``log_level = "warning"`` (tool events off) and with ``log_level = "info"`` (every call logged).

Usage:
    python bench/eventlog_cost.py [--base DIR] [--calls N] [--rounds R] [--cpu C]

``--base`` is the root of a source tree (with client/ and daemon/) to compare against; without it
only this tree's two log levels are compared. Prints a table and writes bench/results/eventlog.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from clients import measure_latency, measure_throughput, socket_channel  # noqa: E402
from common import ECHO_TOOL, ROOT, DaemonUnderTest  # noqa: E402

TOOL = ECHO_TOOL.format(name="echo")


def in_process(calls: int) -> dict[str, float]:
    import uvloop

    from atomictoolsd.eventlog.writer import EventLog

    call = ("echo", "/t/echo.py", 1, "s1", "agent")  # tool, module, call id, session, agent
    results: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, open_it in (("closed log (check only)", False), ("open log, info", True)):
            log = EventLog()
            if open_it:
                log.open(Path(tmp) / "bench.log", max_bytes=1 << 40)

            async def run(log: EventLog = log) -> tuple[float, float]:
                # As in the daemon: the flush runs every quarter second, i.e. every few thousand
                # calls at full speed; here every 2,000 calls, timed apart from the recording.
                log.bind_loop(asyncio.get_running_loop())
                recorded = flushed = 0
                clock = time.perf_counter_ns
                for _ in range(calls // 2000):
                    started = clock()
                    for _ in range(2000):
                        if log.calls_on:
                            log.tool_started(*call)
                        if log.calls_on:
                            log.tool_finished(*call, 0.0001, None)
                    recorded += clock() - started
                    started = clock()
                    log.flush()
                    flushed += clock() - started
                return recorded, flushed

            recorded, flushed = uvloop.run(run())
            results[f"{label}: record, ns/call"] = recorded / calls
            results[f"{label}: flush, ns/call"] = flushed / calls
            log.close()
    return results


class Daemon:
    """A daemon under test from ``source`` at ``log_level``, with one raw connection kept open."""

    def __init__(self, label: str, source: Path, log_level: str) -> None:
        self.label = label
        self.under_test = DaemonUnderTest(
            tools={"echo": TOOL}, config=f'log_level = "{log_level}"\n', source=None if source == ROOT else source
        ).start()
        self.channel = socket_channel(str(self.under_test.socket))
        measure_latency(self.channel, 200, 0)  # the worker starts on the first call

    def run(self, calls: int) -> list[int]:
        """Sequential round trips, in nanoseconds."""
        return [int(s * 1e9) for s in measure_latency(self.channel, calls, 0).samples]

    def throughput(self, seconds: float, window: int = 64) -> float:
        """Calls per second with ``window`` calls in flight on one connection (all CPU, no idle)."""
        return measure_throughput(str(self.under_test.socket), 1, seconds, depth=window)

    def stop(self) -> None:
        self.channel.close()
        self.under_test.stop()


def percentile(values: list[int], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))] / 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, help="a source tree without the event log, to compare against")
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cpu", type=int, default=0, help="the core to pin client, daemon and worker to")
    args = parser.parse_args()

    os.sched_setaffinity(0, {args.cpu})
    report: dict[str, object] = {"in_process": in_process(200_000)}
    for key, value in report["in_process"].items():  # type: ignore[union-attr]
        print(f"{key:45} {value:8.1f}")

    variants = [("this tree, log_level=warning (tool events off)", ROOT, "warning"),
                ("this tree, log_level=info (every call logged)", ROOT, "info")]
    if args.base is not None:
        variants.insert(0, ("base (no event log)", args.base.resolve(), "info"))
    daemons = [Daemon(label, source, level) for label, source, level in variants]
    samples: dict[str, list[list[int]]] = {d.label: [] for d in daemons}
    rates: dict[str, list[float]] = {d.label: [] for d in daemons}
    try:
        for _ in range(args.rounds):  # interleaved, so drift on the machine hits every variant alike
            for daemon in daemons:
                samples[daemon.label].append(daemon.run(args.calls))
                rates[daemon.label].append(daemon.throughput(2.0))
    finally:
        for daemon in daemons:
            daemon.stop()
    rows = {}
    for label, rounds in samples.items():
        p50s = [percentile(r, 0.5) for r in rounds]
        p99s = [percentile(r, 0.99) for r in rounds]
        rows[label] = {"p50_us_median": statistics.median(p50s), "p99_us_median": statistics.median(p99s),
                       "p50_us_rounds": p50s, "calls_per_s_median": statistics.median(rates[label]),
                       "calls_per_s_rounds": rates[label]}
    report["round_trip"] = rows
    report["calls_per_round"] = args.calls
    report["rounds"] = args.rounds
    print(f"\n{'tools/call, one core, median of ' + str(args.rounds) + ' rounds':50} {'p50 µs':>8} {'p99 µs':>8} "
          f"{'calls/s (64 in flight)':>24}")
    for label, row in rows.items():
        print(f"{label:50} {row['p50_us_median']:8.1f} {row['p99_us_median']:8.1f} {row['calls_per_s_median']:24,.0f}")
    out = HERE / "results" / "eventlog.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(f"\nwritten to {out}")


if __name__ == "__main__":
    main()
