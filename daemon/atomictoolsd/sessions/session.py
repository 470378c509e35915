"""One session: the JSON-RPC rules of a request, the MCP and ``atomic/*`` method handlers, what the
session sees, and the call path.

A ``Session`` knows no wire. Its transport hands it decoded messages (``handle_message``, or
``handle_request`` and ``handle_notification`` with the envelope already read) and it writes every
answer, notification and request of its own to the ``output.Output`` it was built with: the Unix
socket's ``connection.Connection``, or the HTTP transport's exchanges. It keeps the state of one
client: the project it is attached to (``atomic/attach`` chooses it; until then, the global and
built-in tools), its allow/deny globs, the revision its client speaks, its calls and requests in
flight. Each request is answered exactly once; an id still in flight is refused. A request goes to
the handler ``HANDLERS`` names for its method, or to one a component registered in the host's
``methods``.

What a session may list and call is resolved once per project view (``_visible_in``): the
allow/deny globs are matched then, not per call. A call starts on a callback path with no task per
call (``start_call`` → ``ModuleRunner.call``); its result arrives from the worker as ready-made JSON
and is spliced into the answer (``call_result``).

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
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import msgspec
from msgspec import UNSET, UnsetType

from atomictools._protocol import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    LOG_LEVELS,
    METHOD_NOT_FOUND,
)
from atomictoolsd import __version__
from atomictoolsd.config.command import shell_quote
from atomictoolsd.config.discovery import git_worktree_root, project_root
from atomictoolsd.config.suggest import unknown_tool
from atomictoolsd.protocol import CallContext, error_result
from atomictoolsd.registry.model import Project, ToolDef, View
from atomictoolsd.registry.trust import trust_command
from atomictoolsd.sessions import batches, dispatcher, revisions
from atomictoolsd.sessions.asking import Asking
from atomictoolsd.sessions.content import shape_result
from atomictoolsd.sessions.loose import NULL, keys_of, scalar, text_of
from atomictoolsd.sessions.messages import (
    AtomicListParams,
    AttachParams,
    CallMeta,
    CallParams,
    CancelledParams,
    InitializeParams,
    ListParams,
    Message,
    ParamsError,
    ReloadParams,
    SetLevelParams,
    clip,
    decode_globs,
    decode_params,
)
from atomictoolsd.sessions.output import Output, encode_error, encode_report

if TYPE_CHECKING:
    from atomictoolsd.config.settings import Config
    from atomictoolsd.pool.pool import WorkerPool
    from atomictoolsd.registry.projects import Registry

__all__ = ["LEVEL_RANK", "LOCKED_OUT", "Handler", "Session", "SessionHost", "encode_report"]

log = logging.getLogger("atomictoolsd.session")

_encode = msgspec.json.encode
_ids = itertools.count(1)

LEVEL_RANK = {level: rank for rank, level in enumerate(LOG_LEVELS)}

# A client this far behind on reading has stopped reading: its log and progress notifications are
# dropped (and counted, and the count told once it catches up) rather than held, so a tool that
# floods them cannot grow the daemon's memory. Answers and list_changed are never dropped: answers
# are bounded by the calls in flight (a client that does not read is no longer read), list_changed
# by the reloads.
_LOSSY_BACKLOG = 4 * 1024 * 1024
_LOSSY = frozenset({"notifications/message", "notifications/progress"})

# Params whose text holds this name may be a 2026-07-28 request's (_accept_stateless_meta reads their
# _meta); a search of the raw bytes, which copies nothing, spares that decode for every other request.
# A transport that has the message's text looks there itself, for less (``names_revision``).
_NAMES_A_REVISION = re.compile(re.escape(revisions.META_VERSION_BYTES)).search

# What a locked session (an agent's, through the shim, which relays every line) may not do: move
# to another project or allowlist, stop the daemon, or make launchers. The allowlist is what the
# agent is offered over MCP; it is no sandbox against an agent that also has a shell.
LOCKED_OUT = frozenset({"atomic/attach", "atomic/shutdown", "atomic/bridges/create", "atomic/bridges/remove"})

# A request handler: (session, request id as JSON, params) → None when it has answered, or an
# awaitable that answers. The params are raw (msgspec.Raw), absent (UNSET), or the method's params
# already decoded by a transport that made the request itself; ``decode_params`` takes each.
# Raising ParamsError answers -32602. Components add theirs to ``Server.methods``.
Handler = Callable[[Any, bytes, Any], "None | Awaitable[None]"]


class _WaitingCall:
    """A call waiting for its project's first scan, or for modules still loading; a cancel marks
    it, and it never starts."""

    __slots__ = ("cancelled",)

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True



# Clients (by the name they give at initialize or in a request's _meta, or the agent the shim attached
# as) that reject a tool schema with $defs/$ref or an untyped enum: they get the portable form of
# every schema (which every client accepts, so a name that matches by mistake loses nothing but the
# schema's form as written).
PORTABLE_ONLY_CLIENTS = ("gemini", "qwen")


def portable_only(*names: str) -> bool:
    """Whether any of ``names`` is a client that takes only portable schemas (PORTABLE_ONLY_CLIENTS)."""
    text = " ".join(names).lower()
    return any(name in text for name in PORTABLE_ONLY_CLIENTS)


class SessionHost(Protocol):
    """What a session uses of the daemon that accepted it (``server.lifecycle.Server``): the message
    size limit and the other settings, the components' ``methods``, the registry and the pool."""

    config: Config
    methods: dict[str, Handler]
    registry: Registry
    pool: WorkerPool

    def accept(self, session: Session, transport: asyncio.BaseTransport | None) -> bool: ...

    def forget(self, session: Session) -> None: ...

    def reserve_stdio(self, session: Session) -> str | None: ...

    def release_stdio(self, session: Session) -> None: ...

    def status(self) -> dict[str, Any]: ...

    def request_stop(self, reason: str) -> None: ...


