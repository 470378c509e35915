"""The daemon's side of the fork server: ask it for workers, learn how they ended.

``Spawner.spawn(spec)`` returns the new worker's pid and the daemon's end of its channel. Exit
statuses arrive separately (only the fork server, their parent, can reap workers) and resolve the
future returned by ``exit_status(pid)``. If the fork server itself dies, the next spawn starts a new
one; workers of the old one die with it (they get SIGKILL from their parent's death).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import socket
import subprocess
import sys
from typing import Any

import msgspec

from atomictoolsd.workers.runtime import WorkerSpec

__all__ = ["SpawnError", "Spawner", "describe_status"]

_encode = msgspec.msgpack.encode
_decode = msgspec.msgpack.decode


class SpawnError(Exception):
    """A worker could not be started."""


def describe_status(status: int | None) -> str:
    """Say in words how a process ended, from an ``os.waitpid`` status."""
    if status is None:
        return "ended for an unknown reason"
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


class Spawner:
    """Starts workers through a fork server (started on first use, restarted if it dies)."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None, start_timeout: float = 30.0) -> None:
        self._loop = loop
        self._start_timeout = start_timeout
        self._proc: subprocess.Popen[bytes] | None = None
        self._control: socket.socket | None = None
        self._ready: asyncio.Future[None] | None = None
        self._starting: asyncio.Lock | None = None
        self._requests: dict[int, asyncio.Future[int]] = {}
        self._exits: dict[int, asyncio.Future[int]] = {}
        self._ids = itertools.count(1)
        self._reaping: asyncio.Future[None] | None = None
        self._sending: asyncio.Lock | None = None  # one request at a time waits for room, in order
        self._room: asyncio.Future[None] | None = None  # resolved when the control socket can take more

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    @property
    def pid(self) -> int | None:
        """The fork server's pid, when one runs."""
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    async def _ensure_started(self) -> socket.socket:
        if self._control is not None:
            return self._control
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            if self._control is not None:
                return self._control
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
            try:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "atomictoolsd.workers.forkserver", str(theirs.fileno()), str(os.getpid())],
                    pass_fds=(theirs.fileno(),),
                    stdin=subprocess.PIPE,  # its EOF tells the fork server that we are gone
                    close_fds=True,
                )
            except OSError as exc:
                ours.close()
                raise SpawnError(f"cannot start the fork server: {exc}") from exc
            finally:
                theirs.close()
            ours.setblocking(False)
            self._proc = proc
            self._ready = self.loop.create_future()
            self.loop.add_reader(ours.fileno(), self._on_readable, ours)
            self._control = ours
            try:
                await asyncio.wait_for(asyncio.shield(self._ready), self._start_timeout)
            except (TimeoutError, SpawnError) as exc:
                self._lost(ours)
                raise SpawnError(f"the fork server did not start: {exc or 'timed out'}") from None
            return ours

    def _on_readable(self, control: socket.socket) -> None:
        while True:
            try:
                data = control.recv(1 << 16)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self._lost(control)
                return
            message = _decode(data)
            op = message[0]
            if op == "spawned":
                future = self._requests.pop(message[1], None)
                if future is not None and not future.done():
                    future.set_result(message[2])
            elif op == "exited":
                future = self.exit_status(message[1])
                if not future.done():
                    future.set_result(message[2])
            elif op == "ready" and self._ready is not None and not self._ready.done():
                self._ready.set_result(None)

    def _lost(self, control: socket.socket) -> None:
        """The fork server is gone: fail waiting requests; its workers die with it."""
        if self._control is control:
            self._control = None
        try:
            self.loop.remove_reader(control.fileno())
            self.loop.remove_writer(control.fileno())
        except (ValueError, OSError):
            pass
        control.close()
        error = SpawnError("the fork server exited")
        if self._room is not None and not self._room.done():
            self._room.set_exception(error)  # a request waiting for room fails like the others
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(error)
            self._ready.exception()  # retrieved: the starter reports it
        for future in self._requests.values():
            if not future.done():
                future.set_exception(error)
        self._requests.clear()
        for future in self._exits.values():
            if not future.done():
                future.set_result(signal.SIGKILL)  # PR_SET_PDEATHSIG: they were killed with it
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.stdin is not None:
                proc.stdin.close()
            self._reaping = self.loop.run_in_executor(None, _wait, proc, 5.0)

    def exit_status(self, pid: int) -> asyncio.Future[int]:
        """A future resolved with the ``waitpid`` status of worker ``pid`` when it ends."""
        future = self._exits.get(pid)
        if future is None:
            future = self._exits[pid] = self.loop.create_future()
        return future

    def forget(self, pid: int) -> None:
        """Drop the bookkeeping of a worker whose end has been handled."""
        self._exits.pop(pid, None)

    async def spawn(self, spec: WorkerSpec) -> tuple[int, socket.socket]:
        """Fork a worker for ``spec``; return its pid and the daemon's end of its channel."""
        control = await self._ensure_started()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        request_id = next(self._ids)
        future: asyncio.Future[int] = self.loop.create_future()
        self._requests[request_id] = future
        try:
            await self._send(control, _encode(["spawn", request_id, msgspec.json.encode(spec)]), theirs.fileno())
        except (OSError, SpawnError) as exc:
            self._requests.pop(request_id, None)
            ours.close()
            raise SpawnError(f"cannot reach the fork server: {exc}") from exc
        finally:
            theirs.close()
        try:
            pid = await future
        except BaseException:
            ours.close()
            raise
        self.exit_status(pid)
        return pid, ours

    async def _send(self, control: socket.socket, message: bytes, fd: int) -> None:
        """Send one request with its file descriptor. The fork server's datagram queue holds only
        ``net.unix.max_dgram_qlen`` requests (10 by default): when it is full (a scan loading many
        modules at once), wait until it has room, requests in the order they came."""
        if self._sending is None:
            self._sending = asyncio.Lock()
        async with self._sending:
            while True:
                try:
                    socket.send_fds(control, [message], [fd])
                    return
                except BlockingIOError:
                    pass
                if control.fileno() < 0:
                    raise SpawnError("the fork server exited")
                self._room = self.loop.create_future()
                self.loop.add_writer(control.fileno(), self._has_room, control)
                try:
                    await self._room
                finally:
                    self._room = None

    def _has_room(self, control: socket.socket) -> None:
        self.loop.remove_writer(control.fileno())
        if self._room is not None and not self._room.done():
            self._room.set_result(None)

    async def close(self) -> None:
        """Stop the fork server (closing its channel makes it kill every worker and exit)."""
        if self._control is not None:
            self._lost(self._control)
        if self._reaping is not None:
            await self._reaping

    def info(self) -> dict[str, Any]:
        return {"pid": self.pid, "workers": sum(1 for f in self._exits.values() if not f.done())}


def _wait(proc: subprocess.Popen[bytes], timeout: float) -> None:
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
