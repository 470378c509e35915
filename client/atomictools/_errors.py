"""The exceptions atomictools raises, in one place.

``ToolError`` is for tool authors: raise it inside a tool and the caller gets a result with
``isError: true`` carrying your message, with no traceback. ``AskError`` is raised inside a tool by
``ctx.elicit`` and ``ctx.sample``. The others are raised by the client.
"""

from __future__ import annotations

from typing import Any

__all__ = ["AskError", "AtomicToolsError", "ConnectError", "RPCError", "ToolError"]


class AtomicToolsError(Exception):
    """Base class of every error atomictools raises on its own."""


class ToolError(AtomicToolsError):
    """Raised by a tool to report a failure the model should read and act on.

    The message becomes the text of a tool result with ``isError: true``.
    """


class AskError(ToolError):
    """``ctx.elicit`` or ``ctx.sample`` got no answer: the client did not declare the capability,
    answered with an error, did not answer within the timeout, or the call was cancelled.

    A ``ToolError``: uncaught, its message is what the model reads. Catch it to go on without the
    answer (``except AskError: ...``).
    """


class ConnectError(AtomicToolsError):
    """The daemon could not be reached (and could not be started, when autostart is on)."""


class RPCError(AtomicToolsError):
    """The daemon answered a request with a JSON-RPC error.

    Attributes:
        code: the JSON-RPC error code, e.g. ``-32602`` for an unknown tool.
        message: the daemon's message.
        data: the optional ``data`` member of the error.
    """

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(f"{message} (code {code})")
        self.code = code
        self.message = message
        self.data = data
