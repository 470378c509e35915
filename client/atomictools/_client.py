"""The tiny client: fetch the current toolset and call tools from any Python process.

``Client`` is synchronous (a blocking Unix socket); ``AsyncClient`` (in ``_async_client``) is its
asyncio twin with the same methods and arguments. Both speak the daemon's NDJSON JSON-RPC, attach to a project directory,
and start the daemon when none answers (unless ``autostart=False``).
"""

from __future__ import annotations

import itertools
import os
import select
import socket
import time
import uuid
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from atomictools._answering import OnElicit, OnSample, answer, capabilities, response
from atomictools._errors import ConnectError, RPCError
from atomictools._paths import RuntimeDirError
from atomictools._paths import socket_path as default_socket_path
from atomictools._protocol import LATEST_PROTOCOL_VERSION

__all__ = ["Client", "ToolFormat", "ToolResult", "convert_tools"]

ToolFormat = Literal["mcp", "openai", "anthropic"]

_encode = msgspec.json.encode
_decode = msgspec.json.decode
_LINE_LIMIT = 64 * 1024 * 1024  # a response larger than this is a bug, not a result
# Below glibc's mmap threshold (128 KiB): a larger recv buffer is mapped and unmapped on every
# read, which cost ~35 µs a call here (bench/calls.py: tiny client 117 µs against 80 µs raw).
_CHUNK = 64 * 1024
_CONNECT_ERRORS = (FileNotFoundError, ConnectionRefusedError)


def _default_socket_path() -> str:
    """The daemon's socket by the one rule of ``_paths``; a refused runtime dir is a ``ConnectError``."""
    try:
        return default_socket_path()
    except RuntimeDirError as exc:
        raise ConnectError(str(exc)) from None


@dataclass
class ToolResult:
    """The result of a tool call.

    Attributes:
        content: the MCP content blocks (``[{"type": "text", "text": …}, {"type": "image", …}, …]``);
            ``blocks(kind)`` picks those of one type.
        structured: the ``structuredContent`` when the tool declares an output schema, else None.
        is_error: True when the tool failed (bad arguments, an exception, a timeout, a crash).
        meta: the result's ``_meta`` (e.g. ``atomic/fullOutput`` when the output was truncated).
    """

    content: list[dict[str, Any]]
    structured: Any = None
    is_error: bool = False
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def text(self) -> str:
        """The text blocks joined with newlines."""
        return "\n".join(b.get("text", "") for b in self.content if b.get("type") == "text")

    def blocks(self, kind: str) -> list[dict[str, Any]]:
        """The content blocks of one type: ``"image"``, ``"audio"``, ``"resource"``, ``"resource_link"``
        or ``"text"`` (an image's or audio's bytes are ``base64.b64decode(block["data"])``)."""
        return [b for b in self.content if b.get("type") == kind]

    @classmethod
    def from_mcp(cls, result: dict[str, Any]) -> ToolResult:
        return cls(
            content=result.get("content", []),
            structured=result.get("structuredContent"),
            is_error=bool(result.get("isError", False)),
            meta=result.get("_meta", {}),
        )


def convert_tools(tools: list[dict[str, Any]], format: ToolFormat) -> list[dict[str, Any]]:
    """Express MCP tool definitions in the shape an LLM API expects.

    ``mcp`` returns them as they are; ``openai`` as Chat Completions function tools; ``anthropic`` as
    Messages API tools.
    """
    if format == "mcp":
        return tools
    if format == "openai":
        return [
            {
                "type": "function",
                "function": {
                    "name": t["name"],
                    "description": t.get("description", ""),
                    "parameters": t["inputSchema"],
                },
            }
            for t in tools
        ]
    if format == "anthropic":
        return [
            {"name": t["name"], "description": t.get("description", ""), "input_schema": t["inputSchema"]}
            for t in tools
        ]
    raise ValueError(f"format must be 'mcp', 'openai' or 'anthropic', not {format!r}")


def _attach_params(directory: str | None, agent: str, session_id: str) -> dict[str, Any]:
    return {
        "directory": os.path.abspath(directory or os.getcwd()),
        "agent": agent,
        "sessionId": session_id,
    }


def _result_or_raise(message: dict[str, Any]) -> Any:
    error = message.get("error")
    if error is not None:
        raise RPCError(error.get("code", 0), error.get("message", ""), error.get("data"))
    return message.get("result")


def _start_daemon() -> None:
    from atomictools._autostart import start_daemon  # imports subprocess; only needed here

    start_daemon()


