"""What ``Client`` and ``AsyncClient`` share: everything but I/O.

Each method of the API is written once here as *steps*: a generator that yields the messages to
send (``Send``) and is sent back each request's result, or, for a method that is one request, a
plain function returning a ``One`` (method, params, what to make of the result): no generator and
no NamedTuple on the path of every call, which cost the tiny client ~1.5 µs a call. ``blocking(steps)`` makes it a method of
the synchronous ``Client`` (a blocking socket), ``awaited(steps)`` a coroutine method of
``AsyncClient``; each class only moves bytes (connect, send, read, close, watch). The request
building, the result handling and the error tree (``_errors``) are therefore the same for both.
"""

from __future__ import annotations

import functools
import itertools
import os
import time
import uuid
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, TypeVar

import msgspec

from atomictools._answering import OnElicit, OnSample, capabilities
from atomictools._errors import CallTimeout, CannotConnect, ProtocolError, ToolError, UnknownTool
from atomictools._paths import RuntimeDirError
from atomictools._paths import socket_path as default_socket_path
from atomictools._protocol import INVALID_PARAMS, LATEST_PROTOCOL_VERSION

__all__ = ["ClientBase", "OnProgress", "Send", "ToolFormat", "ToolResult", "awaited", "blocking", "convert_tools"]

ToolFormat = Literal["mcp", "openai", "anthropic"]
# on_progress(progress, total, message): what a tool reports with ctx.progress, as it comes.
OnProgress = Callable[[float, "float | None", "str | None"], Any]

encode = msgspec.json.encode
decode = msgspec.json.decode
LINE_LIMIT = 64 * 1024 * 1024  # a response larger than this is a bug, not a result
CONNECT_ERRORS = (FileNotFoundError, ConnectionRefusedError)  # nothing listens (yet)
CONNECT_WAIT = 20.0  # seconds a started daemon has to accept
LOST = "the daemon closed the connection"

T = TypeVar("T")


class Send(NamedTuple):
    """One message a step sends: a request (its result is sent back into the step) or a notification."""

    method: str
    params: dict[str, Any] | None = None
    notify: bool = False


# A method that is one request: (method, params, what makes the method's value of the result, or None).
One = tuple[str, "dict[str, Any] | None", "Callable[[Any], Any] | None"]
Steps = Generator[Send, Any, T] | One


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

    def raise_for_error(self) -> ToolResult:
        """Raise ``ToolError`` (its message the result's text, ``result`` this result) when the tool
        failed; else return this result, so that ``client.call(...).raise_for_error().text`` reads."""
        if self.is_error:
            raise ToolError(self.text or "the tool failed without a message", result=self)
        return self

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


def start_daemon(directory: str | None = None) -> None:
    """Start the daemon for a client attaching ``directory``: its files may be in neither that
    project nor the working directory's (``_paths.check_locations``)."""
    from atomictools._autostart import start_daemon  # lazy: imports subprocess; only needed here

    try:
        anchors = [os.getcwd()]
    except OSError:
        anchors = []
    start_daemon(anchors=[*anchors, directory] if directory else anchors)


