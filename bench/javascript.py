"""TypeScript tools beside Python ones, measured side by side in one run:

    python bench/javascript.py [--quick]

1. **save → ``list_changed``** at the official MCP client through the shim, a ``.ts`` file on Bun and
   a ``.py`` file taking turns (each edit changes the tool's description, so the toolset changes),
   and the edit's call answering with the new version ("callable");
2. **steady ``tools/call`` through the shim** (the raw stdio client of ``clients.py`` running
   ``atomictoolsd mcp``) to the same one-line echo tool written in TypeScript (Bun, and Node 22 when
   installed) and in Python, in alternating rounds, pinned to one core and not;
3. **an idle worker's memory**: resident (RSS) and unique (USS) memory of each worker after its calls
   and a quiet second, and its module's load time.

Bun, Node 22 and the packages come from ``.ci/agents`` (``npm install --prefix .ci/agents``), or
Bun from PATH.
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from clients import call_line, measure_latency, stdio_channel  # noqa: E402
from common import (  # noqa: E402
    CONSOLE,
    ECHO_TOOL,
    MODES,
    ROOT,
    DaemonUnderTest,
    Report,
    Stats,
    Table,
    affinity,
    quick_main,
)

AGENTS = ROOT / ".ci" / "agents"
ECHO_TS = '''import { tool } from "@atomic/plugin"

export default tool({
  description: "Echo the text back.",
  args: { text: tool.schema.string() },
  execute: (args) => args.text,
})
'''
HOT_TS = '''import {{ tool }} from "@atomic/plugin"

export default tool({{ description: "Version {version}.", args: {{ x: tool.schema.number() }}, execute: () => "v{version}" }})
'''
HOT_PY = '''
def hot_py(x: int) -> str:
    """Version {version}."""
    return "v{version}"
'''


def runtimes() -> dict[str, str]:
    """The JavaScript runtimes to measure: Bun (required), Node 22 (when installed)."""
    found = {}
    bun = AGENTS / "node_modules" / ".bin" / "bun"
    found["bun"] = str(bun) if bun.exists() else shutil.which("bun") or ""
    node = AGENTS / "node_modules" / "node" / "bin" / "node"
    if node.exists():
        found["node"] = str(node)
    if not found["bun"]:
        raise SystemExit("Bun is not installed: npm install --prefix .ci/agents --no-audit --no-fund")
    return found


def daemon_for(runtime: str, extra: dict[str, str] | None = None) -> DaemonUnderTest:
    daemon = DaemonUnderTest(
        tools={"echo_py": ECHO_TOOL.format(name="echo_py")},
        extra_env={"ATOMICTOOLS_JS_RUNTIME": runtime, "ATOMICTOOLS_JS_PACKAGES": str(AGENTS), "ATOMICTOOLS_BUILTINS": "0",
                   **(extra or {})},
    )
    (daemon.tools_dir / "echo_ts.ts").write_text(ECHO_TS)
    return daemon


async def _edits(daemon: DaemonUnderTest, edits: int) -> dict[str, tuple[Stats, Stats]]:
    import anyio
    from mcp import ClientSession, StdioServerParameters, stdio_client

    state: dict[str, Any] = {"event": None, "at": 0.0}

    async def on_message(message: Any) -> None:
        if getattr(message, "method", None) == "notifications/tools/list_changed" and state["event"] is not None:
            state["at"] = time.perf_counter()
            state["event"].set()

    files = {"ts": (daemon.tools_dir / "hot_ts.ts", HOT_TS, "hot_ts"), "py": (daemon.tools_dir / "hot_py.py", HOT_PY, "hot_py")}
    for path, source, _name in files.values():
        path.write_text(source.format(version=0))
    out = {kind: (Stats(), Stats()) for kind in files}
    params = StdioServerParameters(command=CONSOLE, args=["mcp"], env=daemon.env, cwd=str(daemon.project))
    with open(os.devnull, "w") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write):
            async with ClientSession(read, write, message_handler=on_message) as session:
                await session.initialize()
                with anyio.fail_after(30):
                    while {"hot_ts", "hot_py"} - {t.name for t in (await session.list_tools()).tools}:
                        await anyio.sleep(0.1)
                for version in range(1, edits + 1):
                    for kind, (path, source, name) in files.items():
                        state["event"] = anyio.Event()
                        path.write_text(source.format(version=version))
                        saved = time.perf_counter()
                        with anyio.fail_after(10):
                            await state["event"].wait()
                        result = await session.call_tool(name, {"x": 1})
                        answered = time.perf_counter()
                        text = result.content[0].text if result.content else ""  # type: ignore[union-attr]
                        if text != f"v{version}":
                            raise RuntimeError(f"{name}: after list_changed, the call answered {text!r}")
                        out[kind][0].samples.append(state["at"] - saved)
                        out[kind][1].samples.append(answered - saved)
                        state["event"] = None
                        await session.list_tools()  # as an agent does on list_changed
                        await anyio.sleep(0.2)  # one edit at a time: let the previous generation retire
    return out


def save_latency(bun: str, edits: int) -> Table:
    import anyio

    with daemon_for(bun) as daemon:
        measured = anyio.run(_edits, daemon, edits)
    rows = []
    for kind, label in (("ts", "hot_ts.ts (Bun)"), ("py", "hot_py.py")):
        notice, callable_ = measured[kind][0].ms(), measured[kind][1].ms()
        rows.append([label, edits, notice["p50_ms"], notice["p99_ms"], callable_["p50_ms"], callable_["p99_ms"]])
    return Table(
        "javascript_reload", "Save a tool file → list_changed at the MCP client (through the shim)",
        ["file", "edits", "list_changed p50 ms", "p99 ms", "callable p50 ms", "p99 ms"], rows,
        ["the two files take turns, one edit at a time, in one daemon"],
    )


def call_latency(found: dict[str, str], calls: int, rounds: int) -> tuple[Table, dict[str, Any]]:
    """Every runtime's daemon runs at once, each with its shim; rounds take turns between the Python
    tool and each TypeScript one, so a change in the machine's load hits them alike."""
    rows = []
    data: dict[str, Any] = {}
    for mode, pinned in MODES:
        daemons = {name: daemon_for(runtime).start() for name, runtime in found.items()}
        channels: dict[str, tuple[Any, Any]] = {}
        try:
            with affinity(pinned):
                for name, daemon in daemons.items():
                    channels[name] = stdio_channel([CONSOLE, "mcp"], env=daemon.env, cwd=str(daemon.project))
                    channels[name][1].handshake()
                turns = [("echo_py (Python)", "bun", "echo_py"), *((f"echo_ts ({name})", name, "echo_ts") for name in found)]
                samples = {label: Stats() for label, _name, _tool in turns}
                for _round in range(rounds):
                    for label, name, tool in turns:
                        stats = measure_latency(channels[name][1], calls, warmup=100, line=call_line(tool))
                        samples[label].samples.extend(stats.samples)
        finally:
            for _proc, channel in channels.values():
                channel.close()
            for daemon in daemons.values():
                daemon.stop()
        python_p50 = statistics.median(samples["echo_py (Python)"].samples)
        for label, stats in samples.items():
            summary = stats.summary()
            data[f"{mode} {label}"] = summary
            rows.append([mode, label, summary["n"], summary["p50_us"], summary["p99_us"],
                         round(statistics.median(stats.samples) / python_p50, 2)])
    table = Table(
        "javascript_calls", "Steady tools/call through the shim: a TypeScript tool beside a Python one",
        ["mode", "tool", "calls", "p50 µs", "p99 µs", "× Python p50"], rows,
        ["the raw stdio client running `atomictoolsd mcp`, one daemon per runtime, all at once; "
         "one-line echo tools; rounds take turns between the tools"],
    )
    return table, data


