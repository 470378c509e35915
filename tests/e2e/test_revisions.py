"""Every MCP revision from 2024-11-05 to 2025-11-25 through ``initialize``: each client gets its own
revision back and only what that revision's schema has (initialize, tool definitions and their
annotations, call results, every content block type, progress), checked key by key over the socket
and through the shim; schemas as written or portable by client."""

from __future__ import annotations

import json
import struct
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from atomictools._protocol import SUPPORTED_PROTOCOL_VERSIONS
from helpers import Daemon, Env, RawConnection, serving
from shim_helpers import SHIM

WAV = b"RIFF" + struct.pack("<I", 44) + b"WAVEfmt " + struct.pack("<IHHIIHH", 16, 1, 1, 8000, 8000, 1, 8) + b"data" + struct.pack("<I", 8) + b"\x80" * 8

PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000" "1f15c4890000000d49444154789c6360000002000001e221bc330000000049454e44ae426082"
)

KIT = f'''
import msgspec
from atomictools import Audio, Context, Image, Resource, ResourceLink, tool

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
    """Audio, a resource link, an image and an embedded resource."""
    return [
        Audio({WAV!r}), ResourceLink("file:///etc/hostname", name="hostname", mime_type="text/plain"),
        Image({PNG!r}), Resource(uri="test://note", text="a note", mime_type="text/plain"),
    ]
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


@pytest.fixture(scope="module")
def kit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """One daemon for the module: its tests only list and call the kit's tools."""
    env = Env(tmp_path_factory.mktemp("kit"))
    env.write_tool(env.global_tools, "kit.py", KIT)
    env.write_tool(env.global_tools, "schemas.json", json.dumps(SCHEMA))
    with serving(env) as daemon:
        yield daemon


def _session(daemon: Daemon, version: str, name: str = "test") -> Any:
    raw = daemon.raw()
    reply = raw.request("initialize", {"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": name, "version": "1"}})
    raw.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    return raw, reply["result"]


# Each revision's schema, as far as what the daemon writes: the keys each object may hold. A key
# outside its revision's set is one a strict client of that revision rejects or misreads.
def _since(version: str, table: dict[str, str]) -> set[str]:
    return {key for key, since in table.items() if version >= since}


SCHEMA_KEYS = {
    "initialize": {"protocolVersion": "2024-11-05", "capabilities": "2024-11-05", "serverInfo": "2024-11-05",
                   "instructions": "2024-11-05", "_meta": "2024-11-05"},
    "capabilities": {"experimental": "2024-11-05", "logging": "2024-11-05", "prompts": "2024-11-05",
                     "resources": "2024-11-05", "tools": "2024-11-05", "completions": "2025-03-26", "tasks": "2025-11-25"},
    "serverInfo": {"name": "2024-11-05", "version": "2024-11-05", "title": "2025-06-18", "icons": "2025-11-25",
                   "websiteUrl": "2025-11-25", "description": "2025-11-25"},
    "tool": {"name": "2024-11-05", "description": "2024-11-05", "inputSchema": "2024-11-05", "annotations": "2025-03-26",
             "title": "2025-06-18", "outputSchema": "2025-06-18", "_meta": "2025-06-18", "icons": "2025-11-25",
             "execution": "2025-11-25"},
    "annotations": {"title": "2025-03-26", "readOnlyHint": "2025-03-26", "destructiveHint": "2025-03-26",
                    "idempotentHint": "2025-03-26", "openWorldHint": "2025-03-26"},
    "toolsList": {"tools": "2024-11-05", "nextCursor": "2024-11-05", "_meta": "2024-11-05"},
    "callResult": {"content": "2024-11-05", "isError": "2024-11-05", "_meta": "2024-11-05", "structuredContent": "2025-06-18"},
    "progress": {"progressToken": "2024-11-05", "progress": "2024-11-05", "total": "2024-11-05", "message": "2025-03-26"},
}
# Content blocks: the first revision of each type, and the keys each may hold (``_meta`` from 2025-06-18).
BLOCK_SINCE = {"text": "2024-11-05", "image": "2024-11-05", "resource": "2024-11-05", "audio": "2025-03-26",
               "resource_link": "2025-06-18"}
BLOCK_KEYS = {
    "text": {"type", "text", "annotations"},
    "image": {"type", "data", "mimeType", "annotations"},
    "audio": {"type", "data", "mimeType", "annotations"},
    "resource": {"type", "resource", "annotations"},
    "resource_link": {"type", "uri", "name", "title", "description", "mimeType", "size", "annotations"},
}
RESOURCE_KEYS = {"uri", "mimeType", "text", "blob"}


def _check(version: str, kind: str, value: dict[str, Any]) -> None:
    extra = set(value) - _since(version, SCHEMA_KEYS[kind])
    assert not extra, f"{version} {kind} has {sorted(extra)}, which that revision lacks: {value}"


def _check_block(version: str, block: dict[str, Any]) -> None:
    kind = block["type"]
    assert version >= BLOCK_SINCE[kind], f"{version} has no {kind} block: {block}"
    allowed = BLOCK_KEYS[kind] | ({"_meta"} if version >= "2025-06-18" else set())
    assert set(block) <= allowed, f"{version} {kind} block has {sorted(set(block) - allowed)}"
    if kind == "resource":
        assert set(block["resource"]) <= RESOURCE_KEYS | ({"_meta"} if version >= "2025-06-18" else set())


class ShimConnection(RawConnection):
    """The stdio shim as an agent runs it, read and written line by line like the socket."""

    def __init__(self, env: Env, *args: str) -> None:
        self.process = subprocess.Popen(
            [SHIM, "mcp", *args], env=env.vars, cwd=env.project, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        assert self.process.stdout is not None
        self.file = self.process.stdout
        self._next_id = 0

    def send(self, message: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(message).encode() + b"\n")
        self.process.stdin.flush()

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()  # the shim exits once its stdin closes
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.file.close()


def _connect(daemon: Daemon, env: Env, via: str) -> Any:
    return daemon.raw() if via == "socket" else ShimConnection(env)


@pytest.mark.parametrize("via", ["socket", "shim"])
@pytest.mark.parametrize("version", SUPPORTED_PROTOCOL_VERSIONS)
def test_each_revision_gets_only_what_its_schema_has(kit: Daemon, version: str, via: str) -> None:
    env = kit.env
    with _connect(kit, env, via) as raw:
        init = raw.request("initialize", {"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}})["result"]
        raw.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        assert init["protocolVersion"] == version
        _check(version, "initialize", init)
        _check(version, "capabilities", init["capabilities"])
        _check(version, "serverInfo", init["serverInfo"])
        assert ("title" in init["serverInfo"]) == (version >= "2025-06-18")

        listed = raw.request("tools/list")["result"]
        _check(version, "toolsList", listed)
        tools = {t["name"]: t for t in listed["tools"]}
        for tool in tools.values():
            _check(version, "tool", tool)
            if "annotations" in tool:
                _check(version, "annotations", tool["annotations"])
        locate = tools["locate"]
        assert ("annotations" in locate) == (version >= "2025-03-26")  # present where the revision has them
        assert ("title" in locate) == (version >= "2025-06-18")
        assert ("outputSchema" in locate) == (version >= "2025-06-18")

        raw.send({"jsonrpc": "2.0", "id": 50, "method": "tools/call",
                  "params": {"name": "locate", "arguments": {}, "_meta": {"progressToken": "t"}}})
        progress, result = None, None
        while result is None:
            message = raw.recv()
            if message.get("method") == "notifications/progress":
                progress = message["params"]
            elif message.get("id") == 50:
                result = message["result"]
        assert progress is not None
        _check(version, "progress", progress)
        assert ("message" in progress) == (version >= "2025-03-26")
        _check(version, "callResult", result)
        assert ("structuredContent" in result) == (version >= "2025-06-18")
        assert json.loads(result["content"][0]["text"]) == {"x": 1, "y": 2}  # the text mirrors it for all

        media = raw.request("tools/call", {"name": "media", "arguments": {}})["result"]
        _check(version, "callResult", media)
        for block in media["content"]:
            _check_block(version, block)
        kinds = [block["type"] for block in media["content"]]
        assert kinds == [
            "audio" if version >= "2025-03-26" else "text",
            "resource_link" if version >= "2025-06-18" else "text",
            "image", "resource",
        ]
        if version < "2025-06-18":  # what it could not be sent is described, not lost
            assert "hostname" in media["content"][1]["text"] and "file:///etc/hostname" in media["content"][1]["text"]


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


STATELESS = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}


def _where_stateless(raw: Any, client: str | None) -> dict[str, Any]:
    """The "where" tool's schema as a 2026-07-28 ``tools/list`` naming ``client`` (or no client) gets it."""
    meta = dict(STATELESS)
    if client is not None:
        meta["io.modelcontextprotocol/clientInfo"] = {"name": client, "version": "1"}
    listed = raw.request("tools/list", {"_meta": meta})["result"]
    return next(t for t in listed["tools"] if t["name"] == "where")["inputSchema"]


def _portable(schema: dict[str, Any]) -> bool:
    text = json.dumps(schema)
    if "$defs" in text or "$ref" in text:
        return False
    assert schema["properties"]["place"]["properties"]["city"] == {"type": "string"}
    return True


def test_a_stateless_request_naming_an_agent_that_rejects_defs_gets_the_portable_schema(kit: Daemon) -> None:
    # Each 2026-07-28 request may name its client: the one that names an agent that rejects $defs is
    # sent the portable form even after another name (the session's first) took the schema as written.
    with kit.raw() as raw:
        assert not _portable(_where_stateless(raw, "claude-code"))
        assert _portable(_where_stateless(raw, "gemini-cli"))
        assert _portable(_where_stateless(raw, "qwen-code"))
        assert not _portable(_where_stateless(raw, None))  # no name: the session's own (claude-code)


def test_the_agent_the_shim_attached_as_gets_the_portable_schema_in_the_stateless_revision(kit: Daemon) -> None:
    env = kit.env
    # `atomictoolsd connect gemini` runs the shim with --agent gemini: that names the client for every
    # request of the session, whether or not a request names it again.
    with ShimConnection(env, "--agent", "gemini") as raw:
        assert _portable(_where_stateless(raw, None))
        assert _portable(_where_stateless(raw, "gemini-cli"))
    with ShimConnection(env, "--agent", "claude") as raw:
        assert not _portable(_where_stateless(raw, None))
        assert _portable(_where_stateless(raw, "gemini-cli"))
