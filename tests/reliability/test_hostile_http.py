"""Hostile users of the HTTP port: another local user's connection flood, a flood without the token
by the owner's own uid, and a client with the token that leaves its sessions behind.

What holds: the owner's socket clients and CLI, and an HTTP client with the token, are served
throughout; a connection from another uid is closed as it is accepted (Linux); connections without
the token are bounded and closed within seconds; HTTP sessions have their own bound, the oldest idle
giving way, and never take the socket's room; the log says what was closed.
"""

from __future__ import annotations

import encodings.idna  # noqa: F401 - socket.create_connection needs it; after setuid it cannot be imported
import http.client
import json
import os
import re
import resource
import selectors
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from helpers import Daemon, Env, RawConnection, pinging, wait_for

NOBODY = 65534
SOFT = 256  # the daemon's open-file limit during the floods: 128 kept for workers, 32 for HTTP


def _http(daemon: Daemon) -> dict[str, Any]:
    with daemon.raw() as raw:
        return raw.request("atomic/status")["result"]["http"]


def _port_and_token(daemon: Daemon) -> tuple[int, str]:
    info = _http(daemon)
    return int(info["url"].rsplit(":", 1)[1].split("/")[0]), Path(info["tokenFile"]).read_text().strip()


def _post(port: int, token: str, body: dict[str, Any], session: str | None = None,
          timeout: float = 10) -> tuple[int, dict[str, str], bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
               "Authorization": f"Bearer {token}"}
    if session is not None:
        headers["Mcp-Session-Id"] = session
    try:
        connection.request("POST", "/mcp", body=json.dumps(body).encode(), headers=headers)
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()


INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t"}}}


def _owner_is_served(daemon: Daemon, port: int, token: str) -> list[str]:
    """What fails for the owner now: a socket client, the CLI, an HTTP client with the token."""
    failures = []
    try:
        with RawConnection(daemon.env.socket, timeout=5) as raw:
            if "result" not in raw.request("ping"):
                failures.append("socket ping refused")
    except OSError as exc:
        failures.append(f"socket: {exc!r}")
    cli = subprocess.run([sys.executable, "-P", "-m", "atomictoolsd", "status"],
                         env=daemon.env.vars, capture_output=True, text=True, timeout=30)
    if cli.returncode != 0:
        failures.append(f"CLI status exit {cli.returncode}: {cli.stderr.strip()[-200:]}")
    try:
        status, _, _ = _post(port, token, {"jsonrpc": "2.0", "id": 1, "method": "ping"}, timeout=5)
        if status != 200:
            failures.append(f"HTTP with the token: {status}")
    except OSError as exc:
        failures.append(f"HTTP with the token: {exc!r}")
    return failures


def _open(port: int, count: int) -> list[socket.socket]:
    opened = []
    for _ in range(count):
        try:
            opened.append(socket.create_connection(("127.0.0.1", port), timeout=2))
        except OSError:
            break
    return opened


def _closed_within(sockets: list[socket.socket], seconds: float) -> int:
    """How many of ``sockets`` the other end closed within ``seconds`` (read end-of-file or a reset)."""
    selector = selectors.DefaultSelector()
    for sock in sockets:
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ)
    closed = 0
    deadline = time.monotonic() + seconds
    while closed < len(sockets) and time.monotonic() < deadline:
        for key, _ in selector.select(max(0.0, deadline - time.monotonic())):
            try:
                data = key.fileobj.recv(4096)  # type: ignore[union-attr]
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:
                selector.unregister(key.fileobj)
                closed += 1
    selector.close()
    return closed


@pytest.fixture
def low_limit() -> Any:
    """Set a daemon's open-file soft limit to ``SOFT``; put it back afterwards."""
    set_for: list[tuple[int, tuple[int, int]]] = []

    def lower(pid: int) -> None:
        before = resource.prlimit(pid, resource.RLIMIT_NOFILE)
        set_for.append((pid, before))
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (SOFT, before[1]))

    yield lower
    for pid, before in set_for:
        try:
            resource.prlimit(pid, resource.RLIMIT_NOFILE, before)
        except ProcessLookupError:
            pass


