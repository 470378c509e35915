"""Hot reload: how soon a saved tool reaches a client, and what reloading costs the calls in flight.

    python bench/reload.py [--quick] [--variants]

Against a real daemon in a temporary home:

1. **save → ``list_changed`` at an MCP client**: the official ``mcp`` client (``ClientSession`` over
   ``stdio_client``) runs the shim (``atomictoolsd mcp``) in a project whose tool file is edited;
   each edit changes the tool's description, so the toolset changes. The clock starts when the
   write returns and stops when the client's message handler gets
   ``notifications/tools/list_changed``; then the tool is called and must answer with the new
   version ("callable"). Pinned and unpinned.
2. **the same at a raw socket client** (what the shim relays), for an in-place write and for an
   editor's write-and-rename; ``--variants`` adds other watcher settings (step 10 ms, and
   watchfiles' own defaults 1600/50 ms) to show what the knobs do.
3. **idle CPU** of the daemon watching its tools dirs, against watchfiles' own loop with the same
   step running alone in this process (what the daemon would burn were it not woken by inotify).
4. **calls/s while a module is reloaded every 100 ms**: 8 connections keep 4 calls each in flight
   to one module, first with no reload, then while the module file is rewritten every 100 ms;
   failures (a JSON-RPC error or ``isError``) are counted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rawsocket import RawConnection  # noqa: E402

from common import (  # noqa: E402
    CONSOLE,
    MODES,
    DaemonUnderTest,
    Report,
    Stats,
    Table,
    affinity,
    percentile,
    run_alone,
)

TOOL = '''
def hot(x: int) -> str:
    """Version {version}."""
    return "v{version}"
'''

STEADY = '''
def steady(text: str) -> str:
    """Steady, revision {version}."""
    return text
'''


class Session(RawConnection):
    """A raw socket session that attached and initialized: it receives notifications."""

    def __init__(self, path: Path, directory: Path) -> None:
        super().__init__(path, timeout=None)
        self.request("atomic/attach", {"directory": str(directory)})
        self.request("initialize", {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench"}})
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def wait_for(self, method: str, timeout: float = 10.0) -> float:
        """Block until a notification ``method`` arrives; return when (perf_counter)."""
        self.sock.settimeout(timeout)
        try:
            while True:
                line = self.file.readline()
                if not line:
                    raise EOFError("the daemon closed the connection")
                if json.loads(line).get("method") == method:
                    return time.perf_counter()
        finally:
            self.sock.settimeout(None)


def save_latency(edits: int, atomic: bool, extra_env: dict[str, str]) -> dict[str, Any]:
    with DaemonUnderTest(extra_env=extra_env) as daemon:
        tools = daemon.project / ".atomic" / "tools"
        tools.mkdir(parents=True)
        path = tools / "hot.py"
        path.write_text(TOOL.format(version=0))
        session = Session(daemon.socket, daemon.project)
        session.request("tools/list", {})
        to_notice, to_callable = [], []
        for version in range(1, edits + 1):
            source = TOOL.format(version=version)
            if atomic:
                temp = tools / f".hot.py.{version}.tmp"
                temp.write_text(source)
                os.replace(temp, path)
            else:
                path.write_text(source)
            saved = time.perf_counter()
            noticed = session.wait_for("notifications/tools/list_changed")
            reply = session.request("tools/call", {"name": "hot", "arguments": {"x": 1}})
            answered = time.perf_counter()
            if reply.get("result", {}).get("content", [{}])[0].get("text") != f"v{version}":
                raise RuntimeError(f"after list_changed, the call answered {reply}")
            to_notice.append(noticed - saved)
            to_callable.append(answered - saved)
            time.sleep(0.15)  # one edit at a time: let the previous generation retire
        session.close()
    return {
        "edits": edits,
        "list_changed_p50_ms": round(statistics.median(to_notice) * 1000, 1),
        "list_changed_p99_ms": round(percentile(to_notice, 0.99) * 1000, 1),
        "list_changed_min_ms": round(min(to_notice) * 1000, 1),
        "callable_p50_ms": round(statistics.median(to_callable) * 1000, 1),
        "callable_p99_ms": round(percentile(to_callable, 0.99) * 1000, 1),
    }


async def _mcp_client_edits(daemon: DaemonUnderTest, path: Path, edits: int) -> tuple[Stats, Stats]:
    import anyio
    from mcp import ClientSession, StdioServerParameters, stdio_client

    changed = anyio.Event()
    noticed_at = [0.0]

    async def on_message(message: Any) -> None:
        if getattr(message, "method", None) == "notifications/tools/list_changed" and not changed.is_set():
            noticed_at[0] = time.perf_counter()
            changed.set()

    params = StdioServerParameters(command=CONSOLE, args=["mcp"], env=daemon.env, cwd=str(daemon.project))
    to_notice, to_callable = Stats(), Stats()
    with open(os.devnull, "w") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write):
            async with ClientSession(read, write, message_handler=on_message) as session:
                await session.initialize()
                await session.list_tools()
                for version in range(1, edits + 1):
                    changed = anyio.Event()
                    path.write_text(TOOL.format(version=version))
                    saved = time.perf_counter()
                    with anyio.fail_after(10):
                        await changed.wait()
                    result = await session.call_tool("hot", {"x": 1})
                    answered = time.perf_counter()
                    text = result.content[0].text if result.content else ""  # type: ignore[union-attr]
                    if text != f"v{version}":
                        raise RuntimeError(f"after list_changed, the call answered {text!r}")
                    to_notice.samples.append(noticed_at[0] - saved)
                    to_callable.samples.append(answered - saved)
                    await session.list_tools()  # as an agent does on list_changed
                    await anyio.sleep(0.15)  # one edit at a time: let the previous generation retire
    return to_notice, to_callable


def mcp_client_latency(edits: int) -> dict[str, Any]:
    """Save → ``list_changed`` at the official MCP client, through the shim."""
    import anyio

    with DaemonUnderTest() as daemon:
        tools = daemon.project / ".atomic" / "tools"
        tools.mkdir(parents=True)
        path = tools / "hot.py"
        path.write_text(TOOL.format(version=0))
        to_notice, to_callable = anyio.run(_mcp_client_edits, daemon, path, edits)
    notice, callable_ = to_notice.ms(), to_callable.ms()
    return {
        "edits": edits,
        "list_changed_p50_ms": notice["p50_ms"], "list_changed_p99_ms": notice["p99_ms"],
        "list_changed_min_ms": notice["min_ms"],
        "callable_p50_ms": callable_["p50_ms"], "callable_p99_ms": callable_["p99_ms"],
    }


def idle_cpu(seconds: float) -> dict[str, float]:
    import psutil
    from watchfiles._rust_notify import RustNotify

    with DaemonUnderTest() as daemon:
        (daemon.project / ".atomic" / "tools").mkdir(parents=True)
        Session(daemon.socket, daemon.project).close()  # a project in use: its dir is watched too
        time.sleep(1.0)
        assert daemon.proc is not None
        process = psutil.Process(daemon.proc.pid)
        before = process.cpu_times()
        time.sleep(seconds)
        after = process.cpu_times()
        daemon_cpu = (after.user + after.system - before.user - before.system) / seconds

    with tempfile.TemporaryDirectory() as tmp:
        notify = RustNotify([tmp], False, False, 300, False, True)
        stop = threading.Event()
        thread = threading.Thread(target=lambda: notify.watch(50, 5, 0, stop))
        own = psutil.Process()
        before = own.cpu_times()
        thread.start()
        time.sleep(seconds)
        stop.set()
        thread.join()
        after = own.cpu_times()
        loop_cpu = (after.user + after.system - before.user - before.system) / seconds
    return {"daemon_idle_cpu_pct": round(daemon_cpu * 100, 3), "watchfiles_step_loop_cpu_pct": round(loop_cpu * 100, 3)}


CALL = b'{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"steady","arguments":{"text":"x"}}}\n'


class Load(asyncio.Protocol):
    """Keeps ``depth`` calls in flight on one connection; records each answer's latency and outcome."""

    def __init__(self, depth: int, tally: dict[str, Any]) -> None:
        self.depth = depth
        self.tally = tally
        self.buffer = b""
        self.sent: dict[int, float] = {}
        self.next_id = 1
        self.stopping = False
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        for _ in range(self.depth):
            self.send()

    def send(self) -> None:
        self.sent[self.next_id] = time.perf_counter()
        self.transport.write(CALL % self.next_id)
        self.next_id += 1

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        self.buffer += data
        *lines, self.buffer = self.buffer.split(b"\n")
        for line in lines:
            message = json.loads(line)
            if "id" not in message:
                continue
            started = self.sent.pop(message["id"])
            if self.tally["counting"]:
                self.tally["latencies"].append(now - started)
                result = message.get("result")
                if result is None or result.get("isError") or result["content"][0]["text"] != "x":
                    self.tally["failures"].append(message)
                else:
                    self.tally["ok"] += 1
            if not self.stopping:
                self.send()


