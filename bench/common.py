"""Shared pieces of the benchmarks: peer environments, pinning, a daemon under test, statistics,
tables and result files.

Every figure is measured in one run side by side with the peers — FastMCP (``mcp==1.30.0``) and
MCPServer (``mcp==2.3.0``), each in a virtual environment of its own under ``bench/.venvs`` — so
what is compared ran on the same machine at the same moment. "Pinned" runs every process of the
system under test and the client on CPU 0; "unpinned" lets the scheduler place them.

A benchmark module exposes ``measure(quick: bool) -> Report`` (what ``bench/run.py`` calls) and a
``main()`` that runs it alone. A ``Report`` holds ``Table``s: the same tables are printed, saved in
the JSON, and rendered into docs/performance.md by ``bench/render.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rawsocket import RawConnection

from atomictoolsd.util.processes import stop_process

__all__ = [
    "BENCH",
    "CONSOLE",
    "ECHO_TOOL",
    "ECHO_TOOLS",
    "EIGHT",
    "INITIALIZE",
    "MODES",
    "PEERS",
    "RESULTS",
    "DaemonUnderTest",
    "FloorRelay",
    "Report",
    "Stats",
    "Table",
    "affinity",
    "isolated_env",
    "load_average",
    "machine",
    "peer_commands",
    "percentile",
    "print_table",
    "quick_main",
    "ratio",
    "run_alone",
    "save",
]

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
VENVS = BENCH / ".venvs"
RESULTS = BENCH / "results"
CONSOLE = str(Path(sys.executable).parent / "atomictoolsd")  # the console script agents run
MODES = (("pinned", True), ("unpinned", False))

PEERS = {
    "fastmcp (mcp 1.30.0)": ("mcp1", "mcp==1.30.0", BENCH / "peers" / "fastmcp_echo.py"),
    "mcpserver (mcp 2.3.0)": ("mcp2", "mcp==2.3.0", BENCH / "peers" / "mcpserver_echo.py"),
    # The standalone FastMCP package. 4.1.0, not the newest 4.1.6: 4.1.4 and later need a certifi
    # release this machine's package index does not have yet.
    "fastmcp 4.1.0": ("fastmcp4", "fastmcp==4.1.0", BENCH / "peers" / "fastmcp4_echo.py"),
}

ECHO_TOOL = '''
def {name}(text: str) -> str:
    """Echo the text back."""
    return text
'''

# The echo tool, and eight more modules (echo0 … echo7) for loads spread over eight workers.
ECHO_TOOLS = {name: ECHO_TOOL.format(name=name) for name in ["echo", *(f"echo{i}" for i in range(8))]}
EIGHT = [f"echo{i}" for i in range(8)]

INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}},
}


# -- the peers --------------------------------------------------------------------------------------


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


def peer_commands(extra_tools: int = 0) -> dict[str, list[str]]:
    """Each peer's stdio server command; ``extra_tools`` adds ``echo0`` … ``echo{N-1}``."""
    extra = [str(extra_tools)] if extra_tools else []
    return {name: [str(peer_python(venv, req)), str(script), *extra] for name, (venv, req, script) in PEERS.items()}


# -- the machine ------------------------------------------------------------------------------------


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


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def machine() -> dict[str, Any]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        memory_gib = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError):
        memory_gib = None
    return {
        "cpus": os.cpu_count(), "cpu": model, "memory_gib": memory_gib, "python": sys.version.split()[0],
        "platform": sys.platform, "kernel": os.uname().release, "load_average": load_average(),
    }


# -- statistics -------------------------------------------------------------------------------------