def test_another_users_connection_flood_is_closed_as_it_is_accepted(env: Env, make_daemon, low_limit, record) -> None:  # type: ignore[no-untyped-def]
    if os.geteuid() != 0 or sys.platform != "linux":
        pytest.skip("needs root (to act as another user) and Linux (sock_diag)")
    daemon: Daemon = make_daemon({"ATOMICTOOLS_HTTP": "127.0.0.1:0"})
    port, token = _port_and_token(daemon)
    low_limit(daemon.pid)
    opened_r, opened_w = os.pipe()
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # another user: 1,100 connections, held until the owner has looked
        try:
            os.close(opened_r)
            os.close(done_w)
            resource.setrlimit(resource.RLIMIT_NOFILE, (4096, max(4096, resource.getrlimit(resource.RLIMIT_NOFILE)[1])))
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            flood = _open(port, 1100)
            closed = _closed_within(flood, 5.0)
            os.write(opened_w, f"{len(flood)} {closed}\n".encode())
            os.read(done_r, 1)
        except BaseException as exc:  # noqa: BLE001 - said to the test, which fails on it
            os.write(opened_w, f"crashed {exc!r}\n".encode())
        finally:
            os._exit(0)
    os.close(opened_w)
    os.close(done_r)
    try:
        with os.fdopen(opened_r) as report:
            line = report.readline()
        assert not line.startswith("crashed"), line
        opened, closed = map(int, line.split())
        failures = _owner_is_served(daemon, port, token)
    finally:
        try:
            os.write(done_w, b"x")
        except BrokenPipeError:
            pass  # it ended already
        os.close(done_w)
        os.waitpid(pid, 0)
    assert opened == 1100, f"only {opened} of 1,100 connections were made"
    assert closed == opened, f"{opened - closed} of another user's connections were kept open"
    assert failures == [], failures
    told = re.compile(rf"closed connections unserved: (\d+) from another user of this machine \(uid {NOBODY}\)")
    wait_for(lambda: sum(int(n) for n in told.findall(daemon.stderr())) == opened, 15,
             message="the log lines naming the refused connections")
    assert _http(daemon)["closed"]["otherUser"] == opened
    record(f"uid {NOBODY} opened {opened} TCP connections to the HTTP port under a {SOFT}-descriptor limit: each closed "
           f"as accepted (sock_diag names the owner) and logged; the owner's socket client, CLI and HTTP client "
           f"served throughout")


def test_connections_without_the_token_are_bounded_and_time_out(env: Env, make_daemon, low_limit, record) -> None:  # type: ignore[no-untyped-def]
    daemon: Daemon = make_daemon({"ATOMICTOOLS_HTTP": "127.0.0.1:0"})
    port, token = _port_and_token(daemon)
    low_limit(daemon.pid)
    started = time.monotonic()
    flood = _open(port, 300)  # the owner's own uid, no token: the kernel cannot tell them apart
    try:
        failures = _owner_is_served(daemon, port, token)
        held = _http(daemon)["connections"]
        closed = _closed_within(flood, 12.0)
        took = time.monotonic() - started
    finally:
        for sock in flood:
            sock.close()
    assert len(flood) == 300
    assert failures == [], failures
    assert held <= 32, f"{held} connections without a request held open"
    assert closed == len(flood), f"{len(flood) - closed} connections that sent nothing were never closed"
    assert took < 12.0
    counts = wait_for(lambda: (c := _http(daemon)["closed"]) and c["waitedTooLong"] + c["noRoom"] >= 1 and c, 10)
    wait_for(lambda: "HTTP: closed connections unserved" in daemon.stderr(), 15, message="the log line")
    record(f"{len(flood)} connections without a request under a {SOFT}-descriptor limit: at most {held} held at once, "
           f"every one closed within {took:.1f} s ({counts}); socket, CLI and HTTP with the token served")


