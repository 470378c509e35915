"""Committing what a scan loaded: a tools dir's modules and their worker generations swapped in one
synchronous step, the definition cache kept, and listeners told.

A module's runner is made with a host (``DirHost``, ``LocalHost``, ``BuiltinHost``: the
``pool.RunnerHost`` of its tools dir's scope) through which a worker started later for a call
reports what it loaded, and asks whether it may start (``lifetimes``).

The registry knows nothing of sockets or sessions: it tells its listeners which dirs changed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from atomictools._protocol import check_tool_name
from atomictoolsd.config.discovery import ModuleFile, Skipped
from atomictoolsd.pool.pool import LoadFailure, ModuleRunner, WorkerPool
from atomictoolsd.pool.worker import Worker
from atomictoolsd.registry.cache import CacheEntry, DefinitionCache
from atomictoolsd.registry.confinement import root_listing
from atomictoolsd.registry.content import Hold
from atomictoolsd.registry.lifetimes import Lifetimes, Scans
from atomictoolsd.registry.model import Change, LateLoad, Listener, Module, ToolDef, ToolsDir
from atomictoolsd.registry.ondisk import read_worker_back
from atomictoolsd.registry.outcome import Blocked, Cached, Held, Late, Loaded, LoadOutcome, NotLoaded, NoWorker

__all__ = ["BuiltinHost", "Commits", "DirHost", "LocalHost"]

log = logging.getLogger("atomictoolsd.registry")

# What to do with a load still under way at its scan's commit: commit it once done (``Scanner.load_later``).
LoadLater = Callable[[ToolsDir, ModuleFile, "asyncio.Future[Any]"], None]


class DirHost:
    """What the runners of one tools dir's modules ask of the registry (``pool.RunnerHost``): the
    global dir's (and OpenCode's); ``LocalHost`` and ``BuiltinHost`` add what their scope asks."""

    __slots__ = ("commits", "lifetimes", "tools_dir")

    def __init__(self, commits: Commits, lifetimes: Lifetimes, tools_dir: ToolsDir) -> None:
        self.commits = commits
        self.lifetimes = lifetimes
        self.tools_dir = tools_dir

    def _module(self, runner: ModuleRunner) -> Module | None:
        """The module ``runner`` serves, while the dir lists it."""
        module = self.tools_dir.modules.get(runner.spec.path)
        return module if module is not None and module.runner is runner else None

    async def admit(self, runner: ModuleRunner) -> str | None:
        return None

    def stale(self, runner: ModuleRunner) -> bool:
        return False

    async def verify(self, runner: ModuleRunner, worker: Worker) -> bool:
        return await read_worker_back(self.tools_dir.path, runner.spec.path, worker)

    def load_failed(self, runner: ModuleRunner, failure: LoadFailure) -> None:
        module = self._module(runner)
        if module is not None:
            self.commits.lazy_load_failed(module, failure)

    def loaded(self, runner: ModuleRunner, worker: Worker, definitions: list[dict[str, Any]]) -> None:
        module = self._module(runner)
        if module is not None:
            self.commits.lazy_loaded(module, worker, definitions)

    def health_changed(self, runner: ModuleRunner) -> None:
        module = self._module(runner)
        if module is not None:
            self.commits.health_changed(module)


class LocalHost(DirHost):
    """A project's own dir: a worker starts only while the project is trusted, judged as it is now;
    a confined one is replaced once the project's root holds other entries than it was made for."""

    __slots__ = ()

    async def admit(self, runner: ModuleRunner) -> str | None:
        return await self.lifetimes.admit(self.tools_dir, runner)

    def stale(self, runner: ModuleRunner) -> bool:
        tools_dir = self.tools_dir
        return tools_dir.sandbox is not None and self.lifetimes.listed.get(runner) != root_listing(tools_dir.cwd)


class BuiltinHost(DirHost):
    """A built-in dir: a worker is made for the dir's policy and your git configuration as they are."""

    __slots__ = ()

    async def admit(self, runner: ModuleRunner) -> str | None:
        if runner not in self.lifetimes.made_for:
            return None  # not listed yet
        return await self.lifetimes.builtin_admit(self.tools_dir, runner)

    def stale(self, runner: ModuleRunner) -> bool:
        made_for = self.lifetimes.made_for
        if runner not in made_for:
            return False
        tools_dir = self.tools_dir
        return made_for[runner] is not tools_dir.sandbox or tools_dir in self.lifetimes.config_changed


