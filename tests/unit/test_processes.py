"""The one stop-and-wait (``util/processes.py``): a child that ignores SIGTERM is killed after the
timeout, and a pid is waited for until it is gone (a zombie counts as gone)."""

from __future__ import annotations

import subprocess
import sys

from atomictoolsd.util.processes import pid_alive, stop_process, wait_gone

STUBBORN = "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"


def test_a_child_that_ignores_sigterm_is_killed_after_the_timeout() -> None:
    proc = subprocess.Popen([sys.executable, "-c", STUBBORN], stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    assert stop_process(proc, 0.3) is False
    assert proc.returncode == -9


def test_a_child_that_obeys_stops_without_escalation() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    assert stop_process(proc, 20) is True
    assert proc.returncode == -15


def test_wait_gone_says_whether_the_pid_ended() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert pid_alive(proc.pid)
        assert wait_gone(proc.pid, 0.1) is False
        proc.terminate()
        assert wait_gone(proc.pid, 20) is True  # a zombie, not yet reaped, counts as gone
    finally:
        proc.kill()
        proc.wait()
