"""The worker's side of the repository reader (``_gitread``): its server, started once per worker
when a git built-in first needs it, and one reading per request, killed at the call's deadline.

The server is started as ``python -P -m atomictoolsd.worker.builtins._gitread --serve FD`` from ``/``
(``python_command``, ``SEALED_CWD``) with ``reader_environ()``: this program's own ``PYTHONPATH`` at
most, nothing else of the worker's (no token, no ``GIT_*``, no ``HOME``; the request says where
your git configuration is). It has pygit2 imported, so a reading costs a fork, not an interpreter
(measured: docs/builtins.md). A server that is gone (it crashed, or was killed) is started again
by the next reading; the readings it forked live on and answer.

Runs inside a worker, on the event loop of its async tools; never blocks that loop.
"""

from __future__ import annotations

import asyncio
import errno
import os
import signal
import socket
from collections import deque

from atomictools._launch import SEALED_CWD, python_command, sealed_environ

__all__ = ["READER", "ReaderGone", "read", "reader_environ"]

READER = "atomictoolsd.worker.builtins._gitread"
"""The repository reader's module."""
MAX_ANSWER = 64 * 1024 * 1024  # a reader that says more is not believed


class ReaderGone(Exception):
    """The reader's server could not be started, or ended before it forked the reading."""


def reader_environ() -> dict[str, str]:
    """The reader's whole environment: how to find this program's code, nothing else."""
    return {key: value for key, value in sealed_environ().items() if key.startswith("PYTHON")}


class _Server:
    """One running server: its process, its end of the socket, the pids it owes, in order."""

    def __init__(self, process: asyncio.subprocess.Process, control: socket.socket) -> None:
        self.process = process
        self.control = control
        self.loop = asyncio.get_running_loop()
        self.owed: deque[asyncio.Future[int]] = deque()
        self.received = b""
        self.sending = asyncio.Lock()
        self.gone = False
        self.loop.add_reader(control.fileno(), self._readable)

    def _readable(self) -> None:
        try:
            data = self.control.recv(1 << 12)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.close()
            return
        self.received += data
        while len(self.received) >= 4 and self.owed:
            pid, self.received = int.from_bytes(self.received[:4], "big"), self.received[4:]
            future = self.owed.popleft()
            if future.cancelled():
                _kill(pid)  # its call gave up before it learnt the pid
            else:
                future.set_result(pid)

    async def start(self, request: bytes, out: int) -> asyncio.Future[int]:
        """Send ``request`` with the pipe ``out``; the future of the pid of the child reading it."""
        message = len(request).to_bytes(4, "big") + request
        loop = asyncio.get_running_loop()
        async with self.sending:
            sent = 0
            while not sent:
                try:
                    sent = socket.send_fds(self.control, [message], [out])
                except BlockingIOError:
                    await _writable(loop, self.control)
            if sent < len(message):
                await loop.sock_sendall(self.control, message[sent:])
            future: asyncio.Future[int] = loop.create_future()
            self.owed.append(future)
        return future

    def stop(self) -> None:
        """Close it and end its process (its readings live on in sessions of their own)."""
        self.close()
        if self.process.returncode is None:
            self.process.kill()

    def close(self) -> None:
        if self.gone:
            return
        self.gone = True
        self.loop.remove_reader(self.control.fileno())
        self.control.close()
        for future in self.owed:
            if not future.done():
                future.set_exception(ReaderGone("the repository reader's server ended"))
        self.owed.clear()


_server: _Server | None = None


async def _running() -> _Server:
    global _server
    if _server is not None and not _server.gone and _server.loop is asyncio.get_running_loop():
        return _server
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        process = await asyncio.create_subprocess_exec(
            *python_command(READER, "--serve", str(theirs.fileno())),
            cwd=SEALED_CWD, env=reader_environ(), pass_fds=(theirs.fileno(),), stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
            start_new_session=True,  # a reading's group is killed, never the server's
        )
    except OSError as exc:
        ours.close()
        raise ReaderGone(f"cannot start the repository reader ({exc.strerror or exc})") from None
    finally:
        theirs.close()
    ours.setblocking(False)
    _server = _Server(process, ours)
    return _server


async def read(request: bytes, timeout: float) -> bytes | None:
    """The answer to ``request`` (JSON), or None when the reading takes more than ``timeout``
    seconds: then it is killed, with all it started. Raises ``ReaderGone``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    server = await _running()
    answer, out = os.pipe()
    try:
        os.set_blocking(answer, False)
        try:
            pid_owed = await asyncio.wait_for(server.start(request, out), max(0.0, deadline - loop.time()))
        except TimeoutError:
            server.stop()  # a request may be half sent: this server is of no more use
            raise
        finally:
            os.close(out)  # the child holds it now: its exit is our end of file
        try:
            pid = await asyncio.wait_for(asyncio.shield(pid_owed), max(0.0, deadline - loop.time()))
        except BaseException:
            pid_owed.cancel()  # the server's reader kills it when its pid comes
            raise
        try:
            return await asyncio.wait_for(_read_all(loop, answer), max(0.0, deadline - loop.time()))
        except BaseException:
            _kill(pid)  # still reading (its pipe is open, so it is not reaped): late, or the call cancelled
            raise
    except TimeoutError:
        return None
    finally:
        os.close(answer)


async def _read_all(loop: asyncio.AbstractEventLoop, fd: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            await _readable(loop, fd)
            continue
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > MAX_ANSWER:
            return b""
        chunks.append(chunk)


async def _readable(loop: asyncio.AbstractEventLoop, fd: int) -> None:
    ready: asyncio.Future[None] = loop.create_future()
    loop.add_reader(fd, lambda: ready.done() or ready.set_result(None))
    try:
        await ready
    finally:
        loop.remove_reader(fd)


async def _writable(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
    ready: asyncio.Future[None] = loop.create_future()
    loop.add_writer(sock.fileno(), lambda: ready.done() or ready.set_result(None))
    try:
        await ready
    finally:
        loop.remove_writer(sock.fileno())


def _kill(pid: int) -> None:
    """End a reading's process group (it leads it: ``setsid``); gone already is fine."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError as exc:
        if exc.errno not in (errno.ESRCH, errno.EPERM):
            raise
