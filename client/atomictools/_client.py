"""The tiny client: fetch the current toolset and call tools from any Python process.

``Client`` is synchronous (a blocking Unix socket); ``AsyncClient`` (in ``_async_client``) is its
asyncio twin with the same methods and arguments. Both speak the daemon's NDJSON JSON-RPC, attach to
a project directory, and start the daemon when none answers (unless ``autostart=False``). What they
say and how they read the answers is written once, in ``_base``; this module only moves bytes.
"""

from __future__ import annotations

import select
import socket
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

from atomictools import _base
from atomictools._answering import answer, response
from atomictools._base import (
    CONNECT_ERRORS,
    CONNECT_WAIT,
    LINE_LIMIT,
    LOST,
    ClientBase,
    ToolFormat,
    ToolResult,
    blocking,
    convert_tools,
    decode,
    encode,
)
from atomictools._errors import CannotConnect, ConnectionLost

__all__ = ["Client", "ToolFormat", "ToolResult", "convert_tools"]

# Below glibc's mmap threshold (128 KiB): a larger recv buffer is mapped and unmapped on every
# read, which cost ~35 µs a call here (bench/calls.py: tiny client 117 µs against 80 µs raw).
_CHUNK = 64 * 1024


class Client(ClientBase):
    """A synchronous connection to the daemon; the arguments are ``ClientBase``'s.

    Example:
        >>> with Client() as c:                                   # doctest: +SKIP
        ...     print(c.call("lint", path="a.py").text)
    """

    __doc__ = f"{__doc__}\n{ClientBase.__doc__}"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._sock: socket.socket | None = None
        # Our own line buffer, not sock.makefile(): a file object that once timed out refuses every
        # later read, and select() on the socket cannot see what such a file has buffered.
        self._buffer = bytearray()
        self._notifications: deque[dict[str, Any]] = deque()

    # -- connection ------------------------------------------------------------------------------

    def connect(self) -> Client:
        """Connect (starting the daemon if allowed and needed) and attach to ``directory``."""
        if self._sock is not None:
            return self
        sock = self._open()
        sock.settimeout(self.timeout)
        self._sock = sock
        self._buffer.clear()
        self.request("atomic/attach", self._attach_params())
        if self.on_elicit is not None or self.on_sample is not None:
            self.initialize()  # declares what the callbacks answer: tools may then ask
        return self

    def _open(self) -> socket.socket:
        delay = 0.005
        started = False
        deadline = time.monotonic() + CONNECT_WAIT
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(self.socket_path)
                return sock
            except CONNECT_ERRORS as exc:
                sock.close()
                if self._refused(exc, started, deadline):
                    _base.start_daemon(self.directory)
                    started = True
                time.sleep(delay)
                delay = min(delay * 2, 0.25)
            except OSError as exc:
                sock.close()
                raise CannotConnect(f"cannot connect to {self.socket_path}: {exc}") from exc

    def close(self) -> None:
        """Close the connection. Calls still running in the daemon are cancelled."""
        self._buffer.clear()
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def __enter__(self) -> Client:
        return self.connect()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- I/O -------------------------------------------------------------------------------------

    def _send(self, message: dict[str, Any]) -> None:
        if self._sock is None:
            self.connect()
        assert self._sock is not None
        try:
            self._sock.sendall(encode(message) + b"\n")
        except (BrokenPipeError, ConnectionResetError) as exc:
            self.close()
            raise ConnectionLost(LOST) from exc
        except TimeoutError as exc:  # the socket's timeout: the daemon stopped reading
            # Part of the line may have gone: whatever is sent next would be read as its rest.
            self.close()
            raise ConnectionLost(
                f"the daemon did not take the request within {self.timeout:g} s; the connection was closed"
            ) from exc

    def _read(self, timeout: float | None) -> dict[str, Any] | None:
        """The next message from the daemon, or None when ``timeout`` seconds (None: no limit) pass
        without a whole one; the connection stays usable either way.

        Raises:
            ConnectionLost: the daemon closed the connection (this client is then closed; the next
                request connects again).
        """
        assert self._sock is not None
        buffer = self._buffer
        deadline = None if timeout is None else time.monotonic() + timeout
        searched = 0
        while True:
            newline = buffer.find(b"\n", searched)
            if newline >= 0:
                line = bytes(buffer[: newline + 1])
                del buffer[: newline + 1]
                return decode(line)
            searched = len(buffer)
            if searched > LINE_LIMIT:
                self.close()
                raise ConnectionLost(f"the daemon sent a message over {LINE_LIMIT} bytes; the connection was closed")
            if deadline is not None:
                ready, _, _ = select.select([self._sock], [], [], max(0.0, deadline - time.monotonic()))
                if not ready:
                    return None
            try:
                chunk = self._sock.recv(_CHUNK)
            except ConnectionResetError:
                chunk = b""
            except TimeoutError:  # the socket's timeout (for sendall) while watch() waits unbounded
                continue
            if not chunk:
                self.close()
                raise ConnectionLost(LOST)
            buffer += chunk

    def request(self, method: str, params: dict[str, Any] | None = None) -> Any:
        """Send one JSON-RPC request and return its result; raises as ``_errors`` draws."""
        if self._sock is None:
            self.connect()
        request_id, message = self._request_message(method, params)
        # One deadline for the whole request: a tool that logs or reports progress more often than
        # the timeout must still time out, as with AsyncClient.
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        self._send(message)
        while True:
            reply = self._read(None if deadline is None else deadline - time.monotonic())
            if reply is None:
                cancel, error = self._timed_out(request_id, method)
                self._send(cancel)  # a late answer is then never sent; one already on its way is skipped below
                raise error
            if reply.get("id") == request_id and "method" not in reply:
                return self._result(method, reply)
            if "method" in reply and "id" in reply:
                self._answer(reply)  # a tool asks, while its call is in flight
            elif "method" in reply and not (reply["method"] == "notifications/progress" and self._progress(reply)):
                self._notifications.append(reply)

    def _answer(self, message: dict[str, Any]) -> None:
        callback, args = answer(message, self.on_elicit, self.on_sample)
        try:
            reply = response(message, callback(*args)) if callback is not None else response(message)
        except Exception as exc:  # noqa: BLE001 - the tool gets the callback's failure as its AskError
            reply = response(message, error=exc)
        self._send(reply)

    def notify(self, method: str, params: dict[str, Any] | None = None) -> None:
        """Send a JSON-RPC notification (no answer)."""
        self._send(self._notification(method, params))

    # -- the API (written once in _base) ---------------------------------------------------------

    initialize = blocking(_base.initialize)
    attach = blocking(_base.attach)
    list_tools = blocking(_base.list_tools)
    call = blocking(_base.call)
    call_tool = blocking(_base.call_tool)
    status = blocking(_base.status)
    reload = blocking(_base.reload)

    def watch(self, timeout: float | None = None) -> Iterator[dict[str, Any]]:
        """Yield the daemon's notifications (``notifications/tools/list_changed``, logs) as they come.

        The client stays usable after the watch ends (by its timeout, or when you stop iterating).

        Args:
            timeout: stop after this many seconds without a notification (None: wait forever).
        """
        self.request("atomic/subscribe")
        while True:
            while self._notifications:
                yield self._notifications.popleft()
            message = self._read(timeout)
            if message is None:
                return
            if "method" in message:
                yield message
