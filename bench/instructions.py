"""Instructions and L1 data-cache misses a tools/call costs the daemon and its worker, and the floor's.

    python bench/instructions.py [--calls 2000]

Runs atomictoolsd (the one-line echo tool) and the floor relay (``peers/floor_relay.py``) under
``valgrind --tool=callgrind --cache-sim=yes``; their workers are forks, so they run under it too.
Every process counts from its start to its exit; a figure is the difference between a tree that
ran ``--calls`` sequential calls from the raw client after its warm-up and one that ran none,
divided by the calls. Each system is measured so twice:

- **the call path**: counted only inside uvloop's read callback, where the daemon (and the relay)
  handles a request line and the worker's answer. Periodic work, which valgrind's slowness makes
  run many times more often per call than it does at full speed, is left out.
- **all of it**: everything the server did meanwhile, its periodic work (the sweep of deadlines,
  the event log's batched writes) included, and everything the worker did.

Instruction counts do not move with the machine's load, so one run of each is enough. The cache
figures simulate each process alone, with this CPU's L1 sizes: they show how much memory a call
touches, not what taking turns on one core with the other processes adds.

valgrind is a bench tool, not a dependency (``apt install valgrind``). Saves
``bench/results/instructions-*.json``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

from clients import measure_latency, socket_channel  # noqa: E402
from common import ECHO_TOOLS, DaemonUnderTest, FloorRelay, Report, Table, run_alone  # noqa: E402

READ_CALLBACK = "__pyx_f_6uvloop_4loop___uv_stream_on_read"  # uvloop's: a stream's bytes arrived
WARMUP = 1000
SYSTEMS = ("atomictoolsd", "floor")


def callgrind(out: Path, call_path_only: bool) -> list[str]:
    """The wrapper: every process of the tree counted from its start, into a file of its own."""
    return [
        "valgrind", "--tool=callgrind", "--cache-sim=yes", f"--callgrind-out-file={out}/cg.%p",
        *([f"--toggle-collect={READ_CALLBACK}"] if call_path_only else []),
    ]


def counts(out: Path, pid: int) -> dict[str, int]:
    """The events ``pid`` counted over its life, as it wrote them at its exit."""
    names: list[str] = []
    totals: dict[str, int] = {}
    for line in (out / f"cg.{pid}").read_text(errors="replace").splitlines():
        if line.startswith("events:"):
            names = line.split()[1:]
        elif line.startswith("totals:"):
            totals = {name: int(value) for name, value in zip(names, line.split()[1:], strict=False)}
    return totals


@contextmanager
def server(system: str, wrapper: list[str]) -> Iterator[tuple[str, int, int]]:
    """``system`` started under ``wrapper``, warmed up: its socket, its pid and its worker's pid."""
    if system == "floor":
        with FloorRelay(wrapper) as floor:
            assert floor.proc is not None
            channel = socket_channel(str(floor.socket))
            channel.handshake()
            measure_latency(channel, 1, WARMUP)
            channel.close()
            yield str(floor.socket), floor.proc.pid, psutil.Process(floor.proc.pid).children()[0].pid
        return
    with DaemonUnderTest(tools={"echo": ECHO_TOOLS["echo"]}, wrapper=wrapper) as daemon:
        channel = socket_channel(str(daemon.socket))
        channel.handshake()
        measure_latency(channel, 1, WARMUP)
        channel.close()
        worker = next(m["worker"] for m in daemon.request("atomic/status")["modules"] if m["path"].endswith("/echo.py"))
        yield str(daemon.socket), daemon.pid, worker


def lifetime(system: str, call_path_only: bool, calls: int) -> dict[str, dict[str, int]]:
    """The events of ``system``'s server and worker over their lives, ``calls`` calls after the
    warm-up: ``{"server": {...}, "worker": {...}}``."""
    out = Path(tempfile.mkdtemp(prefix="atb-cg-", dir="/tmp"))
    try:
        with server(system, callgrind(out, call_path_only)) as (socket, pid, worker):
            channel = socket_channel(socket)
            channel.handshake()
            measure_latency(channel, calls, 0)
            channel.close()
        return {"server": counts(out, pid), "worker": counts(out, worker)}  # written as they exited
    finally:
        shutil.rmtree(out, ignore_errors=True)


def measure(system: str, call_path_only: bool, calls: int) -> dict[str, dict[str, float]]:
    """Events a call: the difference between a tree that ran ``calls`` more calls and one that ran
    none (start, load, warm-up and stop are the same in both)."""
    without, with_calls = lifetime(system, call_path_only, 0), lifetime(system, call_path_only, calls)
    return {
        role: {event: (value - without[role].get(event, 0)) / calls for event, value in with_calls[role].items()}
        for role in with_calls
    }


def instructions(calls: int) -> Report:
    assert shutil.which("valgrind"), "valgrind is not installed (apt install valgrind)"
    report = Report("instructions", data={"calls": calls})
    rows: list[list[Any]] = []
    for system in SYSTEMS:
        path, whole = measure(system, True, calls), measure(system, False, calls)
        report.data[system] = {"call_path": path, "all": whole}
        names = ("daemon", "worker") if system == "atomictoolsd" else ("floor relay", "floor worker")
        for role, name in zip(("server", "worker"), names, strict=True):
            on_path = path[role] if role == "server" else None
            rows.append([
                name,
                None if on_path is None else round(on_path.get("Ir", 0)),
                round(whole[role].get("Ir", 0)),
                None if on_path is None else round(on_path.get("D1mr", 0) + on_path.get("D1mw", 0)),
                round(whole[role].get("D1mr", 0) + whole[role].get("D1mw", 0)),
            ])
    report.tables.append(Table(
        "instructions", "instructions and L1 data-cache misses per tools/call (callgrind)",
        ["process", "instructions, call path", "instructions, all", "L1d misses, call path", "L1d misses, all"], rows,
        [f"{calls} sequential echo calls over the socket; \"call path\": inside uvloop's read callback only (the "
         "worker has no such part); \"all\": everything the process did meanwhile. The misses are a simulation "
         "of each process alone."],
    ))
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    run_alone(instructions(parser.parse_args().calls))


if __name__ == "__main__":
    main()
