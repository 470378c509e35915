"""Scanning tools dirs: loading their new and changed modules, and checking that each load read what
is on disk before it is committed (``commits``).

A scan loads changed modules in parallel, then commits them in one synchronous step (tools swapped
and new worker generations installed together), so a call never sees a half-updated directory.
Module definitions come from a worker that loaded the module or, when it is fresh, from the
definition cache (``cache``): after a restart, listing starts no worker, and a module's worker
starts on its first call.

No scan waits on one slow module for longer than ``load_wait``: it commits what has loaded by then,
and a module still importing is committed on its own when it is done (a new module is listed as
``loading`` meanwhile; one that served keeps serving its previous generation). A module whose import
outlived ``load_timeout`` failed by its own doing: that is cached like any load error, so a restart
does not wait for it again.

A load is committed only when what its worker read is what is on disk: the module file and every
helper it imported from its tools dir, byte for byte, once those helpers have been left alone for a
moment (``ondisk.HELPER_SETTLE``). A load that read a file half-written is loaded again; the module
keeps serving its previous generation meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Iterable
from typing import Any

from atomictoolsd.config.discovery import ModuleFile, list_module_files, scan_tools_dir
from atomictoolsd.pool.pool import WorkerPool
from atomictoolsd.registry.cache import DefinitionCache
from atomictoolsd.registry.commits import Commits
from atomictoolsd.registry.confinement import root_listing
from atomictoolsd.registry.lifetimes import Lifetimes, track
from atomictoolsd.registry.model import Change, LateLoad, ToolsDir
from atomictoolsd.registry.ondisk import read_back, settle_helpers
from atomictoolsd.registry.outcome import (
    BLOCKED,
    Cached,
    Held,
    Late,
    Loaded,
    LoadOutcome,
    NotLoaded,
    discard,
    load_outcome,
)

__all__ = ["CONFIRM_SETTLE", "Scanner"]

log = logging.getLogger("atomictoolsd.registry")

CONFIRM_SETTLE = 0.25  # seconds before a serving module's failed reload is tried again


def _reads(outcome: LoadOutcome) -> tuple[list[int] | None, list[list[Any]]]:
    """What a load's worker read: ``[size, crc32]`` of the module file, ``[path, size, crc32]`` of each helper."""
    match outcome:
        case Loaded(worker=worker):
            return worker.fingerprint, worker.helpers
        case NotLoaded(failure=failure):
            return failure.info.get("fingerprint"), failure.info.get("helpers") or []
        case _:
            return None, []  # nothing was read by a worker (blocked, cached, no worker, still loading)


