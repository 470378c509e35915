"""Which tools exist for whom: scanning tools directories, loading and committing their modules,
and the projects that see them (the types are ``model``'s).

A ``ToolsDir`` holds the modules of one directory (a project's ``.atomic/tools``, the global
``~/.atomic/tools``, or the built-ins). A ``Project`` sees several dirs in precedence order —
project-local, then global, then built-in — and its ``View`` is the merge, with every shadowed tool
and every load error kept for listing. A scan loads changed modules in parallel, then commits them
in one synchronous step (tools swapped and new worker generations installed together), so a call
never sees a half-updated directory.

A project's own dir loads only when the ``trusted`` predicate says so. Until then its modules are
``blocked``: listed by file, never loaded — no worker starts and none of their code runs, not even
to learn their tool names. In a fully trusted project, the content of each file is judged on every
scan and before every worker starts (``holding``): a module whose content came through git and was
never reviewed runs confined, or is ``held`` (not run) where it cannot be.

Module definitions come from a worker that loaded the module or, when it is fresh, from the
definition cache (``cache``): after a restart, listing starts no worker, and a module's worker
starts on its first call. A worker that starts later and reports other definitions updates them.

No scan waits on one slow module for longer than ``load_wait``: it commits what has loaded by then,
and a module still importing is committed on its own when it is done (a new module is listed as
``loading`` meanwhile; one that served keeps serving its previous generation). A module whose import
outlived ``load_timeout`` failed by its own doing: that is cached like any load error, so a restart
does not wait for it again.

A load is committed only when what its worker read is what is on disk: the module file and every
helper it imported from its tools dir, byte for byte, once those helpers have been left alone for a
moment (``HELPER_SETTLE``). A load that read a file half-written is loaded again; the module keeps
serving its previous generation meanwhile.

Projects are held, not owned: whoever serves a project ``acquire``s it and ``release``s it when
done (the server does so for each session's attachment), and ``forget_idle`` drops the projects
nobody has held for a while, with their own tools dir and its workers. A project asked for again
is rebuilt, its listing from the definition cache.

The registry knows nothing of sockets or sessions: it tells its listeners which dirs changed, and
its dir listeners which tools dirs came into use or went out of it (the file watcher watches those).
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Callable, Collection, Iterable
from pathlib import Path
from typing import Any

import msgspec

from atomictools._protocol import check_tool_name
from atomictoolsd.config.discovery import (
    ModuleFile,
    Skipped,
    global_tools_dir,
    list_module_files,
    local_tools_dir,
    opencode_global_dirs,
    opencode_tools_dirs,
    project_root,
    scan_tools_dir,
)
from atomictoolsd.environments import Environments
from atomictoolsd.registry.cache import CacheEntry, DefinitionCache
from atomictoolsd.registry.confinement import git_config_identity, root_listing
from atomictoolsd.registry.content import Hold, held_entry
from atomictoolsd.registry.holding import ContentJudge
from atomictoolsd.registry.model import (
    Change,
    DirListener,
    Judgement,
    LateLoad,
    Listener,
    Module,
    Project,
    ToolDef,
    ToolsDir,
)
from atomictoolsd.registry.ondisk import off_loop, read_whole, youngest_mtime
from atomictoolsd.registry.outcome import (
    BLOCKED,
    Blocked,
    Cached,
    Held,
    Late,
    Loaded,
    LoadOutcome,
    NotLoaded,
    NoWorker,
    load_outcome,
)
from atomictoolsd.registry.trust import trust_offer
from atomictoolsd.workers.periodic import Periodic
from atomictoolsd.workers.pool import LoadFailure, ModuleRunner, WorkerPool
from atomictoolsd.workers.worker import Worker

__all__ = ["Registry"]

log = logging.getLogger("atomictoolsd.registry")
_json = msgspec.json.encode

CONFIRM_SETTLE = 0.25  # seconds before a serving module's failed reload is tried again
# Seconds a helper a load read must have been left alone before the load is judged whole: a writer
# that truncates and then writes in several steps shows the same half-written bytes to the worker
# and to a check made at once.
HELPER_SETTLE = 0.2
GIT_CONFIG_INTERVAL = 2.0  # seconds between looks whether your git configuration files changed


def _reads(outcome: LoadOutcome) -> tuple[list[int] | None, list[list[Any]]]:
    """What a load's worker read: ``[size, crc32]`` of the module file, ``[path, size, crc32]`` of each helper."""
    match outcome:
        case Loaded(worker=worker):
            return worker.fingerprint, worker.helpers
        case NotLoaded(failure=failure):
            return failure.info.get("fingerprint"), failure.info.get("helpers") or []
        case _:
            return None, []  # nothing was read by a worker (blocked, cached, no worker, still loading)


def _judged(
    results: list[tuple[ModuleFile, LoadOutcome]], current: dict[str, ModuleFile]
) -> tuple[list[int], list[int]]:
    """(the loads torn by what the listing shows, the loads whose bytes are still to be read back)."""
    torn, to_read = [], []
    for i, (file, outcome) in enumerate(results):
        if not isinstance(outcome, (Loaded, NotLoaded)):
            continue  # nothing was read by a worker
        now = current.get(file.path)
        (torn if now is None or now.key != file.key else to_read).append(i)
    return torn, to_read


async def read_back(root: Path, loads: list[tuple[str, list[int] | None, list[list[Any]]]]) -> list[bool]:
    """``ondisk.read_whole`` off the loop, bounded in time: a check that does not finish is torn."""
    if not loads:
        return []
    return await off_loop(lambda: read_whole(str(root), loads), [False] * len(loads))


async def read_whole_worker(tools_dir: ToolsDir, path: str, worker: Worker) -> bool:
    """Whether a worker started for a call read the module at ``path`` and its helpers whole (see
    ``Registry._reload_torn``)."""
    await settle_helpers(helper[0] for helper in worker.helpers)
    return (await read_back(tools_dir.path, [(path, worker.fingerprint, worker.helpers)]))[0]


def _opencode(tools_dir: ToolsDir) -> ToolsDir:
    tools_dir.loaded_by = "opencode"  # OpenCode loads these itself: its sessions are not offered them
    return tools_dir


def _discard(outcome: LoadOutcome) -> None:
    """Stop the worker generation of a load that will not be committed."""
    if isinstance(outcome, Loaded):
        outcome.worker.runner.drop(outcome.worker)


