"""Protocol constants shared by the daemon, its workers and the client.

Standard library only: the stdio shim and the worker runtime import this module too.
"""

from __future__ import annotations

import re
from typing import Any, Literal, get_args

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
    "RENAMED",
    "SUPPORTED_PROTOCOL_VERSIONS",
    "check_tool_name",
    "read_renamed",
    "with_old_names",
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

# Keys of the daemon's own atomic/* results renamed in 0.2 so that they read as MCP's do (camelCase,
# one name per idea), by where they appear: {old: new}. Until 0.3 each result carries the old key
# beside the new one with the same value (``with_old_names``); docs/protocol.md#renamed lists them.
RENAMED: dict[str, dict[str, str]] = {
    "atomic/status": {"config_sources": "configSources", "config_file": "configFile"},
    "atomic/status modules[]": {
        "source": "definitionsFrom",  # worker or cache; "source" was also the scope in atomic/list
        "errors": "failedCalls",  # a count; "errors" is the list of load errors everywhere else
        "worker_state": "workerState",
        "last_error": "lastError",
        "retry_in": "retryIn",
        "p50_ms": "p50Ms",
        "p99_ms": "p99Ms",
        "load_ms": "loadMs",
        "blocked_reason": "blockedReason",
        "loading": "starting",  # a count of workers; "loading" is the list of modules whose import runs
    },
    "atomic/status watcher": {"debounce_ms": "debounceMs", "step_ms": "stepMs"},
    "atomic/status monitor": {
        "killed_for_memory": "killedForMemory",
        "reaped_idle": "reapedIdle",
        "stopped_over_max_idle": "stoppedOverMaxIdle",
    },
    "atomic/status service": {"watchdog_sec": "watchdogSec"},
    "atomic/status http, atomic/http/rotate": {"token_file": "tokenFile"},
    "atomic/status reload": {"config_error": "configError"},
    "atomic/status bridges[]": {"owner": "ownerPid"},  # as atomic/bridges/* name it
    "atomic/list tools[] and shadowed[], shadowedBy": {"source": "scope"},  # as errors[] and status name it
    "blocked[] of atomic/attach, atomic/list, atomic/reload": {"full_command": "fullCommand"},
}


def with_old_names(result: dict[str, Any], where: str) -> dict[str, Any]:
    """``result`` (changed in place) with the pre-0.2 name of each renamed key it has, as ``RENAMED``
    says for ``where``; returned for chaining."""
    for old, new in RENAMED[where].items():
        if new in result:
            result[old] = result[new]
    return result


_OLD_NAME: dict[str, dict[str, str]] = {where: {new: old for old, new in names.items()} for where, names in RENAMED.items()}


def read_renamed(result: dict[str, Any], new: str, where: str, default: Any = None) -> Any:
    """The value of the renamed key ``new`` of ``result`` (found ``where``, as ``RENAMED`` says),
    read under its old name from a daemon older than 0.2 (a CLI newer than the running daemon);
    ``default`` when it has neither."""
    if new in result:
        return result[new]
    return result.get(_OLD_NAME[where][new], default)