def _torn_or_to_read(
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


async def _listing(tools_dir: ToolsDir) -> dict[str, ModuleFile]:
    """The module files of ``tools_dir`` by path, listed in a thread: a directory holds whatever its
    repository put there (100,000 entries take the listing hundreds of milliseconds)."""
    return {f.path: f for f in await asyncio.to_thread(list_module_files, tools_dir.path)}


def _loading(tools_dir: ToolsDir, file: ModuleFile) -> bool:
    late = tools_dir.loading.get(file.path)
    return late is not None and late.file.key == file.key


class Scanner:
    """Scans the registry's tools dirs and loads their modules; ``commits`` commits what loaded.

    Args:
        load_wait: seconds a scan waits for its loads before it commits those done (the others
            commit on their own when done).
    """

    def __init__(
        self, pool: WorkerPool, cache: DefinitionCache | None, commits: Commits, lifetimes: Lifetimes, load_wait: float,
    ) -> None:
        self.pool = pool
        self.cache = cache
        self.commits = commits
        self.lifetimes = lifetimes
        self.load_wait = load_wait
        self._tasks: set[asyncio.Future[Any]] = set()  # scans under way: kept until done

    def ensure_scanned(self, tools_dir: ToolsDir) -> None:
        """Start the first scan of ``tools_dir`` unless one has started; ``tools_dir.scanned`` tells
        when it is done."""
        if tools_dir.scanned is not None:
            return
        scanned = tools_dir.scanned = asyncio.get_running_loop().create_future()
        self.lifetimes.tell_dir_listeners(tools_dir, True)

        async def first_scan() -> None:
            try:
                await self.scan(tools_dir)
            except Exception as exc:
                log.exception("scanning %s failed", tools_dir.path)
                if not scanned.done():
                    scanned.set_exception(exc)

        scanned.add_done_callback(lambda f: f.cancelled() or f.exception())  # never "never retrieved"
        task = asyncio.ensure_future(first_scan())
        track(self._tasks, task)

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
        track(self._tasks, task)
        return await asyncio.shield(task)

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
                    discard(outcome)  # something newer took its place while it waited for the lock
                    del finished[path]
            if tools_dir.retired:
                return Change(set(), [])
            # Asked on every scan: the directory may have been replaced since, or its level changed.
            await self.lifetimes.rejudge(tools_dir)
            await self.lifetimes.judge_content(tools_dir)
            trusted = tools_dir.trusted
            moved = self.lifetimes.environment_moved(tools_dir)
            files, skipped = await asyncio.to_thread(scan_tools_dir, tools_dir.path)
            on_disk = {f.path: f for f in files}
            if skipped != tools_dir.skipped:
                self.commits.skipped_changed(tools_dir, skipped)
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
                    or self.lifetimes.setup_changed(tools_dir.modules[p])  # its confinement changed, or its content's judgement
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
                    discard(outcome)  # its file changed or went: this scan judged what is there now
            return self.commits.commit(tools_dir, results, removed, self.load_later)

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
            current = await _listing(tools_dir)
            torn, to_read = _torn_or_to_read(results, current)
            loads = [(results[i][0].path, *_reads(results[i][1])) for i in to_read]
            wholes = await read_back(tools_dir.path, loads)
            torn = sorted(torn + [i for i, whole in zip(to_read, wholes, strict=True) if not whole])
            if not torn:
                return results
            for i in torn:
                discard(results[i][1])  # it loaded what is no longer on disk
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
        current = await _listing(tools_dir)
        again = [i for i in failing if results[i][0].path in current]
        retried = await asyncio.gather(*(self._load(tools_dir, current[results[i][0].path], deadline) for i in again))
        for i, result in zip(again, retried, strict=True):
            results[i] = result
        return await self._reload_torn(tools_dir, results, deadline)

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
        await self.lifetimes.judge_content(tools_dir)
        for i in refused:
            file, outcome = results[i]
            assert isinstance(outcome, NotLoaded)
            info = outcome.failure.info
            deps = [list(d) for d in info.get("deps") or []]
            deps += [[path, 0, 0] for path in info["refused"] if all(d[0] != path for d in deps)]
            results[i] = await self._load(tools_dir, file, deadline, deps)
        return results

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
            self.lifetimes.rejudge_at_once(tools_dir)
            if not tools_dir.trusted:
                return file, BLOCKED
        known = tools_dir.modules.get(file.path)
        if deps is None:
            deps = known.deps if known is not None else []
        if self.lifetimes.held_here(tools_dir, file.path, deps):
            return file, Held(tuple(deps))  # its content came through git, unreviewed, and cannot run confined here
        if self.cache is not None and known is None:
            entry = self.cache.lookup(tools_dir.path, file)  # first sight of it in this daemon's life
            if entry is not None:
                return file, Cached(entry)
        runner = self.pool.runner(file.path, file.kind, str(tools_dir.cwd), self.commits.host(tools_dir))
        self.lifetimes.set_up(tools_dir, runner, deps)
        if tools_dir.scope == "local":
            self.lifetimes.listed[runner] = root_listing(tools_dir.cwd)
        task = asyncio.ensure_future(load_outcome(file.path, runner.load()))
        await asyncio.wait([task], timeout=max(0.0, deadline - asyncio.get_running_loop().time()))
        return file, (task.result() if task.done() else Late(task))

    def load_later(self, tools_dir: ToolsDir, file: ModuleFile, task: asyncio.Future[Any]) -> None:
        """Commit the load ``task`` of ``file`` once it is done, in a scan of its own."""
        old = tools_dir.loading.get(file.path)
        done = old.done if old is not None else asyncio.get_running_loop().create_future()
        late = tools_dir.loading[file.path] = LateLoad(file, task, done)  # a load it replaces is stale
        log.info("%s is still loading after %.3g s; listing without it until it is done", file.path, self.load_wait)

        async def finish() -> None:
            outcome = await task
            if tools_dir.loading.get(file.path) is not late or tools_dir.retired:
                discard(outcome)
                return
            try:
                await self.scan(tools_dir, only={file.path}, force=True, finished={file.path: (late, outcome)})
            finally:
                if tools_dir.loading.get(file.path) is late:  # not committed (a failed scan): give up on it
                    tools_dir.loading.pop(file.path).settle()

        finisher = asyncio.ensure_future(finish())
        track(self._tasks, finisher)

    def scan_soon(self, tools_dir: ToolsDir, only: set[str] | None = None) -> None:
        """Scan ``tools_dir`` (``only`` these modules, loaded again) in a task of its own."""
        if only is None:
            task = asyncio.ensure_future(self.scan(tools_dir))
        else:
            task = asyncio.ensure_future(self.scan(tools_dir, only=only, force=True))
        track(self._tasks, task)

    async def rescan(self, dirs: Iterable[ToolsDir], force: bool = False) -> None:
        """Scan ``dirs`` again, one after another, asking again whether each may load and how
        confined, and retrying the modules that failed (with ``force``, loading every module again):
        ``atomic/reload`` for a project's dirs, SIGHUP for every dir. The one rescan there is."""
        for tools_dir in list(dirs):
            await self.lifetimes.rejudge(tools_dir)
            self.ensure_scanned(tools_dir)
            await self.scan(tools_dir, retry_failed=True, force=force)
