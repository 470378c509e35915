"""One connection to the daemon: NDJSON JSON-RPC 2.0 with MCP's methods and the ``atomic/*`` ones.

A session reads one message per line, answers each request exactly once, and never lets a bad line
end the connection: a malformed line gets ``-32700``/``-32600``, an oversized one a clear error, and
the next line is read as usual. Tool calls take a callback path with no task per call; results
arrive from the worker as ready-made JSON and are spliced into the response.

The session sees one project (``atomic/attach`` chooses it; until then, the global and built-in
tools), filtered by its allow/deny globs, at listing and at dispatch alike.

Listing never waits on a slow module: it waits for the project's first scan, which commits what has
loaded within ``load_wait``, and reports the modules still loading (``_meta`` of ``tools/list``,
``loading`` of ``atomic/list`` and ``atomic/attach``); their tools follow with ``list_changed``. A
call to a tool not listed waits for those loads (within the call timeout) before it is unknown.
"""

from __future__ import annotations

import asyncio
import base64
import fnmatch
import itertools
import logging
import os
import re
import select
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import msgspec
from msgspec import UNSET, UnsetType

from atomictools._protocol import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    LOG_LEVELS,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
)
from atomictoolsd import __version__
from atomictoolsd.config.discovery import escape_strings, git_worktree_root
from atomictoolsd.config.suggest import unknown_tool
from atomictoolsd.registry.model import Project, ToolDef
from atomictoolsd.sessions import dispatcher, revisions
from atomictoolsd.sessions.asking import Asking
from atomictoolsd.sessions.content import shape_result
from atomictoolsd.sessions.messages import (
    TOO_DEEP,
    AtomicListParams,
    AttachParams,
    CallParams,
    CancelledParams,
    InitializeParams,
    ListParams,
    ParamsError,
    SetLevelParams,
    decode_message,
    decode_params,
)
from atomictoolsd.workers.protocol import CallContext

if TYPE_CHECKING:
    from atomictoolsd.config.settings import Config
    from atomictoolsd.registry.projects import Registry
    from atomictoolsd.workers.pool import WorkerPool

__all__ = ["Handler", "Session", "SessionHost"]

log = logging.getLogger("atomictoolsd.session")

_encode = msgspec.json.encode
_ids = itertools.count(1)

_LEVEL_RANK = {level: rank for rank, level in enumerate(LOG_LEVELS)}

# A client this far behind on reading has stopped reading: its log and progress notifications are
# dropped (and counted, and the count told once it catches up) rather than held, so a tool that
# floods them cannot grow the daemon's memory. Answers and list_changed are never dropped: answers
# are bounded by the calls in flight (a client that does not read is no longer read), list_changed
# by the reloads.
_LOSSY_BACKLOG = 4 * 1024 * 1024
_LOSSY = frozenset({"notifications/message", "notifications/progress"})


class _WaitingCall:
    """A call waiting for its project's first scan, or for modules still loading; a cancel marks
    it, and it never starts."""

    __slots__ = ("cancelled",)

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


# What a locked session (an agent's, through the shim, which relays every line) may not do: move
# to another project or allowlist, stop the daemon, or make launchers. The allowlist is what the
# agent is offered over MCP; it is no sandbox against an agent that also has a shell.
LOCKED_OUT = frozenset({"atomic/attach", "atomic/shutdown", "atomic/bridges/create", "atomic/bridges/remove"})

# Clients (by the name they give at initialize, or the agent the shim attached as) that reject a tool
# schema with $defs/$ref or an untyped enum: they get the portable form of every schema.
PORTABLE_ONLY_CLIENTS = ("gemini", "qwen")

# A request handler: (session, request id as JSON, raw params) → None when it has answered, or an
# awaitable that answers. Raising ParamsError answers -32602. Components add theirs to
# ``Server.methods``.
Handler = Callable[["Session", bytes, Any], "None | Awaitable[None]"]


class SessionHost(Protocol):
    """What a session uses of the daemon that accepted it (``server.lifecycle.Server``)."""

    config: Config
    registry: Registry
    pool: WorkerPool
    methods: dict[str, Handler]  # the components' methods

    def accept(self, session: Session, transport: asyncio.BaseTransport) -> bool: ...

    def forget(self, session: Session) -> None: ...

    def status(self) -> dict[str, Any]: ...

    def request_stop(self, reason: str) -> None: ...


