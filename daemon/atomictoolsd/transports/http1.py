"""HTTP/1.1 for the daemon's Streamable HTTP endpoint: httptools' parser on an asyncio Protocol.

httptools (llhttp, the parser of Node.js, from the makers of uvloop) does the part that is easy to
get subtly wrong: request lines, headers split across reads, ``Content-Length`` against chunked
bodies, and the ambiguities request smuggling lives on (two lengths, a length beside chunked), which
it refuses. What this module adds is small and has no MCP in it:

- one request at a time per connection, answered in the order they came (pipelining), each
  response whole with a ``Content-Length``, or chunked (an SSE stream);
- keep-alive as the request asks (HTTP/1.0 closes unless it says keep-alive), ``Expect:
  100-continue``, ``HEAD`` answered without a body, an ``Upgrade`` request answered as a plain one
  and the connection then closed;
- limits: the request line and headers (``MAX_HEAD``; a header that never ends, ``_HEAD_GUARD``),
  the body (the handler's ``max_body``, not buffered past it), a request that does not arrive whole
  within ``IDLE`` seconds of the previous answer (``sweep``), and a client that does not read its
  answers stops being read;
- who waits at the door: the handler may refuse a connection as it comes (``admit``), before
  anything is read; and a connection is *waiting* until the handler lets a request of it in (judges
  its head with no 401 or 403, and does not mark it ``shut_out``): one still waiting ``WAITING``
  seconds after it came is closed. The
  waiting ones are kept in arrival order (``Waiting``), so the handler can bound them (``drop``
  closes one at once);
- a client that goes away before its answer is told to the handler (``Response.on_gone``).

What a request means is the handler's (``transports/http.py``): ``head`` judges a request on its
line and headers, before its body is read; ``handle`` answers it, now or later, through its
``Response``. Nothing here makes a task or a future per request.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from http import HTTPStatus
from typing import Any, Protocol

import httptools

__all__ = ["IDLE", "MAX_HEAD", "WAITING", "Handler", "Http1Connection", "Refusal", "Request", "Response", "Waiting"]

log = logging.getLogger("atomictoolsd.http")

MAX_HEAD = 64 * 1024  # the request line and headers, together
# httptools keeps a header it has not seen the end of in a buffer of its own, out of our reach:
# bytes fed with no head completed past this close the connection (a read is at most 256 KiB, so
# one that completes a pipelined request and starts the next is never mistaken for a long head).
_HEAD_GUARD = 16 * MAX_HEAD
IDLE = 30.0  # a connection with no request in flight, and no request whole since, is closed after this
_PIPELINED = 8  # requests read ahead of the one being answered before reading stops
WAITING = 5.0  # seconds a connection may stay before a request of it is let in (no 401 or 403)
_NOT_LET_IN = frozenset({401, 403})  # what a handler answers a request it does not let in

# (status, header lines ending in CRLF, body): an answer given before the body is read.
Refusal = tuple[int, bytes, bytes]

_STATUS = {s.value: b"HTTP/1.1 %d %s\r\n" % (s.value, s.phrase.encode()) for s in HTTPStatus}
_CLOSE = b"connection: close\r\n"
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


class Request:
    """One request: its method, path and query (bytes, as sent), headers by lowercased name, body.

    A header sent twice is joined with ``", "`` (the list form HTTP defines), so a second ``Host``,
    ``Origin`` or ``Authorization`` cannot slip past a check that reads one of them.
    """

    __slots__ = ("answered", "body", "headers", "keep_alive", "method", "path", "query", "refusal", "shut_out", "too_large")

    def __init__(self, method: bytes, target: bytes, headers: dict[bytes, bytes], keep_alive: bool) -> None:
        self.method = method
        if target[:1] != b"/":  # absolute-form (a proxy's), or something else the path check refuses
            try:
                url = httptools.parse_url(target)
                target = (url.path or b"") + (b"?" + url.query if url.query else b"")
            except httptools.HttpParserInvalidURLError:
                target = b""
        path, _, query = target.partition(b"?")
        self.path = path
        self.query = query.partition(b"#")[0]
        self.headers = headers
        self.keep_alive = keep_alive
        self.body = b""
        self.refusal: Refusal | None = None
        self.answered = False  # refused before its body came: the body is read past, not answered again
        self.too_large = False  # the body passed the handler's max_body; what came is not kept
        self.shut_out = False  # refused by the handler with what it would not let in (a 404 without the token)


class Handler(Protocol):
    max_body: int

    def admit(self, connection: Http1Connection) -> bytes | None:
        """None to serve a new connection; else what to write to it before it is closed (``b""``:
        nothing), before anything of it is read."""

    def head(self, request: Request) -> Refusal | None:
        """The answer to a request refused on its line and headers alone; None to read its body."""

    def handle(self, request: Request, response: Response) -> None:
        """Answer ``request`` through ``response``, now or later."""


class Response:
    """How a handler answers one request: ``send`` a whole response, or ``start`` one whose body
    comes in chunks (``write``, then ``end``). ``on_gone`` is called if the client goes away first."""

    __slots__ = ("_connection", "_head_only", "done", "on_gone", "started")

    def __init__(self, connection: Http1Connection, head_only: bool) -> None:
        self._connection = connection
        self._head_only = head_only
        self.started = False
        self.done = False
        self.on_gone: Callable[[], None] | None = None

    def send(self, status: int, headers: bytes, body: bytes) -> None:
        """The whole response: ``headers`` are ``name: value\\r\\n`` lines, ``Content-Length`` is added."""
        if self.done or self.started:
            return
        self.done = True
        connection = self._connection
        close = b"" if connection.keep_alive else _CLOSE
        head = _STATUS[status] + headers + b"content-length: %d\r\n" % len(body) + close + b"\r\n"
        connection.write(head if self._head_only else head + body)
        connection.finished(self)

    def start(self, status: int, headers: bytes) -> None:
        """The head of a response whose body follows in chunks."""
        if self.done or self.started:
            return
        self.started = True
        close = b"" if self._connection.keep_alive else _CLOSE
        self._connection.write(_STATUS[status] + headers + b"transfer-encoding: chunked\r\n" + close + b"\r\n")

    def write(self, data: bytes) -> None:
        if self.started and not self.done and data:
            self._connection.write(b"%x\r\n" % len(data) + data + b"\r\n")

    def end(self, data: bytes = b"") -> None:
        """The last chunk (``data`` may be empty): the response is complete."""
        if not self.started or self.done:
            return
        self.done = True
        self._connection.write((b"%x\r\n" % len(data) + data + b"\r\n" if data else b"") + b"0\r\n\r\n")
        self._connection.finished(self)

    def buffered(self) -> int:
        """Bytes written and not yet taken by the client."""
        transport = self._connection.transport
        return transport.get_write_buffer_size() if transport is not None else 0

    def gone(self) -> None:
        if not self.done:
            self.done = True
            if self.on_gone is not None:
                self.on_gone()


class Waiting:
    """The connections of one listener that no request has been let in on yet, oldest first, and how
    many were closed for waiting ``WAITING`` seconds."""

    __slots__ = ("connections", "timed_out")

    def __init__(self) -> None:
        self.connections: dict[Http1Connection, None] = {}  # a dict: an ordered set
        self.timed_out = 0

    def __len__(self) -> int:
        return len(self.connections)

    def oldest(self) -> Http1Connection:
        return next(iter(self.connections))


class Http1Connection(asyncio.Protocol):
    """One client connection: requests parsed by httptools, handed to ``handler`` one at a time."""

    def __init__(self, handler: Handler, connections: set[Http1Connection], waiting: Waiting) -> None:
        self.handler = handler
        self.connections = connections
        self.waiting = waiting
        self._waiting_timer: asyncio.TimerHandle | None = None
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.current: Response | None = None  # the request being answered
        self.queue: deque[Request] = deque()  # requests read while one was being answered
        self.keep_alive = True  # after the request being answered
        self.idle_since = time.monotonic()
        self._paused = False
        self._last = False  # read nothing more: after an Upgrade, a parse error, a refused Expect
        # The request being read.
        self._url = b""
        self._headers: dict[bytes, bytes] = {}
        self._head_size = 0
        self._unfinished = 0  # bytes fed since the last head completed, while inside a head
        self._request: Request | None = None
        self._chunks: list[bytes] = []
        self._size = 0

    # -- asyncio.Protocol -----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.connections.add(self)
        self.waiting.connections[self] = None
        refusal = self.handler.admit(self)
        if refusal is not None:
            self._forget()
            self._last = True
            if refusal:
                transport.write(refusal)  # type: ignore[attr-defined]
            transport.close()
            return
        self._waiting_timer = asyncio.get_running_loop().call_later(WAITING, self._waited_too_long)

    def connection_lost(self, exc: Exception | None) -> None:
        self._forget()
        self.queue.clear()
        current, self.current = self.current, None
        if current is not None:
            current.gone()

    def data_received(self, data: bytes) -> None:
        if self._last:
            return
        try:
            self.parser.feed_data(data)
            if self._request is None:  # inside a request's head
                self._unfinished += len(data)
                if self._unfinished > _HEAD_GUARD:
                    self._refuse_head()
        except httptools.HttpParserUpgrade:
            # The request was read whole and is answered as a plain one (see on_headers_complete).
            self._last = True
        except httptools.HttpParserError as exc:
            log.debug("http: a malformed request: %s", exc)
            self._last = True
            self.queue.clear()
            if self.current is None and self.transport is not None:
                body = b"Bad Request: " + str(exc).encode("latin-1", "replace")
                self.write(_STATUS[400] + b"content-type: text/plain\r\ncontent-length: %d\r\n" % len(body) + _CLOSE + b"\r\n" + body)
            self.close()

    def _forget(self) -> None:
        self.transport = None
        self.connections.discard(self)
        self._let_in()

    def _let_in(self) -> None:
        self.waiting.connections.pop(self, None)
        if self._waiting_timer is not None:
            self._waiting_timer.cancel()
            self._waiting_timer = None

    def _waited_too_long(self) -> None:
        self._waiting_timer = None
        if self in self.waiting.connections:
            self.waiting.timed_out += 1
            self.drop()

    def drop(self) -> None:
        """Close now, nothing more written; the connection no longer counts as open or waiting."""
        transport = self.transport
        self._forget()
        self._last = True
        if transport is not None:
            transport.abort()

    def _refuse_head(self) -> None:
        self._last = True
        self.queue.clear()
        if self.current is None:
            body = b"Request header fields too large"
            self.write(_STATUS[431] + b"content-type: text/plain\r\ncontent-length: %d\r\n" % len(body) + _CLOSE + b"\r\n" + body)
        self.close()

    def pause_writing(self) -> None:
        # The client is not reading its answers: stop reading its requests until it catches up.
        if self.transport is not None and not self._paused:
            self.transport.pause_reading()
            self._paused = True

    def resume_writing(self) -> None:
        if self.transport is not None and self._paused and len(self.queue) < _PIPELINED:
            self._paused = False
            self.transport.resume_reading()

    # -- httptools' callbacks --------------------------------------------------------------------

    def on_url(self, url: bytes) -> None:
        self._head_size += len(url)
        if self._head_size <= MAX_HEAD:
            self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_size += len(name) + len(value) + 4
        if self._head_size > MAX_HEAD:
            return  # refused at on_headers_complete; nothing more is kept
        name = name.lower()
        seen = self._headers.get(name)
        self._headers[name] = value if seen is None else seen + b", " + value

    def on_headers_complete(self) -> None:
        parser = self.parser
        # An Upgrade (to WebSocket, h2c) is not served: the request is answered as a plain one, and
        # the connection closes after it, as nothing after it can be read as HTTP/1.1.
        keep_alive = parser.should_keep_alive() and not parser.should_upgrade()
        headers = self._headers
        request = self._request = Request(parser.get_method(), self._url, headers, keep_alive)
        # What was kept of this request's head is its own now; the next one starts afresh (no
        # on_message_begin: one callback less per request).
        self._url, self._headers = b"", {}
        self._size = self._unfinished = 0
        if self._head_size > MAX_HEAD:
            request.refusal = (431, b"content-type: text/plain\r\n", b"Request header fields too large")
        else:
            try:
                request.refusal = self.handler.head(request)
            except Exception:  # a bug, not a bad request: say so, as _answer does
                log.exception("http: a request failed")
                request.keep_alive = False
                request.refusal = (500, b"content-type: text/plain\r\n", b"Internal Server Error")
            if request.refusal is None or (request.refusal[0] not in _NOT_LET_IN and not request.shut_out):
                self._let_in()
        self._head_size = 0
        expects = headers.get(b"expect", b"").lower() == b"100-continue"
        if self.current is not None:
            return  # answered in turn, after the body
        if request.refusal is not None:
            # Answered now, before its body; the body is then read past. A client that sent
            # Expect: 100-continue may never send it: the connection closes instead.
            if expects:
                request.keep_alive = False
                self._last = True
            request.answered = True
            self._answer(request)
        elif expects:
            self.write(_CONTINUE)

    def on_body(self, body: bytes) -> None:
        request = self._request
        if request is None or request.refusal is not None or request.too_large:
            return  # a refused request's body is read past, not kept
        self._size += len(body)
        if self._size > self.handler.max_body:
            request.too_large = True
            self._chunks = []
        else:
            self._chunks.append(body)

    def on_message_complete(self) -> None:
        request, self._request = self._request, None
        chunks, self._chunks = self._chunks, []
        if request is None or request.answered:
            if self.current is None:
                self.idle_since = time.monotonic()  # read whole: the idle clock starts now
            return
        request.body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        if self.current is None:
            self._answer(request)
            return
        self.queue.append(request)
        if len(self.queue) >= _PIPELINED and self.transport is not None and not self._paused:
            self.transport.pause_reading()
            self._paused = True

    # -- answering -------------------------------------------------------------------------------

    def _answer(self, request: Request) -> None:
        self.keep_alive = request.keep_alive and not (self._last and not self.queue)
        response = self.current = Response(self, head_only=request.method == b"HEAD")
        if request.refusal is not None:
            response.send(*request.refusal)
            return
        try:
            self.handler.handle(request, response)
        except Exception:
            log.exception("http: a request failed")
            if not response.started:
                self.keep_alive = False
                response.send(500, b"content-type: text/plain\r\n", b"Internal Server Error")
            else:
                self.close()

    def write(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(data)

    def finished(self, response: Response) -> None:
        """``response`` is complete: close, or answer the next request read."""
        if response is not self.current:
            return
        self.current = None
        self.idle_since = time.monotonic()
        if not self.keep_alive:
            self.close()
        elif self.queue:
            # A turn of the loop later, so a pipelined burst does not answer itself recursively.
            asyncio.get_running_loop().call_soon(self._next)

    def _next(self) -> None:
        if self.current is not None or not self.queue or self.transport is None:
            return
        request = self.queue.popleft()
        if self._paused and len(self.queue) < _PIPELINED and not self.transport.get_write_buffer_size():
            self._paused = False
            self.transport.resume_reading()
        self._answer(request)

    def close(self) -> None:
        """After what is written has been sent."""
        if self.transport is not None:
            self.transport.close()

    def idle_for(self, now: float) -> float:
        """Seconds since the last answer with no request read whole since; 0 while one is answered."""
        return 0.0 if self.current is not None else now - self.idle_since


def sweep(connections: set[Http1Connection], idle: float = IDLE) -> None:
    """Close the connections idle for longer than ``idle`` (keep-alive ended; a request sent slowly)."""
    now = time.monotonic()
    for connection in list(connections):
        if connection.idle_for(now) > idle:
            connection.close()


def listen(handler: Handler, connections: set[Http1Connection], waiting: Waiting) -> Callable[[], Any]:
    """The protocol factory for ``loop.create_server``."""
    return lambda: Http1Connection(handler, connections, waiting)
