"""Stop a process and wait for it: the one stop-and-wait, with escalation to SIGKILL.

Used wherever a process is stopped and then waited for: the spawner closing the fork server, the
CLI's ``stop`` and ``service install`` waiting for a daemon to go, ``doctor`` closing the shim it
tried, and the tests' and bench's daemons. A child we started is a ``Popen``, or a ``ForkedChild``
when it was forked and runs on without executing another program (``stop_process``);
another process is a pid (``pid_alive``, ``wait_gone``), which a zombie no longer counts as.

Standard library only (and ``procstat``, which is too). Never imported by a worker.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from typing import Any

from atomictoolsd.util.procstat import STATE, proc_stat

__all__ = ["ForkedChild", "pid_alive", "stop_process", "wait_gone"]

_POLL = 0.02  # seconds between looks while waiting for a pid to go


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie does not: only its parent has yet to reap it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: it exists
    fields = proc_stat(pid, 1)
    return fields is None or fields[STATE] != b"Z"  # None: no /proc (macOS), and the signal said it exists


def wait_gone(pid: int, timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for ``pid`` to end; say whether it did."""
    deadline = time.monotonic() + timeout
    while pid_alive(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(_POLL)
    return True


def stop_process(proc: subprocess.Popen[bytes] | ForkedChild, timeout: float, sig: int | None = signal.SIGTERM) -> bool:
    """Send ``sig`` to our child ``proc`` (None: it was already told to stop), wait up to ``timeout``
    seconds, then SIGKILL it and reap it. Say whether it stopped without the SIGKILL."""
    if sig is not None and proc.poll() is None:
        proc.send_signal(sig)
    try:
        proc.wait(timeout)
        return True
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return False


class ForkedChild:
    """What ``stop_process`` and the spawner use of a ``Popen``, for a child made by ``os.fork``
    that never executes another program (the fork server forked at start, ``spawner.fork_early``)."""

    def __init__(self, pid: int, stdin: Any) -> None:
        self.pid = pid
        self.stdin = stdin  # the write end of its stdin pipe: closing it is its end-of-file
        self.returncode: int | None = None
        self._reaping = threading.Lock()  # poll() on the event loop, wait() in stop_process's thread

    def poll(self) -> int | None:
        with self._reaping:
            if self.returncode is None:
                try:
                    pid, status = os.waitpid(self.pid, os.WNOHANG)
                except ChildProcessError:  # reaped elsewhere: its status is lost
                    self.returncode = 255
                else:
                    if pid:
                        self.returncode = os.waitstatus_to_exitcode(status)
            return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0)
            time.sleep(_POLL / 4)
        return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)