def _loading(tools_dir: ToolsDir, file: ModuleFile) -> bool:
    late = tools_dir.loading.get(file.path)
    return late is not None and late.file.key == file.key


def _settle(late: LateLoad) -> None:
    if not late.done.done():
        late.done.set_result(None)


async def settle_helpers(helpers: Iterable[str]) -> None:
    """Wait until none of ``helpers`` was written in the last ``HELPER_SETTLE`` seconds (at most that
    long: a file still being written then differs from what was read, and the load is torn)."""
    paths = list(helpers)
    if not paths:
        return
    youngest = await off_loop(lambda: youngest_mtime(paths), 0.0)
    wait = youngest + HELPER_SETTLE - time.time()
    if wait > 0:
        await asyncio.sleep(min(wait, HELPER_SETTLE))


class DirHost:
    """What the runners of one tools dir's modules ask of the registry (``pool.RunnerHost``): the
    global dir's (and OpenCode's); ``LocalHost`` and ``BuiltinHost`` add what their scope asks."""

    __slots__ = ("registry", "tools_dir")

    def __init__(self, registry: Registry, tools_dir: ToolsDir) -> None:
        self.registry = registry
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
        return await read_whole_worker(self.tools_dir, runner.spec.path, worker)

    def load_failed(self, runner: ModuleRunner, failure: LoadFailure) -> None:
        module = self._module(runner)
        if module is not None:
            self.registry._lazy_load_failed(module, failure)

    def loaded(self, runner: ModuleRunner, worker: Worker, definitions: list[dict[str, Any]]) -> None:
        module = self._module(runner)
        if module is not None:
            self.registry._lazy_loaded(module, worker, definitions)

    def health_changed(self, runner: ModuleRunner) -> None:
        module = self._module(runner)
        if module is not None:
            self.registry._health_changed(module)


class LocalHost(DirHost):
    """A project's own dir: a worker starts only while the project is trusted, judged as it is now;
    a confined one is replaced once the project's root holds other entries than it was made for."""

    __slots__ = ()

    async def admit(self, runner: ModuleRunner) -> str | None:
        return await self.registry._admit(self.tools_dir, runner)

    def stale(self, runner: ModuleRunner) -> bool:
        tools_dir = self.tools_dir
        return tools_dir.sandbox is not None and self.registry._listed.get(runner) != root_listing(tools_dir.cwd)


class BuiltinHost(DirHost):
    """A built-in dir: a worker is made for the dir's policy and your git configuration as they are."""

    __slots__ = ()

    async def admit(self, runner: ModuleRunner) -> str | None:
        if runner not in self.registry._made_for:
            return None  # not listed yet
        return await self.registry._builtin_admit(self.tools_dir, runner)

    def stale(self, runner: ModuleRunner) -> bool:
        made_for = self.registry._made_for
        if runner not in made_for:
            return False
        tools_dir = self.tools_dir
        return made_for[runner] is not tools_dir.sandbox or tools_dir in self.registry._config_changed


