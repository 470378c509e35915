"""tools/call over Streamable HTTP: atomictoolsd's endpoint against FastMCP 4's, with an HTTP floor.

    python bench/httpcalls.py                 # pinned to one core, then unpinned
    python bench/httpcalls.py --quick         # fewer calls, for a smoke run
    python bench/httpcalls.py --base HEAD~1   # also the endpoint of another revision, in the same turns

Latency: sequential calls of the one-line echo tool with one raw HTTP/1.1 keep-alive client (a plain
socket; no SDK) for every system, after ``initialize``, in turns: atomictoolsd's endpoint
(``start --http``), the standalone FastMCP 4 package's Streamable HTTP server, and the HTTP floor
(``peers/floor_http.py``: the daemon's own HTTP library answering a canned result, no session, no
worker). Beside them, the Unix socket of a daemon with HTTP on and of one with HTTP off: the HTTP
endpoint must cost the socket path nothing. ``--base REV`` adds a daemon run from ``client/`` and
``daemon/`` of another git revision, measured in the same turns: a before and after on a busy
machine, with the same floor and peer.

Calls/s: 16 keep-alive connections, each with its own session and one call in flight, driven by a
uvloop load generator in this process (its capacity shows in the floor's row).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rawsocket import RawConnection  # noqa: E402

from atomictoolsd.util.processes import stop_process  # noqa: E402
from clients import measure_latency, socket_channel  # noqa: E402
from common import (  # noqa: E402
    BENCH,
    INITIALIZE,
    MODES,
    PEERS,
    DaemonUnderTest,
    Report,
    Stats,
    Table,
    affinity,
    peer_python,
    percentile,
    ratio,
    run_alone,
)

FASTMCP4 = "fastmcp 4.1.0"
FASTMCP4_VENV = PEERS[FASTMCP4][:2]
OURS_HTTP = "atomictoolsd, HTTP"
FAST_HTTP = f"{FASTMCP4}, HTTP"
FLOOR_HTTP = "floor: httptools, canned answer"
SOCKET_ON = "atomictoolsd, socket, HTTP on"
SOCKET_OFF = "atomictoolsd, socket, HTTP off"
CALL = b'{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hi"}}}'
PERCENTILES = (0.1, 0.25, 0.5, 0.75, 0.9, 0.99)


class Settings:
    def __init__(self, quick: bool) -> None:
        self.rounds = 2 if quick else 5
        self.calls = 300 if quick else 2000
        self.peer_calls = 60 if quick else 300
        self.warmup = 50 if quick else 200
        self.seconds = 1.0 if quick else 3.0
        self.rate_rounds = 2 if quick else 3  # calls/s: the median of this many turns
        self.streams = 16


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class HttpChannel:
    """One keep-alive HTTP/1.1 connection speaking MCP's Streamable HTTP; reads JSON and SSE answers."""

    def __init__(self, url: str, token: str | None = None) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.target = (parts.path + ("?" + parts.query if parts.query else "")).encode()
        self.sock = socket.create_connection((self.host, self.port), timeout=30)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.file = self.sock.makefile("rb")
        self.headers = b"Host: %s:%d\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n" % (
            self.host.encode(), self.port)
        if token:
            self.headers += b"Authorization: Bearer " + token.encode() + b"\r\n"
        self.session = b""
        self.next_id = 1

    def request_bytes(self, body: bytes) -> bytes:
        return (b"POST " + self.target + b" HTTP/1.1\r\n" + self.headers + self.session
                + b"Content-Length: %d\r\n\r\n" % len(body) + body)

    def post(self, body: bytes) -> tuple[dict[bytes, bytes], list[dict[str, Any]]]:
        self.sock.sendall(self.request_bytes(body))
        return self.read_response()

    def read_response(self) -> tuple[dict[bytes, bytes], list[dict[str, Any]]]:
        status = self.file.readline()
        if not status.startswith(b"HTTP/1.1 2"):
            raise RuntimeError(f"HTTP error: {status!r}")
        headers: dict[bytes, bytes] = {}
        while True:
            line = self.file.readline()
            if line in (b"\r\n", b""):
                break
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip()
        if b"content-length" in headers:
            body = self.file.read(int(headers[b"content-length"]))
        elif headers.get(b"transfer-encoding") == b"chunked":
            chunks = []
            while True:
                size = int(self.file.readline().strip(), 16)
                chunk = self.file.read(size + 2)[:size]
                if not size:
                    break
                chunks.append(chunk)
            body = b"".join(chunks)
        else:
            body = b""
        if headers.get(b"content-type", b"").startswith(b"text/event-stream"):
            messages = [json.loads(line[5:]) for line in body.splitlines() if line.startswith(b"data:") and line[5:].strip()]
        else:
            messages = [json.loads(body)] if body else []
        return headers, messages

    def initialize(self) -> None:
        headers, _ = self.post(json.dumps(INITIALIZE).encode())
        if b"mcp-session-id" in headers:
            self.session = b"Mcp-Session-Id: " + headers[b"mcp-session-id"] + b"\r\nMcp-Protocol-Version: 2025-06-18\r\n"
        self.post(b'{"jsonrpc":"2.0","method":"notifications/initialized"}')

    def call(self, request_id: int) -> dict[str, Any]:
        _, messages = self.post(CALL % request_id)
        answer = next((m for m in messages if m.get("id") == request_id or "result" in m), None)
        if answer is None or "result" not in answer or answer["result"].get("isError"):
            raise RuntimeError(f"call failed: {messages}")
        return answer

    def close(self) -> None:
        self.file.close()
        self.sock.close()


