"""JSON-RPC batches on a connection, for the one MCP revision that has them (2025-03-26; 2025-06-18
removed them): a line holding an array of messages, each handled as if it had come on a line of its
own, whose answers go back together as one array line once the last is in (JSON-RPC 2.0, section 6:
the responses in any order; no line at all when the batch held no request).

A batch is bounded twice: by ``max_message_bytes``, as any line is, and by ``MOST`` messages, since
its answers are held until the last one comes. Each message is read by ``Connection.handle_line``,
so a call in a batch meets every rule a call on its own line does (ids, locked-out methods,
timeouts). What this module owns is which answers belong to which batch: ``Batch`` collects them,
``serve`` reads a batch's messages. The connection, as its session's output, routes an answer to
its batch by its id (``Connection.batched``); an error with no id (a message that is not a request
object) goes to the batch being read.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Protocol

import msgspec
from msgspec import UNSET, UnsetType

from atomictools._protocol import INVALID_REQUEST, PARSE_ERROR
from atomictoolsd.protocol import well_formed_json
from atomictoolsd.sessions.loose import scalar
from atomictoolsd.sessions.messages import TOO_DEEP, clip
from atomictoolsd.sessions.output import encode_error

__all__ = ["MOST", "Batch", "BatchHost", "decode_batch", "error_answer", "refusal", "reused", "serve", "too_many"]

MOST = 1000  # messages in one batch: their answers are held until the last is in

_encode = msgspec.json.encode
_ID_STARTS = b'"-0123456789'  # how an id that is a string or a number starts, as JSON


class Batch:
    """The answers to one batch's requests, written as one JSON array once the last is in."""

    __slots__ = ("_write", "answers", "reading", "waiting")

    def __init__(self, write: Callable[[bytes], None]) -> None:
        self._write = write  # the array, once whole
        self.answers: list[bytes] = []
        self.reading = True  # its messages are still being read: more requests may come
        self.waiting = 0  # requests read and not yet answered

    def add(self, answer: bytes) -> None:
        """An answer given while the batch is read (to a message refused at once)."""
        self.answers.append(answer)

    def answered(self, answer: bytes) -> None:
        """The answer of one of the requests it waits for."""
        self.waiting -= 1
        self.answers.append(answer)
        self.settle()

    def forget(self) -> None:
        """One of its requests will not be answered (the client cancelled it)."""
        self.waiting -= 1
        self.settle()

    def settle(self) -> None:
        if self.reading or self.waiting:
            return
        answers, self.answers = self.answers, []
        if answers:
            self._write(b"[" + b",".join(answers) + b"]")


class BatchHost(Protocol):
    """What ``serve`` uses of the connection (``connection.Connection``)."""

    batch: Batch | None  # the batch being read
    batched: dict[bytes, Batch]  # the requests whose answers go to a batch, by id as JSON

    def handle_line(self, line: bytes) -> None: ...

    def in_flight(self, id_json: bytes) -> bool: ...

    def error(self, id_json: bytes, error: bytes) -> None: ...

    def write_line(self, data: bytes) -> None: ...


class _Head(msgspec.Struct):
    """What ``serve`` reads of a message before handing it on: its id and whether it is a request."""

    id: int | str | None | UnsetType = UNSET
    method: msgspec.Raw | UnsetType = UNSET  # read with loose.scalar


@functools.cache
def _messages_decoder() -> Callable[[bytes], Any]:
    """A batch is read as at most MOST + 1 messages: into an array-like struct of that many raw
    fields, the rest of a longer array skipped unread (a list would build an object for each of the
    millions of elements a line may hold, holding the event loop a third of a second). Made at the
    first batch: a struct of 1,001 fields takes 4 ms, and few clients send batches."""
    fields = [(f"m{i}", msgspec.Raw | UnsetType, UNSET) for i in range(MOST + 1)]
    return msgspec.json.Decoder(msgspec.defstruct("_Messages", fields, array_like=True)).decode