def idle_memory(found: dict[str, str]) -> Table:
    import psutil

    rows = []
    for name, runtime in found.items():
        with daemon_for(runtime) as daemon:
            for tool in ("echo_ts", "echo_py"):
                if tool == "echo_py" and name != "bun":
                    continue
                for _ in range(200):
                    daemon.request("tools/call", {"name": tool, "arguments": {"text": "hi"}}, attach=daemon.project)
            time.sleep(1.0)
            status = daemon.request("atomic/status")
            for module in status["modules"]:
                stem = Path(module["path"]).stem
                if module["worker"] is None or not stem.startswith("echo_") or (stem == "echo_py" and name != "bun"):
                    continue
                worker = psutil.Process(module["worker"])
                memory = worker.memory_full_info()
                # A JavaScript worker's output drain: a fork of the fork server, nearly all of it shared.
                drain = sum(child.memory_full_info().uss for child in worker.children()) if stem == "echo_ts" else 0
                label = f"{stem} ({name})" if stem == "echo_ts" else f"{stem} (Python, forked)"
                rows.append([label, round(memory.rss / 2**20, 1), round(memory.uss / 2**20, 1),
                             round(drain / 2**20, 1) if stem == "echo_ts" else None, module["loadMs"]])
    return Table(
        "javascript_memory", "An idle worker's memory, after 200 calls and a quiet second",
        ["worker", "RSS MiB", "USS MiB", "output drain USS MiB", "load ms"], rows,
        ["RSS counts the runtime's executable pages, which every worker of it shares; USS is the worker's own"],
    )


