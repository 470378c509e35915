"""The floor: the least a client → daemon → worker ``tools/call`` can cost on this machine, now.

    python floor_relay.py SOCKET_PATH

A uvloop server on a Unix socket decodes each NDJSON request with msgspec, forwards the call as a
length-prefixed msgpack frame over a socket pair to one forked worker, and writes the worker's
answer back as a line. The worker is a blocking loop that runs ``echo`` and answers. Nothing else:
no sessions, no validation against a schema, no timeouts, no statistics, no event log. The calls
bench measures it with the same client in the same run, so the distance between it and the daemon
is what the daemon's own work costs, whatever the machine's load is at the moment.

Prints ``ready`` on stdout once it listens; exits on SIGTERM.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import struct
import sys

import msgspec
import uvloop

HEADER = struct.Struct(">I")


class Request(msgspec.Struct):
    method: str
    id: int | None = None
    params: msgspec.Raw = msgspec.Raw(b"{}")


class CallParams(msgspec.Struct):
    name: str
    arguments: msgspec.Raw


def worker(sock: socket.socket) -> None:
    decode, encode = msgspec.msgpack.decode, msgspec.msgpack.encode
    arguments = msgspec.json.Decoder(dict[str, str]).decode
    buffer = b""
    while True:
        data = sock.recv(65536)
        if not data:
            os._exit(0)
        buffer += data
        while len(buffer) >= 4:
            (length,) = HEADER.unpack_from(buffer)
            if len(buffer) < 4 + length:
                break
            call_id, _tool, args = decode(buffer[4 : 4 + length])
            buffer = buffer[4 + length :]
            text = arguments(args)["text"]
            body = encode([call_id, b'{"content":[{"type":"text","text":' + msgspec.json.encode(text) + b"}]}"])
            try:
                sock.sendall(HEADER.pack(len(body)) + body)
            except OSError:
                os._exit(0)  # the relay is gone


class Relay(asyncio.Protocol):
    def __init__(self, to_worker: asyncio.Transport, waiting: dict[int, tuple[Relay, bytes]]) -> None:
        self.to_worker = to_worker
        self.waiting = waiting
        self.buffer = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None  # answers still coming from the worker for it are dropped

    def data_received(self, data: bytes) -> None:
        *lines, self.buffer = (self.buffer + data).split(b"\n")
        for line in lines:
            request = _decode_request(line)
            if request.id is None:
                continue  # a notification
            if request.method != "tools/call":  # initialize and the like: a canned answer
                assert self.transport is not None
                self.transport.write(b'{"jsonrpc":"2.0","id":%d,"result":{}}\n' % request.id)
                continue
            call = _decode_call(request.params)
            call_id = next(_ids)
            self.waiting[call_id] = (self, msgspec.json.encode(request.id))
            body = msgspec.msgpack.encode([call_id, call.name, bytes(call.arguments)])
            self.to_worker.write(HEADER.pack(len(body)) + body)


class FromWorker(asyncio.Protocol):
    def __init__(self, waiting: dict[int, tuple[Relay, bytes]]) -> None:
        self.waiting = waiting
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer + data
        while len(buffer) >= 4:
            (length,) = HEADER.unpack_from(buffer)
            if len(buffer) < 4 + length:
                break
            call_id, result = msgspec.msgpack.decode(buffer[4 : 4 + length])
            buffer = buffer[4 + length :]
            relay, request_id = self.waiting.pop(call_id)
            if relay.transport is not None:
                relay.transport.write(b'{"jsonrpc":"2.0","id":' + request_id + b',"result":' + result + b"}\n")
        self.buffer = buffer


def _ids_from_one():  # type: ignore[no-untyped-def]
    n = 0
    while True:
        n += 1
        yield n


_ids = _ids_from_one()
_decode_request = msgspec.json.Decoder(Request).decode
_decode_call = msgspec.json.Decoder(CallParams).decode


async def serve(path: str, ours: socket.socket) -> None:
    loop = asyncio.get_running_loop()
    waiting: dict[int, tuple[Relay, bytes]] = {}
    to_worker, _ = await loop.connect_accepted_socket(lambda: FromWorker(waiting), sock=ours)
    server = await loop.create_unix_server(lambda: Relay(to_worker, waiting), path)  # type: ignore[arg-type]
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    print("ready", flush=True)
    await stop.wait()
    server.close()


def main() -> None:
    ours, theirs = socket.socketpair()
    if os.fork() == 0:
        ours.close()
        worker(theirs)
    theirs.close()
    uvloop.run(serve(sys.argv[1], ours))


if __name__ == "__main__":
    main()
