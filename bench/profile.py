"""Where a tools/call's time goes: py-spy samples of the daemon, its worker and the shim under load.

    python bench/profile.py [--seconds 10] [--load latency|throughput] [--shim] [--top 25]

Starts a daemon under test pinned to CPU 0 with the one-line echo tool, drives it from CPU 0 (one
sequential raw client, or 16 connections with one call in flight each), and samples each process
with ``py-spy record --nonblocking`` running on the other CPU, so the sampler does not compete with
what it samples. ``--shim`` sends the sequential calls through ``atomictoolsd mcp``.

Prints, per process, the functions with the most samples on top of the stack (self) and anywhere in
it (inclusive), and keeps the collapsed stacks under ``bench/results/profile-*`` for a flame graph.
py-spy is a bench tool, not a dependency: ``pip install py-spy`` into the venv that runs this.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from clients import measure_latency, measure_throughput, socket_channel, stdio_channel  # noqa: E402
from common import CONSOLE, RESULTS, DaemonUnderTest  # noqa: E402

NATIVE: list[str] = []
PY_SPY = shutil.which("py-spy", path=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")


def record(pid: int, seconds: float, out: Path, cpu: int) -> subprocess.Popen[bytes]:
    assert PY_SPY, "py-spy is not installed: pip install py-spy"
    return subprocess.Popen(
        ["taskset", "-c", str(cpu), PY_SPY, "record", "--pid", str(pid), "--duration", str(int(seconds)),
         "--threads", *(NATIVE or ["--rate", "500", "--nonblocking"]), "--format", "raw", "--output", str(out)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )


def summarize(path: Path, top: int) -> str:
    """The functions with the most samples: on top of the stack, and anywhere in it."""
    own: collections.Counter[str] = collections.Counter()
    anywhere: collections.Counter[str] = collections.Counter()
    total = torn = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not count_text.isdigit():
            # --nonblocking reads the target's memory while it runs: now and then a frame's name is
            # read half-written, garbage with a newline in it. Skip those samples; say how many.
            torn += 1
            continue
        count = int(count_text)
        frames = [f for f in stack.split(";") if not f.startswith(("thread (", "process "))]
        if not frames:
            continue
        total += count
        own[_short(frames[-1])] += count
        for frame in {_short(f) for f in frames}:
            anywhere[frame] += count
    lines = [f"{total} samples" + (f" ({torn} torn lines skipped)" if torn else "")]
    lines.append(f"  {'self %':>7}  function")
    lines += [f"  {100 * n / total:7.1f}  {name}" for name, n in own.most_common(top)]
    lines.append(f"  {'incl %':>7}  function")
    lines += [f"  {100 * n / total:7.1f}  {name}" for name, n in anywhere.most_common(top)]
    return "\n".join(lines)


def _short(frame: str) -> str:
    # "name (path/to/file.py:123)" → "name (file.py:123)"
    name, _, where = frame.partition(" (")
    return f"{name} ({where.rsplit('/', 1)[-1]}" if where else name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--load", choices=("latency", "throughput"), default="latency")
    parser.add_argument("--shim", action="store_true", help="sequential calls through atomictoolsd mcp")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--log-level", default=None, help="ATOMICTOOLS_LOG_LEVEL for the daemon")
    parser.add_argument("--native", action="store_true", help="sample C frames too (uvloop, msgspec, the kernel calls)")
    args = parser.parse_args()
    if args.native:  # py-spy must stop the process to unwind C frames: fewer samples, and it shows
        NATIVE.extend(["--native", "--rate", "200"])

    cpus = sorted(os.sched_getaffinity(0))
    target, sampler = cpus[0], cpus[-1]
    os.sched_setaffinity(0, {target})
    extra = {"ATOMICTOOLS_LOG_LEVEL": args.log_level} if args.log_level else {}
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out_dir = RESULTS / f"profile-{stamp}"
    out_dir.mkdir(parents=True, exist_ok=True)
    with DaemonUnderTest(extra_env=extra) as daemon:
        shim = None
        if args.shim:
            shim, channel = stdio_channel([CONSOLE, "mcp"], env=daemon.env, cwd=daemon.project)
        else:
            channel = socket_channel(str(daemon.socket))
        channel.handshake()
        measure_latency(channel, 2000, 0)  # the worker starts, everything warms
        worker = daemon.request("atomic/status")["modules"]
        worker_pid = next(m["worker"] for m in worker if m["path"].endswith("echo.py"))
        targets = {"daemon": daemon.pid, "worker": worker_pid}
        if shim is not None:
            targets["shim"] = shim.pid
        samplers = {name: record(pid, args.seconds, out_dir / f"{name}.txt", sampler) for name, pid in targets.items()}
        time.sleep(0.5)  # py-spy attaches
        done = threading.Event()
        calls = 0
        started = time.perf_counter()
        if args.load == "latency":
            while time.perf_counter() - started < args.seconds:
                calls += len(measure_latency(channel, 1000, 0).samples)
        else:
            rate = measure_throughput(str(daemon.socket), 16, args.seconds)
            calls = int(rate * args.seconds)
        elapsed = time.perf_counter() - started
        done.set()
        for proc in samplers.values():
            proc.wait(60)
        channel.close()
    print(f"{args.load}{' through the shim' if args.shim else ''}: {calls} calls in {elapsed:.1f} s "
          f"({calls / elapsed:,.0f} calls/s, {elapsed / calls * 1e6:.1f} µs each)")
    for name in targets:
        path = out_dir / f"{name}.txt"
        print(f"\n== {name} ({path.relative_to(RESULTS.parent.parent)})")
        print(summarize(path, args.top) if path.exists() and path.stat().st_size else "no samples")


if __name__ == "__main__":
    main()