class Session:
    """The state and the methods of one client's session."""

    HANDLERS: ClassVar[dict[str, Handler]] = {}  # the methods it answers itself (set below the class)

    def __init__(self, server: SessionHost, output: Output) -> None:
        self.server = server
        self.output = output  # where what it says goes (the socket's connection, HTTP's exchanges)
        self.id = next(_ids)
        self.closed = False
        self.peer_pid: int | None = None
        self.project: Project = server.registry.base
        self.directory = ""
        self.worktree = ""
        self.agent = ""
        self.session_id = ""
        self._allow: tuple[str, ...] = ()  # the allow and deny globs (properties below)
        self._deny: tuple[str, ...] = ()
        self.dispatcher = False  # also offer the meta-tools of atomictoolsd.sessions.dispatcher
        # The agent's name when it loads some tools dirs itself ("opencode": OpenCode's tool dirs),
        # whose tools this session is then not offered again (``ToolsDir.loaded_by``).
        self.loads_itself: str | None = None
        # The revision its client chose (sessions.revisions): at initialize, or named in a request's
        # _meta (2026-07-28); None until then (a raw client, which takes everything). ``protocol_version``,
        # ``stateless`` and ``batching`` mirror it for the hot path and for transports.
        self.revision: revisions.Revision | None = None
        self.protocol_version: str | None = None
        # The stateless revision (2026-07-28): every request names it in _meta, none needs initialize;
        # list changes go only to this session's subscriptions/listen requests (id as JSON → id).
        self.stateless = False
        self.batching = False  # JSON-RPC batches are taken (2025-03-26; see sessions.batches)
        self.listens: dict[bytes, Any] = {}
        self.locked = False  # attached with lock: LOCKED_OUT methods are refused from now on
        self.log_level = "info"
        self.dropped = 0  # log and progress notifications dropped since the client stopped reading
        self.calls: dict[bytes, Any] = {}  # calls in flight by their request id, as JSON
        self._tasks: set[asyncio.Task[None]] = set()
        self._pending: set[bytes] = set()  # ids of the requests a task answers (attach, reload, …)
        # Tool schemas with $defs/$ref inlined and enums typed, for agents that reject JSON Schema
        # 2020-12 as written (Gemini CLI, Qwen Code); other clients get each schema as its author wrote it.
        # This is the session's own client's: the agent it attached as, its initialize, or on a session
        # of its own that neither named, the first client a request's _meta names. A list whose request
        # names a client that takes only portable schemas gets them besides (_list): a stateless HTTP
        # session serves every client of its URL and attaches as "http", so there each request's own
        # name decides what it is sent, and no request's name changes what another's is.
        self.portable_schemas = False
        self._tool_shape: frozenset[str] = frozenset()  # tool fields this client's revision lacks
        self.call_log_levels: dict[bytes, str] = {}  # 2026-07-28: the level each call asked for in _meta
        # 2026-07-28: what each call's own request declared (_meta) it can be asked; over HTTP one session
        # serves every stateless client of a URL, so the last request's capabilities are not the call's.
        self.call_capabilities: dict[bytes, dict[str, Any]] = {}
        self.client_capabilities: dict[str, Any] = {}  # what the client declared at initialize
        self.asking = Asking(self)  # requests its tools sent this client (ctx.elicit, ctx.sample)
        self.initialized = False
        self.subscribed = False
        # What this session may list and call in the project's current view, its allow/deny globs
        # applied once per view and lists (not per call): (view, tools by name, tools in name
        # order). Setting ``allow`` or ``deny`` forgets it.
        self._visible: _VisibleTools = _NOTHING_VISIBLE
        # Tools of yours or built-in that answer for a project's blocked module of the same name, and
        # the note an error of theirs gets (``_stood_in``): the caller meant the project's.
        self._stood_in: dict[str, str] = {}
        self._shown_fingerprint: int | None = None  # of the toolset this client was last shown
        # What every call of this session tells its tool (ctx); message and tool-use ids vary per call.
        self._context = CallContext()

    def close(self) -> None:
        """Its wire has closed: nobody is left to read an answer, so its calls and tasks stop. Once:
        its project is released once."""
        if self.closed:
            return
        self.closed = True
        calls, self.calls = self.calls, {}
        for call in calls.values():
            call.cancel()
        for task in self._tasks:
            task.cancel()
        self.server.registry.release(self.project)
        self.server.forget(self)

    # -- reading: one decoded message -------------------------------------------------------------

    def handle_message(self, message: Message, names_revision: bool | None = None) -> None:
        """One JSON-RPC message as its transport decoded it: a request, a notification, or the
        client's response to a request of the daemon's (a tool's question). ``names_revision``:
        whether the message's text holds ``revisions.META_VERSION``, when its transport looked."""
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
        else:
            self.handle_request(_encode(message.id), method, message.params, names_revision)

    def handle_request(self, id_json: bytes, method: str, params: Any, names_revision: bool | None = None) -> None:
        """Request ``id_json`` (its id as JSON), answered once: refused here, or by its handler.
        ``params``: raw, absent (``UNSET``), or the method's params already decoded (``Handler``);
        ``names_revision`` as ``handle_message`` takes it (None: the session looks in ``params``)."""
        if names_revision is None:
            names_revision = type(params) is msgspec.Raw and _NAMES_A_REVISION(params) is not None
        if names_revision:
            if not self._accept_stateless_meta(id_json, method, params):
                return
        elif self.stateless and not method.startswith("atomic/"):
            # 2026-07-28 has no session state to fall back on: each request names its revision.
            self.send_error(id_json, INVALID_PARAMS, revisions.missing_meta([revisions.META_VERSION, revisions.META_CAPABILITIES]))
            return
        if id_json in self.calls or id_json in self._pending or id_json in self.listens:  # in_flight, inline
            # Answers and cancels are matched by id: a second request with the id of one in flight
            # would make both ambiguous, so it is refused and the first one stands.
            self.send_error(id_json, INVALID_REQUEST, batches.reused(id_json))
            return
        if self.locked and method in LOCKED_OUT:
            self.send_error(
                id_json, INVALID_REQUEST,
                f"{method} is not available: this session is locked to the project and tools it attached with",
            )
            return
        handler = self.HANDLERS.get(method) or self.server.methods.get(method)
        if handler is None:
            self.send_error(id_json, METHOD_NOT_FOUND, f"Method not found: {clip(method)}")
            return
        try:
            outcome = handler(self, id_json, params)
        except Exception as exc:
            self._handler_failed(method, id_json, exc)
            return
        if outcome is not None:
            self._spawn(outcome, id_json)

    def in_flight(self, id_json: bytes) -> bool:
        """Whether the request ``id_json`` has been read and not yet answered."""
        return id_json in self.calls or id_json in self._pending or id_json in self.listens

    def busy(self) -> bool:
        """Whether a call or a request a task answers is still in flight (a listen is not)."""
        return bool(self.calls or self._pending)

    def _handler_failed(self, method: str, id_json: bytes, exc: Exception) -> None:
        """Answer a request whose handler raised, and keep the session serving (as _spawn does)."""
        if isinstance(exc, ParamsError):
            self.send_error(id_json, INVALID_PARAMS, str(exc))
        elif isinstance(exc, UnicodeDecodeError):  # a handler decoding its params found a string that is not UTF-8
            self.send_error(id_json, INVALID_PARAMS, "Invalid params: a string in them is not UTF-8")
        else:
            log.exception("request %s failed", method, exc_info=exc)
            self.send_error(id_json, INTERNAL_ERROR, f"Internal error: {type(exc).__name__}: {exc}")

    def _spawn(self, coroutine: Awaitable[None], id_json: bytes) -> None:
        async def run() -> None:
            try:
                await coroutine
            except ParamsError as exc:
                self.send_error(id_json, INVALID_PARAMS, str(exc))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # answer, and keep the session serving
                log.exception("request failed")
                self.send_error(id_json, INTERNAL_ERROR, f"Internal error: {type(exc).__name__}: {exc}")
            finally:
                # In the step that answered, not in a done callback a loop turn later: the client
                # may reuse the id as soon as it reads the answer.
                self._pending.discard(id_json)
                self.output.ended(id_json)

        task = asyncio.get_running_loop().create_task(run())
        self._tasks.add(task)
        self._pending.add(id_json)
        task.add_done_callback(self._tasks.discard)

    # -- writing: through the output ------------------------------------------------------------

    def send_result(self, id_json: bytes, result: bytes) -> None:
        if self.stateless:
            result = revisions.with_result_type(result)
        self.output.result(id_json, result)

    def send_error(self, id_json: bytes, code: int, message: str, data: Any = None) -> None:
        self.output.error(id_json, encode_error(code, message, data))

    def send_request(self, id_json: bytes, method: str, params: bytes, about: bytes | None = None) -> bool:
        """Send the client a request of the daemon's own (a tool's question, ``about`` its call's
        request); False when it is gone."""
        return self.output.request(id_json, method, params, about)

    def send_notification(self, method: str, params: dict[str, Any] | None = None, about: bytes | None = None) -> None:
        if self.stateless and method == "notifications/tools/list_changed":
            for id_json, request_id in list(self.listens.items()):
                self.output.notification(method, _encode({"jsonrpc": "2.0", "method": method, "params": {
                    "_meta": {revisions.SUBSCRIPTION_ID: request_id}}}), id_json)
            return
        if self.behind(method):
            return
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        self.output.notification(method, encode_report(message), about)

    def behind(self, method: str) -> bool:
        """Whether notification ``method`` is a log or progress notification for a client that has
        stopped reading: then it is dropped, and counted."""
        if method in _LOSSY and self.output.backlog() > _LOSSY_BACKLOG:
            self.dropped += 1
            return True
        return False

    def log_message(self, level: str, data: Any, logger: str = "atomictoolsd", about: bytes | None = None) -> None:
        """Send ``notifications/message`` when ``level`` passes this client's level (never to a
        2026-07-28 client: it is sent only the logs of a call that asked, see ``call_log``)."""
        if not self.stateless and LEVEL_RANK.get(level, 0) >= LEVEL_RANK[self.log_level]:
            self.send_notification("notifications/message", {"level": level, "logger": logger, "data": data}, about)

    # -- what this session sees -------------------------------------------------------------------

    @property
    def allow(self) -> tuple[str, ...]:
        """Globs of the tools this session may see (empty: every tool), before ``deny``."""
        return self._allow

    @allow.setter
    def allow(self, globs: tuple[str, ...]) -> None:
        self._allow = globs
        self._visible = _NOTHING_VISIBLE

    @property
    def deny(self) -> tuple[str, ...]:
        """Globs of the tools this session may not see."""
        return self._deny

    @deny.setter
    def deny(self, globs: tuple[str, ...]) -> None:
        self._deny = globs
        self._visible = _NOTHING_VISIBLE

    def allowed(self, name: str) -> bool:
        if self.allow and not any(fnmatch.fnmatchcase(name, g) for g in self.allow):
            return False
        return not any(fnmatch.fnmatchcase(name, g) for g in self.deny)

    def visible(self) -> list[ToolDef]:
        """The tools this session may list and call, in name order."""
        view = self.project.view()
        visible = self._visible
        if visible[0] is not view:
            visible = self._visible_in(view)
        return visible[2]

    def _visible_in(self, view: View) -> _VisibleTools:
        """What this session may list and call in ``view``: its allow/deny globs are matched here,
        once per view, so a call looks its tool up in a dict and matches no glob."""
        own = self.loads_itself
        if self._allow or self._deny or own is not None:
            tools = {
                name: tool for name, tool in view.tools.items()
                if self.allowed(name) and (own is None or tool.module.tools_dir.loaded_by != own)
            }
        else:
            tools = view.tools
        visible = self._visible = (view, tools, list(tools.values()))
        self._stood_in = _stood_in(view, tools) if view.blocked else {}
        return visible

    def _loads_itself(self, *names: str) -> None:
        """Note whether the client is an agent that loads some tools dirs itself (OpenCode)."""
        own = "opencode" if any("opencode" in name.lower() for name in names) else None
        if own != self.loads_itself:
            self.loads_itself = own
            self._visible = _NOTHING_VISIBLE

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
        changed = self._shown_fingerprint is not None and current != self._shown_fingerprint
        self._shown_fingerprint = current
        return changed

    def wants_notifications(self) -> bool:
        if self.stateless:
            return bool(self.listens)  # 2026-07-28: nothing free-floating, only what a listen asked for
        return self.initialized or self.subscribed

    # -- notifications from the client -------------------------------------------------------------

    def handle_notification(self, method: str, raw: msgspec.Raw | UnsetType) -> None:
        if method == "notifications/initialized":
            self.initialized = True
            if self._shown_fingerprint is None and self.project.is_ready():  # else its first listing sets it
                self._shown_fingerprint = self.fingerprint()
        elif method == "notifications/cancelled":
            try:
                params = decode_params(raw, CancelledParams)
            except ParamsError:
                return  # notifications get no answer, not even an error
            self.cancel(_encode(params.requestId))

    def cancel(self, id_json: bytes) -> None:
        """The client cancelled request ``id_json``: a call stops, a subscription ends, and neither
        is answered."""
        if self.listens.pop(id_json, None) is not None:
            self.output.ended(id_json)
            return
        call = self.calls.pop(id_json, None)
        if self.call_log_levels:
            self.call_log_levels.pop(id_json, None)
        if self.call_capabilities:
            self.call_capabilities.pop(id_json, None)
        if call is not None:
            call.cancel()
            self.asking.call_ended(call)
            self.output.ended(id_json)

    # -- requests -------------------------------------------------------------------------------

    def on_initialize(self, id_json: bytes, raw: Any) -> None:
        params = decode_params(raw, InitializeParams)
        version = params.protocolVersion
        revision = self.adopt(revisions.negotiate(version))
        self.client_capabilities = params.capabilities
        client = text_of(params.clientInfo.get("name"))
        if not self.agent:
            self.agent = client
            self._context = msgspec.structs.replace(self._context, agent=self.agent)
        self.portable_schemas = portable_only(self.agent, client)
        self._loads_itself(self.agent, client)
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
        self.stateless = revision.stateless
        self.batching = revision.batches
        self._tool_shape = revision.tool_fields_dropped
        return revision

    def _accept_stateless_meta(self, id_json: bytes, method: str, raw: Any) -> bool:
        """Take a request's 2026-07-28 ``_meta`` (revision, capabilities, client); False when it was
        refused: a key missing or malformed (-32602 naming it), a revision not spoken (-32022 naming
        the ones that are), a method the revision removed (-32601 saying what replaced it)."""
        try:
            meta = decode_params(raw, revisions.RequestMeta).meta
        except ParamsError as exc:
            self.send_error(id_json, INVALID_PARAMS, str(exc))
            return False
        if revisions.META_VERSION not in meta:
            if not self.stateless:
                return True  # the key's name in an argument, not in _meta: an ordinary request
            self.send_error(id_json, INVALID_PARAMS, revisions.missing_meta([revisions.META_VERSION]))
            return False
        version = scalar(meta[revisions.META_VERSION])
        if not isinstance(version, str):
            self.send_error(id_json, INVALID_PARAMS, f"Invalid params: _meta[{revisions.META_VERSION!r}] must be a string such as {revisions.STATELESS[-1]!r}")
            return False
        if version not in revisions.STATELESS:
            self.send_error(
                id_json, revisions.UNSUPPORTED_VERSION,
                f"Unsupported protocol version {clip(str(version))!r}: this server speaks {', '.join(revisions.ALL)} "
                f"({', '.join(revisions.REVISIONS)} through initialize)",
                {"supported": list(revisions.ALL), "requested": str(version)},
            )
            return False
        capabilities = keys_of(meta.get(revisions.META_CAPABILITIES))
        if capabilities is None:
            self.send_error(id_json, INVALID_PARAMS, revisions.missing_meta([revisions.META_CAPABILITIES]))
            return False
        removed = revisions.REMOVED.get(method)
        if removed is not None:
            self.send_error(id_json, METHOD_NOT_FOUND, f"{method} is not part of MCP {version}: {removed}")
            return False
        if not self.stateless:
            self.adopt(revisions.STATELESS_REVISION)
        self.client_capabilities = capabilities
        if not self.agent:  # never on a shared session: HTTP attaches every session as "http"
            client = revisions.client_name(meta)
            if client:
                self.agent = client
                self._context = msgspec.structs.replace(self._context, agent=self.agent)
                self.portable_schemas = portable_only(client)
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
        asked = params.notifications.get("toolsListChanged", NULL)
        honored = {"toolsListChanged": True} if scalar(asked) is True or keys_of(asked) is not None else {}
        request_id = self.output.request_id(id_json)
        if honored:
            self.listens[id_json] = request_id
            if self._shown_fingerprint is None:
                self._shown_fingerprint = self.fingerprint()
        acknowledged = "notifications/subscriptions/acknowledged"
        self.output.notification(acknowledged, _encode({"jsonrpc": "2.0", "method": acknowledged, "params": {
            "_meta": {revisions.SUBSCRIPTION_ID: request_id}, "notifications": honored}}), id_json)
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
                f" {offer['agentMessage']}."
            )
        return instructions

    def on_ping(self, id_json: bytes, raw: Any) -> None:
        self.send_result(id_json, b"{}")

    def on_set_level(self, id_json: bytes, raw: Any) -> None:
        params = decode_params(raw, SetLevelParams)
        if params.level not in LEVEL_RANK:
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
                raise ParamsError(f"Invalid params: unknown cursor {clip(params.cursor)!r}; list again without one")
        page = tools[start : start + size]
        written = not (self.portable_schemas or portable_only(revisions.client_name(keys_of(params.meta))))
        dropped = self._tool_shape
        body = b'{"tools":[' + b",".join(
            t.encoded_for(dropped, written) if hasattr(t, "encoded_for") else t.encoded for t in page
        ) + b"]"
        if start + size < len(tools):
            body += b',"nextCursor":' + _encode(_encode_cursor(start + size))
        if self.stateless:  # 2026-07-28: cache hints; tools change with their files, so no caching
            body += b',"ttlMs":0,"cacheScope":"private"'
        loading = self.project.view().loading
        if loading:  # their tools come with list_changed once they have loaded
            body += b',"_meta":' + _encode({"atomic/loading": loading})
        self.send_result(id_json, body + b"}")
        if start == 0:
            self._shown_fingerprint = self.fingerprint()

    def start_call(self, id_json: bytes, params: Any, waited: bool = False) -> Awaitable[None] | None:
        """``tools/call``, its handler: ``params`` raw, or a ``CallParams`` (a socket line holding a
        call comes decoded whole, ``Connection.handle_line``). Raises ``ParamsError`` for params that
        do not fit, and for a retry it refuses.

        The hot path: no closures, no tasks, as few Python calls as it takes (pinned to one core with
        its client and the worker, each costs several times what it does in a tight loop); the
        call reports back through ``call_result()``. ``waited``: the modules still loading when it
        first came have loaded since (``_call_when_loaded``).
        """
        if type(params) is not CallParams:
            params = decode_params(params, CallParams)
        if params.requestState is not UNSET:  # the retry of a call answered input_required
            name = None if self.dispatcher and params.name in dispatcher.META_NAMES else params.name
            responses = params.inputResponses if params.inputResponses is not UNSET else None
            capabilities = keys_of(params.meta.capabilities) if params.meta is not UNSET else None
            why = self.asking.resume(id_json, name, params.requestState, responses, capabilities or {})
            if why is not None:
                raise ParamsError(why)
            return None
        project = self.project
        if not (project.scanned or project.is_ready()):
            # Registered now, in message order, so that a cancel right behind it finds it.
            waiting = self.calls[id_json] = _WaitingCall()
            return self._call_when_ready(id_json, params, waiting)
        name = params.name
        arguments = params.arguments
        if self.dispatcher and name in dispatcher.META_NAMES:
            raw_arguments = b"{}" if arguments is UNSET else bytes(arguments)
            inner = dispatcher.handle(self, id_json, name, raw_arguments)
            if inner is None:
                return None
            name, arguments = inner[0], msgspec.Raw(inner[1])
        view = project.built or project.view()
        visible = self._visible
        if visible[0] is not view:
            visible = self._visible_in(view)
        tool = visible[1].get(name)
        if tool is None:
            self._not_callable(id_json, name, arguments, params.meta, waited)
            return None
        if tool.needs_trusted_directory is not None and self._refused_here(id_json, tool):
            return None
        timeout = tool.timeout or self.server.config.call_timeout
        context = self._context
        token = None
        meta = params.meta
        if meta is not UNSET:
            timeout = _asked_timeout(scalar(meta.timeout), timeout, self.server.config.max_call_timeout)
            token = scalar(meta.progressToken)
            if self.stateless:
                log_level = scalar(meta.log_level)
                if isinstance(log_level, str) and log_level in LEVEL_RANK:
                    self.call_log_levels[id_json] = log_level
                self.call_capabilities[id_json] = keys_of(meta.capabilities) or {}
            message_id = scalar(meta.message_id)
            tool_use_id = scalar(meta.tool_use_id) or scalar(meta.claude_tool_use_id)
            if message_id or tool_use_id:
                context = msgspec.structs.replace(
                    context, message_id=str(message_id or ""), tool_use_id=str(tool_use_id or "")
                )
        arguments = b"{}" if arguments is UNSET else bytes(arguments)
        if arguments == b"null":
            arguments = b"{}"
        self.calls[id_json] = tool.module.runner.call(name, arguments, context, timeout, self, id_json, token)
        return None

    async def _call_when_ready(self, id_json: bytes, params: CallParams, waiting: _WaitingCall) -> None:
        await self.project.ready()
        if waiting.cancelled or self.calls.get(id_json) is not waiting:
            return  # cancelled while its project loaded: never answered
        del self.calls[id_json]  # start_call registers the call it starts; one it answers at once is not in flight
        outcome = self.start_call(id_json, params)
        if outcome is not None:
            await outcome

    async def _call_when_loaded(
        self, id_json: bytes, params: CallParams, waiting: _WaitingCall, loads: list[asyncio.Future[None]]
    ) -> None:
        config = self.server.config
        timeout = config.call_timeout
        if params.meta is not UNSET:
            timeout = _asked_timeout(scalar(params.meta.timeout), timeout, config.max_call_timeout)
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
        outcome = self.start_call(id_json, params, waited=True)
        if outcome is not None:  # attached meanwhile to a project whose first scan is under way
            await outcome

    def _not_callable(
        self, id_json: bytes, name: str, arguments: msgspec.Raw | UnsetType, meta: CallMeta | UnsetType, waited: bool
    ) -> None:
        """A call to a tool this session does not see: wait for the modules still loading (one may
        define it), or answer that it is unknown, or not allowed here."""
        view = self.project.view()
        if name in view.tools:
            self.send_error(id_json, INVALID_PARAMS, f"Tool {name!r} is not allowed in this session", {"name": name})
            return
        if not waited:
            loads = self.project.loads_under_way()
            if loads:  # a module still loading may define it: wait for them, then look again
                waiting = self.calls[id_json] = _WaitingCall()
                self._spawn(self._call_when_loaded(id_json, CallParams(name, arguments, meta), waiting, loads), id_json)
                return
        message, data = unknown_tool(name, [t.name for t in self.visible()], view.errors, view.blocked, view.held)
        self.send_error(id_json, INVALID_PARAMS, message, data)

    def _refused_here(self, id_json: bytes, tool: ToolDef) -> bool:
        """Refuse a call of ``tool``, which runs a program that may run what a directory holds
        (``.git/config``, a Makefile) in a directory relative to the caller's, unless the user
        trusts that directory with all their rights (``Registry.untrusted_root``) or the tool runs
        confined: nothing of a repository runs before its user trusted it. True when it answered."""
        if tool.module.confined:
            return False
        registry = self.server.registry
        assert tool.needs_trusted_directory is not None
        directory = Path(self.directory or registry.home) / tool.needs_trusted_directory
        untrusted = registry.untrusted_root(directory)
        if untrusted is None:
            return False
        root, level = untrusted
        how = ("trusted only with --sandbox (its own tools run confined; this one would not)" if level == "sandbox"
               else "not trusted")
        try:
            enclosing = project_root(root, registry.home)
        except (OSError, RuntimeError):  # a symlink loop: no project to name
            enclosing = root
        if enclosing != root:  # a repository inside a project: `trust` of it would trust the project
            how += (f" (a repository inside the project {enclosing}, whose trust does not cover it: to trust it on its "
                    f"own, it needs an .atomic directory of its own, mkdir {shell_quote(str(root / '.atomic'))})")
        if level == "unjudged":
            self.send_result(id_json, error_result(
                f"Tool {tool.name!r} did not run: it runs a program in {os.path.normpath(directory)}, in the repository "
                f"{root}, whose submodules cannot all be known (an index too large or unreadable, or more repositories "
                f"than are judged), so what git would run in them cannot be judged. The user can run the command in a "
                f"terminal."))
            return True
        text = (
            f"Tool {tool.name!r} did not run: it runs a program in {os.path.normpath(directory)}, and {root} is {how}. "
            f"A program may run what a directory holds (git the programs .git/config names, make its Makefile, "
            f"npm its package.json scripts), so a {tool.module.scope} tool that runs one there ({tool.module.path}) "
            f"runs only once the user trusts {root} with all their rights. Only the user can trust it (`trust` "
            f"needs their terminal): ask the user whether to run {trust_command(root)}."
        )
        self.send_result(id_json, error_result(text))
        return True

    # CallOwner: what a call started by this session produces

    def call_result(self, call: Any, result: bytes) -> None:
        request_id = call.request_id
        calls = self.calls
        other = calls.pop(request_id, None)
        if other is not call and other is not None:
            calls[request_id] = other  # a later request of the same id (this call was cancelled): still in flight
        if self.call_log_levels:
            self.call_log_levels.pop(request_id, None)
        if self.call_capabilities:
            self.call_capabilities.pop(request_id, None)
        # A call holds a question at its client (Call.asking) for as long as one waits for an answer
        # or a retry: one that holds none has nothing for call_ended to clear.
        if call.asking and self.asking.call_ended(call):
            self.output.ended(request_id)
            return  # its request was answered input_required; the client did not come back
        if self._stood_in and call.tool in self._stood_in and result.find(b'"isError":true') >= 0:
            result = _with_note(result, self._stood_in[call.tool])
        revision = self.revision
        if revision is not None and not revision.full_results:
            result = shape_result(result, revision)
        if self.stateless:  # send_result's, without its call: the call path
            result = revisions.with_result_type(result)
        self.output.result(request_id, result)

    def call_progress(self, call: Any, progress: float, total: float | None, message: str | None) -> None:
        payload: dict[str, Any] = {"progressToken": call.progress_token, "progress": progress}
        if total is not None:
            payload["total"] = total
        if message is not None and (self.revision is None or self.revision.progress_message):
            payload["message"] = message
        self.send_notification("notifications/progress", payload, call.request_id)

    def call_log(self, call: Any, level: str, data: bytes) -> None:
        if self.stateless:  # 2026-07-28: only a call that asked for a level in its _meta is sent its logs
            wanted = self.call_log_levels.get(call.request_id)
            if wanted is not None and LEVEL_RANK.get(level, 0) >= LEVEL_RANK[wanted]:
                self.send_notification("notifications/message", {"level": level, "logger": call.tool, "data": msgspec.Raw(data)},
                                       call.request_id)
            return
        self.log_message(level, msgspec.Raw(data), call.tool, call.request_id)

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
            "network": self.project.network(),
            "tools": [t.listing() for t in tools],
            "counts": counts,
            "errors": view.errors,
            "blocked": view.blocked,
            "loading": view.loading,
            "held": view.held,
        }
        environment = self.server.registry.project_environment(self.project)
        if environment is not None:
            result["environment"] = environment
        if params.all:
            result["shadowed"] = [
                tool.listing(shadowed_by=winner)
                for tool, winner in view.shadowed
                if self.allowed(tool.name)
            ]
        self.send_result(id_json, encode_report(result))

    def on_attach(self, id_json: bytes, raw: Any) -> Awaitable[None]:
        return self._answer_report(id_json, self.attach(decode_params(raw, AttachParams)))

    def attach(self, params: AttachParams) -> Awaitable[dict[str, Any]]:
        """Attach to ``params.directory``'s project; what the attach reports, once the project's
        first scan is done (raises ``ParamsError`` for a directory it cannot attach to).

        Everything but the wait happens before the next message is read: the stdio shim sends its
        attach and the agent's first requests back to back, and those must see the attached project.
        """
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
        self.portable_schemas = self.portable_schemas or portable_only(self.agent)
        self._loads_itself(self.agent)
        self.session_id = params.sessionId or self.session_id or f"s{self.id}"
        self.allow = decode_globs(params.allow, "allow")
        self.deny = decode_globs(params.deny, "deny")
        self.dispatcher = params.dispatcher
        self.locked = params.lock
        self._visible = _NOTHING_VISIBLE
        self._context = CallContext(self.session_id, "", self.agent, self.directory, self.worktree, "")
        return self._attached()

    async def _attached(self) -> dict[str, Any]:
        await self.project.ready()
        view = self.project.view()
        if self._shown_fingerprint is not None:
            self._shown_fingerprint = self.fingerprint()
        result = {
            "sessionId": self.session_id,
            "directory": self.directory,
            "root": str(self.project.root),
            "toolCount": len(self.visible()),
            "errors": view.errors,
            "blocked": view.blocked,
            "loading": view.loading,
            "held": view.held,
        }
        return result

    def on_subscribe(self, id_json: bytes, raw: Any) -> None:
        self.subscribed = True
        if self._shown_fingerprint is None:
            self._shown_fingerprint = self.fingerprint()
        self.send_result(id_json, b"{}")

    def on_reload(self, id_json: bytes, raw: Any) -> Awaitable[None]:
        params = decode_params(raw, ReloadParams)
        registry = self.server.registry
        if params.module is None:
            return self._answer_report(id_json, registry.reload(self.project, force=params.force))
        modules = registry.find_modules(self.project, params.module)
        if not modules:
            known = sorted(Path(m.path).name for d in self.project.dirs if d.scope != "builtin" for m in d.modules.values())
            raise ParamsError(
                f"Invalid params: no tool module of {self.project.root or 'the global tools'} is {params.module!r} "
                f"(a module's path, its file's name or stem, or a tool it defines); its modules: {', '.join(known) or 'none'}"
            )
        return self._answer_report(id_json, registry.reload_modules(self.project, modules))

    async def _answer_report(self, id_json: bytes, report: Awaitable[dict[str, Any]]) -> None:
        self.send_result(id_json, encode_report(await report))

    def on_status(self, id_json: bytes, raw: Any) -> None:
        self.send_result(id_json, encode_report(self.server.status()))

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