def http_latency(channel: HttpChannel, calls: int, warmup: int) -> Stats:
    stats = Stats()
    perf = time.perf_counter
    first = channel.next_id
    for i in range(first, first + warmup + calls):
        started = perf()
        channel.call(i)
        elapsed = perf() - started
        if i >= first + warmup:
            stats.samples.append(elapsed)
    channel.next_id = first + warmup + calls
    return stats


class _HttpLoad(asyncio.Protocol):
    """One keep-alive connection keeping one call in flight; counts answers (Content-Length bodies)."""

    def __init__(self, request: bytes, counter: list[int], stop: list[bool]) -> None:
        self.request, self.counter, self.stop = request, counter, stop
        self.buffer = b""
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buffer[:end].lower()
            at = head.find(b"content-length:")
            if at < 0:
                raise RuntimeError(f"no Content-Length: {head[:200]!r}")
            length = int(head[at + 15 :].split(b"\r\n", 1)[0])
            if len(self.buffer) < end + 4 + length:
                return
            if not head.startswith(b"http/1.1 200"):
                raise RuntimeError(f"HTTP error: {head[:100]!r}")
            self.buffer = self.buffer[end + 4 + length :]
            self.counter[0] += 1
            if not self.stop[0]:
                self.transport.write(self.request)


def http_throughput(url: str, token: str | None, streams: int, seconds: float) -> float:
    """Calls/s with ``streams`` connections, each with its own session, one call in flight each."""
    import uvloop

    channels = []
    for _ in range(streams):
        channel = HttpChannel(url, token)
        channel.initialize()
        channels.append(channel)
    requests = [c.request_bytes(CALL % 1) for c in channels]
    for channel in channels:
        channel.close()  # the sessions stay; the load opens its own connections

    async def run() -> float:
        loop = asyncio.get_running_loop()
        counter, stop = [0], [False]
        parts = urlsplit(url)
        protocols = []
        for request in requests:
            transport, protocol = await loop.create_connection(
                lambda r=request: _HttpLoad(r, counter, stop), parts.hostname, parts.port)  # type: ignore[misc]
            transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            protocols.append(protocol)
        for protocol in protocols:
            protocol.transport.write(protocol.request)
        await asyncio.sleep(min(1.0, seconds / 3))
        start_count, started = counter[0], time.perf_counter()
        await asyncio.sleep(seconds)
        rate = (counter[0] - start_count) / (time.perf_counter() - started)
        stop[0] = True
        for protocol in protocols:
            protocol.transport.close()
        return rate

    return uvloop.run(run())


class HttpServer:
    """A server process on a free loopback port: the FastMCP 4 peer or the HTTP floor."""

    def __init__(self, command: list[str], port: int, path: str = "/mcp") -> None:
        self.command, self.port = command, port
        self.url = f"http://127.0.0.1:{port}{path}"
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> HttpServer:
        self.proc = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while True:
            try:
                channel = HttpChannel(self.url)
                channel.initialize()
                channel.close()
                return self
            except (OSError, RuntimeError, ValueError):
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.__exit__()
                    raise RuntimeError(f"{self.command} did not serve {self.url}") from None
                time.sleep(0.1)

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            stop_process(self.proc, 30)
            self.proc = None


def distribution(stats: Stats) -> dict[str, float]:
    """Percentiles in µs, for the tables and the plot in docs/performance.md."""
    return {**stats.summary(), **{f"p{round(q * 100)}_us": round(percentile(stats.samples, q) * 1e6, 1) for q in PERCENTILES}}


def endpoint(daemon: DaemonUnderTest) -> tuple[str, str]:
    """A daemon's HTTP URL and token, as a user finds them."""
    with RawConnection(daemon.socket) as raw:
        info = raw.request("atomic/status")["result"]["http"]
    return info["url"], Path(info["tokenFile"]).read_text().strip()


