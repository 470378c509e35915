"""Schemas, validation and naming derived from tool signatures (atomictoolsd.worker.schema)."""

from __future__ import annotations

import enum
import functools
import json
from pathlib import Path
from typing import Annotated, Any, Literal, Optional

import msgspec
import pytest

from atomictools import Context, Field, tool
from atomictools._jsonschema import inline_refs
from atomictoolsd.worker.schema import SchemaError, build_tool, collect_tools, tool_name


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Point(msgspec.Struct):
    x: int
    y: Annotated[float, msgspec.Meta(ge=0)] = 0.0


class Opaque:
    """A type msgspec cannot describe."""


class Tree(msgspec.Struct):
    value: int
    children: list[Tree] = []


def _refs(node: Any) -> list[str]:
    text = json.dumps(node)
    return [part for part in ("$ref", "$defs") if part in text]


def test_input_schema_is_an_inlined_closed_object_with_required_and_defaults() -> None:
    def lint(
        path: Annotated[str, Field("File to lint", min_length=1)],
        count: Annotated[int, Field(ge=0, le=10)] = 3,
        mode: Literal["fast", "full"] = "fast",
        color: Optional[Color] = None,  # noqa: UP045 - the typing spelling must work too
        points: list[Point] = [],  # noqa: B006 - a schema default, copied per call
        ctx: Context | None = None,
    ) -> str:
        """Lint a file."""
        return path

    spec = build_tool(lint, "lint")
    schema = spec.input_schema
    assert schema["type"] == "object"
    assert schema["additionalProperties"] is False
    assert schema["required"] == ["path"]
    assert _refs(schema) == []
    props = schema["properties"]
    assert props["path"] == {"description": "File to lint", "type": "string", "minLength": 1}
    assert props["count"] == {"type": "integer", "minimum": 0, "maximum": 10, "default": 3}
    assert props["mode"] == {"type": "string", "enum": ["fast", "full"], "default": "fast"}
    assert {"type": "string", "enum": ["blue", "red"], "title": "Color"} in props["color"]["anyOf"]
    point = props["points"]["items"]
    assert point["type"] == "object" and point["required"] == ["x"]
    assert point["properties"]["y"] == {"type": "number", "minimum": 0, "default": 0.0}
    assert "ctx" not in props, "the context is injected, never part of the schema"


def test_context_parameter_is_found_by_annotation_and_left_out() -> None:
    def t(ctx: Context, text: str) -> str:
        return text

    spec = build_tool(t, "t")
    assert spec.context_param == "ctx"
    assert list(spec.input_schema["properties"]) == ["text"]
    assert spec.param_names == ("text",)


def test_no_parameters_gives_an_empty_closed_object() -> None:
    def t() -> str:
        return ""

    assert build_tool(t, "t").input_schema == {"type": "object", "properties": {}, "additionalProperties": False}


def test_arguments_are_validated_with_messages_naming_field_and_rule() -> None:
    def t(count: Annotated[int, Field(ge=0)], name: str) -> str:
        return ""

    spec = build_tool(t, "t")
    assert spec.parse_arguments(b'{"count": 2, "name": "a"}') == {"count": 2, "name": "a"}
    with pytest.raises(msgspec.ValidationError, match=r"Expected `int` >= 0 - at `\$.count`"):
        spec.parse_arguments(b'{"count": -1, "name": "a"}')
    with pytest.raises(msgspec.ValidationError, match="missing required field `name`"):
        spec.parse_arguments(b'{"count": 1}')
    with pytest.raises(msgspec.ValidationError, match="unknown field `extra`"):
        spec.parse_arguments(b'{"count": 1, "name": "a", "extra": 1}')


def test_recursive_types_are_inlined_up_to_the_recursion() -> None:
    def t(tree: Tree) -> str:
        return ""

    schema = build_tool(t, "t").input_schema
    assert _refs(schema) == []
    children = schema["properties"]["tree"]["properties"]["children"]
    assert children["items"] == {"type": "object"}


def test_inline_refs_merges_sibling_keywords() -> None:
    schema = {"$ref": "#/$defs/A", "$defs": {"A": {"type": "object", "properties": {"b": {"$ref": "#/$defs/B", "default": 1}}}, "B": {"type": "integer"}}}
    assert inline_refs(schema) == {"type": "object", "properties": {"b": {"type": "integer", "default": 1}}}


def test_paths_are_strings_in_the_schema_and_paths_in_the_call() -> None:
    def t(where: Path) -> str:
        return str(where)

    spec = build_tool(t, "t")
    assert spec.input_schema["properties"]["where"] == {"type": "string"}
    assert spec.parse_arguments(b'{"where": "/tmp/x"}') == {"where": Path("/tmp/x")}


