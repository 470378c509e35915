"""SIGHUP reloads without dropping connections (reconfigure); starting is safe under races and
leftovers (cli.daemon ``start``, server lock and socket checks)."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator

import psutil
import pytest

from helpers import Daemon, Env, RawConnection, wait_for

SLOW = '''
    import time

    def slow(seconds: float) -> str:
        """Sleep, then answer."""
        time.sleep(seconds)
        return "finished"
'''


def write_config(env: Env, text: str) -> None:
    env.write_config(text)


def log_events(env: Env) -> list[dict]:  # type: ignore[type-arg]
    path = env.root / "state" / "atomictools" / "log" / "atomictoolsd.log"
    try:
        return [json.loads(line) for line in path.read_text().splitlines()]
    except FileNotFoundError:
        return []


def reloads(env: Env) -> list[dict]:  # type: ignore[type-arg]
    return [e for e in log_events(env) if e["event"] == "daemon.reload"]


def hup_and_wait(env: Env, daemon: Daemon) -> dict:  # type: ignore[type-arg]
    count = len(reloads(env))
    os.kill(daemon.pid, signal.SIGHUP)
    return wait_for(lambda: reloads(env)[count:], timeout=20, interval=0.05, message="the reload")[0]


def test_sighup_rescans_and_reconfigures_without_dropping_connections(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    env.write_tool(env.global_tools, "slow.py", SLOW)
    daemon: Daemon = make_daemon()
    raw = RawConnection(env.socket)
    raw.request("initialize", {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t"}})
    raw.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    assert [t["name"] for t in raw.request("tools/list")["result"]["tools"]] == ["slow"]
    worker_before = raw.request("tools/call", {"name": "slow", "arguments": {"seconds": 0}}) and \
        raw.request("atomic/status")["result"]["modules"][0]["worker"]

    # A call in flight across the reload finishes; a new file is found; new settings apply.
    in_flight: list[dict] = []  # type: ignore[type-arg]
    other = RawConnection(env.socket)
    thread = threading.Thread(
        target=lambda: in_flight.append(other.request("tools/call", {"name": "slow", "arguments": {"seconds": 1.0}}))
    )
    thread.start()
    wait_for(lambda: raw.request("atomic/status")["result"]["modules"][0]["inflight"], message="the call to start")
    env.write_tool(env.global_tools, "added.py", SLOW.replace("slow", "added"))
    write_config(env, "call_timeout = 0.3\nworker_threads = 4\n")
    result = hup_and_wait(env, daemon)
    assert sorted(result["changed"]) == ["call_timeout", "worker_threads"] and result["tools"] == 2
    thread.join(10)
    assert in_flight[0]["result"]["content"][0]["text"] == "finished", "the call in flight was not dropped"

    notification = wait_for(lambda: raw.recv(), message="list_changed on the open connection")
    assert notification["method"] == "notifications/tools/list_changed"
    assert [t["name"] for t in raw.request("tools/list")["result"]["tools"]] == ["added", "slow"]
    timed_out = raw.request("tools/call", {"name": "slow", "arguments": {"seconds": 2}})["result"]
    assert timed_out["isError"] and "timed out after 0.3 s" in timed_out["content"][0]["text"]
    status = raw.request("atomic/status")["result"]
    assert status["config"]["call_timeout"] == 0.3 and status["configSources"]["call_timeout"].endswith("config.toml")
    # worker_threads shapes a worker: the old one retired, the next call got a new one.
    assert raw.request("tools/call", {"name": "slow", "arguments": {"seconds": 0}})["result"]["content"][0]["text"] == "finished"
    slow_module = next(m for m in raw.request("atomic/status")["result"]["modules"] if m["path"].endswith("slow.py"))
    assert slow_module["worker"] not in (None, worker_before)
    raw.close()
    other.close()


def test_a_bad_configuration_on_sighup_keeps_the_running_one(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    env.write_tool(env.global_tools, "slow.py", SLOW)
    write_config(env, "call_timeout = 30\n")
    daemon = make_daemon()
    with daemon.client() as client:
        write_config(env, "call_timeout = 'soon'\n")
        result = hup_and_wait(env, daemon)
        config = env.root / "config" / "atomictools" / "config.toml"
        assert result["configError"] == f"call_timeout (from {config}): expected a number, got 'soon'"
        errors = [e for e in log_events(env) if e["event"] == "config.error"]
        assert errors and errors[0]["level"] == "error" and f"call_timeout (from {config})" in errors[0]["error"]
        assert f"configuration not reloaded, keeping the current one: call_timeout (from {config})" in daemon.stderr()
        assert client.call("slow", seconds=0).text == "finished"
        assert client.status()["config"]["call_timeout"] == 30.0


# -- start: races and leftovers -------------------------------------------------------------------


def run(env: Env, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "atomictoolsd", *args], env=env.vars, cwd=env.project,
        capture_output=True, text=True, timeout=90,
    )


def lock_pid(env: Env) -> int | None:
    try:
        return int((env.runtime_dir / "atomictoolsd.lock").read_text())
    except (OSError, ValueError):
        return None


def daemons_of(env: Env) -> list[psutil.Process]:
    """atomictoolsd serve processes of this test's environment."""
    found = []
    for process in psutil.process_iter(["cmdline", "environ"]):
        cmdline = process.info["cmdline"] or []
        if "atomictoolsd" in cmdline and "serve" in cmdline:
            if (process.info["environ"] or {}).get("XDG_RUNTIME_DIR") == str(env.runtime_base):
                found.append(process)
    return found


