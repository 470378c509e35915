"""Test helpers: an isolated environment, a real daemon process, and a raw NDJSON connection.

Every path a daemon uses comes from the environment built here, so tests never touch the real home
or runtime dir. Every process a test starts is stopped by pid, and the daemon's descendants are
checked to be gone after it stops.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil

from atomictools import Client
from atomictoolsd.util.processes import stop_process
from atomictoolsd.worker.forkserver import WORKER_NAME


def _load_raw_client() -> Any:
    # bench/rawsocket.py is the one raw socket client; bench runs as plain scripts and never imports
    # the tests, so the tests load it by file path (not via sys.path, where bench's module names
    # would shadow ours).
    path = Path(__file__).resolve().parent.parent / "bench" / "rawsocket.py"
    spec = importlib.util.spec_from_file_location("bench_rawsocket", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


RawConnection = _load_raw_client().RawConnection

__all__ = [
    "Daemon", "Env", "RawConnection", "as_other_user", "daemon_pid", "run_in_terminal", "serving", "stop_detached",
    "wait_for",
]


def command_line(process: psutil.Process) -> str:
    """``process``'s command line, or "" when it ended while we looked (psutil may then raise
    NoSuchProcess, or FileNotFoundError from /proc)."""
    try:
        return " ".join(process.cmdline())
    except (psutil.Error, FileNotFoundError, ProcessLookupError):
        return ""


# The bystander of ``pinging``: a process of its own, so that what the test's own process does
# meanwhile (decoding a large answer holds its GIL) is not taken for the daemon's stall.
_PINGER = """
import json, select, socket, sys, time
sock = socket.socket(socket.AF_UNIX)
sock.connect(sys.argv[1])
reader, every, times, n = sock.makefile("rb"), float(sys.argv[2]), [], 0
while not select.select([sys.stdin], [], [], 0)[0]:
    n += 1
    started = time.monotonic()
    sock.sendall(b'{"jsonrpc":"2.0","id":%d,"method":"ping"}\\n' % n)
    while json.loads(reader.readline()).get("id") != n:
        pass
    times.append(time.monotonic() - started)
    time.sleep(every)
print(json.dumps(times))
"""


@contextmanager
def pinging(socket_path: Path | str, every: float = 0.01) -> Iterator[list[float]]:
    """A bystander on its own connection, in a process of its own, pings the daemon every ``every``
    seconds while the block runs: the list of how long each ping took to be answered (filled when
    the block ends)."""
    pings: list[float] = []
    pinger = subprocess.Popen(
        [sys.executable, "-I", "-c", _PINGER, str(socket_path), str(every)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    )
    try:
        time.sleep(0.2)  # connected and pinging before the block begins
        yield pings
    finally:
        out, _ = pinger.communicate(b"stop", timeout=60)
    pings.extend(json.loads(out))


def wait_for(
    predicate: Any, timeout: float = 10.0, interval: float = 0.01, message: str | Callable[[], str] = "condition",
) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` seconds, saying
    ``message`` (a callable is asked then, so it can tell what there was at the end)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            said = message() if callable(message) else message
            raise AssertionError(f"timed out after {timeout} s waiting for {said}")
        time.sleep(interval)


def run_in_terminal(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` with a terminal (a pty) on stdin, as a person typing the command does."""
    import pty

    controller, terminal = pty.openpty()
    try:
        return subprocess.run(argv, stdin=terminal, capture_output=True, text=True, timeout=60, **kwargs)
    finally:
        os.close(controller)
        os.close(terminal)


