"""The dispatcher meta-tools, for agents that ignore ``notifications/tools/list_changed``.

Codex never re-lists tools during a session, and Claude Code often does not. A session attached with
``dispatcher: true`` (``atomictoolsd mcp --dispatcher``) is also offered two tools whose definitions
never change: ``atomic_list_tools`` returns the tools the session can use right now, with their
schemas, and ``atomic_call_tool`` calls any of them by name. The inner call goes through the
session's ordinary call path, so its arguments are validated as usual, the allow/deny globs apply,
and ``_meta`` (progress token, timeout) and ``notifications/cancelled`` for the outer request reach
it unchanged.

This lives in the daemon, not in the shim: the shim stays a byte relay that parses nothing (JSON
parsing would cost it start-up time and per-message work), and every socket client gets the same
dispatcher, with cancellation and progress keyed by the very request the agent sent.

Must never: hold state of its own (the session owns everything), or let the meta-tools bypass the
session's allow/deny rules.
"""

from __future__ import annotations

import fnmatch
from typing import TYPE_CHECKING, Any, Protocol

import msgspec
from msgspec import UNSET, UnsetType

from atomictoolsd.protocol import error_result

if TYPE_CHECKING:
    from atomictoolsd.registry.model import Project, ToolDef

__all__ = ["CALL_TOOL", "LIST_TOOL", "META_NAMES", "META_TOOLS", "MetaTool", "handle"]

LIST_TOOL = "atomic_list_tools"
CALL_TOOL = "atomic_call_tool"
META_NAMES = frozenset({LIST_TOOL, CALL_TOOL})

_encode = msgspec.json.encode


class MetaTool:
    """A meta-tool's definition, shaped like a ``ToolDef`` for listing (``name``, ``definition``, ``encoded``)."""

    __slots__ = ("definition", "encoded", "name")

    def __init__(self, definition: dict[str, Any]) -> None:
        self.name: str = definition["name"]
        self.definition = definition
        self.encoded = _encode(definition)


META_TOOLS = (
    MetaTool({
        "name": LIST_TOOL,
        "title": "List the current tools",
        "description": (
            "List the tools this server offers right now, with their input schemas. Tools appear and "
            "disappear as their files change, so call this when a tool you expect is missing, then "
            f"call the tool through {CALL_TOOL}."
        ),
        "inputSchema": {
            "type": "object",
            "properties": {
                "pattern": {
                    "type": "string",
                    "description": "Only tools whose name matches this glob (for example 'git*').",
                    "default": "*",
                },
            },
            "additionalProperties": False,
        },
        "outputSchema": {
            "type": "object",
            "properties": {"tools": {"type": "array", "items": {"type": "object"}}},
            "required": ["tools"],
        },
        "annotations": {"readOnlyHint": True, "idempotentHint": True, "openWorldHint": False},
    }),
    MetaTool({
        "name": CALL_TOOL,
        "title": "Call a current tool by name",
        "description": (
            f"Call any tool listed by {LIST_TOOL}, by name, with its arguments. Use it for tools "
            "that were added after this session started; the arguments are validated against the "
            "tool's input schema as usual."
        ),
        "inputSchema": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "description": f"The tool's name, as {LIST_TOOL} gives it."},
                "arguments": {
                    "type": "object",
                    "description": "The tool's arguments, matching its inputSchema.",
                    "default": {},
                },
            },
            "required": ["name"],
            "additionalProperties": False,
        },
    }),
)


class _ListArgs(msgspec.Struct, forbid_unknown_fields=True):
    pattern: str = "*"


class _CallArgs(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    arguments: msgspec.Raw | UnsetType = UNSET


_decode_list = msgspec.json.Decoder(_ListArgs).decode
_decode_call = msgspec.json.Decoder(_CallArgs).decode


class MetaSession(Protocol):
    """What the meta-tools use of the session they are called in (``session.Session``, which imports
    this module)."""

    project: Project

    def visible(self) -> list[ToolDef]: ...

    def allowed(self, name: str) -> bool: ...

    def send_result(self, id_json: bytes, result: bytes) -> None: ...


def handle(session: MetaSession, id_json: bytes, name: str, arguments: bytes) -> tuple[str, bytes] | None:
    """Serve a call to a meta-tool.

    Returns:
        None when the call has been answered here; for ``atomic_call_tool`` with a tool the session
        may call, ``(tool name, raw arguments)`` for the session to dispatch as an ordinary call.
    """
    if name == LIST_TOOL:
        try:
            pattern = _decode_list(arguments).pattern
        except (msgspec.ValidationError, msgspec.DecodeError, RecursionError) as exc:
            session.send_result(id_json, error_result(f"Invalid arguments for {LIST_TOOL}: {exc}"))
            return None
        tools = [t.definition for t in session.visible() if fnmatch.fnmatchcase(t.name, pattern)]
        listing: dict[str, Any] = {"tools": tools}
        loading = session.project.view().loading
        if loading:  # their tools are listed once they have loaded
            listing["loading"] = loading
        text = _encode(listing).decode()
        session.send_result(
            id_json, _encode({"content": [{"type": "text", "text": text}], "structuredContent": listing})
        )
        return None
    try:
        call = _decode_call(arguments)
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError) as exc:
        session.send_result(id_json, error_result(f"Invalid arguments for {CALL_TOOL}: {exc}"))
        return None
    inner = bytes(call.arguments) if call.arguments is not UNSET else b"{}"
    if inner.strip() == b"null":
        inner = b"{}"
    elif not inner.lstrip().startswith(b"{"):
        session.send_result(
            id_json, error_result(f"Invalid arguments for {CALL_TOOL}: Expected `object` - at `$.arguments`")
        )
        return None
    tool = session.project.view().tools.get(call.name)
    if tool is None and session.project.loads_under_way():
        return call.name, inner  # the session's call path waits for the modules still loading
    if tool is None or not session.allowed(call.name):
        reason = "is not allowed in this session" if tool is not None else "does not exist"
        session.send_result(
            id_json, error_result(f"Tool {call.name!r} {reason}; call {LIST_TOOL} to see the current tools")
        )
        return None
    return call.name, inner
