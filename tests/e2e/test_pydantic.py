"""Tools that speak pydantic, through a real daemon: ``BaseModel`` parameters and results with nested
models, constraints and defaults, ``pydantic.Field`` and ``Annotated[..., Field(...)]``, served as
FastMCP serves them (the same function, moved into ``.atomic/tools/`` with its decorator changed,
has the same schema and accepts and refuses the same arguments), and never imported by a worker
whose module does not use it."""

from __future__ import annotations

import asyncio
import sys
import textwrap
import types

import pytest

from atomictools._jsonschema import inline_refs
from helpers import Daemon, Env, wait_for

pydantic = pytest.importorskip("pydantic")

# A FastMCP tool, as its docs write one; ``{decorator}`` is FastMCP's or ours.
FASTMCP_TOOL = '''
from typing import Annotated, Literal

from pydantic import BaseModel, Field

{imports}


class Point(BaseModel):
    x: int = Field(ge=0, description="Distance from the left edge")
    y: int = Field(default=0, ge=0)


class Shape(BaseModel):
    """A polygon."""

    points: list[Point] = Field(min_length=3)
    label: str | None = None
    kind: Literal["outline", "filled"] = "outline"


class Measured(BaseModel):
    label: str
    corners: int
    width: int


{decorator}
def measure(
    shape: Shape,
    scale: Annotated[int, Field(gt=0, le=10, description="How many times bigger")] = 1,
    unit: str = Field(default="px", pattern="^[a-z]+$"),
) -> Measured:
    """Measure a shape."""
    xs = [p.x * scale for p in shape.points]
    return Measured(label=f"{{shape.label or 'unnamed'}} in {{unit}}", corners=len(shape.points), width=max(xs) - min(xs))
'''

GOOD = {"shape": {"points": [{"x": 1}, {"x": 4, "y": 2}, {"x": 2}], "label": "tri"}, "scale": 2}
BAD = [
    ({"shape": {"points": [{"x": 1}, {"x": -4}, {"x": 2}]}}, "shape.points.1.x"),
    ({"shape": {"points": [{"x": 1}]}}, "shape.points"),
    ({"shape": {"points": [{"x": 1}, {"x": 2}, {"x": 3}], "kind": "dotted"}}, "shape.kind"),
    ({"shape": {"points": [{"x": 1}, {"x": 2}, {"x": 3}]}, "scale": 11}, "scale"),
    ({"shape": {"points": [{"x": 1}, {"x": 2}, {"x": 3}]}, "unit": "PX"}, "unit"),
    ({}, "shape"),
]


def _fastmcp() -> tuple[dict, dict, dict, list[str]]:
    """What the MCP SDK's own server makes of the tool: its input and output schemas (refs inlined),
    its answer to GOOD, and its error for each of BAD."""
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("peer")
    module = types.ModuleType("fastmcp_peer_tools")  # a module of its own: pydantic resolves names there
    module.mcp = server  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    try:
        source = textwrap.dedent(FASTMCP_TOOL.format(imports="", decorator="@mcp.tool()"))
        exec(compile(source, "<fastmcp>", "exec"), module.__dict__)
    finally:
        del sys.modules[module.__name__]

    async def run() -> tuple[dict, dict, dict, list[str]]:
        [listed] = await server.list_tools()
        good = await server.call_tool("measure", GOOD)
        errors = []
        for arguments, _field in BAD:
            try:
                await server.call_tool("measure", arguments)
            except Exception as exc:  # noqa: BLE001 - its ToolError, whatever it is called
                errors.append(str(exc))
        return inline_refs(listed.input_schema), inline_refs(listed.output_schema), good, errors

    return asyncio.run(run())


def _ported(env: Env) -> None:
    env.write_tool(env.local_tools, "measure.py", FASTMCP_TOOL.format(imports="from atomictools import tool", decorator="@tool"))