class Commits:
    """Commits loads and removals to the registry's tools dirs, and tells the listeners."""

    def __init__(self, pool: WorkerPool, cache: DefinitionCache | None, lifetimes: Lifetimes, scans: Scans) -> None:
        self.pool = pool
        self.cache = cache
        self.lifetimes = lifetimes
        self.scans = scans
        self._listeners: list[Listener] = []

    def add_listener(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def remove_listener(self, listener: Listener) -> None:
        self._listeners.remove(listener)

    def notify(self, change: Change) -> None:
        for listener in list(self._listeners):
            try:
                listener(change)
            except Exception:  # a listener's bug must not stop a reload
                log.exception("registry listener failed")

    def commit(
        self,
        tools_dir: ToolsDir,
        results: list[tuple[ModuleFile, LoadOutcome]],
        removed: list[str],
        later: LoadLater | None = None,
    ) -> Change:
        """Apply loaded modules and removals in one step, then tell listeners; a load still under way
        (``Late``) keeps what its module served until ``later`` commits it."""
        settled: list[LateLoad] = []
        failures: list[Module] = []
        blocked: list[Module] = []
        loaded = bool(removed)
        for file, outcome in results:
            module = tools_dir.modules.get(file.path)
            runner = self.pool.runner(file.path, file.kind, str(tools_dir.cwd), self.host(tools_dir))
            # A worker it starts later on a call is confined alike.
            runner.set_up(tools_dir.sandbox, runner.trusted_content)
            if module is None:
                module = tools_dir.modules[file.path] = Module(tools_dir, file, runner)
                if tools_dir.scope == "builtin":
                    self.lifetimes.made_for[runner] = tools_dir.sandbox
                if isinstance(outcome, Late):
                    module.state = "loading"
            elif isinstance(outcome, NoWorker) and module.state != "loading":
                # Not the module's doing: it keeps what it served, and its old file key has the next
                # scan try again.
                log.warning("cannot load %s now: no worker could be started (%s)", module.path, outcome)
                continue
            if isinstance(outcome, Late):
                # It keeps what it served (and its old file key) until the load is done.
                assert later is not None, "a load under way comes from a scan"
                later(tools_dir, file, outcome.task)
                continue
            late = tools_dir.loading.pop(file.path, None)
            if late is not None:
                settled.append(late)  # this outcome takes the place of a load under way
            module.file = file
            match outcome:
                case Blocked():
                    self._block(module)
                    blocked.append(module)
                    continue
                case Held(deps=deps):
                    self._hold(module, [list(d) for d in deps])
                    continue
                case Cached(entry=entry):
                    if entry.error is not None:
                        self._fail(module, {**entry.error, "deps": entry.deps})
                    else:
                        self._install(module, None, entry.definitions, entry.load_ms or 0.0, entry.deps, entry.problems)
                    module.definitions_from = "cache"
                case NoWorker(error=error):  # a module seen for the first time
                    loaded = True
                    module.definitions_from = "worker"
                    self._fail(module, {"file": module.path, "line": None, "traceback": "",
                                        "message": f"no worker could be started to load it ({error})"}, transient=True)
                case NotLoaded(failure=failure):
                    loaded = True
                    module.definitions_from = "worker"
                    self._fail(module, failure.info, transient=not failure.by_module)
                case Loaded(worker=worker, definitions=definitions, load_ms=load_ms):
                    loaded = True
                    module.definitions_from = "worker"
                    self._install(module, worker, definitions, load_ms, worker.deps, worker.problems)
            # A worker it starts later on a call is confined (and judged) alike.
            module.hold = self.lifetimes.set_up(tools_dir, runner, module.deps)
            if module.error is not None or module.problems:
                failures.append(module)
        if blocked:
            self._log_blocked(tools_dir, blocked)
        for path in removed:
            tools_dir.modules.pop(path)
            late = tools_dir.loading.pop(path, None)
            if late is not None:
                settled.append(late)
            self.pool.discard(path, str(tools_dir.cwd))
            log.info("removed %s", path, extra={"event": "module.removed", "data": {"path": path, "scope": tools_dir.scope}})
        if tools_dir.scanned is None:
            tools_dir.scanned = asyncio.get_running_loop().create_future()
        if not tools_dir.scanned.done():
            tools_dir.scanned.set_result(None)
        change = Change({tools_dir}, failures)
        if loaded:
            self.save_cache(tools_dir)
        if results or removed:
            self._changed(tools_dir)
            self.notify(change)
        for late in settled:
            late.settle()  # after the listeners: a call waiting on it finds the new tools
        return change

    def save_cache(self, tools_dir: ToolsDir) -> None:
        if self.cache is None:
            return
        entries: dict[str, CacheEntry] = {}
        for path, module in tools_dir.modules.items():
            file = module.file
            if module.state == "failed" and module.error is not None:
                if module.transient:
                    continue  # not the module's doing: the next daemon loads it afresh
                entries[path] = self.cache.failure_entry(tools_dir.path, file, {**module.error, "deps": module.deps})
            elif module.state in ("ready", "failing"):
                entries[path] = CacheEntry(
                    file.size, file.mtime_ns, deps=[tuple(d) for d in module.deps],  # type: ignore[misc]
                    definitions=module.definitions, problems=module.worker_problems, load_ms=module.load_ms,
                )
        self.cache.store(tools_dir.path, entries)

    def skipped_changed(self, tools_dir: ToolsDir, skipped: list[Skipped]) -> None:
        """Entries that cannot be modules came or went: report them (they never reach a worker)."""
        for entry in set(skipped) - set(tools_dir.skipped):
            log.warning("skipping %s: %s", entry.path, entry.message,
                        extra={"event": "module.skipped", "data": {"path": entry.path, "scope": tools_dir.scope}})
        tools_dir.skipped = skipped
        self._changed(tools_dir)
        self.notify(Change({tools_dir}, []))

    def _changed(self, tools_dir: ToolsDir) -> None:
        """Record that ``tools_dir``'s tools changed: new version, stale views dropped."""
        tools_dir.version += 1
        for project in self.lifetimes.seeing(tools_dir):
            project.invalidate()

    def _install(
        self,
        module: Module,
        worker: Worker | None,
        definitions: list[dict[str, Any]],
        load_ms: float,
        deps: list[Any],
        problems: list[dict[str, Any]],
    ) -> None:
        """Serve ``definitions`` for ``module``: from ``worker`` (a new generation), or from the cache
        when ``worker`` is None (the runner then starts a worker on the first call)."""
        self._set_tools(module, definitions, problems)
        event = "module.reload" if module.loaded_at is not None else "module.load"
        module.deps = [list(d) for d in deps]
        module.load_ms = load_ms
        module.loaded_at = time.time()
        if worker is None:
            return
        module.runner.install(worker)
        log.info(
            "%s %s (%d tools) in %.1f ms", "reloaded" if event == "module.reload" else "loaded",
            module.path, len(module.tools), load_ms,
            extra={"event": event, "data": {
                "path": module.path, "scope": module.scope, "tools": sorted(module.tools), "ms": round(load_ms, 3),
            }},
        )

    def _set_tools(self, module: Module, definitions: list[dict[str, Any]], skipped: list[dict[str, Any]]) -> None:
        tools: dict[str, ToolDef] = {}
        module.worker_problems = list(skipped)  # what the module itself skipped, kept for the cache
        problems = list(skipped)
        for definition in definitions:
            name = str(definition.get("name", ""))
            problem = check_tool_name(name)
            if problem:
                problems.append({"tool": name, "line": None, "message": problem})
                continue
            tools[definition["name"]] = ToolDef(module, definition)
        module.tools = tools
        module.definitions = definitions
        module.state = "ready"
        module.error = None
        module.problems = problems
        module.transient = False

    def _block(self, module: Module) -> None:
        module.tools = {}
        module.hold = None
        module.state = "blocked"
        module.error = None
        module.transient = False
        module.problems = []
        module.runner.retire(module.tools_dir.blocked_reason or "its project is not trusted")

    @staticmethod
    def _log_blocked(tools_dir: ToolsDir, blocked: list[Module]) -> None:
        """One line for the modules of a commit that are blocked: a repository can hold a thousand."""
        if len(blocked) == 1:
            what = blocked[0].path
        else:
            named = ", ".join(os.path.basename(m.path) for m in blocked[:5])
            what = f"{len(blocked)} modules of {tools_dir.path} ({named}{', …' if len(blocked) > 5 else ''})"
        reason = tools_dir.blocked_reason
        if reason is None:
            log.info("not loading %s: %s is not a trusted project", what, tools_dir.cwd)
        else:
            log.warning("not loading %s: %s", what, reason)

    def _hold(self, module: Module, deps: list[list[Any]]) -> None:
        """Withdraw a module whose content came through git, unreviewed, where it cannot run confined."""
        if deps:
            module.deps = deps
        module.tools = {}
        module.state = "held"
        module.error = None
        module.transient = False
        module.problems = []
        module.hold = self.lifetimes.hold_of(module.tools_dir, module.path, module.deps) or Hold([module.path], "unknown")
        message = module.held_entry()["message"]
        module.runner.retire(message)
        log.warning("not running %s: %s", module.path, message)

    def _fail(self, module: Module, info: dict[str, Any], transient: bool = False) -> None:
        # A load that refused content not judged trusted failed for the judgement, not the module.
        module.transient = transient or bool(info.get("refused"))
        module.tools = {}
        module.definitions = []
        module.worker_problems = []
        module.deps = [list(d) for d in info.get("deps", [])]
        module.state = "failed"
        module.error = {k: v for k, v in info.items() if k not in ("deps", "helpers")}
        module.problems = []
        module.runner.retire(f"its module failed to load: {info.get('message')}")
        where = f"{module.path}:{info.get('line')}" if info.get("line") else module.path
        log.warning(
            "cannot load %s: %s", where, info.get("message"),
            extra={"event": "module.failed", "data": {
                "path": module.path, "scope": module.scope, "line": info.get("line"), "error": info.get("message"),
            }},
        )

    def lazy_load_failed(self, module: Module, failure: LoadFailure) -> None:
        """A worker started for a call could not load a module that had loaded before."""
        if module.tools_dir.modules.get(module.path) is not module:
            return
        if failure.info.get("refused"):
            # It loads content not judged trusted: judged again, and loaded as that says.
            self.scans.scan_soon(module.tools_dir, {module.path})
            return
        self._fail(module, failure.info, transient=not failure.by_module)
        module.definitions_from = "worker"
        self.save_cache(module.tools_dir)
        self._changed(module.tools_dir)
        self.notify(Change({module.tools_dir}, [module]))

    def lazy_loaded(self, module: Module, worker: Worker, definitions: list[dict[str, Any]]) -> None:
        """A worker started for a call loaded the module: if it reports other definitions than the
        listed ones (a stale cache entry, a module that depends on more than its files), serve its."""
        if module.tools_dir.modules.get(module.path) is not module:
            return
        deps = [list(d) for d in worker.deps]
        if definitions == module.definitions and worker.problems == module.worker_problems and deps == module.deps:
            return
        log.info("%s now defines other tools than listed: updating", module.path)
        self._set_tools(module, definitions, worker.problems)
        module.deps = deps
        module.definitions_from = "worker"
        self.save_cache(module.tools_dir)
        self._changed(module.tools_dir)
        self.notify(Change({module.tools_dir}, [module] if module.problems else []))

    def health_changed(self, module: Module) -> None:
        """The module's workers started crashing in a loop (or kept on), or it recovered."""
        if module.tools_dir.modules.get(module.path) is not module or module.state not in ("ready", "failing"):
            return
        backoff = module.runner.backoff
        if backoff.failing:
            module.state = "failing"
            module.error = {
                "line": None, "traceback": "",
                "message": f"{backoff.describe()}; calls fail at once until it recovers",
            }
            log.warning("%s keeps crashing (%d times in a row)", module.path, backoff.crashes)
        else:
            module.state = "ready"
            module.error = None
            log.info("%s recovered", module.path)
        self._changed(module.tools_dir)
        self.notify(Change({module.tools_dir}, [module] if backoff.failing else []))

    def host(self, tools_dir: ToolsDir) -> DirHost:
        """The host of the runners of ``tools_dir``'s modules (``pool.RunnerHost``)."""
        host = {"local": LocalHost, "builtin": BuiltinHost}.get(tools_dir.scope, DirHost)
        return host(self, self.lifetimes, tools_dir)
