"""The daemon's filtering HTTP proxy: the one way out of a confined worker allowed the network.

Such a worker runs in a network namespace of its own, where only its loopback exists
(``worker/netns.py``). There it listens on ``127.0.0.1:PROXY_PORT`` and hands the listening socket
to the daemon; the spawner gives it to ``NetProxy.attach``, which accepts on it on the daemon's
event loop (a socket stays in the namespace it was made in) and relays each request from the
host's network:

- ``CONNECT host:port`` (HTTPS, and any TCP a client tunnels) is answered ``200`` and relayed both
  ways;
- a plain HTTP request in absolute form (``GET http://host/path HTTP/1.1``) goes to the host in
  origin form, with ``Connection: close`` and without the hop-by-hop headers; the client's next
  request on the same connection can only ever reach the same host.

Where a request may go: the worker's policy (``registry/confinement.policy``) lists the hosts its
user allowed (``--allow-net HOST,…``; none listed: any public host). The name is resolved here, in
a thread of the proxy's own, and the connection is made to an address that was checked, never to
the name again (no DNS rebinding between the check and the connect). Refused, whatever the hosts
listed: loopback, unspecified and multicast addresses, this machine's own addresses (a ``bind``
to the address succeeds: the daemon's HTTP endpoint on any of them, the user's local services),
and, unless ``sandbox_allow_net_private`` names them, every address that is not global (RFC 1918,
shared, link-local, unique-local, reserved), IPv4 addresses inside IPv6 ones judged as the IPv4
address. A refusal is a ``403`` whose text says why and what the user can do.

Bounded, so that a worker cannot hold up the daemon: ``ProxyLimits`` caps the connections of one
worker and of all workers (past the cap, connections wait unaccepted in the worker's own backlog),
the size of a request head and the time to send it, the time to resolve and to connect, and a
relay that carries nothing either way for ``idle_timeout``. Nothing here blocks the event loop:
names are resolved in the proxy's threads (two), and writes wait for the reader (``drain``).

It never decides what a worker may reach (the policy does) and never reads a body.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import logging
import re
import resource
import socket
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from atomictoolsd.config.command import command_name
from atomictoolsd.config.nethosts import host_matches, normal_host, private_allows

__all__ = ["NetProxy", "ProxyLimits", "ProxyRefusal", "address_refusal"]

log = logging.getLogger("atomictoolsd.workers")

_Address = ipaddress.IPv4Address | ipaddress.IPv6Address
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
# Headers that concern one connection, not the request: never passed on (RFC 9110, 7.6.1).
_HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-connection", "proxy-authorization", "proxy-authenticate", "te", "trailer",
    "upgrade",
})
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # a header's name (RFC 9110, 5.6.2)
_LOGGED_REFUSALS = 20  # per worker: a worker that keeps asking is counted, not logged line by line


@dataclass(frozen=True)
class ProxyLimits:
    """How much of the daemon the proxy may take; each bound is per connection unless it says so."""

    per_worker: int = 32  # connections of one worker at once; more wait in its listener's backlog
    total: int = 256  # connections of every worker at once (and an eighth of the open-file limit at most)
    head_bytes: int = 16 * 1024  # a request's line and headers
    head_timeout: float = 10.0  # seconds to send them
    resolve_timeout: float = 10.0
    connect_timeout: float = 10.0
    idle_timeout: float = 300.0  # seconds a relay may carry nothing either way
    chunk: int = 64 * 1024  # bytes read at a time; a writer's buffer holds about as much before it waits
    resolvers: int = 2  # threads resolving names (a slow resolver holds these, never the event loop)


class ProxyRefusal(Exception):
    """A request the proxy answers itself: ``status`` and a message for the user."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


