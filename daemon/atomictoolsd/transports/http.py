"""MCP's Streamable HTTP, served by the daemon itself: one endpoint, ``/mcp``, on loopback.

The HTTP layer only carries JSON-RPC: every message is handed, decoded, to a ``Session`` (the same
class the Unix socket uses), so methods, revisions, allow/deny and trust are the socket's. Each
session's ``HttpSession`` is its ``Output``: what the session says goes to the HTTP exchange of the
request it belongs to. What this module owns is what HTTP adds:

- **Who may ask.** Every request must carry ``Authorization: Bearer <token>``; the token is made by
  the daemon, kept in a 0600 file in its runtime dir (``http-token``), compared in constant time and
  rotatable (``atomictoolsd http token --rotate``). ``Host`` and ``Origin`` must name this server
  (loopback, or the address the user bound explicitly), which defeats DNS rebinding: a page whose
  name resolves to 127.0.0.1 sends its own name. A refused request runs nothing.
- **Who may connect.** On Linux a connection from another user of this machine is closed as it is
  accepted, before a byte of it is read: the kernel says who owns the client's socket
  (``transports/peers.py``). The rest wait at most ``http1.WAITING`` seconds for a request the
  token lets in, at most ``WAITING_MOST`` at once (the oldest gives way to a newcomer), and every
  HTTP connection counts against HTTP's own share of the daemon's descriptors
  (``Server.http_connection_limit``), never against the Unix socket's.
- **Sessions.** ``initialize`` makes a stateful session (``Mcp-Session-Id``); its POSTs are answered
  as JSON, or as an SSE stream once a notification or a question of the tool's comes before the
  answer; GET opens its stream for list changes; DELETE ends it. A request without a session id is
  stateless (the 2026-07-28 revision): it is served by a session kept per URL, whose state is only
  what the URL chose.
- **Routing.** Each answer finds its HTTP exchange by a dict lookup on the request's id. In a
  stateful session a request keeps its client's id (the session knows it by that id) unless a
  request in flight has it; else, and always in a stateless session, which every client of its URL
  shares, it gets an id of the daemon's own (``"h<n>"``), so two clients' ids never collide, and
  the client's id is put back in the answer. A call's progress, logs and questions go to its own
  exchange (``about``, see ``sessions/output.py``). The answer is written to the request's connection
  when it comes (no task or future waits for it). At most ``MAX_SESSIONS`` live at once, stateful,
  stateless and the REST API's together: to make a new one, the one idle the longest (no request in flight, no
  stream open) is ended; when none is idle, the new one is refused.
- **The project.** The URL picks it as the shim's ``--directory`` does:
  ``/mcp?directory=/abs/path&allow=glob&deny=glob&dispatcher=1``; the session is locked to it.
- **Batches.** A 2025-03-26 session may POST a JSON array of messages (``_Batch``): the answers
  of its requests come back as one JSON array, or as an SSE stream once a notification comes first.
- **The tools REST API.** ``/api/tools…`` (``transports/rest.py``) passes the same checks (the
  token, Host, Origin) and is then that module's.

HTTP/1.1 itself (httptools' parser on an asyncio Protocol, in the daemon's own event loop) is in
``transports/http1.py``, imported only when HTTP is on (see ``HttpTransport.start``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import itertools
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import parse_qs, unquote_to_bytes, urlsplit

import msgspec
from msgspec import UNSET, UnsetType

from atomictools._protocol import INVALID_REQUEST, PARSE_ERROR
from atomictoolsd.config.errors import SetupError
from atomictoolsd.config.statefile import write_atomic
from atomictoolsd.protocol import well_formed_json
from atomictoolsd.sessions import batches
from atomictoolsd.sessions.loose import NULL, scalar
from atomictoolsd.sessions.messages import AttachParams, ParamsError, decode_globs, decode_message
from atomictoolsd.sessions.output import encode_error
from atomictoolsd.sessions.revisions import ALL as REVISIONS
from atomictoolsd.sessions.revisions import META_VERSION, META_VERSION_BYTES, UNSUPPORTED_VERSION
from atomictoolsd.sessions.session import Session, SessionHost
from atomictoolsd.transports.peers import PeerOwners
from atomictoolsd.transports.rest import RestApi
from atomictoolsd.util.periodic import Periodic, Scheduler

if TYPE_CHECKING:
    from atomictoolsd.transports.http1 import Http1Connection, Refusal, Request, Response, Waiting

__all__ = ["TOKEN_NAME", "HttpTransport", "parse_address", "read_token"]

log = logging.getLogger("atomictoolsd.http")

TOKEN_NAME = "http-token"
ENDPOINT = "/mcp"
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
# A session nobody has used for this long, with no stream open, is ended (a client that vanished
# without DELETE); its id then answers 404 and the client starts a new one, as the spec says.
SESSION_IDLE = 1800.0
# HTTP sessions at once (stateful and stateless); past it the one idle the longest is ended. They
# hold no descriptor: this bounds the memory of clients that never say DELETE.
MAX_SESSIONS = 256
WAITING_MOST = 64  # connections at once that no request has been let in on yet (token, Host, Origin)
_SWEEP_EVERY = 5.0  # idle connections (http1.IDLE) and sessions
_SSE_HEAD = b"content-type: text/event-stream\r\ncache-control: no-cache\r\n"
_JSON_HEAD = b"content-type: application/json\r\n"
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
    if _every_interface(host):
        # Every interface at once: no one name for the Host check to accept, so every request would
        # be refused; and a user opening the port beyond loopback names the one address meant.
        raise AddressError(
            f"http address {value!r}: name one address of this machine (e.g. 192.168.1.5:8765), not every "
            f"interface; a bare port serves loopback"
        )
    return host, port


def _every_interface(host: str) -> bool:
    """Whether binding ``host`` listens on every interface, in any spelling the resolver takes
    (``0``, ``0.0.0.00``, ``[::0]``, ``[::ffff:0.0.0.0]``, as well as ``0.0.0.0`` and ``::``)."""
    if host == "*":
        return True
    try:
        address = ipaddress.ip_address(host.partition("%")[0])
    except ValueError:
        try:
            return socket.inet_aton(host) == bytes(4)  # the resolver's own shorthand forms
        except OSError:
            return False  # a name: bound as the resolver says, checked in Host as written
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_unspecified


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

    def http_connection_limit(self) -> int:
        """HTTP connections allowed at once: HTTP's share of the daemon's descriptors."""


class _Envelope(msgspec.Struct):
    jsonrpc: msgspec.Raw = NULL  # read with loose.scalar
    id: msgspec.Raw | UnsetType = UNSET
    method: str | UnsetType = UNSET
    params: msgspec.Raw | UnsetType = UNSET
    result: msgspec.Raw | UnsetType = UNSET
    error: msgspec.Raw | UnsetType = UNSET


class _Name(msgspec.Struct):
    name: msgspec.Raw = NULL  # read with loose.scalar
    meta: dict[str, msgspec.Raw] = msgspec.field(default_factory=dict, name="_meta")


_NO_NAME = _Name()  # params neither named nor asked about


class _Cancelled(msgspec.Struct):
    requestId: int | str  # noqa: N815 - the wire name


class _Exchange:
    """One POST waiting for its answer. What comes for it is written to its response at once: the
    answer alone as JSON, or, once a notification or a question of the tool's comes first, an SSE
    stream of them with the answer last."""

    __slots__ = ("client_id", "extra", "internal", "method", "response", "session", "streams")

    def __init__(self, session: HttpSession, internal: bytes, client_id: bytes, method: str, response: Response,
                 extra: bytes, streams: bool = True) -> None:
        self.session = session
        # Whether the request's Accept takes an SSE stream; when not, its answer is JSON and what
        # comes before it (progress, a tool's question) goes to the session's GET stream, if any.
        self.streams = streams
        self.internal = internal  # the id the session knows the request by
        self.client_id = client_id
        self.method = method
        self.response = response
        self.extra = extra  # header lines of this answer (Mcp-Session-Id after initialize)

    def push(self, message: bytes, final: bool = False) -> None:
        response = self.response
        if final:
            session = self.session
            session.exchanges.pop(self.internal, None)
            session.used = time.monotonic()
            if response.started:
                response.end(_sse(message))
            else:
                response.send(200, _JSON_HEAD + self.extra, message)
            return
        if not self.streams:
            if self.session.stream is not None:
                self.session.stream.push(message)
            return
        if not response.started:
            response.start(200, _SSE_HEAD + self.extra)
        response.write(_sse(message))

    def gone(self) -> None:
        """The client went away before the answer: its call stops, as a socket client's does."""
        session = self.session
        if session.exchanges.pop(self.internal, None) is not None:
            session.used = time.monotonic()
            session.core.cancel(self.internal)

    def drop(self) -> None:
        """No answer will come (the client cancelled, the session ended): end the POST as it stands."""
        self.session.exchanges.pop(self.internal, None)
        if self.response.started:
            self.response.end()
        else:
            self.response.send(200, _JSON_HEAD + self.extra, b"")


