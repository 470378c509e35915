"""atomictools: write tools for atomictoolsd, and call them from any Python process.

Tool authors use ``tool``, ``Context``, ``Field`` and ``ToolError``, and return ``Image``, ``Audio``,
``Resource`` or ``ResourceLink`` for content that is not text; agent processes use ``Client``
and ``AsyncClient``. The names load lazily (PEP 562) so that a process needing one part, such as
the stdio shim that only needs the socket path, does not pay for importing the others. For the
same reason this module imports nothing at run time (``typing`` alone costs the shim ~5 ms).
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing

__version__ = "0.2.0"

__all__ = [
    "AskError",
    "AsyncClient",
    "AtomicToolsError",
    "Audio",
    "CallTimeout",
    "CannotConnect",
    "Client",
    "ConnectError",
    "ConnectionLost",
    "Context",
    "Elicitation",
    "Field",
    "Image",
    "ProtocolError",
    "RPCError",
    "Resource",
    "ResourceLink",
    "Sample",
    "ToolError",
    "ToolResult",
    "TransportError",
    "UnknownTool",
    "__version__",
    "tool",
]

_EXPORTS = {
    "AsyncClient": "atomictools._async_client",
    "Client": "atomictools._client",
    "ToolResult": "atomictools._base",
    "Context": "atomictools._authoring",
    "Field": "atomictools._authoring",
    "tool": "atomictools._authoring",
    "Audio": "atomictools._content",
    "Image": "atomictools._content",
    "Resource": "atomictools._content",
    "ResourceLink": "atomictools._content",
    "AskError": "atomictools._errors",
    "Elicitation": "atomictools._asking",
    "Sample": "atomictools._asking",
    "AtomicToolsError": "atomictools._errors",
    "ConnectError": "atomictools._errors",
    "RPCError": "atomictools._errors",
    "ToolError": "atomictools._errors",
    "CallTimeout": "atomictools._errors",
    "CannotConnect": "atomictools._errors",
    "ConnectionLost": "atomictools._errors",
    "ProtocolError": "atomictools._errors",
    "TransportError": "atomictools._errors",
    "UnknownTool": "atomictools._errors",
}

if TYPE_CHECKING:  # pragma: no cover - for type checkers and editors only
    from typing import Any

    from atomictools._asking import Elicitation, Sample
    from atomictools._async_client import AsyncClient
    from atomictools._authoring import Context, Field, tool
    from atomictools._base import ToolResult
    from atomictools._client import Client
    from atomictools._content import Audio, Image, Resource, ResourceLink
    from atomictools._errors import (
        AskError,
        AtomicToolsError,
        CallTimeout,
        CannotConnect,
        ConnectError,
        ConnectionLost,
        ProtocolError,
        RPCError,
        ToolError,
        TransportError,
        UnknownTool,
    )


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'atomictools' has no attribute {name!r}")
    import importlib  # lazy: this module imports nothing at run time (above)

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
