"""The MCP revisions the daemon speaks, and what a client of each may be sent: one frozen
``Revision`` per revision, which a session holds once its client has chosen one.

A session takes its ``Revision`` at ``initialize`` (``negotiate``) or, for the stateless revision,
from a request's ``_meta`` (``STATELESS_REVISION``; every such request carries it). The parts of
the daemon that write what a client reads ask that value, never a revision string:

- ``tool_fields_dropped``: the tool-definition fields its clients lack (``annotations`` before
  2025-03-26; ``title``, ``outputSchema``, ``_meta`` before 2025-06-18; ``icons``, ``execution``
  before 2025-11-25), for ``registry.model.ToolDef.encoded_for``;
- ``blocks`` and ``structured_content``: the content blocks and the result field it takes
  (``audio`` since 2025-03-26; ``resource_link`` and ``structuredContent`` since 2025-06-18), for
  ``sessions.content.shape_result``; ``full_results`` when it takes every one (no shaping at all);
- ``progress_message``, ``server_title``: ``notifications/progress`` ``message`` (2025-03-26) and
  ``serverInfo.title`` (2025-06-18);
- ``asks``: what a tool may ask its client (``sampling/createMessage`` since 2024-11-05,
  ``elicitation/create`` since 2025-06-18), for ``sessions.asking``: as requests to the client, or
  in the stateless revision, which takes none, as ``input_required`` results; ``elicitation_forms``:
  the form fields of SEP-1034 (defaults) and SEP-1330 (titled and multi-select enums), 2025-11-25 on;
- ``batches``: JSON-RPC batches (a line or POST body holding an array of messages) are taken:
  2025-03-26 alone (2025-06-18 removed them), for ``sessions.batches``;
- ``stateless``: 2026-07-28 (no handshake, ``_meta`` on each request, ``resultType`` on results,
  cache hints on lists, list changes only on a ``subscriptions/listen`` stream).

A client that names at ``initialize`` a revision the daemon does not speak gets the newest one
reached that way, as the specification says; it may then disconnect, but it is never sent a field
its own revision lacks. This module holds no state and does no I/O; a new revision is one more
row in ``_SINCE`` and one more name in ``REVISIONS`` or ``STATELESS``.
"""

from __future__ import annotations

import msgspec

from atomictools._protocol import LATEST_PROTOCOL_VERSION, SUPPORTED_PROTOCOL_VERSIONS
from atomictoolsd.sessions.loose import keys_of, text_of

__all__ = [
    "ALL", "BY_VERSION", "LATEST", "REMOVED", "REVISIONS", "STATELESS", "STATELESS_REVISION",
    "ListenParams", "RequestMeta", "Revision", "missing_meta", "negotiate", "older_form", "revision", "with_result_type",
]

REVISIONS = SUPPORTED_PROTOCOL_VERSIONS  # through initialize, oldest first
LATEST = LATEST_PROTOCOL_VERSION
STATELESS = ("2026-07-28",)  # no handshake: each request names its revision in _meta
ALL = (*REVISIONS, *STATELESS)

# The first revision whose clients take each feature (revisions are dates: they order as text).
_SINCE = {
    # tool-definition fields
    "annotations": "2025-03-26",
    "title": "2025-06-18",
    "outputSchema": "2025-06-18",
    "_meta": "2025-06-18",
    "icons": "2025-11-25",
    "execution": "2025-11-25",
    # content blocks (text, image and an embedded resource: every revision)
    "audio": "2025-03-26",
    "resource_link": "2025-06-18",
    # the rest
    "structuredContent": "2025-06-18",
    "progress message": "2025-03-26",
    "serverInfo.title": "2025-06-18",
    "sampling/createMessage": "2024-11-05",
    "elicitation/create": "2025-06-18",
    "elicitation forms": "2025-11-25",  # SEP-1034 defaults, SEP-1330 enum forms
    "batches": "2025-03-26",
}
# The first revision whose clients no longer take a feature.
_UNTIL = {"batches": "2025-06-18"}
_TOOL_FIELDS = ("annotations", "title", "outputSchema", "_meta", "icons", "execution")
_BLOCKS = ("text", "image", "resource", "audio", "resource_link")
_ASKS = ("sampling/createMessage", "elicitation/create")


class Revision(msgspec.Struct, frozen=True):
    """What a client of one MCP revision may be sent (see the module docstring for each field)."""

    version: str
    stateless: bool
    tool_fields_dropped: frozenset[str]
    blocks: frozenset[str]
    structured_content: bool
    full_results: bool  # every block and structuredContent: a result is sent as the worker made it
    progress_message: bool
    server_title: bool
    asks: frozenset[str]
    elicitation_forms: bool
    batches: bool


