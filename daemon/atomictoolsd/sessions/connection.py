"""One connection's reading and writing: NDJSON framing, the JSON-RPC envelope's rules, and every
line the daemon writes to a client.

``Connection`` reads one message per line and never lets a bad line end the connection: a malformed
line gets ``-32700``/``-32600``, an oversized one a clear error, and the next line is read as usual.
Each request is answered exactly once (``send_result``/``send_error``); an id still in flight is
refused. A line holding ``"tools/call"`` is decoded whole, envelope, params and ``_meta``, in one
step (``messages.CallRequest``) and goes straight to ``start_call``; any other request goes to the
handler its subclass names for the method (``HANDLERS``), or to one a component registered in the
host's ``methods``. Answers are written joined once, with no intermediate bytes objects. A line
holding a JSON array is a batch: taken in a session whose revision has them (2025-03-26, see
``batches``), refused otherwise.

It knows no method itself: ``session.Session`` adds them (the handlers, what a session sees, the
call path) and the state they keep.
"""

from __future__ import annotations

import asyncio
import logging
import re
import select
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

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
from atomictoolsd.config.discovery import escape_strings
from atomictoolsd.sessions import batches, revisions
from atomictoolsd.sessions.messages import (
    TOO_DEEP,
    CallParams,
    ParamsError,
    clip,
    decode_call,
    decode_message,
)

if TYPE_CHECKING:
    from atomictoolsd.config.settings import Config
    from atomictoolsd.sessions.asking import Asking

__all__ = ["LOCKED_OUT", "Connection", "ConnectionHost", "Handler", "clip", "encode_report"]

log = logging.getLogger("atomictoolsd.session")

_encode = msgspec.json.encode

LEVEL_RANK = {level: rank for rank, level in enumerate(LOG_LEVELS)}

# A client this far behind on reading has stopped reading: its log and progress notifications are
# dropped (and counted, and the count told once it catches up) rather than held, so a tool that
# floods them cannot grow the daemon's memory. Answers and list_changed are never dropped: answers
# are bounded by the calls in flight (a client that does not read is no longer read), list_changed
# by the reloads.
_LOSSY_BACKLOG = 4 * 1024 * 1024
_LOSSY = frozenset({"notifications/message", "notifications/progress"})

_CALL_METHOD = b'"tools/call"'  # a line holding it is first read as a CallRequest, in one decode
_META_VERSION = revisions.META_VERSION_BYTES  # a line holding it is a 2026-07-28 request
# A line this long is within any max_message_bytes (whose least is 1024): data_received passes it on
# without reading the setting.
_WITHIN_ANY_LIMIT = 1025
_RESULT_HEAD = b'{"jsonrpc":"2.0","id":'
_RESULT_MID = b',"result":'
_ERROR_MID = b',"error":'
_LINE_END = b"}\n"
_join = b"".join

# What a locked session (an agent's, through the shim, which relays every line) may not do: move
# to another project or allowlist, stop the daemon, or make launchers. The allowlist is what the
# agent is offered over MCP; it is no sandbox against an agent that also has a shell.
LOCKED_OUT = frozenset({"atomic/attach", "atomic/shutdown", "atomic/bridges/create", "atomic/bridges/remove"})

# A request handler: (session, request id as JSON, raw params) → None when it has answered, or an
# awaitable that answers. Raising ParamsError answers -32602. Components add theirs to
# ``Server.methods``.
Handler = Callable[[Any, bytes, Any], "None | Awaitable[None]"]


class ConnectionHost(Protocol):
    """What a connection reads of the daemon that accepted it: the message size limit, and the
    components' methods."""

    config: Config
    methods: dict[str, Handler]


