"""MCP's Streamable HTTP, served by the daemon itself: one endpoint, ``/mcp``, on loopback.

The HTTP layer only carries JSON-RPC: every message is handed to a ``Session`` (the same class the
Unix socket uses), so methods, revisions, allow/deny and trust are the socket's. What this module
owns is what HTTP adds:

- **Who may ask.** Every request must carry ``Authorization: Bearer <token>``; the token is made by
  the daemon, kept in a 0600 file in its runtime dir (``http-token``), compared in constant time and
  rotatable (``atomictoolsd http token --rotate``). ``Host`` and ``Origin`` must name this server
  (loopback, or the address the user bound explicitly), which defeats DNS rebinding: a page whose
  name resolves to 127.0.0.1 sends its own name. A refused request runs nothing.
- **Sessions.** ``initialize`` makes a stateful session (``Mcp-Session-Id``); its POSTs are answered
  as JSON, or as an SSE stream once a notification or a question of the tool's comes before the
  answer; GET opens its stream for list changes; DELETE ends it. A request without a session id is
  stateless (the 2026-07-28 revision): it is served by a session kept per URL, whose state is only
  what the URL chose.
- **Routing.** Each request gets an id of the daemon's own (``"h<n>"``) before the session sees it,
  so two clients' ids never collide and each answer finds its HTTP exchange by a dict lookup; the
  client's id is put back in the answer.
- **The project.** The URL picks it as the shim's ``--directory`` does:
  ``/mcp?directory=/abs/path&allow=glob&deny=glob&dispatcher=1``; the session is locked to it.

The server is uvicorn (httptools' parser) with a raw ASGI app, in the daemon's own event loop; it is
imported only when HTTP is on (see ``HttpTransport.start``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import itertools
import logging
import os
import secrets
import socket
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import parse_qs, urlsplit

import msgspec
from msgspec import UNSET, UnsetType

from atomictools._protocol import INVALID_REQUEST, PARSE_ERROR
from atomictoolsd.config.errors import SetupError
from atomictoolsd.config.statefile import write_atomic
from atomictoolsd.sessions.revisions import ALL as REVISIONS
from atomictoolsd.sessions.revisions import META_VERSION, META_VERSION_BYTES, UNSUPPORTED_VERSION, with_result_type
from atomictoolsd.sessions.session import Session, SessionHost
from atomictoolsd.workers.periodic import Periodic

__all__ = ["TOKEN_NAME", "HttpTransport", "parse_address", "read_token"]

log = logging.getLogger("atomictoolsd.http")

TOKEN_NAME = "http-token"
ENDPOINT = "/mcp"
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
_WILDCARDS = frozenset({"0.0.0.0", "::", "*"})
# A session nobody has used for this long, with no stream open, is ended (a client that vanished
# without DELETE); its id then answers 404 and the client starts a new one, as the spec says.
SESSION_IDLE = 1800.0
_SWEEP_EVERY = 60.0
# How late an answer may be before a task starts watching for its client to go away (see _answer).
_WATCH_AFTER = 0.02
_SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
_JSON = b"application/json"

HEADER_MISMATCH = -32020  # 2026-07-28: a routing header that disagrees with the body

_encode = msgspec.json.encode
_ids = itertools.count(1)


class AddressError(SetupError, ValueError):
    """The ``http`` setting names no usable address; the message says what to write."""


def parse_address(value: str) -> tuple[str, int]:
    """``PORT``, ``HOST:PORT`` or ``[IPv6]:PORT`` → (host, port); a bare port is loopback.

    Raises:
        AddressError: not one of those forms, or the port is out of range.
    """
    text = value.strip()
    host = "127.0.0.1"
    if text.startswith("["):
        end = text.find("]")
        if end < 0 or text[end + 1 : end + 2] != ":":
            raise AddressError(f"http address {value!r}: write [IPv6]:PORT, e.g. [::1]:8765")
        host, text = text[1:end], text[end + 2 :]
    elif ":" in text:
        host, _, text = text.rpartition(":")
    try:
        port = int(text)
    except ValueError:
        raise AddressError(f"http address {value!r}: write PORT or HOST:PORT, e.g. 8765 or 127.0.0.1:8765") from None
    if not 0 <= port <= 65535 or not host:
        raise AddressError(f"http address {value!r}: the port must be 0-65535 (0: any free port) and the host not empty")
    if host in _WILDCARDS:
        # Every interface at once: no one name for the Host check to accept, so every request would
        # be refused; and a user opening the port beyond loopback names the one address meant.
        raise AddressError(
            f"http address {value!r}: name one address of this machine (e.g. 192.168.1.5:8765), not every "
            f"interface; a bare port serves loopback"
        )
    return host, port


def read_token(path: Path) -> str | None:
    """The token in ``path`` when it is ours and private; None when it is missing or unsafe."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fh.fileno())
        if info.st_uid != os.geteuid() or info.st_mode & 0o077:
            return None  # readable by others: not a secret any more, make a new one
        token = fh.read(4096).decode("ascii", "replace").strip()
    return token if len(token) >= 32 else None