def test_a_fastmcp_tool_moved_in_with_its_decorator_changed_has_fastmcps_schemas(env: Env, daemon: Daemon) -> None:
    _ported(env)
    theirs_in, theirs_out, _good, _errors = _fastmcp()
    with daemon.client() as client:
        [tool] = client.list_tools()
    ours_in, ours_out = tool["inputSchema"], tool["outputSchema"]
    # pydantic's own schema of the same signature: nested models, constraints, defaults, descriptions.
    assert ours_in["properties"] == theirs_in["properties"]
    assert ours_in["required"] == theirs_in["required"] == ["shape"]
    assert ours_out["properties"] == theirs_out["properties"] and ours_out["required"] == theirs_out["required"]
    # Then the pass every tool gets: references inlined, the root an object that takes nothing else.
    assert "$defs" not in str(ours_in) and "$ref" not in str(ours_in) and "title" not in ours_in
    assert ours_in["additionalProperties"] is False and ours_in["type"] == "object"
    point = ours_in["properties"]["shape"]["properties"]["points"]["items"]["properties"]["x"]
    assert point == {"description": "Distance from the left edge", "minimum": 0, "title": "X", "type": "integer"}
    assert ours_in["properties"]["scale"]["description"] == "How many times bigger"
    assert ours_in["properties"]["shape"]["properties"]["kind"]["enum"] == ["outline", "filled"]


def test_a_fastmcp_tool_validates_and_answers_as_fastmcp_does(env: Env, daemon: Daemon) -> None:
    _ported(env)
    _in, _out, theirs, their_errors = _fastmcp()
    with daemon.client() as client:
        result = client.call_tool("measure", GOOD)
        assert not result.is_error, result.text
        assert result.structured == theirs.structured_content == {"label": "tri in px", "corners": 3, "width": 6}
        for (arguments, field), their_error in zip(BAD, their_errors, strict=True):
            refused = client.call_tool("measure", arguments)
            assert refused.is_error and refused.text.startswith("Invalid arguments for tool 'measure': "), refused.text
            # The field, by its path, as pydantic (and so FastMCP) names it.
            assert f"`{field}`:" in refused.text and field in their_error, (refused.text, their_error)


def test_pydantic_models_in_results_and_fields_as_defaults(env: Env, daemon: Daemon) -> None:
    env.write_tool(env.local_tools, "inventory.py", '''
        from pydantic import BaseModel, Field
        from atomictools import Context, tool


        class Item(BaseModel):
            name: str
            count: int = Field(default=1, ge=0)


        @tool
        def inventory(items: list[Item], ctx: Context, minimum: int = Field(default=0, ge=0)) -> list[Item]:
            """Keep the items with at least ``minimum`` of them."""
            return [item for item in items if item.count >= minimum]


        @tool
        def loose(name: str) -> dict:
            """A model returned where the annotation says dict."""
            return {"item": Item(name=name)}


        @tool
        def wrong() -> Item:
            return {"name": 3}
    ''')
    with daemon.client() as client:
        kept = client.call_tool("inventory", {"items": [{"name": "a", "count": 3}, {"name": "b"}], "minimum": 2})
        assert kept.structured == {"result": [{"name": "a", "count": 3}]}, kept.text
        assert client.call_tool("inventory_loose", {"name": "c"}).structured == {"item": {"name": "c", "count": 1}}
        refused = client.call_tool("inventory", {"items": [], "minimum": -1})
        assert refused.is_error and "`minimum`: Input should be greater than or equal to 0" in refused.text
        wrong = client.call_tool("inventory_wrong", {})
        assert wrong.is_error and "does not match its return annotation" in wrong.text and "`name`" in wrong.text