class ClientBase:
    """The state and the rules of a connection to the daemon; ``Client`` and ``AsyncClient`` add I/O.

    Args:
        socket_path: the daemon's socket; by default ``ATOMICTOOLS_SOCKET`` or the runtime dir's.
        directory: the project directory whose tools to see (default: the current directory).
        autostart: start the daemon when none answers.
        timeout: seconds each request may take in all, from sending it to its answer (None waits as
            long as the call runs); notifications and questions meanwhile do not extend it. When it
            passes, the request is cancelled in the daemon and ``CallTimeout`` raised. A request the
            daemon does not even read within it closes the connection (``ConnectionLost``).
        agent: the name this client reports to the daemon (shown in status and in ``ctx.agent``).
        on_elicit: answers a tool's ``ctx.elicit``: called with the message and the requested
            schema, it returns the answer's content (a dict) to accept, None to decline, or an
            ``Elicitation``. With it the client declares the elicitation capability.
        on_sample: answers a tool's ``ctx.sample``: called with the ``sampling/createMessage``
            params, it returns the reply's text or a ``CreateMessageResult`` dict.
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
        self.declared: dict[str, Any] = {}  # the capabilities the last initialize declared
        self.progress_handlers: dict[str, OnProgress] = {}  # by progress token, while their calls run

    def _progress(self, message: dict[str, Any]) -> bool:
        """Give a ``notifications/progress`` to the handler of its call; False when none has it."""
        params = message.get("params") or {}
        handler = self.progress_handlers.get(params.get("progressToken"))  # type: ignore[arg-type]
        if handler is None:
            return False
        handler(params.get("progress", 0), params.get("total"), params.get("message"))
        return True

    # -- messages --------------------------------------------------------------------------------

    def _request_message(self, method: str, params: dict[str, Any] | None) -> tuple[int, dict[str, Any]]:
        request_id = next(self._ids)
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        return request_id, message

    @staticmethod
    def _notification(method: str, params: dict[str, Any] | None) -> dict[str, Any]:
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        return message

    def _timed_out(self, request_id: int, method: str) -> tuple[dict[str, Any], CallTimeout]:
        """The cancellation to send for a request whose answer did not come in time, and the error."""
        cancel = self._notification(
            "notifications/cancelled",
            {"requestId": request_id, "reason": f"the client waited {self.timeout:g} s"},
        )
        return cancel, CallTimeout(f"no answer to {method} within {self.timeout:g} s; the request was cancelled")

    @staticmethod
    def _result(method: str, reply: dict[str, Any]) -> Any:
        """A request's result, or the error the tree has for its JSON-RPC error."""
        error = reply.get("error")
        if error is None:
            return reply.get("result")
        code, message, data = error.get("code", 0), error.get("message", ""), error.get("data")
        if method == "tools/call" and code == INVALID_PARAMS and isinstance(data, dict) and "name" in data:
            raise UnknownTool(code, message, data)  # the daemon's unknown tool: data {name, suggestions|loadError}
        raise ProtocolError(code, message, data)

    def _refused(self, exc: OSError, started: bool, deadline: float) -> bool:
        """After a refused connect: True to start the daemon now, False to wait and try again;
        raises ``CannotConnect`` when neither will help."""
        if not self.autostart:
            raise CannotConnect(
                f"no daemon is listening on {self.socket_path}; start one with `atomictoolsd start`"
            ) from exc
        if started and time.monotonic() > deadline:
            raise CannotConnect(f"the daemon started but {self.socket_path} does not accept") from exc
        return not started

    def _attach_params(self) -> dict[str, Any]:
        return {"directory": self.directory, "agent": self.agent, "sessionId": self.session_id}


def _default_socket_path() -> str:
    """The daemon's socket by the one rule of ``_paths``; a refused runtime dir is ``CannotConnect``."""
    try:
        return default_socket_path()
    except RuntimeDirError as exc:
        raise CannotConnect(str(exc)) from None


# -- the API, once, as steps ---------------------------------------------------------------------


def initialize(client: ClientBase, protocol_version: str = LATEST_PROTOCOL_VERSION) -> Steps[dict[str, Any]]:
    """Run MCP's initialize handshake (optional here: the daemon serves tools without it)."""
    declared = capabilities(client.on_elicit, client.on_sample)
    result = yield Send(
        "initialize",
        {
            "protocolVersion": protocol_version,
            "capabilities": declared,
            "clientInfo": {"name": f"atomictools-{client.agent}", "version": "0"},
        },
    )
    client.declared = declared
    yield Send("notifications/initialized", notify=True)
    return result


def attach(client: ClientBase, directory: str) -> Steps[dict[str, Any]]:
    """Move this session to another project directory."""
    client.directory = os.path.abspath(directory)
    return ("atomic/attach", client._attach_params(), None)


def list_tools(
    client: ClientBase, directory: str | None = None, format: ToolFormat = "mcp"
) -> Steps[list[dict[str, Any]]]:
    """The tools visible from ``directory`` (default: the attached one), in ``format``."""
    if directory is not None and os.path.abspath(directory) != client.directory:
        yield Send("atomic/attach", attach(client, directory)[1])
    tools: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        result = yield Send("tools/list", {"cursor": cursor} if cursor else {})
        tools.extend(result["tools"])
        cursor = result.get("nextCursor")
        if not cursor:
            return convert_tools(tools, format)


