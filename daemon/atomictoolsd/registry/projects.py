"""Which tools exist for whom: the ``Registry``, which composes the three parts that keep the tools
dirs in step with the files (the types are ``model``'s).

A ``ToolsDir`` holds the modules of one directory (a project's ``.atomic/tools``, the global
``~/.atomic/tools``, or the built-ins). A ``Project`` sees several dirs in precedence order —
project-local, then global, then built-in — and its ``View`` is the merge, with every shadowed tool
and every load error kept for listing.

- ``lifetimes.Lifetimes``: the projects in use and their dirs, from first use until forgotten, and
  how each dir may run (trust, confinement, content held).
- ``scanning.Scanner``: scans and loads, and the checks that a load read what is on disk.
- ``commits.Commits``: commits what loaded in one step (tools and worker generations together),
  the definition cache, the listeners, and the hosts of the modules' runners.

The registry is their one face to the rest of the daemon, and what each part asks of another goes
through it. It knows nothing of sockets or sessions: it tells its listeners which dirs changed, and
its dir listeners which tools dirs came into use or went out of it (the file watcher watches those).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Collection, Iterable, Iterator
from pathlib import Path
from typing import Any

from atomictoolsd.config.discovery import ModuleFile, git_dirs_around, project_root
from atomictoolsd.environments import Environments
from atomictoolsd.pool.pool import WorkerPool
from atomictoolsd.registry.cache import DefinitionCache
from atomictoolsd.registry.commits import Commits
from atomictoolsd.registry.holding import ContentJudge
from atomictoolsd.registry.lifetimes import GIT_CONFIG_INTERVAL, Lifetimes
from atomictoolsd.registry.model import Change, DirListener, Judgement, LateLoad, Listener, Module, Project, ToolsDir
from atomictoolsd.registry.outcome import LoadOutcome
from atomictoolsd.registry.scanning import Scanner
from atomictoolsd.worker.gitindex import Unjudgeable, submodules_of

__all__ = ["GIT_CONFIG_INTERVAL", "Registry"]


class Registry:
    """All projects in use, the global dir and the built-ins, kept in step with the files.

    Args:
        trusted: whether a project root's own tools may load (default: every project's may).
        judge: how a tools dir may run, when its trust has levels (see ``Lifetimes``).
        cache: where module definitions are kept across restarts (None: nowhere).
        load_wait: seconds a scan waits for its loads before it commits those done (the others
            commit on their own when done).
        content: judges the content of fully trusted projects' own dirs (``holding``; None: it is
            not followed).
        trust_level: how a project root is trusted: ``full``, ``sandbox`` or None (not at all);
            by default every root fully.
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
        trust_level: Callable[[Path], str | None] | None = None,
    ) -> None:
        self.pool = pool
        self.home = home
        self.trust_level: Callable[[Path], str | None] = trust_level or (lambda root: "full")
        self.cache = cache
        self.lifetimes = Lifetimes(
            self, pool.scheduler, pool, home, builtin_dirs, trusted, cache, judge, content, environments, opencode_dirs,
        )
        self.commits = Commits(pool, cache, self.lifetimes, self)
        self.scanner = Scanner(pool, cache, self.commits, self.lifetimes, load_wait)

    # -- what the parts share -------------------------------------------------------------------

    @property
    def load_wait(self) -> float:
        return self.scanner.load_wait

    @load_wait.setter
    def load_wait(self, seconds: float) -> None:
        self.scanner.load_wait = seconds

    @property
    def dirs(self) -> dict[tuple[Path, Path], ToolsDir]:
        """Every tools dir in use, by (path, cwd)."""
        return self.lifetimes.dirs

    @property
    def projects(self) -> dict[Path, Project]:
        return self.lifetimes.projects

    @property
    def base(self) -> Project:
        """What a session attached to no project sees: the global dirs and the shared built-ins."""
        return self.lifetimes.base

    @property
    def global_dir(self) -> ToolsDir:
        return self.lifetimes.global_dir

    @property
    def global_dirs(self) -> list[ToolsDir]:
        return self.lifetimes.global_dirs

    @property
    def builtin_dirs(self) -> list[ToolsDir]:
        return self.lifetimes.builtin_dirs

    # -- listeners ------------------------------------------------------------------------------

    def add_listener(self, listener: Listener) -> None:
        self.commits.add_listener(listener)

    def remove_listener(self, listener: Listener) -> None:
        self.commits.remove_listener(listener)

    def add_dir_listener(self, listener: DirListener) -> None:
        """Call ``listener(tools_dir, True)`` when a tools dir comes into use, before its first scan,
        and ``listener(tools_dir, False)`` once it is forgotten with its project."""
        self.lifetimes.add_dir_listener(listener)

    def remove_dir_listener(self, listener: DirListener) -> None:
        self.lifetimes.remove_dir_listener(listener)

    # -- projects -------------------------------------------------------------------------------

    def project(self, directory: Path) -> Project:
        """The project of ``directory``, created (and its first scan started) on first use."""
        return self.lifetimes.project(directory)

    def untrusted_root(self, directory: Path) -> tuple[Path, str | None] | None:
        """What a program run in ``directory`` may run the content of without the user's full trust:
        the root to trust and how it is trusted now (``sandbox``, or None: not at all, or
        ``unjudged``: a repository whose submodules cannot all be known); None when there is none.

        A program reads the directory's own files (a Makefile, ``package.json``) up to its project
        root, and git the config of each repository it may find there (``git_dirs_around``). The
        project must be fully trusted, and each such git dir must belong to a fully trusted root:
        the repository it is the ``.git`` of (a repository inside a trusted project is not the
        project's), or one whose ``.git`` holds it (a submodule's, a linked worktree's). The home
        directory itself is the user's own (its dotfiles repository too), but not what lies under
        it unmarked: a directory there without a root of its own belongs to the home, which then
        counts only once trusted. The file system is looked at (a few ``stat`` calls up the tree).
        """
        home = self.home.resolve()
        try:
            real = directory.resolve()
            project = project_root(real, home)
        except (OSError, RuntimeError):  # a symlink loop on the way, a name the system refuses
            return directory, None
        if real != home:
            level = self.trust_level(project)
            if level != "full":
                return project, level
        try:
            # Lazily: the first repository not trusted ends the walk, before its index is read.
            for git_dir in itertools.chain(git_dirs_around(real), self._submodule_git_dirs(real)):
                # Its repository (a bare one is its own), and each repository whose .git holds it.
                holders = list(dict.fromkeys(
                    [*(d.parent for d in (git_dir, *git_dir.parents) if d.name == ".git"), git_dir]))
                if not any(root == home or self.trust_level(root) == "full" for root in holders):
                    return holders[0], self.trust_level(holders[0])
        except Unjudgeable as exc:
            return Path(exc.args[0]), "unjudged"
        return None

    @staticmethod
    def _submodule_git_dirs(directory: Path) -> Iterator[Path]:
        """The git dirs of the submodules the repository of ``directory`` lists in its index (git's
        ``status`` runs git in each, with its config): one cloned in place has its own ``.git``.
        Raises ``Unjudgeable`` (``gitindex.submodules_of``)."""
        for dot_git in submodules_of(str(directory)):
            if os.path.lexists(dot_git):
                yield from git_dirs_around(Path(dot_git).parent)

    def acquire(self, directory: Path) -> Project:
        """The project of ``directory`` (see ``project``), held until ``release``."""
        return self.lifetimes.acquire(directory)

    def release(self, project: Project) -> None:
        self.lifetimes.release(project)

    async def forget_idle(self, idle_for: float) -> list[Project]:
        """Forget every project nobody has held for ``idle_for`` seconds; return them."""
        return await self.lifetimes.forget_idle(idle_for)

    async def forget(self, project: Project) -> bool:
        return await self.lifetimes.forget(project)

    async def refresh_trust(self) -> list[ToolsDir]:
        """Ask again whether each project's own dir is trusted; load or block the ones that changed."""
        return await self.lifetimes.refresh_trust()

    def project_environment(self, project: Project) -> dict[str, Any] | None:
        return self.lifetimes.project_environment(project)

    def close(self) -> None:
        """Stop looking at your git configuration and judging content (the daemon is stopping)."""
        self.lifetimes.close()

    def info(self) -> dict[str, Any]:
        return self.lifetimes.info()

    # -- scanning (``lifetimes.Scans``) -------------------------------------------------------------

    def ensure_scanned(self, tools_dir: ToolsDir) -> None:
        """Start the first scan of ``tools_dir`` unless one has started."""
        self.scanner.ensure_scanned(tools_dir)

    async def scan(
        self,
        tools_dir: ToolsDir,
        only: set[str] | None = None,
        force: bool = False,
        skip: Collection[str] | Callable[[], Collection[str]] = (),
        retry_failed: bool = False,
        finished: dict[str, tuple[LateLoad, LoadOutcome]] | None = None,
    ) -> Change:
        """Bring ``tools_dir`` in step with the files (``Scanner.scan``)."""
        return await self.scanner.scan(tools_dir, only, force, skip, retry_failed, finished)

    def scan_soon(self, tools_dir: ToolsDir, only: set[str] | None = None) -> None:
        self.scanner.scan_soon(tools_dir, only)

    def commit(self, tools_dir: ToolsDir, results: list[tuple[ModuleFile, LoadOutcome]], removed: list[str]) -> Change:
        return self.commits.commit(tools_dir, results, removed, self.scanner.load_later)

    async def rescan(self, dirs: Iterable[ToolsDir], force: bool = False) -> None:
        """Scan ``dirs`` again (``Scanner.rescan``): ``atomic/reload``, SIGHUP."""
        await self.scanner.rescan(dirs, force)

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
        where no watcher sees it): ``{success, toolCount, errors}`` of those modules, and ``blocked``
        when they are (their project is not trusted)."""
        paths = {module.path for module in modules}
        for tools_dir in project.dirs:
            mine = {path for path in paths if path in tools_dir.modules}
            if mine:
                await self.scan(tools_dir, only=mine, force=True)
        await project.loaded()
        reloaded = [m for d in project.dirs for m in d.modules.values() if m.path in paths]
        errors = [entry for module in reloaded for entry in module.error_entries()]
        result: dict[str, Any] = {"success": not errors, "toolCount": sum(len(m.tools) for m in reloaded), "errors": errors}
        blocked = [entry for entry in project.view().blocked if entry["file"] in paths]
        if blocked:
            result["blocked"] = blocked
        return result
