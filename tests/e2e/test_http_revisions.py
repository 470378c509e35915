"""Every revision reached through ``initialize`` (2024-11-05 … 2025-11-25), over the daemon's HTTP
endpoint: each client gets only what its revision's schema has, key by key, as over the socket and
through the shim (test_revisions.py holds the schema tables this reuses)."""

from __future__ import annotations

import http.client
import json
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from atomictools._protocol import SUPPORTED_PROTOCOL_VERSIONS
from e2e.test_revisions import KIT, _check, _check_block
from helpers import Env

pytestmark = pytest.mark.slow


class Session:
    """One stateful HTTP session: initialize, then POSTs carrying its id and revision."""

    def __init__(self, url: str, token: str, version: str) -> None:
        parts = urlsplit(url)
        self.host, self.port, self.path, self.token = parts.hostname or "", parts.port or 80, parts.path, token
        self.headers: dict[str, str] = {}
        self.version = version

    def post(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        connection = http.client.HTTPConnection(self.host, self.port, timeout=30)
        connection.request("POST", self.path, body=json.dumps(body).encode(), headers={
            "Content-Type": "application/json", "Accept": "application/json, text/event-stream",
            "Authorization": f"Bearer {self.token}", **self.headers})
        response = connection.getresponse()
        payload = response.read()
        assert response.status in (200, 202), (response.status, payload)
        if "mcp-session-id" in {k.lower() for k, _ in response.getheaders()}:
            self.headers = {"Mcp-Session-Id": response.getheader("mcp-session-id") or "", "MCP-Protocol-Version": self.version}
        connection.close()
        if response.getheader("content-type", "").startswith("text/event-stream"):
            return [json.loads(line[6:]) for line in payload.decode().splitlines() if line.startswith("data: ")]
        return [json.loads(payload)] if payload else []


@pytest.mark.parametrize("version", SUPPORTED_PROTOCOL_VERSIONS)
def test_each_revision_gets_only_what_its_schema_has_over_http(env: Env, make_daemon: Any, version: str) -> None:
    env.write_tool(env.global_tools, "kit.py", KIT)
    daemon = make_daemon({"ATOMICTOOLS_HTTP": "127.0.0.1:0"})
    with daemon.raw() as raw:
        info = raw.request("atomic/status")["result"]["http"]
    session = Session(info["url"], Path(info["tokenFile"]).read_text().strip(), version)
    [init] = session.post({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}})
    init = init["result"]
    assert init["protocolVersion"] == version
    _check(version, "initialize", init)
    _check(version, "serverInfo", init["serverInfo"])
    session.post({"jsonrpc": "2.0", "method": "notifications/initialized"})

    [listed] = session.post({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
    for tool in listed["result"]["tools"]:
        _check(version, "tool", tool)
    locate = next(t for t in listed["result"]["tools"] if t["name"] == "locate")
    assert ("annotations" in locate) == (version >= "2025-03-26") and ("outputSchema" in locate) == (version >= "2025-06-18")

    *notes, answer = session.post({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                                   "params": {"name": "locate", "arguments": {}, "_meta": {"progressToken": "t"}}})
    [progress] = [n["params"] for n in notes if n.get("method") == "notifications/progress"]
    _check(version, "progress", progress)
    assert ("message" in progress) == (version >= "2025-03-26")
    _check(version, "callResult", answer["result"])
    assert ("structuredContent" in answer["result"]) == (version >= "2025-06-18")
    assert json.loads(answer["result"]["content"][0]["text"]) == {"x": 1, "y": 2}

    [media] = session.post({"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": "media", "arguments": {}}})
    for block in media["result"]["content"]:
        _check_block(version, block)
    assert [b["type"] for b in media["result"]["content"]] == [
        "audio" if version >= "2025-03-26" else "text", "resource_link" if version >= "2025-06-18" else "text", "image", "resource"]