def _embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one carries and is delivered to (mapped, 6to4, Teredo, NAT64)."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def address_refusal(address: _Address, host: str, private: list[str]) -> str | None:
    """Why a confined tool may not reach ``address`` (which ``host`` resolved to), or None.
    ``private`` is ``sandbox_allow_net_private``. This machine's own addresses are checked when
    connecting (``_own_address``)."""
    if isinstance(address, ipaddress.IPv6Address):
        inner = _embedded_ipv4(address)
        if inner is not None:
            return address_refusal(inner, host, private)  # where it is delivered
    if address.is_loopback:
        return "a loopback address (this machine's own services)"
    if address.is_unspecified:
        return "the unspecified address (this machine)"
    if address.is_multicast:
        return "a multicast address"
    if not address.is_global and not private_allows(private, host, address):
        return "a private address (your own network; sandbox_allow_net_private can allow it)"
    return None


@dataclass
class _WorkerProxy:
    """One worker's listener and connections."""

    pid: int
    hosts: list[str] | None  # None: any public host
    private: list[str]
    handoff: socket.socket | None
    listener: socket.socket | None = None
    accepting: asyncio.Task[None] | None = None
    connections: set[asyncio.Task[None]] = field(default_factory=set)
    refused: int = 0
    closed: bool = False