def test_a_worker_whose_module_does_not_use_pydantic_never_imports_it(env: Env, daemon: Daemon) -> None:
    env.write_tool(env.local_tools, "model.py", '''
        from pydantic import BaseModel

        class Thing(BaseModel):
            name: str

        def model(thing: Thing) -> str:
            return thing.name
    ''')
    env.write_tool(env.local_tools, "plain.py", '''
        import sys

        def plain() -> str:
            return str(sorted(m for m in sys.modules if m.partition(".")[0] in ("pydantic", "pydantic_core")))
    ''')
    with daemon.client() as client:
        assert client.call("model", thing={"name": "x"}).text == "x"
        assert client.call("plain").text == "[]"


def test_aliases_enums_optional_models_and_lists_of_models_as_pydantic_has_them(env: Env, daemon: Daemon) -> None:
    env.write_tool(env.local_tools, "echo.py", '''
        from enum import Enum
        from typing import Annotated, Optional

        from pydantic import BaseModel, Field


        class Color(str, Enum):
            red = "red"
            blue = "blue"


        class Inner(BaseModel):
            n: Annotated[int, Field(ge=1, le=5)] = 1


        class Outer(BaseModel):
            inner: Optional[Inner] = None
            items: list[Inner] = Field(default_factory=list, max_length=2)
            color: Color = Color.red
            tag: str = Field(alias="tagName", default="t")


        def echo(outer: Outer, extra: Annotated[list[Inner], Field(min_length=1)]) -> list[Outer]:
            """Echo."""
            return [outer, Outer(items=extra)]
    ''')
    with daemon.client() as client:
        [tool] = client.list_tools()
        outer = tool["inputSchema"]["properties"]["outer"]["properties"]
        # The alias is the name on the wire, as pydantic validates by it.
        assert "tagName" in outer and "tag" not in outer and outer["color"]["enum"] == ["red", "blue"]
        answer = client.call_tool("echo", {"outer": {"inner": {"n": 2}, "color": "blue", "tagName": "x"}, "extra": [{"n": 3}]})
        assert answer.structured == {"result": [
            {"inner": {"n": 2}, "items": [], "color": "blue", "tag": "x"},
            {"inner": None, "items": [{"n": 3}], "color": "red", "tag": "t"},
        ]}, answer.text
        refused = client.call_tool("echo", {"outer": {"items": [{"n": 1}, {"n": 2}, {"n": 9}]}, "extra": []})
        assert refused.is_error and "`outer.items`: List should have at most 2 items" in refused.text
        assert "`extra`: List should have at least 1 item" in refused.text


def test_a_module_of_pydantic_1_is_told_its_models_need_pydantic_2(env: Env, daemon: Daemon) -> None:
    # Its declared environment holds pydantic 1 (installed for real), which the worker's schema cannot read.
    declared = '''
        # /// script
        # dependencies = ["pydantic==1.10.27"]
        # ///
        from pydantic import BaseModel


        class Point(BaseModel):
            x: int
    '''
    env.write_tool(env.local_tools, "old.py", declared + '''

        def old(point: Point) -> int:
            return point.x
    ''')
    env.write_tool(env.local_tools, "old_result.py", declared + '''

        def old_result(x: int):
            return Point(x=x)
    ''')
    [error] = wait_for(lambda: len(_list(daemon)["tools"]) == 1 and _list(daemon)["errors"], timeout=120,
                       message="the pydantic 1 environment")
    assert error["file"].endswith("old.py") and error["message"] == (
        "old: the module's pydantic is 1.10.27, and a tool's pydantic types need pydantic 2, as FastMCP's do: "
        "declare pydantic>=2 (dependencies = [\"pydantic>=2\"]) or install it in the module's environment, or make "
        "them a msgspec.Struct, a @dataclass or a TypedDict")
    with daemon.client() as client:  # a model of its returned as it is, not pydantic 2's serializer's error
        answer = client.call_tool("old_result", {"x": 3})
        assert not answer.is_error and answer.text == '"Point(x=3)"', answer.text


def _list(daemon: Daemon) -> dict:
    with daemon.client() as client:
        return client.request("atomic/list")
