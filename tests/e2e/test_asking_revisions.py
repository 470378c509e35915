"""A tool's question in the form its client's revision has: a 2025-06-18 client predates SEP-1034
(defaults) and SEP-1330 (titled and multi-select enums), so it gets defaults on booleans only and a
titled choice as ``enum`` with ``enumNames``, and a multi-select is refused to the tool (which may
catch it) instead of sent; a 2025-11-25 client gets every form as the tool wrote it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from helpers import Daemon, Env, serving

KIT = '''
from typing import Literal

import msgspec
from atomictools import AskError, Context, tool


class Profile(msgspec.Struct):
    name: str = "John Doe"
    age: int = 30
    status: Literal["active", "inactive"] = "active"
    verified: bool = True


TITLED = {"type": "object", "properties": {"size": {"type": "string", "default": "m", "oneOf": [
    {"const": "s", "title": "Small"}, {"const": "m", "title": "Medium"}]}}}
MULTI = {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}}}}


@tool(timeout=30)
def profile(ctx: Context) -> str:
    """Ask for a profile with defaults."""
    return ctx.elicit("Profile?", Profile).action


@tool(timeout=30)
def titled(ctx: Context) -> str:
    """Ask for one titled choice."""
    return ctx.elicit("Size?", TITLED).action


@tool(timeout=30)
def multi(ctx: Context) -> str:
    """Ask for several choices, going on without them when the client cannot show the form."""
    try:
        return ctx.elicit("Tags?", MULTI).action
    except AskError as exc:
        return f"went on: {exc}"
'''


@pytest.fixture(scope="module")
def kit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """One daemon for the module: each test calls a form tool and declines what it asks."""
    env = Env(tmp_path_factory.mktemp("form"))
    env.write_tool(env.global_tools, "form.py", KIT)
    with serving(env) as daemon:
        yield daemon


def _asked(daemon: Daemon, version: str, tool: str) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """The schema the client was asked with (None: not asked), and the call's result."""
    with daemon.raw() as raw:
        raw.request("initialize", {"protocolVersion": version, "capabilities": {"elicitation": {}}, "clientInfo": {"name": "raw"}})
        raw.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        raw.send({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": tool, "arguments": {}}})
        message = raw.recv()
        if message.get("method") != "elicitation/create":
            return None, message["result"]
        raw.send({"jsonrpc": "2.0", "id": message["id"], "result": {"action": "decline"}})
        return message["params"]["requestedSchema"], raw.reply(1)["result"]


def test_a_2025_06_18_client_gets_defaults_on_booleans_only(kit: Daemon) -> None:
    schema, result = _asked(kit, "2025-06-18", "form_profile")
    assert schema is not None and result["content"][0]["text"] == "decline"
    assert schema["properties"] == {
        "name": {"type": "string"}, "age": {"type": "integer"},
        "status": {"type": "string", "enum": ["active", "inactive"]}, "verified": {"type": "boolean", "default": True},
    }
    schema, _ = _asked(kit, "2025-11-25", "form_profile")
    assert schema is not None and schema["properties"]["name"]["default"] == "John Doe"  # SEP-1034 as written


def test_a_2025_06_18_client_gets_a_titled_choice_as_enum_names(kit: Daemon) -> None:
    schema, _ = _asked(kit, "2025-06-18", "form_titled")
    assert schema is not None
    assert schema["properties"]["size"] == {"type": "string", "enum": ["s", "m"], "enumNames": ["Small", "Medium"]}
    schema, _ = _asked(kit, "2025-11-25", "form_titled")
    assert schema is not None and schema["properties"]["size"]["oneOf"][1] == {"const": "m", "title": "Medium"}


def test_a_multi_select_is_refused_to_the_tool_for_a_2025_06_18_client_and_asked_of_a_newer_one(kit: Daemon) -> None:
    schema, result = _asked(kit, "2025-06-18", "form_multi")
    assert schema is None and not result.get("isError")
    text = result["content"][0]["text"]
    assert text.startswith("went on: ") and "'tags' is a multi-select" in text and "2025-06-18" in text
    schema, result = _asked(kit, "2025-11-25", "form_multi")
    assert schema is not None and schema["properties"]["tags"]["type"] == "array" and result["content"][0]["text"] == "decline"