def as_other_user(uid: int, gid: int, groups: list[int], attempt: Callable[[], str]) -> str:
    """Run ``attempt`` in a child process that has become ``uid``/``gid``; return what it reports."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_fd)
            os.setgroups(groups)
            os.setgid(gid)
            os.setuid(uid)
            outcome = attempt()
        except BaseException as exc:  # noqa: BLE001 - whatever happens is the report
            outcome = f"crashed {exc!r}"
        os.write(write_fd, outcome.encode())
        os._exit(0)
    os.close(write_fd)
    os.waitpid(pid, 0)
    with os.fdopen(read_fd, "rb") as f:
        return f.read().decode()


class Env:
    """An isolated home, runtime dir and XDG dirs, and helpers to write tool modules into them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.home = root / "home"
        self.home.mkdir()
        # A short runtime dir: pytest's tmp paths can exceed the 108-byte socket path limit.
        self.runtime_base = Path(tempfile.mkdtemp(prefix="at-", dir="/tmp"))
        os.chmod(self.runtime_base, 0o700)
        self.project = root / "project"
        self.project.mkdir()
        (self.project / ".atomic").mkdir()
        self.vars = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(("ATOMICTOOLS_", "XDG_", "LISTEN_", "NOTIFY_SOCKET")) and key not in ("COLUMNS", "LINES")
        }
        self.vars.update(
            HOME=str(self.home),
            XDG_RUNTIME_DIR=str(self.runtime_base),
            XDG_STATE_HOME=str(root / "state"),
            XDG_CONFIG_HOME=str(root / "config"),
            XDG_CACHE_HOME=str(root / "cache"),
            XDG_DATA_HOME=str(root / "data"),
            # Every test sees only the tools it wrote: tests of the built-ins and of OpenCode's tool
            # directories remove these.
            ATOMICTOOLS_BUILTINS="0",
            ATOMICTOOLS_OPENCODE_DIRS="0",
        )
        # Every test may use project-local tools without trusting its project first: trust_all in the
        # config file (the one place it is read from); tests of trust turn it off (``set_trust_all``).
        self.trust_all = True
        self.write_config()

    @property
    def config_file(self) -> Path:
        return self.root / "config" / "atomictools" / "config.toml"

    def write_config(self, text: str = "", **settings: Any) -> Path:
        """Write ``config.toml``: ``text`` (dedented) and ``settings`` (each ``key = value``), with
        this environment's ``trust_all`` unless they set it; nothing else. A running daemon reads it
        on SIGHUP."""
        text = textwrap.dedent(text) + "".join(f"{key} = {json.dumps(value)}\n" for key, value in settings.items())
        if not any(line.strip().startswith("trust_all") for line in text.splitlines()):
            text = f"trust_all = {'true' if self.trust_all else 'false'}\n{text}"
        self.config_file.parent.mkdir(parents=True, exist_ok=True)
        self.config_file.write_text(text)
        return self.config_file

    def set_trust_all(self, value: bool) -> None:
        """Whether every project's tools load without trust (the config file's ``trust_all``)."""
        self.trust_all = value
        self.write_config()

    @property
    def runtime_dir(self) -> Path:
        return self.runtime_base / "atomictools"

    @property
    def socket(self) -> Path:
        return self.runtime_dir / "atomictoolsd.sock"

    @property
    def global_tools(self) -> Path:
        return self.home / ".atomic" / "tools"

    @property
    def local_tools(self) -> Path:
        return self.project / ".atomic" / "tools"

    @property
    def state_dir(self) -> Path:
        return self.root / "state" / "atomictools"

    def write_tool(self, where: Path, filename: str, source: str) -> Path:
        """Write a tool module (dedented); ``where`` is a tools dir, created when missing."""
        where.mkdir(parents=True, exist_ok=True)
        path = where / filename
        path.write_text(textwrap.dedent(source))
        return path

    def cleanup(self) -> None:
        shutil.rmtree(self.runtime_base, ignore_errors=True)


