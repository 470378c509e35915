"""The Streamable HTTP endpoint: the official client over it, every security rule, the project in the URL.

A real daemon serves HTTP on a free loopback port (``ATOMICTOOLS_HTTP=127.0.0.1:0``); its URL and
token come from ``atomic/status`` and the token file, as a user's would.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import pytest

from helpers import Env, serving, wait_for

pytestmark = pytest.mark.slow

WRITER = '''
from pathlib import Path

def touch(name: str) -> str:
    """Write a marker file in the project, so a test can tell whether this ran."""
    Path(__file__).resolve().parents[2].joinpath(name).write_text("ran")
    return "touched " + name
'''

SLOW = '''
import asyncio
from pathlib import Path

from atomictools import Context

async def slow(seconds: float, marker: str, ctx: Context) -> str:
    """Report progress, sleep, then write a marker (unless cancelled first)."""
    ctx.progress(1, 2, "half way")
    await asyncio.sleep(seconds)
    Path(__file__).resolve().parents[2].joinpath(marker).write_text("ran")
    return "slept"
'''

ECHO = '''
def echo(text: str) -> str:
    """Say it back."""
    return text
'''


class Http:
    """The daemon's endpoint, spoken to with the standard library's HTTP client."""

    def __init__(self, url: str, token: str) -> None:
        self.url = url
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "", parts.port or 80
        self.token = token

    def request(self, method: str, body: Any = None, *, headers: dict[str, str] | None = None, path: str = "/mcp",
                token: str | None = "default", raw: bytes | None = None) -> tuple[int, dict[str, str], bytes]:
        connection = http.client.HTTPConnection(self.host, self.port, timeout=30)
        sent = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
        if token is not None:
            sent["Authorization"] = f"Bearer {self.token if token == 'default' else token}"
        sent.update(headers or {})
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        connection.request(method, path, body=data, headers=sent)
        response = connection.getresponse()
        payload = response.read()
        found = {k.lower(): v for k, v in response.getheaders()}
        connection.close()
        return response.status, found, payload

    def initialize(self, path: str = "/mcp") -> str:
        status, headers, _ = self.request("POST", _initialize(), path=path)
        assert status == 200, status
        session = headers["mcp-session-id"]
        self.request("POST", {"jsonrpc": "2.0", "method": "notifications/initialized"}, path=path,
                     headers={"Mcp-Session-Id": session})
        return session

    def rpc(self, method: str, params: dict[str, Any] | None = None, *, session: str | None = None,
            path: str = "/mcp") -> dict[str, Any]:
        headers = {"Mcp-Session-Id": session} if session else {}
        status, found, payload = self.request("POST", {"jsonrpc": "2.0", "id": 7, "method": method, "params": params or {}},
                                              headers=headers, path=path)
        assert status == 200, (status, payload)
        return _messages(found, payload)[-1]


def _initialize(version: str = "2025-11-25") -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}}


def _messages(headers: dict[str, str], payload: bytes) -> list[dict[str, Any]]:
    if headers.get("content-type", "").startswith("text/event-stream"):
        return [json.loads(line[6:]) for line in payload.decode().splitlines() if line.startswith("data: ")]
    return [json.loads(payload)]


HTTP = {"ATOMICTOOLS_HTTP": "127.0.0.1:0"}


def _write_tools(env: Env) -> None:
    env.write_tool(env.local_tools, "touch.py", WRITER)
    env.write_tool(env.local_tools, "slow.py", SLOW)
    env.write_tool(env.local_tools, "echo.py", ECHO)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Http]]:
    """One daemon serving HTTP for the module's tests that call its tools (each with a marker name
    of its own) and read the answers."""
    env = Env(tmp_path_factory.mktemp("http"))
    _write_tools(env)
    with serving(env, HTTP) as daemon:
        yield _endpoint(daemon)


@pytest.fixture
def own_served(env: Env, make_daemon: Any) -> tuple[Any, Http]:
    """An HTTP daemon of the test's own, for a test that adds a tool, rotates the token or changes
    the revision of the project URL's stateless session."""
    _write_tools(env)
    return _endpoint(make_daemon(HTTP))


def _endpoint(daemon: Any) -> tuple[Any, Http]:
    with daemon.raw() as raw:
        status = raw.request("atomic/status")["result"]
    info = status["http"]
    assert info["url"], info
    token_file = Path(info["tokenFile"])
    mode = stat.S_IMODE(token_file.stat().st_mode)
    assert mode == 0o600, oct(mode)
    return daemon, Http(info["url"], token_file.read_text().strip())


