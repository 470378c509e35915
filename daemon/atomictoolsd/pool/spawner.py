"""The daemon's side of the fork server: ask it for workers, learn how they ended.

``Spawner.spawn(spec)`` returns the new worker's pid and the daemon's end of its channel. Exit
statuses arrive separately (only the fork server, their parent, can reap workers) and resolve the
future returned by ``exit_status(pid)``.

The fork server holds the write end of a pipe whose read end the daemon watches: its end-of-file
says at once that the fork server died (the control socket is a datagram socket pair, which reports
no end-of-file, and ``SOCK_SEQPACKET`` does not exist for ``AF_UNIX`` on macOS). Then its waiting
requests fail, its workers are counted as ended (they get SIGKILL from their parent's death on
Linux; elsewhere the daemon kills them) along with what they started, and the next spawn starts a
new fork server. A send that fails counts as the same news, and the spawn is tried once more on a
new fork server. What it sends is decoded as a ``ForkServerMessage`` (``protocol.py``); a datagram
that is not one (a confined fork server runs next to a project's code) has it killed and replaced
at once, as one that stopped answering is (below).

The fork server is started sealed (``atomictools._launch``): ``-P``, from ``/``, without ``PYTHON*``
variables but the daemon's own code roots. Started with ``-m`` from the daemon's directory, every
module there (``ssl.py``) would run in it and in every worker forked from it.

A fork server that is alive but does not answer (a tool sent its parent SIGSTOP; a debugger holds
it) would hold every later spawn, and with them reloads and attaches. So it has a health check: its
state is read (Linux: ``/proc``) every second, every quarter second while a spawn waits, and it is
pinged when it has been quiet for a while; one that is stopped, or has left a spawn or a ping
unanswered for ``answer_timeout`` seconds, is killed and replaced, as if it had died (its waiting
spawns are tried once more on the new one). ``info()`` says what the last check found and what the
last replacement was for.

The first fork server is forked from the daemon itself (``fork_early``, called by ``serve`` before it
reads its settings or starts a thread or an event loop), so it and its workers run the interpreter's
machine code at the daemon's own addresses. On one core, where a call goes daemon → worker → daemon,
these processes take turns on one branch predictor, and with shared addresses each finds it trained
by the others: a call then costs ~9 µs (15 %) less than with an exec'd fork server
(docs/performance.md, "Shared code addresses"). It is sealed as an exec'd one is: the daemon
is (``serve`` re-executes itself sealed; one that still is not gets an exec'd fork server), and the
child keeps none of its descriptors, runs from
``/`` with ``sealed_environ()`` and never returns to the daemon's code. A fork server that replaces a
lost one is exec'd: by then the daemon has threads, which a fork does not copy.

Confined workers (``WorkerSpec.sandbox``) come from fork servers of their own, one per project (the
pool keeps a ``Spawner`` for each, whose fork server stops after ``IDLE_STOP`` seconds without a
worker), always exec'd, so that a confined worker does not learn where the daemon's code is (the
daemon parses what it sends), and so that what one project's processes do to their fork server ends
no other project's workers. Their environment is the allowlisted one (``confined_environ``): a
confined worker's memory is a copy of its fork server's, so nothing the confined workers may not see
(a token of the daemon's, a variable one project is allowed) ever enters that process. What one
worker is allowed by name goes to it alone, over its own channel (``spawn(env=…)``), before anything
else. One allowed the network gets a second socket with its spawn request, on which it hands over its
proxy listener; the spawner gives the daemon's end to the ``NetProxy`` until the worker ends
(``_hand_over``).

A ``SpawnError`` is never the module's doing: the caller fails what needed the worker, not the module.
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import msgspec

from atomictools._launch import SEALED_CWD, is_sealed, python_command, sealed_environ
from atomictoolsd.pool.netproxy import NetProxy
from atomictoolsd.protocol import (
    Exited,
    ForkServerMessage,
    Ping,
    Ready,
    Spawn,
    Spawned,
    SpawnFailed,
    WorkerSpec,
)
from atomictoolsd.util.processes import ForkedChild, stop_process
from atomictoolsd.util.procgroups import kill_worker_processes
from atomictoolsd.util.procstat import STATE, proc_stat

__all__ = [
    "FORKSERVER_GONE", "EarlyForkServer", "SpawnError", "Spawner", "confined_environ", "describe_status", "fork_early",
]

log = logging.getLogger("atomictoolsd.workers")

# The exit "status" of a worker that died with its fork server: no one could reap it for us, so its
# real status is unknown (a real one is never negative).
FORKSERVER_GONE = -1

_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(ForkServerMessage).decode

_FORKSERVER = "atomictoolsd.worker.forkserver"


class EarlyForkServer(NamedTuple):
    """A fork server forked from the daemon at start, for its ``Spawner`` to adopt."""

    proc: ForkedChild
    control: socket.socket  # the daemon's end of the control socket pair
    alive_fd: int  # the read end of its liveness pipe


def fork_early(child_setup: Callable[[], object] | None = None) -> EarlyForkServer | None:
    """Fork the first fork server from this process, now. Call it while the process has one thread
    and has read nothing a worker should not see; None where it cannot (a thread already runs, no
    ``fork``, no descriptors left) or should not (this interpreter is not sealed: a fork would keep
    its ``sys.path``): the spawner then starts one by exec, as it does every later one.

    ``child_setup`` runs first thing in the fork server (the daemon drops the variables its service
    manager meant for it alone). The environment the process was started with, which
    ``/proc/PID/environ`` shows and a fork keeps, is wiped: the fork server runs with
    ``sealed_environ()``, as an exec'd one, and nothing else."""
    if not sys.platform.startswith("linux") or threading.active_count() != 1:
        return None  # macOS: forking a process that has loaded system frameworks is not safe
    if not is_sealed():
        return None  # an exec'd fork server is started sealed, whatever this process was started with
    # Imported before the fork: the fork server then has it, and shares its pages with the daemon.
    from atomictoolsd.worker import forkserver  # lazy: only serve pays for it (start-up cost)

    try:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    except OSError as exc:
        log.warning("cannot fork the fork server at start (%s); it will be started on first use", _fd_cause(exc))
        return None
    pipes: list[int] = []
    try:
        alive_r, alive_w = os.pipe()
        pipes += [alive_r, alive_w]
        stdin_r, stdin_w = os.pipe()
    except OSError as exc:
        ours.close()
        theirs.close()
        for fd in pipes:
            os.close(fd)
        log.warning("cannot fork the fork server at start (%s); it will be started on first use", _fd_cause(exc))
        return None
    daemon_pid = os.getpid()
    pid = os.fork()
    if pid == 0:
        try:
            args = [str(theirs.fileno()), str(daemon_pid), str(alive_w)]
            os.dup2(stdin_r, 0)  # its end-of-file is the daemon's going, as for an exec'd one
            _close_all_but({0, 1, 2, theirs.fileno(), alive_w})
            if child_setup is not None:
                child_setup()
            os.chdir(SEALED_CWD)
            sealed = sealed_environ()
            os.environ.clear()  # the C environment now holds copies only: the original can go
            os.environ.update(sealed)
            _wipe_initial_environment()
            sys.argv = [forkserver.__file__ or _FORKSERVER, *args]
            forkserver.main(args)
        finally:
            os._exit(1)  # never back into the daemon's code
    theirs.close()
    os.close(alive_w)
    os.close(stdin_r)
    ours.setblocking(False)
    return EarlyForkServer(ForkedChild(pid, open(stdin_w, "wb", buffering=0)), ours, alive_r)