def call_tool(
    client: ClientBase, name: str, arguments: dict[str, Any] | None = None, *, timeout: float | None = None,
    on_progress: OnProgress | None = None, on_elicit: OnElicit | None = None,
) -> Steps[ToolResult]:
    """Call a tool. A failure inside the tool is a result with ``is_error`` (``raise_for_error()``
    raises it); a tool this session cannot call raises ``UnknownTool``.

    Args:
        timeout: seconds the daemon lets this call run (capped by its configured maximum).
        on_progress: called with ``(progress, total, message)`` for each progress the tool reports
            (``ctx.progress``) while this call runs.
        on_elicit: answers what the tool asks (``ctx.elicit``) while this call runs, in place of the
            client's own ``on_elicit``; the client declares the elicitation capability for it first
            when it has not yet. One handler at a time: calls made at once with different handlers
            on one ``AsyncClient`` share the last one given.
    """
    params: dict[str, Any] = {"name": name, "arguments": arguments or {}}
    if timeout is not None:
        params["_meta"] = {"atomic/timeout": timeout}
    if on_progress is None and on_elicit is None:
        return ("tools/call", params, ToolResult.from_mcp)
    return _call_with_handlers(client, params, on_progress, on_elicit)


def _call_with_handlers(
    client: ClientBase, params: dict[str, Any], on_progress: OnProgress | None, on_elicit: OnElicit | None
) -> Generator[Send, Any, ToolResult]:
    token = uuid.uuid4().hex
    if on_progress is not None:
        params.setdefault("_meta", {})["progressToken"] = token
        client.progress_handlers[token] = on_progress
    own = client.on_elicit
    try:
        if on_elicit is not None:
            client.on_elicit = on_elicit
            if "elicitation" not in client.declared:
                yield from initialize(client)  # type: ignore[misc]
        result = yield Send("tools/call", params)
    finally:
        client.progress_handlers.pop(token, None)
        client.on_elicit = own
    return ToolResult.from_mcp(result)


def call(
    client: ClientBase, name: str, /, *, on_progress: OnProgress | None = None, on_elicit: OnElicit | None = None,
    **arguments: Any,
) -> Steps[ToolResult]:
    """Call a tool with keyword arguments; see ``call_tool`` for a dict of arguments (and for a
    tool with an argument named ``on_progress`` or ``on_elicit``, which are this method's own)."""
    return call_tool(client, name, arguments, on_progress=on_progress, on_elicit=on_elicit)


def status(client: ClientBase) -> Steps[dict[str, Any]]:
    """The daemon's status: pid, version, projects, modules, workers, errors (docs/protocol.md)."""
    return ("atomic/status", None, None)


def reload(client: ClientBase, module: str | None = None, force: bool = False) -> Steps[dict[str, Any]]:
    """Rescan the tools of the attached project (with ``force``, load every module again, changed or
    not), or load only ``module`` again (a module's path, its file's name or stem, or a tool it
    defines): ``{success, toolCount, errors}``."""
    params = {k: v for k, v in (("module", module), ("force", force)) if v}
    return ("atomic/reload", params or None, None)


def blocking(steps: Callable[..., Steps[T]]) -> Callable[..., T]:
    """``steps`` as a method of the synchronous ``Client``."""

    @functools.wraps(steps)
    def method(self: Any, *args: Any, **kwargs: Any) -> T:
        run = steps(self, *args, **kwargs)
        if type(run) is tuple:  # One request
            method, params, then = run
            return self.request(method, params) if then is None else then(self.request(method, params))
        answer = None
        try:
            while True:
                send = run.send(answer)
                if send.notify:
                    self.notify(send.method, send.params)
                    answer = None
                else:
                    answer = self.request(send.method, send.params)
        except StopIteration as done:
            return done.value

    return method


def awaited(steps: Callable[..., Steps[T]]) -> Callable[..., Any]:
    """``steps`` as a coroutine method of ``AsyncClient``."""

    @functools.wraps(steps)
    async def method(self: Any, *args: Any, **kwargs: Any) -> T:
        run = steps(self, *args, **kwargs)
        if type(run) is tuple:  # One request
            method, params, then = run
            result = await self.request(method, params)
            return result if then is None else then(result)
        answer = None
        try:
            while True:
                send = run.send(answer)
                if send.notify:
                    await self.notify(send.method, send.params)
                    answer = None
                else:
                    answer = await self.request(send.method, send.params)
        except StopIteration as done:
            return done.value

    return method