class _Batch:
    """One POST holding a batch (a 2025-03-26 session): the answers of its requests, sent as one JSON
    array once the last is in; or, once a notification or a question of a tool's comes first, an SSE
    stream of them with each answer as it comes, ended after the last. No request: 202."""

    __slots__ = ("answers", "parts", "reading", "response", "session", "streams")

    def __init__(self, session: HttpSession, response: Response, streams: bool) -> None:
        self.session = session
        self.response = response
        self.streams = streams  # as _Exchange's
        self.parts: dict[bytes, _BatchPart] = {}  # its requests not yet answered, by the session's id
        self.answers: list[bytes] = []  # held until the last is in, unless a stream has started
        self.reading = True

    def add(self, answer: bytes) -> None:
        if self.response.started:
            self.response.write(_sse(answer))
        else:
            self.answers.append(answer)

    def note(self, message: bytes) -> None:
        """A notification or a question of one of its requests' tools: the answer becomes a stream."""
        response = self.response
        if not self.streams:
            if self.session.stream is not None:
                self.session.stream.push(message)
            return
        if not response.started:
            response.start(200, _SSE_HEAD)
            for answer in self.answers:
                response.write(_sse(answer))
            self.answers.clear()
        response.write(_sse(message))

    def settle(self) -> None:
        if self.reading or self.parts:
            return
        response = self.response
        if response.started:
            response.end()
        elif self.answers:
            response.send(200, _JSON_HEAD, b"[" + b",".join(self.answers) + b"]")
        else:
            response.send(202, b"", b"")

    def gone(self) -> None:
        """The client went away before the answers: the batch's calls stop."""
        session = self.session
        for internal in list(self.parts):
            if session.exchanges.pop(internal, None) is not None:
                session.core.cancel(internal)
        self.parts.clear()


class _BatchPart:
    """One request of a ``_Batch``, as the session's exchanges hold it."""

    __slots__ = ("batch", "client_id", "internal", "method", "streams")

    def __init__(self, batch: _Batch, internal: bytes, client_id: bytes, method: str) -> None:
        self.batch = batch
        self.internal = internal
        self.client_id = client_id
        self.method = method
        self.streams = batch.streams

    def push(self, message: bytes, final: bool = False) -> None:
        if not final:
            self.batch.note(message)
            return
        self._leave()
        self.batch.add(message)
        self.batch.settle()

    def drop(self) -> None:
        """No answer will come (the client cancelled it, the session ended)."""
        self._leave()
        self.batch.settle()

    def _leave(self) -> None:
        batch = self.batch
        batch.session.exchanges.pop(self.internal, None)
        batch.parts.pop(self.internal, None)
        batch.session.used = time.monotonic()


