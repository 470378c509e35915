"""The network of a confined tool allowed it (``trust --sandbox --allow-net``): a namespace of its
own, and the daemon's filtering proxy as its one way out (docs/sandbox.md, "The network").

Real daemon, real workers, real kernel namespaces. The machine has no internet, so the "public"
hosts a tool may reach are test hosts in a network namespace this test makes (``ip netns``, a veth
pair): 10.231.N.1 and 10.231.N.3 serve HTTP and a TCP echo, and the host's end of the pair is
10.231.N.2, one of this machine's own addresses. Those are private addresses, which the proxy
refuses unless the user's ``sandbox_allow_net_private`` names them: the tests name the test
network there, as a user names a host of their own network, and check the refusal without it. Every
other target is on this machine: loopback listeners the test starts, and the daemon's own HTTP
endpoint.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import psutil
import pytest

from atomictoolsd.worker.netns import USERNS_ENV
from atomictoolsd.worker.netns import support as netns_support
from atomictoolsd.worker.sandbox import REQUIRED_ABI, kernel_abi
from helpers import Daemon, Env, wait_for

pytestmark = [
    pytest.mark.skipif(kernel_abi() < REQUIRED_ABI, reason=f"confining workers needs Landlock ABI {REQUIRED_ABI}"),
    pytest.mark.skipif(not netns_support()["available"], reason=str(netns_support()["reason"])),
]

HELPER = r'''
import json, os, select, socket, subprocess, sys, urllib.error, urllib.request

PROXY = ("127.0.0.1", 3128)
held = []


def attempt(what, target):
    try:
        return _attempt(what, target)
    except urllib.error.HTTPError as exc:
        return f"refused: {exc.code} {exc.read().decode().strip()}"
    except OSError as exc:
        return f"failed: {type(exc).__name__} errno {exc.errno} {exc}"


def head(sock):
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return data.decode(errors="replace")


def _attempt(what, target):
    if what == "get":  # through the proxy that the environment names, as any HTTP client
        with urllib.request.urlopen(target, timeout=30) as response:
            return "ok: " + response.read().decode()
    if what == "direct":  # host:port, around the proxy
        host, port = target.rsplit(":", 1)
        socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
        return "connected"
    if what == "tunnel":  # CONNECT host:port through the proxy, then an echo
        with socket.create_connection(PROXY, timeout=30) as sock:
            sock.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
            answer = head(sock)
            if not answer.startswith("HTTP/1.1 200"):
                return "refused: " + answer.replace("\r\n", " ")
            sock.sendall(b"ping")
            return "ok: " + sock.recv(100).decode()
    if what == "raw":  # these bytes to the proxy; the first line of its answer
        with socket.create_connection(PROXY, timeout=30) as sock:
            sock.sendall(target.encode())
            return "answer: " + head(sock).split("\r\n")[0]
    if what == "hold":  # open connections to the proxy and send nothing
        for _ in range(int(target)):
            held.append(socket.create_connection(PROXY, timeout=5))
        return f"ok: {len(held)}"
    if what == "stall":  # ask for a large page and never read it
        sock = socket.create_connection(PROXY, timeout=30)
        sock.sendall(f"GET {target} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        held.append(sock)
        return "ok: asked"
    if what == "held":  # what each held connection got so far
        answered, _, _ = select.select(held, [], [], 0)
        seen = {"waiting": len(held) - len(answered)}
        for sock in answered:
            line = sock.recv(200, socket.MSG_PEEK).decode(errors="replace").split("\r\n")[0] or "closed"
            seen[line] = seen.get(line, 0) + 1
        return "ok: " + json.dumps(seen, sort_keys=True)
    if what == "namespace":  # a user namespace of its own, and with it every capability in it
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.unshare(0x10000000 | 0x40000000) != 0:  # CLONE_NEWUSER | CLONE_NEWNET
            raise OSError(ctypes.get_errno(), "unshare")
        return "ok: unshared"
    if what == "env":
        return "ok: " + json.dumps({k: v for k, v in os.environ.items() if k.lower().endswith("_proxy")}, sort_keys=True)
    raise ValueError(what)


if __name__ == "__main__":
    print(attempt(sys.argv[1], sys.argv[2]))
'''

TOOL = r'''
import os, subprocess, sys

from _nethelper import attempt


def {name}(what: str, target: str = "", child: bool = False) -> str:
    """Try one way to the network, here or from a program this tool starts."""
    if not child:
        return attempt(what, target)
    helper = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_nethelper.py")
    done = subprocess.run([sys.executable, helper, what, target], capture_output=True, text=True, timeout=90)
    return done.stdout.strip() or done.stderr.strip()[-400:]
'''

# The test hosts: a page on 8080 that says which address served it, a TCP echo on 8443. Bounded:
# the program ends itself after five minutes, whatever happens to the test.
SERVER = r'''
import os, socketserver, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class Page(BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/big":  # more than any buffer on the way holds: for a client that never reads
            self.send_response(200)
            self.send_header("Content-Length", str(256 << 20))
            self.end_headers()
            for _ in range(4096):
                self.wfile.write(b"x" * (64 << 10))
            return
        body = f"upstream {self.connection.getsockname()[0]} {self.path}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

class Echo(socketserver.BaseRequestHandler):
    def handle(self):
        self.request.sendall(self.request.recv(100))

threading.Timer(300, lambda: os._exit(0)).start()
ThreadingHTTPServer.allow_reuse_address = socketserver.ThreadingTCPServer.allow_reuse_address = True
page = ThreadingHTTPServer(("0.0.0.0", 8080), Page)
echo = socketserver.ThreadingTCPServer(("0.0.0.0", 8443), Echo)
threading.Thread(target=echo.serve_forever, daemon=True).start()
print("ready", flush=True)
page.serve_forever()
'''


def ip(*args: str) -> str:
    return subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30).stdout


class NetHosts:
    """Two test hosts in a network namespace of the test's own, reached over a veth pair."""

    def __init__(self) -> None:
        tag = os.getpid() % 10000
        self.namespace = f"atomictools-test-{tag}"
        self.veth = f"atv{tag}"
        taken = ip("-o", "-4", "addr", "show")
        subnet = next(n for n in range(20, 250) if f" 10.231.{(tag + n) % 230 + 20}." not in taken)
        self.prefix = f"10.231.{(tag + subnet) % 230 + 20}"
        self.server: subprocess.Popen[str] | None = None
        ip("netns", "add", self.namespace)
        try:
            self._wire()
            self._serve()
        except BaseException:
            self.close()
            raise

    def _wire(self) -> None:
        ns = self.namespace
        ip("link", "add", f"{self.veth}h", "type", "veth", "peer", "name", f"{self.veth}u", "netns", ns)
        ip("addr", "add", f"{self.mine}/24", "dev", f"{self.veth}h")
        ip("link", "set", f"{self.veth}h", "up")
        for address in (self.first, self.second):
            ip("-n", ns, "addr", "add", f"{address}/24", "dev", f"{self.veth}u")
        ip("-n", ns, "link", "set", f"{self.veth}u", "up")
        ip("-n", ns, "link", "set", "lo", "up")

    def _serve(self) -> None:
        self.server = subprocess.Popen(
            ["ip", "netns", "exec", self.namespace, sys.executable, "-I", "-c", SERVER],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
        )
        assert self.server.stdout is not None
        line = self.server.stdout.readline()
        assert line.strip() == "ready", self.server.stderr.read() if self.server.stderr else line

    @property
    def first(self) -> str:
        return f"{self.prefix}.1"

    @property
    def second(self) -> str:
        return f"{self.prefix}.3"

    @property
    def mine(self) -> str:
        """The host's end of the pair: an address of this machine."""
        return f"{self.prefix}.2"

    def close(self) -> None:
        if self.server is not None and self.server.poll() is None:
            self.server.send_signal(signal.SIGTERM)
            try:
                self.server.wait(10)
            except subprocess.TimeoutExpired:
                self.server.kill()
                self.server.wait()
        subprocess.run(["ip", "netns", "del", self.namespace], capture_output=True, timeout=30)  # the pair goes with it


