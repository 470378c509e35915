"""The Unix socket's side of a session: NDJSON framing, reading each line into a message, and
writing every line the daemon sends a client.

``Connection`` is the asyncio protocol of one socket connection and the ``output.Output`` of its
``session.Session``, which it makes as the connection is made. It reads one message per line and
never lets a bad line end the connection: a malformed line gets ``-32700``/``-32600``, an oversized
one a clear error, and the next line is read as usual. A line is decoded once (``handle_line``: a
``tools/call`` into a ``messages.CallRequest``, envelope and params together; any other line into a
``messages.Message``, its params left raw) and handed to the session, which knows every method and
rule of a request. Answers are written joined once, with no intermediate bytes objects. A line
holding a JSON array is a batch: taken in a session whose revision has them (2025-03-26, see
``batches``), refused otherwise; the answers of its requests go to it, not to the socket.

Backpressure: a client that does not read its answers is not read either (``pause_writing``), and
its log and progress notifications are dropped meanwhile (``Session.behind``, which reads
``backlog``). A half-closed client is answered every request it sent, then closed.
"""

from __future__ import annotations

import asyncio
import re
import select
from typing import TYPE_CHECKING, Any

import msgspec
from msgspec import UNSET

from atomictools._protocol import INVALID_PARAMS, INVALID_REQUEST, PARSE_ERROR
from atomictoolsd.protocol import well_formed_json
from atomictoolsd.sessions import batches, handoff, revisions
from atomictoolsd.sessions.loose import NULL, scalar
from atomictoolsd.sessions.messages import TOO_DEEP, decode_call, decode_message
from atomictoolsd.sessions.output import encode_error
from atomictoolsd.sessions.session import Session

if TYPE_CHECKING:
    from atomictoolsd.sessions.session import SessionHost

__all__ = ["Connection"]

_encode = msgspec.json.encode

# A line this long is within any max_message_bytes (whose least is 1024): data_received passes it on
# without reading the setting.
_WITHIN_ANY_LIMIT = 1025
_META_VERSION = revisions.META_VERSION_BYTES  # a line holding it may be a 2026-07-28 request
_RESULT_HEAD = b'{"jsonrpc":"2.0","id":'
_RESULT_MID = b',"result":'
_ERROR_MID = b',"error":'
_LINE_END = b"}\n"
_join = b"".join


