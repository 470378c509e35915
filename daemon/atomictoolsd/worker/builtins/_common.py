"""What the built-in tools share: the caller's project root, and a reading of its repository that
runs no program, reads nothing outside the project, never hangs, and lets no project starve another.

Runs inside a worker. The built-ins answer questions about any project, trusted or not, so
everything in a repository is taken as hostile:

- **Programs.** The git binary is never run: a repository's configuration can make it run programs
  (hooks, filter drivers, fsmonitor, an external diff, textconv, a pager, and the transport of a
  partial clone's lazy fetch: ``remote.<name>.uploadpack``, ``core.sshCommand``, ``ext::`` URLs),
  and a list of keys to switch off never keeps up with git. The repository is read with libgit2,
  which runs none of them and fetches nothing, each reading in a process of its own, forked by the
  repository reader's server (``_gitreader``, ``_gitread``), which was started from ``/`` in an
  environment that holds nothing of the daemon's: no token, no variable of yours. The request says
  where your git configuration is (``git_config_files``).
- **Where it looks.** The reader finds the repository without git's help and refuses one that
  leads outside itself (``_gitcheck``); its answer, errors included, holds nothing it read outside.
- **Hangs.** Whatever still blocks the reader (a FIFO where a ``.gitignore`` is read, a huge index)
  is cut at the call's deadline (``GIT_TIMEOUT``): its whole process group is killed and the call
  answers an error that says so.
- **Isolation.** The tools are async: a reading waits on the worker's event loop and holds no
  thread, so a project whose calls hang cannot take the threads another project's calls need.
  Each project runs at most ``PER_PROJECT`` readings at once; more wait for their own project's
  turn (within their deadline), never for another project's.

This module must never read a repository but through ``GitCall.read`` (the turn, the deadline).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from atomictools import Context, ToolError
from atomictoolsd.config.discovery import project_root, within
from atomictoolsd.worker.builtins._gitreader import ReaderGone, read

__all__ = [
    "GIT_TIMEOUT",
    "MAX_READ_BYTES",
    "PER_PROJECT",
    "GitCall",
    "NotARepository",
    "git_call",
    "git_config_files",
    "home",
    "inside",
    "project_of",
    "read_repository",
]

GIT_TIMEOUT = 10.0
"""Seconds one built-in call may spend reading the repository, all its readings together."""
PER_PROJECT = 4
"""Readings of one project that run at once; more wait their turn."""
MAX_READ_BYTES = 1024 * 1024


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



class NotARepository(ToolError):
    """The project is in no git repository."""


def git_config_files(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Your own git configuration, where git would find it: ``home`` (what ``~`` means), ``xdg``
    (``$XDG_CONFIG_HOME/git``: its ``config``, ``ignore`` and ``attributes``) and ``files``, your
    global and system config files with their level. ``GIT_CONFIG_GLOBAL``, ``GIT_CONFIG_SYSTEM``
    and ``GIT_CONFIG_NOSYSTEM`` choose them as they do for git."""
    environ = os.environ if environ is None else environ
    you = Path(environ.get("HOME") or Path.home())
    xdg = Path(environ.get("XDG_CONFIG_HOME") or you / ".config") / "git"
    files: list[list[str]] = []
    chosen = environ.get("GIT_CONFIG_GLOBAL")
    files.append([chosen or str(you / ".gitconfig"), "global"])
    if environ.get("GIT_CONFIG_NOSYSTEM", "").lower() not in ("1", "true", "yes", "on"):
        files.append([environ.get("GIT_CONFIG_SYSTEM") or "/etc/gitconfig", "system"])
    return {"home": str(you), "xdg": "" if chosen else str(xdg), "files": files}


_turns: dict[Path, asyncio.Semaphore] = {}


@asynccontextmanager
async def git_call(root: Path, what: str) -> AsyncIterator[GitCall]:
    """One built-in call's readings of the project at ``root``: waits for the project's turn, and
    gives the call its deadline (``GIT_TIMEOUT`` from now, the wait included)."""
    call = GitCall(root, time.monotonic() + GIT_TIMEOUT, what)
    turn = _turns.setdefault(root, asyncio.Semaphore(PER_PROJECT))
    try:
        await asyncio.wait_for(turn.acquire(), GIT_TIMEOUT)
    except TimeoutError:
        raise ToolError(
            f"{what} waited {GIT_TIMEOUT:g} s for this project's other repository readings ({PER_PROJECT} "
            f"at once), which are not finishing: something in the repository may be making them hang"
        ) from None
    try:
        yield call
    finally:
        turn.release()


class GitCall:
    """The repository readings of one built-in call: one project, one deadline."""

    def __init__(self, root: Path, deadline: float, what: str) -> None:
        self.root = root
        self.deadline = deadline
        self.what = what

    async def read(self, op: str, **arguments: Any) -> dict[str, Any]:
        """The reader's answer to ``op``; its refusal or error is a ``ToolError`` (``NotARepository``
        when there is no repository)."""
        request = {"op": op, "root": str(self.root), "config": git_config_files(), **arguments}
        answer = await self._run(json.dumps(request).encode())
        if "error" in answer:
            error = NotARepository if answer.get("kind") == "none" else ToolError
            prefix = "" if answer.get("kind") in ("none", "refused") else f"{self.what}: "
            raise error(f"{prefix}{answer['error']}")
        return answer

    async def _run(self, request: bytes) -> dict[str, Any]:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise self._late()
        try:
            said = await read(request, left)
        except ReaderGone as exc:
            raise ToolError(f"{self.what}: {exc}") from None
        if said is None:
            raise self._late()
        try:
            answer = json.loads(said)
        except ValueError:
            answer = None
        if not isinstance(answer, dict):  # never its raw output: it says nothing of ours
            raise ToolError(f"{self.what}: the repository reader ended without an answer")
        return answer

    def _late(self) -> ToolError:
        return ToolError(
            f"{self.what}: reading the repository did not finish within {GIT_TIMEOUT:g} s and was stopped; "
            f"something in the repository may block it (a FIFO or a device where a file is read, such as a "
            f".gitignore), or it is very large"
        )


async def read_repository(root: Path, op: str, what: str, **arguments: Any) -> dict[str, Any]:
    """One reading as a whole built-in call (see ``git_call`` for several)."""
    async with git_call(root, what) as call:
        return await call.read(op, **arguments)
