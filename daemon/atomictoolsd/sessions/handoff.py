"""A shim's stdin and stdout, handed to the daemon: an agent's messages read and answered with no
relay in between.

The stdio shim (``shim/relay.py``) attaches over the socket, then asks ``atomic/handoff``. A daemon
that takes descriptors stops reading the socket and answers; the shim sends its stdin and stdout
(one byte with ``SCM_RIGHTS``); from then on the connection reads the agent's requests from that
stdin and writes every line to that stdout. A call then goes agent → daemon → worker: one process
and two copies fewer than through a relay. The socket stays open as the shim's life:

- the shim's end closing (the agent stopped it, or it saw the agent die) ends the session as a
  client hanging up does: its calls are cancelled, what is not yet written is dropped;
- the daemon closes its end when the session ends: after a ``done`` line once every answer is
  written when the agent's stdin ended, or at once when the agent closed its end of the stdout (the
  shim exits 0); without one when the daemon stops (the shim says so and exits 1).

The socket carries ``atomic/handoff`` notifications only, each ``{"state": …}``: ``taken`` once the
descriptors are in use, ``refused`` (with ``why``) when they are not and the socket goes on as
before, so that the shim relays, and ``done``. What the session says while the descriptors are on
their way is held and written after, where the connection then writes.

Refused: a descriptor that is not a pipe or a stream socket, or not open for its direction (a
terminal, a file, ``/dev/null``: the shim relays those), a connection with a request in flight or
bytes unread, no descriptors within ``WAIT`` seconds (the connection is closed), or no room for two
more descriptors under the open-file budget.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import socket
import stat
from collections.abc import Callable
from typing import Any, Protocol

import msgspec

from atomictools._protocol import INVALID_REQUEST
from atomictoolsd.sessions.output import encode_error
from atomictoolsd.sessions.session import Session, SessionHost

__all__ = ["METHOD", "WAIT", "Connection", "StdioTransport", "offer"]

log = logging.getLogger(__name__)

METHOD = "atomic/handoff"
WAIT = 10.0  # seconds the daemon waits for the descriptors once it asked for them
_CLOEXEC = getattr(socket, "MSG_CMSG_CLOEXEC", 0)  # Linux: received close-on-exec, with no window


class Connection(Protocol):
    """What the hand-over uses of the socket's connection (``connection.Connection``): its transport,
    which it replaces, and the protocol's methods the stdio's pipes call."""

    transport: Any
    session: Session
    server: SessionHost
    batched: dict[bytes, Any]
    batch: Any

    @property
    def half_closed(self) -> bool: ...

    def unread(self) -> bool: ...

    def error(self, id_json: bytes, error: bytes) -> None: ...

    def data_received(self, data: bytes) -> None: ...

    def eof_received(self) -> bool: ...

    def pause_writing(self) -> None: ...

    def resume_writing(self) -> None: ...

    def connection_lost(self, exc: Exception | None) -> None: ...


def _notice(state: str, why: str | None = None) -> bytes:
    params = {"state": state} if why is None else {"state": state, "why": why}
    return msgspec.json.encode({"jsonrpc": "2.0", "method": METHOD, "params": params}) + b"\n"


def offer(connection: Connection, id_json: bytes) -> None:
    """``atomic/handoff`` on ``connection``: ask for the shim's stdin and stdout, or refuse (an error
    answer; the connection goes on as a socket)."""
    control = connection.transport
    why = _cannot_take(connection, control)
    if why is not None:
        connection.error(id_json, encode_error(INVALID_REQUEST, f"{METHOD} refused: {why}; relay instead"))
        return
    assert control is not None
    control.pause_reading()  # before the answer: the byte that carries the descriptors is read here
    control.write(b'{"jsonrpc":"2.0","id":' + id_json + b',"result":{"descriptors":["stdin","stdout"]}}\n')
    _Receiving(connection, control).start()


def _cannot_take(connection: Connection, control: Any) -> str | None:
    if isinstance(control, (StdioTransport, _Held)):
        return "this connection has handed its descriptors over already"
    if control is None or control.get_extra_info("socket") is None:
        return "only a Unix socket connection can hand over descriptors"
    if connection.session.revision is not None:
        # The shim asks right after its attach; a client that speaks MCP already is one the shim
        # relays (an agent's own atomic/handoff), whose next bytes are its messages, not descriptors.
        return "it comes before the session's first MCP request"
    if connection.session.busy() or connection.batched or connection.batch is not None or connection.unread():
        return "send it alone, with no other request in flight"
    return connection.server.reserve_stdio(connection.session)  # from here on, released unless taken


class _Held:
    """The connection's transport while the descriptors are on their way: what the session writes is
    held, in order, for the transport that follows."""

    def __init__(self, control: Any, stop: Callable[[], None]) -> None:
        self.control = control
        self.stop = stop  # the wait for the descriptors, ended when the connection is
        self.held: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.held.append(data)

    def get_write_buffer_size(self) -> int:
        return sum(map(len, self.held))

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default  # no hang-up watch of its own: the control socket's end ends it

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def is_closing(self) -> bool:
        return bool(self.control.is_closing())

    def close(self) -> None:
        self.stop()
        self.control.close()

    def abort(self) -> None:
        self.stop()
        self.control.abort()


class _Receiving:
    """Waits for the byte that carries the descriptors, on a duplicate of the paused socket."""

    def __init__(self, connection: Connection, control: Any) -> None:
        self.connection = connection
        self.control = control
        self.held = _Held(control, self._stop)
        self.loop = asyncio.get_running_loop()
        self.sock = socket.socket(fileno=os.dup(control.get_extra_info("socket").fileno()))
        self.timer: asyncio.TimerHandle | None = None
        self.waiting = False

    def start(self) -> None:
        self.connection.transport = self.held  # type: ignore[assignment]
        self.sock.setblocking(False)
        self.loop.add_reader(self.sock.fileno(), self._readable)
        self.timer = self.loop.call_later(WAIT, self._too_late)
        self.waiting = True

    def _stop(self) -> None:
        if not self.waiting:
            return
        self.waiting = False
        self.loop.remove_reader(self.sock.fileno())
        if self.timer is not None:
            self.timer.cancel()
        self.sock.close()  # the duplicate only: the connection's socket stays open

    def _too_late(self) -> None:
        self._stop()
        log.warning("a shim asked to hand over its stdio and sent nothing for %.0f s: closed", WAIT)
        self.connection.transport = self.control
        self.connection.server.release_stdio(self.connection.session)
        self.control.abort()

    def _readable(self) -> None:
        try:
            data, fds, _flags, _address = socket.recv_fds(self.sock, 1, 2, _CLOEXEC)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data, fds = b"", []
        self._stop()
        if not data:  # the shim went: what it held is read by the socket as usual, and ends it
            for fd in fds:
                os.close(fd)
            self._give_back(None)
            return
        owned = _own(fds)
        if isinstance(owned, str):
            self._give_back(owned)
            return
        task = self.loop.create_task(self._take(*owned))
        task.add_done_callback(_log_failure)

    def _give_back(self, why: str | None, read: bytes = b"") -> None:
        """Refused, or the shim went: the socket is the connection's transport again. ``read``: what
        was read from the agent's stdin meanwhile, handled first."""
        control, connection = self.control, self.connection
        connection.transport = control
        connection.server.release_stdio(connection.session)
        if why is not None and not control.is_closing():
            control.write(_notice("refused", why))
        for data in self.held.held:
            control.write(data)
        if read:
            connection.data_received(read)
        control.resume_reading()

    async def _take(self, stdin: _Owned, stdout: _Owned) -> None:
        """Serve the session on ``stdin`` and ``stdout``: the stdout first, so that nothing has been
        read from the agent when the daemon cannot write to it. Either may fail before it is taken
        (the agent's end of the stdout already closed): the shim relays then, and finds it so."""
        loop = self.loop
        stdio = StdioTransport(self.connection, self.control)
        stdin_protocol = _StdinProtocol(self.connection, stdio, stdin)
        try:
            # closefd=False: the pipe transport closes the descriptor; the file object only names it.
            writer, _ = await loop.connect_write_pipe(lambda: _StdoutProtocol(self.connection, stdio, stdout),
                                                      open(stdout.fd, "wb", buffering=0, closefd=False))
        except OSError as exc:
            stdin.close()
            stdout.close()
            self._give_back(f"its stdout cannot be written: {exc}")
            return
        try:
            reader, _ = await loop.connect_read_pipe(lambda: stdin_protocol,
                                                     open(stdin.fd, "rb", buffering=0, closefd=False))
        except OSError as exc:
            writer.abort()
            stdin.close()
            self._give_back(f"its stdin cannot be read: {exc}")
            return
        if self.connection.transport is not self.held:  # the connection was closed meanwhile (forgotten)
            reader.close()
            writer.close()
            return
        if stdio.failed is not None:
            reader.close()
            writer.abort()
            # What the stdin's transport read already is read no more by anyone else: handled here,
            # before the shim relays the rest.
            self._give_back(f"its {stdio.failed}", b"".join(stdin_protocol.early or ()))
            return
        stdio.attach(reader, writer)
        self.control.set_protocol(_ShimProtocol(stdio))
        self.control.write(_notice("taken"))
        self.control.resume_reading()  # to see its end
        self.connection.transport = stdio  # type: ignore[assignment]
        for data in self.held.held:
            stdio.write(data)
        stdin_protocol.start()


