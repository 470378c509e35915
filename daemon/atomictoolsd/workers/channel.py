"""The framing between the daemon and a worker: a 4-byte big-endian length, then one msgpack value.

Both sides import this, so it stays at the standard library and msgspec. Every message is a
msgpack array whose first element names it; see ``runtime`` (what a worker sends and accepts).
A result travels as the JSON of an MCP ``CallToolResult``; ``error_result`` makes the error one that
either side may have to answer with (a worker for a tool that raised, the daemon for a worker that died).
"""

from __future__ import annotations

import struct
from typing import Any

import msgspec

__all__ = ["MAX_FRAME", "FrameReader", "encode_frame", "error_result"]

_HEADER = struct.Struct(">I")
MAX_FRAME = 1 << 30  # a larger frame means the stream is corrupt, not that a result is big

_encoder = msgspec.msgpack.Encoder()
_decode = msgspec.msgpack.decode
_json = msgspec.json.encode


def encode_frame(message: Any) -> bytes:
    """One message, framed."""
    body = _encoder.encode(message)
    return _HEADER.pack(len(body)) + body


def error_result(text: str) -> bytes:
    """An MCP ``CallToolResult`` with ``isError: true`` and one text block, as JSON."""
    return b'{"content":[{"type":"text","text":' + _json(text) + b'}],"isError":true}'


class FrameReader:
    """Reassembles frames from a byte stream fed in arbitrary chunks."""

    __slots__ = ("_buffer",)

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[Any]:
        """Add bytes; return every message now complete, in order.

        Raises:
            ValueError: a frame announces a size above ``MAX_FRAME`` (the stream is corrupt).
        """
        buffer = self._buffer
        if not buffer and len(data) > 4:
            (length,) = _HEADER.unpack_from(data)
            if length + 4 == len(data):  # the common case: exactly one whole frame
                return [_decode(memoryview(data)[4:])]
        buffer += data
        messages = []
        offset = 0
        size = len(buffer)
        with memoryview(buffer) as view:  # released before the buffer is resized below
            while size - offset >= 4:
                (length,) = _HEADER.unpack_from(buffer, offset)
                if length > MAX_FRAME:
                    raise ValueError(f"frame of {length} bytes exceeds the {MAX_FRAME}-byte limit")
                end = offset + 4 + length
                if end > size:
                    break
                messages.append(_decode(view[offset + 4 : end]))
                offset = end
        if offset:
            del buffer[:offset]
        return messages