_VisibleTools = tuple["View | None", dict[str, ToolDef], list[ToolDef]]
_NOTHING_VISIBLE: _VisibleTools = (None, {}, [])


def _stood_in(view: View, tools: dict[str, ToolDef]) -> dict[str, str]:
    """The global and built-in tools named as a blocked module of the project is (``greet`` for
    ``greet.py``, or ``greet_*``): a call to one was most likely meant for the project's tool, which
    does not run. Each with the note its error result gets, saying which tool answered and why."""
    notes: dict[str, str] = {}
    for entry in view.blocked:
        stem = os.path.splitext(os.path.basename(entry["file"]))[0]
        why = entry.get("reason") or "its project is not trusted"
        for name, tool in tools.items():
            if tool.module.scope != "local" and (name == stem or name.startswith(stem + "_")):
                notes[name] = (
                    f"Note: this answer came from the {tool.module.scope} tool {name!r} ({tool.module.path}), "
                    f"not from the project's {entry['file']}, which is blocked: {why}. The project's tool of "
                    f"this name does not run until the user trusts it."
                )
    return notes


def _with_note(result: bytes, note: str) -> bytes:
    """``result`` (a tool's error result) with ``note`` as a last text block."""
    try:
        value = msgspec.json.decode(result)
        value["content"] = [*value.get("content", []), {"type": "text", "text": note}]
    except (msgspec.DecodeError, AttributeError, TypeError):
        return result
    return _encode(value)


def _asked_timeout(asked: Any, timeout: float, most: float) -> float:
    """The timeout a call's ``_meta["atomic/timeout"]`` asks for (seconds, at most ``most``), or
    ``timeout`` when it asks for none or for something that is not a positive number."""
    if isinstance(asked, (int, float)) and not isinstance(asked, bool) and asked > 0:
        return min(float(asked), most)
    return timeout


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


Session.HANDLERS = {
    "initialize": Session.on_initialize,
    "ping": Session.on_ping,
    "server/discover": Session.on_discover,
    "subscriptions/listen": Session.on_listen,
    "logging/setLevel": Session.on_set_level,
    "tools/list": Session.on_list,
    "tools/call": Session.start_call,
    "atomic/attach": Session.on_attach,
    "atomic/list": Session.on_atomic_list,
    "atomic/subscribe": Session.on_subscribe,
    "atomic/reload": Session.on_reload,
    "atomic/status": Session.on_status,
    "atomic/shutdown": Session.on_shutdown,
}
