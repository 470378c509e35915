"""One /proc stat reader for the CLI, the spawner, the fork server and the group killer: a process
may name itself anything, ") " and a state letter included."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from atomictoolsd.cli._common import pid_alive
from atomictoolsd.util.procstat import PPID, SESSION, STATE, proc_stat

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="no /proc")

# A name (comm, 15 bytes at most) that looks like the end of the name followed by a zombie's state.
ODD_NAME = "x) Z 1 (y) Z"


@pytest.fixture
def oddly_named() -> subprocess.Popen[bytes]:
    code = (
        f"import sys\nopen('/proc/self/comm', 'w').write({ODD_NAME!r})\n"
        "print('ready', flush=True)\nsys.stdin.read()\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        assert Path(f"/proc/{proc.pid}/comm").read_text().strip() == ODD_NAME
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_a_live_process_with_a_tricky_name_is_alive(oddly_named: subprocess.Popen[bytes]) -> None:
    assert pid_alive(oddly_named.pid)


def test_the_fields_start_after_the_last_parenthesis(oddly_named: subprocess.Popen[bytes]) -> None:
    import os

    fields = proc_stat(oddly_named.pid)
    assert fields is not None
    assert fields[STATE] in (b"S", b"R")
    assert int(fields[PPID]) == os.getpid()
    assert int(fields[SESSION]) == os.getsid(oddly_named.pid)
    limited = proc_stat(oddly_named.pid, SESSION + 1)
    # The state (field 0) may change between the two reads; the others of these do not.
    assert limited is not None and limited[1:SESSION + 1] == fields[1:SESSION + 1] and len(limited) == SESSION + 2


def test_a_zombie_is_not_alive_and_a_gone_process_has_no_stat() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    while (proc_stat(proc.pid) or [b"Z"])[STATE] != b"Z":  # exited, not yet reaped
        pass
    assert not pid_alive(proc.pid)
    proc.wait()
    assert proc_stat(proc.pid) is None