def decode_batch(line: bytes) -> list[msgspec.Raw]:
    """The messages of the batch ``line`` (a JSON array), at most ``MOST + 1``: that many means
    more than ``MOST`` (``too_many``).

    Raises:
        msgspec.DecodeError, UnicodeDecodeError, RecursionError: the line is no JSON array.
    """
    messages = []
    for message in msgspec.structs.astuple(_messages_decoder()(line)):
        if message is UNSET:
            break
        messages.append(message)
    return messages
_decode_head = msgspec.json.Decoder(_Head).decode


def serve(host: BatchHost, line: bytes) -> None:
    """Handle the batch ``line`` (a JSON array) on ``host``, whose session takes batches."""
    try:
        messages = decode_batch(line)
    except RecursionError:
        host.error(b"null", encode_error(INVALID_REQUEST, f"Invalid request: {TOO_DEEP}"))
        return
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        repaired = well_formed_json(line) if isinstance(exc, msgspec.DecodeError) else None
        if repaired is not None:  # half a character (a lone surrogate escape): read as U+FFFD
            serve(host, repaired)
        else:
            host.error(b"null", encode_error(PARSE_ERROR, f"Parse error: {exc}"))
        return
    refusal = too_many(len(messages))
    if refusal:
        host.error(b"null", encode_error(INVALID_REQUEST, refusal))
        return
    batch = host.batch = Batch(host.write_line)
    try:
        for message in messages:
            _read(host, batch, bytes(message))
    finally:
        host.batch = None
        batch.reading = False
    batch.settle()


def too_many(count: int) -> str:
    """Why a batch of ``count`` messages is refused, or "" when it is taken."""
    if not count:
        return "Invalid request: an empty batch; a batch holds at least one message"
    if count > MOST:
        return (f"Invalid request: a batch of more than {MOST} messages; at most {MOST} go in one batch: "
                f"send the rest in another batch, or one message at a time")
    return ""


def reused(id_json: bytes) -> str:
    """The error for a request whose id is that of a request still in flight."""
    return (f"Invalid request: id {clip(id_json.decode())} is already used by a request in flight; "
            f"use a new id for each request")


def _read(host: BatchHost, batch: Batch, message: bytes) -> None:
    """Hand one message of ``batch`` to the connection, its answer bound for the batch."""
    if message[:1] == b"[":
        batch.add(error_answer(b"null", INVALID_REQUEST, "Invalid request: a batch holds messages, not batches"))
        return
    try:
        head = _decode_head(message)
    except (msgspec.ValidationError, msgspec.DecodeError, UnicodeDecodeError):
        host.handle_line(message)  # not a request object: refused with no id, which goes to the batch
        return
    except RecursionError:
        batch.add(error_answer(b"null", INVALID_REQUEST, f"Invalid request: {TOO_DEEP}"))
        return
    if head.id is UNSET:
        host.handle_line(message)  # a notification: no answer
        return
    id_json = _encode(head.id)
    if head.method is not UNSET:
        why = refusal(id_json, scalar(head.method))
        if not why and (id_json in host.batched or host.in_flight(id_json)):
            why = reused(id_json)
        if why:
            batch.add(error_answer(id_json, INVALID_REQUEST, why))
            return
    elif head.id is None or id_json in host.batched or host.in_flight(id_json):
        host.handle_line(message)  # the client's answer to a tool's question: no answer
        return
    host.batched[id_json] = batch
    batch.waiting += 1
    host.handle_line(message)
    if host.batched.get(id_json) is batch and not host.in_flight(id_json):
        del host.batched[id_json]  # nothing will answer it (a response to a question, read as one)
        batch.waiting -= 1


def refusal(id_json: bytes, method: Any) -> str:
    """Why the request ``id_json`` of a batch is refused before it is read, or ""."""
    if id_json[:1] not in _ID_STARTS:
        return "Invalid request: a request's id must be a string or a number (MCP does not allow null)"
    if method == "initialize":
        return "Invalid request: initialize cannot be part of a batch; send it on its own first"
    return ""


def error_answer(id_json: bytes, code: int, message: str) -> bytes:
    """A JSON-RPC error response, as one element of a batch's answer."""
    return b'{"jsonrpc":"2.0","id":' + id_json + b',"error":' + _encode({"code": code, "message": message}) + b"}"
