"""What the built-in tools share: the caller's project root and a git that runs nothing of the repo's.

Runs inside a worker.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from atomictools import Context, ToolError
from atomictoolsd.discovery import project_root

__all__ = ["GIT_TIMEOUT", "MAX_READ_BYTES", "git", "home", "inside", "project_of"]

GIT_TIMEOUT = 30.0
MAX_READ_BYTES = 1024 * 1024

# A repository's own config can name programs for git to run (an fsmonitor hook, an external diff,
# a textconv filter, a pager). These tools answer questions about any project, trusted or not, so
# they switch those off (git diff also gets --no-ext-diff --no-textconv).
_GIT_SAFETY = ("-c", "core.fsmonitor=false", "-c", "core.pager=cat")
_GIT_ENV = {"GIT_OPTIONAL_LOCKS": "0", "GIT_TERMINAL_PROMPT": "0", "GIT_PAGER": "cat", "LC_ALL": "C"}


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
    if target != root and root not in target.parents:
        raise ToolError(f"Refused: {relative!r} is outside the project root {root}")
    return target


def _no_filters(cwd: Path) -> list[str]:
    """``-c`` options that switch off every filter driver the repository's config names.

    A repository's own ``.git/config`` can set ``filter.<driver>.clean``/``smudge``/``process`` to
    any command, and ``git status``/``git diff`` run them; the built-ins serve untrusted projects
    too. Listing the config runs nothing; an empty value disables the command.
    """
    listed = subprocess.run(
        ["git", "config", "--name-only", "--get-regexp", r"^filter\."],
        cwd=cwd, env={**os.environ, **_GIT_ENV}, stdin=subprocess.DEVNULL,
        capture_output=True, text=True, errors="replace", timeout=GIT_TIMEOUT,
    )
    drivers = sorted({name[len("filter."):].rpartition(".")[0] for name in listed.stdout.split()})
    options: list[str] = []
    for driver in drivers:
        for key in ("clean", "smudge", "process"):
            options += ["-c", f"filter.{driver}.{key}="]
        options += ["-c", f"filter.{driver}.required=false"]
    return options


def git(args: list[str], cwd: Path, *, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run git in ``cwd`` with nothing the repository configures allowed to run a command (no
    fsmonitor, pager, filters; callers add ``--no-ext-diff --no-textconv`` to diffs). With
    ``check``, a failure is a ``ToolError`` carrying git's message."""
    try:
        done = subprocess.run(
            ["git", *_GIT_SAFETY, *_no_filters(cwd), *args],
            cwd=cwd,
            env={**os.environ, **_GIT_ENV},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=GIT_TIMEOUT,
        )
    except FileNotFoundError:
        raise ToolError("git is not installed (no git on PATH)") from None
    except subprocess.TimeoutExpired:
        raise ToolError(f"git {args[0]} took longer than {GIT_TIMEOUT:g} s") from None
    if check and done.returncode != 0:
        message = done.stderr.strip() or f"exit code {done.returncode}"
        if "not a git repository" in message:
            raise ToolError(f"{cwd} is not inside a git repository")
        raise ToolError(f"git {args[0]} failed: {message}")
    return done