class _Owned:
    """One of the agent's descriptors as the daemon holds it. A pipe is opened again through
    ``/proc``: a file description of the daemon's own, non-blocking whatever another holder of the
    shim's does to its flags, and left as it was. A socket cannot be opened again: it is used as it
    came, and the flags its description had are put back once the daemon is done with it."""

    def __init__(self, fd: int, access: int) -> None:
        self.keep = -1  # a socket's: a duplicate to restore its flags through, once closed
        self.flags = 0
        try:
            if stat.S_ISFIFO(os.fstat(fd).st_mode) and os.path.isdir("/proc/self/fd"):
                self.fd = os.open(f"/proc/self/fd/{fd}", access | os.O_NONBLOCK | os.O_CLOEXEC)
                os.close(fd)
            else:
                self.fd = fd
                os.set_inheritable(fd, False)  # where the flag could not come with it
                self.flags = fcntl.fcntl(fd, fcntl.F_GETFL)
                self.keep = os.dup(fd)
        except OSError:
            os.close(fd)
            raise

    def close(self) -> None:
        """Not used after all (or its transport could not be made)."""
        try:
            os.close(self.fd)
        except OSError:
            pass
        self.restore()

    def restore(self) -> None:
        """The daemon is done with it (its transport closed it)."""
        if self.keep >= 0:
            try:
                fcntl.fcntl(self.keep, fcntl.F_SETFL, self.flags)
            except OSError:
                pass
            os.close(self.keep)
            self.keep = -1