def _wipe_initial_environment() -> None:
    """Zero the strings of the environment this process image started with (what
    ``/proc/PID/environ`` reads): after ``os.environ`` was rebuilt nothing points to them."""
    import ctypes  # lazy: in the fork server only, which loads it anyway (prctl)

    fields = proc_stat("self")
    if fields is None or len(fields) <= _ENV_END:
        return
    start, end = int(fields[_ENV_START]), int(fields[_ENV_END])
    if 0 < start < end:
        ctypes.memset(start, 0, end - start)


# /proc/PID/stat, fields 50 and 51 (env_start, env_end), as indexes into what proc_stat returns.
_ENV_START, _ENV_END = 47, 48


def _close_all_but(keep: set[int]) -> None:
    """Close every descriptor of this process but ``keep`` (a forked child's)."""
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        fds = list(range(os.sysconf("SC_OPEN_MAX") if hasattr(os, "sysconf") else 1024))
    for fd in fds:
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass  # the listing's own descriptor, gone with it


def confined_environ() -> dict[str, str]:
    """The environment of the confined workers' fork server: what a confined worker may see of the
    daemon's (``sandbox.worker_environ``), and the interpreter's sealed ``PYTHON*`` variables."""
    from atomictoolsd.worker import sandbox  # lazy: ctypes, once a confined worker is asked for
    from atomictoolsd.worker.forkserver import SPAWN_TIMES_ENV  # lazy: imported with the sandbox

    sealed = sealed_environ()
    kept = {key: value for key, value in sealed.items() if key.startswith("PYTHON") or key == SPAWN_TIMES_ENV}
    return {**sandbox.worker_environ(sealed), **kept}


