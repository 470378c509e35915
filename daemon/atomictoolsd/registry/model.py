"""What the registry is made of: a tool (``ToolDef``), a tool module (``Module``), a tools directory
(``ToolsDir``), a project and the dirs it sees (``Project``), a project's merged ``View``, and the
``Change`` its listeners are told.

Plain state and the rules that read it (precedence, what a session may see); scanning, loading and
committing are the registry's (``scanning``, ``commits``). Knows nothing of sockets or sessions.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from atomictools._protocol import WRITTEN_SCHEMA
from atomictoolsd.config.discovery import ModuleFile, Skipped, may_hold_modules
from atomictoolsd.pool.javascript.definitions import RUNTIME_KEY
from atomictoolsd.pool.pool import ModuleRunner
from atomictoolsd.protocol import NEEDS_TRUSTED_DIRECTORY
from atomictoolsd.registry.content import Hold, Verdict, held_entry
from atomictoolsd.registry.trust import trust_offer

__all__ = ["Change", "DirListener", "Judgement", "LateLoad", "Listener", "Module", "Project", "Scope", "ToolDef", "ToolsDir", "View"]

_json = msgspec.json.encode

Scope = str  # "local" | "global" | "builtin"
Judgement = tuple[bool, "dict[str, Any] | None", "str | None"]  # see Registry's ``judge``


class LateLoad:
    """A load of ``file`` committed on its own once done; ``done`` resolves when the module's load
    has been committed (or given up: the file went, the dir was forgotten)."""

    __slots__ = ("done", "file", "task")

    def __init__(self, file: ModuleFile, task: asyncio.Future[Any], done: asyncio.Future[None]) -> None:
        self.file = file
        self.task = task
        self.done = done

    def settle(self) -> None:
        """Let whoever waits for this load go on (it was committed, or given up)."""
        if not self.done.done():
            self.done.set_result(None)


class ToolDef:
    """One tool as the daemon serves it: its MCP definition (pre-encoded) and the module behind it."""

    __slots__ = (
        "_variants", "definition", "encoded", "encoded_as_written", "module", "name", "needs_trusted_directory",
        "runtime", "timeout", "written",
    )

    def __init__(self, module: Module, definition: dict[str, Any]) -> None:
        definition = dict(definition)
        timeout = definition.pop("timeout", None)
        self.runtime: str | None = definition.pop(RUNTIME_KEY, None)  # "bun 1.4.5": a TypeScript/JavaScript tool's
        written = definition.pop(WRITTEN_SCHEMA, None)
        # Where, relative to the caller's directory, it runs a program that may run what the
        # directory holds: only where the user trusts that directory. None: nowhere.
        where = definition.pop(NEEDS_TRUSTED_DIRECTORY, None)
        self.needs_trusted_directory: str | None = where if isinstance(where, str) else None
        self.name: str = definition["name"]
        self.module = module
        self.definition = definition
        self.timeout: float | None = timeout
        # The portable form, for the agents that take nothing else (PORTABLE_ONLY_CLIENTS): a schema
        # every agent accepts (Gemini: no $defs), and a description (Qwen Code offers its model no
        # tool without one).
        portable = _portable(definition)
        # The schema as its author wrote it, for clients that take JSON Schema 2020-12 whole.
        self.written = written
        self.encoded_as_written = _json(definition if written is None else {**definition, "inputSchema": written})
        same = portable is definition and written is None
        self.encoded = self.encoded_as_written if same else _json(portable)
        self._variants: dict[tuple[frozenset[str], bool], bytes] = {}

    def encoded_for(self, dropped: frozenset[str], as_written: bool) -> bytes:
        """The definition without the fields in ``dropped`` (a client of an older MCP revision), with
        the schema as written or portable; made once per combination."""
        if not dropped:
            return self.encoded_as_written if as_written else self.encoded
        key = (dropped, as_written)
        found = self._variants.get(key)
        if found is None:
            shaped = {k: v for k, v in self.definition.items() if k not in dropped}
            if not as_written:
                shaped = _portable(shaped)
            elif self.written is not None:
                shaped["inputSchema"] = self.written
            found = self._variants[key] = _json(shaped)
        return found

    def listing(self, shadowed_by: ToolDef | None = None) -> dict[str, Any]:
        """The definition plus where it comes from, for ``atomictoolsd list --json``; with
        ``shadowed_by``, the tool of the same name that wins over this one."""
        listed = {
            **self.definition, "scope": self.module.scope, "kind": self.module.kind, "path": self.module.path,
            "confined": self.module.confined,
            **({"held": True} if self.module.hold is not None else {}),
            **({"runtime": self.runtime} if self.runtime else {}),
        }
        if shadowed_by is not None:
            listed["shadowedBy"] = {"scope": shadowed_by.module.scope, "path": shadowed_by.module.path}
        return listed


def _portable(definition: dict[str, Any]) -> dict[str, Any]:
    """``definition`` as the agents that take only the portable form get it: with a description
    (its title, or its name, said to be all there is) where its author wrote none."""
    if definition.get("description"):
        return definition
    described = definition.get("title") or definition["name"]
    return {**definition, "description": f"{described} (its author wrote no description)"}


class Module:
    """One tool module file and its current state: ``pending``, ``loading`` (seen for the first time,
    its first load outlived a scan's ``load_wait``), ``ready``, ``failed``, ``blocked``, ``held`` (its
    content came through git, unreviewed, and this machine cannot confine it: ``holding``) or
    ``failing`` (it loaded, but its workers keep crashing).

    ``error`` says why a failed module failed (or what a failing one keeps dying of); ``problems``
    lists the tools a ready module skipped (``{tool, line, message}``), so its other tools serve.
    """

    def __init__(self, tools_dir: ToolsDir, file: ModuleFile, runner: ModuleRunner) -> None:
        self.tools_dir = tools_dir
        self.path = file.path
        self.kind = file.kind
        self.file = file
        self.runner = runner
        self.state = "pending"
        self.file_seen = time.time()  # when this daemon first saw the file (for a module still loading)
        self.tools: dict[str, ToolDef] = {}
        self.error: dict[str, Any] | None = None
        self.problems: list[dict[str, Any]] = []
        self.load_ms: float | None = None
        self.loaded_at: float | None = None
        self.definitions: list[dict[str, Any]] = []  # as the worker reported them (for the cache)
        self.worker_problems: list[dict[str, Any]] = []  # the tools the worker reported skipping
        self.deps: list[list[Any]] = []  # [path, size, mtime_ns] of the helpers it imported
        self.definitions_from = ""  # "worker" (loaded in this daemon's life) or "cache" (the definition cache)
        # It failed for a reason outside the module (no worker could start, its worker died while
        # loading): never cached, and the next scan tries again.
        self.transient = False
        self.hold: Hold | None = None  # why it runs confined, or not at all, until reviewed (``holding``)

    @property
    def confined(self) -> bool:
        """Whether its workers run confined (``trust --sandbox``, or held content)."""
        return self.state not in ("blocked", "held") and (self.tools_dir.sandbox is not None or self.hold is not None)

    def held_entry(self) -> dict[str, Any]:
        assert self.hold is not None
        tools_dir = self.tools_dir
        return {"scope": self.scope, **held_entry(self.path, self.hold, tools_dir.cwd, self.state != "held", tools_dir.held_reason)}

    def depends_on(self, path: str) -> bool:
        return any(dep[0] == path for dep in self.deps)

    @property
    def scope(self) -> Scope:
        return self.tools_dir.scope

    def loading_entry(self) -> dict[str, Any]:
        """What ``list`` reports for a module whose first load is still under way (``installing``:
        the environment of the dependencies it declares is being built)."""
        entry = {"file": self.path, "scope": self.scope, "since": self.file_seen}
        if self.runner.installing is not None:
            entry["installing"] = _installing(self.runner.installing)
        return entry

    def error_entry(self) -> dict[str, Any]:
        assert self.error is not None
        return {
            "file": self.path,
            "line": self.error.get("line"),
            "message": self.error.get("message", ""),
            "scope": self.scope,
        }

    def error_entries(self) -> list[dict[str, Any]]:
        """What ``list`` and ``reload`` report for this module: its failure, or each skipped tool."""
        if self.error is not None:
            return [self.error_entry()]
        return [
            {"file": self.path, "line": p.get("line"), "message": p.get("message", ""), "scope": self.scope,
             "tool": p.get("tool")}
            for p in self.problems
        ]

    def info(self) -> dict[str, Any]:
        installing = self.runner.installing
        info = {
            "path": self.path,
            "scope": self.scope,
            # Not serving yet, and the environment of what it declares is being built.
            "state": "installing" if installing is not None and self.state in ("pending", "loading") else self.state,
            **({"installing": _installing(installing)} if installing is not None else {}),
            "tools": sorted(self.tools),
            "loadMs": round(self.load_ms, 2) if self.load_ms is not None else None,
            "definitionsFrom": self.definitions_from,
            # Whether its workers run confined (``trust --sandbox``), and why it is blocked if it is.
            "confined": self.confined,
            **({"held": self.held_entry()} if self.hold is not None else {}),
            # A built-in module runs per project where it is confined: which one this row serves.
            **({"project": str(self.tools_dir.cwd)} if self.scope == "builtin" and self.tools_dir.sandbox else {}),
            **({"blockedReason": self.tools_dir.blocked_reason} if self.state == "blocked" and self.tools_dir.blocked_reason else {}),
            "error": self.error_entry() if self.error else None,
            "problems": self.error_entries() if self.error is None else [],
            **self.runner.info(),
        }
        return info


def _installing(build: dict[str, Any]) -> dict[str, Any]:
    """What status and list say of an environment being built (``environments``)."""
    return {key: build[key] for key in ("requirements", "step", "progress", "since")}


class ToolsDir:
    """The modules of one tools directory.

    Args:
        path: the directory (it may not exist yet).
        scope: ``local``, ``global`` or ``builtin``.
        cwd: the working directory of this dir's workers (the project root, or the home directory).
    """

    def __init__(self, path: Path, scope: Scope, cwd: Path) -> None:
        self.path = path
        self.scope = scope
        self.cwd = cwd
        self.modules: dict[str, Module] = {}
        self.skipped: list[Skipped] = []  # entries that cannot be modules, or the dir itself: reported as errors
        self.trusted = True  # a project's own dir is set from the trust store when it is created
        # How its workers are confined (``sandbox.confine``'s policy), None for full rights; and
        # why its modules are blocked when they are for another reason than want of trust.
        self.sandbox: dict[str, Any] | None = None
        self.blocked_reason: str | None = None
        # A fully trusted project's own dir, whose content is followed (``holding``): the last
        # judgement of its content (None: not followed); how its held modules run (None: they do
        # not, for ``held_reason``).
        self.content: Verdict | None = None
        self.held_policy: dict[str, Any] | None = None
        self.held_reason: str | None = None
        self.version = 0
        self.scanned: asyncio.Future[None] | None = None
        self.lock = asyncio.Lock()
        self.retired = False  # forgotten with its project: scans no longer touch it
        # The agent that loads this dir's tools itself ("opencode" for OpenCode's tool dirs): its
        # sessions are not offered them twice.
        self.loaded_by: str | None = None
        self.loading: dict[str, LateLoad] = {}  # loads that outlived their scan's load_wait, by path
        self._catalog: tuple[int, dict[str, ToolDef], list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]] | None = None

    def catalog(self) -> tuple[dict[str, ToolDef], list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
        """This dir's tools by name, its errors (load errors, skipped tools and name clashes between
        modules), its blocked modules, and its held ones (``holding``).

        Two modules of one dir that define the same name: the file that sorts first keeps it.
        """
        if self._catalog is not None and self._catalog[0] == self.version:
            return self._catalog[1], self._catalog[2], self._catalog[3], self._catalog[4]
        tools: dict[str, ToolDef] = {}
        errors: list[dict[str, Any]] = []
        blocked: list[dict[str, Any]] = []
        held: list[dict[str, Any]] = []
        errors.extend(s.entry(self.scope) for s in self.skipped)
        offer: dict[str, str] | None = None  # the same for every blocked module of the dir: made once
        for path in sorted(self.modules):
            module = self.modules[path]
            if module.hold is not None:
                held.append(module.held_entry())
            if module.state == "blocked":
                entry = {"file": path, "scope": self.scope, "root": str(self.cwd)}
                if self.blocked_reason is not None and self.scope != "local":
                    entry["reason"] = self.blocked_reason
                else:
                    offer = offer or trust_offer(self.cwd)
                    if self.blocked_reason is None:
                        entry.update(offer)
                    else:
                        entry.update(reason=self.blocked_reason, command=offer["fullCommand"])
                blocked.append(entry)
            errors.extend(module.error_entries())
            for name, tool in module.tools.items():
                holder = tools.get(name)
                if holder is not None:
                    errors.append(
                        {"file": path, "line": None, "scope": self.scope,
                         "message": f"tool {name!r} is already defined by {holder.module.path}; this one is ignored"}
                    )
                    continue
                tools[name] = tool
        self._catalog = (self.version, tools, errors, blocked, held)
        return tools, errors, blocked, held

    @property
    def key(self) -> tuple[Path, Path]:
        """What tells it from every other dir: its path, and for a built-in dir the project it serves."""
        return (self.path, self.cwd)

    def info(self) -> dict[str, Any]:
        return {"path": str(self.path), "scope": self.scope, "modules": len(self.modules)}


class View:
    """What a project sees: visible tools by name (sorted), shadowed ones, errors, blocked modules,
    the modules whose first load is still under way (their tools come with a later view), and the
    held ones (content that came through git, unreviewed: ``holding``)."""

    __slots__ = ("blocked", "errors", "held", "key", "loading", "shadowed", "tools")

    def __init__(
        self,
        key: tuple[int, ...],
        tools: dict[str, ToolDef],
        shadowed: list[tuple[ToolDef, ToolDef]],
        errors: list[dict[str, Any]],
        blocked: list[dict[str, Any]] | None = None,
        loading: list[dict[str, Any]] | None = None,
        held: list[dict[str, Any]] | None = None,
    ) -> None:
        self.key = key
        self.tools = tools
        self.shadowed = shadowed
        self.errors = errors
        self.blocked = blocked or []
        self.loading = loading or []
        self.held = held or []


class Project:
    """A project root and the tools dirs it sees, highest precedence first."""

    def __init__(self, root: Path | None, dirs: list[ToolsDir]) -> None:
        self.root = root
        self.dirs = dirs
        self.holders = 0  # acquire() minus release()
        self.idle_since: float | None = time.monotonic()  # when holders last dropped to 0 (monotonic)
        # What the call path reads without a method call: ``built`` is the view as last built (None
        # once one of its dirs changed: ``view()`` builds it again); ``scanned`` turns True once
        # ``is_ready()`` has seen every dir scanned, and stays so.
        self.built: View | None = None
        self.scanned = False

    def is_ready(self) -> bool:
        """Whether every dir has been scanned once."""
        if not self.scanned:
            self.scanned = all(d.scanned is not None and d.scanned.done() for d in self.dirs)
        return self.scanned

    def view(self) -> View:
        view = self.built
        if view is not None:
            return view  # the registry drops it whenever one of our dirs changes
        key = tuple(d.version for d in self.dirs)
        tools: dict[str, ToolDef] = {}
        shadowed: list[tuple[ToolDef, ToolDef]] = []
        errors: list[dict[str, Any]] = []
        blocked: list[dict[str, Any]] = []
        loading: list[dict[str, Any]] = []
        held: list[dict[str, Any]] = []
        for tools_dir in self.dirs:
            dir_tools, dir_errors, dir_blocked, dir_held = tools_dir.catalog()
            errors.extend(dir_errors)
            blocked.extend(dir_blocked)
            held.extend(dir_held)
            loading.extend(m.loading_entry() for m in tools_dir.modules.values() if m.state == "loading")
            for name, tool in dir_tools.items():
                winner = tools.get(name)
                if winner is None:
                    tools[name] = tool
                else:
                    shadowed.append((tool, winner))
        self.built = View(key, dict(sorted(tools.items())), shadowed, errors, blocked, loading, held)
        return self.built

    def loads_under_way(self) -> list[asyncio.Future[None]]:
        """When each load that outlived its scan's ``load_wait`` in this project's dirs is done.

        Any of them may define a tool not listed yet (a module names its tools freely with
        ``@tool(name=…)``), so a call to an unknown tool waits for them all.
        """
        return [late.done for d in self.dirs for late in d.loading.values() if not late.done.done()]

    async def loaded(self) -> None:
        """Wait until the loads under way in this project's dirs (and those they lead to) are done."""
        while pending := self.loads_under_way():
            await asyncio.wait(pending)

    def invalidate(self) -> None:
        self.built = None

    async def ready(self) -> None:
        """Wait until every dir of this project has been scanned once."""
        for tools_dir in self.dirs:
            if tools_dir.scanned is not None:
                await asyncio.shield(tools_dir.scanned)

    def trust_offer(self) -> dict[str, str] | None:
        """What unblocks this project's own tools (``registry.trust.trust_offer``), when they are
        blocked for want of trust.

        Known without waiting for a scan: trust is decided when the project is created, and before
        the first scan is done, a look at the dir's first entries tells (``may_hold_modules``): the
        session's ``initialize`` asks, on the event loop, and a repository may put a million
        entries there.
        """
        for tools_dir in self.dirs:
            if tools_dir.scope == "local" and not tools_dir.trusted and _holds_modules(tools_dir):
                return trust_offer(tools_dir.cwd)
        return None

    def trust_level(self) -> str | None:
        """How the project's own tools run: ``full``, ``sandbox``, ``untrusted``, ``blocked`` (trusted
        with ``--sandbox`` where the sandbox is unavailable); None for no project (the home)."""
        for tools_dir in self.dirs:
            if tools_dir.scope == "local":
                if tools_dir.trusted:
                    return "sandbox" if tools_dir.sandbox is not None else "full"
                return "blocked" if tools_dir.blocked_reason else "untrusted"
        return None

    def network(self) -> str | None:
        """What the project's own confined tools may reach, in words (from their policy,
        ``confinement.network_policy``); None where they do not run confined."""
        policy = next((d.sandbox for d in self.dirs if d.scope == "local" and d.trusted), None)
        if policy is None:
            return None
        if policy.get("net_off"):
            return f"none, though allowed: {policy['net_off']}"
        if not policy.get("net"):
            return "none"
        hosts = policy.get("net_hosts")
        return f"through the daemon's proxy: {', '.join(hosts) if hosts else 'any public host'}"

    def sees(self, tools_dir: ToolsDir) -> bool:
        return any(d is tools_dir for d in self.dirs)


def _holds_modules(tools_dir: ToolsDir) -> bool:
    """Whether ``tools_dir`` holds modules: as its last scan found, once one is done; else as a
    bounded look at its entries says."""
    scanned = tools_dir.scanned
    if scanned is not None and scanned.done() and not scanned.cancelled() and scanned.exception() is None:
        return bool(tools_dir.modules)
    return may_hold_modules(tools_dir.path)


class Change:
    """What a commit changed: the dirs, and the modules that failed to load in it."""

    __slots__ = ("dirs", "failures")

    def __init__(self, dirs: set[ToolsDir], failures: list[Module]) -> None:
        self.dirs = dirs
        self.failures = failures


Listener = Callable[[Change], None]
DirListener = Callable[[ToolsDir, bool], None]  # (tools_dir, in use): True when it comes into use
