"""The daemon under a service manager's protocols: sd_notify on NOTIFY_SOCKET, socket activation
with systemd-socket-activate, stderr to the journal (service.notify, service.activation, cli.daemon)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from atomictools import Client
from atomictoolsd.service.notify import STATUS_INTERVAL
from helpers import Daemon, Env, RawConnection, wait_for

GREET = '''
    def greet(name: str) -> str:
        """Greet someone."""
        return f"Hello, {name}"
'''


class NotifyServer:
    """What systemd does with NOTIFY_SOCKET: receive datagrams of KEY=value lines."""

    def __init__(self, address: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(address)
        self.sock.settimeout(0.1)
        self.messages: list[str] = []

    def receive(self) -> None:
        while True:
            try:
                self.messages.append(self.sock.recv(65536).decode())
            except TimeoutError:
                return

    def wait(self, predicate, message: str, timeout: float = 20.0) -> list[str]:  # type: ignore[no-untyped-def]
        def check() -> bool:
            self.receive()
            return predicate(self.messages)

        wait_for(check, timeout=timeout, message=message)
        return self.messages

    def index(self, prefix: str, start: int = 0) -> int:
        return next(i for i, m in enumerate(self.messages) if i >= start and m.startswith(prefix))

    def close(self) -> None:
        self.sock.close()


@pytest.fixture(params=["path", "abstract"])
def notify(request: pytest.FixtureRequest, env: Env) -> Iterator[tuple[NotifyServer, str]]:
    if request.param == "path":
        address = str(env.runtime_base / "notify.sock")
        server, variable = NotifyServer(address), address
    else:
        name = f"atomictoolsd-test-{os.getpid()}-{time.monotonic_ns()}"
        server, variable = NotifyServer("\0" + name), "@" + name
    yield server, variable
    server.close()


def environ_of(pid: int) -> dict[str, str]:
    return psutil.Process(pid).environ()


def test_notify_ready_status_watchdog_reloading_stopping_in_order(env: Env, make_daemon, notify) -> None:  # type: ignore[no-untyped-def]
    server, variable = notify
    env.write_tool(env.global_tools, "greet.py", GREET)
    daemon: Daemon = make_daemon({"NOTIFY_SOCKET": variable, "WATCHDOG_USEC": "200000"})
    with daemon.client() as client:
        assert client.call("greet", name="x").text == "Hello, x"
    server.wait(lambda m: sum(x == "WATCHDOG=1" for x in m) >= 3, "three watchdog pings")
    assert server.messages[0] == "READY=1", server.messages[:3]
    first_status = server.index("STATUS=")
    assert first_status == 1 and server.index("WATCHDOG=1") > first_status
    server.wait(lambda m: any("serving 1 tool from 1 module; 1 worker" in x for x in m), "a status line with the worker")

    # The fork server and the workers never see the variables meant for the daemon.
    forkserver = [p for p in daemon.descendants() if p.ppid() == daemon.pid]
    for process in daemon.descendants():
        assert not {"NOTIFY_SOCKET", "WATCHDOG_USEC", "LISTEN_FDS"} & set(environ_of(process.pid)), process
    assert forkserver

    env.write_tool(env.global_tools, "shout.py", GREET.replace("greet", "shout"))
    mark = len(server.messages)
    os.kill(daemon.pid, signal.SIGHUP)
    server.wait(lambda m: any(x.startswith("STATUS=serving 2 tools") for x in m[mark:]), "the status after the reload")
    reloading = server.index("RELOADING=1", mark)
    assert "\nMONOTONIC_USEC=" in server.messages[reloading]
    assert server.index("READY=1", reloading) > reloading

    mark = len(server.messages)
    assert daemon.stop(signal.SIGTERM) == 0
    server.receive()
    stopping = server.index("STOPPING=1", mark)
    assert "STATUS=stopping: SIGTERM" in server.messages[stopping]
    assert not any(m == "WATCHDOG=1" for m in server.messages[stopping + 1 :]), "silence after STOPPING"


def test_a_tool_change_reaches_the_status_line_soon_not_at_the_next_periodic_look(env: Env, make_daemon, notify) -> None:  # type: ignore[no-untyped-def]
    server, variable = notify
    env.write_tool(env.global_tools, "greet.py", GREET)
    daemon: Daemon = make_daemon({"NOTIFY_SOCKET": variable})
    ready = time.monotonic()  # the daemon was ready before this; its periodic look comes 5 s after that
    with daemon.client() as client:
        assert len(client.list_tools()) == 1
        mark = len(server.messages)
        env.write_tool(env.global_tools, "shout.py", GREET.replace("greet", "shout"))
        wait_for(lambda: len(client.list_tools()) == 2, message="the new tool")
    server.wait(lambda m: any(x.startswith("STATUS=serving 2 tools") for x in m[mark:]), "the status line of the change")
    assert time.monotonic() - ready < STATUS_INTERVAL - 1, "told when the tools changed, not at the first periodic look"


def test_a_watchdog_meant_for_another_process_is_not_pinged(env: Env, make_daemon, notify) -> None:  # type: ignore[no-untyped-def]
    server, variable = notify
    daemon = make_daemon({"NOTIFY_SOCKET": variable, "WATCHDOG_USEC": "100000", "WATCHDOG_PID": "1"})
    server.wait(lambda m: "READY=1" in m, "READY")
    time.sleep(0.5)  # five watchdog intervals: enough for pings to show if they were sent
    server.receive()
    assert "WATCHDOG=1" not in server.messages
    with RawConnection(env.socket) as raw:
        service = raw.request("atomic/status")["result"]["service"]
    assert service["manager"] == "systemd" and service["notify"] and service["watchdogSec"] is None
    daemon.stop()


def test_a_bad_configuration_reaches_the_service_manager(env: Env, notify) -> None:  # type: ignore[no-untyped-def]
    server, variable = notify
    config = env.write_config('log_level = "chatty"\n')
    proc = subprocess.run(
        [sys.executable, "-m", "atomictoolsd", "serve"], env={**env.vars, "NOTIFY_SOCKET": variable},
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 2, "the exit code the unit's RestartPreventExitStatus names"
    message = f"bad configuration: log_level (from {config}): must be one of debug, info, warning, error"
    assert message in proc.stderr
    server.receive()
    assert server.messages == [f"STATUS={message}; got 'chatty'"]


def test_stderr_goes_to_the_journal_in_its_format(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    daemon = Daemon(env)
    daemon.stderr_path.touch()
    info = os.stat(daemon.stderr_path)
    daemon.extra_env = {"JOURNAL_STREAM": f"{info.st_dev}:{info.st_ino}"}
    daemon.start()
    try:
        daemon.stop()
    finally:
        daemon.reap_leftovers()
    lines = daemon.stderr().splitlines()
    assert any(line.startswith("<6>atomictoolsd: atomictoolsd ") and "serving on" in line for line in lines), lines
    assert all(line.startswith("<") for line in lines), "every line carries its level; the journal adds the time"


def _accepts(path: Path) -> bool:
    """Whether a connection to ``path`` is taken (the file is there from ``bind``, before ``listen``)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except OSError:
        return False
    finally:
        probe.close()
    return True


