"""The raw NDJSON clients every system is measured with: the same code for stdio and for sockets.

``Channel`` sends one JSON-RPC line and reads lines until the answer to it arrives. The load
generator keeps a fixed number of requests in flight with uvloop and raw protocols, so the client
is not what limits the figure.
"""

from __future__ import annotations

import asyncio
import io
import json
import socket
import subprocess
import time
from collections.abc import Callable
from typing import Any

from common import INITIALIZE, Stats

__all__ = ["Channel", "measure_latency", "measure_throughput", "socket_channel", "stdio_channel"]

CALL = b'{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hi"}}}\n'


class Channel:
    """A request/response line channel over a pair of byte streams."""

    def __init__(self, write: Callable[[bytes], Any], readline: Callable[[], bytes], close: Callable[[], None]) -> None:
        self.write = write
        self.readline = readline
        self.close = close

    def request(self, line: bytes, request_id: int) -> dict[str, Any]:
        self.write(line)
        while True:
            reply = self.readline()
            if not reply:
                raise EOFError("the server closed the channel")
            message = json.loads(reply)
            if message.get("id") == request_id:
                return message

    def handshake(self) -> None:
        self.request(json.dumps(INITIALIZE).encode() + b"\n", 0)
        self.write(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')


def stdio_channel(command: list[str], env: dict[str, str] | None = None) -> tuple[subprocess.Popen[bytes], Channel]:
    proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, bufsize=0, env=env)
    assert proc.stdin is not None and proc.stdout is not None
    reader = io.BufferedReader(proc.stdout)  # type: ignore[arg-type]

    def close() -> None:
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    return proc, Channel(proc.stdin.write, reader.readline, close)


def socket_channel(path: str) -> Channel:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    reader = sock.makefile("rb")

    def close() -> None:
        reader.close()
        sock.close()

    return Channel(sock.sendall, reader.readline, close)


def measure_latency(channel: Channel, calls: int, warmup: int) -> Stats:
    """Sequential tools/call round trips; the first ``warmup`` are not counted."""
    stats = Stats()
    perf = time.perf_counter
    for i in range(1, warmup + calls + 1):
        line = CALL % i
        started = perf()
        reply = channel.request(line, i)
        elapsed = perf() - started
        if "result" not in reply:
            raise RuntimeError(f"call failed: {reply}")
        if i > warmup:
            stats.samples.append(elapsed)
    return stats


class _LoadProtocol(asyncio.Protocol):
    """Keeps ``depth`` requests in flight on one stream; counts answers."""

    def __init__(self, depth: int, counter: list[int], stop: list[bool]) -> None:
        self.depth = depth
        self.counter = counter
        self.stop = stop
        self.buffer = b""
        self.next_id = 1
        self.transport: Any = None
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def start(self, transport: Any) -> None:
        self.transport = transport
        for _ in range(self.depth):
            self._send()

    def _send(self) -> None:
        self.transport.write(CALL % self.next_id)
        self.next_id += 1

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        lines = self.buffer.split(b"\n")
        self.buffer = lines.pop()
        for line in lines:
            if b'"result"' not in line:
                if b'"id"' in line:
                    raise RuntimeError(f"call failed: {line[:200]!r}")
                continue
            self.counter[0] += 1
            if not self.stop[0]:
                self._send()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result(None)


async def _drive(open_streams: Callable[[], Any], streams: int, depth: int, seconds: float) -> float:
    counter, stop = [0], [False]
    protocols = [await open_streams(_LoadProtocol(depth, counter, stop)) for _ in range(streams)]
    await asyncio.sleep(min(1.0, seconds / 3))  # warm up
    start_count, started = counter[0], time.perf_counter()
    await asyncio.sleep(seconds)
    rate = (counter[0] - start_count) / (time.perf_counter() - started)
    stop[0] = True
    for protocol in protocols:
        protocol.transport.close()
    return rate


def measure_throughput(target: str | list[str], streams: int, depth: int, seconds: float, env: dict[str, str] | None = None) -> float:
    """Calls per second with ``streams`` connections (a socket path) or one stdio server (a command).

    For a socket, ``streams`` connections each keep ``depth`` requests in flight. For a stdio server
    (one connection by nature) one process keeps ``streams * depth`` in flight.
    """
    import uvloop

    async def main() -> float:
        loop = asyncio.get_running_loop()
        if isinstance(target, str):

            async def open_socket(protocol: _LoadProtocol) -> _LoadProtocol:
                transport, _ = await loop.create_unix_connection(lambda: protocol, target)
                protocol.start(transport)
                return protocol

            return await _drive(open_socket, streams, depth, seconds)

        proc = await asyncio.create_subprocess_exec(*target, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL, env=env)
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(json.dumps(INITIALIZE).encode() + b"\n")
        await proc.stdout.readline()
        proc.stdin.write(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
        counter, stop = [0], [False]
        protocol = _LoadProtocol(streams * depth, counter, stop)

        class Writer:
            def write(self, data: bytes) -> None:
                proc.stdin.write(data)  # type: ignore[union-attr]

            def close(self) -> None:
                pass

        async def pump() -> None:
            while True:
                chunk = await proc.stdout.read(65536)  # type: ignore[union-attr]
                if not chunk:
                    return
                protocol.data_received(chunk)

        reader = asyncio.ensure_future(pump())
        protocol.start(Writer())
        await asyncio.sleep(min(1.0, seconds / 3))
        start_count, started = counter[0], time.perf_counter()
        await asyncio.sleep(seconds)
        rate = (counter[0] - start_count) / (time.perf_counter() - started)
        stop[0] = True
        proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            proc.kill()
            await proc.wait()
        reader.cancel()
        return rate

    return uvloop.run(main())