class NetProxy:
    """Serves the proxy listeners that confined workers hand over; one per worker, until it ends."""

    def __init__(self, limits: ProxyLimits | None = None) -> None:
        self.limits = limits or ProxyLimits()
        self._workers: dict[int, _WorkerProxy] = {}
        self._open = 0  # connections of every worker
        self._freed: asyncio.Event | None = None
        self._resolver: ThreadPoolExecutor | None = None
        self.relayed = 0  # requests let through, since the start
        self.refused = 0  # requests refused, since the start

    # -- workers ------------------------------------------------------------------------------

    def attach(self, pid: int, handoff: socket.socket, policy: dict[str, Any]) -> _WorkerProxy:
        """Serve worker ``pid``'s proxy once it hands its listener over ``handoff`` (ours to close),
        to the hosts ``policy`` allows; ``detach`` it when the worker ends."""
        hosts = policy.get("net_hosts")
        proxy = _WorkerProxy(pid, list(hosts) if hosts else None, list(policy.get("net_private") or ()), handoff)
        self._workers[pid] = proxy
        handoff.setblocking(False)
        asyncio.get_running_loop().add_reader(handoff.fileno(), self._on_handoff, proxy)
        return proxy

    def detach(self, proxy: _WorkerProxy) -> None:
        """The worker ended: its listener closes, its connections end."""
        if proxy.closed:
            return
        proxy.closed = True
        if self._workers.get(proxy.pid) is proxy:
            del self._workers[proxy.pid]
        self._close_handoff(proxy)
        if proxy.accepting is not None:
            proxy.accepting.cancel()
        for task in list(proxy.connections):
            task.cancel()
        if proxy.listener is not None:
            proxy.listener.close()  # the last reference to the worker's namespace: it goes too

    async def close(self) -> None:
        tasks = [t for p in self._workers.values() for t in (*p.connections, *([p.accepting] if p.accepting else []))]
        for proxy in list(self._workers.values()):
            self.detach(proxy)
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._resolver is not None:
            self._resolver.shutdown(wait=False, cancel_futures=True)

    def info(self) -> dict[str, Any]:
        """For status: the workers served, connections open, requests relayed and refused."""
        return {"workers": len(self._workers), "connections": self._open, "relayed": self.relayed,
                "refused": self.refused, "perWorker": self.limits.per_worker, "total": self.total()}

    def _close_handoff(self, proxy: _WorkerProxy) -> None:
        if proxy.handoff is None:
            return
        try:
            asyncio.get_running_loop().remove_reader(proxy.handoff.fileno())
        except (ValueError, OSError):
            pass
        proxy.handoff.close()
        proxy.handoff = None

    def _on_handoff(self, proxy: _WorkerProxy) -> None:
        assert proxy.handoff is not None
        try:
            _, fds, _, _ = socket.recv_fds(proxy.handoff, 64, 4)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            fds = []
        self._close_handoff(proxy)
        listeners = [socket.socket(fileno=fd) for fd in fds]
        for extra in listeners[1:]:
            extra.close()
        if not listeners:
            return  # the worker could not isolate itself: it reports that, and ends
        listener = listeners[0]
        if not _is_tcp_listener(listener):
            listener.close()
            log.warning("worker %d handed over something that is not a TCP listener; its network stays closed", proxy.pid)
            return
        listener.setblocking(False)
        proxy.listener = listener
        proxy.accepting = asyncio.get_running_loop().create_task(self._accept(proxy))

    # -- connections --------------------------------------------------------------------------

    async def _accept(self, proxy: _WorkerProxy) -> None:
        loop = asyncio.get_running_loop()
        assert proxy.listener is not None
        while True:
            await self._room(proxy)
            try:
                conn, _ = await loop.sock_accept(proxy.listener)
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    await asyncio.sleep(0.1)  # out of descriptors: the connection waits in the backlog
                    continue
                return
            self._open += 1
            task = loop.create_task(self._serve(proxy, conn))
            proxy.connections.add(task)
            task.add_done_callback(lambda t, p=proxy: self._ended(p, t))

    async def _room(self, proxy: _WorkerProxy) -> None:
        """Wait until this worker, and every worker together, may have one more connection."""
        if self._freed is None:
            self._freed = asyncio.Event()
        while len(proxy.connections) >= self.limits.per_worker or self._open >= self.total():
            self._freed.clear()
            await self._freed.wait()

    def total(self) -> int:
        """Connections of every worker at once: ``limits.total``, and no more than an eighth of the
        open-file limit (each holds two descriptors; clients and workers need the rest)."""
        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        return self.limits.total if soft == resource.RLIM_INFINITY else max(1, min(self.limits.total, soft // 8))

    def _ended(self, proxy: _WorkerProxy, task: asyncio.Task[None]) -> None:
        proxy.connections.discard(task)
        self._open -= 1
        if self._freed is not None:
            self._freed.set()
        if not task.cancelled() and task.exception() is not None:
            log.warning("a proxy connection of worker %d failed: %r", proxy.pid, task.exception())

    async def _serve(self, proxy: _WorkerProxy, conn: socket.socket) -> None:
        upstream: asyncio.StreamWriter | None = None
        try:
            reader, writer = await asyncio.open_connection(sock=conn, limit=self.limits.head_bytes)
        except OSError:
            conn.close()
            return
        try:
            try:
                request = await self._read_head(reader)
                if request is None:
                    return
                up_reader, upstream = await self._open_upstream(proxy, request)
            except ProxyRefusal as refusal:
                self._refused(proxy, refusal)
                await self._answer(writer, refusal.status, refusal.reason, str(refusal))
                return
            self.relayed += 1
            if request.method == "CONNECT":
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:
                upstream.write(request.forwarded_head())
            await self._relay(reader, writer, up_reader, upstream)
        except (OSError, asyncio.IncompleteReadError, TimeoutError):
            pass
        finally:
            for stream in (writer, upstream):
                if stream is not None:
                    stream.close()

    async def _read_head(self, reader: asyncio.StreamReader) -> _Request | None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.limits.head_timeout)
        except asyncio.IncompleteReadError:
            return None  # gone before it asked anything
        except asyncio.LimitOverrunError:
            raise ProxyRefusal(431, "Request Header Fields Too Large",
                          f"the request's head is larger than {self.limits.head_bytes} bytes") from None
        except TimeoutError:
            raise ProxyRefusal(408, "Request Timeout",
                          f"the request's head did not arrive within {self.limits.head_timeout:g} s") from None
        return _Request.parse(head)

    async def _open_upstream(self, proxy: _WorkerProxy, request: _Request) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        host = request.host
        where = f"{host}:{request.port}"
        if proxy.hosts is not None and not host_matches(host, proxy.hosts):
            raise ProxyRefusal(403, "Forbidden", (
                f"{host} is not among the hosts this project's tools may reach ({', '.join(proxy.hosts)}); "
                f"the user can add it to the hosts of `{command_name()} trust --sandbox --allow-net HOST,…`"
            ))
        addresses = await self._resolve(host, request.port)
        allowed, why = [], None
        for family, sockaddr in addresses:
            refusal = address_refusal(ipaddress.ip_address(sockaddr[0].split("%")[0]), host, proxy.private)
            if refusal is None:
                allowed.append((family, sockaddr))
            else:
                why = why or refusal
        if not allowed:
            raise ProxyRefusal(403, "Forbidden", f"{where} is {why}: a confined tool never reaches it")
        return await self._connect(where, allowed)

    async def _resolve(self, host: str, port: int) -> list[tuple[int, Any]]:
        try:
            ipaddress.ip_address(host)
        except ValueError:
            pass
        else:
            return [(socket.AF_INET6 if ":" in host else socket.AF_INET, (host, port))]
        if self._resolver is None:
            self._resolver = ThreadPoolExecutor(self.limits.resolvers, thread_name_prefix="atomictoolsd-resolve")
        loop = asyncio.get_running_loop()
        try:
            found = await asyncio.wait_for(
                loop.run_in_executor(self._resolver, socket.getaddrinfo, host, port, 0, socket.SOCK_STREAM),
                self.limits.resolve_timeout,
            )
        except TimeoutError:
            raise ProxyRefusal(504, "Gateway Timeout", f"{host} did not resolve within {self.limits.resolve_timeout:g} s") from None
        except OSError as exc:
            raise ProxyRefusal(502, "Bad Gateway", f"{host} does not resolve: {exc}") from None
        return [(family, sockaddr) for family, _, _, _, sockaddr in found if family in (socket.AF_INET, socket.AF_INET6)]

    async def _connect(self, where: str, addresses: list[tuple[int, Any]]) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        loop = asyncio.get_running_loop()
        failure = "no address"
        for family, sockaddr in addresses:
            sock = socket.socket(family, socket.SOCK_STREAM)
            try:
                sock.setblocking(False)
                if _own_address(sock, sockaddr[0]):
                    raise ProxyRefusal(403, "Forbidden", f"{where} is one of this machine's own addresses: a confined tool never reaches it")
                await asyncio.wait_for(loop.sock_connect(sock, sockaddr), self.limits.connect_timeout)
                return await asyncio.open_connection(sock=sock, limit=self.limits.chunk)
            except TimeoutError:
                sock.close()
                failure = f"no answer within {self.limits.connect_timeout:g} s"
            except OSError as exc:
                sock.close()
                failure = exc.strerror or str(exc)
            except BaseException:
                sock.close()
                raise
        raise ProxyRefusal(502, "Bad Gateway", f"cannot connect to {where}: {failure}")

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     up_reader: asyncio.StreamReader, upstream: asyncio.StreamWriter) -> None:
        """Both ways until the host closes (or both sides have), or nothing moves for ``idle_timeout``."""
        last = [time.monotonic()]
        to_host = asyncio.ensure_future(self._pipe(reader, upstream, last))
        try:
            await self._pipe(up_reader, writer, last)
        finally:
            to_host.cancel()
            await asyncio.gather(to_host, return_exceptions=True)

    async def _pipe(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, last: list[float]) -> None:
        idle = self.limits.idle_timeout
        while True:
            try:
                data = await asyncio.wait_for(source.read(self.limits.chunk), idle)
            except TimeoutError:
                if time.monotonic() - last[0] < idle:
                    continue  # the other way is busy
                return
            if not data:
                if sink.can_write_eof():
                    sink.write_eof()
                return
            last[0] = time.monotonic()
            sink.write(data)
            await asyncio.wait_for(sink.drain(), idle)

    async def _answer(self, writer: asyncio.StreamWriter, status: int, reason: str, message: str) -> None:
        body = f"atomictoolsd's proxy refused this request: {message}\n".encode()
        writer.write(
            f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body
        )
        try:
            await asyncio.wait_for(writer.drain(), self.limits.head_timeout)
        except (OSError, TimeoutError):
            pass

    def _refused(self, proxy: _WorkerProxy, refusal: ProxyRefusal) -> None:
        self.refused += 1
        proxy.refused += 1
        if proxy.refused <= _LOGGED_REFUSALS:
            log.info(
                "the proxy refused a request of worker %d: %s%s", proxy.pid, refusal,
                " (its later refusals are counted, not logged)" if proxy.refused == _LOGGED_REFUSALS else "",
                extra={"event": "netproxy.refused", "data": {"pid": proxy.pid, "status": refusal.status}},
            )


