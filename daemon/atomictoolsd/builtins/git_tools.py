"""Built-in tools ``git-status`` and ``git-diff-summary``: what changed in the caller's project (and
only there: paths are limited to the project root, which may be part of a larger repository).

They are async (see ``_common``): a git run that hangs holds no thread of the shared worker."""

from __future__ import annotations

import os
from typing import Annotated

from atomictools import Context, Field, ToolError, tool
from atomictoolsd.builtins._common import git, inside, project_of

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
    # cwd is the project root: "--" + the directory keeps it to the project when the repository is larger.
    pathspec = os.path.relpath(where, root)
    out = (await git(root, ["status", "--porcelain", "--ignore-submodules=all", "--", pathspec], "git-status", filters=True)).stdout
    return out if out.strip() else f"Clean: nothing to commit in {where}"


@tool(name="git-diff-summary", annotations={"readOnlyHint": True})
async def git_diff_summary(
    ctx: Context,
    staged: Annotated[bool, Field("Summarise the staged changes (the index) instead of the unstaged ones")] = False,
) -> str:
    """Summarise the project's changes per file (`git diff --stat`): lines added and removed."""
    root = project_of(ctx)
    args = ["diff", "--stat", "--no-ext-diff", "--no-textconv", "--no-color", "--ignore-submodules=all"]
    if staged:
        args.append("--staged")
    out = (await git(root, [*args, "--", "."], "git-diff-summary", filters=True)).stdout
    return out if out.strip() else f"No {'staged' if staged else 'unstaged'} changes in {root}"
