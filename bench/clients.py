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
from pathlib import Path
from typing import Any

from common import INITIALIZE, Stats

__all__ = ["Channel", "call_line", "measure_latency", "measure_throughput", "socket_channel", "stdio_channel"]


def call_line(tool: str = "echo") -> bytes:
    """A ``tools/call`` line of ``tool`` with ``%d`` where the request id goes."""
    return b'{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"' + tool.encode() + b'","arguments":{"text":"hi"}}}\n'


CALL = call_line()


class Channel:
    """A request/response line channel over a pair of byte streams."""

    def __init__(self, write: Callable[[bytes], Any], readline: Callable[[], bytes], close: Callable[[], None]) -> None:
        self.write = write
        self.readline = readline
        self.close = close
        self.next_id = 1  # the next request id measure_latency uses

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


def stdio_channel(
    command: list[str], env: dict[str, str] | None = None, cwd: str | Path | None = None
) -> tuple[subprocess.Popen[bytes], Channel]:
    proc = subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, bufsize=0, env=env, cwd=cwd
    )
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


def measure_latency(channel: Channel, calls: int, warmup: int, line: bytes = CALL) -> Stats:
    """Sequential ``tools/call`` round trips; the first ``warmup`` are not counted."""
    stats = Stats()
    perf = time.perf_counter
    first = channel.next_id
    for i in range(first, first + warmup + calls):
        request = line % i
        started = perf()
        reply = channel.request(request, i)
        elapsed = perf() - started
        if "result" not in reply or reply["result"].get("isError"):
            raise RuntimeError(f"call failed: {reply}")
        if i >= first + warmup:
            stats.samples.append(elapsed)
    channel.next_id = first + warmup + calls
    return stats


class _LoadProtocol(asyncio.Protocol):
    """Keeps ``depth`` requests in flight on one stream, cycling through ``lines``; counts answers."""

    def __init__(self, depth: int, lines: list[bytes], counter: list[int], stop: list[bool]) -> None:
        self.depth = depth
        self.lines = lines
        self.counter = counter
        self.stop = stop
        self.buffer = b""
        self.next_id = 1
        self.transport: Any = None

    def start(self, transport: Any) -> None:
        self.transport = transport
        for _ in range(self.depth):
            self._send()

    def _send(self) -> None:
        self.transport.write(self.lines[self.next_id % len(self.lines)] % self.next_id)
        self.next_id += 1

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        lines = self.buffer.split(b"\n")
        self.buffer = lines.pop()
        for line in lines:
            if b'"result"' not in line or b'"isError":true' in line:
                if b'"id"' in line:
                    raise RuntimeError(f"call failed: {line[:200]!r}")
                continue  # a notification
            self.counter[0] += 1
            if not self.stop[0]:
                self._send()


async def _count(counter: list[int], seconds: float) -> float:
    await asyncio.sleep(min(1.0, seconds / 3))  # warm up
    start_count, started = counter[0], time.perf_counter()
    await asyncio.sleep(seconds)
    return (counter[0] - start_count) / (time.perf_counter() - started)


def measure_throughput(
    target: str | list[str],
    streams: int,
    seconds: float,
    tools: list[str] | None = None,
    depth: int = 1,
    env: dict[str, str] | None = None,
    cwd: str | Path | None = None,
) -> float:
    """Calls per second with ``streams`` connections (``target`` a socket path) or through one stdio
    server (``target`` a command).

    On a socket each connection keeps ``depth`` requests in flight and calls one tool, connection
    ``i`` the tool ``tools[i % len(tools)]``. A stdio server has one connection by nature: one
    process gets ``streams * depth`` requests in flight, pipelined, cycling through ``tools``.
    """
    import uvloop

    lines = [call_line(tool) for tool in tools or ["echo"]]

    async def over_socket(path: str) -> float:
        loop = asyncio.get_running_loop()
        counter, stop = [0], [False]
        protocols = []
        for i in range(streams):
            protocol = _LoadProtocol(depth, [lines[i % len(lines)]], counter, stop)
            transport, _ = await loop.create_unix_connection(lambda p=protocol: p, path)  # type: ignore[misc]
            protocols.append((protocol, transport))
        for protocol, transport in protocols:
            protocol.start(transport)
        rate = await _count(counter, seconds)
        stop[0] = True
        for _, transport in protocols:
            transport.close()
        return rate

    async def over_stdio(command: list[str]) -> float:
        proc = await asyncio.create_subprocess_exec(
            *command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL, env=env, cwd=cwd, limit=1 << 20,
        )
        assert proc.stdin is not None and proc.stdout is not None
        stdin, stdout = proc.stdin, proc.stdout
        stdin.write(json.dumps(INITIALIZE).encode() + b"\n")
        await stdout.readline()
        stdin.write(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
        counter, stop = [0], [False]
        protocol = _LoadProtocol(streams * depth, lines, counter, stop)

        async def pump() -> None:
            while chunk := await stdout.read(65536):
                protocol.data_received(chunk)

        reader = asyncio.ensure_future(pump())
        protocol.start(stdin)
        rate = await _count(counter, seconds)
        stop[0] = True
        stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            proc.kill()
            await proc.wait()
        reader.cancel()
        return rate

    if isinstance(target, str):
        return uvloop.run(over_socket(target))
    return uvloop.run(over_stdio(target))
