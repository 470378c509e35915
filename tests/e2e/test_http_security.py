"""Who may reach the daemon's HTTP endpoint, beyond test_http.py: where it listens (loopback for a
bare port; an address only when the user names it, and then still only with the token), another
user of the machine (who can reach the port but not read the token) and another user's daemon's
token, and that nothing of the HTTP server is imported while HTTP is off."""

from __future__ import annotations

import http.client
import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

import pytest

from helpers import Daemon, Env, as_other_user

pytestmark = pytest.mark.slow

NOBODY = 65534

TOUCH = '''
from pathlib import Path

def touch(name: str) -> str:
    """Write a marker file in the project, so a test can tell whether this ran."""
    Path(__file__).resolve().parents[2].joinpath(name).write_text("ran")
    return "touched " + name
'''


def _status(daemon: Daemon) -> dict[str, Any]:
    with daemon.raw() as raw:
        return raw.request("atomic/status")["result"]["http"]


def _post(host: str, port: int, body: dict[str, Any], token: str | None, host_header: str | None = None,
          path: str = "/mcp") -> tuple[int, dict[str, str], bytes]:
    connection = http.client.HTTPConnection(host, port, timeout=30)
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    if host_header is not None:
        headers["Host"] = host_header
    connection.request("POST", path, body=json.dumps(body).encode(), headers=headers)
    response = connection.getresponse()
    payload = response.read()
    found = {k.lower(): v for k, v in response.getheaders()}
    connection.close()
    return response.status, found, payload


def _call(name: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "touch", "arguments": {"name": name}}}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_bare_port_listens_on_loopback_127_0_0_1_only(env: Env, make_daemon: Any) -> None:
    port = _free_port()
    daemon = make_daemon({"ATOMICTOOLS_HTTP": str(port)})
    assert _status(daemon)["url"] == f"http://127.0.0.1:{port}/mcp"
    # Another address of this machine (all of 127/8 is local) finds nothing listening there.
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.2", port), timeout=5).close()


def test_an_address_named_explicitly_is_served_with_the_token_and_only_under_its_name(env: Env, make_daemon: Any) -> None:
    env.write_tool(env.local_tools, "touch.py", TOUCH)
    daemon = make_daemon({"ATOMICTOOLS_HTTP": "127.0.0.2:0"})
    info = _status(daemon)
    token = Path(info["tokenFile"]).read_text().strip()
    port = int(info["url"].rsplit(":", 1)[1].split("/")[0])
    assert info["url"] == f"http://127.0.0.2:{port}/mcp"
    path = f"/mcp?directory={env.project}"
    status, headers, _ = _post("127.0.0.2", port, _call("untokened"), None, path=path)
    assert status == 401 and headers["www-authenticate"].startswith("Bearer")  # never without the token
    # The name it was given is this server's; loopback names are not, as it was not bound there.
    status, _, _ = _post("127.0.0.2", port, _call("renamed"), token, host_header=f"localhost:{port}", path=path)
    assert status == 403
    # A call of touch made after the refused ones: once it is done, they would have run too.
    status, _, body = _post("127.0.0.2", port, _call("served"), token, path=path)
    assert status == 200 and json.loads(body)["result"]["content"][0]["text"] == "touched served"
    assert not (env.project / "untokened").exists() and not (env.project / "renamed").exists()


def test_another_users_daemon_and_another_user_get_401_and_nothing_runs(env: Env, make_daemon: Any, tmp_path: Path) -> None:
    env.write_tool(env.local_tools, "touch.py", TOUCH)
    daemon = make_daemon({"ATOMICTOOLS_HTTP": "127.0.0.1:0"})
    info = _status(daemon)
    port = int(info["url"].rsplit(":", 1)[1].split("/")[0])
    path = f"/mcp?directory={env.project}"
    # Another user's daemon has its own token: a client configured for that one is refused here.
    (tmp_path / "other").mkdir()
    other_env = Env(tmp_path / "other")
    other = Daemon(other_env, {"ATOMICTOOLS_HTTP": "127.0.0.1:0"})
    try:
        other.start()
        other_token = Path(_status(other)["tokenFile"]).read_text().strip()
    finally:
        other.stop()
        other_env.cleanup()
    status, headers, body = _post("127.0.0.1", port, _call("foreign"), other_token, path=path)
    assert status == 401 and 'error="invalid_token"' in headers["www-authenticate"]
    assert "not this daemon's" in json.loads(body)["error"]["message"]

    # Another user of this machine cannot read the token (0600 in a 0700 dir), and on Linux its
    # connection is closed as it is accepted (the kernel says who owns the client's socket).
    def attempt() -> str:
        try:
            Path(info["tokenFile"]).read_text()
            outcome = "read the token"
        except OSError as exc:
            outcome = f"token unreadable: errno {exc.errno}"
        try:
            status, _, _ = _post("127.0.0.1", port, _call("nobody"), None, path=path)
        except (ConnectionError, http.client.RemoteDisconnected) as exc:
            return f"{outcome}; closed unanswered ({type(exc).__name__})"
        return f"{outcome}; HTTP {status}"

    if os.geteuid() == 0:
        outcome = as_other_user(NOBODY, NOBODY, [], attempt)
        if outcome.startswith("crashed"):
            pytest.skip(f"cannot act as another user here: {outcome}")
        expected = "closed unanswered" if sys.platform == "linux" else "HTTP 401"
        assert outcome.startswith("token unreadable: errno 13; ") and expected in outcome, outcome
    # A call of touch made after the refused ones: once it is done, they would have run too.
    token = Path(info["tokenFile"]).read_text().strip()
    status, _, body = _post("127.0.0.1", port, _call("after"), token, path=path)
    assert status == 200 and json.loads(body)["result"]["content"][0]["text"] == "touched after"
    assert not (env.project / "foreign").exists() and not (env.project / "nobody").exists()
    assert _status(daemon)["refused"] >= 1
    if os.geteuid() == 0 and sys.platform == "linux":
        assert _status(daemon)["closed"]["otherUser"] == 1


def _imported(daemon: Daemon) -> set[str]:
    """The modules the daemon imported, from its ``-X importtime`` report on stderr."""
    return {line.rsplit("|", 1)[1].strip() for line in daemon.stderr().splitlines()
            if line.startswith("import time:") and "|" in line}


@pytest.mark.parametrize("http", [False, True], ids=["off", "on"])
def test_nothing_of_http_is_imported_while_http_is_off(env: Env, make_daemon: Any, http: bool) -> None:
    env.write_tool(env.global_tools, "touch.py", TOUCH)
    command = [sys.executable, "-X", "importtime", "-P", "-m", "atomictoolsd", "serve"]
    daemon = make_daemon({"ATOMICTOOLS_HTTP": "127.0.0.1:0"} if http else None, command=command)
    with daemon.raw() as raw:  # a session's whole path: initialize, a listing, a call, the status
        raw.request("initialize", {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t"}})
        raw.request("tools/list")
        raw.request("tools/call", {"name": "touch", "arguments": {"name": "m"}})
        raw.request("atomic/status")
    daemon.stop()
    imported = _imported(daemon)
    assert "asyncio" in imported, "the import report was not read"  # the measure itself works
    server = {"uvicorn", "httptools", "h11", "atomictoolsd.transports.http"} & imported
    assert server if http else not server, sorted(server)
