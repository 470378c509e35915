"""Scale: 1,000 tool modules across 50 projects — listing, memory, and the first call of a module.

    python bench/scale.py [--quick] [--projects 50] [--modules 20]

Each of 50 projects has 20 tool modules of one tool each (a typical small tool: two parameters with
descriptions and a constraint), every project trusted. One connection per project attaches to it,
all at once, and the daemon is measured twice:

1. **first-ever scan** (no definition cache): to learn a module's tools the daemon must import it,
   so each module is loaded in a worker; the daemon keeps no more than ``max_idle_workers`` (32)
   of them idle, the least recently used going first. Measured: attach of all projects → every
   answer (the scan), workers alive at that moment and again once the worker monitor has looked
   (1.5 s later), the daemon's RSS, the workers' RSS and USS (memory only that worker uses: forked
   workers share the rest), ``tools/list`` latency in each project, and the first call of a module
   (most modules' scan worker is gone by then: a fork and an import).
2. **after a restart** (definition cache warm): listing must start no worker. Measured: start →
   ready, attach of all projects → every answer, workers alive afterwards (0 expected), daemon RSS
   and RSS per idle module (the growth from attaching, divided by the modules), ``tools/list``
   latency, and the first call of a cold module: no worker runs, so the call waits for a fork, the
   module's import and its schemas. The very first call of the daemon's life also starts the fork
   server; it is reported apart.

Then, apart: ``tools/list`` when one session sees 1,000 tools (50 global modules of 20 tools each),
walking every page (``page_size`` 500) and with one page, timed to the answer's last byte.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rawsocket import RawConnection  # noqa: E402

from common import MODES, DaemonUnderTest, Report, Stats, Table, affinity, run_alone  # noqa: E402

MODULE = '''from typing import Annotated

from atomictools import Field


def {name}(
    path: Annotated[str, Field("A file of the project, relative to its root")],
    limit: Annotated[int, Field("Lines to return at most", ge=1)] = 100,
) -> str:
    """Tool {module} of project {project}: the first lines of a file."""
    return f"{{path}}:{{limit}}"
'''

WIDE_MODULE_TOOL = '''
@tool
def t{index}(text: str, count: int = 1) -> str:
    """Tool {index} of module {module}."""
    return text * count
'''


def layout(root: Path, projects: int, modules: int) -> list[tuple[Path, list[str]]]:
    """Write the projects; return each project's directory and tool names."""
    out = []
    for p in range(projects):
        directory = root / "projects" / f"p{p:02d}"
        tools = directory / ".atomic" / "tools"
        tools.mkdir(parents=True)
        names = []
        for m in range(modules):
            name = f"p{p:02d}_t{m:02d}"
            (tools / f"{name}.py").write_text(MODULE.format(name=name, module=m, project=p))
            names.append(name)
        out.append((directory, names))
    return out


def workers_of(daemon: DaemonUnderTest) -> list[psutil.Process]:
    """The daemon's tool workers: the fork server's children (a process that ends meanwhile is none)."""
    workers: list[psutil.Process] = []
    for child in psutil.Process(daemon.pid).children():
        try:
            workers += child.children()
        except psutil.Error:
            continue
    return workers


def memory(daemon: DaemonUnderTest, sample: int = 100) -> dict[str, Any]:
    """The daemon's RSS, and the workers' count, RSS and USS (USS measured on up to ``sample``)."""
    return memory_of(psutil.Process(daemon.pid), workers_of(daemon), sample)


def memory_of(daemon: psutil.Process, workers: list[psutil.Process], sample: int = 100) -> dict[str, Any]:
    """As ``memory``; a worker that exits while it is measured (the idle reaper, a retired
    generation) is left out rather than ending the whole run."""
    rss = [r for r in (_read(w, lambda p: p.memory_info().rss) for w in workers) if r is not None]
    step = max(1, len(workers) // sample)
    uss = [u for u in (_read(w, lambda p: p.memory_full_info().uss) for w in workers[::step]) if u is not None]
    out: dict[str, Any] = {"daemon_rss_mb": round(daemon.memory_info().rss / 2**20, 1), "workers": len(rss)}
    if rss and uss:
        out.update(
            workers_rss_mb_each=round(sum(rss) / len(rss) / 2**20, 2),
            workers_uss_mb_each=round(sum(uss) / len(uss) / 2**20, 2),
            workers_uss_mb_total=round(sum(uss) / len(uss) * len(rss) / 2**20, 1),
        )
    return out


def _read(process: psutil.Process, what: Any) -> int | None:
    try:
        return int(what(process))
    except psutil.Error:  # NoSuchProcess, ZombieProcess, AccessDenied: gone while we looked
        return None


def attach_all(daemon: DaemonUnderTest, projects: list[tuple[Path, list[str]]]) -> tuple[list[RawConnection], float]:
    """One connection per project, all attaching at once; seconds until every answer arrived."""
    connections = [RawConnection(daemon.socket, timeout=None) for _ in projects]
    started = time.perf_counter()
    ids = [c.send_request("atomic/attach", {"directory": str(d)}) for c, (d, _) in zip(connections, projects, strict=True)]
    for connection, request_id, (directory, names) in zip(connections, ids, projects, strict=True):
        result = connection.answer(request_id)
        if result["errors"] or result["toolCount"] < len(names):
            raise RuntimeError(f"{directory}: {result}")
    elapsed = time.perf_counter() - started
    for connection in connections:
        connection.result("initialize", {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "b"}})
    return connections, elapsed