class Session(asyncio.Protocol):
    """The state and protocol of one connection."""

    def __init__(self, server: SessionHost) -> None:
        self.server = server
        self.id = next(_ids)
        self.transport: asyncio.Transport | None = None
        self.peer_pid: int | None = None
        self._buffer = bytearray()
        self._discarding = False  # inside a line already refused as oversized
        self.project: Project = server.registry.base
        self.directory = ""
        self.worktree = ""
        self.agent = ""
        self.session_id = ""
        self.allow: tuple[str, ...] = ()
        self.deny: tuple[str, ...] = ()
        self.dispatcher = False  # also offer the meta-tools of atomictoolsd.sessions.dispatcher
        self.locked = False  # attached with lock: LOCKED_OUT methods are refused from now on
        # The revision its client chose (sessions.revisions): at initialize, or named in a request's
        # _meta (2026-07-28); None until then (a raw client, which takes everything). ``protocol_version``
        # and ``modern`` mirror it for the hot path and for transports.
        self.revision: revisions.Revision | None = None
        self.protocol_version: str | None = None
        # Tool schemas with $defs/$ref inlined and enums typed, for agents that reject JSON Schema
        # 2020-12 as written (Gemini CLI, Qwen Code); other clients get each schema as its author wrote it.
        self.portable_schemas = False
        self._tool_shape: frozenset[str] = frozenset()  # tool fields this client's revision lacks
        # The stateless revision (2026-07-28): every request names it in _meta, none needs initialize;
        # list changes go only to this session's subscriptions/listen requests (id as JSON → id).
        self.modern = False
        self.listens: dict[bytes, Any] = {}
        self.call_log_levels: dict[bytes, str] = {}  # 2026-07-28: the level each call asked for in _meta
        # 2026-07-28: what each call's own request declared (_meta) it can be asked; over HTTP one session
        # serves every stateless client of a URL, so the last request's capabilities are not the call's.
        self.call_capabilities: dict[bytes, dict[str, Any]] = {}
        self.client_capabilities: dict[str, Any] = {}  # what the client declared at initialize
        self.asking = Asking(self)  # requests its tools sent this client (ctx.elicit, ctx.sample)
        self.initialized = False
        self.subscribed = False
        self.log_level = "info"
        self.dropped = 0  # log and progress notifications dropped since the client stopped reading
        self.calls: dict[bytes, Any] = {}  # calls in flight by their request id, as JSON
        self._tasks: set[asyncio.Task[None]] = set()
        self._pending: set[bytes] = set()  # ids of the requests a task answers (attach, reload, …)
        self._eof = False  # the client half-closed: answer every request read, then close
        self._visible: tuple[Any, list[ToolDef]] | None = None
        self._seen: int | None = None  # fingerprint of the toolset this client last saw
        # What every call of this session tells its tool (ctx); message and tool-use ids vary per call.
        self._context = CallContext()

    # -- asyncio.Protocol -----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if not self.server.accept(self, transport):
            transport.close()
            self.transport = None

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        calls, self.calls = self.calls, {}
        for call in calls.values():
            call.cancel()  # nobody is left to read the answer
        for task in self._tasks:
            task.cancel()
        self.server.registry.release(self.project)
        self.server.forget(self)

    def pause_writing(self) -> None:
        # The client is not reading its answers: stop reading its requests until it catches up,
        # so a stalled client cannot grow the daemon's memory without bound.
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.transport is not None:
            if not self._eof:
                self.transport.resume_reading()
            if self.dropped:
                dropped, self.dropped = self.dropped, 0
                self.log_message("warning", f"{dropped} log and progress notification(s) were dropped while this client was not reading")

    def data_received(self, data: bytes) -> None:
        limit = self.server.config.max_message_bytes
        if self._discarding:
            newline = data.find(b"\n")
            if newline < 0:
                return
            data = data[newline + 1 :]
            self._discarding = False
        buffer = self._buffer
        if not buffer and data.endswith(b"\n") and data.count(b"\n") == 1 and len(data) <= limit + 1:
            self.handle_line(data)  # the common case: one whole message per read
            return
        buffer += data
        start = 0
        while True:
            newline = buffer.find(b"\n", start)
            if newline < 0:
                break
            if newline - start > limit:
                self.send_error(b"null", INVALID_REQUEST, self._oversized(newline - start))
            else:
                self.handle_line(bytes(buffer[start:newline]))
            start = newline + 1
            if self.transport is None:
                return
        del buffer[:start]
        if len(buffer) > limit:
            size = len(buffer)
            buffer.clear()
            self._discarding = True
            self.send_error(b"null", INVALID_REQUEST, self._oversized(size, partial=True))

    def eof_received(self) -> bool:
        # A half-close (`echo … | socat`, a shim whose agent closed stdin) ends the requests, not
        # the answers: every request already read is answered, then the connection closes. A client
        # that is gone altogether (it exited, or was stopped with Ctrl-C) reads nothing more: its
        # calls are cancelled at once, as connection_lost does, instead of running to their end.
        if _peer_closed(self.transport):
            return False  # the transport closes; connection_lost cancels the calls
        if self._buffer and not self._discarding:
            line, self._buffer = bytes(self._buffer), bytearray()
            self.handle_line(line)  # the last line may lack its newline
        self._eof = True
        self._close_if_done()
        return True  # keep the writing side open

    def _close_if_done(self) -> None:
        if self._eof and not self.calls and not self._pending and self.transport is not None:
            self.transport.close()  # after what is buffered has been written

    def _oversized(self, size: int, partial: bool = False) -> str:
        limit = self.server.config.max_message_bytes
        grown = "at least " if partial else ""
        return (
            f"Message too large: {grown}{size} bytes, the limit is {limit} bytes "
            f"(ATOMICTOOLS_MAX_MESSAGE_BYTES); it was discarded"
        )

    # -- framing --------------------------------------------------------------------------------

    def handle_line(self, line: bytes) -> None:
        if not line.strip():
            return
        try:
            message = decode_message(line)
        except RecursionError:
            self._refuse_deep(line)
            return
        except msgspec.ValidationError as exc:
            stripped = line.lstrip()
            if stripped.startswith(b"["):
                self.send_error(b"null", INVALID_REQUEST, "Batches are not supported: send one JSON-RPC message per line")
            else:
                self.send_error(self._salvage_id(line), INVALID_REQUEST, f"Invalid request: {exc}")
            return
        except msgspec.DecodeError as exc:
            self.send_error(b"null", PARSE_ERROR, f"Parse error: {exc}")
            return
        if message.jsonrpc != "2.0":
            if message.id is not UNSET:
                self.send_error(_encode(message.id), INVALID_REQUEST, 'Invalid request: "jsonrpc" must be "2.0"')
            return
        method = message.method
        if method is UNSET:
            if message.result is UNSET and message.error is UNSET and message.id is not UNSET:
                self.send_error(_encode(message.id), INVALID_REQUEST, 'Invalid request: no "method"')
            elif message.id is not UNSET:
                self.asking.response(_encode(message.id), message.result, message.error)
            return  # a response: to a tool's question (ctx.elicit, ctx.sample), or to nothing
        if message.id is UNSET:
            self.handle_notification(method, message.params)
            return
        id_json = _encode(message.id)
        if revisions.META_VERSION_BYTES in line:
            if not self._accept_modern(id_json, method, message.params):
                return
        elif self.modern and not method.startswith("atomic/"):
            # 2026-07-28 has no session state to fall back on: each request names its revision.
            self.send_error(id_json, INVALID_PARAMS, revisions.missing_meta([revisions.META_VERSION, revisions.META_CAPABILITIES]))
            return
        if id_json in self.calls or id_json in self._pending or id_json in self.listens:
            # Answers and cancels are matched by id: a second request with the id of one in flight
            # would make both ambiguous, so it is refused and the first one stands.
            self.send_error(
                id_json, INVALID_REQUEST,
                f"Invalid request: id {_clip(id_json.decode())} is already used by a request in flight; "
                f"use a new id for each request",
            )
            return
        if self.locked and method in LOCKED_OUT:
            self.send_error(
                id_json, INVALID_REQUEST,
                f"{method} is not available: this session is locked to the project and tools it attached with",
            )
            return
        handler = _HANDLERS.get(method) or self.server.methods.get(method)
        if handler is None:
            self.send_error(id_json, METHOD_NOT_FOUND, f"Method not found: {_clip(method)}")
            return
        try:
            outcome = handler(self, id_json, message.params)
        except ParamsError as exc:
            self.send_error(id_json, INVALID_PARAMS, str(exc))
            return
        except Exception as exc:  # answer, and keep the connection serving (as _spawn does)
            log.exception("request %s failed", method)
            self.send_error(id_json, INTERNAL_ERROR, f"Internal error: {type(exc).__name__}: {exc}")
            return
        if outcome is not None:
            self._spawn(outcome, id_json)

    @staticmethod
    def _salvage_id(line: bytes) -> bytes:
        try:
            value = msgspec.json.decode(line)
        except msgspec.DecodeError:
            return b"null"
        except RecursionError:
            return _scan_envelope(line)[0]
        if isinstance(value, dict) and isinstance(value.get("id"), (int, str)) and not isinstance(value["id"], bool):
            return _encode(value["id"])
        return b"null"

    def _refuse_deep(self, line: bytes) -> None:
        id_json, field, method = _scan_envelope(line)
        if field == "params" and method and id_json != b"null":
            self.send_error(id_json, INVALID_PARAMS, f"Invalid params: {TOO_DEEP}")
        else:
            where = f"{field!r} is " if field else ""
            self.send_error(id_json, INVALID_REQUEST, f"Invalid request: {where}{TOO_DEEP}")

    def _spawn(self, coroutine: Awaitable[None], id_json: bytes) -> None:
        async def run() -> None:
            try:
                await coroutine
            except ParamsError as exc:
                self.send_error(id_json, INVALID_PARAMS, str(exc))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # answer, and keep the connection serving
                log.exception("request failed")
                self.send_error(id_json, INTERNAL_ERROR, f"Internal error: {type(exc).__name__}: {exc}")
            finally:
                # In the step that answered, not in a done callback a loop turn later: the client
                # may reuse the id as soon as it reads the answer.
                self._pending.discard(id_json)
                self._close_if_done()

        task = asyncio.get_running_loop().create_task(run())
        self._tasks.add(task)
        self._pending.add(id_json)
        task.add_done_callback(self._tasks.discard)

    # -- writing --------------------------------------------------------------------------------

    def send_result(self, id_json: bytes, result: bytes) -> None:
        if self.modern:
            result = revisions.with_result_type(result)
        if self.transport is not None:
            self.transport.write(b'{"jsonrpc":"2.0","id":' + id_json + b',"result":' + result + b"}\n")

    def send_error(self, id_json: bytes, code: int, message: str, data: Any = None) -> None:
        error: dict[str, Any] = {"code": code, "message": message}
        if data is not None:
            error["data"] = data
        if self.transport is not None:
            self.transport.write(b'{"jsonrpc":"2.0","id":' + id_json + b',"error":' + _encode_report(error) + b"}\n")

    def send_request(self, id_json: bytes, method: str, params: bytes) -> bool:
        """Send the client a request of the daemon's own (a tool's question); False when it is gone."""
        if self.transport is None:
            return False
        self.transport.write(b'{"jsonrpc":"2.0","id":' + id_json + b',"method":' + _encode(method) + b',"params":' + params + b"}\n")
        return True

    def send_notification(self, method: str, params: dict[str, Any] | None = None) -> None:
        if self.modern and method == "notifications/tools/list_changed":
            for id_json, request_id in list(self.listens.items()):
                self.notify_listener(id_json, _encode({"jsonrpc": "2.0", "method": method, "params": {
                    "_meta": {revisions.SUBSCRIPTION_ID: request_id}}}))
            return
        if self.transport is None:
            return
        if method in _LOSSY and self.transport.get_write_buffer_size() > _LOSSY_BACKLOG:
            self.dropped += 1
            return
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        self.transport.write(_encode_report(message) + b"\n")

    def client_id(self, id_json: bytes) -> Any:
        """The id the client gave the request ``id_json`` (a transport may have renamed it)."""
        return msgspec.json.decode(id_json)

    def notify_listener(self, id_json: bytes, message: bytes) -> None:
        """Write ``message`` on the stream of the ``subscriptions/listen`` request ``id_json``."""
        if self.transport is not None:
            self.transport.write(message + b"\n")

    def log_message(self, level: str, data: Any, logger: str = "atomictoolsd") -> None:
        """Send ``notifications/message`` when ``level`` passes this client's level (never to a
        2026-07-28 client: it is sent only the logs of a call that asked, see ``call_log``)."""
        if not self.modern and _LEVEL_RANK.get(level, 0) >= _LEVEL_RANK[self.log_level]:
            self.send_notification("notifications/message", {"level": level, "logger": logger, "data": data})

    # -- what this session sees -------------------------------------------------------------------

    def allowed(self, name: str) -> bool:
        if self.allow and not any(fnmatch.fnmatchcase(name, g) for g in self.allow):
            return False
        return not any(fnmatch.fnmatchcase(name, g) for g in self.deny)

    def visible(self) -> list[ToolDef]:
        """The tools this session may list and call, in name order."""
        view = self.project.view()
        cached = self._visible
        if cached is not None and cached[0] is view:
            return cached[1]
        if self.allow or self.deny:
            tools = [t for name, t in view.tools.items() if self.allowed(name)]
        else:
            tools = list(view.tools.values())
        self._visible = (view, tools)
        return tools

    def fingerprint(self) -> int:
        return hash(tuple(t.encoded for t in self.visible()))

    def toolset_changed(self) -> bool:
        """Whether the visible toolset differs from what this client last saw (and remember it)."""
        if not self.project.is_ready():
            # The first scan of a project (a daemon the shim just started) completes dir by dir; the
            # client's first listing waits for all of them, so telling it of each would only make it
            # list again, once per dir (issue: two or three list_changed right after initialize).
            return False
        current = self.fingerprint()
        changed = self._seen is not None and current != self._seen
        self._seen = current
        return changed

    def wants_notifications(self) -> bool:
        if self.modern:
            return bool(self.listens)  # 2026-07-28: nothing free-floating, only what a listen asked for
        return self.initialized or self.subscribed

    # -- notifications from the client -------------------------------------------------------------

    def handle_notification(self, method: str, raw: msgspec.Raw | UnsetType) -> None:
        if method == "notifications/initialized":
            self.initialized = True
            if self._seen is None and self.project.is_ready():  # else its first listing sets it
                self._seen = self.fingerprint()
        elif method == "notifications/cancelled":
            try:
                params = decode_params(raw, CancelledParams)
            except ParamsError:
                return  # notifications get no answer, not even an error
            if self.listens.pop(_encode(params.requestId), None) is not None:
                return  # the client ended its subscription: no answer, as for a cancelled call
            call = self.calls.pop(_encode(params.requestId), None)
            if self.call_log_levels:
                self.call_log_levels.pop(_encode(params.requestId), None)
            if self.call_capabilities:
                self.call_capabilities.pop(_encode(params.requestId), None)
            if call is not None:
                call.cancel()
                self.asking.call_ended(call)
                self._close_if_done()

    # -- requests -------------------------------------------------------------------------------

    def on_initialize(self, id_json: bytes, raw: Any) -> None:
        params = decode_params(raw, InitializeParams)
        version = params.protocolVersion
        revision = self.adopt(revisions.negotiate(version))
        self.client_capabilities = params.capabilities
        if not self.agent:
            self.agent = str(params.clientInfo.get("name", ""))
            self._context = msgspec.structs.replace(self._context, agent=self.agent)
        client = f"{self.agent} {params.clientInfo.get('name', '')}".lower()
        self.portable_schemas = any(name in client for name in PORTABLE_ONLY_CLIENTS)
        instructions = self._instructions()
        result = {
            "protocolVersion": revision.version,
            "capabilities": {"tools": {"listChanged": True}, "logging": {}},
            "serverInfo": {"name": "atomictoolsd", "version": __version__}
            | ({"title": "atomictoolsd"} if revision.server_title else {}),
            "instructions": instructions,
        }
        self.send_result(id_json, _encode(result))

    def adopt(self, revision: revisions.Revision) -> revisions.Revision:
        """Speak ``revision`` to this client from now on."""
        self.revision = revision
        self.protocol_version = revision.version
        self.modern = revision.stateless
        self._tool_shape = revision.tool_fields_dropped
        return revision

    def _accept_modern(self, id_json: bytes, method: str, raw: Any) -> bool:
        """Take a request's 2026-07-28 ``_meta`` (revision, capabilities, client); False when it was
        refused: a key missing or malformed (-32602 naming it), a revision not spoken (-32022 naming
        the ones that are), a method the revision removed (-32601 saying what replaced it)."""
        try:
            meta = decode_params(raw, revisions.RequestMeta).meta
        except ParamsError as exc:
            self.send_error(id_json, INVALID_PARAMS, str(exc))
            return False
        if revisions.META_VERSION not in meta:
            if not self.modern:
                return True  # the key's name in an argument, not in _meta: an ordinary request
            self.send_error(id_json, INVALID_PARAMS, revisions.missing_meta([revisions.META_VERSION]))
            return False
        version = meta[revisions.META_VERSION]
        if not isinstance(version, str):
            self.send_error(id_json, INVALID_PARAMS, f"Invalid params: _meta[{revisions.META_VERSION!r}] must be a string such as {revisions.STATELESS[-1]!r}")
            return False
        if version not in revisions.STATELESS:
            self.send_error(
                id_json, revisions.UNSUPPORTED_VERSION,
                f"Unsupported protocol version {_clip(str(version))!r}: this server speaks {', '.join(revisions.ALL)} "
                f"({', '.join(revisions.REVISIONS)} through initialize)",
                {"supported": list(revisions.ALL), "requested": str(version)},
            )
            return False
        capabilities = meta.get(revisions.META_CAPABILITIES)
        if not isinstance(capabilities, dict):
            self.send_error(id_json, INVALID_PARAMS, revisions.missing_meta([revisions.META_CAPABILITIES]))
            return False
        removed = revisions.REMOVED.get(method)
        if removed is not None:
            self.send_error(id_json, METHOD_NOT_FOUND, f"{method} is not part of MCP {version}: {removed}")
            return False
        if not self.modern:
            self.adopt(revisions.STATELESS_REVISION)
        self.client_capabilities = capabilities
        client = meta.get(revisions.META_CLIENT)
        if isinstance(client, dict) and client.get("name") and not self.agent:
            self.agent = str(client["name"])
            self._context = msgspec.structs.replace(self._context, agent=self.agent)
            self.portable_schemas = any(name in self.agent.lower() for name in PORTABLE_ONLY_CLIENTS)
        return True

    def on_discover(self, id_json: bytes, raw: Any) -> None:
        """``server/discover`` (2026-07-28): the revisions, capabilities and instructions, without a handshake."""
        result = {
            "supportedVersions": list(revisions.ALL),
            "capabilities": {"tools": {"listChanged": True}},
            "instructions": self._instructions(),
            "ttlMs": 0,
            "cacheScope": "private",
            "_meta": {revisions.META_SERVER: {"name": "atomictoolsd", "title": "atomictoolsd", "version": __version__}},
        }
        self.send_result(id_json, _encode(result))

    def on_listen(self, id_json: bytes, raw: Any) -> None:
        """``subscriptions/listen`` (2026-07-28): acknowledge what is honored (tool-list changes; this
        server has no prompts or resources), then keep the request open: each change is sent on it."""
        params = decode_params(raw, revisions.ListenParams)
        honored = {"toolsListChanged": True} if params.notifications.get("toolsListChanged") else {}
        request_id = self.client_id(id_json)
        if honored:
            self.listens[id_json] = request_id
            if self._seen is None:
                self._seen = self.fingerprint()
        self.notify_listener(id_json, _encode({"jsonrpc": "2.0", "method": "notifications/subscriptions/acknowledged",
                                               "params": {"_meta": {revisions.SUBSCRIPTION_ID: request_id}, "notifications": honored}}))
        if not honored:  # nothing to listen for: the stream ends at once, gracefully
            self.send_result(id_json, _encode({"_meta": {revisions.SUBSCRIPTION_ID: request_id}}))

    def _instructions(self) -> str:
        instructions = (
            "Tools from this project's .atomic/tools/ and the user's ~/.atomic/tools/. "
            "The tool list changes when those files change."
        )
        offer = self.project.trust_offer()  # the shim attaches first, so the project is known here
        if offer:
            instructions += (
                " This project's own tools are not loaded until the user trusts the project;"
                f" if they want them, tell them: {offer['message']}"
            )
        return instructions

    def on_ping(self, id_json: bytes, raw: Any) -> None:
        self.send_result(id_json, b"{}")

    def on_set_level(self, id_json: bytes, raw: Any) -> None:
        params = decode_params(raw, SetLevelParams)
        if params.level not in _LEVEL_RANK:
            raise ParamsError(f"Invalid params: level must be one of {', '.join(LOG_LEVELS)}")
        self.log_level = params.level
        self.send_result(id_json, b"{}")

    def on_list(self, id_json: bytes, raw: Any) -> Awaitable[None] | None:
        params = decode_params(raw, ListParams)
        if not self.project.is_ready():
            return self._list_when_ready(id_json, params)
        self._list(id_json, params)
        return None

    async def _list_when_ready(self, id_json: bytes, params: ListParams) -> None:
        await self.project.ready()
        self._list(id_json, params)

    def _list(self, id_json: bytes, params: ListParams) -> None:
        tools: list[Any] = self.visible()
        if self.dispatcher:
            tools = [*dispatcher.META_TOOLS, *(t for t in tools if t.name not in dispatcher.META_NAMES)]
        size = self.server.config.page_size
        start = 0
        if params.cursor is not None:
            start = _decode_cursor(params.cursor)
            if start is None or start > len(tools):
                raise ParamsError(f"Invalid params: unknown cursor {_clip(params.cursor)!r}; list again without one")
        page = tools[start : start + size]
        dropped, written = self._tool_shape, not self.portable_schemas
        body = b'{"tools":[' + b",".join(
            t.encoded_for(dropped, written) if hasattr(t, "encoded_for") else t.encoded for t in page
        ) + b"]"
        if start + size < len(tools):
            body += b',"nextCursor":' + _encode(_encode_cursor(start + size))
        if self.modern:  # 2026-07-28: cache hints; tools change with their files, so no caching
            body += b',"ttlMs":0,"cacheScope":"private"'
        loading = self.project.view().loading
        if loading:  # their tools come with list_changed once they have loaded
            body += b',"_meta":' + _encode({"atomic/loading": loading})
        self.send_result(id_json, body + b"}")
        if start == 0:
            self._seen = self.fingerprint()

    def on_call(self, id_json: bytes, raw: Any) -> Awaitable[None] | None:
        params = decode_params(raw, CallParams)
        if params.requestState is not UNSET:  # the retry of a call answered input_required
            name = None if self.dispatcher and params.name in dispatcher.META_NAMES else params.name
            responses = params.inputResponses if params.inputResponses is not UNSET else None
            capabilities = params.meta.get(revisions.META_CAPABILITIES) if params.meta else None
            why = self.asking.resume(id_json, name, params.requestState, responses,
                                     capabilities if isinstance(capabilities, dict) else {})
            if why is not None:
                raise ParamsError(why)
            return None
        if not self.project.is_ready():
            # Registered now, in message order, so that a cancel right behind it finds it.
            waiting = self.calls[id_json] = _WaitingCall()
            return self._call_when_ready(id_json, params, waiting)
        self._call(id_json, params)
        return None

    async def _call_when_ready(self, id_json: bytes, params: CallParams, waiting: _WaitingCall) -> None:
        await self.project.ready()
        if waiting.cancelled or self.calls.get(id_json) is not waiting:
            return  # cancelled while its project loaded: never answered
        del self.calls[id_json]  # _call registers the call it starts; one it answers at once is not in flight
        self._call(id_json, params)

    async def _call_when_loaded(
        self, id_json: bytes, params: CallParams, waiting: _WaitingCall, loads: list[asyncio.Future[None]]
    ) -> None:
        timeout = self.server.config.call_timeout
        asked = params.meta.get("atomic/timeout") if params.meta else None
        if isinstance(asked, (int, float)) and not isinstance(asked, bool) and asked > 0:
            timeout = min(float(asked), self.server.config.max_call_timeout)
        deadline = asyncio.get_running_loop().time() + timeout
        while loads and params.name not in self.project.view().tools:  # each load may bring it
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                break
            await asyncio.wait(loads, timeout=left, return_when=asyncio.FIRST_COMPLETED)
            loads = self.project.loads_under_way()
        if waiting.cancelled or self.calls.get(id_json) is not waiting:
            return  # cancelled while the modules loaded: never answered
        del self.calls[id_json]
        self._call(id_json, params, waited=True)

    def _call(self, id_json: bytes, params: CallParams, waited: bool = False) -> None:
        # The hot path: no closures, no tasks; the call reports back through call_result().
        name = params.name
        arguments = params.arguments
        if self.dispatcher and name in dispatcher.META_NAMES:
            raw_arguments = b"{}" if arguments is UNSET else bytes(arguments)
            inner = dispatcher.handle(self, id_json, name, raw_arguments)
            if inner is None:
                return
            name, arguments = inner[0], msgspec.Raw(inner[1])
        tool = self.project.view().tools.get(name)
        if tool is None and not waited:
            loads = self.project.loads_under_way()
            if loads:  # a module still loading may define it: wait for them, then look again
                waiting = self.calls[id_json] = _WaitingCall()
                self._spawn(self._call_when_loaded(id_json, CallParams(name, arguments, params.meta), waiting, loads), id_json)
                return
        if tool is None or ((self.allow or self.deny) and not self.allowed(name)):
            if tool is None:
                view = self.project.view()
                message, data = unknown_tool(name, [t.name for t in self.visible()], view.errors, view.blocked)
            else:
                message, data = f"Tool {name!r} is not allowed in this session", {"name": name}
            self.send_error(id_json, INVALID_PARAMS, message, data)
            return
        config = self.server.config
        timeout = tool.timeout or config.call_timeout
        context = self._context
        token = None
        meta = params.meta
        if meta is not UNSET and meta:
            asked = meta.get("atomic/timeout")
            if isinstance(asked, (int, float)) and not isinstance(asked, bool) and asked > 0:
                timeout = min(float(asked), config.max_call_timeout)
            token = meta.get("progressToken")
            if self.modern:
                level = meta.get(revisions.META_LOG_LEVEL)
                if level in _LEVEL_RANK:
                    self.call_log_levels[id_json] = level
                capabilities = meta.get(revisions.META_CAPABILITIES)
                self.call_capabilities[id_json] = capabilities if isinstance(capabilities, dict) else {}
            message_id = meta.get("atomic/messageId")
            tool_use_id = meta.get("atomic/toolUseId") or meta.get("claudecode/toolUseId")
            if message_id or tool_use_id:
                context = msgspec.structs.replace(
                    context, message_id=str(message_id or ""), tool_use_id=str(tool_use_id or "")
                )
        arguments = b"{}" if arguments is UNSET else bytes(arguments)
        if arguments == b"null":
            arguments = b"{}"
        self.calls[id_json] = tool.module.runner.call(
            self.server.pool.next_call_id(), name, arguments, context, timeout, self, id_json, token
        )

    # CallOwner: what a call started by this session produces

    def call_result(self, call: Any, result: bytes) -> None:
        if self.calls.get(call.request_id) is call:
            del self.calls[call.request_id]
        if self.call_log_levels:
            self.call_log_levels.pop(call.request_id, None)
        if self.call_capabilities:
            self.call_capabilities.pop(call.request_id, None)
        if self.asking.call_ended(call):
            self._close_if_done()
            return  # its request was answered input_required; the client did not come back
        self.send_result(call.request_id, shape_result(result, self.revision))
        self._close_if_done()

    def call_progress(self, call: Any, progress: float, total: float | None, message: str | None) -> None:
        payload: dict[str, Any] = {"progressToken": call.progress_token, "progress": progress}
        if total is not None:
            payload["total"] = total
        if message is not None and (self.revision is None or self.revision.progress_message):
            payload["message"] = message
        self.send_notification("notifications/progress", payload)

    def call_log(self, call: Any, level: str, data: bytes) -> None:
        if self.modern:  # 2026-07-28: only a call that asked for a level in its _meta is sent its logs
            wanted = self.call_log_levels.get(call.request_id)
            if wanted is not None and _LEVEL_RANK.get(level, 0) >= _LEVEL_RANK[wanted]:
                self.send_notification("notifications/message", {"level": level, "logger": call.tool, "data": msgspec.Raw(data)})
            return
        self.log_message(level, msgspec.Raw(data), logger=call.tool)

    def call_ask(self, call: Any, ask_id: int, method: str, params: bytes, wait: float | None) -> None:
        limit = self.server.config.ask_timeout
        self.asking.ask(call, ask_id, method, params, limit if wait is None else min(wait, limit))

    async def on_atomic_list(self, id_json: bytes, raw: Any) -> None:
        """Tools with their scope and path, counts by scope, errors; shadowed ones with ``all``."""
        params = decode_params(raw, AtomicListParams)
        await self.project.ready()
        view = self.project.view()
        tools = self.visible()
        counts: dict[str, int] = {}
        for tool in tools:  # by scope; tools of declarative files count apart, wherever they are
            scope = "declarative" if tool.module.kind == "declarative" else tool.module.scope
            counts[scope] = counts.get(scope, 0) + 1
        result: dict[str, Any] = {
            "root": str(self.project.root) if self.project.root else None,
            "trust": self.project.trust_level(),
            "tools": [t.listing() for t in tools],
            "counts": counts,
            "errors": view.errors,
            "blocked": view.blocked,
            "loading": view.loading,
        }
        if params.all:
            result["shadowed"] = [
                tool.listing(shadowed_by=winner)
                for tool, winner in view.shadowed
                if self.allowed(tool.name)
            ]
        self.send_result(id_json, _encode_report(result))

    def on_attach(self, id_json: bytes, raw: Any) -> Awaitable[None]:
        # Everything but the wait happens before the next line is read: the stdio shim sends its
        # attach and the agent's first requests back to back, and those must see the attached project.
        params = decode_params(raw, AttachParams)
        try:
            directory = Path(params.directory or os.getcwd()).expanduser()
        except RuntimeError as exc:  # ~user of a user who does not exist
            raise ParamsError(f"Invalid params: directory {params.directory!r}: {exc}") from None
        if not directory.is_absolute() or not directory.is_dir():
            raise ParamsError(f"Invalid params: directory {str(directory)!r} is not an existing absolute directory")
        directory = directory.resolve()
        project = self.server.registry.acquire(directory)
        self.server.registry.release(self.project)  # held while attached: see idle_projects
        self.project = project
        self.directory = str(directory)
        self.worktree = str(git_worktree_root(directory) or self.project.root or directory)
        self.agent = params.agent or self.agent
        self.session_id = params.sessionId or self.session_id or f"s{self.id}"
        self.allow = tuple(params.allow)
        self.deny = tuple(params.deny)
        self.dispatcher = params.dispatcher
        self.locked = params.lock
        self._visible = None
        self._context = CallContext(self.session_id, "", self.agent, self.directory, self.worktree, "")
        return self._attached(id_json)

    async def _attached(self, id_json: bytes) -> None:
        await self.project.ready()
        view = self.project.view()
        if self._seen is not None:
            self._seen = self.fingerprint()
        result = {
            "sessionId": self.session_id,
            "directory": self.directory,
            "root": str(self.project.root),
            "toolCount": len(self.visible()),
            "errors": view.errors,
            "blocked": view.blocked,
            "loading": view.loading,
        }
        self.send_result(id_json, _encode_report(result))

    def on_subscribe(self, id_json: bytes, raw: Any) -> None:
        self.subscribed = True
        if self._seen is None:
            self._seen = self.fingerprint()
        self.send_result(id_json, b"{}")

    async def on_reload(self, id_json: bytes, raw: Any) -> None:
        result = await self.server.registry.reload(self.project)
        self.send_result(id_json, _encode_report(result))

    def on_status(self, id_json: bytes, raw: Any) -> None:
        self.send_result(id_json, _encode_report(self.server.status()))

    def on_shutdown(self, id_json: bytes, raw: Any) -> None:
        self.send_result(id_json, _encode({"stopping": True, "pid": os.getpid()}))
        self.server.request_stop("atomic/shutdown")

    def info(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "pid": self.peer_pid,
            "agent": self.agent,
            "sessionId": self.session_id,
            "directory": self.directory,
            "inflight": len(self.calls),
        }