def test_docstring_args_section_describes_parameters() -> None:
    def t(path: str, verbose: bool = False) -> str:
        """Do things.

        Args:
            path: the file to read,
                relative to the project.
            verbose (bool): say more.

        Returns:
            text
        """
        return ""

    spec = build_tool(t, "t")
    props = spec.input_schema["properties"]
    assert props["path"]["description"] == "the file to read, relative to the project."
    assert props["verbose"]["description"] == "say more."
    assert spec.description.startswith("Do things.")


def test_field_description_wins_over_docstring() -> None:
    def t(path: Annotated[str, Field("from Field")]) -> str:
        """Args:
        path: from docstring
        """
        return ""

    assert build_tool(t, "t").input_schema["properties"]["path"]["description"] == "from Field"


@pytest.mark.parametrize(
    ("annotation", "schema", "wrapped"),
    [
        (Point, {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "number", "minimum": 0, "default": 0.0}}, "required": ["x"]}, False),
        (dict[str, int], {"type": "object", "additionalProperties": {"type": "integer"}}, False),
        (list[int], {"type": "object", "properties": {"result": {"type": "array", "items": {"type": "integer"}}}, "required": ["result"]}, True),
        (int, {"type": "object", "properties": {"result": {"type": "integer"}}, "required": ["result"]}, True),
    ],
)
def test_structured_returns_get_an_object_output_schema(annotation: Any, schema: dict[str, Any], wrapped: bool) -> None:
    def t() -> None: ...

    t.__annotations__["return"] = annotation
    spec = build_tool(t, "t")
    assert spec.output_schema == schema
    assert spec.wrap_output is wrapped


@pytest.mark.parametrize("annotation", [str, None, Any])
def test_text_returns_have_no_output_schema(annotation: Any) -> None:
    def t() -> None: ...

    t.__annotations__["return"] = annotation
    assert build_tool(t, "t").output_schema is None


def test_async_tools_are_recognised() -> None:
    async def t() -> str:
        return ""

    assert build_tool(t, "t").is_async


def test_options_from_the_decorator() -> None:
    @tool(name="renamed", description="Custom.", title="Nice", timeout=5, annotations={"readOnlyHint": True})
    def t() -> str:
        """Docstring."""
        return ""

    spec = build_tool(t, "renamed", t.__atomic_tool__)
    assert spec.definition() == {
        "name": "renamed",
        "title": "Nice",
        "description": "Custom.",
        "inputSchema": {"type": "object", "properties": {}, "additionalProperties": False},
        "annotations": {"readOnlyHint": True},
        "timeout": 5,
    }


def test_decorator_rejects_bad_options() -> None:
    with pytest.raises(ValueError, match="unknown tool annotation"):
        tool(annotations={"readonly": True})
    with pytest.raises(ValueError, match="positive number"):
        tool(timeout=0)


def test_unsupported_signatures_are_schema_errors() -> None:
    def star(*args: int) -> str:
        return ""

    def opaque(x: Opaque) -> str:
        return ""

    with pytest.raises(SchemaError, match=r"\*args"):
        build_tool(star, "star")
    # The parameter, and the forms that work, not msgspec's advice on schema hooks.
    with pytest.raises(SchemaError, match=r"opaque: parameter 'x' cannot be a tool input .* a msgspec.Struct, a @dataclass, a TypedDict") as refused:
        build_tool(opaque, "opaque")
    assert "schema_hook" not in str(refused.value)


# -- naming and collection -------------------------------------------------------------------------


def test_tool_names_follow_the_file_stem() -> None:
    assert tool_name("lint", "lint") == "lint"
    assert tool_name("git", "status") == "git_status"
    assert tool_name("git", "status", "gs") == "gs"


def _module(source: str, name: str = "mod") -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": name}
    exec(compile(source, f"{name}.py", "exec"), namespace)  # noqa: S102 - test modules we wrote
    return namespace


def test_collect_marked_tools_and_skip_imported_ones() -> None:
    namespace = _module(
        "from atomictools import tool\n"
        "@tool\ndef git(): 'main'\n"
        "@tool\ndef status(): 'other'\n"
        "def helper(): pass\n",
        name="git",
    )
    imported = _module("from atomictools import tool\n@tool\ndef elsewhere(): pass\n", name="other")
    namespace["elsewhere"] = imported["elsewhere"]
    names = sorted(s.name for s in collect_tools(namespace, "git", "git"))
    assert names == ["git", "git_status"]