class _Stream:
    """A GET stream: the session's messages that belong to no request (list changes)."""

    __slots__ = ("response", "session")

    def __init__(self, session: HttpSession, response: Response) -> None:
        self.session = session
        self.response = response

    def push(self, message: bytes) -> None:
        self.response.write(_sse(message))

    def close(self) -> None:
        self.gone()
        self.response.end()

    def gone(self) -> None:
        if self.session.stream is self:
            self.session.stream = None
            self.session.used = time.monotonic()


class HttpSession:
    """One MCP session over HTTP: the ``Session`` it carries (``core``), whose ``Output`` it is,
    its requests waiting for their answers (``exchanges``, by the id the session knows each by)
    and its GET stream. Each message of the session goes to the exchange of the request it
    belongs to, else to the latest call's, else to the GET stream (``_target``)."""

    def __init__(self, server: SessionHost, key: str, stateful: bool) -> None:
        self.key = key  # the Mcp-Session-Id, or the URL of a stateless session
        self.stateful = stateful
        self.exchanges: dict[bytes, _Exchange | _BatchPart] = {}
        self.stream: _Stream | None = None
        self.used = time.monotonic()
        self.open = True  # until end(): its session is closed then
        self.core = Session(server, self)

    # -- where each message goes: the Output ---------------------------------------------------------

    def result(self, id_json: bytes, result: bytes) -> None:
        exchange = self.exchanges.get(id_json)
        if exchange is not None:
            exchange.push(b'{"jsonrpc":"2.0","id":' + exchange.client_id + b',"result":' + result + b"}", final=True)

    def error(self, id_json: bytes, error: bytes) -> None:
        exchange = self.exchanges.get(id_json)
        if exchange is not None:
            exchange.push(b'{"jsonrpc":"2.0","id":' + exchange.client_id + b',"error":' + error + b"}", final=True)
        elif id_json == b"null" and self.stream is not None:
            self.stream.push(b'{"jsonrpc":"2.0","id":null,"error":' + error + b"}")

    def request(self, id_json: bytes, method: str, params: bytes, about: bytes | None) -> bool:
        target = self._target(about)
        if target is None:
            return False  # no stream to ask on: the tool gets "the client has gone away"
        target.push(b'{"jsonrpc":"2.0","id":' + id_json + b',"method":' + _encode(method) + b',"params":' + params + b"}")
        return True

    def notification(self, method: str, message: bytes, about: bytes | None) -> None:
        if about is None and method.endswith("/list_changed"):
            if self.stream is not None:  # a list change belongs to no request: the GET stream's
                self.stream.push(message)
            return
        target = self._target(about)
        if target is not None:
            target.push(message)

    def backlog(self) -> int:
        """Bytes written to this session's clients that they have not read yet."""
        queued = sum(e.response.buffered() for e in self.exchanges.values() if isinstance(e, _Exchange))
        return queued + (self.stream.response.buffered() if self.stream else 0)

    def request_id(self, id_json: bytes) -> Any:
        exchange = self.exchanges.get(id_json)
        return msgspec.json.decode(exchange.client_id if exchange is not None else id_json)

    def ended(self, id_json: bytes) -> None:
        pass  # an exchange ends with its answer, or when its client cancels or leaves

    def close(self) -> None:
        if self.open:
            self.open = False
            self.core.close()

    def _target(self, about: bytes | None) -> _Exchange | _BatchPart | _Stream | None:
        """The exchange of the request ``about`` names, else the latest call's, else the GET stream."""
        if about is not None:
            exchange = self.exchanges.get(about)
            if exchange is not None:
                return exchange if exchange.streams else self.stream
        for exchange in reversed(self.exchanges.values()):
            if exchange.method == "tools/call" and exchange.streams:
                return exchange
        return self.stream

    def end(self) -> None:
        """End the session: its calls are cancelled, its requests and streams ended."""
        for exchange in list(self.exchanges.values()):
            exchange.drop()
        if self.stream is not None:
            self.stream.close()
        self.close()


def _hand_over(session: HttpSession, body: bytes) -> None:
    """A message that is no request (a notification, the client's answer to a tool's question),
    decoded as a socket line is; one that is no JSON-RPC message is told on the GET stream."""
    try:
        message = decode_message(body)
    except (msgspec.MsgspecError, UnicodeDecodeError, RecursionError) as exc:
        session.error(b"null", encode_error(INVALID_REQUEST, f"Invalid request: {exc}"))
        return
    session.core.handle_message(message)


def _repaired(request: Request, error: Exception) -> bool:
    """Whether ``request``'s body, which failed to decode with ``error``, failed on half a character
    only (a lone surrogate escape, ``well_formed_json``): then its body now holds U+FFFD in its place."""
    repaired = well_formed_json(request.body) if isinstance(error, msgspec.DecodeError) else None
    if repaired is None:
        return False
    request.body = repaired
    return True


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode()
    except UnicodeDecodeError:
        return False
    return True