def _encode_report(value: Any) -> bytes:
    """A report (status, list, attach, reload, an error) as JSON. Its paths come from the file system,
    whose names need not be UTF-8: such a string is sent escaped rather than failing the answer."""
    try:
        return _encode(value)
    except UnicodeEncodeError:
        return _encode(escape_strings(value))


def _peer_closed(transport: Any) -> bool:
    """Whether the other end closed both directions (POLLHUP), not only its writing side.

    On Linux a Unix stream socket reports POLLHUP once the peer has closed, and only POLLIN (EOF)
    after a ``shutdown(SHUT_WR)``. Where that cannot be told, the connection counts as half-closed,
    and writing the answers is what finds out.
    """
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None:
        return False
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLOUT)
    return any(events & select.POLLHUP for _, events in poller.poll(0))


def _encode_cursor(offset: int) -> str:
    return base64.urlsafe_b64encode(f"o{offset}".encode()).decode()


def _decode_cursor(cursor: str) -> int | None:
    if len(cursor) > 64:  # far longer than any offset the daemon issues
        return None
    try:
        text = base64.urlsafe_b64decode(cursor.encode("ascii")).decode("ascii")
    except ValueError:  # not base64, not ASCII (UnicodeError is a ValueError)
        return None
    digits = text[1:]
    if not text.startswith("o") or not digits.isascii() or not digits.isdigit() or len(digits) > 18:
        return None
    return int(digits)


