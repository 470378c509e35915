"""Shim start-up: spawn → first ``initialize`` answer, through a bridge script and the console script.

Starts an isolated daemon (temporary home and runtime dir), creates a bridge through the daemon,
then spawns each launcher many times: write ``initialize`` to its stdin at once (as agents do), time
until the answer's line arrives on its stdout, close stdin, wait for the exit. Python's own start-up
(``python -IS -c pass``, ``python -c pass``) is measured the same way as the floor, and the peer, a
one-tool stdio server on the MCP SDK's ``MCPServer``, in the same run (fewer spawns: ~0.5 s each).

    python bench/shim.py [--runs 200] [--peer-runs 20] [--pin CPU]

Prints a table and saves JSON under bench/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PEER = """\
from mcp.server.mcpserver import MCPServer

server = MCPServer("peer")


@server.tool()
def echo(text: str) -> str:
    \"\"\"Echo the text back.\"\"\"
    return text


server.run()
"""
INITIALIZE = (
    b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25",'
    b'"capabilities":{},"clientInfo":{"name":"bench","version":"0"}}}\n'
)


def spawn_to_answer(command: list[str], env: dict[str, str], cwd: str, answer: bool = True) -> float:
    """Milliseconds from spawn to the first stdout line (to the exit when ``answer`` is False)."""
    start = time.perf_counter()
    proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, cwd=cwd)
    assert proc.stdin is not None and proc.stdout is not None
    if answer:
        proc.stdin.write(INITIALIZE)
        proc.stdin.flush()
        line = proc.stdout.readline()
        elapsed = (time.perf_counter() - start) * 1000
        if b'"protocolVersion"' not in line:
            raise RuntimeError(f"{command[0]}: unexpected answer {line[:200]!r}")
        proc.stdin.close()
        proc.wait(10)
        return elapsed
    proc.stdin.close()
    proc.wait(10)
    return (time.perf_counter() - start) * 1000


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200, help="spawns per launcher (default 200)")
    parser.add_argument("--peer-runs", type=int, default=20, help="spawns of the MCP SDK peer (default 20; 0 skips)")
    parser.add_argument("--pin", type=int, help="pin this process and its children to one CPU")
    args = parser.parse_args()
    if args.pin is not None:
        os.sched_setaffinity(0, {args.pin})

    root = Path(tempfile.mkdtemp(prefix="at-bench-", dir="/tmp"))
    os.chmod(root, 0o700)
    (root / "home" / ".atomic" / "tools").mkdir(parents=True)
    (root / "project").mkdir()
    (root / "home" / ".atomic" / "tools" / "echo.py").write_text(
        'def echo(text: str) -> str:\n    """Echo the text back."""\n    return text\n'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ATOMICTOOLS_", "XDG_"))}
    env.update(HOME=str(root / "home"), XDG_RUNTIME_DIR=str(root), XDG_STATE_HOME=str(root / "state"),
               XDG_CONFIG_HOME=str(root / "config"), XDG_CACHE_HOME=str(root / "cache"))
    python = sys.executable
    console = str(Path(python).parent / "atomictoolsd")
    cwd = str(root / "project")
    daemon = subprocess.Popen([python, "-m", "atomictoolsd", "serve"], env=env, cwd=cwd,
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        created = subprocess.run([console, "bridge", "create", "--agent", "generic", "--json"], env=env, cwd=cwd,
                                 capture_output=True, text=True, check=True)
        bridge = json.loads(created.stdout)["path"]
        launchers = {
            "bridge script": [bridge],
            "atomictoolsd mcp (console script)": [console, "mcp"],
            "python -m atomictoolsd mcp": [python, "-m", "atomictoolsd", "mcp"],
        }
        floors = {
            "python -IS -c pass (floor)": [python, "-IS", "-c", "pass"],
            "python -c pass (floor)": [python, "-c", "pass"],
        }
        results: dict[str, list[float]] = {name: [] for name in [*launchers, *floors]}
        for command in launchers.values():  # warm the page cache and the daemon
            for _ in range(5):
                spawn_to_answer(command, env, cwd)
        for _ in range(args.runs):  # interleaved, so drift in machine load hits every row alike
            for name, command in launchers.items():
                results[name].append(spawn_to_answer(command, env, cwd))
            for name, command in floors.items():
                results[name].append(spawn_to_answer(command, env, cwd, answer=False))
        if args.peer_runs:
            peer = root / "peer.py"
            peer.write_text(PEER)
            peer_name = "peer: MCPServer (mcp SDK) stdio"
            results[peer_name] = [spawn_to_answer([python, str(peer)], env, cwd) for _ in range(args.peer_runs)]
    finally:
        daemon.terminate()
        daemon.wait(30)
        shutil.rmtree(root, ignore_errors=True)

    rows = {
        name: {"p50_ms": round(statistics.median(v), 2), "p99_ms": round(percentile(v, 0.99), 2),
               "min_ms": round(min(v), 2), "runs": len(v)}
        for name, v in results.items()
    }
    width = max(len(n) for n in rows)
    print(f"{'spawn → first initialize answer':<{width}}  {'p50 ms':>8}  {'p99 ms':>8}  {'min ms':>8}")
    for name, row in rows.items():
        print(f"{name:<{width}}  {row['p50_ms']:>8.2f}  {row['p99_ms']:>8.2f}  {row['min_ms']:>8.2f}")
    out = HERE / "results" / f"shim-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({
        "bench": "shim", "when": time.time(), "runs": args.runs, "pinned_cpu": args.pin,
        "python": sys.version.split()[0], "machine": platform.machine(), "cpus": os.cpu_count(),
        "results": rows,
    }, indent=2) + "\n")
    if args.peer_runs:
        for name in launchers:
            print(f"{name}: {rows[peer_name]['p50_ms'] / rows[name]['p50_ms']:.0f}x faster than the peer (p50)")
    print(f"\nsaved {out.relative_to(HERE.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