def list_latency(connections: list[RawConnection], rounds: int) -> Stats:
    stats = Stats()
    for _ in range(rounds):
        for connection in connections:
            started = time.perf_counter()
            tools = connection.result("tools/list")["tools"]
            stats.samples.append(time.perf_counter() - started)
            assert tools
    return stats


def first_calls(connections: list[RawConnection], projects: list[tuple[Path, list[str]]], index: int) -> Stats:
    """The first call of tool ``index`` of each project."""
    stats = Stats()
    for connection, (_, names) in zip(connections, projects, strict=True):
        started = time.perf_counter()
        result = connection.result("tools/call", {"name": names[index], "arguments": {"path": "a.txt"}})
        stats.samples.append(time.perf_counter() - started)
        if result.get("isError"):
            raise RuntimeError(result)
    return stats


def run_mode(projects_n: int, modules_n: int, rounds: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    # What is measured is each project's whole first scan, so an attach must answer only once every
    # module has loaded: a load_wait longer than any scan here (by default an attach answers after
    # 2 s with the modules still loading, and their tools follow with list_changed).
    daemon = DaemonUnderTest(tools={}, extra_env={"ATOMICTOOLS_LOAD_WAIT": "300"})
    try:
        projects = layout(daemon.root, projects_n, modules_n)
        daemon.start()
        out["first_ready_ms"] = round((daemon.ready_s or 0) * 1000, 1)
        time.sleep(0.5)  # the built-in tools' first scan
        before = memory(daemon)
        connections, scan_s = attach_all(daemon, projects)
        after = memory(daemon)
        time.sleep(1.5)  # the worker monitor looks twice a second
        settled = memory(daemon)
        out["first_scan"] = {
            "attach_all_s": round(scan_s, 2), "before_attach": before, "after_attach": after, "settled": settled,
            "tools_list": list_latency(connections, rounds).ms(),
            "first_call_warm_worker": first_calls(connections, projects, 0).ms(),
        }
        for connection in connections:
            connection.close()
        daemon.stop(remove=False)

        daemon.start()
        out["restart_ready_ms"] = round((daemon.ready_s or 0) * 1000, 1)
        time.sleep(0.5)
        before = memory(daemon)
        connections, scan_s = attach_all(daemon, projects)
        after = memory(daemon)
        modules = projects_n * modules_n
        status = daemon.request("atomic/status")
        lists = list_latency(connections, rounds).ms()
        very_first = first_calls(connections[:1], projects[:1], 0).ms()
        cold = first_calls(connections[1:], projects[1:], 0).ms()
        warm = first_calls(connections, projects, 0).ms()
        out["restart"] = {
            "attach_all_s": round(scan_s, 3), "before_attach": before, "after_attach": after,
            "rss_kb_per_idle_module": round((after["daemon_rss_mb"] - before["daemon_rss_mb"]) * 1024 / modules, 1),
            "cache": status.get("cache"), "tools_list": lists,
            "first_call_of_the_daemon_ms": very_first["p50_ms"], "first_call_cold_module": cold,
            "second_call": warm, "workers_after_calls": len(workers_of(daemon)),
        }
        for connection in connections:
            connection.close()
    finally:
        daemon.stop()
    out["wide"] = wide(rounds)
    return out


def wide(rounds: int) -> dict[str, Any]:
    """tools/list when one session sees 1,000 tools: 50 global modules of 20 tools each."""
    tools = {
        f"w{m:02d}": "from atomictools import tool\n" + "".join(WIDE_MODULE_TOOL.format(index=i, module=m) for i in range(20))
        for m in range(50)
    }
    out: dict[str, Any] = {}
    for page_size in (500, 1000):
        with DaemonUnderTest(tools=tools, extra_env={"ATOMICTOOLS_PAGE_SIZE": str(page_size)}) as daemon:
            connection = RawConnection(daemon.socket, timeout=None)
            connection.result("atomic/attach", {"directory": str(daemon.project)})
            stats, pages, count = Stats(), 0, 0
            for _ in range(rounds * 10):
                # Timed to the answer's last byte: parsing ~350 KB of JSON in Python is the client's
                # cost (a few ms), not the daemon's. The cursor is read after the clock stops.
                cursor, pages, count, elapsed = None, 0, 0, 0.0
                while True:
                    started = time.perf_counter()
                    connection.send_request("tools/list", {"cursor": cursor} if cursor else {})
                    line = connection.file.readline()
                    elapsed += time.perf_counter() - started
                    result = json.loads(line)["result"]
                    pages += 1
                    count += len(result["tools"])
                    cursor = result.get("nextCursor")
                    if not cursor:
                        break
                stats.samples.append(elapsed)
            connection.close()
            out[f"page_size_{page_size}"] = {"tools": count, "pages": pages, **stats.ms()}
    return out


def measure(quick: bool = False, projects: int = 50, modules: int = 20) -> Report:
    if quick:
        projects, modules = 10, 10
    rounds = 5 if quick else 20
    report = Report("scale", data={"projects": projects, "modules_per_project": modules, "rounds": rounds})
    rows: list[list[Any]] = []
    memory_rows: list[list[Any]] = []
    for mode, pinned in MODES:
        with affinity(pinned):
            result = run_mode(projects, modules, rounds)
        report.data[mode] = result
        first, again = result["first_scan"], result["restart"]
        rows += [
            ["first-ever scan: attach all projects → all answered", mode, 1, first["attach_all_s"] * 1000, None],
            ["first-ever scan: tools/list in a project", mode, first["tools_list"]["n"], first["tools_list"]["p50_ms"],
             first["tools_list"]["p99_ms"]],
            ["first-ever scan: first call of a module, 1.5 s after the scan", mode,
             first["first_call_warm_worker"]["n"], first["first_call_warm_worker"]["p50_ms"],
             first["first_call_warm_worker"]["p99_ms"]],
            ["restart: serve → ready", mode, 1, result["restart_ready_ms"], None],
            ["restart: attach all projects → all answered (cache)", mode, 1, again["attach_all_s"] * 1000, None],
            ["restart: tools/list in a project", mode, again["tools_list"]["n"], again["tools_list"]["p50_ms"],
             again["tools_list"]["p99_ms"]],
            ["restart: the daemon's first call (starts the fork server)", mode, 1, again["first_call_of_the_daemon_ms"], None],
            ["restart: first call of a cold module (fork + import)", mode, again["first_call_cold_module"]["n"],
             again["first_call_cold_module"]["p50_ms"], again["first_call_cold_module"]["p99_ms"]],
            ["restart: second call of that module", mode, again["second_call"]["n"], again["second_call"]["p50_ms"],
             again["second_call"]["p99_ms"]],
        ]
        for label, key in (("1,000 tools, page_size 500 (walk both pages)", "page_size_500"),
                           ("1,000 tools, page_size 1000 (one page)", "page_size_1000")):
            w = result["wide"][key]
            rows.append([f"one session sees {label}", mode, w["n"], w["p50_ms"], w["p99_ms"]])
        fa, fs, ra = first["after_attach"], first["settled"], again["after_attach"]
        memory_rows += [
            ["first-ever scan, as it ends", mode, fa["workers"], fa["daemon_rss_mb"], fa.get("workers_rss_mb_each"),
             fa.get("workers_uss_mb_each"), fa.get("workers_uss_mb_total"), None],
            ["first-ever scan, 1.5 s later", mode, fs["workers"], fs["daemon_rss_mb"], fs.get("workers_rss_mb_each"),
             fs.get("workers_uss_mb_each"), fs.get("workers_uss_mb_total"), None],
            ["restart (cache), before any call", mode, ra["workers"], ra["daemon_rss_mb"], None, None, None,
             again["rss_kb_per_idle_module"]],
        ]
    report.tables.append(Table(
        "scale-latency", f"{projects * modules:,} tool modules across {projects} projects (ms)",
        ["what", "mode", "n", "p50 ms", "p99 ms"], rows,
        [f"Each project: {modules} modules of one tool, plus the 4 built-in tools; a tools/list answers "
         f"{modules + 4} tools."],
    ))
    report.tables.append(Table(
        "scale-memory", f"memory with {projects * modules:,} modules attached",
        ["when", "mode", "workers", "daemon RSS MB", "RSS MB / worker", "USS MB / worker", "USS MB all workers",
         "daemon KB / idle module"],
        memory_rows,
        ["USS: memory only that worker uses (the rest it shares with the fork server it was forked from). "
         "Daemon KB / idle module: the daemon's RSS growth from attaching every project, per module."],
    ))
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="10 projects of 10 modules, fewer rounds")
    parser.add_argument("--projects", type=int, default=50)
    parser.add_argument("--modules", type=int, default=20, help="modules per project")
    args = parser.parse_args()
    run_alone(measure(args.quick, args.projects, args.modules))


if __name__ == "__main__":
    main()