@pytest.fixture(scope="module")
def hosts() -> Iterator[NetHosts]:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("test hosts need root and iproute2 (ip netns)")
    made = NetHosts()
    try:
        yield made
    finally:
        made.close()


class Listener:
    """A TCP listener on this machine; records whatever reaches it."""

    def __init__(self, address: str, family: int = socket.AF_INET) -> None:
        self.sock = socket.create_server((address, 0), family=family)
        self.sock.settimeout(0.2)
        self.target = f"[{address}]:{self.port}" if family == socket.AF_INET6 else f"{address}:{self.port}"
        self.received: list[bytes] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            with conn:
                self.received.append(b"connected")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


def cli(env: Env, *args: str, extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    if args[:1] == ("trust",) and "--list" not in args:
        args = (*args, "--yes")  # no terminal here: trust asks for one otherwise
    return subprocess.run([sys.executable, "-m", "atomictoolsd", *args], env={**env.vars, **(extra or {})},
                          cwd=env.project, capture_output=True, text=True, timeout=60)


def configure(env: Env, text: str) -> None:
    env.write_config(text)


@pytest.fixture
def project(env: Env) -> Env:
    env.set_trust_all(False)
    env.write_tool(env.local_tools, "_nethelper.py", HELPER)
    env.write_tool(env.local_tools, "net.py", TOOL.replace("{name}", "net"))
    env.write_tool(env.local_tools, "other.py", TOOL.replace("{name}", "other"))
    return env


def call(client: Any, what: str, target: str = "", child: bool = False, tool: str = "net") -> str:
    result = client.call(tool, what=what, target=target, child=child)
    assert not result.is_error, result.text
    return str(result.text).strip()


def test_a_tool_with_the_network_reaches_no_address_of_this_machine(project: Env, hosts: NetHosts, make_daemon, record) -> None:  # type: ignore[no-untyped-def]
    env = project
    configure(env, f'http = "127.0.0.1:0"\nsandbox_allow_net_private = "{hosts.prefix}.0/24"\n')
    assert cli(env, "trust", "--sandbox", "--allow-net").returncode == 0
    daemon: Daemon = make_daemon()
    listeners = [Listener("127.0.0.1"), Listener("127.0.0.2"), Listener(hosts.mine)]
    if socket.has_ipv6:
        try:
            listeners.append(Listener("::1", socket.AF_INET6))
        except OSError:
            pass  # no IPv6 loopback here
    try:
        with daemon.client() as client:
            endpoint = client.status()["http"]["url"].split("//")[1].split("/")[0]  # the daemon's own HTTP
            targets = [endpoint, *(listener.target for listener in listeners)]
            outcomes = {}
            for child in (False, True):
                for target in targets:
                    outcomes[(target, "direct", child)] = call(client, "direct", target, child)
                    outcomes[(target, "get", child)] = call(client, "get", f"http://{target}/mcp", child)
                    outcomes[(target, "tunnel", child)] = call(client, "tunnel", target, child)
                port = endpoint.rsplit(":", 1)[1]
                outcomes[("localhost", "get", child)] = call(client, "get", f"http://localhost:{port}/mcp", child)
            got_through = {k: v for k, v in outcomes.items() if not v.startswith(("refused", "failed"))}
            assert not got_through, got_through
            assert all(v.startswith("refused: 403") or "403" in v for (_, how, _), v in outcomes.items() if how != "direct"), outcomes
            assert "this machine's own addresses" in outcomes[(listeners[2].target, "tunnel", False)]
            assert "loopback" in outcomes[(endpoint, "get", False)]
            assert all(listener.received == [] for listener in listeners)
            # The way that is open: the proxy, to a host that is not this machine.
            for child in (False, True):
                assert call(client, "get", f"http://{hosts.first}:8080/page?x=1", child) == f"ok: upstream {hosts.first} /page?x=1"
                assert call(client, "tunnel", f"{hosts.first}:8443", child) == "ok: ping"
            assert call(client, "direct", f"{hosts.first}:8080").startswith("failed"), "only through the proxy"
            listing = client.request("atomic/list", {})
            assert listing["network"] == "through the daemon's proxy: any public host", listing["network"]
            assert client.status()["netProxy"]["refused"] >= len(targets) * 4
    finally:
        for listener in listeners:
            listener.close()
    record(f"{len(outcomes)} ways to this machine's addresses tried (loopback, ::1, its own veth address, the daemon's "
           f"HTTP endpoint): all refused; the test host reached through the proxy (GET and CONNECT)")


def test_allow_net_hosts_names_the_only_hosts_and_private_ones_need_the_user(project: Env, hosts: NetHosts, make_daemon) -> None:  # type: ignore[no-untyped-def]
    env = project
    other = env.root / "elsewhere"
    other.mkdir()
    as_dir = subprocess.run([sys.executable, "-m", "atomictoolsd", "trust", "--yes", "--sandbox", "--allow-net", str(env.project)],
                            env=env.vars, cwd=other, capture_output=True, text=True, timeout=60)
    assert as_dir.returncode == 0 and str(env.project) in as_dir.stdout, "--allow-net DIR: the project at DIR, any host"
    assert "sandbox (+net)" in cli(env, "trust", "--list").stdout
    done = cli(env, "trust", "--sandbox", f"--allow-net={hosts.first}")
    assert done.returncode == 0, done.stderr
    assert f"network: through the daemon's proxy (HTTP_PROXY, HTTPS_PROXY): {hosts.first}" in done.stdout
    assert f"sandbox (+net {hosts.first})" in cli(env, "trust", "--list").stdout
    bad = cli(env, "trust", "--sandbox", "--allow-net", "exa mple.com", str(env.project))
    assert bad.returncode == 2 and "--allow-net" in bad.stderr and "not a host name" in bad.stderr, bad.stderr
    daemon: Daemon = make_daemon()
    with daemon.client() as client:
        # Without the user's word, a host of a private network is not reached: not a public one.
        refused = call(client, "get", f"http://{hosts.first}:8080/")
        assert refused.startswith("refused: 403") and "a private address" in refused and "sandbox_allow_net_private" in refused, refused
        configure(env, f'sandbox_allow_net_private = "{hosts.prefix}.0/24"\n')
        os.kill(daemon.pid, signal.SIGHUP)
        wait_for(lambda: call(client, "get", f"http://{hosts.first}:8080/").startswith("ok"), timeout=20,
                 message="the new configuration to reach the workers")
        assert call(client, "tunnel", f"{hosts.first}:8443") == "ok: ping"
        for how, target in (("get", f"http://{hosts.second}:8080/"), ("tunnel", f"{hosts.second}:8443")):
            refused = call(client, how, target)
            assert "403" in refused and f"{hosts.second} is not among the hosts this project's tools may reach ({hosts.first})" in refused, refused
        assert client.request("atomic/list", {})["network"] == f"through the daemon's proxy: {hosts.first}"


def test_the_proxy_bounds_what_a_worker_can_take(project: Env, hosts: NetHosts, make_daemon, record) -> None:  # type: ignore[no-untyped-def]
    env = project
    configure(env, f'sandbox_allow_net_private = "{hosts.prefix}.0/24"\n')
    assert cli(env, "trust", "--sandbox", "--allow-net").returncode == 0
    daemon: Daemon = make_daemon()
    with daemon.client() as client:
        per_worker = client.status()["netProxy"]["perWorker"]
        assert call(client, "hold", "100") == "ok: 100"  # connections that never send a request
        started = time.monotonic()
        wait_for(lambda: client.status()["netProxy"]["connections"] == per_worker, message="the held connections")
        # The daemon, and another worker's way out, do not wait for them.
        for _ in range(5):
            before = time.monotonic()
            client.request("ping", {})
            assert time.monotonic() - before < 1.0
        assert call(client, "get", f"http://{hosts.first}:8080/", tool="other").startswith("ok: upstream")
        too_big = f"GET http://{hosts.first}:8080/ HTTP/1.1\r\nX-Filler: {'a' * 17000}"
        assert call(client, "raw", too_big, tool="other") == "answer: HTTP/1.1 431 Request Header Fields Too Large"
        assert client.status()["netProxy"]["connections"] <= per_worker + 1, "one worker holds no more than its share"
        # A client that never reads what it asked for: the proxy stops reading the host, and holds
        # a buffer's worth, not the page.
        rss = psutil.Process(daemon.pid).memory_info().rss
        assert call(client, "stall", f"http://{hosts.first}:8080/big", tool="other") == "ok: asked"
        time.sleep(2)
        grown = (psutil.Process(daemon.pid).memory_info().rss - rss) / (1 << 20)
        assert grown < 16, f"the daemon grew by {grown:.1f} MiB"
        # A request head that does not come in time is answered, and the next held ones are taken.
        wait_for(lambda: f'"HTTP/1.1 408 Request Timeout": {per_worker}' in call(client, "held"), timeout=30,
                 interval=0.2, message="the first held connections to time out")
        waited = time.monotonic() - started
        seen = json.loads(call(client, "held").removeprefix("ok: "))
        assert seen.get("HTTP/1.1 408 Request Timeout") == per_worker and seen.get("waiting", 0) == 100 - per_worker, seen
    record(f"100 silent connections from one worker: {per_worker} taken at a time, answered 408 after {waited:.1f} s; "
           f"the daemon and another worker's requests unaffected; a 256 MiB page never read grew the daemon by {grown:.1f} MiB")


def test_without_user_namespaces_a_tool_allowed_the_network_has_none(project: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    env = project
    done = cli(env, "trust", "--sandbox", "--allow-net", extra={USERNS_ENV: "0"})
    assert done.returncode == 0 and "note: its tools get no network on this machine" in done.stdout, done.stdout
    daemon: Daemon = make_daemon({USERNS_ENV: "0"})
    with daemon.client() as client:
        listing = client.request("atomic/list", {})
        assert listing["network"].startswith("none, though allowed:") and "user namespaces" in listing["network"], listing
        for child in (False, True):
            assert call(client, "raw", "GET http://192.0.2.1/ HTTP/1.1\r\n\r\n", child).startswith("failed"), "no proxy"
            assert call(client, "env", child=child) == "ok: {}", "no proxy named"
    shown = cli(env, "list", extra={USERNS_ENV: "0"}).stdout
    assert "network of its confined tools: none, though allowed:" in shown, shown


@pytest.mark.parametrize("level", ["--sandbox", "--allow-net", "full"])
def test_a_confined_tool_makes_no_namespace(project: Env, make_daemon, level: str) -> None:  # type: ignore[no-untyped-def]
    # A new user namespace would hand the tool every capability in it (netfilter, mounts: kernel code
    # no confined tool needs), and a network namespace of its own a way around its proxy's rules.
    env = project
    args = {"--sandbox": ["--sandbox"], "--allow-net": ["--sandbox", "--allow-net"], "full": []}[level]
    assert cli(env, "trust", *args).returncode == 0
    daemon: Daemon = make_daemon()
    with daemon.client() as client:
        # The tool runs on a thread the worker started after its seccomp filter: threads still start
        # (clone3 answers ENOSYS, and the C library uses clone).
        assert call(client, "env").startswith("ok")
        for child in (False, True):
            outcome = call(client, "namespace", child=child)
            if level == "full":
                # The control: the attempt works where nothing forbids it (a program the tool starts;
                # the worker itself has threads, and the kernel makes namespaces for one thread only).
                assert outcome == ("ok: unshared" if child else "failed: OSError errno 22 [Errno 22] unshare"), outcome
            else:
                assert outcome.startswith("failed: PermissionError errno 1"), outcome
