"""A linter wrapper: run ruff on part of the project and hand the model its findings.

Copy into `.atomic/tools/` (or `~/.atomic/tools/`). Needs ruff in the daemon's environment
(`pip install ruff`) or on PATH.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Annotated

from atomictools import Context, Field, ToolError, tool


def _ruff() -> str:
    beside = Path(sys.executable).with_name("ruff")  # the daemon's own virtualenv first
    found = str(beside) if beside.exists() else shutil.which("ruff")
    if found is None:
        raise ToolError("ruff is not installed; install it with `pip install ruff` where the daemon runs")
    return found


@tool(timeout=120, annotations={"readOnlyHint": True})
def lint(
    ctx: Context,
    path: Annotated[str, Field("File or directory to lint, relative to the project", min_length=1, max_length=1024)] = ".",
    select: Annotated[
        str, Field("Only these rule codes or prefixes, comma-separated (e.g. F,E9)", pattern=r"^[A-Z0-9]+(,[A-Z0-9]+)*$")
    ] | None = None,
) -> str:
    """Lint Python code with ruff and return one line per problem (file:line:col: code message)."""
    root = Path(ctx.worktree or ctx.directory or os.getcwd()).resolve()
    target = (root / path).resolve()
    if target != root and root not in target.parents:
        raise ToolError(f"{path!r} is outside the project ({root})")
    if not target.exists():
        raise ToolError(f"{path!r} does not exist in {root}")
    command = [_ruff(), "check", "--output-format=concise", "--no-cache", "--force-exclude"]
    if select:
        command += ["--select", select]
    done = subprocess.run([*command, "--", str(target)], cwd=root, capture_output=True, text=True, timeout=110)
    if done.returncode not in (0, 1):  # 1 means "found problems", anything else is ruff failing
        raise ToolError(f"ruff failed (exit {done.returncode}): {done.stderr.strip()}")
    if done.returncode == 0:
        return f"No problems found in {path}"
    return done.stdout.replace(f"{root}{os.sep}", "").strip()