def _jsonrpc_error(code: int, message: str) -> bytes:
    return _encode({"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message}})


def _refusal(status: int, code: int, message: str, headers: bytes = b"") -> Refusal:
    return status, _JSON_HEAD + headers, _jsonrpc_error(code, message)


def accepts(accept: bytes | None, media: bytes) -> bool:
    """Whether an ``Accept`` header takes the media type ``media`` (``b"text/event-stream"``): the
    most specific of its ranges that matches (the type itself, ``text/*``, ``*/*``) decides, and a
    range of ``q=0`` refuses. No header takes anything; media types are case-insensitive."""
    if accept is None:
        return True
    lowered = accept.lower()
    family = media.split(b"/")[0] + b"/*"
    # find, not ``in`` (each request asks): see sessions/connection.py
    if lowered.replace(b" ", b"").find(b"q=") < 0:  # every range takes what it matches (the usual header)
        return lowered.find(media) >= 0 or lowered.find(family) >= 0 or lowered.find(b"*/*") >= 0
    best = (-1, 0.0)  # (how specific the matching range is, its q)
    for item in lowered.split(b","):
        kind, *params = item.split(b";")
        kind = kind.strip()
        specific = 2 if kind == media else 1 if kind == family else 0 if kind == b"*/*" else -1
        if specific > best[0]:
            best = (specific, _quality(params))
    return best[1] > 0


def _quality(params: list[bytes]) -> float:
    """A media range's ``q`` (1 when it has none or one that is no number)."""
    for param in params:
        name, _, value = param.partition(b"=")
        if name.strip() == b"q":
            try:
                return float(value.strip())
            except ValueError:
                return 1.0
    return 1.0


def _takes_sse(accept: bytes | None) -> bool:
    """Whether a request's ``Accept`` takes an SSE stream (for a POST: its answer's form)."""
    return accepts(accept, b"text/event-stream")


def _acceptable(accept: bytes | None) -> bool:
    """Whether a POST's ``Accept`` takes JSON or SSE, the two forms an answer comes in."""
    return accepts(accept, b"application/json") or accepts(accept, b"text/event-stream")


def _sse(message: bytes) -> bytes:
    return b"event: message\ndata: " + message + b"\n\n"


class HttpTransport:
    """The Streamable HTTP endpoint: a daemon component, started when the ``http`` setting is set.

    It is the handler of ``transports/http1.py``'s connections: ``head`` judges each request on its
    headers (the token, Host, Origin, the path, the method, the media type and length) before its
    body is read, ``handle`` answers it.
    """

    def __init__(self, address: str, scheduler: Scheduler) -> None:
        self.address = address
        self.scheduler = scheduler  # the daemon's one loop for periodic work: it sweeps idle sessions
        self.host = ""
        self.port = 0
        self.error = ""
        self.token = ""
        self.token_path: Path | None = None
        self.server: HttpHost | None = None
        self.sessions: dict[bytes, HttpSession] = {}  # stateful, by Mcp-Session-Id
        self.stateless: dict[bytes, HttpSession] = {}  # by the URL's query: the project and lists it chose
        self.rest = RestApi(self._new_session, self._spawn)  # /api/tools: the tools REST API
        self._allowed_hosts: frozenset[str] = frozenset()
        self._our_hosts: frozenset[bytes] = frozenset()  # the Host values that pass as sent, for a set lookup
        self._bearer = b""  # the Authorization value that passes as sent
        self._listener: asyncio.AbstractServer | None = None
        self._connections: set[Http1Connection] = set()
        self._waiting: Waiting | None = None  # http1.Waiting, once loaded
        self._waited = 0.0  # http1.WAITING, once loaded
        self._owners: PeerOwners | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._sweeper: Periodic | None = None
        self._sweep_connections: Callable[[set[Http1Connection]], None] | None = None  # http1.sweep, once loaded
        self.requests = 0
        self.refused = 0
        # Connections closed unserved: another user's, no room, too many waiting (http1.Waiting counts
        # those that waited too long).
        self.closed = {"otherUser": 0, "noRoom": 0, "tooManyWaiting": 0}
        self._closed_told = self._closed_counts()  # what the log has said so far
        self._other_users: set[int] = set()  # uids refused since the log last said so
        self.sessions_ended = 0  # idle sessions ended to make room for new ones
        # Sessions given room and still attaching: counted with the tables, so sessions opened at
        # the same moment (each attaching, none in a table yet) cannot pass the bound together.
        self._opening = 0

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
        self._set_token(read_token(self.token_path) or new_token(self.token_path))
        try:
            sock = socket.create_server((self.host, port), family=socket.AF_INET6 if ":" in self.host else socket.AF_INET)
        except OSError as exc:
            self.error = f"cannot listen on {self.host}:{port}: {exc.strerror or exc}; choose another port (ATOMICTOOLS_HTTP)"
            log.error("HTTP not served: %s", self.error)
            return
        sock.set_inheritable(False)
        self.port = sock.getsockname()[1]
        names = set(LOOPBACK_NAMES) if self.host in LOOPBACK_NAMES else set()
        names.add(self.host)
        self._allowed_hosts = frozenset(names)
        self._our_hosts = frozenset(f"{f'[{n}]' if ':' in n else n}:{self.port}".encode() for n in names)
        from atomictoolsd.transports import http1  # lazy: httptools loads only when HTTP is on (start-up, memory)

        self._waiting = http1.Waiting()
        self._waited = http1.WAITING
        self._owners = PeerOwners()
        self._listener = await asyncio.get_running_loop().create_server(
            http1.listen(self, self._connections, self._waiting), sock=sock
        )
        self._sweep_connections = http1.sweep
        self._sweeper = self.scheduler.every("HTTP sweep", self._sweep, _SWEEP_EVERY, logger=log)
        self._sweeper.start()
        log.info("serving MCP over HTTP on %s", self.url())

    async def stop(self) -> None:
        for session in [*self.sessions.values(), *self.stateless.values()]:
            session.end()
        self.sessions.clear()
        self.stateless.clear()
        self.rest.end()
        for task in list(self._tasks):
            task.cancel()
        if self._sweeper is not None:
            await self._sweeper.stop()
        if self._listener is not None:
            self._listener.close()
            for connection in list(self._connections):
                connection.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._listener.wait_closed(), 1)
        if self._owners is not None:
            self._owners.close()

    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}{ENDPOINT}"

    def info(self) -> dict[str, Any]:
        return {
            "url": self.url() if self.port else None,
            "error": self.error or None,
            "tokenFile": str(self.token_path) if self.token_path else None,
            "sessions": len(self.sessions),
            "statelessSessions": len(self.stateless),
            "sessionsEnded": self.sessions_ended,
            "connections": len(self._connections),
            "waiting": len(self._waiting) if self._waiting is not None else 0,
            "closed": self._closed_counts(),
            "requests": self.requests,
            "refused": self.refused,
        }

    def _set_token(self, token: str) -> None:
        self.token = token
        self._bearer = b"Bearer " + token.encode()

    def _rotate_method(self, session: Session, id_json: bytes, raw: Any) -> None:
        if self.token_path is None:
            session.send_error(id_json, INVALID_REQUEST, "HTTP is not served by this daemon: nothing to rotate")
            return
        self._set_token(new_token(self.token_path))
        session.send_result(id_json, _encode({"tokenFile": str(self.token_path)}))

    def _sweep(self) -> None:
        """Close idle connections; end the sessions nobody has used for ``SESSION_IDLE`` seconds
        and that have no stream open; say in the log what connections were closed unserved."""
        if self._sweep_connections is not None:
            self._sweep_connections(self._connections)
        self._tell_closed()
        now = time.monotonic()
        for table in (self.sessions, self.stateless, self.rest.sessions):
            for key, session in list(table.items()):
                if not session.exchanges and session.stream is None and now - session.used > SESSION_IDLE:
                    del table[key]
                    session.end()

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- connections ------------------------------------------------------------------------------

    def admit(self, connection: Http1Connection) -> bytes | None:
        """Close a connection another user of this machine made (Linux), before anything of it is
        read; make room for it in HTTP's share, closing the oldest connection still waiting to be let
        in (also when more than ``WAITING_MOST`` wait); refuse it when every one has been let in."""
        assert self.server is not None and self._waiting is not None
        transport = connection.transport
        sock = transport.get_extra_info("socket") if transport is not None else None
        uid = self._owners.uid(sock) if self._owners is not None and sock is not None else None
        if uid is not None and uid != os.geteuid():
            self.closed["otherUser"] += 1
            self._other_users.add(uid)
            return b""
        limit = self.server.http_connection_limit()
        waiting = self._waiting
        while len(waiting) > WAITING_MOST or len(self._connections) > limit:
            oldest = waiting.oldest()
            if oldest is connection:
                break
            self.closed["tooManyWaiting" if len(waiting) > WAITING_MOST else "noRoom"] += 1
            oldest.drop()
        if len(self._connections) > limit:
            self.closed["noRoom"] += 1
            body = (f"Too many HTTP connections: {limit} are open, each with a request let in "
                    f"(HTTP's share of the open-file limit; raise ulimit -n)").encode()
            return (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain\r\nconnection: close\r\n"
                    b"content-length: %d\r\n\r\n" % len(body) + body)
        return None

    def _closed_counts(self) -> dict[str, int]:
        return {**self.closed, "waitedTooLong": self._waiting.timed_out if self._waiting is not None else 0}

    def _tell_closed(self) -> None:
        """One log line for what was closed unserved since the last one (a flood is one line a sweep)."""
        counts = self._closed_counts()
        news = {k: n - self._closed_told[k] for k, n in counts.items() if n != self._closed_told[k]}
        if not news:
            return
        self._closed_told = counts
        parts = []
        if news.get("otherUser"):
            uids = ", ".join(str(u) for u in sorted(self._other_users))
            parts.append(f"{news['otherUser']} from another user of this machine (uid {uids}), as accepted")
        if news.get("waitedTooLong"):
            parts.append(f"{news['waitedTooLong']} that sent no request with the token within {self._waited:g} s")
        if news.get("tooManyWaiting"):
            parts.append(f"{news['tooManyWaiting']} still waiting for the token, for newer ones (at most {WAITING_MOST} wait)")
        if news.get("noRoom"):
            parts.append(f"{news['noRoom']} for want of room in HTTP's share of the open-file limit")
        self._other_users.clear()
        log.warning("HTTP: closed connections unserved: %s", "; ".join(parts),
                    extra={"event": "http.closed", "data": news})

    # -- what http1 asks -------------------------------------------------------------------------

    @property
    def max_body(self) -> int:
        assert self.server is not None
        return self.server.config.max_message_bytes

    def head(self, request: Request) -> Refusal | None:
        """Refused on its headers, before its body is read: the path, then Host, Origin and the
        token, then the method, and for a POST its media type and length."""
        self.requests += 1
        headers = request.headers
        path = request.path
        rest = False
        if path != b"/mcp" and (b"%" not in path or unquote_to_bytes(path) != b"/mcp"):
            rest = self.rest.serves(path)
            if not rest:
                # Before the token: a 401 for /.well-known/oauth-* would send a client into OAuth discovery.
                # Without the token, the connection is not let in all the same.
                request.shut_out = self._refuse(headers) is not None
                return _refusal(404, INVALID_REQUEST, f"Not found: the MCP endpoint is {ENDPOINT}, the tools REST API under /api/tools")
        refusal = self._refuse(headers)
        if refusal is not None:
            self.refused += 1
            return refusal
        if rest:
            return self.rest.head(request, self.max_body)
        method = request.method
        if method == b"POST":
            content_type = headers.get(b"content-type", b"")
            if content_type != _JSON and content_type.split(b";")[0].strip().lower() != _JSON:
                return _refusal(415, INVALID_REQUEST, "Unsupported media type: send Content-Type: application/json")
            length = headers.get(b"content-length")
            if length is not None and length.isdigit() and int(length) > self.max_body:
                return self._too_large()
            return None
        if method == b"GET" or method == b"DELETE":
            return None
        return _refusal(405, INVALID_REQUEST, f"Method {method.decode('latin-1')} not allowed", b"allow: GET, POST, DELETE\r\n")

    def handle(self, request: Request, response: Response) -> None:
        if request.too_large:
            response.send(*self._too_large())
        elif request.path != b"/mcp" and self.rest.serves(request.path):
            self.rest.handle(request, response)
        elif request.method == b"POST":
            self._post(request, response)
        elif request.method == b"GET":
            self._get(request, response)
        else:
            response.send(*self._delete(request.headers))

    def _too_large(self) -> Refusal:
        return _refusal(413, INVALID_REQUEST, f"Message too large: the limit is {self.max_body} bytes (ATOMICTOOLS_MAX_MESSAGE_BYTES)")

    def _refuse(self, headers: dict[bytes, bytes]) -> Refusal | None:
        """403 for a Host or Origin that is not this server, 401 without the right token."""
        host = headers.get(b"host", b"")
        if host not in self._our_hosts and not self._our_host(host.decode("latin-1"), scheme_port=None):
            return _refusal(403, INVALID_REQUEST, f"Forbidden: Host {host.decode('latin-1')!r} is not this server (DNS rebinding protection)")
        origin = headers.get(b"origin")
        if origin is not None:
            if origin == b"null":
                return _refusal(403, INVALID_REQUEST, "Forbidden: an opaque Origin (null) is not this server")
            parts = urlsplit(origin.decode("latin-1"))
            if parts.scheme not in ("http", "https") or not self._our_host(parts.netloc, scheme_port=80 if parts.scheme == "http" else 443):
                return _refusal(403, INVALID_REQUEST, f"Forbidden: Origin {origin.decode('latin-1')!r} is not this server")
        given = headers.get(b"authorization", b"")
        if hmac.compare_digest(given, self._bearer):
            return None  # as every client sends it; else the same compare, after the parsing HTTP allows
        scheme, _, credential = given.partition(b" ")
        if scheme.lower() != b"bearer" or not credential:
            return _refusal(401, INVALID_REQUEST, f"Unauthorized: send Authorization: Bearer <the token in {self.token_path}>",
                            b'www-authenticate: Bearer realm="atomictoolsd"\r\n')
        if not hmac.compare_digest(credential.strip(), self._bearer[7:]):
            return _refusal(401, INVALID_REQUEST, f"Unauthorized: the token is not this daemon's (it may have been rotated: read {self.token_path})",
                            b'www-authenticate: Bearer realm="atomictoolsd", error="invalid_token"\r\n')
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

    def _post(self, request: Request, response: Response) -> None:
        body = request.body
        headers = request.headers
        try:
            message = msgspec.json.decode(body, type=_Envelope)
        except msgspec.ValidationError:
            if body.lstrip()[:1] == b"[":
                self._post_batch(request, response)
            else:
                response.send(*_refusal(400, INVALID_REQUEST, "Invalid request: expected a JSON-RPC object"))
            return
        except (msgspec.DecodeError, UnicodeDecodeError, RecursionError) as exc:  # Unicode…: a string not UTF-8
            if _repaired(request, exc):
                self._post(request, response)
            else:
                response.send(*_refusal(400, PARSE_ERROR, f"Parse error: {exc}"))
            return
        if not body.isascii() and not _is_utf8(body):  # inside a string the envelope kept raw (the id, params)
            response.send(*_refusal(400, PARSE_ERROR, "Parse error: a string in the message is not UTF-8"))
            return
        version = headers.get(b"mcp-protocol-version")
        # A 2026-07-28 request is one whose params' _meta names a revision; the bytes test only
        # spares the decode for every other request (an argument may contain the key's text too).
        # A request in a stateful session (Mcp-Session-Id) is never one. The params' name and
        # _meta are decoded once, when either is asked about (find, not ``in``: see
        # sessions/connection.py).
        names_revision = body.find(META_VERSION_BYTES) >= 0
        params = _params(message) if names_revision or b"mcp-name" in headers else _NO_NAME
        stateless_request = (
            names_revision
            and message.method is not UNSET
            and b"mcp-session-id" not in headers
            and scalar(params.meta.get(META_VERSION)) is not None
        )
        if version is not None and version.decode("latin-1") not in REVISIONS:
            text = f"Unsupported MCP-Protocol-Version {version.decode('latin-1')!r}; supported: {', '.join(REVISIONS)}"
            error = {"code": UNSUPPORTED_VERSION, "message": text, "data": {"supported": list(REVISIONS), "requested": version.decode("latin-1")}} \
                if stateless_request else {"code": INVALID_REQUEST, "message": text}
            response.send(400, _JSON_HEAD, _encode({"jsonrpc": "2.0", "id": None, "error": error}))
            return
        mismatch = _header_mismatch(headers, message, params, stateless_request)
        if mismatch:
            response.send(*_refusal(400, HEADER_MISMATCH, mismatch))
            return
        if not _acceptable(headers.get(b"accept")):
            response.send(*_refusal(406, INVALID_REQUEST, "Not acceptable: an answer comes as application/json or "
                                    "text/event-stream; send Accept: application/json, text/event-stream"))
            return
        session_id = headers.get(b"mcp-session-id")
        if session_id is not None:
            session = self.sessions.get(session_id)
            if session is None:
                response.send(*_refusal(404, INVALID_REQUEST, "Session not found: it ended or the daemon restarted; initialize again"))
                return
            self._deliver(session, message, request, response, b"")
            return
        if message.method == "initialize":
            self._spawn(self._open(request, message, response))
            return
        session = self.stateless.get(request.query)
        if session is not None and session.open:
            self._deliver(session, message, request, response, b"")
            return
        self._spawn(self._open(request, message, response))

    async def _open(self, request: Request, message: _Envelope, response: Response) -> None:
        """A new session for this request (``initialize``, or the first stateless request of a URL)."""
        stateful = message.method == "initialize"
        made = await self._new_session(request.query, stateful)
        if isinstance(made, str):
            response.send(*_refusal(400, INVALID_REQUEST, made))
            return
        extra = b""
        if stateful:
            self.sessions[made.key.encode()] = made
            extra = b"mcp-session-id: " + made.key.encode() + b"\r\n"
        else:
            existing = self.stateless.get(request.query)
            if existing is not None and existing.open:
                made.end()  # another request for this URL made one while this one attached
                made = existing
            else:
                self.stateless[request.query] = made
        self._deliver(made, message, request, response, extra)

    def _deliver(self, session: HttpSession, message: _Envelope, request: Request, response: Response, extra: bytes) -> None:
        """Hand the message to its session; its answer goes to ``response`` (see ``_Exchange``)."""
        if response.done:
            return  # the client went away while its session was being made
        session.used = time.monotonic()
        method = message.method
        if method is UNSET or message.id is UNSET:
            if method == "notifications/cancelled":
                self._cancel_by_client_id(session, message.params)
            else:
                _hand_over(session, request.body)  # a notification, or the client's answer to a tool's question
            response.send(202, extra, b"")
            return
        client_id = bytes(message.id)
        exchanges = session.exchanges
        streams = _takes_sse(request.headers.get(b"accept"))
        if session.stateful and client_id not in exchanges and _canonical(client_id):
            # One client's session, whose ids it must not reuse (MCP says so), and this one reads
            # back as sent: the session knows the request by the client's id, and its envelope is
            # held to what a socket line's is. A stateless session is every client's of its URL:
            # there ids are always the daemon's own.
            exchange = exchanges[client_id] = _Exchange(session, client_id, client_id, method, response, extra, streams)
            response.on_gone = exchange.gone
            if scalar(message.jsonrpc) != "2.0":
                session.error(client_id, encode_error(INVALID_REQUEST, 'Invalid request: "jsonrpc" must be "2.0"'))
                return
            session.core.handle_request(client_id, method, message.params)
            return
        internal = _internal_id(exchanges)
        exchange = exchanges[internal] = _Exchange(session, internal, client_id, method, response, extra, streams)
        response.on_gone = exchange.gone
        session.core.handle_request(internal, method, message.params)

    def _post_batch(self, request: Request, response: Response) -> None:
        """A POST whose body is a batch: taken in a stateful 2025-03-26 session, refused elsewhere."""
        headers = request.headers
        session_id = headers.get(b"mcp-session-id")
        session = self.sessions.get(session_id) if session_id is not None else None
        if session_id is not None and session is None:
            response.send(*_refusal(404, INVALID_REQUEST, "Session not found: it ended or the daemon restarted; initialize again"))
            return
        if session is None or not session.core.batching:
            response.send(*_refusal(400, INVALID_REQUEST, "Batches are not supported: send one JSON-RPC message per "
                                    "request (only a session initialized with MCP 2025-03-26 takes batches)"))
            return
        if not _acceptable(headers.get(b"accept")):
            response.send(*_refusal(406, INVALID_REQUEST, "Not acceptable: an answer comes as application/json or "
                                    "text/event-stream; send Accept: application/json, text/event-stream"))
            return
        try:
            messages = batches.decode_batch(request.body)
        except (msgspec.DecodeError, UnicodeDecodeError, RecursionError) as exc:
            if _repaired(request, exc):
                self._post_batch(request, response)
            else:
                response.send(*_refusal(400, PARSE_ERROR, f"Parse error: {exc}"))
            return
        refusal = batches.too_many(len(messages))
        if refusal:
            response.send(*_refusal(400, INVALID_REQUEST, refusal))
            return
        session.used = time.monotonic()
        batch = _Batch(session, response, _takes_sse(headers.get(b"accept")))
        response.on_gone = batch.gone
        for message in messages:
            self._deliver_part(batch, bytes(message))
        batch.reading = False
        batch.settle()

    def _deliver_part(self, batch: _Batch, raw: bytes) -> None:
        """Hand one message of a batch to its session; a request's answer goes to the batch."""
        session = batch.session
        try:
            message = msgspec.json.decode(raw, type=_Envelope)
        except (msgspec.MsgspecError, UnicodeDecodeError, RecursionError):
            batch.add(_jsonrpc_error(INVALID_REQUEST, "Invalid request: expected a JSON-RPC object"))
            return
        method = message.method
        if method is UNSET or message.id is UNSET:
            if method == "notifications/cancelled":
                self._cancel_by_client_id(session, message.params)
            else:
                _hand_over(session, raw)  # a notification, or the client's answer to a tool's question
            return
        client_id = bytes(message.id)
        why = batches.refusal(client_id, method)
        if not why and scalar(message.jsonrpc) != "2.0":
            why = 'Invalid request: "jsonrpc" must be "2.0"'
        if why:
            batch.add(batches.error_answer(client_id, INVALID_REQUEST, why))
            return
        internal = _internal_id(session.exchanges)
        session.exchanges[internal] = batch.parts[internal] = _BatchPart(batch, internal, client_id, method)
        session.core.handle_request(internal, method, message.params)

    def _cancel_by_client_id(self, session: HttpSession, raw: msgspec.Raw | UnsetType) -> None:
        """``notifications/cancelled`` names the client's id; the session knows the call by ours."""
        try:
            request_id = _encode(msgspec.json.decode(raw, type=_Cancelled).requestId) if raw is not UNSET else None
        except msgspec.MsgspecError:
            return  # notifications get no answer, not even an error
        for internal, exchange in list(session.exchanges.items()):
            if exchange.client_id == request_id:
                exchange.drop()
                session.core.cancel(internal)

    # -- sessions ---------------------------------------------------------------------------------

    async def _new_session(self, query_string: bytes, stateful: bool) -> HttpSession | str:
        """A session for the URL's project and lists, or why there is none (said to this request only)."""
        assert self.server is not None
        query_text = query_string.decode("latin-1")
        if not self._make_room():
            return (f"Too many HTTP sessions: {MAX_SESSIONS} are open and each has a request in flight or a "
                    f"stream open; end one (DELETE) or try again when one is done")
        self._opening += 1
        try:
            # The caller puts the session in its table as soon as this returns, with no await between.
            return await self._attached_session(query_text, stateful)
        finally:
            self._opening -= 1

    async def _attached_session(self, query_text: str, stateful: bool) -> HttpSession | str:
        """A new session, attached to the project the URL's query names (``_new_session``)."""
        assert self.server is not None
        session = HttpSession(self.server, secrets.token_urlsafe(24) if stateful else query_text, stateful)
        core = session.core
        if not self.server.accept(core, None):
            session.close()
            return "Too many connections: the daemon takes no more sessions now (max_connections)"
        query = parse_qs(query_text)
        # The URL's lists, as an attach's params hold them (bounded alike: decode_globs).
        allow = msgspec.Raw(_encode([g for v in query.get("allow", []) for g in v.split(",") if g]))
        deny = msgspec.Raw(_encode([g for v in query.get("deny", []) for g in v.split(",") if g]))
        dispatcher = query.get("dispatcher", ["0"])[-1].lower() in ("1", "true", "yes", "on")
        directory = query.get("directory", [None])[-1]
        if directory is None:
            # No project: the global and built-in tools, with the URL's lists, locked like the shim's.
            try:
                core.allow, core.deny = decode_globs(allow, "allow"), decode_globs(deny, "deny")
            except ParamsError as exc:
                session.end()
                return f"the URL's lists: {exc}"
            core.dispatcher, core.locked, core.agent = dispatcher, True, "http"
            return session
        params = AttachParams(lock=True, directory=directory, agent="http", allow=allow, deny=deny, dispatcher=dispatcher,
                              sessionId=session.key[:12] if stateful else "http")
        try:
            await core.attach(params)
        except ParamsError as exc:
            session.end()
            return f"directory in the URL: {exc}"
        except Exception as exc:  # as a request's handler failing is answered
            log.exception("attaching an HTTP session failed")
            session.end()
            return f"directory in the URL: Internal error: {type(exc).__name__}: {exc}"
        return session

    def _make_room(self) -> bool:
        """Whether a new session fits, once the one idle the longest has ended if need be (MCP's and
        the REST API's alike)."""
        tables = (self.sessions, self.stateless, self.rest.sessions)
        if sum(map(len, tables)) + self._opening < MAX_SESSIONS:
            return True
        idle = [
            (session.used, table, key)
            for table in tables
            for key, session in table.items()
            if not session.exchanges and session.stream is None
        ]
        if not idle:
            return False
        _used, table, key = min(idle, key=lambda entry: entry[0])
        table.pop(key).end()
        self.sessions_ended += 1
        return True

    def _delete(self, headers: dict[bytes, bytes]) -> Refusal:
        session_id = headers.get(b"mcp-session-id")
        if session_id is None:
            return _refusal(400, INVALID_REQUEST, "DELETE needs the Mcp-Session-Id of the session to end")
        session = self.sessions.pop(session_id, None)
        if session is None:
            return _refusal(404, INVALID_REQUEST, "Session not found")
        session.end()
        return 200, b"", b""

    # -- GET: the session's stream ----------------------------------------------------------------

    def _get(self, request: Request, response: Response) -> None:
        headers = request.headers
        if not _takes_sse(headers.get(b"accept")):
            response.send(*_refusal(406, INVALID_REQUEST, "Not acceptable: GET opens an SSE stream; send Accept: text/event-stream"))
            return
        session_id = headers.get(b"mcp-session-id")
        if session_id is None:
            response.send(*_refusal(405, INVALID_REQUEST, "GET needs an Mcp-Session-Id (initialize first); stateless clients "
                                    "listen with subscriptions/listen", b"allow: POST, DELETE\r\n"))
            return
        session = self.sessions.get(session_id)
        if session is None:
            response.send(*_refusal(404, INVALID_REQUEST, "Session not found: initialize again"))
            return
        if session.stream is not None:
            response.send(*_refusal(409, INVALID_REQUEST, "Conflict: this session already has its GET stream open"))
            return
        stream = session.stream = _Stream(session, response)
        response.on_gone = stream.gone
        response.start(200, _SSE_HEAD)
        response.write(b": stream open\n\n")


