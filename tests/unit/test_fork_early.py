"""The first fork server is forked from the daemon only when the daemon is sealed (spawner.fork_early)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from atomictools._launch import sealed_environ

# Forks the fork server if it may, then stops it (by its pid, as the daemon would) and says which.
SCRIPT = """
from atomictoolsd.util.processes import stop_process
from atomictoolsd.pool.spawner import fork_early

first = fork_early()
if first is not None:
    first.proc.stdin.close()  # its end-of-file: the fork server stops
    stop_process(first.proc, 10, None)
print("forked" if first is not None else "exec")
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the fork server is forked on Linux only")
@pytest.mark.parametrize(("flags", "expected"), [(["-P"], "forked"), ([], "exec")])
def test_only_a_sealed_interpreter_forks_its_fork_server(flags: list[str], expected: str, tmp_path: Path) -> None:
    # Without -P the interpreter put its directory first on sys.path, which a fork would keep; an
    # exec'd fork server is started sealed instead.
    done = subprocess.run(
        [sys.executable, *flags, "-c", SCRIPT], cwd=tmp_path, env=sealed_environ(),
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == expected
