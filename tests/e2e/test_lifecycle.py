"""Starting, stopping and guarding the daemon: lock, socket, permissions, signals."""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time

import psutil
import pytest

from helpers import Daemon, Env, RawConnection, wait_for

SLOW = '''
    import time
    def slow(seconds: float) -> str:
        time.sleep(seconds)
        return "finished"
'''


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_cleanly_leaving_no_socket_lock_or_worker(env: Env, make_daemon, sig: int) -> None:  # type: ignore[no-untyped-def]
    env.write_tool(env.global_tools, "slow.py", SLOW)
    daemon = make_daemon()
    with daemon.client() as client:
        client.call("slow", seconds=0)
    workers = daemon.workers()
    assert workers, "a worker serves the module"
    assert daemon.stop(sig) == 0
    assert not env.socket.exists()
    assert not (env.runtime_dir / "atomictoolsd.lock").exists()
    assert daemon.leftovers() == []


def test_calls_in_flight_finish_before_shutdown(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    env.write_tool(env.global_tools, "slow.py", SLOW)
    daemon = make_daemon()
    result: list[str] = []
    client = daemon.client()

    def call() -> None:
        result.append(client.call("slow", seconds=1.0).text)

    thread = threading.Thread(target=call)
    thread.start()
    wait_for(lambda: any(m["inflight"] for m in client_status(env)["modules"]), message="the call to start")
    started = time.monotonic()
    assert daemon.stop(signal.SIGTERM) == 0
    thread.join(5)
    client.close()
    assert result == ["finished"]
    assert time.monotonic() - started >= 0.5, "the daemon waited for the call"


def client_status(env: Env) -> dict:  # type: ignore[type-arg]
    with RawConnection(env.socket) as raw:
        return raw.request("atomic/status")["result"]


def test_socket_is_0600_in_a_0700_dir(daemon: Daemon, env: Env) -> None:
    assert stat.S_IMODE(os.stat(env.socket).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(env.runtime_dir).st_mode) == 0o700


def test_a_second_daemon_refuses_and_leaves_the_first_serving(env: Env, make_daemon, daemon: Daemon) -> None:  # type: ignore[no-untyped-def]
    second = subprocess.run(
        [sys.executable, "-m", "atomictoolsd", "serve"], env=env.vars, capture_output=True, text=True, timeout=30
    )
    assert second.returncode == 0
    assert f"already running (pid {daemon.pid})" in second.stderr
    with daemon.raw() as raw:
        assert raw.request("ping")["result"] == {}


def test_restart_after_kill_9_replaces_the_stale_socket(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    env.write_tool(env.global_tools, "slow.py", SLOW)
    first = make_daemon()
    with first.client() as client:
        client.call("slow", seconds=0)
    first.descendants()
    first.kill()
    assert env.socket.exists(), "a killed daemon leaves its socket behind"
    with pytest.raises(ConnectionRefusedError):
        socket.socket(socket.AF_UNIX).connect(str(env.socket))
    assert first.leftovers() == [], "workers die with the daemon"
    second = make_daemon()
    with second.client() as client:
        assert client.call("slow", seconds=0).text == "finished"


def test_runtime_dir_open_to_others_is_refused(env: Env) -> None:
    env.runtime_dir.mkdir(mode=0o755)
    os.chmod(env.runtime_dir, 0o755)
    proc = subprocess.run([sys.executable, "-m", "atomictoolsd", "serve"], env=env.vars, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1
    assert f"chmod 700 {env.runtime_dir}" in proc.stderr
    assert not env.socket.exists()


def test_too_long_socket_path_is_refused_with_the_fix(env: Env) -> None:
    long_sock = str(env.runtime_base / ("s" * 120 + ".sock"))  # in a directory of yours: only its length is wrong
    proc = subprocess.run(
        [sys.executable, "-m", "atomictoolsd", "serve"],
        env={**env.vars, "ATOMICTOOLS_SOCKET": long_sock},
        capture_output=True, text=True, timeout=30,
    )
    assert proc.returncode == 1
    assert "Set ATOMICTOOLS_SOCKET" in proc.stderr


def test_workers_die_when_the_daemon_is_killed(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    env.write_tool(env.global_tools, "slow.py", SLOW)
    daemon = make_daemon()
    with daemon.client() as client:
        client.call("slow", seconds=0)
    processes = daemon.descendants()
    assert len(processes) >= 2  # the fork server and a worker
    daemon.kill()
    assert daemon.leftovers() == []
    assert all(not psutil.pid_exists(p.pid) or p.status() == psutil.STATUS_ZOMBIE for p in processes)


def test_the_daemons_own_dirs_are_private(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    """Spill files hold tool output, the state dir the trust store, the logs every call: 0700."""
    (env.root / "state" / "atomictools").mkdir(parents=True, mode=0o755)  # left open by an older run
    os.chmod(env.root / "state" / "atomictools", 0o755)
    env.write_tool(env.global_tools, "big.py", "def big() -> str:\n    return 'x\\n' * 5000\n")
    daemon = make_daemon()
    with daemon.client() as client:
        assert client.call("big").meta["atomic/fullOutput"]
    for path in (env.root / "state" / "atomictools", env.root / "cache" / "atomictools", env.state_dir / "spill"):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o700, path
