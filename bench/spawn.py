"""Worker (re)spawn time, through the fork server and without it.

    python bench/spawn.py [--forks 200] [--cold 30]

A worker serves one tool module. It is started when a module loads or reloads, after a crash, and
on the first call after its idle worker was reaped, so its start-up is on the path of every reload.
Measured here, with a one-line tool module (its import is a fraction of a millisecond):

- **fork server**: the daemon's ``Spawner`` asks the warm fork server for a worker; the times are
  request → pid (the fork), and request → the worker's ``loaded`` message (fork, runtime set-up, the
  module's import, its schemas), sequentially, each worker closed before the next;
- **cold**: ``python -m atomictoolsd.workers.runtime`` started with ``subprocess`` (``sys.executable``,
  never a pyenv shim), request → ``loaded``: what every spawn would cost without the fork server.

Prints a table and writes ``bench/results/spawn-*.json``. No assertion: the figures go into
docs/performance.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent))

from atomictoolsd.workers.channel import FrameReader  # noqa: E402
from atomictoolsd.workers.runtime import WorkerSpec  # noqa: E402
from atomictoolsd.workers.spawner import Spawner  # noqa: E402
from common import print_table, save  # noqa: E402

MODULE = "def tiny() -> str:\n    return 'tiny'\n"


def summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "n": len(ordered),
        "p50_ms": round(statistics.median(ordered) * 1000, 3),
        "p99_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000, 3),
        "min_ms": round(ordered[0] * 1000, 3),
    }


def read_loaded(sock: socket.socket) -> None:
    reader = FrameReader()
    while True:
        data = sock.recv(65536)
        if not data:
            raise RuntimeError("the worker closed its channel before loading")
        for message in reader.feed(data):
            if message[0] == "loaded":
                return
            if message[0] == "failed":
                raise RuntimeError(f"the module failed to load: {message[1]}")


async def fork_server(spec: WorkerSpec, count: int) -> tuple[list[float], list[float], float]:
    spawner = Spawner()
    started = time.perf_counter()
    pid, sock = await spawner.spawn(spec)  # starts the fork server: paid once per daemon
    first = time.perf_counter() - started
    sock.setblocking(True)
    read_loaded(sock)
    sock.close()
    to_pid, to_loaded = [], []
    loop = asyncio.get_running_loop()
    for _ in range(count):
        started = time.perf_counter()
        pid, sock = await spawner.spawn(spec)
        forked = time.perf_counter()
        await loop.run_in_executor(None, _blocking_loaded, sock)
        loaded = time.perf_counter()
        to_pid.append(forked - started)
        to_loaded.append(loaded - started)
        sock.close()  # the worker exits on end-of-file
        await spawner.exit_status(pid)
        spawner.forget(pid)
    await spawner.close()
    return to_pid, to_loaded, first


def _blocking_loaded(sock: socket.socket) -> None:
    sock.setblocking(True)
    read_loaded(sock)


def cold(spec: WorkerSpec, count: int) -> list[float]:
    samples = []
    spec_json = msgspec.json.encode(spec).decode()
    for _ in range(count):
        ours, theirs = socket.socketpair()
        started = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "atomictoolsd.workers.runtime", str(theirs.fileno()), spec_json],
            pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
        )
        theirs.close()
        read_loaded(ours)
        samples.append(time.perf_counter() - started)
        ours.close()
        proc.wait(10)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--forks", type=int, default=200)
    parser.add_argument("--cold", type=int, default=30)
    args = parser.parse_args()

    import uvloop

    with tempfile.TemporaryDirectory(prefix="atb-spawn-") as tmp:
        module = Path(tmp) / "tiny.py"
        module.write_text(MODULE)
        spec = WorkerSpec(path=str(module), cwd=tmp, spill_dir=os.path.join(tmp, "spill"))
        to_pid, to_loaded, first = uvloop.run(fork_server(spec, args.forks))
        cold_samples = cold(spec, args.cold)

    rows = {
        "fork server: request → pid": summary(to_pid),
        "fork server: request → module loaded": summary(to_loaded),
        "cold python: start → module loaded": summary(cold_samples),
    }
    print_table(
        ["worker spawn", "n", "p50 ms", "p99 ms", "min ms"],
        [[name, r["n"], r["p50_ms"], r["p99_ms"], r["min_ms"]] for name, r in rows.items()],
    )
    print(f"\nfirst spawn of the daemon's life (starts the fork server): {first * 1000:.1f} ms")
    ratio = rows["cold python: start → module loaded"]["p50_ms"] / rows["fork server: request → module loaded"]["p50_ms"]
    print(f"fork server vs cold start (p50, to loaded): {ratio:.0f}x faster")
    path = save("spawn", {"rows": rows, "first_spawn_ms": round(first * 1000, 2), "python": sys.executable})
    print(f"saved {path}")


if __name__ == "__main__":
    main()