def new_token(path: Path) -> str:
    token = secrets.token_urlsafe(32)
    write_atomic(path, token.encode() + b"\n", 0o600)
    return token


class HttpHost(SessionHost, Protocol):
    """What the HTTP transport uses of the daemon beyond a session's needs."""

    paths: Any  # runtime_dir: where the token lives


class _Envelope(msgspec.Struct):
    jsonrpc: Any = None
    id: msgspec.Raw | UnsetType = UNSET
    method: str | UnsetType = UNSET
    params: msgspec.Raw | UnsetType = UNSET
    result: msgspec.Raw | UnsetType = UNSET
    error: msgspec.Raw | UnsetType = UNSET


class _Name(msgspec.Struct):
    name: Any = None
    meta: dict[str, Any] = msgspec.field(default_factory=dict, name="_meta")


class _Cancelled(msgspec.Struct):
    requestId: int | str  # noqa: N815 - the wire name


class _Exchange:
    """One POST waiting for its answer: the messages for it, in order, the last one the answer."""

    __slots__ = ("client_id", "done", "items", "method", "waiter")

    def __init__(self, client_id: bytes, method: str) -> None:
        self.client_id = client_id
        self.method = method
        self.items: list[bytes] = []
        self.done = False
        self.waiter: asyncio.Future[None] | None = None

    def push(self, message: bytes, final: bool = False) -> None:
        self.items.append(message)
        self.done = self.done or final
        self.wake()

    def wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait(self) -> None:
        """Until a message comes, or ``wake`` (the client went away)."""
        if self.items or self.done:
            return
        self.waiter = asyncio.get_running_loop().create_future()
        try:
            await self.waiter
        finally:
            self.waiter = None


class _Stream:
    """A GET stream: the session's messages that belong to no request (list changes)."""

    __slots__ = ("closed", "items", "waiter")

    def __init__(self) -> None:
        self.items: list[bytes] = []
        self.closed = False
        self.waiter: asyncio.Future[None] | None = None

    def push(self, message: bytes) -> None:
        self.items.append(message)
        self.wake()

    def close(self) -> None:
        self.closed = True
        self.wake()

    def wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class _NoWire(asyncio.Transport):
    """The transport a ``HttpSession`` holds: what it writes goes through its overrides, never here."""

    def __init__(self, session: HttpSession) -> None:
        super().__init__()
        self._session = session
        self._closing = False

    def write(self, data: bytes | bytearray | memoryview) -> None:  # a line no override routed: refused-connection text
        log.debug("http: unrouted message dropped: %r", bytes(data)[:200])

    def get_write_buffer_size(self) -> int:
        return self._session.backlog()

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        if not self._closing:
            self._closing = True
            self._session.connection_lost(None)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