class SpawnError(Exception):
    """A worker could not be started: the fork server could not fork it, or is gone."""


class _ForkServerGone(SpawnError):
    """The fork server went away before it answered; a new one may do better."""


def describe_status(status: int | None) -> str:
    """Say in words how a process ended, from an ``os.waitpid`` status."""
    if status is None:
        return "ended for an unknown reason"
    if status == FORKSERVER_GONE:
        return "was killed with the fork server"
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        return f"was killed by {name} ({sig})"
    if os.WIFEXITED(status):
        return f"exited with code {os.WEXITSTATUS(status)}"
    return f"ended with status {status}"


class _ForkServer:
    """One fork server process, and what the daemon awaits from it."""

    def __init__(
        self, proc: subprocess.Popen[bytes] | ForkedChild, control: socket.socket, alive_fd: int, ready: asyncio.Future[None]
    ) -> None:
        self.proc = proc
        self.control = control
        self.alive_fd = alive_fd  # read end of the pipe only the fork server writes to: EOF = it died
        self.ready = ready
        self.requests: dict[int, asyncio.Future[int]] = {}
        self.workers: set[int] = set()  # forked and not reported ended
        self.gone = False
        self.heard = time.monotonic()  # when it last sent anything
        self.waiting_since: float | None = None  # since when an answer (to a spawn or a ping) is due
        self.health: asyncio.TimerHandle | None = None
        self.check_due = 0.0  # when the health check was meant to run
        self.stopped_checks = 0  # health checks in a row that found it stopped
        self.busy = time.monotonic()  # when a health check last found it with a worker or a request
        self.pings = itertools.count(1)

    def expect_answer(self) -> None:
        if self.waiting_since is None:
            self.waiting_since = time.monotonic()