def _clip(text: str, limit: int = 80) -> str:
    """``text`` short enough to echo in an error message (a client's value can be megabytes)."""
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} characters)"


# Tokens of a JSON text, enough to walk its nesting: strings, punctuation, other scalars.
_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{}:,]|[^\s\[\]{}:,"]+', re.S)
_SCAN_BYTES = 1 << 18  # the envelope (jsonrpc, id, method) comes first; never walk megabytes for it
_SCAN_DEPTH = 64


def _scan_envelope(line: bytes) -> tuple[bytes, str | None, bool]:
    """For a line too deeply nested to decode: its id as JSON (``null`` when not found), the top-level
    key whose value is nested deepest (None when not reached), and whether it names a method."""
    depth = 0
    key: str | None = None
    id_json = b"null"
    method = False
    for match in _TOKEN.finditer(line, 0, _SCAN_BYTES):
        token = match.group()
        if token in (b"[", b"{"):
            depth += 1
            if depth > _SCAN_DEPTH:
                return id_json, key, method
        elif token in (b"]", b"}"):
            depth -= 1
        elif depth != 1 or token == b":":
            continue
        elif token == b",":
            key = None
        elif key is None:
            try:
                key = msgspec.json.decode(token, type=str)
            except (msgspec.DecodeError, msgspec.ValidationError):
                return id_json, None, method
        elif key == "id":
            try:
                value = msgspec.json.decode(token, type=int | str)
            except (msgspec.DecodeError, msgspec.ValidationError):
                continue
            id_json = _encode(value)
        elif key == "method":
            method = True
    return id_json, None, method


_HANDLERS: dict[str, Handler] = {
    "initialize": Session.on_initialize,
    "ping": Session.on_ping,
    "server/discover": Session.on_discover,
    "subscriptions/listen": Session.on_listen,
    "logging/setLevel": Session.on_set_level,
    "tools/list": Session.on_list,
    "tools/call": Session.on_call,
    "atomic/attach": Session.on_attach,
    "atomic/list": Session.on_atomic_list,
    "atomic/subscribe": Session.on_subscribe,
    "atomic/reload": Session.on_reload,
    "atomic/status": Session.on_status,
    "atomic/shutdown": Session.on_shutdown,
}