def _project_path(env: Env) -> str:
    return "/mcp?directory=" + quote(str(env.project), safe="/")


def _touch_after(endpoint: Http, env: Env, name: str) -> None:
    """Call touch after a refused call of it: once this one is done, the refused one would have run too."""
    session = endpoint.initialize(_project_path(env))
    reply = endpoint.rpc("tools/call", {"name": "touch", "arguments": {"name": name}}, session=session,
                         path=_project_path(env))
    assert reply["result"]["content"][0]["text"] == f"touched {name}", reply


def test_http_is_off_by_default_and_its_server_is_not_imported(daemon: Any) -> None:
    with daemon.raw() as raw:
        status = raw.request("atomic/status")["result"]
    assert "http" not in status
    maps = Path(f"/proc/{daemon.pid}/maps").read_text()
    assert "httptools" not in maps and "uvicorn" not in maps


def test_the_official_client_lists_calls_sees_progress_and_list_changes(env: Env, own_served: tuple[Any, Http]) -> None:
    import httpx2
    from mcp import ClientSession, types
    from mcp.client.streamable_http import streamable_http_client

    _, endpoint = own_served
    changed = asyncio.Event()
    progress: list[float] = []

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ServerNotification) and isinstance(message, types.ToolListChangedNotification):
            changed.set()
        elif getattr(message, "method", "") == "notifications/tools/list_changed":
            changed.set()

    async def main() -> None:
        url = f"http://{endpoint.host}:{endpoint.port}{_project_path(env)}"
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {endpoint.token}"}, timeout=30) as client:
            async with streamable_http_client(url, http_client=client) as (read, write):
                async with ClientSession(read, write, message_handler=on_message) as session:
                    await session.initialize()
                    names = sorted(t.name for t in (await session.list_tools()).tools)
                    assert names == ["echo", "slow", "touch"], names

                    async def on_progress(value: float, total: float | None, message: str | None) -> None:
                        progress.append(value)

                    result = await session.call_tool("slow", {"seconds": 0.05, "marker": "m1"}, progress_callback=on_progress)
                    assert not result.is_error and result.content[0].text == "slept"
                    assert progress == [1]
                    await asyncio.sleep(0.3)  # the GET stream opens after initialize
                    env.write_tool(env.local_tools, "later.py", 'def later() -> str:\n    """New."""\n    return "x"\n')
                    await asyncio.wait_for(changed.wait(), 15)
                    names = sorted(t.name for t in (await session.list_tools()).tools)
                    assert "later" in names

    asyncio.run(main())


def test_every_request_needs_the_token_and_a_refused_one_runs_nothing(served: tuple[Any, Http]) -> None:
    daemon, endpoint = served
    env = daemon.env
    session = endpoint.initialize(_project_path(env))
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "touch", "arguments": {"name": "marker"}}}
    for token in (None, "wrong-token-" + "x" * 40, ""):
        status, headers, body = endpoint.request("POST", call, token=token, headers={"Mcp-Session-Id": session},
                                                 path=_project_path(env))
        assert status == 401, (token, status)
        assert headers["www-authenticate"].startswith("Bearer")
        assert "token" in json.loads(body)["error"]["message"]
    status, _, _ = endpoint.request("GET", token=None, headers={"Accept": "text/event-stream", "Mcp-Session-Id": session})
    assert status == 401
    status, _, _ = endpoint.request("DELETE", token=None, headers={"Mcp-Session-Id": session})
    assert status == 401
    _touch_after(endpoint, env, "after-refused")
    assert not (env.project / "marker").exists()
    reply = endpoint.rpc("tools/call", call["params"], session=session, path=_project_path(env))
    assert reply["result"]["content"][0]["text"] == "touched marker"
    assert (env.project / "marker").read_text() == "ran"