def test_plain_function_named_like_the_file_is_the_tool() -> None:
    namespace = _module("def greet(name: str) -> str:\n    'Greet.'\n    return name\ndef other(): pass\n", name="greet")
    assert [s.name for s in collect_tools(namespace, "greet", "greet")] == ["greet"]


def test_a_module_without_tools_is_an_error() -> None:
    with pytest.raises(SchemaError, match="no tools found"):
        collect_tools(_module("def helper(): pass\n"), "mod", "mod")


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("from atomictools import tool\n@tool(name='has.dot')\ndef a(): pass\n", "may contain only letters"),
        ("from atomictools import tool\n@tool(name='x' * 65)\ndef a(): pass\n", "the limit is 64"),
        ("from atomictools import tool\n@tool(name='bad\\n')\ndef a(): pass\n", "may contain only letters"),
        ("from atomictools import tool\n@tool(name='same')\ndef a(): pass\n@tool(name='same')\ndef b(): pass\n", "two tools are named 'same'"),
    ],
)
def test_bad_or_duplicate_names_are_load_errors(source: str, message: str) -> None:
    with pytest.raises(SchemaError, match=message):
        collect_tools(_module(source), "mod", "mod")


def test_a_tool_without_a_docstring_has_no_description_rather_than_its_own_name() -> None:
    def undocumented(path: str) -> str:
        return path

    def documented(path: str) -> str:
        """Read a file."""
        return path

    assert "description" not in build_tool(undocumented, "undocumented").definition()
    assert build_tool(documented, "documented").definition()["description"] == "Read a file."


def _serve_calls(tools: dict[str, Any], calls: list[tuple[str, bytes]], monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Each call's text, as the real runtime answers it on a channel of its own (in a thread, which
    ends at the channel's end instead of ending the process)."""
    import contextlib
    import socket
    import sys
    import threading

    from atomictoolsd.protocol import CallContext, CallTool, FrameReader, WorkerMessage, WorkerSpec, encode_frame
    from atomictoolsd.worker import scheduling

    monkeypatch.setattr(scheduling, "exit_worker", sys.exit)
    specs = {name: build_tool(fn, name) for name, fn in tools.items()}
    daemon_end, worker_end = socket.socketpair()
    worker = WorkerSpec(path="/t/tools.py", threads=2, memory_limit=0, truncate_lines=2000, truncate_bytes=50000,
                        max_result_bytes=1 << 20)
    runtime = scheduling.Runtime(worker_end, specs, worker)

    def serve() -> None:
        with contextlib.suppress(SystemExit):  # the channel's end
            runtime.run()

    reading = threading.Thread(target=serve, daemon=True)
    reading.start()
    reader = FrameReader(1 << 20, WorkerMessage)
    texts = []
    for call_id, (name, arguments) in enumerate(calls, 1):
        daemon_end.sendall(encode_frame(CallTool(call_id, name, arguments, CallContext() if call_id == 1 else None, False)))
        messages: list[Any] = []
        while not messages:
            messages = reader.feed(daemon_end.recv(65536))
        texts.append(json.loads(messages[0].result)["content"][0]["text"])
    daemon_end.close()
    reading.join(5)
    worker_end.close()
    return texts


def test_arguments_reach_each_parameter_whether_passed_by_position_or_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    def plain(a: int, b: str = "b", c: float = 1.5) -> str:
        return f"{a}|{b}|{c}"

    def keyword_only(a: int, *, b: str = "b", c: float = 1.5) -> str:
        return f"{a}|{b}|{c}"

    def with_ctx(a: int, ctx: Context, b: str = "b") -> str:
        return f"{a}|{b}|{type(ctx).__name__}"

    def by_name_only(fn: Any) -> Any:  # a decorator whose wrapper takes keywords only
        @functools.wraps(fn)
        def wrapper(**arguments: Any) -> Any:
            return fn(**arguments)
        return wrapper

    @by_name_only
    def wrapped(a: int, b: str = "b") -> str:
        return f"{a}|{b}"

    tools = {"plain": plain, "keyword_only": keyword_only, "with_ctx": with_ctx, "wrapped": wrapped}
    assert [build_tool(fn, name).positional for name, fn in tools.items()] == [True, False, False, False]
    texts = _serve_calls(tools, [
        ("plain", b'{"a":1}'), ("plain", b'{"c":2.5,"a":2,"b":"x"}'),
        ("keyword_only", b'{"a":3,"c":0.5}'), ("with_ctx", b'{"b":"y","a":4}'), ("wrapped", b'{"a":5}'),
    ], monkeypatch)
    assert texts == ["1|b|1.5", "2|x|2.5", "3|b|0.5", "4|y|Context", "5|b"]