def test_a_request_answered_before_the_token_lets_no_connection_in(env: Env, make_daemon, low_limit, record) -> None:  # type: ignore[no-untyped-def]
    """Each connection sends, without the token, a request for a path the daemon does not serve (it
    is answered 404 before the token is looked at), then keeps the connection: it is still a
    connection without the token, bounded and closed within seconds."""
    daemon: Daemon = make_daemon({"ATOMICTOOLS_HTTP": "127.0.0.1:0"})
    port, token = _port_and_token(daemon)
    low_limit(daemon.pid)
    started = time.monotonic()
    flood = _open(port, 300)
    answered = 0
    for sock in flood:
        try:
            sock.sendall(f"GET /.well-known/oauth-protected-resource HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
            answered += sock.recv(4096).startswith(b"HTTP/1.1 404")
        except OSError:
            pass  # closed for room already: what the bound does
    try:
        failures = _owner_is_served(daemon, port, token)
        closed = _closed_within(flood, 12.0)
        took = time.monotonic() - started
    finally:
        for sock in flood:
            sock.close()
    assert answered >= 1
    assert failures == [], failures
    assert closed == len(flood), f"{len(flood) - closed} connections answered 404 without the token were kept open"
    record(f"{len(flood)} connections each answered 404 for a path without the token ({answered} read it), then "
           f"kept: every one closed within {took:.1f} s; socket, CLI and HTTP with the token served")


SLOW = '''
import time

def slow(seconds: float) -> str:
    time.sleep(seconds)
    return "done"
'''


def test_abandoned_http_sessions_never_lock_out_the_socket(env: Env, make_daemon, record) -> None:  # type: ignore[no-untyped-def]
    env.write_tool(env.global_tools, "slow.py", SLOW)
    daemon: Daemon = make_daemon({"ATOMICTOOLS_HTTP": "127.0.0.1:0", "ATOMICTOOLS_MAX_CONNECTIONS": "50"})
    port, token = _port_and_token(daemon)

    def initialize() -> str:
        status, headers, body = _post(port, token, INITIALIZE)
        assert status == 200, (status, body)
        session = headers["mcp-session-id"]
        status, _, _ = _post(port, token, {"jsonrpc": "2.0", "method": "notifications/initialized"}, session)
        assert status == 202
        return session

    busy = initialize()
    answer: list[Any] = []
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "slow", "arguments": {"seconds": 8}}}
    caller = threading.Thread(target=lambda: answer.append(_post(port, token, call, busy, timeout=60)))
    caller.start()
    wait_for(lambda: any(s.get("inflight") for s in _sessions(daemon)), 10, message="the busy session's call")
    sessions = [initialize() for _ in range(753)]  # and never DELETE one
    with RawConnection(env.socket, timeout=5) as raw:  # the socket still takes its clients
        assert "result" in raw.request("ping")
    with daemon.client() as client:
        assert client.call("slow", seconds=0).text == "done"
    info = _http(daemon)
    status, _, _ = _post(port, token, {"jsonrpc": "2.0", "id": 3, "method": "ping"}, sessions[0])
    assert status == 404, "the oldest idle session gave way"
    status, _, _ = _post(port, token, {"jsonrpc": "2.0", "id": 3, "method": "ping"}, sessions[-1])
    assert status == 200, "the newest is served"
    caller.join(60)
    status, _, body = answer[0]
    assert status == 200 and json.loads(body)["result"]["content"][0]["text"] == "done", "a busy session never gives way"
    assert info["sessions"] <= 256 and info["sessionsEnded"] >= 753 + 1 - 256
    record(f"754 HTTP sessions left open by a client with the token under max_connections 50: at most "
           f"{info['sessions']} kept, {info['sessionsEnded']} idle ones ended oldest first (404, initialize again), "
           f"one with a call in flight kept; the socket's clients served throughout")