def _own(fds: list[int]) -> tuple[_Owned, _Owned] | str:
    """The stdin and stdout the daemon serves, or why not (what came is closed then)."""
    why = _unfit(fds)
    owned: list[_Owned] = []
    if why is None:
        try:
            owned.append(_Owned(fds[0], os.O_RDONLY))
            owned.append(_Owned(fds[1], os.O_WRONLY))
            return owned[0], owned[1]
        except OSError as exc:
            why = f"its {('stdin', 'stdout')[len(owned)]} cannot be opened: {exc}"
            fds = fds[len(owned) + 1:]
    for one in owned:
        one.close()
    for fd in fds:
        os.close(fd)
    return why


def _unfit(fds: list[int]) -> str | None:
    """Why these are not a stdin and a stdout the daemon can serve, or None."""
    if len(fds) != 2:
        return f"{len(fds)} descriptor(s) came, not stdin and stdout"
    try:
        first, second = os.fstat(fds[0]), os.fstat(fds[1])
    except OSError as exc:
        return f"its descriptors cannot be read: {exc}"
    if stat.S_ISSOCK(first.st_mode) and (first.st_dev, first.st_ino) == (second.st_dev, second.st_ino):
        return "its stdin and stdout are one socket, which a reader and a writer apart cannot share"
    for fd, name, modes in ((fds[0], "stdin", (os.O_RDONLY, os.O_RDWR)), (fds[1], "stdout", (os.O_WRONLY, os.O_RDWR))):
        try:
            mode = os.fstat(fd).st_mode
            access = fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE
        except OSError as exc:
            return f"its {name} cannot be read: {exc}"
        if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)):
            return f"its {name} is not a pipe or a socket"
        if stat.S_ISSOCK(mode):
            with socket.socket(fileno=os.dup(fd)) as sock:
                if sock.type != socket.SOCK_STREAM:
                    return f"its {name} is not a stream socket"
        elif access not in modes:
            return f"its {name} is not open for {'reading' if name == 'stdin' else 'writing'}"
    return None


def _ignored(data: bytes) -> None:
    pass


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("taking a shim's stdio failed", exc_info=task.exception())