@pytest.mark.parametrize("headers", [
    {"Host": "evil.example:80"},
    {"Host": "attacker.test"},
    {"Origin": "http://evil.example"},
    {"Origin": "http://localhost:1"},
    {"Origin": "null"},
], ids=["host", "host-no-port", "origin", "origin-other-port", "origin-null"])
def test_a_foreign_host_or_origin_is_forbidden_before_anything_runs(served: tuple[Any, Http], headers: dict[str, str]) -> None:
    daemon, endpoint = served
    env = daemon.env
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "touch", "arguments": {"name": "rebound"}}}
    status, _, body = endpoint.request("POST", call, headers=headers, path=_project_path(env))
    assert status == 403, status
    assert "Forbidden" in json.loads(body)["error"]["message"]
    status, _, _ = endpoint.request("POST", _initialize(), headers=headers)
    assert status == 403
    _touch_after(endpoint, env, "after-forbidden")
    assert not (env.project / "rebound").exists()
    # The names of this server pass, with the port it listens on.
    for name in ("localhost", "127.0.0.1"):
        status, _, _ = endpoint.request("POST", _initialize(), headers={"Host": f"{name}:{endpoint.port}", "Origin": f"http://{name}:{endpoint.port}"})
        assert status == 200


def test_bad_requests_get_clear_errors(served: tuple[Any, Http]) -> None:
    daemon, endpoint = served
    status, _, body = endpoint.request("POST", raw=b'{"jsonrpc": "2.0", "id": 1, "method": ')
    assert status == 400 and json.loads(body)["error"]["code"] == -32700
    status, _, body = endpoint.request("POST", raw=b'{"jsonrpc": "2.0", "id": 1, "method": "\xff"}')  # not UTF-8
    assert status == 400 and json.loads(body)["error"]["code"] == -32700
    # Not UTF-8 in what the envelope keeps raw (the id, a tool's arguments): refused, never echoed back.
    for raw in (b'{"jsonrpc": "2.0", "id": "\xff", "method": "ping"}',
                b'{"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "echo", "arguments": {"text": "\xff"}}}'):
        status, _, body = endpoint.request("POST", raw=raw)
        assert status == 400 and json.loads(body)["error"]["code"] == -32700, body
    status, _, body = endpoint.request("POST", [_initialize()])
    assert status == 400 and "Batches" in json.loads(body)["error"]["message"]
    status, _, body = endpoint.request("POST", raw=b"x" * (17 * 1024 * 1024))
    assert status == 413 and "too large" in json.loads(body)["error"]["message"]
    status, _, _ = endpoint.request("POST", _initialize(), headers={"Content-Type": "text/plain"})
    assert status == 415
    status, _, body = endpoint.request("POST", {"jsonrpc": "2.0", "id": 3, "method": "tools/list"}, headers={"Mcp-Session-Id": "no-such"})
    assert status == 404 and "initialize again" in json.loads(body)["error"]["message"]
    status, _, _ = endpoint.request("GET", path="/elsewhere")
    assert status == 404
    status, headers, _ = endpoint.request("PUT", {})
    assert status == 405 and "POST" in headers["allow"]
    session = endpoint.initialize()
    status, _, _ = endpoint.request("GET", headers={"Accept": "application/json", "Mcp-Session-Id": session})
    assert status == 406
    status, _, body = endpoint.request("POST", {"jsonrpc": "2.0", "id": 4, "method": "tools/list"},
                                       headers={"Mcp-Session-Id": session, "MCP-Protocol-Version": "1999-01-01"})
    assert status == 400 and "MCP-Protocol-Version" in json.loads(body)["error"]["message"]
    status, _, body = endpoint.request("POST", {"jsonrpc": "2.0", "id": 5, "method": "tools/list"},
                                       headers={"Mcp-Session-Id": session, "Mcp-Method": "tools/call"})
    assert status == 400 and "Mcp-Method" in json.loads(body)["error"]["message"]
    status, _, body = endpoint.request("POST", {"jsonrpc": "2.0", "id": 6, "method": "tools/call", "params": {"name": "echo"}},
                                       headers={"Mcp-Session-Id": session, "Mcp-Name": "touch"})
    assert status == 400 and "Mcp-Name" in json.loads(body)["error"]["message"]
    status, _, body = endpoint.request("POST", {"jsonrpc": "2.0", "id": 8, "method": "no/such"}, headers={"Mcp-Session-Id": session})
    assert status == 200 and json.loads(body)["error"]["code"] == -32601
    # DELETE ends the session; its id is then unknown.
    status, _, _ = endpoint.request("DELETE", headers={"Mcp-Session-Id": session})
    assert status == 200
    status, _, _ = endpoint.request("POST", {"jsonrpc": "2.0", "id": 9, "method": "tools/list"}, headers={"Mcp-Session-Id": session})
    assert status == 404
    assert daemon.proc.poll() is None


