"""Every MCP revision from 2024-11-05 to 2025-11-25 through ``initialize``: each client gets its own
revision back and only what that revision has (tool fields, result fields, content blocks,
progress fields), over the socket and through the shim; schemas as written or portable by client."""

from __future__ import annotations

import json
import struct
from typing import Any

import pytest

from atomictools._protocol import SUPPORTED_PROTOCOL_VERSIONS
from helpers import Daemon, Env

WAV = b"RIFF" + struct.pack("<I", 44) + b"WAVEfmt " + struct.pack("<IHHIIHH", 16, 1, 1, 8000, 8000, 1, 8) + b"data" + struct.pack("<I", 8) + b"\x80" * 8

KIT = f'''
import msgspec
from atomictools import Audio, Context, ResourceLink, tool

class Point(msgspec.Struct):
    x: int
    y: int

@tool(name="locate", title="Where it is", annotations={{"readOnlyHint": True}})
def locate(ctx: Context) -> Point:
    """A point, as structured content; with a progress message first."""
    ctx.progress(1, 2, "looking")
    return Point(1, 2)

@tool(name="media")
def media():
    """Audio and a resource link."""
    return [Audio({WAV!r}), ResourceLink("file:///etc/hostname", name="hostname", mime_type="text/plain")]
'''

SCHEMA = {
    "name": "schemas", "version": "1", "description": "2020-12 keywords",
    "tools": [{
        "name": "where", "description": "A tool whose schema uses $defs.",
        "inputSchema": {
            "$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
            "$defs": {"place": {"type": "object", "properties": {"city": {"type": "string"}}}},
            "properties": {"place": {"$ref": "#/$defs/place"}}, "additionalProperties": False,
        },
        "handler": {"type": "shell", "command": "echo ok"},
    }],
}


@pytest.fixture
def kit(env: Env, make_daemon: Any) -> Daemon:
    env.write_tool(env.global_tools, "kit.py", KIT)
    env.write_tool(env.global_tools, "schemas.json", json.dumps(SCHEMA))
    return make_daemon()


def _session(daemon: Daemon, version: str, name: str = "test") -> Any:
    raw = daemon.raw()
    reply = raw.request("initialize", {"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": name, "version": "1"}})
    raw.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    return raw, reply["result"]


@pytest.mark.parametrize("version", SUPPORTED_PROTOCOL_VERSIONS)
def test_each_revision_gets_only_what_it_has(kit: Daemon, version: str) -> None:
    raw, init = _session(kit, version)
    with raw:
        assert init["protocolVersion"] == version
        assert ("title" in init["serverInfo"]) == (version >= "2025-06-18")
        tools = {t["name"]: t for t in raw.request("tools/list")["result"]["tools"]}
        locate = tools["locate"]
        assert ("annotations" in locate) == (version >= "2025-03-26")
        assert ("title" in locate) == (version >= "2025-06-18")
        assert ("outputSchema" in locate) == (version >= "2025-06-18")
        assert set(locate) <= {"name", "description", "inputSchema", "annotations", "title", "outputSchema", "_meta"}

        raw.send({"jsonrpc": "2.0", "id": 50, "method": "tools/call",
                  "params": {"name": "locate", "arguments": {}, "_meta": {"progressToken": "t"}}})
        progress, result = None, None
        while result is None:
            message = raw.recv()
            if message.get("method") == "notifications/progress":
                progress = message["params"]
            elif message.get("id") == 50:
                result = message["result"]
        assert progress is not None and ("message" in progress) == (version >= "2025-03-26")
        assert ("structuredContent" in result) == (version >= "2025-06-18")
        assert json.loads(result["content"][0]["text"]) == {"x": 1, "y": 2}  # the text mirrors it for all

        media = raw.request("tools/call", {"name": "media", "arguments": {}})["result"]["content"]
        kinds = [block["type"] for block in media]
        assert kinds[0] == ("audio" if version >= "2025-03-26" else "text")
        assert kinds[1] == ("resource_link" if version >= "2025-06-18" else "text")


def test_an_unknown_revision_gets_the_newest(kit: Daemon) -> None:
    raw, init = _session(kit, "2099-01-01")
    with raw:
        assert init["protocolVersion"] == SUPPORTED_PROTOCOL_VERSIONS[-1]


@pytest.mark.parametrize("client", ["gemini-cli-mcp-client", "qwen-code-mcp-client"])
def test_agents_that_reject_defs_get_the_portable_schema_others_get_it_as_written(kit: Daemon, client: str) -> None:
    raw, _ = _session(kit, "2025-11-25", name="claude-code")
    with raw:
        where = next(t for t in raw.request("tools/list")["result"]["tools"] if t["name"] == "where")
        assert where["inputSchema"]["$defs"] == SCHEMA["tools"][0]["inputSchema"]["$defs"]
        assert where["inputSchema"]["$schema"].endswith("2020-12/schema")
    raw, _ = _session(kit, "2025-11-25", name=client)
    with raw:
        where = next(t for t in raw.request("tools/list")["result"]["tools"] if t["name"] == "where")
        assert "$defs" not in json.dumps(where["inputSchema"]) and "$ref" not in json.dumps(where["inputSchema"])
        assert where["inputSchema"]["properties"]["place"]["properties"]["city"] == {"type": "string"}
