"""Shim start-up: spawn → first ``initialize`` answer, against the peers' start → initialized.

    python bench/shim.py            # pinned to one core, then unpinned
    python bench/shim.py --quick

An agent spawns an MCP server for every session and waits for its answer to ``initialize`` before
its first turn. Against a running daemon (temporary home and runtime dir), each launcher is spawned
many times: ``initialize`` is written to its stdin at once (as agents do), the clock stops when the
answer's line arrives on stdout, then stdin closes and the process is waited for. Launchers: a
bridge script (``atomictoolsd bridge create``), the console script ``atomictoolsd mcp``, and
``python -m atomictoolsd mcp``. Floors: the interpreter starting and exiting (``python -I -S -c
pass``, ``python -c pass``). Peers: FastMCP and MCPServer, each from its own venv, the same way
(fewer spawns: ~0.5 s each). All of them take turns, so drift in the machine's load hits them alike.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import CONSOLE, MODES, DaemonUnderTest, Report, Stats, Table, affinity, peer_commands, quick_main, ratio  # noqa: E402

INITIALIZE = (
    b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25",'
    b'"capabilities":{},"clientInfo":{"name":"bench","version":"0"}}}\n'
)
BRIDGE, CONSOLE_SCRIPT = "bridge script", "atomictoolsd mcp (console script)"


def spawn_to_answer(command: list[str], env: dict[str, str] | None, cwd: str, answer: bool = True) -> float:
    """Seconds from spawn to the first stdout line (to the exit when ``answer`` is False)."""
    start = time.perf_counter()
    proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, cwd=cwd)
    assert proc.stdin is not None and proc.stdout is not None
    if not answer:
        proc.stdin.close()
        proc.wait(10)
        return time.perf_counter() - start
    proc.stdin.write(INITIALIZE)
    proc.stdin.flush()
    line = proc.stdout.readline()
    elapsed = time.perf_counter() - start
    if b'"protocolVersion"' not in line:
        raise RuntimeError(f"{command[0]}: unexpected answer {line[:200]!r}")
    proc.stdin.close()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    return elapsed


def run_mode(runs: int, peer_runs: int) -> dict[str, Stats]:
    python = sys.executable
    with DaemonUnderTest() as daemon:
        cwd = str(daemon.project)
        launchers = {
            BRIDGE: [daemon.bridge()],
            CONSOLE_SCRIPT: [CONSOLE, "mcp"],
            "python -m atomictoolsd mcp": [python, "-m", "atomictoolsd", "mcp"],
        }
        floors = {
            "floor: python -I -S -c pass (to exit)": [python, "-IS", "-c", "pass"],
            "floor: python -c pass (to exit)": [python, "-c", "pass"],
        }
        peers = peer_commands()
        results = {name: Stats() for name in [*launchers, *floors, *peers]}
        for command in launchers.values():  # warm the page cache and the daemon
            for _ in range(3):
                spawn_to_answer(command, daemon.env, cwd)
        for command in peers.values():
            spawn_to_answer(command, None, cwd)
        for i in range(runs):  # in turns, so drift in machine load hits every row alike
            for name, command in launchers.items():
                results[name].samples.append(spawn_to_answer(command, daemon.env, cwd))
            for name, command in floors.items():
                results[name].samples.append(spawn_to_answer(command, daemon.env, cwd, answer=False))
            if i % max(1, runs // peer_runs) == 0 and len(results[next(iter(peers))].samples) < peer_runs:
                for name, command in peers.items():
                    results[name].samples.append(spawn_to_answer(command, None, cwd))
    return results


def measure(quick: bool = False) -> Report:
    runs, peer_runs = (30, 5) if quick else (200, 20)
    report = Report("shim", data={"runs": runs, "peer_runs": peer_runs})
    rows: list[list[Any]] = []
    for mode, pinned in MODES:
        with affinity(pinned):
            stats = {name: s.ms() for name, s in run_mode(runs, peer_runs).items()}
        report.data[mode] = stats
        fast, sdk = (stats[name]["p50_ms"] for name in ("fastmcp (mcp 1.30.0)", "mcpserver (mcp 2.3.0)"))
        for name, s in stats.items():
            ours = "atomictoolsd" in name or name == BRIDGE
            rows.append([
                name, mode, s["n"], s["p50_ms"], s["p99_ms"],
                ratio(fast, s["p50_ms"]) if ours else None, ratio(sdk, s["p50_ms"]) if ours else None,
            ])
    report.tables.append(Table(
        "shim", "spawn → first initialize answer (ms), a daemon already running",
        ["launcher", "mode", "n", "p50 ms", "p99 ms", "p50 × vs fastmcp", "p50 × vs mcpserver"],
        rows,
        ["The peers (FastMCP, MCPServer) are their start → answer to initialize; the floors are a bare "
         "interpreter starting and exiting."],
    ))
    return report


def main() -> None:
    quick_main(measure, __doc__)


if __name__ == "__main__":
    main()