def extract(revision: str, into: Path) -> Path:
    """``client/`` and ``daemon/`` of ``revision``, written under ``into``."""
    archive = subprocess.run(["git", "-C", str(BENCH.parent), "archive", revision, "client", "daemon"], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def measure(quick: bool = False, base: str | None = None) -> Report:
    settings = Settings(quick)
    python4 = str(peer_python(*FASTMCP4_VENV))
    report = Report("httpcalls", data={"settings": vars(settings), **({"base": base} if base else {})})
    latency_rows: list[list[Any]] = []
    rate_rows: list[list[Any]] = []
    base_http = f"atomictoolsd at {base}, HTTP"
    with tempfile.TemporaryDirectory(prefix="atomictools-base-") as scratch:
        source = extract(base, Path(scratch)) if base else None
        for mode, pinned in MODES:
            measure_mode(settings, mode, pinned, python4, source, base_http, report, latency_rows, rate_rows)
    report.tables.append(Table(
        "http-latency", "tools/call over Streamable HTTP (µs), sequential calls of a one-line echo tool",
        ["system, transport", "mode", "p50 µs", "p90 µs", "p99 µs", "p50 × vs fastmcp 4 HTTP", "p50 × the floor"], latency_rows,
        [f"{settings.rounds} rounds taken in turns; per round {settings.calls} timed calls ({settings.peer_calls} to "
         "FastMCP), after a warm-up, one keep-alive connection each. The socket rows compare a daemon serving HTTP "
         "with one that does not."],
    ))
    report.tables.append(Table(
        "http-throughput", f"calls/s over HTTP, {settings.streams} keep-alive connections, one call in flight each",
        ["system", "mode", "calls/s", "share of the floor's"], rate_rows,
        [f"{settings.seconds:g} s after a warm-up, in turns; each connection has its own session. The floor's row is "
         "also the load generator's capacity."],
    ))
    return report


def measure_mode(settings: Settings, mode: str, pinned: bool, python4: str, source: Path | None, base_http: str,
                 report: Report, latency_rows: list[list[Any]], rate_rows: list[list[Any]]) -> None:
    with affinity(pinned):
        daemons = {OURS_HTTP: DaemonUnderTest(extra_env={"ATOMICTOOLS_HTTP": "127.0.0.1:0"}).start()}
        plain = DaemonUnderTest().start()
        try:
            if source is not None:
                daemons[base_http] = DaemonUnderTest(extra_env={"ATOMICTOOLS_HTTP": "127.0.0.1:0"}, source=source).start()
            endpoints = {name: endpoint(daemon) for name, daemon in daemons.items()}
            ours = daemons[OURS_HTTP]
            fast_port, floor_port = free_port(), free_port()
            with HttpServer([python4, str(BENCH / "peers" / "fastmcp4_echo.py"), "--http", str(fast_port)], fast_port) as fast, \
                    HttpServer([sys.executable, str(BENCH / "peers" / "floor_http.py"), str(floor_port)], floor_port) as floor:
                channels = {**{name: HttpChannel(*ends) for name, ends in endpoints.items()}, FAST_HTTP: HttpChannel(fast.url),
                            FLOOR_HTTP: HttpChannel(floor.url)}
                for channel in channels.values():
                    channel.initialize()
                sockets = {SOCKET_ON: socket_channel(str(ours.socket)), SOCKET_OFF: socket_channel(str(plain.socket))}
                for channel in sockets.values():
                    channel.handshake()
                pooled = {name: Stats() for name in [*channels, *sockets]}
                for _ in range(settings.rounds):
                    for name, channel in channels.items():
                        peer = name == FAST_HTTP
                        calls = settings.peer_calls if peer else settings.calls
                        warmup = settings.warmup // 5 if peer else settings.warmup
                        pooled[name].samples += http_latency(channel, calls, warmup).samples
                    for name, socket_chan in sockets.items():
                        pooled[name].samples += measure_latency(socket_chan, settings.calls, settings.warmup).samples
                for channel in channels.values():
                    channel.close()
                for socket_chan in sockets.values():
                    socket_chan.close()
                turns: dict[str, list[float]] = {name: [] for name in [*endpoints, FLOOR_HTTP]}
                for _ in range(settings.rate_rounds):
                    for name, (url, token) in endpoints.items():
                        turns[name].append(http_throughput(url, token, settings.streams, settings.seconds))
                    turns[FLOOR_HTTP].append(http_throughput(floor.url, None, settings.streams, settings.seconds))
                rates = {name: statistics.median(values) for name, values in turns.items()}
        finally:
            for daemon in [*daemons.values(), plain]:
                daemon.stop()
    stats = {name: distribution(s) for name, s in pooled.items()}
    fast_p50, floor_p50, floor_rate = stats[FAST_HTTP]["p50_us"], stats[FLOOR_HTTP]["p50_us"], rates[FLOOR_HTTP]
    for name, s in stats.items():
        latency_rows.append([name, mode, s["p50_us"], s["p90_us"], s["p99_us"],
                             ratio(fast_p50, s["p50_us"]) if name != FAST_HTTP else None,
                             ratio(s["p50_us"], floor_p50) if name != FLOOR_HTTP else None])
    for name, rate in rates.items():
        rate_rows.append([name, mode, round(rate), f"{rate / floor_rate:.0%}" if name != FLOOR_HTTP else None])
    report.data[mode] = {"latency": stats, "calls_per_s": {k: round(v) for k, v in rates.items()},
                         "calls_per_s_turns": {k: [round(v) for v in values] for k, values in turns.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    parser.add_argument("--base", metavar="REV", help="also measure the endpoint of this git revision, in the same turns")
    args = parser.parse_args()
    run_alone(measure(args.quick, args.base))


if __name__ == "__main__":
    main()
