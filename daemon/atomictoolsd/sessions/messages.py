"""The JSON-RPC messages a session reads: the envelope (``Message``, its params left raw) and each
method's params, as msgspec structs, and the one way to decode params (a mismatch is
``ParamsError``, answered -32602).

A ``tools/call``'s params are ``CallParams`` with the keys of its ``_meta`` the daemon reads
(``CallMeta``), decoded in one step; ``CallRequest`` is a whole ``tools/call`` message, envelope and
params in one decode: the socket's call path. No state, no I/O: a transport decodes a message
(``decode_message``, ``decode_call``), ``session`` handles it; this module says what a message may
hold.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, UnsetType

from atomictools._protocol import LATEST_PROTOCOL_VERSION
from atomictoolsd.sessions.loose import NULL
from atomictoolsd.sessions.revisions import META_CAPABILITIES, META_LOG_LEVEL, META_VERSION

__all__ = [
    "TOO_DEEP", "AtomicListParams", "AttachParams", "CallMeta", "CallParams", "CallRequest", "CancelledParams",
    "InitializeParams", "ListParams", "Message", "ParamsError", "ReloadParams", "SetLevelParams", "clip",
    "decode_call", "decode_globs", "decode_message", "decode_params", "GLOB_MOST", "MOST_GLOBS", "NO_GLOBS",
]


class Message(msgspec.Struct):
    jsonrpc: str | UnsetType = UNSET
    id: int | str | None | UnsetType = UNSET
    method: str | UnsetType = UNSET
    params: msgspec.Raw | UnsetType = UNSET
    result: msgspec.Raw | UnsetType = UNSET
    error: msgspec.Raw | UnsetType = UNSET


class CallMeta(msgspec.Struct):
    """The keys of a ``tools/call``'s ``_meta`` the daemon reads, decoded with the call (the rest are
    skipped unread). Each is raw, read where it is used (``loose``): a value of the wrong type is
    ignored there, never an error, as a key the daemon does not know would be."""

    progressToken: msgspec.Raw = NULL  # noqa: N815 - the wire name
    timeout: msgspec.Raw = msgspec.field(default=NULL, name="atomic/timeout")
    message_id: msgspec.Raw = msgspec.field(default=NULL, name="atomic/messageId")
    tool_use_id: msgspec.Raw = msgspec.field(default=NULL, name="atomic/toolUseId")
    claude_tool_use_id: msgspec.Raw = msgspec.field(default=NULL, name="claudecode/toolUseId")
    log_level: msgspec.Raw = msgspec.field(default=NULL, name=META_LOG_LEVEL)  # 2026-07-28
    capabilities: msgspec.Raw = msgspec.field(default=NULL, name=META_CAPABILITIES)  # 2026-07-28: this call's
    # 2026-07-28: a request that names its revision; such a call is read as a Message (``Connection``)
    revision: msgspec.Raw = msgspec.field(default=NULL, name=META_VERSION)


class CallParams(msgspec.Struct):
    name: str
    arguments: msgspec.Raw | UnsetType = UNSET  # Raw cannot share a union with None; null is Raw too
    meta: CallMeta | UnsetType = msgspec.field(default=UNSET, name="_meta")
    # 2026-07-28: the retry of a call answered input_required (see sessions.asking)
    inputResponses: dict[str, msgspec.Raw] | UnsetType = UNSET  # noqa: N815 - the wire name; passed on as they are
    requestState: str | UnsetType = UNSET  # noqa: N815


class CallRequest(msgspec.Struct):
    """A whole ``tools/call`` message, envelope and params in one decode. A message that does not
    fit (another method, a malformed id or params) is read as a ``Message``, whose handling
    answers it."""

    jsonrpc: Literal["2.0"]
    id: int | str
    method: Literal["tools/call"]
    params: CallParams


class InitializeParams(msgspec.Struct):
    protocolVersion: str = LATEST_PROTOCOL_VERSION  # noqa: N815 - the wire name
    capabilities: dict[str, msgspec.Raw] = {}  # what the client can do: its keys are what counts
    clientInfo: dict[str, msgspec.Raw] = {}  # noqa: N815 - its name read with loose.text_of


class ListParams(msgspec.Struct):
    cursor: str | None = None
    # Read for the client it names (revisions.client_name): a shared stateless session lists each
    # request's tools in the schema form its own client accepts. Raw: a malformed one names nobody.
    meta: msgspec.Raw = msgspec.field(default=NULL, name="_meta")


# An allow or deny list of globs, bounded: each glob is matched against every tool of each view.
MOST_GLOBS = 256  # globs in one list
GLOB_MOST = 256  # characters in one glob
_Globs = Annotated[list[Annotated[str, msgspec.Meta(max_length=GLOB_MOST)]], msgspec.Meta(max_length=MOST_GLOBS)]
_GLOBS_BYTES = MOST_GLOBS * (6 * GLOB_MOST + 3) + 2  # the JSON of the longest list, every character escaped
_decode_globs = msgspec.json.Decoder(_Globs).decode
NO_GLOBS = msgspec.Raw(b"[]")


def decode_globs(raw: msgspec.Raw, key: str) -> tuple[str, ...]:
    """The allow or deny list ``key`` of a request's params, raw as they held it (a longer one is
    refused by its size, before any of it is built); raise ``ParamsError`` past the bounds."""
    bounds = f"at most {MOST_GLOBS} globs of at most {GLOB_MOST} characters each"
    if len(raw) > _GLOBS_BYTES:
        raise ParamsError(f"Invalid params: {key} holds {len(raw):,} bytes of globs; it takes {bounds}")
    try:
        return tuple(_decode_globs(raw))
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise ParamsError(f"Invalid params: {key}: {exc} ({bounds})") from None


class AttachParams(msgspec.Struct):
    lock: bool = False  # the shim locks its agent's session to this attach: see session.LOCKED_OUT
    directory: str | None = None
    agent: str = ""
    sessionId: str = ""  # noqa: N815
    allow: msgspec.Raw = NO_GLOBS  # read with decode_globs
    deny: msgspec.Raw = NO_GLOBS
    dispatcher: bool = False


class AtomicListParams(msgspec.Struct):
    all: bool = False


class ReloadParams(msgspec.Struct):
    module: str | None = None  # a module's path, a tool it defines or its file's stem; None: the whole project
    force: bool = False  # the whole project: every module loaded again, changed or not (a module always is)


class SetLevelParams(msgspec.Struct):
    level: str


class CancelledParams(msgspec.Struct):
    requestId: int | str  # noqa: N815
    reason: str | None = None


class ParamsError(Exception):
    """Request parameters that do not fit the method (answered with -32602)."""



decode_message = msgspec.json.Decoder(Message).decode
decode_call = msgspec.json.Decoder(CallRequest).decode
_param_decoders: dict[type, msgspec.json.Decoder[Any]] = {}



def decode_params(raw: Any, kind: type[Any]) -> Any:
    """Decode request params into ``kind``; raise ``ParamsError`` (answered -32602) when they do not
    fit. Params a transport made as ``kind`` itself (``session.Handler``) are taken as they are."""
    if type(raw) is kind:
        return raw
    decoder = _param_decoders.get(kind)
    if decoder is None:
        decoder = _param_decoders[kind] = msgspec.json.Decoder(kind)
    try:
        return decoder.decode(raw if raw is not UNSET else b"{}")
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise ParamsError(f"Invalid params: {exc}") from None
    except RecursionError:
        raise ParamsError(f"Invalid params: {TOO_DEEP}") from None


# The JSON decoder refuses nesting deeper than the interpreter's recursion limit allows (about 1,000
# levels, fewer the deeper the stack it is called from). Such a message is answered, never fatal.
TOO_DEEP = "nested too deeply to decode (keep JSON under a few hundred levels of arrays and objects)"


def clip(text: str, limit: int = 80) -> str:
    """``text`` short enough to echo in an error message (a client's value can be megabytes)."""
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} characters)"