class Connection(asyncio.Protocol):
    """One client's socket: its lines read into messages for its session, its session's output
    written as lines."""

    def __init__(self, server: SessionHost) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._discarding = False  # inside a line already refused as oversized
        self._eof = False  # the client half-closed: answer every request read, then close
        self._hangup_watch: select.epoll | asyncio.TimerHandle | None = None  # after _eof (_watch_hangup)
        # JSON-RPC batches (sessions.batches): the requests whose answers go to a batch, by id; the
        # batch being read.
        self.batched: dict[bytes, batches.Batch] = {}
        self.batch: batches.Batch | None = None
        self.session = Session(server, self)

    # -- asyncio.Protocol -----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if not self.server.accept(self.session, transport):
            transport.close()
            self.transport = None

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_hangup_watch()
        self.transport = None
        self._buffer.clear()  # a line left half-read: freed now, not when the collector finds the connection
        self.session.close()

    def pause_writing(self) -> None:
        # The client is not reading its answers: stop reading its requests until it catches up,
        # so a stalled client cannot grow the daemon's memory without bound.
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.transport is not None:
            if not self._eof:
                self.transport.resume_reading()
            session = self.session
            if session.dropped:
                dropped, session.dropped = session.dropped, 0
                session.log_message("warning", f"{dropped} log and progress notification(s) were dropped while this client was not reading")

    def data_received(self, data: bytes) -> None:
        # The common case first: one whole message per read, and nothing held from before. (find,
        # not ``in``, here and on every other per-call test of bytes: on bytes, ``in`` first tries
        # its operand as an integer, and the TypeError it raises and clears costs more than the
        # search, ~1,800 instructions a test in CPython 3.11.)
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
        searched = len(buffer)  # what it held holds no newline: only the new bytes are searched
        buffer += data
        start = 0
        while True:
            newline = buffer.find(b"\n", max(start, searched))
            if newline < 0:
                break
            if newline - start > limit:
                self.error(b"null", encode_error(INVALID_REQUEST, self._oversized(newline - start)))
            else:
                self.handle_line(bytes(memoryview(buffer)[start:newline]))  # one copy, not two
            start = newline + 1
            if self.transport is None:
                return
        del buffer[:start]
        if len(buffer) > limit:
            size = len(buffer)
            buffer.clear()
            self._discarding = True
            self.error(b"null", encode_error(INVALID_REQUEST, self._oversized(size, partial=True)))

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

    @property
    def half_closed(self) -> bool:
        """Whether the client ended its requests (the shim's stdin ended)."""
        return self._eof

    def unread(self) -> bool:
        """Whether bytes of a line not yet whole are held."""
        return bool(self._buffer)

    def _close_if_done(self) -> None:
        if self._eof and not self.session.busy() and self.transport is not None:
            self.transport.close()  # after what is buffered has been written

    def _oversized(self, size: int, partial: bool = False) -> str:
        limit = self.server.config.max_message_bytes
        grown = "at least " if partial else ""
        return (
            f"Message too large: {grown}{size} bytes, the limit is {limit} bytes "
            f"(ATOMICTOOLS_MAX_MESSAGE_BYTES); it was discarded"
        )

    # -- reading --------------------------------------------------------------------------------

    def handle_line(self, line: bytes) -> None:
        """One line: decoded once into a message for the session, or answered here when it is none
        (not JSON, not a JSON-RPC object, nested too deeply) or is a batch.

        A line is first read whole as a ``CallRequest``, envelope and params in one decode: the
        call path's (a line of another method fails at its ``method`` and costs the raised error,
        which is less than searching every line for the method first). The session takes it as any
        request (``handle_request``: the same rules, its handler taking the params as they are). A
        line that does not fit, or whose ``_meta`` names a revision (a 2026-07-28 request, whose
        ``_meta`` the session reads whole), is read as a ``Message``, as every other line is.
        """
        try:
            call = decode_call(line)
        except (msgspec.ValidationError, msgspec.DecodeError, UnicodeDecodeError, RecursionError):
            pass  # read as a Message below, which answers it
        else:
            meta = call.params.meta
            if meta is UNSET or meta.revision is NULL:
                self.session.handle_request(_encode(call.id), "tools/call", call.params, False)
                return
        try:
            message = decode_message(line)
        except RecursionError:
            self._refuse_deep(line)
        except msgspec.ValidationError as exc:
            self._not_an_object(line, exc)
        except msgspec.DecodeError as exc:
            repaired = well_formed_json(line)
            if repaired is not None:  # half a character (a lone surrogate escape): read as U+FFFD
                self.handle_line(repaired)
            elif line.strip():  # a blank line is no message: nothing to answer
                self.error(b"null", encode_error(PARSE_ERROR, f"Parse error: {exc}"))
        except UnicodeDecodeError:  # msgspec's error for a string that is not UTF-8
            self.error(_salvage_id(line), encode_error(PARSE_ERROR, "Parse error: a string in the message is not UTF-8"))
        else:
            if message.method == handoff.METHOD and message.id is not UNSET and message.jsonrpc == "2.0":
                handoff.offer(self, _encode(message.id))  # the shim's stdio, read and written here
                return
            self.session.handle_message(message, line.find(_META_VERSION) >= 0)

    def _not_an_object(self, line: bytes, exc: msgspec.ValidationError) -> None:
        """A JSON line that is no JSON-RPC object: a batch (taken when the session's revision has
        them), or an invalid request."""
        stripped = line.lstrip()
        if stripped.startswith(b"[") and self.session.batching:
            batches.serve(self, stripped)
        elif stripped.startswith(b"["):
            self.error(b"null", encode_error(
                INVALID_REQUEST,
                "Batches are not supported: send one JSON-RPC message per line (only a session initialized "
                "with MCP 2025-03-26 takes batches)",
            ))
        else:
            self.error(_salvage_id(line), encode_error(INVALID_REQUEST, f"Invalid request: {exc}"))

    def in_flight(self, id_json: bytes) -> bool:
        """Whether the request ``id_json`` has been read and not yet answered (``batches``)."""
        return self.session.in_flight(id_json)

    def _settle_batches(self) -> None:
        """Let go of the batched requests that will not be answered (cancelled)."""
        in_flight = self.session.in_flight
        for id_json in [i for i in self.batched if not in_flight(i)]:
            self.batched.pop(id_json).forget()

    def _refuse_deep(self, line: bytes) -> None:
        id_json, field, method = _scan_envelope(line)
        if field == "params" and method and id_json != b"null":
            self.error(id_json, encode_error(INVALID_PARAMS, f"Invalid params: {TOO_DEEP}"))
        else:
            where = f"{field!r} is " if field else ""
            self.error(id_json, encode_error(INVALID_REQUEST, f"Invalid request: {where}{TOO_DEEP}"))

    # -- writing: the session's output ------------------------------------------------------------

    def result(self, id_json: bytes, result: bytes) -> None:
        transport = self.transport
        if self.batched and id_json in self.batched:
            self.batched.pop(id_json).answered(_join((_RESULT_HEAD, id_json, _RESULT_MID, result, b"}")))
        elif transport is not None:
            # One join: the line is built once, with no intermediate bytes objects on the call path.
            transport.write(_join((_RESULT_HEAD, id_json, _RESULT_MID, result, _LINE_END)))
        if self._eof:
            self._close_if_done()  # a half-closed client: closed after the last answer it waits for

    def error(self, id_json: bytes, error: bytes) -> None:
        if (self.batched or self.batch is not None) and self._to_batch(
            id_json, _join((_RESULT_HEAD, id_json, _ERROR_MID, error, b"}"))
        ):
            return
        if self.transport is not None:
            self.transport.write(_join((_RESULT_HEAD, id_json, _ERROR_MID, error, _LINE_END)))

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

    def request(self, id_json: bytes, method: str, params: bytes, about: bytes | None) -> bool:
        if self.transport is None:
            return False
        self.transport.write(b'{"jsonrpc":"2.0","id":' + id_json + b',"method":' + _encode(method) + b',"params":' + params + b"}\n")
        return True

    def notification(self, method: str, message: bytes, about: bytes | None) -> None:
        if self.transport is not None:
            self.transport.write(message + b"\n")

    def backlog(self) -> int:
        return self.transport.get_write_buffer_size() if self.transport is not None else 0

    def request_id(self, id_json: bytes) -> Any:
        return msgspec.json.decode(id_json)

    def ended(self, id_json: bytes) -> None:
        if self.batched:
            self._settle_batches()  # a request of a batch the client cancelled gets no answer
        if self._eof:
            self._close_if_done()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class _IdOnly(msgspec.Struct):
    id: msgspec.Raw = NULL  # the rest of the line is skipped unread


_decode_id_only = msgspec.json.Decoder(_IdOnly).decode


def _salvage_id(line: bytes) -> bytes:
    """The id of a line that is no valid message, when it has a usable one, as JSON; else ``null``."""
    try:
        value = scalar(_decode_id_only(line).id)
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError):
        return b"null"
    except RecursionError:
        return _scan_envelope(line)[0]
    if isinstance(value, (int, str)) and not isinstance(value, bool):
        return _encode(value)
    return b"null"


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