class Registry:
    """All projects in use, the global dir and the built-ins, kept in step with the files.

    Args:
        trusted: whether a project root's own tools may load (default: every project's may).
        judge: how a tools dir may run, when its trust has levels: ``(loads, sandbox policy or None,
            why it is blocked or None)`` for a dir (``trusted`` is then not asked). For a project's
            own built-in dir that runs confined it returns the function that makes that judgement,
            run in a thread (``_judged``); a built-in dir judged at once runs unconfined, so the
            project uses the shared built-in dirs.
        cache: where module definitions are kept across restarts (None: nowhere).
        load_wait: seconds a scan waits for its loads before it commits those done (the others
            commit on their own when done).
        content: judges the content of fully trusted projects' own dirs (``holding``; None: it is
            not followed).
    """

    def __init__(
        self,
        pool: WorkerPool,
        home: Path,
        builtin_dirs: Iterable[ToolsDir] = (),
        trusted: Callable[[Path], bool] | None = None,
        cache: DefinitionCache | None = None,
        judge: Callable[[ToolsDir], Judgement | Callable[[], Judgement]] | None = None,
        load_wait: float = 2.0,
        content: ContentJudge | None = None,
        environments: Environments | None = None,
        opencode_dirs: bool = False,
    ) -> None:
        self.pool = pool
        self.content = content
        self.environments = environments  # whose choice of a project's environment may change (trust --python)
        self.opencode_dirs = opencode_dirs  # OpenCode's tool dirs are tools dirs too (a project's, the user's)
        self.load_wait = load_wait
        self.home = home
        self.cache = cache
        self.trusted: Callable[[Path], bool] = trusted or (lambda root: True)
        self.judge = judge
        self.global_dir = ToolsDir(global_tools_dir(home), "global", home)
        # Every dir of the user's, highest precedence first: the global dir, then OpenCode's.
        self.global_dirs = [self.global_dir]
        if opencode_dirs:
            self.global_dirs += [_opencode(ToolsDir(path, "global", home)) for path in opencode_global_dirs(home)]
        for tools_dir in self.global_dirs:
            self._judge(tools_dir)
        self.builtin_dirs = list(builtin_dirs)
        # By (path, cwd): a project's own built-in dir has the shared one's path (``_builtins``).
        self.dirs: dict[tuple[Path, Path], ToolsDir] = {d.key: d for d in self.global_dirs}
        for tools_dir in self.builtin_dirs:
            self.dirs[tools_dir.key] = tools_dir
        self.projects: dict[Path, Project] = {}
        self.base = Project(None, [*self.global_dirs, *self.builtin_dirs])
        self._listeners: list[Listener] = []
        self._dir_listeners: list[DirListener] = []
        self._tasks: set[asyncio.Future[Any]] = set()  # scans under way: kept until done
        # A built-in dir's judgement under way in its thread, and the one asked for meanwhile (``_judged``).
        self._judging: dict[ToolsDir, asyncio.Future[None]] = {}
        self._judge_next: dict[ToolsDir, asyncio.Future[None]] = {}
        # Built-in dirs judged again because your git configuration changed: until that is done, their
        # workers (made for the files as they were) take no call (``stale``).
        self._config_changed: set[ToolsDir] = set()
        # What a confined project's root held when its module's last worker was made (``root_listing``):
        # the worker may write the entries there then, no other (``sandbox._add_split``), so one made
        # since (mkdir build) sends the next call to a new worker.
        self._listed: weakref.WeakKeyDictionary[ModuleRunner, tuple[int, int] | None] = weakref.WeakKeyDictionary()
        # The policy a confined built-in's current worker was made for: a new one (a trust or git
        # configuration change, ``_check_git_config``) sends the next call to a new worker.
        self._made_for: weakref.WeakKeyDictionary[ModuleRunner, dict[str, Any] | None] = weakref.WeakKeyDictionary()
        self._git_config_check = Periodic(
            "checking your git configuration", self._check_git_config, GIT_CONFIG_INTERVAL,
            while_=self._confined_builtins, logger=log,
        )

    # -- listeners ------------------------------------------------------------------------------

    def add_listener(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def remove_listener(self, listener: Listener) -> None:
        self._listeners.remove(listener)

    def add_dir_listener(self, listener: DirListener) -> None:
        """Call ``listener(tools_dir, True)`` when a tools dir comes into use, before its first scan,
        and ``listener(tools_dir, False)`` once it is forgotten with its project."""
        self._dir_listeners.append(listener)

    def remove_dir_listener(self, listener: DirListener) -> None:
        self._dir_listeners.remove(listener)

    def _notify(self, change: Change) -> None:
        for listener in list(self._listeners):
            try:
                listener(change)
            except Exception:  # a listener's bug must not stop a reload
                log.exception("registry listener failed")

    # -- projects -------------------------------------------------------------------------------

    def project(self, directory: Path) -> Project:
        """The project of ``directory``, created (and its first scan started) on first use."""
        root = project_root(directory, self.home)
        project = self.projects.get(root)
        if project is None:
            project = self.projects[root] = Project(root, [*self._local_dirs(root), *self.global_dirs, *self._builtins(root)])
        else:
            for tools_dir in project.dirs:
                if tools_dir.scope == "local":
                    self._trust_lost(tools_dir)
        for tools_dir in project.dirs:
            self.ensure_scanned(tools_dir)
        return project

    def _local_dirs(self, root: Path) -> list[ToolsDir]:
        """The project's own tools dirs, highest precedence first: ``.atomic/tools``, then OpenCode's
        (none for the home: its ``.atomic/tools`` is the global dir)."""
        if local_tools_dir(root) == self.global_dir.path:
            return []
        paths = [(local_tools_dir(root), False)]
        if self.opencode_dirs:
            paths += [(path, True) for path in opencode_tools_dirs(root)]
        dirs = []
        for path, opencode in paths:
            local = self.dirs.get((path, root))
            if local is None:
                local = self.dirs[(path, root)] = ToolsDir(path, "local", root)
                if opencode:
                    _opencode(local)
                self._judge(local)
            dirs.append(local)
        return dirs

    def _builtins(self, root: Path) -> list[ToolsDir]:
        """The built-in dirs the project at ``root`` sees: a dir of its own for each, whose workers
        run confined to the project, where the judge confines them; else the shared ones (one worker
        per module serves every project, as where the sandbox is unavailable). The judge only says
        which here: the confinement itself is judged by the dir's first scan, in a thread."""
        dirs = []
        for shared in self.builtin_dirs:
            own = self.dirs.get((shared.path, root))
            if own is None:
                own = ToolsDir(shared.path, "builtin", root)
                if not callable(self._asked(own)):
                    dirs.append(shared)
                    continue
                self.dirs[own.key] = own
            dirs.append(own)
        return dirs

    def ensure_scanned(self, tools_dir: ToolsDir) -> None:
        """Start the first scan of ``tools_dir`` unless one has started; ``tools_dir.scanned`` tells
        when it is done."""
        if tools_dir.scanned is not None:
            return
        scanned = tools_dir.scanned = asyncio.get_running_loop().create_future()
        self._tell_dir_listeners(tools_dir, True)

        async def first_scan() -> None:
            try:
                await self.scan(tools_dir)
            except Exception as exc:
                log.exception("scanning %s failed", tools_dir.path)
                if not scanned.done():
                    scanned.set_exception(exc)

        scanned.add_done_callback(lambda f: f.cancelled() or f.exception())  # never "never retrieved"
        task = asyncio.ensure_future(first_scan())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _host(self, tools_dir: ToolsDir) -> DirHost:
        """The host of the runners of ``tools_dir``'s modules (``pool.RunnerHost``)."""
        host = {"local": LocalHost, "builtin": BuiltinHost}.get(tools_dir.scope, DirHost)
        return host(self, tools_dir)

    def _tell_dir_listeners(self, tools_dir: ToolsDir, in_use: bool) -> None:
        for listener in list(self._dir_listeners):
            try:
                listener(tools_dir, in_use)
            except Exception:  # a listener's bug must not keep a project from loading or going
                log.exception("registry dir listener failed")

    def acquire(self, directory: Path) -> Project:
        """The project of ``directory`` (see ``project``), held until ``release``: a held project
        is never forgotten."""
        project = self.project(directory)
        project.holders += 1
        project.idle_since = None
        return project

    def release(self, project: Project) -> None:
        """Let go of a project from ``acquire`` (the base project, never acquired, is ignored)."""
        if project.holders > 0:
            project.holders -= 1
            if project.holders == 0:
                project.idle_since = time.monotonic()

    async def forget_idle(self, idle_for: float) -> list[Project]:
        """Forget every project nobody has held for ``idle_for`` seconds; return them."""
        now = time.monotonic()
        idle = [
            p for p in self.projects.values()
            if p.holders == 0 and p.idle_since is not None and now - p.idle_since >= idle_for
        ]
        forgotten = []
        for project in idle:
            if await self.forget(project):
                forgotten.append(project)
        return forgotten

    async def forget(self, project: Project) -> bool:
        """Drop an unheld project: its entry, and its own tools dir with that dir's modules, cached
        definitions in memory and workers (they finish the calls they are running, then exit).
        The global dir and the shared built-in dirs stay; the project's own built-in dirs go with
        their workers. Returns False when it is held (again) or already gone."""
        root = project.root
        if root is None:  # the base project: always in use
            return False
        own = [
            d for d in project.dirs
            if d.scope != "global" and d not in self.builtin_dirs
            and not any(p is not project and p.sees(d) for p in (self.base, *self.projects.values()))
        ]
        for tools_dir in own:
            await tools_dir.lock.acquire()  # no scan of it is half done when it goes
        try:
            if project.holders or self.projects.get(root) is not project:
                return False
            del self.projects[root]
            for tools_dir in own:
                tools_dir.retired = True
                if self.dirs.get(tools_dir.key) is tools_dir:
                    del self.dirs[tools_dir.key]
                for path in list(tools_dir.modules):
                    self.pool.discard(path, str(tools_dir.cwd))
                tools_dir.modules.clear()
                for late in tools_dir.loading.values():
                    _settle(late)  # its finisher sees the dir retired and stops what it loaded
                tools_dir.loading.clear()
                if self.cache is not None and tools_dir.scope == "local":  # a built-in's entry is shared
                    self.cache.forget(tools_dir.path)
                self._tell_dir_listeners(tools_dir, False)
        finally:
            for tools_dir in own:
                tools_dir.lock.release()
        log.info(
            "forgot the project %s: no session has used it for a while", root,
            extra={"event": "project.forget", "data": {"root": str(root)}},
        )
        return True

    # -- scanning and loading ---------------------------------------------------------------------

    async def scan(
        self,
        tools_dir: ToolsDir,
        only: set[str] | None = None,
        force: bool = False,
        skip: Collection[str] | Callable[[], Collection[str]] = (),
        retry_failed: bool = False,
        finished: dict[str, tuple[LateLoad, LoadOutcome]] | None = None,
    ) -> Change:
        """Bring ``tools_dir`` in step with the files: load new and changed modules, drop removed ones.

        Args:
            only: restrict the scan to these paths (what a file watcher reports); None scans all.
            force: reload every module in ``only`` even if its size and mtime look unchanged (the
                watcher saw it written: two saves within one mtime tick can keep both).
            skip: leave these modules as they are (files the watcher sees half-saved); a callable
                is asked right after the directory is listed, under the scan's lock, so that a file
                that changes while the scan waits for the lock is judged as the scan sees it.
            retry_failed: load again the modules that failed, changed or not (an explicit reload:
                what made them fail may lie outside the file, such as a package or a permission).
            finished: loads that outlived an earlier scan's ``load_wait`` and are now done, with
                their outcomes: committed as if this scan had loaded them (when their file is
                still what they loaded, and nothing newer took their place).

        Loads still running after ``load_wait`` are committed by a scan of their own once done;
        meanwhile a module seen for the first time is ``loading``, and one that served keeps its
        tools and its worker.

        A scan, once begun, runs to its commit even when whoever asked for it goes away (a client
        that disconnects during ``atomic/reload``, a watcher task cancelled): stopped between
        loading and committing, it would leave the workers it started serving nobody.
        """
        task = asyncio.ensure_future(self._scan(tools_dir, only, force, skip, retry_failed, finished or {}))
        self._tasks.add(task)
        task.add_done_callback(self._scan_done)
        return await asyncio.shield(task)

    def _scan_done(self, task: asyncio.Future[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:  # retrieved: its asker may be gone
            log.warning("a scan failed: %r", task.exception())

    async def _scan(
        self,
        tools_dir: ToolsDir,
        only: set[str] | None,
        force: bool,
        skip: Collection[str] | Callable[[], Collection[str]],
        retry_failed: bool,
        finished: dict[str, tuple[LateLoad, LoadOutcome]],
    ) -> Change:
        async with tools_dir.lock:
            for path, (late, outcome) in list(finished.items()):
                if tools_dir.retired or tools_dir.loading.get(path) is not late:
                    _discard(outcome)  # something newer took its place while it waited for the lock
                    del finished[path]
            if tools_dir.retired:
                return Change(set(), [])
            # Asked on every scan: the directory may have been replaced since, or its level changed.
            await self._judged(tools_dir)
            await self._judge_content(tools_dir)
            trusted = tools_dir.trusted
            moved = self._environment_moved(tools_dir)
            files, skipped = scan_tools_dir(tools_dir.path)
            on_disk = {f.path: f for f in files}
            if skipped != tools_dir.skipped:
                self._skipped_changed(tools_dir, skipped)
            if callable(skip):
                skip = skip()
            removed = [
                p for p in tools_dir.modules if p not in on_disk and (only is None or p in only) and p not in skip
            ]
            changed = [
                f for p, f in on_disk.items()
                if (only is None or p in only)
                and p not in skip
                and (
                    force
                    or p not in tools_dir.modules
                    or tools_dir.modules[p].file.key != f.key
                    or (retry_failed and tools_dir.modules[p].state == "failed")
                    or (tools_dir.modules[p].state == "blocked") == trusted  # trust was given or taken
                    or self._setup_changed(tools_dir.modules[p])  # its confinement changed, or its content's judgement
                    or moved  # the project's environment changed
                    or tools_dir.modules[p].transient
                )
                # A load of this very file is under way: it commits when done (unless the watcher
                # saw the file written again, which its key may not show).
                and (force or p in finished or not _loading(tools_dir, f) or not trusted)
            ]
            used: set[str] = set()
            if trusted:
                deadline = asyncio.get_running_loop().time() + self.load_wait

                async def load(file: ModuleFile) -> tuple[ModuleFile, LoadOutcome]:
                    late = finished.get(file.path)
                    if late is not None and late[0].file.key == file.key:
                        used.add(file.path)
                        return file, late[1]
                    return await self._load(tools_dir, file, deadline)

                results = await asyncio.gather(*(load(f) for f in changed))
                results = await self._reload_torn(tools_dir, results, deadline)
                results = await self._confirm_failures(tools_dir, results, deadline)
                results = await self._retry_refused(tools_dir, results, deadline)
            else:
                results: list[tuple[ModuleFile, LoadOutcome]] = [(f, BLOCKED) for f in changed]
            for path, (_late, outcome) in finished.items():
                if path not in used:
                    _discard(outcome)  # its file changed or went: this scan judged what is there now
            return self._commit(tools_dir, results, removed)

    async def _reload_torn(
        self, tools_dir: ToolsDir, results: list[tuple[ModuleFile, LoadOutcome]], deadline: float
    ) -> list[tuple[ModuleFile, LoadOutcome]]:
        """Load again the modules whose file changed while their worker read it: it may have read
        it half-written (an editor truncates, then writes), and committing that would withdraw the
        tools of a module that is fine a moment later.

        A load is torn when the file's size or mtime moved, or when the bytes the worker loaded from
        it or from a helper it imported are not the bytes on disk now (a rewrite within one mtime
        tick keeps both), judged once the helpers have settled (``settle_helpers``). A module still torn
        after three tries, or whose file is gone, is left as it was: the writes that tore it, or the
        removal, reach the watcher, which scans it again once they settle.
        """
        for attempt in range(4):
            await settle_helpers(helper[0] for _file, outcome in results for helper in _reads(outcome)[1])
            current = {f.path: f for f in list_module_files(tools_dir.path)}
            torn, to_read = _judged(results, current)
            loads = [(results[i][0].path, *_reads(results[i][1])) for i in to_read]
            wholes = await read_back(tools_dir.path, loads)
            torn = sorted(torn + [i for i, whole in zip(to_read, wholes, strict=True) if not whole])
            if not torn:
                return results
            for i in torn:
                _discard(results[i][1])  # it loaded what is no longer on disk
            if attempt == 3:
                kept = [r for i, r in enumerate(results) if i not in set(torn)]
                log.info("left %d module(s) of %s as they were: their files keep changing", len(torn), tools_dir.path)
                return kept
            retry = [i for i in torn if results[i][0].path in current]
            again = await asyncio.gather(*(self._load(tools_dir, current[results[i][0].path], deadline) for i in retry))
            for i, result in zip(retry, again, strict=True):
                results[i] = result
            gone = set(torn) - set(retry)
            results = [r for i, r in enumerate(results) if i not in gone]
        return results

    async def _confirm_failures(
        self, tools_dir: ToolsDir, results: list[tuple[ModuleFile, LoadOutcome]], deadline: float
    ) -> list[tuple[ModuleFile, LoadOutcome]]:
        """Load once more, after a short settle, the modules that served tools and now fail.

        A reload can read a file that is being written (truncated, the writer not yet scheduled
        again) even after ``_reload_torn``'s checks when the machine is busy; committing that would
        withdraw tools that are fine a moment later. So a module that was ready keeps serving its
        old generation until the failure is seen twice. A real breaking edit shows CONFIRM_SETTLE
        later; a torn read never withdraws tools.
        """
        failing = [
            i for i, (file, outcome) in enumerate(results)
            if isinstance(outcome, NotLoaded)
            and getattr(tools_dir.modules.get(file.path), "state", None) == "ready"
        ]
        if not failing:
            return results
        await asyncio.sleep(CONFIRM_SETTLE)
        current = {f.path: f for f in list_module_files(tools_dir.path)}
        again = [i for i in failing if results[i][0].path in current]
        retried = await asyncio.gather(*(self._load(tools_dir, current[results[i][0].path], deadline) for i in again))
        for i, result in zip(again, retried, strict=True):
            results[i] = result
        return await self._reload_torn(tools_dir, results, deadline)

    async def _load(
        self, tools_dir: ToolsDir, file: ModuleFile, deadline: float, deps: list[list[Any]] | None = None,
    ) -> tuple[ModuleFile, LoadOutcome]:
        """Load ``file``: its cached definitions, or a new worker generation, or a failure; ``_Late``
        when the worker is still importing it at ``deadline`` (loop time). ``deps``: what it imports,
        when known better than from its last load."""
        if tools_dir.scope == "local":
            # Asked again at each load, not only when the scan began: a load of a file changed while
            # the scan ran (``_reload_torn``, ``_confirm_failures``, ``_retry_refused``) may read the
            # files of another directory renamed into the project's place since.
            self._judge(tools_dir)
            if not tools_dir.trusted:
                return file, BLOCKED
        known = tools_dir.modules.get(file.path)
        if deps is None:
            deps = known.deps if known is not None else []
        if self._held_here(tools_dir, file.path, deps):
            return file, Held(tuple(deps))  # its content came through git, unreviewed, and cannot run confined here
        if self.cache is not None and known is None:
            entry = self.cache.lookup(tools_dir.path, file)  # first sight of it in this daemon's life
            if entry is not None:
                return file, Cached(entry)
        runner = self.pool.runner(file.path, file.kind, str(tools_dir.cwd), self._host(tools_dir))
        self._set_up(tools_dir, runner, deps)
        if tools_dir.scope == "local":
            self._listed[runner] = root_listing(tools_dir.cwd)
        task = asyncio.ensure_future(load_outcome(file.path, runner.load()))
        await asyncio.wait([task], timeout=max(0.0, deadline - asyncio.get_running_loop().time()))
        return file, (task.result() if task.done() else Late(task))

    def _load_later(self, tools_dir: ToolsDir, file: ModuleFile, task: asyncio.Future[Any]) -> None:
        """Commit the load ``task`` of ``file`` once it is done, in a scan of its own."""
        old = tools_dir.loading.get(file.path)
        done = old.done if old is not None else asyncio.get_running_loop().create_future()
        late = tools_dir.loading[file.path] = LateLoad(file, task, done)  # a load it replaces is stale
        log.info("%s is still loading after %.3g s; listing without it until it is done", file.path, self.load_wait)

        async def finish() -> None:
            outcome = await task
            if tools_dir.loading.get(file.path) is not late or tools_dir.retired:
                _discard(outcome)
                return
            try:
                await self.scan(tools_dir, only={file.path}, force=True, finished={file.path: (late, outcome)})
            finally:
                if tools_dir.loading.get(file.path) is late:  # not committed (a failed scan): give up on it
                    _settle(tools_dir.loading.pop(file.path))

        finisher = asyncio.ensure_future(finish())
        self._tasks.add(finisher)
        finisher.add_done_callback(self._scan_done)

    def _commit(
        self,
        tools_dir: ToolsDir,
        results: list[tuple[ModuleFile, LoadOutcome]],
        removed: list[str],
    ) -> Change:
        """Apply loaded modules and removals in one step, then tell listeners."""
        settled: list[LateLoad] = []
        failures: list[Module] = []
        loaded = bool(removed)
        for file, outcome in results:
            module = tools_dir.modules.get(file.path)
            runner = self.pool.runner(file.path, file.kind, str(tools_dir.cwd), self._host(tools_dir))
            # A worker it starts later on a call is confined alike.
            runner.set_up(tools_dir.sandbox, runner.trusted_content)
            if module is None:
                module = tools_dir.modules[file.path] = Module(tools_dir, file, runner)
                if tools_dir.scope == "builtin":
                    self._made_for[runner] = tools_dir.sandbox
                if isinstance(outcome, Late):
                    module.state = "loading"
            elif isinstance(outcome, NoWorker) and module.state != "loading":
                # Not the module's doing: it keeps what it served, and its old file key has the next
                # scan try again.
                log.warning("cannot load %s now: no worker could be started (%s)", module.path, outcome)
                continue
            if isinstance(outcome, Late):
                # It keeps what it served (and its old file key) until the load is done.
                self._load_later(tools_dir, file, outcome.task)
                continue
            late = tools_dir.loading.pop(file.path, None)
            if late is not None:
                settled.append(late)  # this outcome takes the place of a load under way
            module.file = file
            match outcome:
                case Blocked():
                    self._block(module)
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
            module.hold = self._set_up(tools_dir, runner, module.deps)
            if module.error is not None or module.problems:
                failures.append(module)
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
            self._save_cache(tools_dir)
        if results or removed:
            self._changed(tools_dir)
            self._notify(change)
        for late in settled:
            _settle(late)  # after the listeners: a call waiting on it finds the new tools
        return change

    def _save_cache(self, tools_dir: ToolsDir) -> None:
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

    def _skipped_changed(self, tools_dir: ToolsDir, skipped: list[Skipped]) -> None:
        """Entries that cannot be modules came or went: report them (they never reach a worker)."""
        for entry in set(skipped) - set(tools_dir.skipped):
            log.warning("skipping %s: %s", entry.path, entry.message,
                        extra={"event": "module.skipped", "data": {"path": entry.path, "scope": tools_dir.scope}})
        tools_dir.skipped = skipped
        self._changed(tools_dir)
        self._notify(Change({tools_dir}, []))

    def _changed(self, tools_dir: ToolsDir) -> None:
        """Record that ``tools_dir``'s tools changed: new version, stale views dropped."""
        tools_dir.version += 1
        for project in (self.base, *self.projects.values()):
            if project.sees(tools_dir):
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
        reason = module.tools_dir.blocked_reason
        module.runner.retire(reason or "its project is not trusted")
        if reason is None:
            log.info("not loading %s: %s is not a trusted project", module.path, module.tools_dir.cwd)
        else:
            log.warning("not loading %s: %s", module.path, reason)

    def _hold(self, module: Module, deps: list[list[Any]]) -> None:
        """Withdraw a module whose content came through git, unreviewed, where it cannot run confined."""
        if deps:
            module.deps = deps
        module.tools = {}
        module.state = "held"
        module.error = None
        module.transient = False
        module.problems = []
        module.hold = self._hold_of(module.tools_dir, module.path, module.deps) or Hold([module.path], "unknown")
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

    def _lazy_load_failed(self, module: Module, failure: LoadFailure) -> None:
        """A worker started for a call could not load a module that had loaded before."""
        if module.tools_dir.modules.get(module.path) is not module:
            return
        if failure.info.get("refused"):
            # It loads content not judged trusted: judged again, and loaded as that says.
            self._scan_soon(module.tools_dir, {module.path})
            return
        self._fail(module, failure.info, transient=not failure.by_module)
        module.definitions_from = "worker"
        self._save_cache(module.tools_dir)
        self._changed(module.tools_dir)
        self._notify(Change({module.tools_dir}, [module]))

    def _lazy_loaded(self, module: Module, worker: Worker, definitions: list[dict[str, Any]]) -> None:
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
        self._save_cache(module.tools_dir)
        self._changed(module.tools_dir)
        self._notify(Change({module.tools_dir}, [module] if module.problems else []))

    def _health_changed(self, module: Module) -> None:
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
        self._notify(Change({module.tools_dir}, [module] if backoff.failing else []))

    async def rescan(self, dirs: Iterable[ToolsDir], force: bool = False) -> None:
        """Scan ``dirs`` again, one after another, asking again whether each may load and how
        confined, and retrying the modules that failed (with ``force``, loading every module again):
        ``atomic/reload`` for a project's dirs, SIGHUP for every dir. The one rescan there is."""
        for tools_dir in list(dirs):
            await self._judged(tools_dir)
            self.ensure_scanned(tools_dir)
            await self.scan(tools_dir, retry_failed=True, force=force)

    async def reload(self, project: Project, force: bool = False) -> dict[str, Any]:
        """Rescan every dir of a project (asking again whether it is trusted; with ``force``, loading
        every module of its own and the global dir again, changed or not):
        ``{success, toolCount, errors}``, and ``blocked`` when the project's own tools are."""
        await self.rescan([d for d in project.dirs if d.scope == "builtin"])
        await self.rescan([d for d in project.dirs if d.scope != "builtin"], force=force)
        await project.loaded()  # an explicit reload answers with every module's outcome
        view = project.view()
        result: dict[str, Any] = {"success": not view.errors, "toolCount": len(view.tools), "errors": view.errors}
        if view.blocked:
            result["blocked"] = view.blocked
        if view.held:
            result["held"] = view.held
        return result

    def find_modules(self, project: Project, which: str) -> list[Module]:
        """The modules of ``project`` that ``which`` names: a module's path, a tool it defines, or
        its file's stem (``lint`` for ``lint.py``); the one with precedence first. Empty when none does."""
        found: list[Module] = []
        for tools_dir in project.dirs:
            for module in tools_dir.modules.values():
                path = Path(module.path)
                if which in (module.path, path.stem, path.name) or which in module.tools:
                    found.append(module)
        return found

    async def reload_modules(self, project: Project, modules: Iterable[Module]) -> dict[str, Any]:
        """Load ``modules`` again now, changed or not (their files, or what they import, changed
        where no watcher sees it): ``{success, toolCount, errors}`` of those modules."""
        paths = {module.path for module in modules}
        for tools_dir in project.dirs:
            mine = {path for path in paths if path in tools_dir.modules}
            if mine:
                await self.scan(tools_dir, only=mine, force=True)
        await project.loaded()
        reloaded = [m for d in project.dirs for m in d.modules.values() if m.path in paths]
        errors = [entry for module in reloaded for entry in module.error_entries()]
        return {"success": not errors, "toolCount": sum(len(m.tools) for m in reloaded), "errors": errors}

    def _trust_lost(self, tools_dir: ToolsDir) -> bool:
        """Block a trusted project's own dir at once when it is trusted no more (its directory was
        replaced: a rename keeps the file watcher on the old one, so no scan would come), and
        rescan it to list the files there now."""
        if tools_dir.scope != "local" or not tools_dir.trusted or self.trusted(tools_dir.cwd):
            return False
        tools_dir.trusted = False
        self._commit(tools_dir, [(m.file, BLOCKED) for m in list(tools_dir.modules.values())], [])
        task = asyncio.ensure_future(self.scan(tools_dir))
        self._tasks.add(task)
        task.add_done_callback(self._scan_done)
        return True

    async def _admit(self, tools_dir: ToolsDir, runner: ModuleRunner) -> str | None:
        """Asked before a worker of a project's own module starts (and imports the file there now)."""
        if self._trust_lost(tools_dir) or not tools_dir.trusted:
            return f"its project is not trusted (now); {trust_offer(tools_dir.cwd)['agentMessage']}"
        if self._judge(tools_dir):
            # Its level changed and no refresh told us (the CLI found no daemon to ask): the worker
            # starts as the store says now, and a scan brings the listing in step.
            self._scan_soon(tools_dir)
            if not tools_dir.trusted:
                return tools_dir.blocked_reason or "its project is not trusted (now)"
        # Its content as it is now, not as the last scan found it: a pull the watcher has yet to
        # report, a restart that listed it from the definition cache.
        await self._judge_content(tools_dir)
        module = tools_dir.modules.get(runner.spec.path)
        hold = self._set_up(tools_dir, runner, module.deps if module is not None else [])
        self._listed[runner] = root_listing(tools_dir.cwd)
        if module is not None and self._setup_changed(module):
            self._scan_soon(tools_dir, {module.path})  # the listing follows
        if hold is not None and tools_dir.held_policy is None:
            return held_entry(runner.spec.path, hold, tools_dir.cwd, False, tools_dir.held_reason)["message"]
        return None

    def _scan_soon(self, tools_dir: ToolsDir, only: set[str] | None = None) -> None:
        """Scan ``tools_dir`` (``only`` these modules, loaded again) in a task of its own."""
        if only is None:
            task = asyncio.ensure_future(self.scan(tools_dir))
        else:
            task = asyncio.ensure_future(self.scan(tools_dir, only=only, force=True))
        self._tasks.add(task)
        task.add_done_callback(self._scan_done)

    # -- content that came through git (``holding``) ------------------------------------------------

    async def _judge_content(self, tools_dir: ToolsDir) -> None:
        """Judge again the content of a fully trusted project's own dir (``holding``)."""
        if self.content is None or tools_dir.scope != "local":
            return
        verdict = tools_dir.content = await self.content.judge(tools_dir)
        if verdict is not None and (verdict.held or verdict.stuck):
            tools_dir.held_policy, tools_dir.held_reason = self.content.held_policy(tools_dir.cwd)

    def _hold_of(self, tools_dir: ToolsDir, path: str, deps: list[list[Any]]) -> Hold | None:
        return None if self.content is None else self.content.hold(tools_dir.content, path, deps)

    def _held_here(self, tools_dir: ToolsDir, path: str, deps: list[list[Any]]) -> bool:
        """Whether the module at ``path`` is held where it cannot run confined: it does not run."""
        return self._hold_of(tools_dir, path, deps) is not None and tools_dir.held_policy is None

    def _set_up(self, tools_dir: ToolsDir, runner: ModuleRunner, deps: list[list[Any]]) -> Hold | None:
        """Make ``runner``'s next worker run as its module may now: confined as its dir is or as a held
        module is, and loading only content judged trusted. Returns why the module is held, if it is."""
        hold = self._hold_of(tools_dir, runner.spec.path, deps)
        if hold is not None:
            runner.set_up(tools_dir.held_policy, None)  # confined: whatever it loads stays inside
        else:
            runner.set_up(tools_dir.sandbox, tools_dir.content.allowed if tools_dir.content is not None else None)
        return hold

    def _setup_changed(self, module: Module) -> bool:
        """Whether ``module`` must load again: it is held or released, or confined otherwise, now."""
        tools_dir = module.tools_dir
        hold = self._hold_of(tools_dir, module.path, module.deps)
        if hold != module.hold:
            return True
        not_run = hold is not None and tools_dir.held_policy is None
        if (module.state == "held") != not_run:
            return True
        wanted = tools_dir.held_policy if hold is not None else tools_dir.sandbox
        return not not_run and module.runner.spec.sandbox != wanted

    async def _retry_refused(
        self, tools_dir: ToolsDir, results: list[tuple[ModuleFile, LoadOutcome]], deadline: float
    ) -> list[tuple[ModuleFile, LoadOutcome]]:
        """Load once more the modules whose worker refused a file of the tools dir as content not
        judged trusted: a file that changed after the judgement is judged again; held content the
        module imports holds the module with it."""
        refused = [
            i for i, (_file, outcome) in enumerate(results)
            if isinstance(outcome, NotLoaded) and outcome.failure.info.get("refused")
        ]
        if not refused:
            return results
        await self._judge_content(tools_dir)
        for i in refused:
            file, outcome = results[i]
            assert isinstance(outcome, NotLoaded)
            info = outcome.failure.info
            deps = [list(d) for d in info.get("deps") or []]
            deps += [[path, 0, 0] for path in info["refused"] if all(d[0] != path for d in deps)]
            results[i] = await self._load(tools_dir, file, deadline, deps)
        return results

    async def _builtin_admit(self, tools_dir: ToolsDir, runner: ModuleRunner) -> None:
        """Asked before a built-in's worker starts: it is made for your git configuration as it is,
        after the judgement under way, if one is (its calls wait for it)."""
        pending = self._judge_next.get(tools_dir) or self._judging.get(tools_dir)
        if pending is not None:
            await asyncio.wait([pending])  # its outcome is its asker's to hear
        policy = tools_dir.sandbox
        if policy is not None and git_config_identity(policy["git_files"]) != policy["git_config"]:
            await self._config_judged(tools_dir)
        self._made_for[runner] = tools_dir.sandbox
        runner.set_up(tools_dir.sandbox, runner.trusted_content)
        return None

    async def _check_git_config(self) -> None:
        """Judge again each confined built-in dir whose git configuration files changed since its
        policy was made (``confinement.git_config_identity``): a Landlock rule binds the file there
        when a worker started, so ``git config --global``, which writes a new ~/.gitconfig, or an
        edit that includes another file, needs a new worker. Looked at every
        ``GIT_CONFIG_INTERVAL`` seconds, not on each call: a few ``stat``s, once for every project."""
        now: dict[tuple[str, ...], list[list[int] | None]] = {}
        changed = []
        for tools_dir in list(self.dirs.values()):
            policy = tools_dir.sandbox
            if tools_dir.scope != "builtin" or policy is None:
                continue
            files = tuple(policy["git_files"])
            if files not in now:
                now[files] = git_config_identity(list(files))
            if now[files] != policy["git_config"]:
                changed.append(tools_dir)
        await asyncio.gather(*(self._config_judged(d) for d in changed))

    async def _config_judged(self, tools_dir: ToolsDir) -> None:
        """Judge again a built-in dir whose git configuration files changed; meanwhile a call waits
        for a worker made for them as they are now rather than go to one made before."""
        self._config_changed.add(tools_dir)
        try:
            await self._judged(tools_dir)
        finally:
            self._config_changed.discard(tools_dir)

    def close(self) -> None:
        """Stop looking at your git configuration and judging content (the daemon is stopping)."""
        self._git_config_check.cancel()
        if self.content is not None:
            self.content.close()

    def _confined_builtins(self) -> bool:
        return any(d.scope == "builtin" and d.sandbox is not None for d in self.dirs.values())

    async def refresh_trust(self) -> list[ToolsDir]:
        """Ask again whether each project's own dir is trusted; load or block the ones that changed.
        The dirs whose content is followed are scanned too (content may have been approved), and
        those whose project's environment changed (``trust --python``)."""
        dirs = list(self.dirs.values())
        judged = await asyncio.gather(*(self._judged(d) for d in dirs))
        changed = [tools_dir for tools_dir, changed in zip(dirs, judged, strict=True) if changed]
        again = [
            d for d in dirs
            if d not in changed and (self._environment_moved(d) or (self.content is not None and self.content.follows(d)))
        ]
        await asyncio.gather(*(self.scan(d) for d in (*changed, *again)))
        return changed

    def _environment_moved(self, tools_dir: ToolsDir) -> bool:
        """Whether the environment chosen for a project's own dir is not the one its workers run with."""
        return tools_dir.scope == "local" and self.environments is not None and self.environments.project_moved(
            str(tools_dir.cwd))

    def project_environment(self, project: Project) -> dict[str, Any] | None:
        """What ``list`` says of the project's environment: the one its tools run with, or one it
        has that could be (``environments.project.describe``)."""
        if project.root is None or project.root == self.home or self.environments is None:
            return None
        return self.environments.describe_project(str(project.root))

    def _asked(self, tools_dir: ToolsDir) -> Judgement | Callable[[], Judgement] | None:
        """What the judge says of ``tools_dir`` now (see ``judge``); None: nothing to ask."""
        if tools_dir.scope == "builtin" and any(tools_dir is shared for shared in self.builtin_dirs):
            return None  # the shared ones serve where a project's own cannot: with full rights, as the product's code
        if self.judge is not None:
            return self.judge(tools_dir)
        if tools_dir.scope == "local":
            return self.trusted(tools_dir.cwd), None, None
        return None

    def _judge(self, tools_dir: ToolsDir) -> bool:
        """Ask again whether ``tools_dir`` (the global dir or a project's own) may load, and how
        confined; True when that changed. A built-in dir is judged by ``_judged``."""
        judgement = self._asked(tools_dir)
        if callable(judgement):
            raise TypeError(f"{tools_dir.path} for {tools_dir.cwd} is judged in a thread: await _judged")
        return judgement is not None and self._apply(tools_dir, judgement)

    async def _judged(self, tools_dir: ToolsDir) -> bool:
        """``_judge`` for any dir; a project's own built-in dir is judged in a thread, as its judge
        runs git and walks the file system (``confinement.builtin_policy``), which must never hold
        up the event loop and every client with it.

        One judgement of a dir runs at a time. Whoever asks while one runs is answered by the next,
        begun once it is done and shared by all who ask meanwhile: a change noticed during a
        judgement is judged, and an older judgement is never applied after a newer one. True when
        the judgement changed since this was asked."""
        if tools_dir.scope != "builtin" or self.judge is None or any(tools_dir is d for d in self.builtin_dirs):
            return self._judge(tools_dir)
        before = (tools_dir.trusted, tools_dir.sandbox, tools_dir.blocked_reason)
        next_one = self._judge_next.get(tools_dir)
        if next_one is None:
            next_one = asyncio.ensure_future(self._judge_in_turn(tools_dir, self._judging.get(tools_dir)))
            self._judge_next[tools_dir] = next_one
            self._tasks.add(next_one)
            next_one.add_done_callback(self._scan_done)
        await asyncio.shield(next_one)  # an asker that goes away leaves it to the others
        return (tools_dir.trusted, tools_dir.sandbox, tools_dir.blocked_reason) != before

    async def _judge_in_turn(self, tools_dir: ToolsDir, previous: asyncio.Future[None] | None) -> None:
        if previous is not None:
            await asyncio.wait([previous])
        this = self._judging[tools_dir] = self._judge_next.pop(tools_dir)
        try:
            judgement = self._asked(tools_dir)  # the trust store is read here, on the loop
            if callable(judgement):
                judgement = await asyncio.get_running_loop().run_in_executor(None, judgement)
            if judgement is not None and self._apply(tools_dir, judgement) and tools_dir.sandbox is not None:
                self._git_config_check.start()
        finally:
            if self._judging.get(tools_dir) is this:
                del self._judging[tools_dir]

    def _apply(self, tools_dir: ToolsDir, judgement: Judgement) -> bool:
        changed = judgement != (tools_dir.trusted, tools_dir.sandbox, tools_dir.blocked_reason)
        if changed:  # the same policy stays the same object: a built-in's worker is replaced when it is not
            tools_dir.trusted, tools_dir.sandbox, tools_dir.blocked_reason = judgement
        return changed

    def info(self) -> dict[str, Any]:
        return {
            "projects": [
                {"root": str(root), "tools": len(p.view().tools), "dirs": [str(d.path) for d in p.dirs],
                 "trust": _trust_of(p)}
                for root, p in self.projects.items()
            ],
            "modules": [m.info() for d in self.dirs.values() for m in d.modules.values()],
            "skipped": [s.entry(d.scope) for d in self.dirs.values() for s in d.skipped],
        }


def _trust_of(project: Project) -> str | None:
    """How a project's own tools may run, in a word for ``status``: ``trusted``, ``sandboxed``
    (trusted with ``--sandbox``), ``untrusted`` (blocked until ``trust``) or ``blocked`` (for
    another reason, said in its modules' ``blockedReason``); None without a tools dir of its own."""
    own = project.dirs[0] if project.root is not None and project.dirs else None
    if own is None or own.scope != "local":
        return None
    if not own.trusted:
        return "untrusted" if own.blocked_reason is None else "blocked"
    return "sandboxed" if own.sandbox is not None else "trusted"