async def calls_under_reload(seconds: float, reload_every: float | None) -> dict[str, Any]:
    with DaemonUnderTest() as daemon:
        tools = daemon.project / ".atomic" / "tools"
        tools.mkdir(parents=True)
        path = tools / "steady.py"
        path.write_text(STEADY.format(version=0))
        with RawConnection(daemon.socket) as raw:  # attach a project: the load connections are raw
            raw.result("atomic/attach", {"directory": str(daemon.project)})
        loop = asyncio.get_running_loop()
        tally: dict[str, Any] = {"counting": False, "ok": 0, "failures": [], "latencies": []}
        protocols = []
        for _ in range(8):
            raw = socket.socket(socket.AF_UNIX)
            raw.connect(str(daemon.socket))
            raw.sendall(json.dumps({"jsonrpc": "2.0", "id": 0, "method": "atomic/attach", "params": {"directory": str(daemon.project)}}).encode() + b"\n")
            raw.recv(65536)
            raw.setblocking(False)
            _, protocol = await loop.create_unix_connection(lambda: Load(4, tally), sock=raw)
            protocols.append(protocol)
        await asyncio.sleep(1.0)  # warm up
        reloads = 0
        tally["counting"] = True
        started = time.perf_counter()
        deadline = started + seconds
        while time.perf_counter() < deadline:
            if reload_every is None:
                await asyncio.sleep(0.05)
                continue
            await asyncio.sleep(reload_every)
            reloads += 1
            path.write_text(STEADY.format(version=reloads))
        elapsed = time.perf_counter() - started
        tally["counting"] = False
        for protocol in protocols:
            protocol.stopping = True
        await asyncio.sleep(0.2)
        for protocol in protocols:
            protocol.transport.close()
        with RawConnection(daemon.socket) as raw:
            raw.result("atomic/attach", {"directory": str(daemon.project)})
            status = raw.result("atomic/status")
        spawns = next(m["spawns"] for m in status["modules"] if m["path"] == str(path))
    latencies = tally["latencies"]
    return {
        "seconds": round(elapsed, 2),
        "rewrites": reloads,
        "worker_generations": spawns,
        "calls": tally["ok"] + len(tally["failures"]),
        "calls_per_s": round((tally["ok"] + len(tally["failures"])) / elapsed),
        "failures": len(tally["failures"]),
        "first_failure": tally["failures"][0] if tally["failures"] else None,
        "p50_us": round(statistics.median(latencies) * 1e6),
        "p99_us": round(percentile(latencies, 0.99) * 1e6),
    }


