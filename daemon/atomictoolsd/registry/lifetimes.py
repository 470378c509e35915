"""The projects in use and their tools dirs, from first use until forgotten, and how each dir may
run: trusted or not, confined or not, its content held or not.

A ``Project`` sees several dirs in precedence order — project-local, then global, then built-in.
A project's own dir loads only when the ``trusted`` predicate (or the ``judge``) says so. Until
then its modules are ``blocked``: listed by file, never loaded — no worker starts and none of their
code runs, not even to learn their tool names. In a fully trusted project, the content of each file
is judged on every scan and before every worker starts (``holding``): a module whose content came
through git and was never reviewed runs confined, or is ``held`` (not run) where it cannot be.

Projects are held, not owned: whoever serves a project ``acquire``s it and ``release``s it when
done (the server does so for each session's attachment), and ``forget_idle`` drops the projects
nobody has held for a while, with their own tools dir and its workers. A project asked for again
is rebuilt, its listing from the definition cache.

What it needs of scanning and committing it asks of the registry (``Scans``): it never imports them.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Protocol

from atomictoolsd.config.discovery import (
    ModuleFile,
    global_tools_dir,
    local_tools_dir,
    opencode_global_dirs,
    opencode_tools_dirs,
    project_root,
)
from atomictoolsd.environments import Environments
from atomictoolsd.pool.pool import ModuleRunner, WorkerPool
from atomictoolsd.registry.cache import DefinitionCache
from atomictoolsd.registry.confinement import git_config_identity, git_named_entries, root_listing
from atomictoolsd.registry.content import Hold, held_entry
from atomictoolsd.registry.holding import ContentJudge
from atomictoolsd.registry.model import Change, DirListener, Judgement, Module, Project, ToolsDir
from atomictoolsd.registry.outcome import BLOCKED, LoadOutcome
from atomictoolsd.registry.trust import trust_offer
from atomictoolsd.util.periodic import Scheduler

__all__ = ["GIT_CONFIG_INTERVAL", "Lifetimes", "Scans", "track"]

log = logging.getLogger("atomictoolsd.registry")

GIT_CONFIG_INTERVAL = 2.0  # seconds between looks whether your git configuration files changed


class Scans(Protocol):
    """What the lifetimes of projects ask of the registry's scanning and committing."""

    def ensure_scanned(self, tools_dir: ToolsDir) -> None: ...

    async def scan(self, tools_dir: ToolsDir) -> Change: ...

    def scan_soon(self, tools_dir: ToolsDir, only: set[str] | None = None) -> None: ...

    def commit(self, tools_dir: ToolsDir, results: list[tuple[ModuleFile, LoadOutcome]], removed: list[str]) -> Change: ...


def track(tasks: set[asyncio.Future[Any]], task: asyncio.Future[Any]) -> None:
    """Keep ``task`` in ``tasks`` until it is done; log its failure (its asker may be gone)."""
    tasks.add(task)
    task.add_done_callback(lambda done: _done(tasks, done))


def _done(tasks: set[asyncio.Future[Any]], task: asyncio.Future[Any]) -> None:
    tasks.discard(task)
    if not task.cancelled() and task.exception() is not None:  # retrieved: its asker may be gone
        log.warning("a scan failed: %r", task.exception())


def _opencode(tools_dir: ToolsDir) -> ToolsDir:
    tools_dir.loaded_by = "opencode"  # OpenCode loads these itself: its sessions are not offered them
    return tools_dir