def percentile(samples: Sequence[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


@dataclass
class Stats:
    """Durations in seconds → a summary in microseconds (``summary()``) or milliseconds (``ms()``)."""

    samples: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, float]:
        return self._summary(1e6, "us", 1)

    def ms(self) -> dict[str, float]:
        return self._summary(1e3, "ms", 2)

    def _summary(self, scale: float, unit: str, digits: int) -> dict[str, float]:
        n = len(self.samples)
        return {
            "n": n,
            f"p50_{unit}": round(statistics.median(self.samples) * scale, digits),
            f"p99_{unit}": round(percentile(self.samples, 0.99) * scale, digits),
            f"min_{unit}": round(min(self.samples) * scale, digits),
            f"mean_{unit}": round(statistics.fmean(self.samples) * scale, digits),
        }


def ratio(slow: float, fast: float) -> float:
    """How many times ``fast`` beats ``slow`` (one decimal)."""
    return round(slow / fast, 1) if fast else float("inf")


# -- tables and results -----------------------------------------------------------------------------


@dataclass
class Table:
    """One table of figures: printed, saved, and rendered into docs/performance.md under ``key``."""

    key: str
    title: str
    headers: list[str]
    rows: list[list[Any]]
    notes: list[str] = field(default_factory=list)


@dataclass
class Report:
    """What one benchmark measured: its tables, and the raw figures behind them."""

    name: str
    tables: list[Table] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)

    def print(self) -> None:
        for table in self.tables:
            print(f"\n## {table.title}")
            print_table(table.headers, table.rows)
            for note in table.notes:
                print(f"   {note}")

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "tables": [asdict(t) for t in self.tables], "data": self.data}


def fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if value >= 1000:
            return f"{value:,.0f}"
        if value >= 100:
            return f"{value:.0f}"
        return f"{value:.3g}" if value < 1 else f"{value:.1f}"
    if isinstance(value, int) and abs(value) >= 1000:
        return f"{value:,}"
    return str(value)


def numeric_columns(rows: list[list[Any]], width: int) -> list[bool]:
    """Which columns hold only numbers (or nothing): those are right-aligned."""
    return [bool(rows) and all(isinstance(row[i], (int, float)) or row[i] is None for row in rows) for i in range(width)]