class Daemon:
    """A real ``atomictoolsd serve`` process in an ``Env``."""

    def __init__(
        self, env: Env, extra_env: dict[str, str] | None = None, python: str | None = None,
        command: list[str] | None = None, cwd: Path | None = None,
    ) -> None:
        self.env = env
        self.extra_env = dict(extra_env or {})
        # -P as the autostart and the units start it: started without, it re-executes itself.
        self.command = command or [python or sys.executable, "-P", "-m", "atomictoolsd", "serve"]
        self.cwd = cwd or env.root
        self.proc: subprocess.Popen[bytes] | None = None
        self.stderr_path = env.root / "daemon.stderr"
        self._known: dict[int, psutil.Process] = {}

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, timeout: float = 20.0) -> Daemon:
        with open(self.stderr_path, "ab") as stderr:
            self.proc = subprocess.Popen(
                self.command,
                env={**self.env.vars, **self.extra_env},
                cwd=self.cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
            )
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"the daemon exited with {self.proc.returncode}:\n{self.stderr()}")
            try:
                with RawConnection(self.env.socket, timeout=2) as raw:
                    if "result" in raw.request("ping"):
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"the daemon did not answer within {timeout} s:\n{self.stderr()}")
            time.sleep(0.01)
        return self

    def stderr(self) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def descendants(self) -> list[psutil.Process]:
        """Every process below the daemon (the fork server and the workers); remembered for checks."""
        try:
            found = psutil.Process(self.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            found = []
        for process in found:
            self._known[process.pid] = process
        return found

    def workers(self) -> list[psutil.Process]:
        """Worker processes (children of the fork server); one that ends while we look is not one."""
        found = []
        for process in self.descendants():
            try:
                if process.name() == WORKER_NAME:
                    found.append(process)
            except psutil.Error:  # a zombie its parent has yet to reap, or gone
                continue
        return found

    def client(self, directory: Path | None = None, **kwargs: Any) -> Client:
        return Client(
            str(self.env.socket),
            directory=str(directory or self.env.project),
            autostart=False,
            **kwargs,
        ).connect()

    def raw(self) -> RawConnection:
        return RawConnection(self.env.socket)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int:
        """Signal the daemon and wait for it; return its exit code."""
        assert self.proc is not None
        self.descendants()
        if not stop_process(self.proc, timeout, sig):
            raise AssertionError(f"the daemon did not stop within {timeout} s:\n{self.stderr()}")
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL the daemon (as a crash would)."""
        if self.proc is not None and self.proc.poll() is None:
            self.descendants()
            self.proc.kill()
            self.proc.wait()

    def leftovers(self, timeout: float = 5.0) -> list[psutil.Process]:
        """Processes this daemon started that are still alive after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            alive = [p for p in self._known.values() if _alive(p)]
            if not alive or time.monotonic() > deadline:
                return alive
            time.sleep(0.02)

    def reap_leftovers(self) -> list[psutil.Process]:
        """Kill (by pid) whatever this daemon left behind, and return what that was."""
        alive = self.leftovers(timeout=0)
        for process in alive:
            try:
                process.kill()
            except psutil.NoSuchProcess:
                pass
        return alive


@contextmanager
def serving(env: Env, extra_env: dict[str, str] | None = None) -> Iterator[Daemon]:
    """A daemon in ``env`` shared by the tests of a module that only read from it (list, call,
    status): started once, then stopped; it fails if anything it started is left, and removes
    ``env``'s runtime dir. A test that changes the daemon or counts what it did starts its own."""
    daemon = Daemon(env, extra_env).start()
    try:
        yield daemon
    finally:
        if daemon.proc is not None and daemon.proc.poll() is None:
            daemon.stop()
        left = daemon.reap_leftovers() if daemon.leftovers() else []
        env.cleanup()
        assert not left, f"processes left behind: {[p.pid for p in left]}"


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def daemon_pid(env: Env, runtime_dir: Path | None = None) -> int | None:
    """The pid of the daemon of ``env`` (or of ``runtime_dir``), from its lock file (None without one)."""
    try:
        return int(((runtime_dir or env.runtime_dir) / "atomictoolsd.lock").read_text())
    except (OSError, ValueError):
        return None


def stop_detached(env: Env, runtime_dir: Path | None = None) -> None:
    """Stop a daemon started detached (by the CLI or a client) in ``env`` (or in ``runtime_dir``), by
    its pid, and fail if it or anything it started is still alive after 15 s."""
    pid = daemon_pid(env, runtime_dir)
    if pid is None:
        return
    try:
        process = psutil.Process(pid)
        children = process.children(recursive=True)
    except psutil.NoSuchProcess:
        return
    os.kill(pid, signal.SIGTERM)
    _gone, alive = psutil.wait_procs([process, *children], timeout=15)
    for leftover in alive:
        leftover.kill()
    assert not alive, f"processes left behind: {[p.pid for p in alive]}"


def code_address(pid: int) -> str:
    """Where the interpreter is mapped in process ``pid`` (randomized per exec, kept by a fork)."""
    with open(f"/proc/{pid}/maps") as maps:
        return next(line.split("-")[0] for line in maps if "libpython" in line or "/bin/python" in line)
