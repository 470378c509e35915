"""What the built-in tools share: the caller's project root, and a git that runs nothing of the
repository's, reads nothing outside the project, never hangs, and lets no project starve another.

Runs inside a worker. The built-ins answer questions about any project, trusted or not, so
everything in a repository is taken as hostile:

- **Programs.** A repository's config can name programs for git to run (an fsmonitor hook, hooks
  such as post-index-change that git diff runs when it refreshes the index, clean/smudge filter
  drivers, an external diff, a textconv filter, a pager). All are switched off: the hooks dir
  points nowhere, the filter drivers the repository defines are emptied (``_repo_filters``; yours,
  from ~/.gitconfig, still apply), git diff gets --no-ext-diff --no-textconv.
- **Where git looks.** Git is never left to discover the repository: ``GIT_DIR`` and
  ``GIT_WORK_TREE`` are set to the ``.git`` that ``_repository`` found and checked, so
  ``core.worktree`` and ``core.bare`` are moot; a ``.git`` file is followed only to a linked
  worktree or submodule dir that names it back; an unowned repository is refused as git would
  (``safe.directory``, which only your own config may set). The repository's config files and
  everything they include must be regular files of at most ``MAX_CONFIG_BYTES`` inside the
  repository, and so must the files it names for git to read (``core.excludesFile``,
  ``core.attributesFile``, ``diff.orderFile``); submodules are not looked into (a submodule's
  ``.git`` may point anywhere). Every ``GIT_*`` variable of the caller's environment that could
  redirect git is dropped.
- **Hangs.** Whatever still blocks git (a FIFO where git reads a ``.gitignore``, a huge index) is
  cut at the call's deadline (``GIT_TIMEOUT``): its whole process group is killed and the call
  answers an error that says so.
- **Isolation.** The tools are async: a git run waits on the worker's event loop and holds no
  thread, so a project whose calls hang cannot take the threads another project's calls need.
  Each project runs at most ``PER_PROJECT`` git calls at once; more wait for their own project's
  turn (within their deadline), never for another project's.

This module must never run git without ``_run`` (the deadline, the pinned environment).
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import NamedTuple

from atomictools import Context, ToolError
from atomictoolsd.config.discovery import (
    GIT_INCLUDE_KEYS,
    GIT_PATH_KEYS,
    KEPT_GIT_VARS,
    Repository,
    RepositoryRefused,
    git_config_path,
    locate_repository,
    project_root,
    regular_file,
    within,
)

__all__ = [
    "GIT_TIMEOUT",
    "MAX_CONFIG_BYTES",
    "MAX_READ_BYTES",
    "PER_PROJECT",
    "GitCall",
    "NotARepository",
    "GitResult",
    "Repository",
    "git",
    "git_call",
    "home",
    "inside",
    "project_of",
]

GIT_TIMEOUT = 10.0
"""Seconds one built-in call may spend running git, all its runs together."""
PER_PROJECT = 4
"""Git calls of one project that run at once; more wait their turn."""
MAX_READ_BYTES = 1024 * 1024
MAX_CONFIG_BYTES = 1024 * 1024

_GIT_SAFETY = (
    "-c", "core.fsmonitor=false", "-c", "core.pager=cat", "-c", "core.hooksPath=/dev/null",
    "-c", "core.untrackedCache=false",
)
_GIT_ENV = {"GIT_OPTIONAL_LOCKS": "0", "GIT_TERMINAL_PROMPT": "0", "GIT_PAGER": "cat", "LC_ALL": "C"}
_REPO_SCOPES = ("local", "worktree")
_FILTER_KEYS = re.compile(r"^filter\.(.+)\.(clean|smudge|process)$", re.DOTALL)
_INCLUDE_DEPTH = 10  # git's own limit
_GIT_DIR_FILES = (
    "HEAD", "config", "config.worktree", "index", "packed-refs", "commondir", "gitdir", "shallow",
    "info/exclude", "info/attributes", "info/grafts", "objects/info/alternates",
)


def home() -> Path:
    return Path(os.environ.get("HOME") or Path.home())


def project_of(ctx: Context) -> Path:
    """The project root of the caller's directory (as the daemon finds it)."""
    if not ctx.directory:
        raise ToolError("This session has no project directory; the client must attach one first (atomic/attach)")
    return project_root(Path(ctx.directory), home())


def inside(root: Path, relative: str) -> Path:
    """``relative`` resolved against ``root`` (symlinks followed), refused when it leaves ``root``."""
    if "\x00" in relative:
        raise ToolError("Refused: the path contains a NUL byte")
    target = (root / relative).resolve()
    if not within(target, root):
        raise ToolError(f"Refused: {relative!r} is outside the project root {root}")
    return target


# -- the repository -------------------------------------------------------------------------------