def print_table(headers: list[str], rows: list[list[Any]]) -> None:
    cells = [headers, *[[fmt(c) for c in row] for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    numeric = numeric_columns(rows, len(headers))
    for i, row in enumerate(cells):
        print("  ".join(c.rjust(w) if num else c.ljust(w) for c, w, num in zip(row, widths, numeric, strict=True)).rstrip())
        if i == 0:
            print("  ".join("-" * w for w in widths))


def save(name: str, payload: dict[str, Any]) -> Path:
    """Write a result file under bench/results/ and return its path."""
    RESULTS.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = RESULTS / f"{name}-{stamp}.json"
    payload = {"machine": machine(), "when": time.strftime("%Y-%m-%d %H:%M:%S %z"), **payload}
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path


def run_alone(report: Report) -> None:
    """What each script's ``main()`` does with its report: print it and save it."""
    report.print()
    print(f"\nsaved {save(report.name, {'reports': [report.as_json()]})}")


def quick_main(measure: Callable[[bool], Report], doc: str | None) -> None:
    """The ``main()`` of a script whose one option is ``--quick``: measure, print, save."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    run_alone(measure(parser.parse_args().quick))


# -- a daemon under test ----------------------------------------------------------------------------


def isolated_env(root: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment with home, runtime, state, config and cache dirs under ``root``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ATOMICTOOLS_", "XDG_"))}
    env.update(
        HOME=str(root / "home"),
        XDG_RUNTIME_DIR=str(root),
        XDG_STATE_HOME=str(root / "state"),
        XDG_CONFIG_HOME=str(root / "config"),
        XDG_CACHE_HOME=str(root / "cache"),
        **(extra or {}),
    )
    return env


class DaemonUnderTest:
    """An atomictoolsd in a temporary home and runtime dir.

    Args:
        tools: global tool modules, file stem → source (default: the one-line ``echo`` tool).
        extra_env: more variables (``ATOMICTOOLS_*`` settings).
        config: the text of its ``config.toml``.
        source: run the daemon from another source tree (its ``client/`` and ``daemon/``), e.g. a
            ``git worktree`` of an older commit, to measure before and after.
        wrapper: a command to run it under (``valgrind …``); its workers, forks, run under it too.
    """

    def __init__(
        self,
        *,
        tools: dict[str, str] | None = None,
        extra_env: dict[str, str] | None = None,
        config: str | None = None,
        source: Path | None = None,
        wrapper: Sequence[str] = (),
    ) -> None:
        self.wrapper = list(wrapper)
        self.root = Path(tempfile.mkdtemp(prefix="atb-", dir="/tmp"))
        os.chmod(self.root, 0o700)
        self.home = self.root / "home"
        self.tools_dir = self.home / ".atomic" / "tools"
        self.tools_dir.mkdir(parents=True)
        for stem, text in (tools if tools is not None else {"echo": ECHO_TOOL.format(name="echo")}).items():
            (self.tools_dir / f"{stem}.py").write_text(text)
        self.project = self.root / "project"
        self.project.mkdir()
        extra = dict(extra_env or {})
        if source is not None:
            extra["PYTHONPATH"] = f"{source / 'client'}:{source / 'daemon'}"
        self.env = isolated_env(self.root, extra)
        # Every project's tools load: trust_all is read from the config file only.
        config = config or ""
        if "trust_all" not in config:
            config = "trust_all = true\n" + config
        (self.root / "config" / "atomictools").mkdir(parents=True)
        (self.root / "config" / "atomictools" / "config.toml").write_text(config)
        self.socket = self.root / "atomictools" / "atomictoolsd.sock"
        self.proc: subprocess.Popen[bytes] | None = None
        self.ready_s: float | None = None  # spawn → the daemon reported it serves

    def start(self, timeout: float = 60.0) -> DaemonUnderTest:
        """Start ``atomictoolsd serve`` and return once it reports that its socket serves."""
        read_fd, write_fd = os.pipe()
        started = time.perf_counter()
        self.proc = subprocess.Popen(
            # -P as the autostart starts it (without it, a daemon re-executes itself and starts later).
            [*self.wrapper, sys.executable, "-P", "-m", "atomictoolsd", "serve", "--ready-fd", str(write_fd)],
            env=self.env, cwd=self.project, pass_fds=(write_fd,),
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        os.close(write_fd)
        try:
            with os.fdopen(read_fd, "rb") as ready:
                line = ready.readline()  # EOF without a line: the daemon failed to start
        except BaseException:
            self.stop()
            raise
        self.ready_s = time.perf_counter() - started
        if not line.startswith(b"started"):
            self.stop()
            raise RuntimeError(f"the daemon under test did not start: {line!r}")
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def bridge(self) -> str:
        """Create a bridge script through the daemon and return its path."""
        created = subprocess.run(
            [CONSOLE, "bridge", "create", "--agent", "generic", "--json"],
            env=self.env, cwd=self.project, capture_output=True, text=True, check=True,
        )
        return json.loads(created.stdout)["path"]

    def request(self, method: str, params: dict[str, Any] | None = None, attach: Path | None = None) -> Any:
        """One request on a fresh connection (attached to ``attach`` first); its result."""
        with RawConnection(self.socket, timeout=None) as raw:
            if attach is not None:
                raw.send_request("atomic/attach", {"directory": str(attach)})
            return raw.result(method, params or {})

    def stop(self, remove: bool = True) -> None:
        """Stop the daemon (SIGTERM, then SIGKILL); remove its dirs unless ``remove`` is False."""
        if self.proc is not None:
            stop_process(self.proc, 60)
        self.proc = None
        if remove:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> DaemonUnderTest:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class FloorRelay:
    """``peers/floor_relay.py``: the least a client → daemon → worker call costs here, now.
    ``wrapper``: a command to run it under, as ``DaemonUnderTest`` takes one."""

    def __init__(self, wrapper: Sequence[str] = ()) -> None:
        self.wrapper = list(wrapper)
        self.root = Path(tempfile.mkdtemp(prefix="atb-floor-", dir="/tmp"))
        self.socket = self.root / "floor.sock"
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> FloorRelay:
        self.proc = subprocess.Popen(
            [*self.wrapper, sys.executable, str(BENCH / "peers" / "floor_relay.py"), str(self.socket)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        )
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != b"ready":
            self.__exit__()
            raise RuntimeError("the floor relay did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            stop_process(self.proc, 30)
            self.proc = None
        shutil.rmtree(self.root, ignore_errors=True)
