"""Shared pieces of the benchmarks: peer environments, pinning, a daemon under test, statistics.

Every figure is measured in one run side by side with the peers — FastMCP (``mcp==1.30.0``) and
MCPServer (``mcp==2.3.0``), each in a virtual environment of its own under ``bench/.venvs`` — so
what is compared ran on the same machine at the same moment. "Pinned" runs every process of the
system under test and the client on CPU 0; "unpinned" lets the scheduler place them.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
VENVS = BENCH / ".venvs"
RESULTS = BENCH / "results"

PEERS = {
    "fastmcp (mcp 1.30.0)": ("mcp1", "mcp==1.30.0", BENCH / "peers" / "fastmcp_echo.py"),
    "mcpserver (mcp 2.3.0)": ("mcp2", "mcp==2.3.0", BENCH / "peers" / "mcpserver_echo.py"),
}

ECHO_TOOL = '''
def echo(text: str) -> str:
    """Echo the text back."""
    return text
'''

INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}},
}


def peer_python(venv: str, requirement: str) -> Path:
    """The interpreter of a peer's own virtual environment, created on first use."""
    python = VENVS / venv / "bin" / "python"
    marker = VENVS / venv / ".installed"
    if python.exists() and marker.exists() and marker.read_text() == requirement:
        return python
    shutil.rmtree(VENVS / venv, ignore_errors=True)
    print(f"creating {VENVS / venv} with {requirement} …", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "venv", str(VENVS / venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", requirement], check=True)
    marker.write_text(requirement)
    return python


def peer_commands() -> dict[str, list[str]]:
    return {name: [str(peer_python(venv, req)), str(script)] for name, (venv, req, script) in PEERS.items()}


@contextmanager
def affinity(pinned: bool) -> Iterator[None]:
    """Run the block (and every process it starts) on CPU 0 when ``pinned``."""
    before = os.sched_getaffinity(0)
    if pinned:
        os.sched_setaffinity(0, {min(before)})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


@dataclass
class Stats:
    """Latencies in seconds → a summary in microseconds."""

    samples: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, float]:
        ordered = sorted(self.samples)
        n = len(ordered)
        return {
            "n": n,
            "p50_us": round(statistics.median(ordered) * 1e6, 1),
            "p99_us": round(ordered[min(n - 1, int(n * 0.99))] * 1e6, 1),
            "mean_us": round(statistics.fmean(ordered) * 1e6, 1),
        }


class DaemonUnderTest:
    """An atomictoolsd in a temporary home and runtime dir, serving the echo tool."""

    def __init__(self, extra_env: dict[str, str] | None = None) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="atb-", dir="/tmp"))
        os.chmod(self.root, 0o700)
        home = self.root / "home"
        (home / ".atomic" / "tools").mkdir(parents=True)
        (home / ".atomic" / "tools" / "echo.py").write_text(ECHO_TOOL)
        self.project = self.root / "project"
        self.project.mkdir()
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("ATOMICTOOLS_", "XDG_"))}
        self.env.update(
            HOME=str(home),
            XDG_RUNTIME_DIR=str(self.root),
            XDG_STATE_HOME=str(self.root / "state"),
            XDG_CONFIG_HOME=str(self.root / "config"),
            XDG_CACHE_HOME=str(self.root / "cache"),
            ATOMICTOOLS_TRUST_ALL="1",
            **(extra_env or {}),
        )
        self.socket = self.root / "atomictools" / "atomictoolsd.sock"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> DaemonUnderTest:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "atomictoolsd", "serve"],
            env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with socket.socket(socket.AF_UNIX) as sock:
                    sock.connect(str(self.socket))
                    return self
            except OSError:
                time.sleep(0.01)
        raise RuntimeError("the daemon under test did not start")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> DaemonUnderTest:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def save(name: str, payload: dict[str, Any]) -> Path:
    """Write a result file under bench/results/ and return its path."""
    RESULTS.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = RESULTS / f"{name}-{stamp}.json"
    payload = {"machine": machine(), **payload}
    path.write_text(json.dumps(payload, indent=2))
    return path


def machine() -> dict[str, Any]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpus": os.cpu_count(), "cpu": model, "python": sys.version.split()[0], "platform": sys.platform}


def print_table(headers: list[str], rows: list[list[Any]]) -> None:
    cells = [headers, *[[str(c) for c in row] for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    for i, row in enumerate(cells):
        print("  ".join(c.rjust(w) if j else c.ljust(w) for j, (c, w) in enumerate(zip(row, widths, strict=True))))
        if i == 0:
            print("  ".join("-" * w for w in widths))