class StdioTransport:
    """The transport of a connection whose shim handed its stdio over: it reads the agent's stdin and
    writes its stdout; the shim's socket (``control``) is its life."""

    def __init__(self, connection: Connection, control: Any) -> None:
        self.connection = connection
        self.control = control
        self.reader: Any = None
        self.writer: Any = None
        self.taken = False  # attach: the connection reads and writes here
        self.failed: str | None = None  # what ended a side before it was taken (``_take`` gives back)
        self.lost = False
        self.reading_paused = False  # by the connection: the agent does not read its answers
        self.closed_here = False  # the daemon closed it (the session's end, the daemon's stop)
        self.finished = False  # closed at the session's own end: its stdin ended, every call answered

    def attach(self, reader: Any, writer: Any) -> None:
        self.reader, self.writer = reader, writer
        self.taken = True
        self.write = writer.write  # the call path's write: the pipe transport's own method

    def write(self, data: bytes) -> None:  # replaced in attach
        raise RuntimeError("no stdout yet")

    def get_write_buffer_size(self) -> int:
        return int(self.writer.get_write_buffer_size())

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default  # no socket: the control socket's end is the hang-up (``_ShimProtocol``)

    def pause_reading(self) -> None:
        self.reading_paused = True
        if not self.reader.is_closing():
            self.reader.pause_reading()

    def resume_reading(self) -> None:
        self.reading_paused = False
        if not self.reader.is_closing():
            self.reader.resume_reading()

    def is_closing(self) -> bool:
        return bool(self.writer.is_closing())

    def close(self) -> None:
        """Close after what is buffered has been written. The stdout's ``connection_lost``, once it is
        written out, ends the connection (``ended``): the session is counted and the shim waits until
        then, so that an agent which stops reading when its server exits has every answer."""
        if self.closed_here:
            return
        self.closed_here = True
        # The session's own end (else the daemon stops, its calls cut short): the shim is told done.
        self.finished = self.connection.half_closed and not self.connection.session.busy()
        self.write = _ignored  # what the session says from here on (a list_changed) is for no one
        self.reader.close()
        self.writer.close()

    def abort(self) -> None:
        self.closed_here = True
        self.reader.abort()
        self.writer.abort()
        self.control.abort()

    def ended(self, exc: Exception | None, side: str = "") -> None:
        """One side is gone (``side``: the stdout closed or written out, the stdin failed; "": the
        shim's socket closed): the connection's end, once. The shim is told ``done`` when the agent
        ended it (its end of the stdout closed, its stdin failed) or the session did (its stdin
        ended, every call answered); not when the daemon stops (the shim says so and exits 1). The
        shim's end stops the writing: the session is over, its answers wanted by no one."""
        if not self.taken:  # the connection is not ours yet: _take gives it back
            self.failed = self.failed or f"{'stdout' if side == 'stdout' else 'stdin'} ended at once: {exc}"
            return
        if self.lost:
            return
        self.lost = True
        self.reader.close()
        if side != "stdout":
            self.writer.abort()  # closing or not: nothing more is written, nothing left held
        by_agent = side == "stdin" or (side == "stdout" and (self.finished or not self.closed_here))
        if by_agent and not self.control.is_closing():
            self.control.write(_notice("done"))
        self.control.close()
        self.connection.connection_lost(exc)


class _StdinProtocol(asyncio.Protocol):
    """The agent's stdin. What comes before the connection writes to the stdout (the pipe transport
    starts reading as it is made) is kept, reading paused, and read once it does (``start``)."""

    def __init__(self, connection: Connection, stdio: StdioTransport, owned: _Owned) -> None:
        self.connection = connection
        self.stdio = stdio
        self.owned = owned
        self.transport: Any = None
        self.early: list[bytes] | None = []
        self.early_eof = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:  # until start
        assert self.early is not None
        self.early.append(data)
        self.transport.pause_reading()

    def start(self) -> None:
        """The connection writes to the stdout now: read what came, and from here on every read goes
        straight to the connection, with no call in between."""
        early, self.early = self.early or [], None
        self.data_received = self.connection.data_received  # type: ignore[method-assign]
        self.transport.set_protocol(self)  # the transport keeps the method it calls: this one now
        for data in early:
            self.connection.data_received(data)
        if self.early_eof:
            self.connection.eof_received()
        elif not self.transport.is_closing() and not self.stdio.reading_paused:
            self.transport.resume_reading()

    def eof_received(self) -> bool:
        if self.early is not None:
            self.early_eof = True
        else:
            self.connection.eof_received()  # the agent closed stdin: answer what was asked, then close
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.owned.restore()
        if exc is not None:
            self.stdio.ended(exc, side="stdin")


class _StdoutProtocol(asyncio.BaseProtocol):
    def __init__(self, connection: Connection, stdio: StdioTransport, owned: _Owned) -> None:
        self.connection = connection
        self.stdio = stdio
        self.owned = owned

    def pause_writing(self) -> None:
        self.connection.pause_writing()

    def resume_writing(self) -> None:
        self.connection.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self.owned.restore()
        self.stdio.ended(exc, side="stdout")


class _ShimProtocol(asyncio.Protocol):
    """The shim's socket once it handed its stdio over: it says nothing more; its end is the session's."""

    def __init__(self, stdio: StdioTransport) -> None:
        self.stdio = stdio

    def data_received(self, data: bytes) -> None:
        pass  # nothing is expected; nothing it sends is a message of the session

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.stdio.ended(exc)