@dataclass
class _Request:
    """A request's head, as the proxy needs it."""

    method: str
    host: str
    port: int
    target: str = ""  # origin form, for a plain HTTP request
    version: str = "HTTP/1.1"
    headers: list[tuple[str, str]] = field(default_factory=list)

    @classmethod
    def parse(cls, head: bytes) -> _Request:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            raise ProxyRefusal(400, "Bad Request", "not an HTTP/1.x request")
        method, target, version = parts
        headers = []
        for line in lines[1:]:
            if line:
                name, sep, value = line.partition(":")
                if not sep or not _TOKEN.match(name):
                    raise ProxyRefusal(400, "Bad Request", f"a malformed header line: {line[:80]!r}")
                headers.append((name, value.strip()))
        if method == "CONNECT":
            host, port = _authority(target)
            return cls(method, host, port, version=version)
        url = urllib.parse.urlsplit(target)
        if url.scheme.lower() != "http" or not url.hostname:
            how = "use CONNECT for https" if url.scheme.lower() == "https" else "send an absolute http:// URL"
            raise ProxyRefusal(400, "Bad Request", f"this is a proxy: {how}")
        try:
            port = url.port or 80
        except ValueError:
            raise ProxyRefusal(400, "Bad Request", f"a bad port in {target[:200]!r}") from None
        origin = (url.path or "/") + (f"?{url.query}" if url.query else "")
        return cls(method, _host(url.hostname), port, origin, version, headers)

    def forwarded_head(self) -> bytes:
        """The head sent to the host: origin form, ``Host`` from the URL (the one that was checked,
        never the client's), no hop-by-hop headers, ``Connection: close``."""
        named = {v.strip().lower() for n, v in self.headers if n.lower() == "connection" for v in v.split(",")}
        dropped = _HOP_BY_HOP | named | {"host"}
        kept = [(n, v) for n, v in self.headers if n.lower() not in dropped]
        host = f"[{self.host}]" if ":" in self.host else self.host
        kept.insert(0, ("Host", host if self.port == 80 else f"{host}:{self.port}"))
        lines = [f"{self.method} {self.target} {self.version}", *(f"{n}: {v}" for n, v in kept), "Connection: close"]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _authority(target: str) -> tuple[str, int]:
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ProxyRefusal(400, "Bad Request", f"CONNECT needs host:port, got {target[:200]!r}")
    return _host(host), int(port)


def _host(host: str) -> str:
    try:
        return normal_host(host)
    except ValueError as exc:
        raise ProxyRefusal(400, "Bad Request", str(exc)) from None


def _is_tcp_listener(sock: socket.socket) -> bool:
    try:
        return sock.type == socket.SOCK_STREAM and sock.family in (socket.AF_INET, socket.AF_INET6) and bool(
            sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN))
    except OSError:
        return False


def _own_address(sock: socket.socket, address: str) -> bool:
    """Whether ``address`` is one of this machine's: only then can a socket be bound to it."""
    try:
        sock.bind((address, 0))
    except OSError as exc:
        return exc.errno != errno.EADDRNOTAVAIL
    return True