class Spawner:
    """Starts workers through a fork server (started on first use, restarted if it dies)."""

    CHECK_EVERY = 1.0  # seconds between two health checks (a quarter of it while a spawn waits)
    PING_AFTER = 5.0  # seconds of silence after which it is pinged
    IDLE_STOP = 60.0  # seconds without a worker after which a project's confined fork server stops

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop | None = None,
        start_timeout: float = 30.0,
        answer_timeout: float = 5.0,
        first: EarlyForkServer | None = None,
        net_proxy: NetProxy | None = None,
        environ: Callable[[], dict[str, str]] = sealed_environ,
        idle_stop: float | None = None,
    ) -> None:
        self._loop = loop
        self._idle_stop = idle_stop  # stop the fork server after this long without a worker (None: never)
        self._net_proxy = net_proxy  # serves the workers allowed the network (confined ones only)
        self._environ = environ  # the fork servers' environment, made as each one starts
        self._first = first  # forked at start: the first fork server, until it is adopted or closed
        self._start_timeout = start_timeout
        self._answer_timeout = answer_timeout
        self._server: _ForkServer | None = None
        self._starting: asyncio.Lock | None = None
        self._exits: dict[int, asyncio.Future[int]] = {}
        self._ids = itertools.count(1)
        self._reaping: asyncio.Future[None] | None = None
        self.lost = 0  # fork servers that died on their own
        self.replaced = 0  # fork servers stopped or not answering, killed and replaced
        self.last_problem: str | None = None  # why the last one was replaced

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    @property
    def pid(self) -> int | None:
        """The fork server's pid, when one runs."""
        server = self._server
        proc = server.proc if server is not None and not server.gone else self._first.proc if self._first else None
        return proc.pid if proc is not None and proc.poll() is None else None

    async def _ensure_started(self) -> _ForkServer:
        if self._server is not None:
            return self._server
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            if self._server is not None:
                return self._server
            server = self._start()
            try:
                await asyncio.wait_for(asyncio.shield(server.ready), self._start_timeout)
            except (TimeoutError, SpawnError) as exc:
                self._lost(server)
                raise SpawnError(f"the fork server did not start: {str(exc) or 'timed out'}") from None
            server.heard = time.monotonic()
            self._schedule_check(server, self.CHECK_EVERY)
            return server

    def _start(self) -> _ForkServer:
        first, self._first = self._first, None
        if first is not None:
            return self._adopt(first.proc, first.control, first.alive_fd)
        try:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        except OSError as exc:
            raise SpawnError(f"cannot start the fork server: {_fd_cause(exc)}") from exc
        try:
            alive_r, alive_w = os.pipe()
        except OSError as exc:
            ours.close()
            theirs.close()
            raise SpawnError(f"cannot start the fork server: {_fd_cause(exc)}") from exc
        try:
            proc = subprocess.Popen(
                python_command("atomictoolsd.worker.forkserver", str(theirs.fileno()), str(os.getpid()), str(alive_w)),
                cwd=SEALED_CWD,
                env=self._environ(),
                pass_fds=(theirs.fileno(), alive_w),
                stdin=subprocess.PIPE,  # its EOF tells the fork server that we are gone
                close_fds=True,
            )
        except OSError as exc:
            ours.close()
            os.close(alive_r)
            raise SpawnError(f"cannot start the fork server: {exc}") from exc
        finally:
            theirs.close()
            os.close(alive_w)
        ours.setblocking(False)
        return self._adopt(proc, ours, alive_r)

    def _adopt(self, proc: subprocess.Popen[bytes] | ForkedChild, control: socket.socket, alive_fd: int) -> _ForkServer:
        server = _ForkServer(proc, control, alive_fd, self.loop.create_future())
        self.loop.add_reader(control.fileno(), self._on_readable, server)
        self.loop.add_reader(alive_fd, self._on_alive_readable, server)
        self._server = server
        return server

    def _on_alive_readable(self, server: _ForkServer) -> None:
        try:
            data = os.read(server.alive_fd, 64)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._lost(server, unexpected=True)

    def _on_readable(self, server: _ForkServer) -> None:
        control = server.control
        while not server.gone:
            try:
                data = control.recv(1 << 16)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self._lost(server, unexpected=True)
                return
            server.heard = time.monotonic()
            try:
                message = _decode(data)
            except msgspec.DecodeError as exc:
                self._replace(server, f"sent what is not a fork server's message ({exc})")
                return
            self._handle(server, message)
            # It answers in turn: whatever it sent, an answer to what it still owes is due from now.
            server.waiting_since = server.heard if server.requests else None

    def _handle(self, server: _ForkServer, message: ForkServerMessage) -> None:
        match message:
            case Spawned(request_id, pid):
                future = server.requests.pop(request_id, None)
                server.workers.add(pid)
                stale = self._exits.get(pid)
                if stale is not None and stale.done():
                    del self._exits[pid]  # an earlier worker's, whose pid this one reuses
                if future is not None and not future.done():
                    future.set_result(pid)
            case SpawnFailed(request_id, reason):
                future = server.requests.pop(request_id, None)
                if future is not None and not future.done():
                    future.set_exception(SpawnError(reason))
            case Exited(pid, status):
                server.workers.discard(pid)
                future = self.exit_status(pid)
                if not future.done():
                    future.set_result(status)
            case Ready() if not server.ready.done():
                server.ready.set_result(None)

    # -- health ---------------------------------------------------------------------------------

    def _check_health(self, server: _ForkServer) -> None:
        server.health = None
        if server.gone:
            return
        now = time.monotonic()
        if now - server.check_due > self.CHECK_EVERY and server.waiting_since is not None:
            # The daemon itself was held up (stopped, starved): what the fork server owes us may be
            # waiting unread. Its time to answer starts again now.
            server.waiting_since = now
        problem = None
        # Twice in a row: a tracer such as strace stops it for an instant at every system call.
        server.stopped_checks = server.stopped_checks + 1 if _process_state(server.proc.pid) in _STOPPED else 0
        if server.stopped_checks >= 2:
            problem = "was stopped (SIGSTOP, or a debugger)"
        elif server.waiting_since is not None and now - server.waiting_since > self._answer_timeout:
            problem = f"did not answer for {self._answer_timeout:g} s"
        if problem is not None:
            self._replace(server, problem)
            return
        if self._idle(server, now):
            self._lost(server)  # not unexpected: it exits as at the daemon's stop; the next spawn starts one
            return
        if server.waiting_since is None and now - server.heard >= self.PING_AFTER:
            try:
                server.control.send(_encode(Ping(next(server.pings))))
                server.expect_answer()
            except BlockingIOError:
                pass  # its queue is full: requests wait in it, and they are timed already
            except OSError:
                self._lost(server, unexpected=True)
                return
        self._schedule_check(server, self.CHECK_EVERY / 4 if server.requests else self.CHECK_EVERY)

    def _idle(self, server: _ForkServer, now: float) -> bool:
        """Whether ``server`` has had no worker and no request for ``idle_stop`` seconds."""
        if server.workers or server.requests:
            server.busy = now
            return False
        return self._idle_stop is not None and now - server.busy >= self._idle_stop

    def _schedule_check(self, server: _ForkServer, delay: float) -> None:
        server.check_due = time.monotonic() + delay
        server.health = self.loop.call_later(delay, self._check_health, server)

    def _replace(self, server: _ForkServer, problem: str) -> None:
        """Kill a fork server that cannot serve, so that the next spawn starts a new one."""
        pid = server.proc.pid
        self.replaced += 1
        self.last_problem = f"the fork server (pid {pid}) {problem}; it was replaced"
        log.warning(
            "the fork server (pid %d) %s; replacing it (%d worker(s) end with it)", pid, problem, len(server.workers),
            extra={"event": "forkserver.replace", "data": {"pid": pid, "problem": problem, "workers": sorted(server.workers)}},
        )
        try:
            os.kill(pid, signal.SIGKILL)  # SIGKILL reaches a stopped process too
        except ProcessLookupError:
            pass
        self._lost(server, unexpected=True, why=problem)

    def _lost(self, server: _ForkServer, unexpected: bool = False, why: str = "exited") -> None:
        """The fork server is gone (or being stopped): fail its waiting requests, end its workers."""
        if server.gone:
            return
        server.gone = True
        if server.health is not None:
            server.health.cancel()
            server.health = None
        if self._server is server:
            self._server = None
        for fd in (server.control.fileno(), server.alive_fd):
            try:
                self.loop.remove_reader(fd)
            except (ValueError, OSError):
                pass
        try:
            self.loop.remove_writer(server.control.fileno())  # a spawn waiting to send (_writable)
        except (ValueError, OSError):
            pass
        server.control.close()
        os.close(server.alive_fd)
        error = _ForkServerGone(f"the fork server {why}")
        if not server.ready.done():
            server.ready.set_exception(error)
            server.ready.exception()  # retrieved: the starter reports it
        for future in server.requests.values():
            if not future.done():
                future.set_exception(error)
        server.requests.clear()
        if unexpected:
            self.lost += 1
            # It could not end its workers' groups and sessions (nor, without PR_SET_PDEATHSIG, the
            # workers): do it here. Their pids still hold those ids while anything is left in them.
            kill_worker_processes(server.workers)
            log.warning(
                "the fork server (pid %d) %s; %d worker(s) died with it; the next worker starts a new one",
                server.proc.pid, why, len(server.workers),
                extra={"event": "forkserver.exit", "data": {"pid": server.proc.pid, "workers": sorted(server.workers)}},
            )
        for pid in server.workers:
            future = self.exit_status(pid)
            if not future.done():
                future.set_result(FORKSERVER_GONE)
        server.workers.clear()
        proc = server.proc
        if proc.stdin is not None:
            proc.stdin.close()
        self._reaping = self.loop.run_in_executor(None, stop_process, proc, 5.0, None)

    def exit_status(self, pid: int) -> asyncio.Future[int]:
        """A future resolved with the ``waitpid`` status of worker ``pid`` when it ends
        (``FORKSERVER_GONE`` when it died with the fork server)."""
        future = self._exits.get(pid)
        if future is None:
            future = self._exits[pid] = self.loop.create_future()
        return future

    def forget(self, pid: int) -> None:
        """Drop the bookkeeping of a worker whose end has been handled."""
        self._exits.pop(pid, None)

    async def spawn(self, spec: WorkerSpec, first: bytes = b"") -> tuple[int, socket.socket]:
        """Fork a worker for ``spec``; return its pid and the daemon's end of its channel. ``first``
        is on the channel before the worker starts (what it reads before loading its module: the
        variables a confined worker is given by name, never through the fork server; the content a
        followed project's worker may load).

        Raises:
            SpawnError: no fork server could be started, it could not fork, or two died in turn.
        """
        try:
            return await self._spawn_on(await self._ensure_started(), spec, first)
        except _ForkServerGone:
            pass  # died before it answered, or before we noticed: once more, on a new one
        try:
            return await self._spawn_on(await self._ensure_started(), spec, first)
        except _ForkServerGone as exc:
            raise SpawnError(f"{exc}, twice in a row") from None

    async def _spawn_on(self, server: _ForkServer, spec: WorkerSpec, first: bytes) -> tuple[int, socket.socket]:
        try:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        except OSError as exc:  # out of file descriptors: fail the calls now, not at their timeout
            raise SpawnError(f"cannot open the worker's channel: {_fd_cause(exc)}") from exc
        try:
            handoff = self._handoff_pair(spec)
        except SpawnError:
            ours.close()
            theirs.close()
            raise
        rest = first
        if first:  # in the channel's buffer now: the worker need not wait for us once forked
            ours.setblocking(False)
            try:
                rest = first[ours.send(first):]
            except BlockingIOError:
                pass
        request_id = next(self._ids)
        future: asyncio.Future[int] = self.loop.create_future()
        server.requests[request_id] = future
        server.expect_answer()
        message = _encode(Spawn(request_id, msgspec.json.encode(spec)))
        fds = [theirs.fileno(), *([handoff[1].fileno()] if handoff else [])]
        try:
            while True:
                try:
                    socket.send_fds(server.control, [message], fds)
                    break
                except BlockingIOError:
                    await self._writable(server)
        except OSError as exc:
            server.requests.pop(request_id, None)
            ours.close()
            _close_pair(handoff, 0)
            # A datagram socket reports no end-of-file: a failed send may be the first news of its death.
            self._lost(server, unexpected=True)
            raise _ForkServerGone(f"cannot reach the fork server ({exc})") from exc
        except BaseException:
            server.requests.pop(request_id, None)
            if not server.requests:
                server.waiting_since = None  # it was never asked: no answer is due
            ours.close()
            _close_pair(handoff, 0)
            raise
        finally:
            theirs.close()
            _close_pair(handoff, 1)
        try:
            pid = await future
            if rest:
                await self.loop.sock_sendall(ours, rest)  # larger than the buffer: the worker reads meanwhile
        except BaseException:
            ours.close()
            _close_pair(handoff, 0)
            raise
        self.exit_status(pid)
        if handoff is not None:
            self._hand_over(pid, handoff[0], spec)
        return pid, ours

    def _handoff_pair(self, spec: WorkerSpec) -> tuple[socket.socket, socket.socket] | None:
        """For a confined worker allowed the network: the socket pair on which it hands its proxy
        listener over (``worker/netns.isolate``); None for every other worker."""
        if self._net_proxy is None or spec.sandbox is None or not spec.sandbox.get("net"):
            return None
        try:
            return socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        except OSError as exc:
            raise SpawnError(f"cannot open the worker's network hand-over socket: {_fd_cause(exc)}") from exc

    def _hand_over(self, pid: int, handoff: socket.socket, spec: WorkerSpec) -> None:
        """The proxy serves worker ``pid`` from now until it ends."""
        assert self._net_proxy is not None and spec.sandbox is not None
        served = self._net_proxy.attach(pid, handoff, spec.sandbox)
        self.exit_status(pid).add_done_callback(lambda _: self._net_proxy.detach(served))  # type: ignore[union-attr]

    async def _writable(self, server: _ForkServer) -> None:
        if server.gone:
            raise _ForkServerGone("the fork server exited")
        fd = server.control.fileno()
        waiter: asyncio.Future[None] = self.loop.create_future()
        self.loop.add_writer(fd, lambda: waiter.done() or waiter.set_result(None))
        try:
            await asyncio.wait_for(waiter, 1.0)  # and look again: it may have died meanwhile
        except TimeoutError:
            pass
        finally:
            if not server.gone:
                self.loop.remove_writer(fd)

    async def close(self) -> None:
        """Stop the fork server (closing its channel makes it kill every worker and exit)."""
        first, self._first = self._first, None
        if first is not None and self._server is None:  # never used: adopted only to be stopped
            self._adopt(first.proc, first.control, first.alive_fd)
        if self._server is not None:
            self._lost(self._server)
        if self._reaping is not None:
            await self._reaping

    def info(self) -> dict[str, Any]:
        """For status: the fork server's pid and state, and what became of the ones before it.

        ``state`` is ``"running"``, ``"stopped"``, ``"not answering"`` (a spawn or a ping is late;
        the health check replaces it once ``answer_timeout`` has passed) or None (none runs: the
        next spawn starts one). ``problem`` says what is wrong now, else why the last one was replaced.
        """
        state = None
        problem = self.last_problem
        server = self._server
        pid = self.pid
        if server is not None and pid is not None:
            state = "running"
            waited = time.monotonic() - server.waiting_since if server.waiting_since is not None else 0.0
            if _process_state(pid) in _STOPPED:
                state = "stopped"
                problem = f"the fork server (pid {pid}) is stopped (SIGSTOP, or a debugger); it is being replaced"
            elif waited > 1.0:
                state = "not answering"
                problem = f"the fork server (pid {pid}) has not answered for {waited:.1f} s"
        return {
            "pid": pid, "state": state, "workers": sum(1 for f in self._exits.values() if not f.done()),
            "lost": self.lost, "replaced": self.replaced, "problem": problem,
        }


_STOPPED = ("T", "t")  # stopped by a signal; stopped by a tracer


def _close_pair(pair: tuple[socket.socket, socket.socket] | None, which: int) -> None:
    if pair is not None:
        pair[which].close()


def _process_state(pid: int) -> str | None:
    """The one-letter state Linux gives a process (``R``, ``S``, ``T``, ...); None where unknown."""
    fields = proc_stat(pid, 1)
    return fields[STATE].decode() if fields else None


def _fd_cause(exc: OSError) -> str:
    if exc.errno in (errno.EMFILE, errno.ENFILE):
        return (
            f"{exc.strerror} (the daemon is out of file descriptors: close idle connections, "
            f"or raise the open-file limit, ulimit -n, and restart the daemon)"
        )
    return str(exc)