def _canonical(id_json: bytes) -> bool:
    """Whether the session, re-encoding this id, gets these very bytes: a plain integer, or a string
    without escapes (it keys calls and answers by its own encoding of the id)."""
    if id_json[:1] == b'"':
        return b"\\" not in id_json
    return id_json.isdigit() and (id_json[:1] != b"0" or id_json == b"0")


def _internal_id(exchanges: dict[bytes, Any]) -> bytes:
    """An id of the daemon's own for a request whose client id cannot be used as it is: taken by a
    request in flight in the same session (two clients of one stateless URL), or re-encoded
    differently; never one a client's own id in flight already has."""
    while True:
        internal = b'"h%d"' % next(_ids)
        if internal not in exchanges:
            return internal


def _params(message: _Envelope) -> _Name:
    """The request's ``name`` and ``_meta``, or empty ones where its params have neither."""
    if message.params is UNSET:
        return _Name()
    try:
        return msgspec.json.decode(message.params, type=_Name)
    except msgspec.MsgspecError:
        return _Name()


def _header_mismatch(headers: dict[bytes, bytes], message: _Envelope, params: _Name, stateless_request: bool) -> str:
    """The 2026-07-28 routing headers must say what the body says (a proxy routes on them); a
    request of that revision (``stateless_request``: its ``_meta`` names it) must carry them: ``Mcp-Method``,
    ``MCP-Protocol-Version`` equal to its ``_meta`` revision, and ``Mcp-Name`` on a ``tools/call``.
    ``params``: the message's (``_params``), decoded when an ``Mcp-Name`` header or the revision's
    key is there."""
    method_header = headers.get(b"mcp-method")
    if method_header is None and stateless_request:
        return "Mcp-Method header missing: a 2026-07-28 request over HTTP names its method in it"
    if method_header is not None and message.method is not UNSET and method_header.decode("latin-1") != message.method:
        return f"Mcp-Method header {method_header.decode('latin-1')!r} does not match the body's method {message.method!r}"
    name_header = headers.get(b"mcp-name")
    if (name_header is not None or stateless_request) and message.params is not UNSET:
        name = scalar(params.name)
        if name_header is None:
            if message.method == "tools/call" and isinstance(name, str):
                return "Mcp-Name header missing: a 2026-07-28 tools/call over HTTP names its tool in it"
        elif name_header.decode("latin-1") != name:
            return f"Mcp-Name header {name_header.decode('latin-1')!r} does not match the body's name {name!r}"
        if stateless_request:
            asked = scalar(params.meta.get(META_VERSION))
            version = headers.get(b"mcp-protocol-version")
            if version is None:
                return f"MCP-Protocol-Version header missing: a 2026-07-28 request over HTTP repeats its _meta revision ({asked!r}) in it"
            if version.decode("latin-1") != asked:
                return f"MCP-Protocol-Version header {version.decode('latin-1')!r} does not match the body's _meta revision {asked!r}"
    return ""
