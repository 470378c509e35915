"""Protocol constants shared by the daemon, its workers and the client.

Standard library only: the stdio shim and the worker runtime import this module too.
"""

from __future__ import annotations

import re
from typing import Literal, get_args

__all__ = [
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    "INVALID_REQUEST",
    "LATEST_PROTOCOL_VERSION",
    "LOG_LEVELS",
    "LogLevel",
    "METHOD_NOT_FOUND",
    "NAME_PATTERN",
    "PARSE_ERROR",
    "SUPPORTED_PROTOCOL_VERSIONS",
    "check_tool_name",
]

# JSON-RPC 2.0 error codes (MCP uses the same).
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603

# MCP revisions served with the initialize handshake, oldest first (what each adds:
# atomictoolsd/sessions/revisions.py).
SUPPORTED_PROTOCOL_VERSIONS: tuple[str, ...] = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
LATEST_PROTOCOL_VERSION = SUPPORTED_PROTOCOL_VERSIONS[-1]

# MCP's logging levels (logging/setLevel, notifications/message, ctx.log): the syslog severities,
# least severe first. The daemon's own log uses Python logging's (atomictoolsd.config.levels).
LogLevel = Literal["debug", "info", "notice", "warning", "error", "critical", "alert", "emergency"]
LOG_LEVELS: tuple[LogLevel, ...] = get_args(LogLevel)

# Stricter than MCP allows: Claude, Copilot and Codex reject dots and names over 64 characters, and
# the Gemini API wants a function name to start with a letter or "_".
NAME_PATTERN = re.compile(r"[a-zA-Z_][a-zA-Z0-9_-]{0,63}")  # whole name: use fullmatch ("$" lets "x\n" through)


def check_tool_name(name: str) -> str | None:
    """Return why ``name`` is not a valid tool name, or None when it is."""
    if NAME_PATTERN.fullmatch(name):
        return None
    if not name:
        return "tool name is empty"
    if len(name) > 64:
        return f"tool name {name!r} is {len(name)} characters long; the limit is 64"
    if not (name[0].isascii() and (name[0].isalpha() or name[0] == "_")):
        return f"tool name {name!r} must start with a letter or '_' (the Gemini API refuses others)"
    return f"tool name {name!r} may contain only letters, digits, '_' and '-'"

# The key of a tool definition that carries its input schema as the author wrote it (JSON Schema
# 2020-12 with $defs/$ref), beside the portable one in ``inputSchema``; never sent as such to a client.
WRITTEN_SCHEMA = "atomic/writtenInputSchema"