@pytest.fixture
def detached(env: Env) -> Iterator[Env]:
    """Stop whatever daemons of this environment the test started (by pid), and their children."""
    yield env
    processes = daemons_of(env)
    for process in list(processes):
        try:
            processes += process.children(recursive=True)
            process.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(processes, timeout=15)
    for leftover in alive:
        leftover.kill()
    assert not alive, f"processes left behind: {alive}"


def test_concurrent_starts_give_one_daemon(detached: Env) -> None:
    env = detached
    starts = [
        subprocess.Popen([sys.executable, "-m", "atomictoolsd", "start"], env=env.vars, cwd=env.project,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    outputs = [proc.communicate(timeout=90) for proc in starts]
    assert [proc.returncode for proc in starts] == [0] * 4, outputs
    stdout = [out for out, _ in outputs]
    assert sum("atomictoolsd started (pid" in out for out in stdout) == 1, stdout
    pid = lock_pid(env)
    assert pid is not None and all(f"(pid {pid})" in out for out in stdout), stdout
    # The ones that lost the lock exit right after reporting the winner.
    wait_for(lambda: [p.pid for p in daemons_of(env)] == [pid], timeout=20, message="exactly one daemon")
    with RawConnection(env.socket) as raw:  # serving as soon as every start has returned
        assert raw.request("ping")["result"] == {}


def test_a_start_that_loses_the_race_returns_only_once_the_winner_serves(env: Env) -> None:
    # Play the winner: hold the instance lock, and serve only a while later.
    env.runtime_dir.mkdir(mode=0o700)
    lock = os.open(env.runtime_dir / "atomictoolsd.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)
    os.write(lock, f"{os.getpid()}\n".encode())
    start = subprocess.Popen([sys.executable, "-m", "atomictoolsd", "start"], env=env.vars, cwd=env.project,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        try:
            start.wait(1.5)
        except subprocess.TimeoutExpired:
            pass
        assert start.poll() is None, "it waits while the lock holder does not serve yet"
        listener.bind(str(env.socket))
        listener.listen()
        out, err = start.communicate(timeout=30)
    finally:
        if start.poll() is None:
            start.kill()
            start.wait()
        listener.close()
        os.close(lock)
    assert start.returncode == 0, err
    assert f"atomictoolsd is already running (pid {os.getpid()})" in out


def test_start_after_kill_9_replaces_the_stale_lock_and_socket(detached: Env) -> None:
    env = detached
    env.write_tool(env.global_tools, "slow.py", SLOW)
    assert run(env, "start").returncode == 0
    first = lock_pid(env)
    assert first is not None
    with RawConnection(env.socket) as raw:
        raw.request("tools/call", {"name": "slow", "arguments": {"seconds": 0}})
    children = psutil.Process(first).children(recursive=True)
    os.kill(first, signal.SIGKILL)
    psutil.wait_procs([psutil.Process(first)] if psutil.pid_exists(first) else [], timeout=10)
    _, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, "the fork server and workers die with the daemon"
    assert env.socket.exists() and lock_pid(env) == first, "kill -9 leaves the socket and the lock file"

    again = run(env, "start")
    assert again.returncode == 0 and "atomictoolsd started (pid" in again.stdout, again.stdout + again.stderr
    second = lock_pid(env)
    assert second not in (None, first)
    with RawConnection(env.socket) as raw:
        assert raw.request("tools/call", {"name": "slow", "arguments": {"seconds": 0}})["result"]["content"][0]["text"] == "finished"
    stopped = run(env, "stop")
    assert stopped.returncode == 0 and f"stopped (pid {second})" in stopped.stdout


def test_a_socket_another_process_serves_is_never_taken_over(env: Env) -> None:
    env.runtime_dir.mkdir(mode=0o700)
    squatter = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    squatter.bind(str(env.socket))
    squatter.listen()
    try:
        proc = run(env, "serve")
        assert proc.returncode == 1
        assert f"{env.socket} is served by another process (pid {os.getpid()})" in proc.stderr
        assert "ATOMICTOOLS_SOCKET" in proc.stderr
        probe = socket.socket(socket.AF_UNIX)
        probe.connect(str(env.socket))  # still the squatter's
        probe.close()
        assert not (env.runtime_dir / "atomictoolsd.lock").exists()
    finally:
        squatter.close()


def test_start_refuses_a_runtime_dir_open_to_others(env: Env) -> None:
    env.runtime_dir.mkdir(mode=0o700)
    os.chmod(env.runtime_dir, 0o755)
    result = run(env, "start")
    assert result.returncode == 1
    assert f"{env.runtime_dir} has mode 0755, open to other users; run: chmod 700 {env.runtime_dir}" in result.stderr
    assert not env.socket.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another user needs root")
def test_start_refuses_a_runtime_dir_owned_by_someone_else(env: Env) -> None:
    env.runtime_dir.mkdir(mode=0o700)
    os.chown(env.runtime_dir, 65534, 65534)
    result = run(env, "start")
    assert result.returncode == 1
    assert f"{env.runtime_dir} is owned by uid 65534, not by you (uid 0)" in result.stderr
    assert "set ATOMICTOOLS_RUNTIME_DIR to a directory of your own" in result.stderr
    assert not env.socket.exists()