def test_the_url_picks_the_project_and_the_lists_and_locks_the_session(served: tuple[Any, Http]) -> None:
    daemon, endpoint = served
    env = daemon.env
    session = endpoint.initialize()
    names = [t["name"] for t in endpoint.rpc("tools/list", session=session)["result"]["tools"]]
    assert names == []  # no directory: the global and built-in tools (none in this test's home)
    path = _project_path(env) + "&deny=touch"
    session = endpoint.initialize(path)
    names = [t["name"] for t in endpoint.rpc("tools/list", session=session, path=path)["result"]["tools"]]
    assert names == ["echo", "slow"]
    reply = endpoint.rpc("tools/call", {"name": "touch", "arguments": {"name": "denied"}}, session=session, path=path)
    assert "error" in reply or reply["result"].get("isError")
    assert not (env.project / "denied").exists()
    path = _project_path(env) + "&allow=e*&dispatcher=1"
    session = endpoint.initialize(path)
    names = [t["name"] for t in endpoint.rpc("tools/list", session=session, path=path)["result"]["tools"]]
    assert "echo" in names and "slow" not in names and any(n.startswith("atomic") or n.startswith("tool") for n in names if n != "echo")
    # Locked like the shim's session: it cannot move to another project nor stop the daemon.
    for method in ("atomic/attach", "atomic/shutdown"):
        reply = endpoint.rpc(method, {"directory": "/"}, session=session, path=path)
        assert reply["error"]["code"] == -32600 and "locked" in reply["error"]["message"]
    status, _, body = endpoint.request("POST", _initialize(), path="/mcp?directory=/no/such/dir")
    assert status == 400 and "directory" in json.loads(body)["error"]["message"]
    # Without a session id: a stateless request, served for the URL's project.
    names = [t["name"] for t in endpoint.rpc("tools/list", path=_project_path(env))["result"]["tools"]]
    assert names == ["echo", "slow", "touch"]


