"""Before and after: the call path of this tree against another revision, in one run.

    python bench/compare.py --base HEAD~1 [--rounds 3] [--log-level warning]

Extracts ``client/`` and ``daemon/`` of ``--base`` (any git revision) into a temporary dir, starts a
daemon from it and one from this tree (same tools, same settings), and measures them in turns:
sequential ``tools/call`` latency, calls/s with 16 connections to one module and 64 connections over
eight, and the CPU each process spends per call at 16 connections (from its user + system time).
Pinned to one core, then unpinned. CPU per call is the steadiest figure on a busy machine: it counts
what a call costs, not how long the scheduler made it wait.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

from clients import measure_latency, measure_throughput, socket_channel  # noqa: E402
from common import ECHO_TOOLS, EIGHT, MODES, ROOT, DaemonUnderTest, Report, Table, affinity, run_alone  # noqa: E402


def extract(revision: str, into: Path) -> Path:
    """``client/`` and ``daemon/`` of ``revision``, written under ``into``."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", revision, "client", "daemon"], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def worker_pid(daemon: DaemonUnderTest, module: str = "echo.py") -> int:
    return next(m["worker"] for m in daemon.request("atomic/status")["modules"] if m["path"].endswith(module))


def cpu_per_call(daemon: DaemonUnderTest, seconds: float) -> dict[str, float]:
    """µs of CPU per call for the daemon, the worker and this client, 16 connections to one module."""
    processes = {"daemon": psutil.Process(daemon.pid), "worker": psutil.Process(worker_pid(daemon)), "client": psutil.Process()}
    before = {name: p.cpu_times() for name, p in processes.items()}
    started = time.perf_counter()
    rate = measure_throughput(str(daemon.socket), 16, seconds)
    calls = rate * (time.perf_counter() - started)
    after = {name: p.cpu_times() for name, p in processes.items()}
    return {
        name: round((after[name].user + after[name].system - before[name].user - before[name].system) / calls * 1e6, 1)
        for name in processes
    }


def measure_pair(base: Path, rounds: int, extra: dict[str, str], seconds: float) -> dict[str, dict[str, Any]]:
    daemons = {"base": DaemonUnderTest(tools=ECHO_TOOLS, extra_env=extra, source=base).start(), "this tree": DaemonUnderTest(tools=ECHO_TOOLS, extra_env=extra).start()}
    figures: dict[str, dict[str, list[Any]]] = {name: {"p50": [], "16x1": [], "64x8": [], "cpu": []} for name in daemons}
    channels = {}
    try:
        for name, daemon in daemons.items():
            channels[name] = socket_channel(str(daemon.socket))
            channels[name].handshake()
            measure_latency(channels[name], 300, 0)  # the worker starts
        for _ in range(rounds):
            for name, daemon in daemons.items():
                figures[name]["p50"].append(measure_latency(channels[name], 2000, 100).summary()["p50_us"])
                figures[name]["16x1"].append(measure_throughput(str(daemon.socket), 16, seconds))
                figures[name]["64x8"].append(measure_throughput(str(daemon.socket), 64, seconds, EIGHT))
                figures[name]["cpu"].append(cpu_per_call(daemon, seconds))
    finally:
        for name, daemon in daemons.items():
            if name in channels:
                channels[name].close()
            daemon.stop()
    out: dict[str, dict[str, Any]] = {}
    for name, f in figures.items():
        out[name] = {
            "p50_us": round(statistics.median(f["p50"]), 1),
            "calls_per_s_16x1": round(statistics.median(f["16x1"])),
            "calls_per_s_64x8": round(statistics.median(f["64x8"])),
            **{f"cpu_us_per_call_{k}": statistics.median(c[k] for c in f["cpu"]) for k in ("daemon", "worker", "client")},
        }
    return out


def measure(base_revision: str, rounds: int = 3, log_level: str | None = None, seconds: float = 2.0) -> Report:
    extra = {"ATOMICTOOLS_LOG_LEVEL": log_level} if log_level else {}
    report = Report("compare", data={"base": base_revision, "rounds": rounds, "log_level": log_level or "info"})
    rows: list[list[Any]] = []
    with tempfile.TemporaryDirectory(prefix="atb-base-") as tmp:
        base = extract(base_revision, Path(tmp))
        for mode, pinned in MODES:
            with affinity(pinned):
                pair = measure_pair(base, rounds, extra, seconds)
            report.data[mode] = pair
            for name, r in pair.items():
                rows.append([f"{base_revision}" if name == "base" else name, mode, r["p50_us"], r["calls_per_s_16x1"],
                             r["calls_per_s_64x8"], r["cpu_us_per_call_daemon"], r["cpu_us_per_call_worker"]])
    report.tables.append(Table(
        "compare", f"before ({base_revision}) and after (this tree), log_level={log_level or 'info'}",
        ["tree", "mode", "p50 µs", "calls/s 16 × 1", "calls/s 64 × 8", "daemon CPU µs/call", "worker CPU µs/call"],
        rows, [f"Median of {rounds} rounds taken in turns; CPU per call at 16 connections to one module."],
    ))
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", required=True, help="the git revision to compare against, e.g. HEAD~1")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=2.0, help="length of each calls/s run")
    parser.add_argument("--log-level", help="ATOMICTOOLS_LOG_LEVEL for both daemons (default: the default, info)")
    args = parser.parse_args()
    run_alone(measure(args.base, args.rounds, args.log_level, args.seconds))


if __name__ == "__main__":
    main()