class Lifetimes:
    """All projects in use, the global dir and the built-ins, and how each of their dirs may run.

    Args:
        scans: the registry's scanning and committing.
        scheduler: the daemon's loop for periodic work (the look at your git configuration).
        trusted: whether a project root's own tools may load (default: every project's may).
        judge: how a tools dir may run, when its trust has levels: ``(loads, sandbox policy or None,
            why it is blocked or None)`` for a dir (``trusted`` is then not asked). For a project's
            own built-in dir that runs confined it returns the function that makes that judgement,
            run in a thread (``rejudge``); a built-in dir judged at once runs unconfined, so the
            project uses the shared built-in dirs.
        cache: where module definitions are kept across restarts (None: nowhere).
        content: judges the content of fully trusted projects' own dirs (``holding``; None: it is
            not followed).
    """

    def __init__(
        self,
        scans: Scans,
        scheduler: Scheduler,
        pool: WorkerPool,
        home: Path,
        builtin_dirs: Iterable[ToolsDir] = (),
        trusted: Callable[[Path], bool] | None = None,
        cache: DefinitionCache | None = None,
        judge: Callable[[ToolsDir], Judgement | Callable[[], Judgement]] | None = None,
        content: ContentJudge | None = None,
        environments: Environments | None = None,
        opencode_dirs: bool = False,
    ) -> None:
        self.scans = scans
        self.pool = pool
        self.content = content
        self.environments = environments  # whose choice of a project's environment may change (trust --python)
        self.opencode_dirs = opencode_dirs  # OpenCode's tool dirs are tools dirs too (a project's, the user's)
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
            self.rejudge_at_once(tools_dir)
        self.builtin_dirs = list(builtin_dirs)
        # By (path, cwd): a project's own built-in dir has the shared one's path (``_builtins``).
        self.dirs: dict[tuple[Path, Path], ToolsDir] = {d.key: d for d in self.global_dirs}
        for tools_dir in self.builtin_dirs:
            self.dirs[tools_dir.key] = tools_dir
        self.projects: dict[Path, Project] = {}
        self.base = Project(None, [*self.global_dirs, *self.builtin_dirs])
        self._dir_listeners: list[DirListener] = []
        self._tasks: set[asyncio.Future[Any]] = set()  # judgements under way: kept until done
        # A built-in dir's judgement under way in its thread, and the one asked for meanwhile (``rejudge``).
        self._judging: dict[ToolsDir, asyncio.Future[None]] = {}
        self._judge_next: dict[ToolsDir, asyncio.Future[None]] = {}
        # Built-in dirs judged again because your git configuration changed: until that is done, their
        # workers (made for the files as they were) take no call (``BuiltinHost.stale``).
        self.config_changed: set[ToolsDir] = set()
        # What a confined project's root held when its module's last worker was made (``root_listing``):
        # the worker may write the entries there then, no other (``sandbox._add_split``), so one made
        # since (mkdir build) sends the next call to a new worker.
        self.listed: weakref.WeakKeyDictionary[ModuleRunner, tuple[int, int] | None] = weakref.WeakKeyDictionary()
        # The policy a confined built-in's current worker was made for: a new one (a trust or git
        # configuration change, ``_check_git_config``) sends the next call to a new worker.
        self.made_for: weakref.WeakKeyDictionary[ModuleRunner, dict[str, Any] | None] = weakref.WeakKeyDictionary()
        self._git_config_check = scheduler.every(
            "checking your git configuration", self._check_git_config, GIT_CONFIG_INTERVAL,
            while_=self._confined_builtins, logger=log,
        )

    def add_dir_listener(self, listener: DirListener) -> None:
        """Call ``listener(tools_dir, True)`` when a tools dir comes into use, before its first scan,
        and ``listener(tools_dir, False)`` once it is forgotten with its project."""
        self._dir_listeners.append(listener)

    def remove_dir_listener(self, listener: DirListener) -> None:
        self._dir_listeners.remove(listener)

    def tell_dir_listeners(self, tools_dir: ToolsDir, in_use: bool) -> None:
        for listener in list(self._dir_listeners):
            try:
                listener(tools_dir, in_use)
            except Exception:  # a listener's bug must not keep a project from loading or going
                log.exception("registry dir listener failed")

    def project(self, directory: Path) -> Project:
        """The project of ``directory``, created (and its first scan started) on first use."""
        root = project_root(directory, self.home)
        project = self.projects.get(root)
        if project is None:
            project = self.projects[root] = Project(root, [*self._local_dirs(root), *self.global_dirs, *self._builtins(root)])
        else:
            for tools_dir in project.dirs:
                if tools_dir.scope == "local":
                    self.trust_lost(tools_dir)
        for tools_dir in project.dirs:
            self.scans.ensure_scanned(tools_dir)
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
                self.rejudge_at_once(local)
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
                if not callable(self._ask_judge(own)):
                    dirs.append(shared)
                    continue
                self.dirs[own.key] = own
            dirs.append(own)
        return dirs

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
                    late.settle()  # its finisher sees the dir retired and stops what it loaded
                tools_dir.loading.clear()
                if self.cache is not None and tools_dir.scope == "local":  # a built-in's entry is shared
                    self.cache.forget(tools_dir.path)
                self.tell_dir_listeners(tools_dir, False)
        finally:
            for tools_dir in own:
                tools_dir.lock.release()
        log.info(
            "forgot the project %s: no session has used it for a while", root,
            extra={"event": "project.forget", "data": {"root": str(root)}},
        )
        return True

    def seeing(self, tools_dir: ToolsDir) -> list[Project]:
        """The projects in use that see ``tools_dir`` (the base project among them)."""
        return [project for project in (self.base, *self.projects.values()) if project.sees(tools_dir)]

    def trust_lost(self, tools_dir: ToolsDir) -> bool:
        """Block a trusted project's own dir at once when it is trusted no more (its directory was
        replaced: a rename keeps the file watcher on the old one, so no scan would come), and
        rescan it to list the files there now."""
        if tools_dir.scope != "local" or not tools_dir.trusted or self.trusted(tools_dir.cwd):
            return False
        tools_dir.trusted = False
        self.scans.commit(tools_dir, [(m.file, BLOCKED) for m in list(tools_dir.modules.values())], [])
        self.scans.scan_soon(tools_dir)
        return True

    async def admit(self, tools_dir: ToolsDir, runner: ModuleRunner) -> str | None:
        """Asked before a worker of a project's own module starts (and imports the file there now)."""
        if self.trust_lost(tools_dir) or not tools_dir.trusted:
            return f"its project is not trusted (now); {trust_offer(tools_dir.cwd)['agentMessage']}"
        if self.rejudge_at_once(tools_dir):
            # Its level changed and no refresh told us (the CLI found no daemon to ask): the worker
            # starts as the store says now, and a scan brings the listing in step.
            self.scans.scan_soon(tools_dir)
            if not tools_dir.trusted:
                return tools_dir.blocked_reason or "its project is not trusted (now)"
        # Its content as it is now, not as the last scan found it: a pull the watcher has yet to
        # report, a restart that listed it from the definition cache.
        await self.judge_content(tools_dir)
        module = tools_dir.modules.get(runner.spec.path)
        hold = self.set_up(tools_dir, runner, module.deps if module is not None else [])
        self.listed[runner] = root_listing(tools_dir.cwd)
        if module is not None and self.setup_changed(module):
            self.scans.scan_soon(tools_dir, {module.path})  # the listing follows
        if hold is not None and tools_dir.held_policy is None:
            return held_entry(runner.spec.path, hold, tools_dir.cwd, False, tools_dir.held_reason)["message"]
        return None

    async def judge_content(self, tools_dir: ToolsDir) -> None:
        """Judge again the content of a fully trusted project's own dir (``holding``)."""
        if self.content is None or tools_dir.scope != "local":
            return
        verdict = tools_dir.content = await self.content.judge(tools_dir)
        if verdict is not None and (verdict.held or verdict.stuck):
            tools_dir.held_policy, tools_dir.held_reason = self.content.held_policy(tools_dir.cwd)

    def hold_of(self, tools_dir: ToolsDir, path: str, deps: list[list[Any]]) -> Hold | None:
        return None if self.content is None else self.content.hold(tools_dir.content, path, deps)

    def held_here(self, tools_dir: ToolsDir, path: str, deps: list[list[Any]]) -> bool:
        """Whether the module at ``path`` is held where it cannot run confined: it does not run."""
        return self.hold_of(tools_dir, path, deps) is not None and tools_dir.held_policy is None

    def set_up(self, tools_dir: ToolsDir, runner: ModuleRunner, deps: list[list[Any]]) -> Hold | None:
        """Make ``runner``'s next worker run as its module may now: confined as its dir is or as a held
        module is, and loading only content judged trusted. Returns why the module is held, if it is."""
        hold = self.hold_of(tools_dir, runner.spec.path, deps)
        if hold is not None:
            runner.set_up(tools_dir.held_policy, None)  # confined: whatever it loads stays inside
        else:
            runner.set_up(tools_dir.sandbox, tools_dir.content.allowed if tools_dir.content is not None else None)
        return hold

    def setup_changed(self, module: Module) -> bool:
        """Whether ``module`` must load again: it is held or released, or confined otherwise, now."""
        tools_dir = module.tools_dir
        hold = self.hold_of(tools_dir, module.path, module.deps)
        if hold != module.hold:
            return True
        not_run = hold is not None and tools_dir.held_policy is None
        if (module.state == "held") != not_run:
            return True
        wanted = tools_dir.held_policy if hold is not None else tools_dir.sandbox
        return not not_run and module.runner.spec.sandbox != wanted

    async def builtin_admit(self, tools_dir: ToolsDir, runner: ModuleRunner) -> None:
        """Asked before a built-in's worker starts: it is made for your git configuration as it is,
        after the judgement under way, if one is (its calls wait for it)."""
        pending = self._judge_next.get(tools_dir) or self._judging.get(tools_dir)
        if pending is not None:
            await asyncio.wait([pending])  # its outcome is its asker's to hear
        policy = tools_dir.sandbox
        if policy is not None and git_config_identity(policy["git_files"]) != policy["git_config"]:
            await self._rejudge_for_git_config(tools_dir)
        self.made_for[runner] = tools_dir.sandbox
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
        await asyncio.gather(*(self._rejudge_for_git_config(d) for d in changed))

    async def _rejudge_for_git_config(self, tools_dir: ToolsDir) -> None:
        """Judge again a built-in dir whose git configuration files changed; meanwhile a call waits
        for a worker made for them as they are now rather than go to one made before."""
        self.config_changed.add(tools_dir)
        try:
            await self.rejudge(tools_dir)
        finally:
            self.config_changed.discard(tools_dir)

    def close(self) -> None:
        """Stop looking at your git configuration and judging content (the daemon is stopping)."""
        self._git_config_check.cancel()
        if self.content is not None:
            self.content.close()

    def _confined_builtins(self) -> bool:
        return any(d.scope == "builtin" and d.sandbox is not None for d in self.dirs.values())

    async def refresh_trust(self) -> list[ToolsDir]:
        """Ask again whether each project's own dir is trusted; load or block the ones that changed,
        and load again those whose project's environment changed (``trust --python``): both are
        returned (what ``trust`` says the daemon did). The dirs whose content is followed are
        scanned too (content may have been approved)."""
        dirs = list(self.dirs.values())
        judged = await asyncio.gather(*(self.rejudge(d) for d in dirs))
        changed = [tools_dir for tools_dir, changed in zip(dirs, judged, strict=True) if changed]
        moved = [d for d in dirs if d not in changed and self.environment_moved(d)]
        again = [
            d for d in dirs
            if d not in changed and d not in moved and self.content is not None and self.content.follows(d)
        ]
        await asyncio.gather(*(self.scans.scan(d) for d in (*changed, *moved, *again)))
        return [*changed, *moved]

    def environment_moved(self, tools_dir: ToolsDir) -> bool:
        """Whether the environment chosen for a project's own dir is not the one its workers run with."""
        return tools_dir.scope == "local" and self.environments is not None and self.environments.project_moved(
            str(tools_dir.cwd))

    def project_environment(self, project: Project) -> dict[str, Any] | None:
        """What ``list`` says of the project's environment: the one its tools run with, or one it
        has that could be (``environments.project.describe``)."""
        if project.root is None or project.root == self.home or self.environments is None:
            return None
        return self.environments.describe_project(str(project.root))

    def _ask_judge(self, tools_dir: ToolsDir) -> Judgement | Callable[[], Judgement] | None:
        """What the judge says of ``tools_dir`` now (see ``judge``); None: nothing to ask."""
        if tools_dir.scope == "builtin" and any(tools_dir is shared for shared in self.builtin_dirs):
            return None  # the shared ones serve where a project's own cannot: with full rights, as the product's code
        if self.judge is not None:
            return self.judge(tools_dir)
        if tools_dir.scope == "local":
            return self.trusted(tools_dir.cwd), None, None
        return None

    def rejudge_at_once(self, tools_dir: ToolsDir) -> bool:
        """Ask again whether ``tools_dir`` (the global dir or a project's own) may load, and how
        confined; True when that changed. A built-in dir is judged by ``rejudge``."""
        judgement = self._ask_judge(tools_dir)
        if callable(judgement):
            raise TypeError(f"{tools_dir.path} for {tools_dir.cwd} is judged in a thread: await rejudge")
        return judgement is not None and self._apply_judgement(tools_dir, judgement)

    async def rejudge(self, tools_dir: ToolsDir) -> bool:
        """``rejudge_at_once`` for any dir; a project's own built-in dir is judged in a thread, as its judge
        runs git and walks the file system (``confinement.builtin_policy``), which must never hold
        up the event loop and every client with it.

        One judgement of a dir runs at a time. Whoever asks while one runs is answered by the next,
        begun once it is done and shared by all who ask meanwhile: a change noticed during a
        judgement is judged, and an older judgement is never applied after a newer one. True when
        the judgement changed since this was asked."""
        if tools_dir.scope != "builtin" or self.judge is None or any(tools_dir is d for d in self.builtin_dirs):
            if tools_dir.scope == "local" and tools_dir.sandbox is not None:
                # What the repository's git config names (``git config`` once for each file it reads)
                # is read in a thread: the policy made on the loop below finds it there.
                await asyncio.to_thread(git_named_entries, tools_dir.cwd, self.home)
            return self.rejudge_at_once(tools_dir)
        before = (tools_dir.trusted, tools_dir.sandbox, tools_dir.blocked_reason)
        next_one = self._judge_next.get(tools_dir)
        if next_one is None:
            next_one = asyncio.ensure_future(self._rejudge_in_turn(tools_dir, self._judging.get(tools_dir)))
            self._judge_next[tools_dir] = next_one
            track(self._tasks, next_one)
        await asyncio.shield(next_one)  # an asker that goes away leaves it to the others
        return (tools_dir.trusted, tools_dir.sandbox, tools_dir.blocked_reason) != before

    async def _rejudge_in_turn(self, tools_dir: ToolsDir, previous: asyncio.Future[None] | None) -> None:
        if previous is not None:
            await asyncio.wait([previous])
        this = self._judging[tools_dir] = self._judge_next.pop(tools_dir)
        try:
            judgement = self._ask_judge(tools_dir)  # the trust store is read here, on the loop
            if callable(judgement):
                judgement = await asyncio.get_running_loop().run_in_executor(None, judgement)
            if judgement is not None and self._apply_judgement(tools_dir, judgement) and tools_dir.sandbox is not None:
                self._git_config_check.start()
        finally:
            if self._judging.get(tools_dir) is this:
                del self._judging[tools_dir]

    def _apply_judgement(self, tools_dir: ToolsDir, judgement: Judgement) -> bool:
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