class HttpSession(Session):
    """A ``Session`` whose messages go to HTTP exchanges and streams instead of a socket."""

    def __init__(self, server: SessionHost, key: str, stateful: bool) -> None:
        super().__init__(server)
        self.key = key  # the Mcp-Session-Id, or the URL of a stateless session
        self.stateful = stateful
        self.exchanges: dict[bytes, _Exchange] = {}
        self.stream: _Stream | None = None
        self.used = time.monotonic()
        self._route: bytes | None = None  # the request a call's message belongs to, while it is sent

    def backlog(self) -> int:
        queued = sum(len(m) for e in self.exchanges.values() for m in e.items)
        return queued + (sum(len(m) for m in self.stream.items) if self.stream else 0)

    # -- where each message goes -----------------------------------------------------------------

    def send_result(self, id_json: bytes, result: bytes) -> None:
        if self.modern:
            result = with_result_type(result)
        exchange = self.exchanges.get(id_json)
        if exchange is not None:
            exchange.push(b'{"jsonrpc":"2.0","id":' + exchange.client_id + b',"result":' + result + b"}", final=True)

    def send_error(self, id_json: bytes, code: int, message: str, data: Any = None) -> None:
        error: dict[str, Any] = {"code": code, "message": message}
        if data is not None:
            error["data"] = data
        exchange = self.exchanges.get(id_json)
        if exchange is not None:
            exchange.push(b'{"jsonrpc":"2.0","id":' + exchange.client_id + b',"error":' + _encode(error) + b"}", final=True)
        elif id_json == b"null" and self.stream is not None:
            self.stream.push(b'{"jsonrpc":"2.0","id":null,"error":' + _encode(error) + b"}")

    def send_request(self, id_json: bytes, method: str, params: bytes) -> bool:
        target = self._target()
        if target is None:
            return False  # no stream to ask on: the tool gets "the client has gone away"
        target.push(b'{"jsonrpc":"2.0","id":' + id_json + b',"method":' + _encode(method) + b',"params":' + params + b"}")
        return True

    def send_notification(self, method: str, params: dict[str, Any] | None = None) -> None:
        if self.modern and method == "notifications/tools/list_changed":
            super().send_notification(method, params)  # to each listen request: notify_listener
            return
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        data = _encode(message)
        if method.endswith("/list_changed"):
            if self.stream is not None:
                self.stream.push(data)
            return
        target = self._target()
        if target is not None:
            target.push(data)

    def client_id(self, id_json: bytes) -> Any:
        exchange = self.exchanges.get(id_json)
        return msgspec.json.decode(exchange.client_id) if exchange is not None else super().client_id(id_json)

    def notify_listener(self, id_json: bytes, message: bytes) -> None:
        exchange = self.exchanges.get(id_json)
        if exchange is not None:
            exchange.push(message)

    def _target(self) -> _Exchange | _Stream | None:
        """The call's own exchange when a call's message is being sent, else the latest request's,
        else the GET stream."""
        if self._route is not None:
            exchange = self.exchanges.get(self._route)
            if exchange is not None:
                return exchange
        for exchange in reversed(self.exchanges.values()):
            if exchange.method == "tools/call":
                return exchange
        return self.stream

    def call_progress(self, call: Any, progress: float, total: float | None, message: str | None) -> None:
        self._route = call.request_id
        try:
            super().call_progress(call, progress, total, message)
        finally:
            self._route = None

    def call_log(self, call: Any, level: str, data: bytes) -> None:
        self._route = call.request_id
        try:
            super().call_log(call, level, data)
        finally:
            self._route = None

    def call_ask(self, call: Any, ask_id: int, method: str, params: bytes, wait: float | None) -> None:
        self._route = call.request_id
        try:
            super().call_ask(call, ask_id, method, params, wait)
        finally:
            self._route = None

    def end(self) -> None:
        """End the session: its calls are cancelled, its streams closed."""
        for exchange in self.exchanges.values():
            exchange.done = True
            exchange.push(b"")  # wakes the waiting request, which then answers with what it has
        if self.stream is not None:
            self.stream.close()
        if self.transport is not None:
            self.transport.close()


Reply = tuple[int, list[tuple[bytes, bytes]], bytes]