requires_socket_activate = pytest.mark.skipif(
    shutil.which("systemd-socket-activate") is None, reason="no systemd-socket-activate"
)


@requires_socket_activate
def test_serves_on_the_socket_systemd_passes_and_never_unlinks_it(env: Env) -> None:
    env.write_tool(env.global_tools, "greet.py", GREET)
    env.runtime_dir.mkdir(mode=0o700)
    command = ["systemd-socket-activate", "-l", str(env.socket)]
    for key in env.vars:
        command += ["-E", key]  # it passes on only the variables it is told to
    stderr = open(env.root / "activate.stderr", "wb")
    proc = subprocess.Popen(
        [*command, sys.executable, "-m", "atomictoolsd", "serve"],
        env=env.vars, cwd=env.root, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr,
    )
    known: list[psutil.Process] = []
    try:
        wait_for(lambda: _accepts(env.socket), message="systemd-socket-activate to listen")  # bound, then listening
        # The first connection starts the daemon; it is queued on the socket meanwhile, not refused.
        with Client(str(env.socket), directory=str(env.project), autostart=False, timeout=30) as client:
            assert client.call("greet", name="activated").text == "Hello, activated"
            status = client.status()
        assert status["pid"] == proc.pid, "the daemon is the process systemd-socket-activate became"
        assert status["service"]["activated"] is True and status["service"]["manager"] == "systemd"
        assert status["socket"] == str(env.socket)
        assert "atomictoolsd" in psutil.Process(proc.pid).cmdline()
        known = psutil.Process(proc.pid).children(recursive=True)
        listening = os.stat(f"/proc/{proc.pid}/fd/3").st_ino
        for child in known:
            environ = child.environ()
            assert "LISTEN_FDS" not in environ and "LISTEN_PID" not in environ, child
            inherited = {os.stat(f"/proc/{child.pid}/fd/{fd}").st_ino for fd in os.listdir(f"/proc/{child.pid}/fd")}
            assert listening not in inherited, f"{child} inherited the listening socket"
        assert (env.runtime_dir / "atomictoolsd.lock").read_text().strip() == str(proc.pid), "the lock is still taken"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        assert env.socket.exists(), "the socket belongs to the service manager: the daemon leaves it"
        assert not (env.runtime_dir / "atomictoolsd.lock").exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        stderr.close()
    gone, alive = psutil.wait_procs(known, timeout=10)
    for leftover in alive:
        leftover.kill()
    assert not alive, f"processes left behind: {alive}"


@requires_socket_activate
def test_a_passed_socket_that_cannot_serve_is_refused_with_the_fix(env: Env) -> None:
    env.runtime_dir.mkdir(mode=0o700)
    command = ["systemd-socket-activate", "--datagram", "-l", str(env.socket)]
    for key in env.vars:
        command += ["-E", key]
    proc = subprocess.Popen(
        [*command, sys.executable, "-m", "atomictoolsd", "serve"], env=env.vars,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        wait_for(env.socket.exists, message="systemd-socket-activate to listen")
        poke = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        poke.sendto(b"x", str(env.socket))
        poke.close()
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1
    assert "systemd passed file descriptor 3 (AF_UNIX/SOCK_DGRAM" in err and "ListenStream=" in err


def test_path_of_the_log_and_manager_in_status(daemon: Daemon, env: Env) -> None:
    with RawConnection(env.socket) as raw:
        status = raw.request("atomic/status")["result"]
    assert status["service"] == {
        "manager": "none", "unit": None, "notify": False, "watchdogSec": None, "activated": False,
    }
    assert status["log"]["file"] == str(env.root / "state" / "atomictools" / "log" / "atomictoolsd.log")
    assert Path(status["log"]["file"]).exists()
