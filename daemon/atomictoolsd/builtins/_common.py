"""What the built-in tools share: the caller's project root and a git that runs nothing of the repo's.

Runs inside a worker.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from atomictools import Context, ToolError
from atomictoolsd.config.discovery import project_root

__all__ = ["GIT_TIMEOUT", "MAX_READ_BYTES", "git", "home", "inside", "project_of"]

GIT_TIMEOUT = 30.0
MAX_READ_BYTES = 1024 * 1024

# A repository's own config can name programs for git to run (an fsmonitor hook, hooks such as
# post-index-change that git diff runs when it refreshes the index, clean/smudge filter drivers that
# status and diff run on changed files, an external diff, a textconv filter, a pager), and so can
# the config of each of its submodules. These tools answer questions about any project, trusted or
# not, so they switch all of that off: the hooks dir points nowhere, the filter drivers the
# repository itself defines are emptied (see ``_repo_filters``; yours, from ~/.gitconfig, still
# apply), submodules are compared by commit only (``--ignore-submodules=dirty`` runs nothing in
# them), and git diff gets --no-ext-diff --no-textconv.
_GIT_SAFETY = ("-c", "core.fsmonitor=false", "-c", "core.pager=cat", "-c", "core.hooksPath=/dev/null")
_GIT_ENV = {"GIT_OPTIONAL_LOCKS": "0", "GIT_TERMINAL_PROMPT": "0", "GIT_PAGER": "cat", "LC_ALL": "C"}
_REPO_SCOPES = ("local", "worktree")
_FILTER_KEYS = re.compile(r"^filter\.(.+)\.(clean|smudge|process)$", re.DOTALL)


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


def _repo_filters(cwd: Path, env: dict[str, str]) -> dict[str, str]:
    """Environment that empties every filter driver the repository's own config defines.

    ``GIT_CONFIG_COUNT`` pairs rather than ``-c``: a driver's name may hold ``=``, which ``-c``
    would split on. Reading the config runs nothing.
    """
    def listing(*options: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            ["git", *_GIT_SAFETY, "config", *options, "-z", "--name-only", "--get-regexp", _FILTER_KEYS.pattern],
            cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True, timeout=GIT_TIMEOUT,
        )

    listed = listing("--show-scope")
    fields = listed.stdout.decode("utf-8", "surrogateescape").split("\0")
    drivers = {
        match.group(1)
        for scope, key in zip(fields[::2], fields[1::2], strict=False)
        if scope in _REPO_SCOPES and (match := _FILTER_KEYS.match(key))
    }
    if listed.returncode not in (0, 1):  # 1: none defined; else a git before 2.26: empty every driver
        fields = listing().stdout.decode("utf-8", "surrogateescape").split("\0")
        drivers = {match.group(1) for key in fields if (match := _FILTER_KEYS.match(key))}
    pairs = [(f"filter.{name}.{key}", "") for name in sorted(drivers) for key in ("clean", "smudge", "process")]
    pairs += [(f"filter.{name}.required", "false") for name in sorted(drivers)]
    if not pairs:
        return {}
    first = int(env.get("GIT_CONFIG_COUNT") or 0)
    extra = {"GIT_CONFIG_COUNT": str(first + len(pairs))}
    for i, (key, value) in enumerate(pairs, start=first):
        extra[f"GIT_CONFIG_KEY_{i}"] = key
        extra[f"GIT_CONFIG_VALUE_{i}"] = value
    return extra


def git(args: list[str], cwd: Path, *, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run git in ``cwd``; with ``check``, a failure is a ``ToolError`` carrying git's message."""
    env = {**os.environ, **_GIT_ENV}
    try:
        if args[0] in ("status", "diff"):  # the commands that look at file contents
            env.update(_repo_filters(cwd, env))
        done = subprocess.run(
            ["git", *_GIT_SAFETY, *args],
            cwd=cwd,
            env=env,
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