def test_rest_sessions_left_behind_are_bounded_with_the_others(env: Env, make_daemon, record) -> None:  # type: ignore[no-untyped-def]
    """The tools REST API keeps a session for each query string it is asked with: a client with
    the token asking with 600 different ones leaves them behind, bounded as MCP's are."""
    daemon: Daemon = make_daemon({"ATOMICTOOLS_HTTP": "127.0.0.1:0", "ATOMICTOOLS_MAX_CONNECTIONS": "50"})
    port, token = _port_and_token(daemon)
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        for i in range(600):
            connection.request("GET", f"/api/tools?n={i}", headers={"Authorization": f"Bearer {token}"})
            response = connection.getresponse()
            response.read()
            assert response.status == 200, (i, response.status)
    finally:
        connection.close()
    with RawConnection(env.socket, timeout=5) as raw:
        assert "result" in raw.request("ping")
    held = len(_sessions(daemon))
    info = _http(daemon)
    assert held <= 256 + 8, f"{held} sessions held after 600 REST queries"
    record(f"600 REST queries, each with a query string of its own, left behind by a client with the token under "
           f"max_connections 50: {held} sessions kept ({info['sessionsEnded']} idle ones ended); the socket served")


def test_sessions_opened_at_the_same_moment_stay_within_the_bound(env: Env, make_daemon, record) -> None:  # type: ignore[no-untyped-def]
    """Sessions that attach to a project at the same moment are counted while they attach: a burst
    of new REST queries arriving at a nearly full table keeps the HTTP sessions within their bound."""
    daemon: Daemon = make_daemon({"ATOMICTOOLS_HTTP": "127.0.0.1:0", "ATOMICTOOLS_MAX_CONNECTIONS": "200"})
    port, token = _port_and_token(daemon)
    headers = {"Authorization": f"Bearer {token}"}

    def ask(query: str, directory: Path = env.project) -> int:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            connection.request("GET", f"/api/tools?directory={directory}&{query}", headers=headers)
            response = connection.getresponse()
            response.read()
            return response.status
        finally:
            connection.close()

    for i in range(240):
        assert ask(f"n={i}") == 200
    burst = 60
    # Each to a project of its own, opened for the first time: its session attaches while the others do.
    projects = [env.root / f"burst-{i}" for i in range(burst)]
    for project_dir in projects:
        project_dir.mkdir()
    statuses: list[int] = []
    gate = threading.Barrier(burst)
    threads = [threading.Thread(target=lambda i=i: (gate.wait(), statuses.append(ask(f"burst={i}", projects[i]))))
               for i in range(burst)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(statuses) == burst and set(statuses) <= {200, 400}, statuses
    held = [s for s in _sessions(daemon) if s.get("agent") == "http"]
    assert len(held) <= 256, f"{len(held)} HTTP sessions held after a burst of {burst} at 240"
    record(f"a burst of {burst} new REST queries at once on top of 240 sessions: {len(held)} HTTP sessions held "
           f"({statuses.count(200)} answered, {statuses.count(400)} told to try again)")


def _sessions(daemon: Daemon) -> list[dict[str, Any]]:
    with daemon.raw() as raw:
        return raw.request("atomic/status")["result"]["sessions"]


NOISY = '''
    import time
    from atomictools import Context, tool

    @tool(timeout=60)
    def noisy(ctx: Context) -> str:
        end = time.monotonic() + 5
        n = 0
        while time.monotonic() < end:
            n += 1
            ctx.progress(n, None, "p" * 65536)
            ctx.log("info", "l" * 65536)
        return f"sent {n}"
'''


def _peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def test_progress_and_logs_for_an_http_client_that_reads_nothing_are_dropped(env: Env, make_daemon, record) -> None:  # type: ignore[no-untyped-def]
    """A tool sends 64 KiB progress and log notifications as fast as it can for 5 s, on the SSE stream
    of an HTTP call whose client reads nothing: they are dropped (as on the socket), the daemon does
    not grow, and the answer still comes."""
    env.write_tool(env.global_tools, "noisy.py", NOISY)
    daemon: Daemon = make_daemon({"ATOMICTOOLS_HTTP": "127.0.0.1:0"})
    port, token = _port_and_token(daemon)
    status, headers, _ = _post(port, token, INITIALIZE)
    session = headers["mcp-session-id"]
    _post(port, token, {"jsonrpc": "2.0", "method": "notifications/initialized"}, session)
    _post(port, token, {"jsonrpc": "2.0", "id": 2, "method": "logging/setLevel", "params": {"level": "debug"}}, session)
    baseline = _peak_rss(daemon.pid)
    body = json.dumps({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                       "params": {"name": "noisy", "arguments": {}, "_meta": {"progressToken": 1}}}).encode()
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Accept: application/json, text/event-stream\r\n"
                     + f"Authorization: Bearer {token}\r\nMcp-Session-Id: {session}\r\n"
                       f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        time.sleep(6)  # the tool sends for 5 s; the client reads nothing meanwhile
        grown = (_peak_rss(daemon.pid) - baseline) / 2**20
        assert grown < 32, f"the daemon's peak RSS grew by {grown:.0f} MiB"
        sock.settimeout(30)
        stream = b""
        while b'"id":7,"result"' not in stream:
            chunk = sock.recv(1 << 20)
            assert chunk, f"the stream ended without the answer: {stream[-300:]!r}"
            stream += chunk
    sent = re.search(rb'"text":"sent (\d+)"', stream)
    assert sent, stream[-300:]
    relayed = stream.count(b'"notifications/progress"') + stream.count(b'"notifications/message"')
    record(f"a tool sent {int(sent.group(1)) * 2:,} progress and log notifications of 64 KiB in 5 s to an HTTP client "
           f"reading nothing: {relayed} relayed, the rest dropped; the daemon grew {grown:.1f} MiB; the answer came")


_MANY = b"[" + b",".join([b"[]"] * 2_000_000) + b"]"
HTTP_ELEMENTS = {
    "jsonrpc": ("/mcp", b'{"jsonrpc":' + _MANY + b',"id":1,"method":"ping"}'),
    "name and _meta": ("/mcp", b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":' + _MANY + b','
                       b'"arguments":{},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","x":' + _MANY + b'}}}'),
}


@pytest.mark.parametrize("where", list(HTTP_ELEMENTS))
def test_millions_of_elements_in_a_field_only_looked_at_stall_no_one(env: Env, make_daemon, where: str) -> None:  # type: ignore[no-untyped-def]
    """Over HTTP, a request's ``jsonrpc``, its params' ``name`` and ``_meta`` are only looked at:
    decoded whole, millions of elements there held the event loop about two seconds a request."""
    daemon: Daemon = make_daemon({"ATOMICTOOLS_HTTP": "127.0.0.1:0"})
    port, token = _port_and_token(daemon)
    path, body = HTTP_ELEMENTS[where]

    def post(body: bytes) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            connection.request("POST", path, body=body, headers={
                "Content-Type": "application/json", "Accept": "application/json, text/event-stream",
                "Authorization": f"Bearer {token}", "Mcp-Method": "tools/call", "Mcp-Name": "echo",
                "MCP-Protocol-Version": "2026-07-28"})
            response = connection.getresponse()
            answer = json.loads(response.read())  # whatever it says: one answer
            assert response.status in (200, 400) and {"result", "error", "content"} & set(answer), (response.status, answer)
        finally:
            connection.close()

    post(body.replace(_MANY, b"[]"))  # the session's tools loaded before the watch
    with pinging(env.socket) as pings:
        for _ in range(3):
            post(body)
    waited = sum(max(0.0, took - 0.1) for took in pings)
    # What a loaded machine's scheduling adds (one ping late by a second) stays below.
    assert waited < 1.0, f"pings waited {waited:.2f} s in all (the slowest {max(pings):.2f} s) while such requests came"


def test_a_urls_allow_and_deny_lists_are_bounded_as_an_attachs(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    from atomictoolsd.sessions.messages import MOST_GLOBS

    daemon: Daemon = make_daemon({"ATOMICTOOLS_HTTP": "127.0.0.1:0"})
    port, token = _port_and_token(daemon)
    globs = ",".join(["echo*"] * (MOST_GLOBS + 1))
    for query in (f"allow={globs}", f"directory={env.project}&deny={globs}"):
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            connection.request("POST", f"/mcp?{query}", body=json.dumps(INITIALIZE).encode(), headers={
                "Content-Type": "application/json", "Accept": "application/json, text/event-stream",
                "Authorization": f"Bearer {token}"})
            response = connection.getresponse()
            answer = json.loads(response.read())
        finally:
            connection.close()
        assert response.status == 400 and f"at most {MOST_GLOBS} globs" in answer["error"]["message"], (response.status, answer)
