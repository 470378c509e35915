"""Built-in tools ``git-status`` and ``git-diff-summary``: what changed in the caller's project (and
only there: paths are limited to the project root, which may be part of a larger repository).

They never run git: the repository reader (``_gitread``, libgit2 in a process of its own) reads the
repository, and its text is laid out as git's (``_gitformat``). They are async (see ``_common``):
a reading that hangs holds no thread of the shared worker."""

from __future__ import annotations

import os
from typing import Annotated

from atomictools import Context, Field, ToolError, tool
from atomictoolsd.worker.builtins._common import inside, project_of, read_repository

__all__ = ["git_diff_summary", "git_status"]


@tool(name="git-status", annotations={"readOnlyHint": True})
async def git_status(
    ctx: Context,
    subdirectory: Annotated[
        str, Field("Only report paths under this directory (relative to the project root)", max_length=4096)
    ] | None = None,
) -> str:
    """Show the project's working tree status, one line per changed path (`git status --porcelain`:
    XY PATH, where X is the staged and Y the unstaged state; ?? means untracked)."""
    root = project_of(ctx)
    where = inside(root, subdirectory) if subdirectory else root
    if not where.is_dir():
        raise ToolError(f"{subdirectory!r} is not a directory in {root}")
    # Paths under the directory only: the project may be a part of a larger repository.
    out = (await read_repository(root, "status", "git-status", path=os.path.relpath(where, root)))["text"]
    return out if out.strip() else f"Clean: nothing to commit in {where}"


@tool(name="git-diff-summary", annotations={"readOnlyHint": True})
async def git_diff_summary(
    ctx: Context,
    staged: Annotated[bool, Field("Summarise the staged changes (the index) instead of the unstaged ones")] = False,
) -> str:
    """Summarise the project's changes per file (`git diff --stat`): lines added and removed."""
    root = project_of(ctx)
    out = (await read_repository(root, "diff", "git-diff-summary", staged=staged))["text"]
    return out if out.strip() else f"No {'staged' if staged else 'unstaged'} changes in {root}"
