"""The MCP revisions the daemon speaks, and what a client of each may be sent.

A session holds the revision its client chose at ``initialize`` (``Session.protocol_version``); the
parts of the daemon that write what a client reads ask here what that revision has, by comparing
revision strings (they are dates, so they order as text):

- tool definitions: ``annotations`` since 2025-03-26; ``title``, ``outputSchema`` and ``_meta`` since
  2025-06-18 (``registry.model.ToolDef.encoded_for`` drops the rest);
- call results: ``structuredContent`` and ``resource_link`` blocks since 2025-06-18, ``audio``
  since 2025-03-26 (``sessions.content.shape_result``);
- ``notifications/progress``: ``message`` since 2025-03-26;
- ``initialize``: ``serverInfo.title`` since 2025-06-18;
- asking the client: sampling since 2024-11-05, elicitation since 2025-06-18 (``sessions.asking``).

A client that names a revision the daemon does not speak gets the newest one, as the specification
says; it may then disconnect, but it is never sent a field its own revision lacks.
"""

from __future__ import annotations

from typing import Any

import msgspec

from atomictools._protocol import LATEST_PROTOCOL_VERSION, SUPPORTED_PROTOCOL_VERSIONS

__all__ = [
    "ALL", "STATELESS", "RequestMeta", "ListenParams", "with_result_type",
    "ANNOTATIONS_SINCE", "LATEST", "PROGRESS_MESSAGE_SINCE", "REVISIONS", "SERVER_TITLE_SINCE", "TOOL_FIELDS_SINCE",
    "negotiate", "tool_fields_dropped",
]

REVISIONS = SUPPORTED_PROTOCOL_VERSIONS  # through initialize
LATEST = LATEST_PROTOCOL_VERSION
STATELESS = ("2026-07-28",)  # no handshake: each request names its revision in _meta
ALL = (*REVISIONS, *STATELESS)

# The 2026-07-28 request _meta keys, and the error for a revision not spoken.
META_VERSION = "io.modelcontextprotocol/protocolVersion"
META_VERSION_BYTES = META_VERSION.encode()
META_CAPABILITIES = "io.modelcontextprotocol/clientCapabilities"
META_CLIENT = "io.modelcontextprotocol/clientInfo"
META_SERVER = "io.modelcontextprotocol/serverInfo"
SUBSCRIPTION_ID = "io.modelcontextprotocol/subscriptionId"
UNSUPPORTED_VERSION = -32022


class RequestMeta(msgspec.Struct):
    meta: dict[str, Any] = msgspec.field(default_factory=dict, name="_meta")


class ListenParams(msgspec.Struct):
    notifications: dict[str, Any] = {}


def with_result_type(result: bytes) -> bytes:
    """``result`` (a JSON object) with ``resultType: "complete"``, which 2026-07-28 results carry."""
    if result.startswith(b"{") and b'"resultType"' not in result[:64]:
        return b'{"resultType":"complete"' + (b"," if result != b"{}" else b"") + result[1:]
    return result

ANNOTATIONS_SINCE = "2025-03-26"
PROGRESS_MESSAGE_SINCE = "2025-03-26"
SERVER_TITLE_SINCE = "2025-06-18"
# Fields of a tool definition, and the first revision whose clients accept each.
TOOL_FIELDS_SINCE = {
    "annotations": ANNOTATIONS_SINCE,
    "title": "2025-06-18",
    "outputSchema": "2025-06-18",
    "_meta": "2025-06-18",
    "icons": "2025-11-25",
    "execution": "2025-11-25",
}


def negotiate(asked: str) -> str:
    """The revision to answer a client that asked for ``asked``: that one when spoken, else the newest."""
    return asked if asked in REVISIONS else LATEST


def tool_fields_dropped(version: str) -> frozenset[str]:
    """The tool-definition fields a client of ``version`` must not be sent."""
    return frozenset(name for name, since in TOOL_FIELDS_SINCE.items() if version < since)