def _jsonrpc_error(code: int, message: str) -> bytes:
    return _encode({"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message}})


def _sse(message: bytes) -> bytes:
    return b"event: message\ndata: " + message + b"\n\n"


class HttpTransport:
    """The Streamable HTTP endpoint: a daemon component, started when the ``http`` setting is set."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.host = ""
        self.port = 0
        self.error = ""
        self.token = ""
        self.token_path: Path | None = None
        self.server: HttpHost | None = None
        self.sessions: dict[str, HttpSession] = {}  # stateful, by Mcp-Session-Id
        self.stateless: dict[str, HttpSession] = {}  # by the URL's query: the project and lists it chose
        self._allowed_hosts: frozenset[str] = frozenset()
        self._uvicorn: Any = None
        self._serving: asyncio.Task[None] | None = None
        self._sweeper: Periodic | None = None
        self.requests = 0
        self.refused = 0

    # -- lifetime -------------------------------------------------------------------------------

    async def start(self, server: HttpHost) -> None:
        self.server = server
        server.methods["atomic/http/rotate"] = self._rotate_method
        try:
            self.host, port = parse_address(self.address)
        except AddressError as exc:
            self.error = str(exc)
            log.error("HTTP not served: %s", exc)
            return
        self.token_path = Path(server.paths.runtime_dir) / TOKEN_NAME
        self.token = read_token(self.token_path) or new_token(self.token_path)
        try:
            sock = socket.create_server((self.host, port), family=socket.AF_INET6 if ":" in self.host else socket.AF_INET)
        except OSError as exc:
            self.error = f"cannot listen on {self.host}:{port}: {exc.strerror or exc}; choose another port (ATOMICTOOLS_HTTP)"
            log.error("HTTP not served: %s", self.error)
            return
        sock.set_inheritable(False)
        self.port = sock.getsockname()[1]
        names = set(LOOPBACK_NAMES) if self.host in LOOPBACK_NAMES or self.host == "localhost" else set()
        names.add(self.host)
        self._allowed_hosts = frozenset(names)
        # Lazy: the HTTP server and its parser load only when HTTP is on (start-up time and memory).
        import uvicorn

        class _Server(uvicorn.Server):
            def capture_signals(self) -> contextlib.AbstractContextManager[None]:
                return contextlib.nullcontext()  # the daemon's own SIGINT/SIGTERM/SIGHUP handlers stay

        config = uvicorn.Config(
            self, http="httptools", ws="none", lifespan="off", interface="asgi3", log_config=None,
            access_log=False, server_header=False, date_header=False, proxy_headers=False,
            timeout_graceful_shutdown=1, timeout_keep_alive=30,
        )
        logging.getLogger("uvicorn.error").setLevel(logging.WARNING)
        self._uvicorn = _Server(config)
        self._serving = asyncio.get_running_loop().create_task(self._uvicorn.serve(sockets=[sock]))
        self._sweeper = Periodic("HTTP session sweep", self._sweep, _SWEEP_EVERY, logger=log)
        self._sweeper.start()
        log.info("serving MCP over HTTP on %s", self.url())

    async def stop(self) -> None:
        for session in [*self.sessions.values(), *self.stateless.values()]:
            session.end()
        self.sessions.clear()
        self.stateless.clear()
        if self._sweeper is not None:
            await self._sweeper.stop()
        if self._uvicorn is not None and self._serving is not None:
            self._uvicorn.should_exit = True
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._serving, 5)

    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}{ENDPOINT}"

    def info(self) -> dict[str, Any]:
        return {
            "url": self.url() if self.port else None,
            "error": self.error or None,
            "tokenFile": str(self.token_path) if self.token_path else None,
            "sessions": len(self.sessions),
            "requests": self.requests,
            "refused": self.refused,
        }

    def _rotate_method(self, session: Session, id_json: bytes, raw: Any) -> None:
        if self.token_path is None:
            session.send_error(id_json, INVALID_REQUEST, "HTTP is not served by this daemon: nothing to rotate")
            return
        self.token = new_token(self.token_path)
        token_file = str(self.token_path)  # "token_file": the name before 0.2 (docs/protocol.md#renamed)
        session.send_result(id_json, _encode({"tokenFile": token_file, "token_file": token_file}))

    def _sweep(self) -> None:
        """End the sessions nobody has used for ``SESSION_IDLE`` seconds and that have no stream open."""
        now = time.monotonic()
        for table in (self.sessions, self.stateless):
            for key, session in list(table.items()):
                if not session.exchanges and session.stream is None and now - session.used > SESSION_IDLE:
                    del table[key]
                    session.end()

    # -- the ASGI app ---------------------------------------------------------------------------

    async def __call__(self, scope: dict[str, Any], receive: Callable[[], Awaitable[dict[str, Any]]],
                       send: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
        if scope["type"] != "http":
            return
        self.requests += 1
        headers = dict(scope["headers"])
        refusal = self._refuse(headers)
        if refusal is None and scope["path"] != ENDPOINT:
            refusal = (404, [], _jsonrpc_error(INVALID_REQUEST, f"Not found: the MCP endpoint is {ENDPOINT}"))
        if refusal is None:
            method = scope["method"]
            if method == "POST":
                await self._post(scope, headers, receive, send)
                return
            if method == "GET":
                await self._get(scope, headers, receive, send)
                return
            if method == "DELETE":
                refusal = self._delete(headers)
            else:
                refusal = (405, [(b"allow", b"GET, POST, DELETE")], _jsonrpc_error(INVALID_REQUEST, f"Method {method} not allowed"))
        await _reply(send, *refusal)

    def _refuse(self, headers: dict[bytes, bytes]) -> Reply | None:
        """403 for a Host or Origin that is not this server, 401 without the right token."""
        host = headers.get(b"host", b"").decode("latin-1")
        if not self._our_host(host, scheme_port=None):
            self.refused += 1
            return 403, [], _jsonrpc_error(INVALID_REQUEST, f"Forbidden: Host {host!r} is not this server (DNS rebinding protection)")
        origin = headers.get(b"origin")
        if origin is not None and origin != b"null":
            parts = urlsplit(origin.decode("latin-1"))
            if parts.scheme not in ("http", "https") or not self._our_host(parts.netloc, scheme_port=80 if parts.scheme == "http" else 443):
                self.refused += 1
                return 403, [], _jsonrpc_error(INVALID_REQUEST, f"Forbidden: Origin {origin.decode('latin-1')!r} is not this server")
        elif origin == b"null":
            self.refused += 1
            return 403, [], _jsonrpc_error(INVALID_REQUEST, "Forbidden: an opaque Origin (null) is not this server")
        given = headers.get(b"authorization", b"")
        scheme, _, credential = given.partition(b" ")
        if scheme.lower() != b"bearer" or not credential:
            self.refused += 1
            return 401, [(b"www-authenticate", b'Bearer realm="atomictoolsd"')], _jsonrpc_error(
                INVALID_REQUEST, f"Unauthorized: send Authorization: Bearer <the token in {self.token_path}>")
        if not hmac.compare_digest(credential.strip(), self.token.encode()):
            self.refused += 1
            return 401, [(b"www-authenticate", b'Bearer realm="atomictoolsd", error="invalid_token"')], _jsonrpc_error(
                INVALID_REQUEST, f"Unauthorized: the token is not this daemon's (it may have been rotated: read {self.token_path})")
        return None

    def _our_host(self, netloc: str, scheme_port: int | None) -> bool:
        if netloc.startswith("["):
            end = netloc.find("]")
            name, rest = netloc[1:end], netloc[end + 1 :]
        else:
            name, _, port_text = netloc.partition(":")
            rest = ":" + port_text if port_text else ""
        if name.lower() not in self._allowed_hosts:
            return False
        if not rest:
            return scheme_port is None or scheme_port == self.port  # Host without a port: the scheme's
        return rest == f":{self.port}"

    # -- POST: one JSON-RPC message --------------------------------------------------------------

    async def _post(self, scope: dict[str, Any], headers: dict[bytes, bytes], receive: Any, send: Any) -> None:
        assert self.server is not None
        content_type = headers.get(b"content-type", b"")
        if not content_type.split(b";")[0].strip().lower() == _JSON:
            await _reply(send, 415, [], _jsonrpc_error(INVALID_REQUEST, "Unsupported media type: send Content-Type: application/json"))
            return
        limit = self.server.config.max_message_bytes
        body = await _read_body(receive, limit)
        if body is None:
            await _reply(send, 413, [], _jsonrpc_error(INVALID_REQUEST, f"Message too large: the limit is {limit} bytes (ATOMICTOOLS_MAX_MESSAGE_BYTES)"))
            return
        try:
            message = msgspec.json.decode(body, type=_Envelope)
        except msgspec.ValidationError:
            text = body.lstrip()[:1]
            note = "Batches are not supported: send one JSON-RPC message per request" if text == b"[" else "Invalid request: expected a JSON-RPC object"
            await _reply(send, 400, [], _jsonrpc_error(INVALID_REQUEST, note))
            return
        except (msgspec.DecodeError, RecursionError) as exc:
            await _reply(send, 400, [], _jsonrpc_error(PARSE_ERROR, f"Parse error: {exc}"))
            return
        version = headers.get(b"mcp-protocol-version")
        modern = META_VERSION_BYTES in body and message.method is not UNSET
        if version is not None and version.decode("latin-1") not in REVISIONS:
            text = f"Unsupported MCP-Protocol-Version {version.decode('latin-1')!r}; supported: {', '.join(REVISIONS)}"
            error = {"code": UNSUPPORTED_VERSION, "message": text, "data": {"supported": list(REVISIONS), "requested": version.decode("latin-1")}} \
                if modern else {"code": INVALID_REQUEST, "message": text}
            await _reply(send, 400, [], _encode({"jsonrpc": "2.0", "id": None, "error": error}))
            return
        method = message.method
        mismatch = _header_mismatch(headers, message, modern)
        if mismatch:
            await _reply(send, 400, [], _jsonrpc_error(HEADER_MISMATCH, mismatch))
            return
        session_id = headers.get(b"mcp-session-id")
        extra: list[tuple[bytes, bytes]] = []
        if session_id is not None:
            session = self.sessions.get(session_id.decode("latin-1"))
            if session is None:
                await _reply(send, 404, [], _jsonrpc_error(INVALID_REQUEST, "Session not found: it ended or the daemon restarted; initialize again"))
                return
        else:
            made = await (self._new_session(scope, stateful=True) if method == "initialize" else self._stateless_session(scope))
            if isinstance(made, str):
                await _reply(send, 400, [], _jsonrpc_error(INVALID_REQUEST, made))
                return
            session = made
            if method == "initialize":
                extra.append((b"mcp-session-id", session.key.encode()))
        session.used = time.monotonic()
        if method is UNSET or message.id is UNSET:
            if method == "notifications/cancelled":
                self._cancel_by_client_id(session, message.params)
            else:
                session.handle_line(body)  # a notification, or the client's answer to a tool's question
            await _reply(send, 202, extra, b"")
            return
        internal = b'"h%d"' % next(_ids)
        exchange = _Exchange(bytes(message.id), method)
        session.exchanges[internal] = exchange
        params = b',"params":' + bytes(message.params) if message.params is not UNSET else b""
        try:
            session.handle_line(b'{"jsonrpc":"2.0","id":' + internal + b',"method":' + _encode(method) + params + b"}")
            await self._answer(session, internal, exchange, extra, receive, send)
        finally:
            session.exchanges.pop(internal, None)
            session.used = time.monotonic()

    async def _answer(self, session: HttpSession, internal: bytes, exchange: _Exchange, extra: list[tuple[bytes, bytes]],
                      receive: Any, send: Any) -> None:
        """JSON when the answer comes first; else an SSE stream of what comes, the answer last.

        A task watches for the client going away (ASGI says so only through ``receive``) and wakes
        the exchange as an answer would; it starts only once the answer is ``_WATCH_AFTER`` late,
        so a quick call pays a timer, not a task (most of a call's cost over HTTP, measured).
        """
        loop = asyncio.get_running_loop()
        gone: list[asyncio.Task[None]] = []

        def watch() -> None:
            task = loop.create_task(_disconnected(receive))
            task.add_done_callback(lambda _task: exchange.wake())
            gone.append(task)

        timer = None
        try:
            if not exchange.items and not exchange.done:
                timer = loop.call_later(_WATCH_AFTER, watch)
                await exchange.wait()
                if not exchange.items:
                    self._cancel(session, internal)  # the client went away first
                    return
            if exchange.done and len(exchange.items) == 1:
                await _reply(send, 200, [(b"content-type", _JSON), *extra], exchange.items[0])
                return
            await send({"type": "http.response.start", "status": 200, "headers": [*_SSE_HEADERS, *extra]})
            if timer is not None:
                timer.cancel()
            if not gone:
                watch()
            while True:
                items, exchange.items = exchange.items, []
                chunk = b"".join(_sse(m) for m in items if m)
                if chunk:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                if exchange.done:
                    break
                await exchange.wait()
                if gone[0].done() and not exchange.items:
                    self._cancel(session, internal)
                    return
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            if timer is not None:
                timer.cancel()
            for task in gone:
                task.cancel()

    def _cancel_by_client_id(self, session: HttpSession, raw: msgspec.Raw | UnsetType) -> None:
        """``notifications/cancelled`` names the client's id; the session knows the call by ours."""
        try:
            request_id = _encode(msgspec.json.decode(raw, type=_Cancelled).requestId) if raw is not UNSET else None
        except msgspec.MsgspecError:
            return  # notifications get no answer, not even an error
        for internal, exchange in list(session.exchanges.items()):
            if exchange.client_id == request_id:
                exchange.done = True
                exchange.push(b"")
                self._cancel(session, internal)

    def _cancel(self, session: HttpSession, internal: bytes) -> None:
        """The client went away before the answer: its call stops, as a socket client's does."""
        session.exchanges.pop(internal, None)
        session.handle_notification("notifications/cancelled", msgspec.Raw(b'{"requestId":' + internal + b"}"))

    # -- sessions ---------------------------------------------------------------------------------

    async def _new_session(self, scope: dict[str, Any], stateful: bool, key: str | None = None) -> HttpSession | str:
        """A session for the URL's project and lists, or why there is none (said to this request only)."""
        assert self.server is not None
        session = HttpSession(self.server, key or secrets.token_urlsafe(24), stateful)
        session.connection_made(_NoWire(session))
        if session.transport is None:
            return "Too many connections: the daemon takes no more sessions now (max_connections)"
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        params: dict[str, Any] = {
            "lock": True,
            "agent": "http",
            "sessionId": session.key[:12] if stateful else "http",
            "allow": [g for v in query.get("allow", []) for g in v.split(",") if g],
            "deny": [g for v in query.get("deny", []) for g in v.split(",") if g],
            "dispatcher": query.get("dispatcher", ["0"])[-1].lower() in ("1", "true", "yes", "on"),
        }
        directory = query.get("directory", [None])[-1]
        if directory is None:
            # No project: the global and built-in tools, with the URL's lists, locked like the shim's.
            session.allow, session.deny = tuple(params["allow"]), tuple(params["deny"])
            session.dispatcher, session.locked, session.agent = params["dispatcher"], True, "http"
        else:
            params["directory"] = directory
            internal = b'"h%d"' % next(_ids)
            exchange = _Exchange(b"null", "atomic/attach")
            session.exchanges[internal] = exchange
            session.handle_line(b'{"jsonrpc":"2.0","id":' + internal + b',"method":"atomic/attach","params":' + _encode(params) + b"}")
            while not exchange.done:
                await exchange.wait()
            session.exchanges.pop(internal, None)
            reply = msgspec.json.decode(exchange.items[-1])
            if "error" in reply:
                session.end()
                return f"directory in the URL: {reply['error']['message']}"
        if stateful:
            self.sessions[session.key] = session
        return session

    async def _stateless_session(self, scope: dict[str, Any]) -> HttpSession | str:
        key = scope.get("query_string", b"").decode("latin-1")
        session = self.stateless.get(key)
        if session is None or session.transport is None:
            made = await self._new_session(scope, stateful=False, key=key)
            if isinstance(made, str):
                return made
            session = self.stateless[key] = made
        return session

    def _delete(self, headers: dict[bytes, bytes]) -> Reply:
        session_id = headers.get(b"mcp-session-id")
        if session_id is None:
            return 400, [], _jsonrpc_error(INVALID_REQUEST, "DELETE needs the Mcp-Session-Id of the session to end")
        session = self.sessions.pop(session_id.decode("latin-1"), None)
        if session is None:
            return 404, [], _jsonrpc_error(INVALID_REQUEST, "Session not found")
        session.end()
        return 200, [], b""

    # -- GET: the session's stream ----------------------------------------------------------------

    async def _get(self, scope: dict[str, Any], headers: dict[bytes, bytes], receive: Any, send: Any) -> None:
        if b"text/event-stream" not in headers.get(b"accept", b""):
            await _reply(send, 406, [], _jsonrpc_error(INVALID_REQUEST, "Not acceptable: GET opens an SSE stream; send Accept: text/event-stream"))
            return
        session_id = headers.get(b"mcp-session-id")
        if session_id is None:
            await _reply(send, 405, [(b"allow", b"POST, DELETE")], _jsonrpc_error(
                INVALID_REQUEST, "GET needs an Mcp-Session-Id (initialize first); stateless clients listen with subscriptions/listen"))
            return
        session = self.sessions.get(session_id.decode("latin-1"))
        if session is None:
            await _reply(send, 404, [], _jsonrpc_error(INVALID_REQUEST, "Session not found: initialize again"))
            return
        if session.stream is not None:
            await _reply(send, 409, [], _jsonrpc_error(INVALID_REQUEST, "Conflict: this session already has its GET stream open"))
            return
        stream = session.stream = _Stream()
        await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
        await send({"type": "http.response.body", "body": b": stream open\n\n", "more_body": True})
        gone = asyncio.ensure_future(_disconnected(receive))
        try:
            while not stream.closed:
                if stream.items:
                    items, stream.items = stream.items, []
                    await send({"type": "http.response.body", "body": b"".join(_sse(m) for m in items), "more_body": True})
                    continue
                stream.waiter = asyncio.get_running_loop().create_future()
                await asyncio.wait((gone, stream.waiter), return_when=asyncio.FIRST_COMPLETED)
                stream.waiter = None
                if gone.done():
                    return
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            gone.cancel()
            if session.stream is stream:
                session.stream = None
            session.used = time.monotonic()


def _header_mismatch(headers: dict[bytes, bytes], message: _Envelope, modern: bool) -> str:
    """The 2026-07-28 routing headers must say what the body says (a proxy routes on them); a
    request of that revision (``modern``: its ``_meta`` names it) must carry them: ``Mcp-Method``,
    ``MCP-Protocol-Version`` equal to its ``_meta`` revision, and ``Mcp-Name`` on a ``tools/call``."""
    method_header = headers.get(b"mcp-method")
    if method_header is None and modern:
        return "Mcp-Method header missing: a 2026-07-28 request over HTTP names its method in it"
    if method_header is not None and message.method is not UNSET and method_header.decode("latin-1") != message.method:
        return f"Mcp-Method header {method_header.decode('latin-1')!r} does not match the body's method {message.method!r}"
    name_header = headers.get(b"mcp-name")
    if (name_header is not None or modern) and message.params is not UNSET:
        try:
            params = msgspec.json.decode(message.params, type=_Name)
        except msgspec.MsgspecError:
            params = _Name()
        if name_header is None:
            if message.method == "tools/call" and isinstance(params.name, str):
                return "Mcp-Name header missing: a 2026-07-28 tools/call over HTTP names its tool in it"
        elif name_header.decode("latin-1") != params.name:
            return f"Mcp-Name header {name_header.decode('latin-1')!r} does not match the body's name {params.name!r}"
        if modern:
            asked = params.meta.get(META_VERSION)
            version = headers.get(b"mcp-protocol-version")
            if version is None:
                return f"MCP-Protocol-Version header missing: a 2026-07-28 request over HTTP repeats its _meta revision ({asked!r}) in it"
            if version.decode("latin-1") != asked:
                return f"MCP-Protocol-Version header {version.decode('latin-1')!r} does not match the body's _meta revision {asked!r}"
    return ""


async def _read_body(receive: Any, limit: int) -> bytes | None:
    """The request body, or None when it passes ``limit`` (the rest is not read)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        event = await receive()
        if event["type"] == "http.disconnect":
            return b""
        chunk = event.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not event.get("more_body"):
            return b"".join(chunks) if len(chunks) != 1 else chunks[0]


async def _disconnected(receive: Any) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _reply(send: Any, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    if body and not any(name == b"content-type" for name, _ in headers):
        headers = [(b"content-type", _JSON), *headers]
    await send({"type": "http.response.start", "status": status, "headers": [*headers, (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
