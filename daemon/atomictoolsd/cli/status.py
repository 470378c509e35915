"""The human form of ``atomic/status`` (``atomictoolsd status``).

At a glance: the process, where it listens (socket, HTTP), the service manager, sessions, workers,
the projects with their trust and modules, what is wrong (load errors, a configuration that did not
load, settings waiting for a restart, modules held for review) and the settings not at their
defaults. ``--verbose`` adds every module with its worker and calls, and each section a part of
the daemon adds (watcher, monitor, cache, bridges, …). Lines fit the terminal's width: text wraps,
a table gives up its widest column first (long values shortened with "…") and wraps its other
columns when that is not enough. Output that goes to a pipe or a file keeps every line whole,
unless ``COLUMNS`` gives a width.

Every value a repository can choose (a path, a tool's name, a load error) is escaped (``safe``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import textwrap
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any, TextIO

from atomictoolsd.cli._common import safe, shown_command, where
from atomictoolsd.config.command import command_name

__all__ = ["output_width", "render", "render_others"]

LABEL = 10  # "socket    ": the width of a line's label
_MIN_COLUMN = 16  # a shortened column keeps at least this many characters
_CORE_KEYS = frozenset({
    "pid", "version", "python", "started", "uptime", "socket", "service", "forkserver", "confinedForkservers",
    "workerSlots", "sessions",
    "projects", "modules", "skipped", "config", "configSources", "configIgnored", "configFile", "log", "reload",
    "sandbox", "http",
})


def output_width(stream: TextIO) -> int | None:
    """The width lines must fit: the terminal's, or ``COLUMNS``; None (no limit) for a pipe or file
    without ``COLUMNS``, so that what a script reads is never cut."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    try:
        return shutil.get_terminal_size().columns if stream.isatty() else None
    except (AttributeError, ValueError, OSError):
        return None