@pytest.mark.parametrize("how", ["json", "sse", "stateless", "delete"])
def test_a_client_that_disconnects_mid_call_cancels_it(served: tuple[Any, Http], how: str) -> None:
    """Every way an HTTP client goes cancels its call: it closes the connection of the POST (answered
    as JSON, as an SSE stream, or a stateless request), or it ends its session with DELETE."""
    daemon, endpoint = served
    env = daemon.env
    session = endpoint.initialize(_project_path(env))
    marker = f"late-{how}"
    params: dict[str, Any] = {"name": "slow", "arguments": {"seconds": 2.0, "marker": marker}}
    if how == "sse":
        params["_meta"] = {"progressToken": "p1"}  # its progress opens an SSE stream before the answer
    body = json.dumps({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": params}).encode()
    in_session = "" if how == "stateless" else f"Mcp-Session-Id: {session}\r\n"
    sock = socket.create_connection((endpoint.host, endpoint.port))
    sock.sendall(
        f"POST {_project_path(env)} HTTP/1.1\r\nHost: 127.0.0.1:{endpoint.port}\r\nAuthorization: Bearer {endpoint.token}\r\n"
        f"Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n{in_session}"
        f"Content-Length: {len(body)}\r\n\r\n".encode() + body
    )
    if how == "sse":
        head = sock.recv(4096)
        assert head.startswith(b"HTTP/1.1 200") and b"text/event-stream" in head, head
    else:
        time.sleep(0.5)  # the call has started; nothing has been answered yet
    if how == "delete":  # the POST's connection stays open until the check below is answered
        status, _, _ = endpoint.request("DELETE", headers={"Mcp-Session-Id": session}, path=_project_path(env))
        assert status == 200
        session = endpoint.initialize(_project_path(env))
    else:
        sock.close()
    # A call made after it, as long: once it is answered, the first would have written its marker.
    reply = endpoint.rpc("tools/call", {"name": "slow", "arguments": {"seconds": 2.0, "marker": f"done-{how}"}}, session=session,
                         path=_project_path(env))
    sock.close()
    assert reply["result"]["content"][0]["text"] == "slept"
    assert not (env.project / marker).exists()


@pytest.mark.parametrize("accept", ["Text/Event-Stream", "*/*", "text/*", None], ids=["mixed-case", "any", "any-text", "absent"])
def test_a_get_whose_accept_takes_sse_in_any_form_opens_the_stream(served: tuple[Any, Http], accept: str | None) -> None:
    """Media types are case-insensitive, ``*/*`` takes an SSE stream (curl's default), so does
    ``text/*``, and no Accept takes anything, as for a POST: each opens the session's stream rather
    than a 406."""
    daemon, endpoint = served
    session = endpoint.initialize(_project_path(daemon.env))
    sent = "" if accept is None else f"Accept: {accept}\r\n"
    with socket.create_connection((endpoint.host, endpoint.port), timeout=10) as sock:
        sock.sendall(f"GET {_project_path(daemon.env)} HTTP/1.1\r\nHost: 127.0.0.1:{endpoint.port}\r\n"
                     f"Authorization: Bearer {endpoint.token}\r\n{sent}Mcp-Session-Id: {session}\r\n\r\n".encode())
        head = sock.recv(4096)
    assert head.startswith(b"HTTP/1.1 200") and b"text/event-stream" in head, head


def test_the_token_rotates_and_the_old_one_stops_working(env: Env, own_served: tuple[Any, Http]) -> None:
    _, endpoint = own_served
    cli = [sys.executable, "-m", "atomictoolsd", "http", "token"]
    environ = {**env.vars}
    out = subprocess.run([*cli, "--rotate"], env=environ, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    status, _, _ = endpoint.request("POST", _initialize())
    assert status == 401
    shown = subprocess.run([*cli, "--show"], env=environ, capture_output=True, text=True, timeout=30).stdout.strip()
    assert len(shown) >= 32 and shown != endpoint.token
    status, _, _ = endpoint.request("POST", _initialize(), token=shown)
    assert status == 200


def test_start_http_option_and_status(env: Env) -> None:
    environ = {**env.vars}
    cli = [sys.executable, "-m", "atomictoolsd"]
    out = subprocess.run([*cli, "start", "--http", "nonsense:port"], env=environ, capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "--http" in out.stderr
    out = subprocess.run([*cli, "start", "--http", "127.0.0.1:0"], env=environ, capture_output=True, text=True, timeout=60)
    try:
        assert out.returncode == 0, out.stderr
        assert "MCP over HTTP at http://127.0.0.1:" in out.stdout
        status = subprocess.run([*cli, "status"], env=environ, capture_output=True, text=True, timeout=30).stdout
        assert "http      http://127.0.0.1:" in status
    finally:
        subprocess.run([*cli, "stop"], env=environ, capture_output=True, timeout=60)


def test_a_daemon_started_with_http_keeps_it_across_reload_and_restart(env: Env) -> None:
    """``--http`` is the daemon's command line: SIGHUP rereads the file, not undoes it; ``restart``
    brings it back at the same address, and takes ``--http`` itself as ``start`` does."""
    cli = [sys.executable, "-m", "atomictoolsd"]

    def say(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*cli, *args], env=env.vars, capture_output=True, text=True, timeout=60)

    def served() -> tuple[int, str, dict[str, Any]]:
        status = json.loads(say("status", "--json").stdout)
        return status["pid"], status["http"]["url"], status

    started = say("start", "--http", "127.0.0.1:0")
    try:
        assert started.returncode == 0, started.stderr
        pid, url, _ = served()
        assert url and url.startswith("http://127.0.0.1:")
        os.kill(pid, signal.SIGHUP)
        wait_for(lambda: served()[2].get("reload"), message="the SIGHUP reload")
        pid_after, url_after, status = served()
        assert (pid_after, url_after) == (pid, url)
        assert not status["reload"]["waiting"], status["reload"]
        assert "waits for a restart" not in say("status").stdout

        restarted = say("restart")
        assert restarted.returncode == 0, restarted.stderr
        new_pid, new_url, _ = served()
        assert new_pid != pid and new_url == url, (url, new_url)

        again = say("restart", "--http", "127.0.0.1:0")
        assert again.returncode == 0, again.stderr
        assert served()[1].startswith("http://127.0.0.1:")
    finally:
        say("stop")


def test_a_daemon_started_with_the_http_variable_keeps_it_across_restart(env: Env) -> None:
    """``ATOMICTOOLS_HTTP=… atomictoolsd start`` sets the variable for that command only: ``restart``
    from a shell without it brings HTTP back at the same address; a shell that sets the variable
    restarts the daemon with its value."""
    cli = [sys.executable, "-m", "atomictoolsd"]

    def say(*args: str, http: str | None = None) -> subprocess.CompletedProcess[str]:
        environ = {**env.vars, "ATOMICTOOLS_HTTP": http} if http else env.vars
        return subprocess.run([*cli, *args], env=environ, capture_output=True, text=True, timeout=60)

    def url() -> str | None:
        return (json.loads(say("status", "--json").stdout).get("http") or {}).get("url")

    started = say("start", http="127.0.0.1:0")
    try:
        assert started.returncode == 0, started.stderr
        assert (url() or "").startswith("http://127.0.0.1:")
        port = _free_port()
        moved = say("restart", http=f"127.0.0.1:{port}")  # this shell's own value
        assert moved.returncode == 0, moved.stderr
        assert url() == f"http://127.0.0.1:{port}/mcp"
        restarted = say("restart")  # a shell without the variable
        assert restarted.returncode == 0, restarted.stderr
        assert url() == f"http://127.0.0.1:{port}/mcp"
    finally:
        say("stop")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class _Wire:
    """One raw HTTP/1.1 connection to the endpoint: exact bytes out, responses read one by one."""

    def __init__(self, endpoint: Http, target: str = "/mcp") -> None:
        self.endpoint = endpoint
        self.target = target
        self.sock = socket.create_connection((endpoint.host, endpoint.port), timeout=10)
        self.file = self.sock.makefile("rb")

    def head(self, method: str = "POST", extra: str = "", first: str = "") -> bytes:
        auth = f"Authorization: Bearer {self.endpoint.token}\r\n"
        return (f"{method} {self.target} HTTP/1.1\r\n{first}Host: 127.0.0.1:{self.endpoint.port}\r\n{auth}"
                f"Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n{extra}").encode()

    def post(self, body: dict[str, Any], extra: str = "") -> bytes:
        data = json.dumps(body).encode()
        return self.head(extra=extra + f"Content-Length: {len(data)}\r\n") + b"\r\n" + data

    def response(self, to_head: bool = False) -> tuple[int, dict[str, str], bytes]:
        status = self.file.readline()
        assert status.startswith(b"HTTP/1.1 "), status
        headers: dict[str, str] = {}
        while (line := self.file.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            headers[name.strip().lower()] = value.strip()
        if to_head:
            body = b""
        elif headers.get("transfer-encoding") == "chunked":
            body = b""
            while size := int(self.file.readline().strip(), 16):
                body += self.file.read(size + 2)[:size]
            self.file.readline()
        else:
            body = self.file.read(int(headers.get("content-length", "0")))
        return int(status.split()[1]), headers, body

    def closed(self) -> bool:
        return self.file.read(1) == b""

    def close(self) -> None:
        self.file.close()
        self.sock.close()


def test_http11_on_one_connection_keep_alive_pipelining_chunked_bodies_and_100_continue(served: tuple[Any, Http]) -> None:
    daemon, endpoint = served
    env = daemon.env
    wire = _Wire(endpoint, _project_path(env))
    try:
        wire.sock.sendall(wire.post(_initialize()))
        status, headers, _ = wire.response()
        assert status == 200
        session = f"Mcp-Session-Id: {headers['mcp-session-id']}\r\n"
        # Three requests in one write: answered in the order sent, on the same connection.
        calls = [{"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {"name": "echo", "arguments": {"text": f"t{i}"}}}
                 for i in (10, 11, 12)]
        wire.sock.sendall(b"".join(wire.post(c, session) for c in calls))
        answers = [json.loads(wire.response()[2]) for _ in calls]
        assert [(a["id"], a["result"]["content"][0]["text"]) for a in answers] == [(10, "t10"), (11, "t11"), (12, "t12")]
        # A chunked body, split across writes.
        data = json.dumps({"jsonrpc": "2.0", "id": 13, "method": "tools/list"}).encode()
        wire.sock.sendall(wire.head(extra=session + "Transfer-Encoding: chunked\r\n") + b"\r\n")
        time.sleep(0.05)
        wire.sock.sendall(b"%x\r\n%s\r\n" % (5, data[:5]))
        time.sleep(0.05)
        wire.sock.sendall(b"%x\r\n%s\r\n0\r\n\r\n" % (len(data) - 5, data[5:]))
        assert [t["name"] for t in json.loads(wire.response()[2])["result"]["tools"]] == ["echo", "slow", "touch"]
        # Expect: 100-continue: the go-ahead comes before the body is sent.
        data = json.dumps({"jsonrpc": "2.0", "id": 14, "method": "ping"}).encode()
        wire.sock.sendall(wire.head(extra=session + f"Expect: 100-continue\r\nContent-Length: {len(data)}\r\n") + b"\r\n")
        assert wire.file.readline() == b"HTTP/1.1 100 Continue\r\n" and wire.file.readline() == b"\r\n"
        wire.sock.sendall(data)
        assert json.loads(wire.response()[2]) == {"jsonrpc": "2.0", "id": 14, "result": {}}
        # HEAD is not a method of the endpoint: 405, and no body follows the head.
        wire.sock.sendall(wire.head("HEAD") + b"\r\n")
        status, headers, _ = wire.response(to_head=True)
        assert status == 405 and int(headers["content-length"]) > 0
        wire.sock.sendall(wire.post({"jsonrpc": "2.0", "id": 15, "method": "ping"}, session + "Connection: close\r\n"))
        status, headers, _ = wire.response()
        assert status == 200 and headers["connection"] == "close" and wire.closed()
    finally:
        wire.close()


@pytest.mark.parametrize("first", [
    "Host: evil.example\r\n",  # a foreign Host, then the right one
    "Authorization: Bearer x\r\n",  # a wrong token, then the right one
    "X-Padding: " + "a" * 70_000 + "\r\n",  # headers past 64 KiB
], ids=["two-hosts", "two-tokens", "huge-headers"])
def test_a_doubled_security_header_or_oversized_headers_are_refused_and_nothing_runs(
        served: tuple[Any, Http], first: str) -> None:
    daemon, endpoint = served
    env = daemon.env
    wire = _Wire(endpoint, _project_path(env))
    try:
        call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "touch", "arguments": {"name": "doubled"}}}
        data = json.dumps(call).encode()
        wire.sock.sendall(wire.head(first=first, extra=f"Content-Length: {len(data)}\r\n") + b"\r\n" + data)
        status, _, _ = wire.response()
        assert status in (401, 403, 431), status
    finally:
        wire.close()
    _touch_after(endpoint, env, "after-doubled")
    assert not (env.project / "doubled").exists()


def test_a_malformed_request_gets_400_and_the_connection_closes(served: tuple[Any, Http]) -> None:
    _, endpoint = served
    wire = _Wire(endpoint)
    try:
        wire.sock.sendall(wire.head(extra="Content-Length: 3\r\nContent-Length: 4\r\n") + b"\r\nabcd")
        status, _, body = wire.response()
        assert status == 400 and b"Content-Length" in body
        assert wire.closed()
    finally:
        wire.close()


def test_concurrent_requests_with_one_id_are_each_answered_with_it(env: Env, own_served: tuple[Any, Http]) -> None:
    # Its own daemon: its stateless requests of the 2026-07-28 revision make the project URL's
    # session one of that revision, where a request without the revision is then refused.
    _, endpoint = own_served
    path = _project_path(env)
    session = endpoint.initialize(path)
    slow, fast = _Wire(endpoint, path), _Wire(endpoint, path)
    stateless = [_Wire(endpoint, path) for _ in range(2)]
    try:
        header = f"Mcp-Session-Id: {session}\r\n"
        # The same id twice in flight in one session, and an id whose JSON has an escape in it.
        slow.sock.sendall(slow.post({"jsonrpc": "2.0", "id": 5, "method": "tools/call",
                                     "params": {"name": "slow", "arguments": {"seconds": 0.5, "marker": "m"}}}, header))
        time.sleep(0.2)
        fast.sock.sendall(fast.post({"jsonrpc": "2.0", "id": 5, "method": "tools/call",
                                     "params": {"name": "echo", "arguments": {"text": "quick"}}}, header))
        assert json.loads(fast.response()[2]) == {"jsonrpc": "2.0", "id": 5, "result": {"content": [{"type": "text", "text": "quick"}]}}
        answer = json.loads(slow.response()[2])
        assert answer["id"] == 5 and answer["result"]["content"][0]["text"] == "slept"
        data = b'{"jsonrpc":"2.0","id":"a\\u0062\\n","method":"ping"}'
        fast.sock.sendall(fast.head(extra=header + f"Content-Length: {len(data)}\r\n") + b"\r\n" + data)
        assert json.loads(fast.response()[2]) == {"jsonrpc": "2.0", "id": "ab\n", "result": {}}
        # Two clients of one stateless URL, both with id 1, at once.
        meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}
        for i, wire in enumerate(stateless):
            name = "slow" if i == 0 else "echo"
            wire.sock.sendall(wire.post({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
                "name": name, "arguments": {"seconds": 0.3, "marker": "s"} if i == 0 else {"text": "other"}, "_meta": meta}},
                f"Mcp-Method: tools/call\r\nMcp-Name: {name}\r\nMCP-Protocol-Version: 2026-07-28\r\n"))
        answers = [json.loads(wire.response()[2]) for wire in reversed(stateless)]
        assert [(a["id"], a["result"]["content"][0]["text"]) for a in answers] == [(1, "other"), (1, "slept")]
    finally:
        for wire in (slow, fast, *stateless):
            wire.close()


def test_a_head_that_never_ends_is_cut_off(served: tuple[Any, Http]) -> None:
    _, endpoint = served
    wire = _Wire(endpoint)
    try:
        wire.sock.sendall(wire.head() + b"X-Endless: ")
        sent = 0
        with pytest.raises(OSError):  # the daemon closes the connection; the writes then fail
            while sent < 64 * 1024 * 1024:
                wire.sock.sendall(b"a" * 65536)
                sent += 65536
        assert sent < 8 * 1024 * 1024, sent  # cut at about a MiB, not buffered on and on
    finally:
        wire.close()


def test_an_argument_that_mentions_the_2026_revision_key_is_just_text(served: tuple[Any, Http]) -> None:
    """Whether a request is of the 2026-07-28 revision is read from its ``_meta``, not from its bytes:
    a tool argument that quotes the key's name is an ordinary argument of a 2025-11-25 session."""
    daemon, endpoint = served
    env = daemon.env
    session = endpoint.initialize(_project_path(env))
    text = "see io.modelcontextprotocol/protocolVersion in the spec"
    answer = endpoint.rpc("tools/call", {"name": "echo", "arguments": {"text": text}}, session=session,
                          path=_project_path(env))
    assert "result" in answer, answer
    assert answer["result"]["content"][0]["text"] == text, answer


def test_an_answer_comes_in_a_form_the_request_accepts(served: tuple[Any, Http]) -> None:
    """A POST whose Accept has no text/event-stream gets its answer as JSON, even when the tool
    reports progress first; one that takes neither JSON nor SSE is refused (406) and runs nothing."""
    daemon, endpoint = served
    env = daemon.env
    session = endpoint.initialize(_project_path(env))
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "slow", "arguments": {"seconds": 0.2, "marker": "json-only"}, "_meta": {"progressToken": "p"}}}
    status, headers, body = endpoint.request("POST", call, headers={"Mcp-Session-Id": session, "Accept": "application/json"},
                                             path=_project_path(env))
    assert status == 200 and headers["content-type"].startswith("application/json"), headers
    assert json.loads(body)["result"]["content"][0]["text"] == "slept"
    # The same call that takes SSE streams its progress before the answer.
    call["id"] = 3
    status, headers, body = endpoint.request("POST", call, headers={"Mcp-Session-Id": session}, path=_project_path(env))
    assert status == 200 and headers["content-type"].startswith("text/event-stream"), headers
    assert [m.get("method") for m in _messages(headers, body)] == ["notifications/progress", None]
    call["id"], call["params"]["arguments"]["marker"] = 4, "refused"
    status, _, body = endpoint.request("POST", call, headers={"Mcp-Session-Id": session, "Accept": "text/html"},
                                       path=_project_path(env))
    assert status == 406 and "Accept" in json.loads(body)["error"]["message"]
    # A call made after the refused one, as long: once it is done, the refused one would be too.
    call["id"], call["params"]["arguments"]["marker"] = 5, "after"
    status, _, _ = endpoint.request("POST", call, headers={"Mcp-Session-Id": session}, path=_project_path(env))
    assert status == 200 and (env.project / "after").exists()
    assert not (env.project / "refused").exists()


@pytest.mark.parametrize("path", ["/.well-known/oauth-protected-resource", "/.well-known/oauth-authorization-server",
                                  "/.well-known/oauth-protected-resource/mcp", "/register"])
def test_oauth_discovery_finds_nothing_so_clients_do_not_start_an_auth_flow(served: tuple[Any, Http], path: str) -> None:
    """The endpoint takes a bearer token, not OAuth: discovery paths answer 404 with or without a
    token, never the 401 that sends a client into an OAuth flow."""
    _, endpoint = served
    for token in (None, "default"):
        status, headers, _ = endpoint.request("GET", path=path, token=token, headers={"Accept": "application/json"})
        assert status == 404, (path, token, status)
        assert "www-authenticate" not in headers
