"""tools/call latency and calls/s: atomictoolsd against FastMCP and MCPServer, in one run.

    python bench/calls.py            # pinned to one core, then unpinned
    python bench/calls.py --quick    # fewer calls, for a smoke run
    python bench/calls.py --floors [--before SRC]   # only the call path against its floors

``--floors`` is the narrow run for work on the call path: atomictoolsd's latency over the socket and
through the shim next to the two floors, and the CPU each process spends per call, pinned then
unpinned; no peers, no calls/s. ``--before SRC`` adds a daemon (and shim) run from another source
tree (its ``client/`` and ``daemon/``, e.g. ``git archive main client daemon`` unpacked), measured in
turns with this one, so a change is judged against what it changed within the same minute.

Latency: sequential calls of the same one-line echo tool, after a warm-up, with the same raw NDJSON
client for every system — over the socket and through the stdio shim (``atomictoolsd mcp``, which
hands its stdin and stdout to the daemon, and ``atomictoolsd mcp --relay``, which copies every line
as it does where it cannot) for atomictoolsd, over stdio for the peers — plus atomictoolsd's own
tiny Python client. The systems
take turns in rounds, so drift in the machine's load hits them alike. atomictoolsd and the floors
run as ``INSTANCES`` separate process trees each, their samples pooled: where ASLR happens to place
each process's code moves one tree's p50 by up to ~3 µs against an identical other (the processes
share one core's branch predictor), so one tree alone measures its luck as much as its code. atomictoolsd runs with its
default configuration (the event log records every call at ``log_level = "info"``) and again with
``log_level = "warning"``.

Two floors run alongside, measured with the same client, so what the machine allows at the moment of
the run stands next to each figure: three processes (client → a minimal uvloop relay → one worker,
``peers/floor_relay.py``), the floor of the socket path; and four, with a standard-library stdio relay
in front of it (``peers/floor_stdio_relay.py``), the floor of the shim path.

Calls/s: 16 and 64 connections, each keeping one call in flight, to one tool module or spread over
eight (connection ``i`` calls module ``i % 8``; each module has its own worker). A peer has one stdio
connection by nature: one process gets the same 16 or 64 requests in flight, pipelined, and for
"eight modules" serves eight tools (one process: it has no modules). Median of the rounds.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

from atomictools import Client  # noqa: E402
from clients import Channel, measure_latency, measure_throughput, socket_channel, stdio_channel  # noqa: E402
from common import (  # noqa: E402
    CONSOLE,
    ECHO_TOOLS,
    EIGHT,
    MODES,
    DaemonUnderTest,
    FloorRelay,
    Report,
    Stats,
    Table,
    affinity,
    peer_commands,
    quick_main,
    ratio,
    run_alone,
)

LOADS = [(16, 1), (64, 1), (16, 8), (64, 8)]  # (connections, modules)
FASTMCP, MCPSERVER, FASTMCP4 = "fastmcp (mcp 1.30.0)", "mcpserver (mcp 2.3.0)", "fastmcp 4.1.0"
PEER_NAMES = (FASTMCP, MCPSERVER, FASTMCP4)
INSTANCES = 3  # process trees of atomictoolsd and of each floor, measured in turns (--quick: 1)
FLOOR_STDIO_RELAY = Path(__file__).resolve().parent / "peers" / "floor_stdio_relay.py"


class Settings:
    def __init__(self, quick: bool) -> None:
        self.rounds = 2 if quick else 5
        self.calls = 300 if quick else 2000  # atomictoolsd's timed calls per round
        self.peer_calls = 60 if quick else 400
        self.warmup = 100 if quick else 200
        self.seconds = 1.0 if quick else 3.0  # per throughput run
        self.load_rounds = 1 if quick else 3
        self.split_calls = 3000 if quick else 20000  # sequential calls timed for the CPU split
        self.instances = 1 if quick else INSTANCES


def tiny_client_latency(client: Client, calls: int, warmup: int) -> Stats:
    stats = Stats()
    perf = time.perf_counter
    for i in range(warmup + calls):
        started = perf()
        result = client.call("echo", text="hi")
        elapsed = perf() - started
        if result.is_error:
            raise RuntimeError(result.text)
        if i >= warmup:
            stats.samples.append(elapsed)
    return stats


FLOOR = "floor: minimal relay + worker (peers/floor_relay.py)"
FLOOR_STDIO = "floor: stdio relay + minimal relay + worker (peers/floor_stdio_relay.py)"


def latency(
    settings: Settings, daemons: dict[str, list[DaemonUnderTest]], peers: dict[str, list[str]], floors: list[FloorRelay],
    tiny_client: bool = True,
) -> tuple[dict[str, Stats], dict[str, dict[str, float]]]:
    """Every system measured in turns, ``settings.rounds`` times; samples pooled per system (over
    its instances: each of ``daemons`` and of ``floors`` is a process tree of its own). Then, for
    atomictoolsd and the floor, the CPU each process spends per sequential call (first instance)."""
    runs: dict[str, list[Callable[[int, int], Stats]]] = {}
    processes: dict[str, dict[str, int]] = {}  # system → role → pid, for the CPU split
    closers: list[Callable[[], None]] = []

    def over(name: str, channel: Channel) -> None:
        closers.append(channel.close)
        runs.setdefault(name, []).append(lambda calls, warmup: measure_latency(channel, calls, warmup))

    try:
        for label, instances in daemons.items():
            for daemon in instances:
                if tiny_client:
                    client = Client(str(daemon.socket), directory=str(daemon.project), autostart=False)
                    closers.append(client.close)
                    runs.setdefault(f"atomictoolsd{label}, tiny client, socket", []).append(
                        lambda c, w, client=client: tiny_client_latency(client, c, w)
                    )
                channel = socket_channel(str(daemon.socket))
                channel.handshake()
                over(f"atomictoolsd{label}, raw client, socket", channel)
                shim, channel = stdio_channel([CONSOLE, "mcp"], env=daemon.env, cwd=daemon.project)
                channel.handshake()
                over(f"atomictoolsd{label}, raw client, stdio shim", channel)
                relay, channel = stdio_channel([CONSOLE, "mcp", "--relay"], env=daemon.env, cwd=daemon.project)
                channel.handshake()
                over(f"atomictoolsd{label}, raw client, stdio shim --relay", channel)
                runs[f"atomictoolsd{label}, raw client, socket"][-1](1, 0)  # the worker starts
                if f"atomictoolsd{label}, raw client, socket" not in processes:
                    worker = next(m["worker"] for m in daemon.request("atomic/status")["modules"] if m["path"].endswith("/echo.py"))
                    processes[f"atomictoolsd{label}, raw client, socket"] = {"daemon": daemon.pid, "worker": worker}
                    processes[f"atomictoolsd{label}, raw client, stdio shim"] = {"shim": shim.pid, "daemon": daemon.pid, "worker": worker}
                    processes[f"atomictoolsd{label}, raw client, stdio shim --relay"] = {
                        "shim": relay.pid, "daemon": daemon.pid, "worker": worker,
                    }
        for name, command in peers.items():
            _, channel = stdio_channel(command)
            channel.handshake()
            over(f"{name}, raw client, stdio", channel)
        for floor in floors:
            channel = socket_channel(str(floor.socket))
            channel.handshake()
            over(f"{FLOOR}, raw client, socket", channel)
            assert floor.proc is not None
            relay = psutil.Process(floor.proc.pid)
            stdio_relay, channel = stdio_channel([sys.executable, "-I", "-S", str(FLOOR_STDIO_RELAY), str(floor.socket)])
            channel.handshake()
            over(f"{FLOOR_STDIO}, raw client, stdio", channel)
            if f"{FLOOR}, raw client, socket" not in processes:
                worker = relay.children()[0].pid
                processes[f"{FLOOR}, raw client, socket"] = {"daemon": relay.pid, "worker": worker}
                processes[f"{FLOOR_STDIO}, raw client, stdio"] = {"shim": stdio_relay.pid, "daemon": relay.pid, "worker": worker}
        pooled = {name: Stats() for name in runs}
        for _ in range(settings.rounds):
            for name, instances in runs.items():
                peer = name.startswith(tuple(PEER_NAMES))
                calls = settings.peer_calls if peer else settings.calls
                warmup = settings.warmup // 5 if peer else settings.warmup
                for run in instances:
                    pooled[name].samples += run(calls, warmup).samples
        split = {name: cpu_split(runs[name][0], pids, settings.split_calls) for name, pids in processes.items()}
        return pooled, split
    finally:
        for close in closers:
            close()


def cpu_split(run: Callable[[int, int], Stats], pids: dict[str, int], calls: int) -> dict[str, float]:
    """µs of CPU (user + system) each process spends per sequential call; "client" is this process."""
    roles = {**{role: psutil.Process(pid) for role, pid in pids.items()}, "client": psutil.Process()}
    before = {role: p.cpu_times() for role, p in roles.items()}
    started = time.perf_counter()
    run(calls, 0)
    wall = time.perf_counter() - started
    after = {role: p.cpu_times() for role, p in roles.items()}
    split = {
        role: round((after[role].user + after[role].system - before[role].user - before[role].system) / calls * 1e6, 1)
        for role in roles
    }
    return {**split, "wall": round(wall / calls * 1e6, 1)}


def throughput(settings: Settings, daemons: dict[str, DaemonUnderTest], floor: FloorRelay) -> dict[str, dict[str, float]]:
    """Calls/s for each system and load, median of ``settings.load_rounds`` runs taken in turns."""
    peers = {1: peer_commands(), 8: peer_commands(extra_tools=8)}
    runs: dict[tuple[str, str], Callable[[], float]] = {}
    for label, daemon in daemons.items():
        for streams, modules in LOADS:
            if label and (streams, modules) not in ((16, 1), (64, 8)):
                continue  # the other log level: the two ends of the range are enough
            tools = ["echo"] if modules == 1 else EIGHT
            runs[(f"atomictoolsd{label}, socket", f"{streams}x{modules}")] = (
                lambda s=streams, t=tools, d=daemon: measure_throughput(str(d.socket), s, settings.seconds, t)
            )
    for streams in (16, 64):
        runs[(f"{FLOOR}, socket", f"{streams}x1")] = lambda s=streams: measure_throughput(str(floor.socket), s, settings.seconds)
    for name in PEER_NAMES:
        for streams, modules in LOADS:
            tools = ["echo"] if modules == 1 else EIGHT
            runs[(f"{name}, stdio", f"{streams}x{modules}")] = (
                lambda s=streams, t=tools, c=peers[modules][name]: measure_throughput(c, s, settings.seconds, t)
            )
    rates: dict[tuple[str, str], list[float]] = {key: [] for key in runs}
    for _ in range(settings.load_rounds):
        for key, run in runs.items():
            rates[key].append(run())
    table: dict[str, dict[str, float]] = {}
    for (system, load), values in rates.items():
        table.setdefault(system, {})[load] = round(statistics.median(values))
    return table


def measure(quick: bool = False) -> Report:
    settings = Settings(quick)
    peers = peer_commands()
    report = Report("calls", data={"settings": vars(settings)})
    latency_rows: list[list[Any]] = []
    load_rows: list[list[Any]] = []
    split_rows: list[list[Any]] = []
    for mode, pinned in MODES:
        with affinity(pinned):
            daemons: dict[str, list[DaemonUnderTest]] = {"": [], " (log_level=warning)": []}
            try:
                for _ in range(settings.instances):
                    daemons[""].append(DaemonUnderTest(tools=ECHO_TOOLS).start())
                    daemons[" (log_level=warning)"].append(
                        DaemonUnderTest(tools=ECHO_TOOLS, extra_env={"ATOMICTOOLS_LOG_LEVEL": "warning"}).start()
                    )
                with contextlib.ExitStack() as stack:
                    floors = [stack.enter_context(FloorRelay()) for _ in range(settings.instances)]
                    pooled, split = latency(settings, daemons, peers, floors)
                    stats = {name: s.summary() for name, s in pooled.items()}
                    rates = throughput(settings, {label: ds[0] for label, ds in daemons.items()}, floors[0])
            finally:
                for daemon in [d for ds in daemons.values() for d in ds]:
                    daemon.stop()
        fast = stats[f"{FASTMCP}, raw client, stdio"]["p50_us"]
        sdk = stats[f"{MCPSERVER}, raw client, stdio"]["p50_us"]
        for name, s in stats.items():
            ours = name.startswith("atomictoolsd")
            latency_rows.append([
                name, mode, s["p50_us"], s["p99_us"],
                ratio(fast, s["p50_us"]) if ours else None, ratio(sdk, s["p50_us"]) if ours else None,
            ])
        fast16, sdk16 = rates[f"{FASTMCP}, stdio"]["16x1"], rates[f"{MCPSERVER}, stdio"]["16x1"]
        for system, by_load in rates.items():
            cells = [by_load.get(f"{s}x{m}") for s, m in LOADS]
            ours = system.startswith("atomictoolsd")
            load_rows.append([
                system, mode, *cells,
                ratio(by_load["16x1"], fast16) if ours else None, ratio(by_load["16x1"], sdk16) if ours else None,
            ])
        report.data[mode] = {"latency": stats, "calls_per_s": rates, "cpu_per_call": split}
        for name, cpu in split.items():
            split_rows.append([name, mode, cpu.get("client"), cpu.get("shim"), cpu.get("daemon"), cpu.get("worker"),
                               round(sum(v for k, v in cpu.items() if k != "wall"), 1), cpu["wall"]])
    report.tables.append(Table(
        "calls-latency", "tools/call latency (µs), sequential calls of a one-line echo tool",
        ["system, client, transport", "mode", "p50 µs", "p99 µs", "p50 × vs fastmcp", "p50 × vs mcpserver"],
        latency_rows,
        [f"{settings.rounds} rounds taken in turns; per round {settings.calls} timed calls to each of "
         f"{settings.instances} instances of atomictoolsd and of the floors, and {settings.peer_calls} to each peer, "
         "after a warm-up."],
    ))
    report.tables.append(Table(
        "calls-cpu", "where a sequential tools/call's time goes: CPU µs per call, by process",
        ["system, client, transport", "mode", "client", "shim", "daemon", "worker", "sum", "wall µs/call"],
        split_rows,
        [f"{settings.split_calls} sequential calls; each process's user + system time (psutil) divided by the calls. "
         "Pinned, one core runs everything in turn: the sum is the wall time, less what other work on the machine took."],
    ))
    report.tables.append(Table(
        "calls-throughput", "calls/s, each connection keeping one call in flight (connections × modules)",
        ["system, transport", "mode", "16 × 1", "64 × 1", "16 × 8", "64 × 8", "16 × 1 vs fastmcp", "16 × 1 vs mcpserver"],
        load_rows,
        ["A peer has one stdio connection: one process gets the 16 or 64 requests in flight, pipelined, and "
         "serves eight tools for \"8 modules\".",
         f"Median of {settings.load_rounds} runs of {settings.seconds:g} s each, taken in turns."],
    ))
    return report


def floors(quick: bool = False, before: Path | None = None) -> Report:
    """``--floors``: atomictoolsd (and the tree at ``before``) against the two floors, latency only."""
    settings = Settings(quick)
    report = Report("calls-floors", data={"settings": vars(settings), "before": str(before) if before else None})
    rows: list[list[Any]] = []
    split_rows: list[list[Any]] = []
    for mode, pinned in MODES:
        with affinity(pinned):
            daemons: dict[str, list[DaemonUnderTest]] = {"": []} if before is None else {"": [], " (before)": []}
            try:
                for _ in range(settings.instances):
                    daemons[""].append(DaemonUnderTest(tools=ECHO_TOOLS).start())
                    if before is not None:
                        daemons[" (before)"].append(DaemonUnderTest(tools=ECHO_TOOLS, source=before).start())
                with contextlib.ExitStack() as stack:
                    floors = [stack.enter_context(FloorRelay()) for _ in range(settings.instances)]
                    pooled, split = latency(settings, daemons, {}, floors, tiny_client=False)
            finally:
                for daemon in [d for ds in daemons.values() for d in ds]:
                    daemon.stop()
        stats = {name: s.summary() for name, s in pooled.items()}
        floor3 = stats[f"{FLOOR}, raw client, socket"]["p50_us"]
        floor4 = stats[f"{FLOOR_STDIO}, raw client, stdio"]["p50_us"]
        for name, s in stats.items():
            floor_p50 = floor4 if "stdio" in name else floor3
            rows.append([name, mode, s["p50_us"], s["p99_us"], round(s["p50_us"] / floor_p50, 2)])
        for name, cpu in split.items():
            split_rows.append([name, mode, cpu.get("client"), cpu.get("shim"), cpu.get("daemon"), cpu.get("worker"), cpu["wall"]])
        report.data[mode] = {"latency": stats, "cpu_per_call": split}
    report.tables.append(Table(
        "calls-floors", "tools/call latency (µs) against the floors measured in the same run",
        ["system, client, transport", "mode", "p50 µs", "p99 µs", "p50 × its floor"], rows,
        ["The socket path against the three-process floor, the shim path against the four-process one.",
         f"{settings.instances} instances of each, {settings.rounds} rounds of {settings.calls} calls to each, samples pooled."],
    ))
    report.tables.append(Table(
        "calls-floors-cpu", "CPU µs per sequential call, by process",
        ["system, client, transport", "mode", "client", "shim", "daemon", "worker", "wall µs/call"], split_rows, [],
    ))
    return report


def main() -> None:
    if "--floors" in sys.argv[1:]:
        parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
        parser.add_argument("--floors", action="store_true", help="only the call path against its floors")
        parser.add_argument("--quick", action="store_true", help="fewer calls")
        parser.add_argument("--before", type=Path, help="also a daemon run from this source tree, in turns")
        args = parser.parse_args()
        run_alone(floors(args.quick, args.before))
        return
    quick_main(measure, __doc__)


if __name__ == "__main__":
    main()