class Lines:
    """Lines of output kept within ``width`` (None: as long as they are)."""

    def __init__(self, width: int | None) -> None:
        self.width = width if width is None else max(width, 20)
        self.lines: list[str] = []

    def field(self, label: str, text: str) -> None:
        """``label`` in its column, then ``text``, wrapped under itself."""
        self.text(f"{label:<{LABEL}}{text}", indent=LABEL)

    def text(self, text: str, indent: int = 0) -> None:
        for line in text.split("\n"):
            if self.width is None or len(line) <= self.width:
                self.lines.append(line)
            else:
                self.lines += textwrap.wrap(line, self.width, subsequent_indent=" " * min(indent, self.width // 2),
                                            break_on_hyphens=False) or [""]

    def blank(self) -> None:
        if self.lines and self.lines[-1]:
            self.lines.append("")

    def table(self, headers: Sequence[str], rows: Sequence[Sequence[Any]], shrink: Sequence[int] = (0,)) -> None:
        """Left-aligned columns. Too wide: the columns of ``shrink`` give up their width first (a
        value loses its start: "…" and the end of a path), then the other columns go on further
        tables, each beside the first column."""
        cells = [[str(c) for c in headers], *[[str(c) for c in row] for row in rows]]
        widths = self._widths(cells, shrink)
        cells = [[_shorten(c, w) for c, w in zip(row, widths, strict=True)] for row in cells]
        for number, group in enumerate(self._groups(widths)):
            if number:
                self.lines.append("")
            for row in cells:
                line = "  ".join(row[i].ljust(widths[i]) for i in group).rstrip()
                self.lines.append(line if self.width is None else _shorten(line, self.width, end=True))

    def _widths(self, cells: list[list[str]], shrink: Sequence[int]) -> list[int]:
        """Each column's width: as wide as its widest cell, unless the table would not fit. Then the
        ``shrink`` columns give up what it takes, down to ``_MIN_COLUMN``; and when that is not
        enough either (the columns will wrap), each keeps up to half the width."""
        widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
        if self.width is None:
            return widths
        floor = [max(_MIN_COLUMN, len(cells[0][i])) if i in shrink else widths[i] for i in range(len(widths))]
        narrowest = [min(w, f) for w, f in zip(widths, floor, strict=True)]
        if sum(narrowest) + 2 * (len(widths) - 1) > self.width:
            return [min(w, max(f, self.width // 2)) if i in shrink else w
                    for i, (w, f) in enumerate(zip(widths, narrowest, strict=True))]
        for column in shrink:
            excess = sum(widths) + 2 * (len(widths) - 1) - self.width
            if excess > 0:
                widths[column] = max(narrowest[column], widths[column] - excess)
        return widths

    def _groups(self, widths: list[int]) -> list[list[int]]:
        """The columns each printed table holds: all, or the first with as many of the others as fit."""
        if self.width is None or sum(widths) + 2 * (len(widths) - 1) <= self.width:
            return [list(range(len(widths)))]
        groups: list[list[int]] = [[0]]
        for i in range(1, len(widths)):
            used = sum(widths[j] + 2 for j in groups[-1])
            if len(groups[-1]) > 1 and used + widths[i] > self.width:
                groups.append([0])
            groups[-1].append(i)
        return groups


def _shorten(text: str, width: int, end: bool = False) -> str:
    """``text`` within ``width``: its start replaced by "…" (a path keeps its end), or its end (``end``)."""
    if len(text) <= width:
        return text
    return text[: width - 1] + "…" if end else "…" + text[len(text) - width + 1:]


def render(status: dict[str, Any], *, verbose: bool = False, width: int | None = None,
           others: Sequence[dict[str, Any]] = ()) -> list[str]:
    """The lines ``atomictoolsd status`` prints for ``status``; ``others``: the user's daemons in
    other runtime dirs."""
    out = Lines(width)
    _header(out, status, verbose)
    _projects(out, status)
    _problems(out, status)
    if verbose:
        _modules(out, status)
        for name, value in status.items():  # sections other parts of the daemon add (bridges, …)
            if name not in _CORE_KEYS:
                _section(out, name, value)
    _settings(out, status, verbose)
    _others(out, others)
    if not verbose:
        out.blank()
        out.text(f"(`{command_name()} status -v`: every module, worker and component; --json: all of it)")
    return out.lines


def _header(out: Lines, status: dict[str, Any], verbose: bool) -> None:
    out.text(f"atomictoolsd {status['version']}  pid {status['pid']}  up {_duration(status['uptime'])}")
    out.field("socket", safe(status["socket"]))
    http = status.get("http")
    if http:
        if http.get("url"):
            token = (f"token in {safe(http.get('tokenFile'))}" if verbose
                     else f"token: `{command_name()} http token --show`")
            out.field("http", f"{http['url']}  ({token})")
        else:
            out.field("http", f"not served: {http.get('error')}")
    out.field("service", _service(status.get("service") or {}))
    sessions = status.get("sessions") or []
    agents = Counter(str(s.get("agent") or "?") for s in sessions)
    out.field("sessions", f"{len(sessions)}" + (f" ({', '.join(f'{a} {n}' for a, n in sorted(agents.items()))})"
                                               if agents else ""))
    fork = status.get("forkserver") or {"pid": None, "workers": 0}
    confined = status.get("confinedForkservers") or []  # one per project with confined workers
    workers = fork.get("workers", 0) + sum(c.get("workers", 0) for c in confined)
    slots = status.get("workerSlots") or {}
    limit = (f", at most {slots['max']} at once" + (f", {slots['waiting']} waiting to start" if slots.get("waiting") else "")
             if slots else "")
    pids = ", ".join(str(c["pid"]) for c in confined if c.get("pid"))
    out.field("workers", f"{workers} running{limit}" + (f"  (fork server pid {fork.get('pid') or '-'}" + (
        f", confined: pid {pids})" if pids else ")") if verbose else ""))
    _sandbox(out, status, verbose)
    log = status.get("log") or {}
    if log.get("file"):
        out.field("log", safe(log["file"]) + (f" ({log.get('level')})" if verbose else ""))
    _reload(out, status, verbose)
    for note in (status.get("configIgnored") or {}).values():
        out.field("config", str(note))
    bridges = status.get("bridges")
    if isinstance(bridges, list) and bridges and not verbose:
        out.field("bridges", f"{len(bridges)} (status --verbose lists them)")


def _service(service: dict[str, Any]) -> str:
    manager = str(service.get("manager", "none"))
    if manager == "none":
        return manager
    unit = f" ({service['unit']})" if service.get("unit") else ""
    manager += unit + (", socket-activated" if service.get("activated") else "")
    watchdog = service.get("watchdogSec")
    return manager + (f", watchdog {watchdog:g} s" if watchdog else "")


def _sandbox(out: Lines, status: dict[str, Any], verbose: bool) -> None:
    """What this kernel lets ``trust --sandbox`` enforce, or why it cannot; how the built-ins run."""
    sandbox = status.get("sandbox")
    if not sandbox:
        return
    builtins = (status.get("config") or {}).get("builtins", True)
    if not sandbox["available"]:
        out.field("sandbox", f"unavailable: {sandbox['reason']}")
        if builtins:
            out.field("", "built-in tools: not confined (atomictoolsd's own code, one worker for every project)")
        return
    if verbose:
        out.field("sandbox", f"Landlock ABI {sandbox['abi']}: confines {', '.join(sandbox['enforced'])}")
        network = sandbox.get("network")
        if network:
            out.field("", "network (--allow-net): " + ("from a namespace of its own, through the daemon's proxy"
                                                       if network["available"] else f"none: {network['reason']}"))
    else:
        out.field("sandbox", f"Landlock ABI {sandbox['abi']}: `trust --sandbox` confines a project's tools")
    if builtins:
        out.field("", "built-in tools: confined to the project they are called for (read-only)")


def _reload(out: Lines, status: dict[str, Any], verbose: bool) -> None:
    """The last SIGHUP: a configuration that did not load, and settings that wait for a restart."""
    reload = status.get("reload")
    if not reload:
        return
    at = time.strftime("%H:%M:%S", time.localtime(reload["at"]))
    config_error = reload.get("configError")
    if config_error:
        out.field("config", f"NOT reloaded at {at}, the previous configuration stays in force: {config_error}")
    elif verbose:
        out.field("config", f"reloaded at {at}")
    for key, value in (reload.get("waiting") or {}).items():
        out.field("config", f"{key} = {json.dumps(value)} waits for a restart (in force: "
                            f"{json.dumps(status['config'].get(key))}; run: {command_name()} restart)")


def _projects(out: Lines, status: dict[str, Any]) -> None:
    """Each project with its trust and its own modules, then the global and built-in tools."""
    modules = status.get("modules") or []
    rows = []
    for project in status.get("projects") or []:
        own = [m for m in modules if m.get("scope") == "local" and _within(m["path"], (project.get("dirs") or [""])[0])]
        rows.append([safe(project["root"]), project.get("trust") or "-", _count(own), project["tools"]])
    out.blank()
    if rows:
        out.table(["PROJECT", "TRUST", "MODULES", "TOOLS"], rows)
    else:
        out.text("no project has been used since the daemon started")
    for scope, label in (("global", "global"), ("builtin", "built-in")):
        mine = [m for m in modules if m.get("scope") == scope and not (scope == "builtin" and m.get("project"))]
        if mine or scope == "global":
            tools = sum(len(m.get("tools") or []) for m in mine)
            out.field(label, f"{_count(mine)} modules, {tools} tools")


def _within(path: str, directory: str) -> bool:
    return bool(directory) and (path == directory or path.startswith(directory.rstrip("/") + "/"))


def _count(modules: list[dict[str, Any]]) -> str:
    """How many modules, and how many of them do not serve."""
    failed = sum(m.get("state") in ("failed", "failing") for m in modules)
    return f"{len(modules)}" + (f" ({failed} failed)" if failed else "")


def _problems(out: Lines, status: dict[str, Any]) -> None:
    """What does not work, each on its line (where, then what): read first, fix first."""
    found: list[tuple[str, str]] = []
    http = status.get("http") or {}
    confined = status.get("confinedForkservers") or []
    for problem in ((status.get("forkserver") or {}).get("problem"),
                    *(c.get("problem") and f"{c.get('project')}: {c['problem']}" for c in confined)):
        if problem:
            found.append(("workers", str(problem)))
    for m in status.get("modules") or []:
        if m.get("error"):
            found.append((where(m["error"]), _first_lines(str(m["error"].get("message", "")), 1)))
        if m.get("retryIn"):
            found.append((safe(m["path"]), f"its worker keeps crashing; next try in {m.get('retryIn'):g} s"))
        for problem in m.get("problems") or []:  # tools a module skipped (a malformed JSON tool)
            tool = f"tool {problem['tool']!r}: " if problem.get("tool") else ""
            found.append((where(problem), tool + _first_lines(str(problem.get("message", "")), 1)))
    for entry in status.get("skipped") or []:
        found.append((safe(entry["file"]), f"not loaded: {entry['message']}"))
    held = Counter(str(m["held"]["command"]) for m in status.get("modules") or [] if isinstance(m.get("held"), dict))
    for command, count in sorted(held.items()):
        found.append((f"{count} module(s)", f"tool code that arrived through git awaits your review: {command}"))
    if http.get("error") and http.get("url"):
        found.append(("http", str(http["error"])))
    if not found:
        return
    out.blank()
    out.text("problems")
    for place, what in found:  # every one: each is yours to fix
        if out.width is not None:  # a long path gives up its start, so that what went wrong shows
            place = _shorten(place, max(_MIN_COLUMN * 2, out.width - 4 - len(what)))
        out.text(f"  {place}: {what}", indent=4)


def _modules(out: Lines, status: dict[str, Any]) -> None:
    modules = [{**m, "scope": _scope(m)} for m in status.get("modules") or []]
    if not modules:
        return
    out.blank()
    out.table(
        ["MODULE", "SCOPE", "STATE", "TOOLS", "WORKER", "RSS", "CALLS", "FAILED", "CANCELLED", "P50 MS", "P99 MS"],
        [
            [
                safe(m["path"]), m["scope"], _state(m), len(m["tools"]), m["worker"] or "-", _size(m.get("rss")),
                m["calls"], m.get("failedCalls"), m.get("cancelled", 0),
                _ms(m.get("p50Ms")), _ms(m.get("p99Ms")),
            ]
            for m in modules
        ],
        shrink=(0, 1),
    )
    for m in modules:
        if not m["error"] and m.get("lastError"):
            out.blank()
            out.text(f"{safe(m['path'])}: last error: {_first_lines(m.get('lastError'))}", indent=2)
        if m.get("blockedReason"):
            out.blank()
            out.text(f"{safe(m['path'])}: blocked: {m.get('blockedReason')}", indent=2)
        if isinstance(m.get("held"), dict):
            out.blank()
            out.text(f"{safe(m['path'])}: held: {m['held'].get('message', '')}", indent=2)


def _settings(out: Lines, status: dict[str, Any], verbose: bool) -> None:
    """The settings not at their defaults, and where each came from (``config`` lists them all)."""
    sources = status.get("configSources") or {}
    out.blank()
    if not sources:
        out.text(f"configuration: all defaults (`{command_name()} config` lists them)")
        return
    out.table(["SETTING", "VALUE", "FROM"],
              [[key, json.dumps(status["config"].get(key)), safe(source)] for key, source in sorted(sources.items())],
              shrink=(2, 1))
    out.text(f"(every other setting has its default: `{command_name()} config`)")


def render_others(others: Sequence[dict[str, Any]], width: int | None) -> list[str]:
    """The lines that name the user's daemons in other runtime dirs (none: no line)."""
    out = Lines(width)
    _others(out, others)
    return out.lines


def _others(out: Lines, others: Sequence[dict[str, Any]]) -> None:
    """The user's daemons in other runtime dirs: invisible otherwise to a CLI that asks one socket."""
    if not others:
        return
    out.blank()
    out.text("other daemons of yours, each in another runtime dir (`ATOMICTOOLS_RUNTIME_DIR=DIR atomictoolsd "
             "status` shows one):")
    out.table(["PID", "SOCKET"], [[d["pid"], shown_command([d["socket"]])] for d in others], shrink=(1,))


def _section(out: Lines, name: str, value: Any) -> None:
    out.blank()
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        headers = list(dict.fromkeys(k for item in value for k in item))
        out.table([_label(h).upper() for h in headers], [[_cell(item.get(h)) for h in headers] for item in value],
                  shrink=tuple(range(len(headers) - 1, -1, -1)))
    elif isinstance(value, list) and not value:
        out.text(f"{name}: none")
    elif isinstance(value, dict):
        # One setting or counter a line, lists one item a line: a person reads down, not across.
        out.text(name)
        value = {_label(k): v for k, v in value.items()}
        width = max((len(k) for k in value), default=0)
        for key, item in value.items():
            items = item if isinstance(item, list) and item else (["none"] if item == [] else [item])
            for index, one in enumerate(items):
                label = key if index == 0 else ""
                out.text(f"  {label.ljust(width)}  {_cell(one)}".rstrip(), indent=width + 4)
    else:
        out.text(f"{name}: {json.dumps(value)}")


def _scope(module: dict[str, Any]) -> str:
    """A module's scope as the table shows it: where it runs confined, and a built-in's project."""
    if not module.get("confined"):
        return str(module["scope"])
    if module.get("project"):
        return f"{module['scope']} (confined to {safe(module['project'])})"
    return f"{module['scope']} (confined)"


def _label(key: str) -> str:
    """``debounceMs`` → ``debounce ms``: a key as words."""
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r" \1", key).replace("_", " ").lower()


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    return safe(value) if isinstance(value, str) else json.dumps(value)


def _state(module: dict[str, Any]) -> str:
    worker = module.get("workerState")
    if module["state"] == "ready" and worker and worker != "ready":
        return f"ready/{worker}"
    return str(module["state"]) if module["state"] != "ready" or worker else "ready/idle"


def _size(rss: int | None) -> str:
    if not rss:
        return "-"
    return f"{rss / (1024 * 1024):.1f}M"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def _first_lines(text: str, limit: int = 3) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return "\n  ".join(lines[:limit]) + (" …" if len(lines) > limit else "")


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"