def _owned(path: Path, worktree: Path) -> None:
    """Refuse a repository another user owns, as git does: only your own config may vouch for one
    (``safe.directory``); explicit ``GIT_DIR`` would skip git's own check."""
    try:
        owner = os.stat(path).st_uid
    except OSError:
        return
    if owner == os.geteuid() or _vouched(worktree):
        return
    raise ToolError(
        f"Refused: {path} belongs to uid {owner}, not to you; git does not read such a repository "
        f"unless you say so in your own config: git config --global --add safe.directory {worktree}"
    )


class NotARepository(ToolError):
    """The project is in no git repository."""


def _vouched(worktree: Path) -> bool:
    """Whether your own config (system, global; never the repository's) lists ``worktree`` as a
    ``safe.directory``, as git asks it. Asked only for a repository someone else owns."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_") or k in KEPT_GIT_VARS}
    try:
        listed = subprocess.run(
            ["git", "config", "--get-all", "safe.directory"], cwd="/", env={**env, "GIT_DIR": "/nonexistent"},
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=GIT_TIMEOUT,
        ).stdout.splitlines()
    except (OSError, subprocess.TimeoutExpired):
        return False
    safe = set()
    for value in listed:  # an empty value resets the list, as in git
        safe = set() if not value else safe | {value}
    return "*" in safe or str(worktree) in safe or f"{worktree}/" in safe


def _repository(root: Path) -> Repository:
    """The repository of the project at ``root``, checked as the module docstring says."""
    try:
        repository = locate_repository(root)
        if repository is None:
            raise NotARepository(f"{root} is not inside a git repository")
        top, common_dir = repository.worktree, repository.common_dir
        _owned(top, top)
        _owned(common_dir, top)
        for directory in {repository.git_dir, repository.common_dir}:
            for name in _GIT_DIR_FILES:
                regular_file(directory / name, "the git file")
        # The ones at the top are read by every status and diff; deeper ones are left to the deadline
        # (looking for them would mean walking the whole tree before git does).
        for directory in {repository.worktree, root.resolve()}:
            for name in (".gitignore", ".gitattributes"):
                if os.path.lexists(directory / name):
                    regular_file(directory / name, "the file")
    except RepositoryRefused as exc:
        raise ToolError(str(exc)) from None
    return repository


# -- running git ----------------------------------------------------------------------------------


class GitResult(NamedTuple):
    returncode: int
    stdout: str
    stderr: str


_turns: dict[Path, asyncio.Semaphore] = {}


@asynccontextmanager
async def git_call(root: Path, what: str) -> AsyncIterator[GitCall]:
    """One built-in call's use of git for the project at ``root``: waits for the project's turn,
    and gives the call its deadline (``GIT_TIMEOUT`` from now, the wait included)."""
    call = GitCall(root, time.monotonic() + GIT_TIMEOUT, what)
    turn = _turns.setdefault(root, asyncio.Semaphore(PER_PROJECT))
    try:
        await asyncio.wait_for(turn.acquire(), GIT_TIMEOUT)
    except TimeoutError:
        raise ToolError(
            f"{what} waited {GIT_TIMEOUT:g} s for this project's other git calls ({PER_PROJECT} at once), "
            f"which are not finishing: something in the repository may be making git hang"
        ) from None
    try:
        yield call
    finally:
        turn.release()


class GitCall:
    """The git runs of one built-in call: one repository, one deadline."""

    def __init__(self, root: Path, deadline: float, what: str) -> None:
        self.root = root
        self.deadline = deadline
        self.what = what
        self._repository: Repository | None = None
        self._env: dict[str, str] | None = None

    def repository(self) -> Repository:
        if self._repository is None:
            self._repository = _repository(self.root)
        return self._repository

    async def _environment(self) -> dict[str, str]:
        if self._env is None:
            repository = self.repository()
            env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_") or k in KEPT_GIT_VARS}
            env.update(_GIT_ENV)
            env["GIT_DIR"] = str(repository.git_dir)
            env["GIT_WORK_TREE"] = str(repository.worktree)
            self._env = env
            try:
                await self._check_config(repository)
            except RepositoryRefused as exc:
                self._env = None  # never a run with a repository that failed its check
                raise ToolError(str(exc)) from None
            except BaseException:
                self._env = None
                raise
        return self._env

    async def _check_config(self, repository: Repository) -> None:
        """Refuse a repository whose config reads outside it, or could block git (see the module)."""
        files = [repository.common_dir / "config", repository.git_dir / "config.worktree"]
        seen: set[Path] = set()
        depth = 0
        while files:
            depth += 1
            if depth > _INCLUDE_DEPTH * 8:
                raise ToolError("Refused: the repository's config includes too many files")
            config = files.pop()
            if config in seen or not regular_file(config, "the repository's config", MAX_CONFIG_BYTES):
                continue
            seen.add(config)
            for key, value in await self._config_entries(config):
                lowered = key.lower()
                if GIT_INCLUDE_KEYS.match(lowered):
                    target = git_config_path(value, config.parent, home())
                    if not repository.holds(target):
                        raise ToolError(
                            f"Refused: the repository's config ({config}) includes {target}, outside the "
                            f"repository; the built-ins read nothing outside the project"
                        )
                    files.append(target)
                elif lowered in GIT_PATH_KEYS and value:
                    target = git_config_path(value, repository.worktree, home())
                    if not repository.holds(target):
                        raise ToolError(f"Refused: the repository's config sets {key} to {target}, outside the repository")
                    regular_file(target, f"{key}", MAX_CONFIG_BYTES)

    async def _config_entries(self, config: Path) -> Iterator[tuple[str, str]]:
        done = await self._run(["config", "--file", str(config), "--no-includes", "-z", "--list"], check_config=False)
        if done.returncode != 0:
            raise ToolError(f"git cannot read the repository's config {config}: {done.stderr.strip()}")
        entries = []
        for item in done.stdout.split("\0"):
            key, _, value = item.partition("\n")
            if key:
                entries.append((key, value))
        return iter(entries)

    async def run(self, args: list[str], *, check: bool = True, filters: bool = False) -> GitResult:
        """Run git in the project root; with ``check``, a failure is a ``ToolError`` carrying git's message."""
        await self._environment()
        if filters:  # the commands that look at file contents
            await self._empty_filters()
        done = await self._run(args)
        if check and done.returncode != 0:
            message = done.stderr.strip() or f"exit code {done.returncode}"
            raise ToolError(f"git {args[0]} failed: {message}")
        return done

    async def _empty_filters(self) -> None:
        """Empty every filter driver the repository's own config defines (``GIT_CONFIG_COUNT`` pairs
        rather than ``-c``: a driver's name may hold ``=``, which ``-c`` would split on)."""
        assert self._env is not None
        if "GIT_CONFIG_COUNT" in self._env:
            return
        listed = await self._run(["config", "-z", "--show-scope", "--name-only", "--get-regexp", _FILTER_KEYS.pattern])
        fields = listed.stdout.split("\0")
        drivers = {
            match.group(1)
            for scope, key in zip(fields[::2], fields[1::2], strict=False)
            if scope in _REPO_SCOPES and (match := _FILTER_KEYS.match(key))
        }
        if listed.returncode not in (0, 1):  # 1: none defined; else a git before 2.26: empty every driver
            plain = await self._run(["config", "-z", "--name-only", "--get-regexp", _FILTER_KEYS.pattern])
            drivers = {match.group(1) for key in plain.stdout.split("\0") if (match := _FILTER_KEYS.match(key))}
        pairs = [(f"filter.{name}.{key}", "") for name in sorted(drivers) for key in ("clean", "smudge", "process")]
        pairs += [(f"filter.{name}.required", "false") for name in sorted(drivers)]
        self._env["GIT_CONFIG_COUNT"] = str(len(pairs))
        for i, (key, value) in enumerate(pairs):
            self._env[f"GIT_CONFIG_KEY_{i}"] = key
            self._env[f"GIT_CONFIG_VALUE_{i}"] = value

    async def _run(self, args: list[str], check_config: bool = True) -> GitResult:
        assert self._env is not None
        env = self._env
        if not check_config:
            # Reading one config file by name, before it is known to be safe: with the repository's
            # GIT_DIR, git would read that repository's config (and follow its includes) to start.
            env = {**env, "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_DIR": "/nonexistent"}
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise self._late(args)
        try:
            process = await asyncio.create_subprocess_exec(
                "git", *_GIT_SAFETY, *args,
                cwd=self.root, env=env, stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                start_new_session=True,  # its own process group: a deadline ends git and all it started
            )
        except FileNotFoundError:
            raise ToolError("git is not installed (no git on PATH)") from None
        try:
            stdout, stderr = await asyncio.wait_for(process.communicate(), left)
        except TimeoutError:
            raise self._late(args) from None
        finally:
            if process.returncode is None:  # late, or the call was cancelled
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                await process.wait()
        return GitResult(
            process.returncode or 0,
            stdout.decode("utf-8", "replace"),
            stderr.decode("utf-8", "replace"),
        )

    def _late(self, args: list[str]) -> ToolError:
        return ToolError(
            f"{self.what}: git {args[0]} did not finish within {GIT_TIMEOUT:g} s and was stopped; something in "
            f"the repository may block git (a FIFO or a device where git reads a file, such as a .gitignore), "
            f"or it is very large"
        )


async def git(root: Path, args: list[str], what: str, *, check: bool = True, filters: bool = False) -> GitResult:
    """One git run as a whole built-in call (see ``git_call`` for several)."""
    async with git_call(root, what) as call:
        return await call.run(args, check=check, filters=filters)
