"""Every tool schema the daemon serves is one the strictest agent accepts (Gemini: no $ref/$defs, no
untyped property, an enum has a type; names of at most 64 characters, starting with a letter or "_"),
and a tool that cannot meet that is a load error naming the parameter."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from atomictoolsd.worker.schema import SchemaError, build_tool
from helpers import Daemon, Env
from shim_helpers import mcp_session, run

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
GEMINI_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_-]{0,63}")


def untyped(node: Any, where: str) -> list[str]:
    """The places in a property schema that carry no type (Gemini's check, written out again here)."""
    if not isinstance(node, dict):
        return [where] if node is True else []
    branches = [b for key in ("anyOf", "oneOf", "allOf") for b in node.get(key, [])]
    out = [] if "type" in node or branches else [where]
    for index, branch in enumerate(branches):
        out += untyped(branch, f"{where}|{index}")
    if isinstance(node.get("items"), dict):
        out += untyped(node["items"], f"{where}[]")
    for name, sub in (node.get("properties") or {}).items():
        out += untyped(sub, f"{where}.{name}")
    return out


def refused_by_some_agent(tool: dict[str, Any]) -> list[str]:
    problems = []
    if not GEMINI_NAME.fullmatch(tool["name"]):
        problems.append(f"name {tool['name']!r}")
    schema = tool["inputSchema"]
    text = json.dumps(schema)
    if '"$ref"' in text or '"$defs"' in text or '"definitions"' in text:
        problems.append("a reference")
    if schema.get("type") != "object":
        problems.append("root is not an object")
    for name, sub in (schema.get("properties") or {}).items():
        problems += [f"untyped {where}" for where in untyped(sub, name)]
    return problems


def test_examples_builtins_and_meta_tools_meet_the_strictest_agent(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    env.local_tools.mkdir(parents=True)
    for pack in ("tools", "squad"):
        for path in (EXAMPLES / pack).iterdir():
            if path.suffix in (".py", ".json"):
                shutil.copy(path, env.local_tools / path.name)
    del env.vars["ATOMICTOOLS_BUILTINS"]  # the built-ins too
    make_daemon()

    async def scenario() -> list[dict[str, Any]]:
        async with mcp_session(env, "--dispatcher") as (session, _):
            listed = await session.list_tools()
            return [t.model_dump(by_alias=True, exclude_none=True) for t in listed.tools]

    tools = run(scenario)
    names = {t["name"] for t in tools}
    assert {"atomic_list_tools", "atomic_call_tool", "file-reader", "lint", "grep", "notes_add"} <= names
    assert len(tools) >= 15, names
    refused = {t["name"]: refused_by_some_agent(t) for t in tools if refused_by_some_agent(t)}
    assert refused == {}


def test_an_unannotated_or_any_parameter_is_refused_at_load_naming_it() -> None:
    def grep(pattern, limit=10) -> str:  # type: ignore[no-untyped-def]
        return ""

    with pytest.raises(SchemaError, match=r"parameter 'pattern' has no type annotation.*`pattern: str`"):
        build_tool(grep, "grep")

    def count(path: str, limit=10) -> str:  # type: ignore[no-untyped-def]
        return ""

    with pytest.raises(SchemaError, match=r"parameter 'limit' has no type annotation.*`limit: int = 10`"):
        build_tool(count, "count")

    def anything(path: str, value: Any, items: list[Any] | None = None) -> str:
        return ""

    with pytest.raises(SchemaError, match=r"property 'value' has no type"):
        build_tool(anything, "anything")


def test_a_load_report_names_the_untyped_parameter_and_the_tool_is_not_served(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    env.write_tool(env.local_tools, "untyped.py", "def untyped(path):\n    return path\n")
    env.write_tool(env.local_tools, "fine.py", "from typing import Literal\n"
                   "def fine(mode: Literal['a', 1] = 'a') -> str:\n    return str(mode)\n")
    env.write_tool(env.local_tools, "loose.json", json.dumps({"name": "l", "version": "1", "tools": [
        {"name": "loose", "description": "d", "inputSchema": {"type": "object", "properties": {"x": {}}},
         "handler": {"type": "shell", "command": "echo {{x}}"}},
        {"name": "enum", "description": "d", "inputSchema": {"type": "object", "properties": {
            "x": {"enum": ["a", "b"]}}}, "handler": {"type": "shell", "command": "echo {{x}}"}},
    ]}))
    env.write_tool(env.local_tools, "digits.py", "from atomictools import tool\n"
                   "@tool(name='2fa')\ndef code() -> str:\n    return ''\n")
    daemon: Daemon = make_daemon()
    with daemon.client() as client:
        listing = client.request("atomic/list")
    served = {t["name"]: t for t in listing["tools"]}
    assert set(served) == {"fine", "enum"}
    assert served["enum"]["inputSchema"]["properties"]["x"]["type"] == "string"
    assert refused_by_some_agent(served["fine"]) == []
    errors = {Path(e["file"]).name + (f":{e['tool']}" if e.get("tool") else ""): e["message"] for e in listing["errors"]}
    assert "parameter 'path' has no type annotation" in errors["untyped.py"]
    assert "property 'x' has no type" in errors["loose.json:loose"]
    assert "must start with a letter or '_'" in errors["digits.py"]