class Client:
    """A synchronous connection to the daemon.

    Args:
        socket_path: the daemon's socket; by default ``ATOMICTOOLS_SOCKET`` or the runtime dir's.
        directory: the project directory whose tools to see (default: the current directory).
        autostart: start the daemon when none answers.
        timeout: seconds to wait for any one answer (None waits as long as the call runs).
        agent: the name this client reports to the daemon (shown in status and in ``ctx.agent``).
        on_elicit: answers a tool's ``ctx.elicit``: called with the message and the requested
            schema, it returns the answer's content (a dict) to accept, None to decline, or an
            ``Elicitation``. With it the client declares the elicitation capability.
        on_sample: answers a tool's ``ctx.sample``: called with the ``sampling/createMessage``
            params, it returns the reply's text or a ``CreateMessageResult`` dict.

    Example:
        >>> with Client() as c:                                   # doctest: +SKIP
        ...     print(c.call("lint", path="a.py").text)
    """

    def __init__(
        self,
        socket_path: str | None = None,
        *,
        directory: str | None = None,
        autostart: bool = True,
        timeout: float | None = None,
        agent: str = "python",
        on_elicit: OnElicit | None = None,
        on_sample: OnSample | None = None,
    ) -> None:
        self.socket_path = socket_path or _default_socket_path()
        self.on_elicit = on_elicit
        self.on_sample = on_sample
        self.directory = os.path.abspath(directory or os.getcwd())
        self.autostart = autostart
        self.timeout = timeout
        self.agent = agent
        self.session_id = uuid.uuid4().hex
        self._ids = itertools.count(1)
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
        self.request("atomic/attach", _attach_params(self.directory, self.agent, self.session_id))
        if self.on_elicit is not None or self.on_sample is not None:
            self.initialize()  # declares what the callbacks answer: tools may then ask
        return self

    def _open(self) -> socket.socket:
        delay = 0.005
        started = False
        deadline = time.monotonic() + 20
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(self.socket_path)
                return sock
            except _CONNECT_ERRORS as exc:
                sock.close()
                if not self.autostart:
                    raise ConnectError(
                        f"no daemon is listening on {self.socket_path}; start one with `atomictoolsd start`"
                    ) from exc
                if not started:
                    _start_daemon()
                    started = True
                elif time.monotonic() > deadline:
                    raise ConnectError(f"the daemon started but {self.socket_path} does not accept") from exc
                time.sleep(delay)
                delay = min(delay * 2, 0.25)
            except OSError as exc:
                sock.close()
                raise ConnectError(f"cannot connect to {self.socket_path}: {exc}") from exc

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

    # -- protocol --------------------------------------------------------------------------------

    def _send(self, message: dict[str, Any]) -> None:
        if self._sock is None:
            self.connect()
        assert self._sock is not None
        try:
            self._sock.sendall(_encode(message) + b"\n")
        except (BrokenPipeError, ConnectionResetError) as exc:
            self.close()
            raise ConnectError("the daemon closed the connection") from exc

    def _read(self, timeout: float | None) -> dict[str, Any] | None:
        """The next message from the daemon, or None when ``timeout`` seconds (None: no limit) pass
        without a whole one; the connection stays usable either way.

        Raises:
            ConnectError: the daemon closed the connection (this client is then closed; the next
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
                return _decode(line)
            searched = len(buffer)
            if searched > _LINE_LIMIT:
                self.close()
                raise ConnectError(f"the daemon sent a message over {_LINE_LIMIT} bytes; the connection was closed")
            if deadline is not None:
                ready, _, _ = select.select([self._sock], [], [], max(0.0, deadline - time.monotonic()))
                if not ready:
                    return None
            try:
                chunk = self._sock.recv(_CHUNK)
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                self.close()
                raise ConnectError("the daemon closed the connection")
            buffer += chunk

    def request(self, method: str, params: dict[str, Any] | None = None) -> Any:
        """Send one JSON-RPC request and return its result; raises ``RPCError`` for an error answer."""
        if self._sock is None:
            self.connect()
        request_id = next(self._ids)
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        self._send(message)
        while True:
            reply = self._read(self.timeout)
            if reply is None:
                raise TimeoutError(f"no answer to {method} within {self.timeout:g} s")
            if reply.get("id") == request_id and "method" not in reply:
                return _result_or_raise(reply)
            if "method" in reply and "id" in reply:
                self._answer(reply)  # a tool asks, while its call is in flight
            elif "method" in reply:
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
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        self._send(message)

    # -- the API ---------------------------------------------------------------------------------

    def initialize(self, protocol_version: str = LATEST_PROTOCOL_VERSION) -> dict[str, Any]:
        """Run MCP's initialize handshake (optional here: the daemon serves tools without it)."""
        result = self.request(
            "initialize",
            {
                "protocolVersion": protocol_version,
                "capabilities": capabilities(self.on_elicit, self.on_sample),
                "clientInfo": {"name": f"atomictools-{self.agent}", "version": "0"},
            },
        )
        self.notify("notifications/initialized")
        return result

    def attach(self, directory: str) -> dict[str, Any]:
        """Move this session to another project directory."""
        self.directory = os.path.abspath(directory)
        return self.request("atomic/attach", _attach_params(self.directory, self.agent, self.session_id))

    def list_tools(self, directory: str | None = None, format: ToolFormat = "mcp") -> list[dict[str, Any]]:
        """The tools visible from ``directory`` (default: the attached one), in ``format``."""
        if directory is not None and os.path.abspath(directory) != self.directory:
            self.attach(directory)
        tools: list[dict[str, Any]] = []
        cursor: str | None = None
        while True:
            result = self.request("tools/list", {"cursor": cursor} if cursor else {})
            tools.extend(result["tools"])
            cursor = result.get("nextCursor")
            if not cursor:
                return convert_tools(tools, format)

    def call(self, name: str, /, **arguments: Any) -> ToolResult:
        """Call a tool with keyword arguments; see ``call_tool`` for a dict of arguments."""
        return self.call_tool(name, arguments)

    def call_tool(
        self, name: str, arguments: dict[str, Any] | None = None, *, timeout: float | None = None
    ) -> ToolResult:
        """Call a tool. A failure inside the tool is a result with ``is_error``; an unknown tool raises.

        Args:
            timeout: seconds the daemon lets this call run (capped by its configured maximum).
        """
        params: dict[str, Any] = {"name": name, "arguments": arguments or {}}
        if timeout is not None:
            params["_meta"] = {"atomic/timeout": timeout}
        return ToolResult.from_mcp(self.request("tools/call", params))

    def status(self) -> dict[str, Any]:
        """The daemon's status: pid, version, projects, modules, workers, errors."""
        return self.request("atomic/status")

    def reload(self) -> dict[str, Any]:
        """Rescan the tools of the attached project: ``{success, toolCount, errors}``."""
        return self.request("atomic/reload")

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
