"""An async tool with progress and cancellation: run the project's tests with pytest.

Each finished test is reported as progress (the caller sees `notifications/progress` when it sent a
progress token; the total is known once pytest has collected the tests). Cancelling the call, or
its timeout, cancels the task: `CancelledError` arrives at the `await`, and the tool kills pytest
(and anything pytest started) before letting the cancellation through.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from typing import Annotated

from atomictools import Context, Field, ToolError, tool

_COLLECTED = re.compile(r"collected (\d+) items?")
_OUTCOME = re.compile(r" (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b")


@tool(timeout=900)
async def run_tests(
    ctx: Context,
    target: Annotated[
        str, Field("Test file, directory or node id, relative to the project", min_length=1, max_length=1024, pattern=r"^[^-]")
    ] = "tests",
) -> str:
    """Run the project's tests with pytest and return the summary (the failures in full, if any)."""
    root = ctx.worktree or ctx.directory or os.getcwd()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-u", "-m", "pytest", "-v", "-p", "no:cacheprovider", "--", target,
        cwd=root,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,  # its own process group: one kill stops pytest and its children
    )
    assert process.stdout is not None
    lines: list[str] = []
    total: int | None = None
    finished = 0
    try:
        async for raw in process.stdout:
            line = raw.decode("utf-8", "replace").rstrip()
            lines.append(line)
            collected = _COLLECTED.search(line)
            if collected:
                total = int(collected.group(1))
            elif _OUTCOME.search(line):
                finished += 1
                ctx.progress(finished, total, line.split(" ")[0])
        code = await process.wait()
    except asyncio.CancelledError:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        await process.wait()
        raise
    if code == 5:
        return f"No tests found in {target}"
    if code not in (0, 1):
        raise ToolError(f"pytest could not run (exit {code}):\n" + "\n".join(lines[-30:]))
    if code == 1:  # some tests failed: their tracebacks and the summary
        start = next((i for i, line in enumerate(lines) if "= FAILURES =" in line or "= ERRORS =" in line), 0)
        raise ToolError("\n".join(lines[start:]))
    return lines[-1].strip("= ") if lines else "pytest printed nothing"