class Connection(asyncio.Protocol):
    """Reading lines and writing answers for one client; ``session.Session`` is the one subclass."""

    HANDLERS: ClassVar[dict[str, Handler]] = {}  # the methods the subclass answers itself

    def __init__(self, server: ConnectionHost) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._discarding = False  # inside a line already refused as oversized
        # The stateless revision (2026-07-28): every request names it in _meta, none needs initialize;
        # list changes go only to this session's subscriptions/listen requests (id as JSON → id).
        self.modern = False
        self.listens: dict[bytes, Any] = {}
        self.locked = False  # attached with lock: LOCKED_OUT methods are refused from now on
        self.log_level = "info"
        self.dropped = 0  # log and progress notifications dropped since the client stopped reading
        self.calls: dict[bytes, Any] = {}  # calls in flight by their request id, as JSON
        self._tasks: set[asyncio.Task[None]] = set()
        self._pending: set[bytes] = set()  # ids of the requests a task answers (attach, reload, …)
        self._eof = False  # the client half-closed: answer every request read, then close
        self._hangup_watch: select.epoll | asyncio.TimerHandle | None = None  # after _eof (_watch_hangup)
        # JSON-RPC batches (sessions.batches): taken when the client's revision has them (2025-03-26);
        # the requests whose answers go to a batch, by id; the batch being read.
        self.batching = False
        self.batched: dict[bytes, batches.Batch] = {}
        self.batch: batches.Batch | None = None

    # What the subclass provides: the client's answers to its tools' questions, notifications, the
    # 2026-07-28 _meta of a request, and the call path.
    asking: Asking

    def handle_notification(self, method: str, raw: msgspec.Raw | UnsetType) -> None:
        raise NotImplementedError

    def _accept_modern(self, id_json: bytes, method: str, raw: Any) -> bool:
        raise NotImplementedError

    def start_call(self, id_json: bytes, params: CallParams) -> Awaitable[None] | None:
        raise NotImplementedError

    # -- asyncio.Protocol -----------------------------------------------------------------------

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
        # The common case first: one whole message per read, and nothing held from before.
        if (
            not self._buffer and not self._discarding and data.find(b"\n") == len(data) - 1
            and (len(data) <= _WITHIN_ANY_LIMIT or len(data) <= self.server.config.max_message_bytes + 1)
        ):
            self.handle_line(data)
            return
        limit = self.server.config.max_message_bytes
        if self._discarding:
            newline = data.find(b"\n")
            if newline < 0:
                return
            data = data[newline + 1 :]
            self._discarding = False
        buffer = self._buffer
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
        if self.transport is not None and not self.transport.is_closing():
            self._watch_hangup()
        return True  # keep the writing side open

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_hangup_watch()

    def _watch_hangup(self) -> None:
        """Cancel the calls at once when a half-closed client then goes altogether.

        Nothing more is read after a half-close, so a client that closes its end next (the MCP
        stdio shutdown: stdin closed, then SIGTERM; or a kill) would be found only when its answer
        is written, after the call ran to its end. An epoll set holding just this socket, for
        nothing but the hang-up it always reports, becomes readable when that happens. Where there
        is no epoll, the socket is looked at twice a second.
        """
        sock = self.transport.get_extra_info("socket") if self.transport is not None else None
        if sock is None:
            return
        loop = asyncio.get_running_loop()
        if hasattr(select, "epoll"):
            watch = select.epoll(1)
            watch.register(sock.fileno(), 0)  # no events asked: EPOLLHUP and EPOLLERR come regardless
            loop.add_reader(watch.fileno(), self._hung_up)
            self._hangup_watch = watch
        else:
            self._hangup_watch = loop.call_later(0.5, self._look_for_hangup)

    def _look_for_hangup(self) -> None:
        if _peer_closed(self.transport):
            self._hung_up()
        elif self.transport is not None:
            self._hangup_watch = asyncio.get_running_loop().call_later(0.5, self._look_for_hangup)

    def _hung_up(self) -> None:
        self._stop_hangup_watch()
        if self.transport is not None:
            self.transport.abort()  # connection_lost cancels the calls

    def _stop_hangup_watch(self) -> None:
        watch, self._hangup_watch = self._hangup_watch, None
        if isinstance(watch, asyncio.TimerHandle):
            watch.cancel()
        elif watch is not None:
            asyncio.get_running_loop().remove_reader(watch.fileno())
            watch.close()

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
        if _CALL_METHOD in line and not self.modern and _META_VERSION not in line:
            try:
                request = decode_call(line)  # only a well-formed 2.0 tools/call fits
            except (msgspec.ValidationError, msgspec.DecodeError, UnicodeDecodeError, RecursionError):
                pass  # read again as a Message below, answered by the rules for every message
            else:
                # What is checked of any request below (its id is new; tools/call is never locked
                # out), then the call, as _run_handler runs a handler.
                id_json = _encode(request.id)
                if id_json in self.calls or id_json in self._pending or id_json in self.listens:
                    self._refuse_reused(id_json)
                    return
                try:
                    outcome = self.start_call(id_json, request.params)
                except Exception as exc:
                    self._handler_failed("tools/call", id_json, exc)
                    return
                if outcome is not None:
                    self._spawn(outcome, id_json)
                return
        try:
            message = decode_message(line)
        except RecursionError:
            self._refuse_deep(line)
            return
        except msgspec.ValidationError as exc:
            stripped = line.lstrip()
            if stripped.startswith(b"[") and self.batching:
                batches.serve(self, stripped)
            elif stripped.startswith(b"["):
                self.send_error(
                    b"null", INVALID_REQUEST,
                    "Batches are not supported: send one JSON-RPC message per line (only a session initialized "
                    "with MCP 2025-03-26 takes batches)",
                )
            else:
                self.send_error(self._salvage_id(line), INVALID_REQUEST, f"Invalid request: {exc}")
            return
        except msgspec.DecodeError as exc:
            if line.strip():  # a blank line is no message: nothing to answer
                self.send_error(b"null", PARSE_ERROR, f"Parse error: {exc}")
            return
        except UnicodeDecodeError:  # msgspec's error for a string that is not UTF-8
            self.send_error(self._salvage_id(line), PARSE_ERROR, "Parse error: a string in the message is not UTF-8")
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
            if self.batched:
                self._settle_batches()  # a request of a batch the client cancelled gets no answer
            return
        id_json = _encode(message.id)
        if _META_VERSION in line:
            if not self._accept_modern(id_json, method, message.params):
                return
        elif self.modern and not method.startswith("atomic/"):
            # 2026-07-28 has no session state to fall back on: each request names its revision.
            self.send_error(id_json, INVALID_PARAMS, revisions.missing_meta([revisions.META_VERSION, revisions.META_CAPABILITIES]))
            return
        if id_json in self.calls or id_json in self._pending or id_json in self.listens:
            self._refuse_reused(id_json)
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
        self._run_handler(method, handler, id_json, message.params)

    def _refuse_reused(self, id_json: bytes) -> None:
        # Answers and cancels are matched by id: a second request with the id of one in flight
        # would make both ambiguous, so it is refused and the first one stands.
        self.send_error(id_json, INVALID_REQUEST, batches.reused(id_json))

    def in_flight(self, id_json: bytes) -> bool:
        """Whether the request ``id_json`` has been read and not yet answered."""
        return id_json in self.calls or id_json in self._pending or id_json in self.listens

    def _settle_batches(self) -> None:
        """Let go of the batched requests that will not be answered (cancelled)."""
        for id_json in [i for i in self.batched if not self.in_flight(i)]:
            self.batched.pop(id_json).forget()

    def _run_handler(self, method: str, handler: Handler, id_json: bytes, params: Any) -> None:
        try:
            outcome = handler(self, id_json, params)
        except Exception as exc:
            self._handler_failed(method, id_json, exc)
            return
        if outcome is not None:
            self._spawn(outcome, id_json)

    def _handler_failed(self, method: str, id_json: bytes, exc: Exception) -> None:
        """Answer a request whose handler raised, and keep the connection serving (as _spawn does)."""
        if isinstance(exc, ParamsError):
            self.send_error(id_json, INVALID_PARAMS, str(exc))
        elif isinstance(exc, UnicodeDecodeError):  # a handler decoding its params found a string that is not UTF-8
            self.send_error(id_json, INVALID_PARAMS, "Invalid params: a string in them is not UTF-8")
        else:
            log.exception("request %s failed", method, exc_info=exc)
            self.send_error(id_json, INTERNAL_ERROR, f"Internal error: {type(exc).__name__}: {exc}")

    @staticmethod
    def _salvage_id(line: bytes) -> bytes:
        try:
            value = msgspec.json.decode(line)
        except (msgspec.DecodeError, UnicodeDecodeError):
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
                if self.batched:
                    self._settle_batches()
                self._close_if_done()

        task = asyncio.get_running_loop().create_task(run())
        self._tasks.add(task)
        self._pending.add(id_json)
        task.add_done_callback(self._tasks.discard)

    # -- writing --------------------------------------------------------------------------------

    def send_result(self, id_json: bytes, result: bytes) -> None:
        if self.modern:
            result = revisions.with_result_type(result)
        if self.batched and id_json in self.batched:
            self.batched.pop(id_json).answered(_join((_RESULT_HEAD, id_json, _RESULT_MID, result, b"}")))
            return
        transport = self.transport
        if transport is not None:
            # One join: the line is built once, with no intermediate bytes objects on the call path.
            transport.write(_join((_RESULT_HEAD, id_json, _RESULT_MID, result, _LINE_END)))

    def send_error(self, id_json: bytes, code: int, message: str, data: Any = None) -> None:
        error: dict[str, Any] = {"code": code, "message": message}
        if data is not None:
            error["data"] = data
        if (self.batched or self.batch is not None) and self._to_batch(
            id_json, _join((_RESULT_HEAD, id_json, _ERROR_MID, encode_report(error), b"}"))
        ):
            return
        if self.transport is not None:
            self.transport.write(_join((_RESULT_HEAD, id_json, _ERROR_MID, encode_report(error), _LINE_END)))

    def _to_batch(self, id_json: bytes, answer: bytes) -> bool:
        """Give ``answer`` to the batch it belongs to; False when it belongs to none: its request
        was not batched, and it is not an error without an id while a batch is read."""
        batch = self.batched.pop(id_json, None)
        if batch is not None:
            batch.answered(answer)
            return True
        if id_json == b"null" and self.batch is not None:
            self.batch.add(answer)
            return True
        return False

    def write_line(self, data: bytes) -> None:
        """Write one message the connection has built whole (a batch's answers)."""
        if self.transport is not None:
            self.transport.write(data + b"\n")

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
        if self.transport is None or self.behind(method):
            return
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        self.transport.write(encode_report(message) + b"\n")

    def behind(self, method: str) -> bool:
        """Whether notification ``method`` is a log or progress notification for a client that has
        stopped reading: then it is dropped, and counted."""
        if method in _LOSSY and self.transport is not None and self.transport.get_write_buffer_size() > _LOSSY_BACKLOG:
            self.dropped += 1
            return True
        return False

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
        if not self.modern and LEVEL_RANK.get(level, 0) >= LEVEL_RANK[self.log_level]:
            self.send_notification("notifications/message", {"level": level, "logger": logger, "data": data})


def encode_report(value: Any) -> bytes:
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