HELLO_TS = '''import { tool } from "@opencode-ai/plugin"

export default tool({
  description: "Greet someone by name",
  args: { name: tool.schema.string().describe("The person's name") },
  async execute(args) { return `hello ${args.name}` },
})
'''


def against_opencode(bun: str, runs: int) -> Table | None:
    """One call of an OpenCode tool file from nothing: OpenCode's own headless run of it (``opencode
    debug agent build --tool``: start, load the tool files, run the tool) against a daemon started
    cold (no definition cache) answering ``atomictoolsd call`` for the same file, started by the call."""
    import subprocess

    opencode = AGENTS / "node_modules" / ".bin" / "opencode"
    if not opencode.exists():
        return None
    rows = []
    with DaemonUnderTest(tools={}) as base:  # an isolated home for OpenCode's own files
        project = base.project
        (project / ".opencode" / "tools").mkdir(parents=True)
        (project / ".opencode" / "tools" / "hello.ts").write_text(HELLO_TS)
        subprocess.run(["git", "init", "-q", str(project)], check=True)
        env = {**base.env, "OPENCODE_DISABLE_AUTOUPDATE": "1", "CI": "1"}
        command = [str(opencode), "debug", "agent", "build", "--tool", "hello", "--params", '{"name":"A"}']
        first = subprocess.run(command, env=env, cwd=project, capture_output=True, text=True, timeout=300)  # installs its packages
        if "hello A" not in first.stdout:
            return None
        samples = Stats()
        for _ in range(runs):
            started = time.perf_counter()
            done = subprocess.run(command, env=env, cwd=project, capture_output=True, text=True, timeout=120)
            samples.samples.append(time.perf_counter() - started)
            assert "hello A" in done.stdout, done.stdout + done.stderr
        rows.append(["opencode debug agent --tool (its own load and run)", runs, samples.ms()["p50_ms"], samples.ms()["min_ms"]])
        ours = Stats()
        for _ in range(runs):
            with DaemonUnderTest(tools={}, extra_env={"ATOMICTOOLS_JS_RUNTIME": bun, "ATOMICTOOLS_JS_PACKAGES": str(AGENTS),
                                                       "ATOMICTOOLS_BUILTINS": "0"}) as fresh:
                fresh.stop(remove=False)  # only its dirs: the call below starts the daemon
                (fresh.project / ".opencode" / "tools").mkdir(parents=True)
                (fresh.project / ".opencode" / "tools" / "hello.ts").write_text(HELLO_TS)
                started = time.perf_counter()
                done = subprocess.run([CONSOLE, "call", "hello", "name=A"], env=fresh.env, cwd=fresh.project,
                                      capture_output=True, text=True, timeout=120)
                ours.samples.append(time.perf_counter() - started)
                assert done.stdout.strip() == "hello A", done.stdout + done.stderr
                subprocess.run([CONSOLE, "stop"], env=fresh.env, cwd=fresh.project, capture_output=True, timeout=60)
        rows.append(["atomictoolsd call, the daemon started by it (Bun)", runs, ours.ms()["p50_ms"], ours.ms()["min_ms"]])
    return Table(
        "javascript_opencode", "One call of an OpenCode tool file from nothing, against OpenCode itself",
        ["what", "runs", "p50 ms", "min ms"], rows,
        ["OpenCode installs @opencode-ai/plugin into .opencode/ on its first run (not counted); "
         "the daemon reads it from its support packages and writes nothing there"],
    )


def measure(quick: bool) -> Report:
    found = runtimes()
    edits, calls, rounds = (10, 300, 2) if quick else (40, 500, 12)
    report = Report("javascript")
    report.tables.append(save_latency(found["bun"], edits))
    table, data = call_latency(found, calls, rounds)
    report.tables.append(table)
    report.data["calls"] = data
    report.tables.append(idle_memory(found))
    opencode = against_opencode(found["bun"], 3 if quick else 8)
    if opencode is not None:
        report.tables.append(opencode)
    report.data["runtimes"] = found
    return report


def main() -> None:
    quick_main(measure, __doc__)


if __name__ == "__main__":
    main()
