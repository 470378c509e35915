"""The exceptions atomictools raises, in one place.

::

    AtomicToolsError                 every error atomictools raises on its own
    ├── ToolError                    a tool failed: raised inside a tool by its author, or by
    │   │                            ToolResult.raise_for_error() for a result with is_error
    │   └── AskError                 ctx.elicit / ctx.sample got no answer (inside a tool)
    ├── TransportError               the daemon could not be reached or stopped answering
    │   ├── CannotConnect            nothing listens on the socket (and it could not be started)
    │   ├── ConnectionLost           the daemon closed the connection (the next request connects again)
    │   └── CallTimeout              no answer within the client's timeout; the request was
    │                                cancelled in the daemon (also a TimeoutError)
    └── ProtocolError                the daemon answered with a JSON-RPC error (code, message, data)
        └── UnknownTool              tools/call of a tool this session cannot call (name,
                                     suggestions, load_error)

A failure *inside* a tool (bad argument values, an exception, a timeout, a crash) is not raised by
the client: it is a ``ToolResult`` with ``is_error``, and ``raise_for_error()`` turns it into a
``ToolError`` when raising suits the caller better.

``ConnectError`` and ``RPCError`` are the names ``TransportError`` and ``ProtocolError`` had before
0.2 (a lost connection was a ``ConnectError`` already); they stay importable as aliases.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AskError",
    "AtomicToolsError",
    "CallTimeout",
    "CannotConnect",
    "ConnectError",
    "ConnectionLost",
    "ProtocolError",
    "RPCError",
    "ToolError",
    "TransportError",
    "UnknownTool",
]


class AtomicToolsError(Exception):
    """Base class of every error atomictools raises on its own."""


class ToolError(AtomicToolsError):
    """Raised by a tool to report a failure the model should read and act on.

    The message becomes the text of a tool result with ``isError: true``. On the calling side,
    ``ToolResult.raise_for_error()`` raises it with that text, and ``result`` is the ``ToolResult``.
    """

    def __init__(self, *args: object, result: Any = None) -> None:
        super().__init__(*args)
        self.result = result


class AskError(ToolError):
    """``ctx.elicit`` or ``ctx.sample`` got no answer: the client did not declare the capability,
    answered with an error, did not answer within the timeout, or the call was cancelled.

    A ``ToolError``: uncaught, its message is what the model reads. Catch it to go on without the
    answer (``except AskError: ...``).
    """


class TransportError(AtomicToolsError):
    """The daemon could not be reached, or the connection to it failed."""


class CannotConnect(TransportError):
    """Nothing listens on the daemon's socket (and it could not be started, when autostart is on),
    or the socket's directory is refused; the message says what to run."""


class ConnectionLost(TransportError):
    """The daemon closed the connection (it stopped, or restarted). This client is closed; its next
    request connects again."""


class CallTimeout(TransportError, TimeoutError):
    """No answer came within the client's ``timeout``. The client sent ``notifications/cancelled``
    for the request, so the daemon stops the call (the tool sees ``ctx.cancelled``) and never
    answers it; the connection stays usable."""


class ProtocolError(AtomicToolsError):
    """The daemon answered a request with a JSON-RPC error.

    Attributes:
        code: the JSON-RPC error code, e.g. ``-32602`` for bad params.
        message: the daemon's message.
        data: the optional ``data`` member of the error.
    """

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(f"{message} (code {code})")
        self.code = code
        self.message = message
        self.data = data


class UnknownTool(ProtocolError):
    """``tools/call`` named a tool this session cannot call.

    Attributes:
        name: the name asked for.
        suggestions: near names the session may call (``did you mean``), possibly empty.
        load_error: ``{file, line, message}`` when the name is that of a module that failed to load
            (or of a tool skipped in a JSON file), else None.
    """

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(code, message, data)
        data = data if isinstance(data, dict) else {}
        self.name: str = data.get("name", "")
        self.suggestions: list[str] = list(data.get("suggestions") or [])
        self.load_error: dict[str, Any] | None = data.get("loadError")


# The names of 0.1, kept so that code catching them goes on working.
ConnectError = TransportError
RPCError = ProtocolError