def _make(version: str) -> Revision:
    def has(feature: str) -> bool:
        return _SINCE[feature] <= version < _UNTIL.get(feature, "9999")

    blocks = frozenset(b for b in _BLOCKS if b not in _SINCE or has(b))
    stateless = version in STATELESS
    return Revision(
        version=version,
        stateless=stateless,
        tool_fields_dropped=frozenset(f for f in _TOOL_FIELDS if not has(f)),
        blocks=blocks,
        structured_content=has("structuredContent"),
        full_results=len(blocks) == len(_BLOCKS) and has("structuredContent"),
        progress_message=has("progress message"),
        server_title=has("serverInfo.title"),
        asks=frozenset(m for m in _ASKS if has(m)),
        elicitation_forms=has("elicitation forms"),
        batches=has("batches"),
    )


BY_VERSION: dict[str, Revision] = {version: _make(version) for version in ALL}
STATELESS_REVISION = BY_VERSION[STATELESS[-1]]


def revision(version: str) -> Revision | None:
    """The ``Revision`` named ``version``, or None when the daemon does not speak it."""
    return BY_VERSION.get(version)


def negotiate(asked: str) -> Revision:
    """The revision to answer an ``initialize`` that asked for ``asked``: that one when it is reached
    through ``initialize``, else the newest that is."""
    return BY_VERSION[asked if asked in REVISIONS else LATEST]


# The 2026-07-28 request _meta keys, and the error for a revision not spoken.
META_VERSION = "io.modelcontextprotocol/protocolVersion"
META_VERSION_BYTES = META_VERSION.encode()
META_CAPABILITIES = "io.modelcontextprotocol/clientCapabilities"
META_CLIENT = "io.modelcontextprotocol/clientInfo"
META_SERVER = "io.modelcontextprotocol/serverInfo"
SUBSCRIPTION_ID = "io.modelcontextprotocol/subscriptionId"
UNSUPPORTED_VERSION = -32022
META_LOG_LEVEL = "io.modelcontextprotocol/logLevel"  # a call's log level; absent: no log messages

# What 2026-07-28 removed, and what a client uses instead (a request for one is answered -32601).
REMOVED = {
    "initialize": "it has no handshake; send server/discover, and the revision and capabilities in each request's _meta",
    "ping": "it has no ping; any request (server/discover is the cheapest) shows the server is there",
    "logging/setLevel": f"a request asks for log messages with _meta[{META_LOG_LEVEL!r}]",
}


def missing_meta(keys: list[str]) -> str:
    """The error for a 2026-07-28 request whose ``_meta`` lacks ``keys`` (or has them malformed)."""
    return (
        f"Invalid params: params._meta must carry {' and '.join(repr(k) for k in keys)} on every request of MCP "
        f"{STATELESS[-1]} (the revision as a string, the capabilities as an object); this server speaks "
        f"{', '.join(STATELESS)} that way and {', '.join(REVISIONS)} through initialize"
    )


class RequestMeta(msgspec.Struct):
    meta: dict[str, msgspec.Raw] = msgspec.field(default_factory=dict, name="_meta")  # its values read with loose


def client_name(meta: dict[str, msgspec.Raw] | None) -> str:
    """The client a request's ``_meta`` names (``io.modelcontextprotocol/clientInfo``), or ""."""
    client = keys_of(meta.get(META_CLIENT)) if meta else None
    return text_of(client.get("name")) if client else ""


class ListenParams(msgspec.Struct):
    notifications: dict[str, msgspec.Raw] = {}  # what the client listens for: true (or an object) for each


def with_result_type(result: bytes) -> bytes:
    """``result`` (a JSON object) with ``resultType: "complete"``, which 2026-07-28 results carry."""
    if result.startswith(b"{") and result.find(b'"resultType"', 0, 64) < 0:  # find, not ``in``: see sessions/connection.py
        return b'{"resultType":"complete"' + (b"," if result != b"{}" else b"") + result[1:]
    return result


def older_form(params: bytes) -> bytes | str:
    """``elicitation/create`` params for a client that predates SEP-1034 and SEP-1330 (2025-06-18):
    defaults kept on booleans only, a titled single choice (``oneOf`` of ``const``/``title``) as
    ``enum`` with ``enumNames``; or why the form cannot be asked (a multi-select has no older form)."""
    value = msgspec.json.decode(params)
    schema = value.get("requestedSchema")
    properties = schema.get("properties") if isinstance(schema, dict) else None
    if not isinstance(properties, dict):
        return params
    for name, prop in properties.items():
        if not isinstance(prop, dict):
            continue
        if prop.get("type") == "array":
            return f"its form's field {name!r} is a multi-select, which MCP 2025-06-18 has no form for (SEP-1330 came in 2025-11-25)"
        choices = prop.pop("oneOf", None) or prop.pop("anyOf", None)
        if isinstance(choices, list) and all(isinstance(c, dict) and "const" in c for c in choices):
            prop["enum"] = [c["const"] for c in choices]
            prop["enumNames"] = [str(c.get("title", c["const"])) for c in choices]
        if prop.get("type") != "boolean":
            prop.pop("default", None)
    return msgspec.json.encode(value)