def measure(quick: bool = False, variants: bool = False) -> Report:
    import uvloop

    edits, seconds, idle_seconds = (8, 2.0, 3.0) if quick else (30, 5.0, 10.0)
    report = Report("reload", data={"edits": edits, "seconds": seconds, "idle_seconds": idle_seconds})
    rows: list[list[Any]] = []

    def add(name: str, mode: str, r: dict[str, Any]) -> None:
        rows.append([name, mode, r["edits"], r["list_changed_p50_ms"], r["list_changed_p99_ms"],
                     r["callable_p50_ms"], r["callable_p99_ms"]])

    latency: dict[str, Any] = {}
    for mode, pinned in MODES:
        with affinity(pinned):
            name = "official mcp client through the shim, in-place write"
            latency[f"{name}, {mode}"] = result = mcp_client_latency(edits)
            add(name, mode, result)
    sockets = {
        "raw socket client, in-place write": (False, {}),
        "raw socket client, editor rename": (True, {}),
    }
    if variants:
        sockets["raw socket client, step 10 ms (50/10 ms)"] = (False, {"ATOMICTOOLS_WATCH_STEP_MS": "10"})
        sockets["raw socket client, watchfiles defaults (1600/50 ms)"] = (
            False, {"ATOMICTOOLS_WATCH_DEBOUNCE_MS": "1600", "ATOMICTOOLS_WATCH_STEP_MS": "50"},
        )
    for name, (atomic, extra) in sockets.items():
        latency[name] = result = save_latency(edits, atomic, extra)
        add(name, "unpinned", result)
    report.tables.append(Table(
        "reload-latency", "save a tool file → notifications/tools/list_changed at the client (ms)",
        ["client, how the file was saved", "mode", "edits", "list_changed p50", "p99", "callable p50", "p99"],
        rows,
        ["Daemon defaults: debounce 50 ms, step 5 ms. \"Callable\": the new version answered a call made "
         "right after the notification."],
    ))
    idle = idle_cpu(idle_seconds)
    report.tables.append(Table(
        "reload-idle", f"idle CPU over {idle_seconds:g} s (share of one core)",
        ["what", "CPU %"],
        [["daemon watching its tools dirs (woken by inotify)", idle["daemon_idle_cpu_pct"]],
         ["watchfiles' own loop, step 5 ms, alone", idle["watchfiles_step_loop_cpu_pct"]]],
    ))
    steady = uvloop.run(calls_under_reload(seconds, None))
    reloading = uvloop.run(calls_under_reload(seconds, 0.1))
    report.tables.append(Table(
        "reload-calls", "calls/s while a module is rewritten every 100 ms (8 connections × 4 in flight, one module)",
        ["load", "calls/s", "failed calls", "p50 µs", "p99 µs", "rewrites", "worker generations"],
        [[name, r["calls_per_s"], r["failures"], r["p50_us"], r["p99_us"], r["rewrites"], r["worker_generations"]]
         for name, r in (("no reload", steady), ("module rewritten every 100 ms", reloading))],
    ))
    report.data.update({"save_to_list_changed": latency, "idle": idle, "calls": {"steady": steady, "reloading": reloading}})
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    parser.add_argument("--variants", action="store_true", help="also other watcher settings, at a socket client")
    args = parser.parse_args()
    run_alone(measure(args.quick, args.variants))


if __name__ == "__main__":
    main()
