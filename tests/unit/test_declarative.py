"""Declarative tool files without a daemon: the loader's checks, templates, URLs, confined reads."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from atomictools import ToolError
from atomictoolsd.protocol import LoadFailure
from atomictoolsd.worker.declarative.file_read import read_inside
from atomictoolsd.worker.declarative.http_request import HttpHandler
from atomictoolsd.worker.declarative.loader import load_file
from atomictoolsd.worker.declarative.shell import ShellHandler
from atomictoolsd.worker.declarative.templates import TemplateError, ValueRejected, value_text


def write(tmp_path: Path, data: Any, name: str = "t.json") -> str:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


def tool(**fields: Any) -> dict[str, Any]:
    base = {"name": "t", "description": "d", "handler": {"type": "shell", "command": "true"}}
    return {**base, **fields}


# -- whole files --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        ('{"tools": [\n  {"name": "x",}\n]}', 2, "not valid JSON: Expecting property name enclosed in double quotes (line 2, column 16)"),
        ("[1, 2]", None, 'expected a JSON object with a "tools" array'),
        ('{"tool": []}', None, 'expected a JSON object with a "tools" array'),
        ('{"tools": []}', None, 'the "tools" array is empty'),
    ],
)
def test_a_file_that_cannot_be_used_fails_whole(tmp_path: Path, text: str, line: int | None, message: str) -> None:
    with pytest.raises(LoadFailure) as info:
        load_file(write(tmp_path, text))
    assert info.value.info["line"] == line
    assert info.value.info["message"].startswith(message)


def test_a_file_that_is_not_utf8_or_too_large_fails_whole(tmp_path: Path) -> None:
    (tmp_path / "bin.json").write_bytes(b'{"tools": "\xff"}')
    with pytest.raises(LoadFailure, match="not UTF-8"):
        load_file(str(tmp_path / "bin.json"))
    (tmp_path / "big.json").write_bytes(b" " * (1024 * 1024 + 1))
    with pytest.raises(LoadFailure, match="larger than 1048576 bytes"):
        load_file(str(tmp_path / "big.json"))


def test_nesting_too_deep_to_read_fails_the_file_or_skips_the_tool(tmp_path: Path) -> None:
    deep = "[" * 100_000 + "]" * 100_000
    with pytest.raises(LoadFailure, match="nests arrays or objects too deep to be read"):
        load_file(write(tmp_path, '{"x": ' + deep + ', "tools": [' + json.dumps(tool()) + "]}"))
    nested = '{"a": ' * 400 + "1" + "}" * 400
    deep_default = tool(name="deep", inputSchema={"type": "object", "properties": {"x": {"type": "object", "default": 0}}})
    text = json.dumps({"tools": [deep_default, tool(name="good")]}).replace('"default": 0', '"default": ' + nested)
    specs, problems = load_file(write(tmp_path, text))
    assert [s.name for s in specs] == ["good"]
    assert [p["tool"] for p in problems] == ["deep"]


def test_what_only_pythons_json_reads_fails_the_file_with_its_line(tmp_path: Path) -> None:
    with pytest.raises(LoadFailure) as info:
        load_file(write(tmp_path, '{"tools": [\n' + json.dumps(tool()).replace('"true"', '"true", "timeout": NaN') + "]}"))
    assert info.value.info["line"] == 2
    assert info.value.info["message"].startswith("not valid JSON: JSON is malformed: invalid character (byte ")


# -- tools --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("just a string", "Expected `object`, got `str` - at `$.tools[1]` (a tool is an object with keys name, description, "
                          "handler; and optionally title, inputSchema, annotations)"),
        (tool(name=7), "Expected `str`, got `int` - at `$.tools[1].name`"),
        (tool(name="a.b"), "tool name 'a.b' may contain only letters, digits, '_' and '-'"),
        (tool(name="x" * 65), "is 65 characters long; the limit is 64"),
        (tool(description=""), "description must be a non-empty string"),
        (tool(inputschema={}), "Object contains unknown field `inputschema` - at `$.tools[1]`; did you mean 'inputSchema'?"),
        (tool(handler="echo"), 'Expected `object`, got `str` - at `$.tools[1].handler` (a handler is an object whose "type" is '
                               "one of shell, http, file-read)"),
        (tool(handler={"type": "python"}), "Invalid value 'python' - at `$.tools[1].handler.type` (a handler is an object "
                                           'whose "type" is one of shell, http, file-read)'),
        (tool(handler={"description": "x"}), "Object missing required field `type` - at `$.tools[1].handler` (a handler is"),
        (tool(handler={"type": "shell"}), "Object missing required field `command` - at `$.tools[1].handler` (command: "),
        (tool(handler={"type": "shell", "command": " "}), "handler.command must be a non-empty string"),
        (tool(handler={"type": "shell", "command": "echo 'unbalanced"}), "handler.command cannot be split into words"),
        (tool(handler={"type": "shell", "command": "{{prog}} x"}), "must start with a fixed program name"),
        (tool(handler={"type": "shell", "command": "x", "timeout": 0}),
         "Expected `float` >= 1.0 - at `$.tools[1].handler.timeout` (timeout: milliseconds, from 1 to 3600000)"),
        (tool(handler={"type": "shell", "command": "x", "timeout": "30s"}),
         "Expected `float`, got `str` - at `$.tools[1].handler.timeout` (timeout: milliseconds, from 1 to 3600000)"),
        (tool(handler={"type": "shell", "command": "x", "okExitCodes": [0, 256]}),
         "Expected `int` <= 255 - at `$.tools[1].handler.okExitCodes[1]` (okExitCodes: a non-empty list of exit codes"),
        (tool(handler={"type": "shell", "command": "x", "cwd": "{{dir}}"}), "handler.cwd must be a path without"),
        (tool(handler={"type": "shell", "command": "x", "env": {}}),
         "Object contains unknown field `env` - at `$.tools[1].handler`; known keys: command, cwd, okExitCodes, timeout, "
         "type, unsafeFreeText"),
        (tool(handler={"type": "http", "url": "ftp://h/{{x}}"}), "handler.url must be an http or https URL, not 'ftp'"),
        (tool(handler={"type": "http", "url": "/relative"}), "handler.url must be an http or https URL, not 'a relative URL'"),
        (tool(handler={"type": "http", "url": "http://h", "method": "DELETE"}), "handler.method must be one of GET, POST, PUT"),
        (tool(handler={"type": "http", "url": "http://h", "headers": {"Bad: x": "y"}}), "is not a valid header name"),
        (tool(handler={"type": "http", "url": "http://h", "headers": {"X": 1}}),
         "Expected `str`, got `int` - at `$.tools[1].handler.headers[...]` (headers: an object of strings)"),
        (tool(handler={"type": "file-read"}), "Object missing required field `basePath` - at `$.tools[1].handler` (basePath: "
                                              "the directory files are read from"),
        (tool(handler={"type": "file-read", "basePath": ""}), "handler.basePath must be a non-empty string"),
        (tool(handler={"type": "file-read", "basePath": ".", "maxSize": -1}),
         "Expected `int` >= 1 - at `$.tools[1].handler.maxSize` (maxSize: a positive whole number of bytes)"),
        (tool(inputSchema={"type": "array"}), 'inputSchema must be a JSON Schema object with "type": "object"'),
        (tool(inputSchema={"type": "object", "properties": []}), "inputSchema.properties must be an object"),
        (tool(inputSchema={"type": "object", "properties": {"a": {"pattern": "("}}}), "inputSchema is not a valid JSON Schema"),
        (tool(inputSchema={"type": "object", "properties": {"a": {"$ref": "https://example.com/s.json"}}}),
         "remote references are not fetched"),
        (tool(handler={"type": "shell", "command": "echo {{a}}"}, inputSchema={"type": "object"}),
         "the handler uses {{a}} but inputSchema.properties does not declare 'a'"),
        (tool(handler={"type": "file-read", "basePath": "."}, inputSchema={"type": "object", "properties": {"p": {}}}),
         "the handler reads argument path but inputSchema.properties does not declare 'path'"),
        (tool(annotations={"readOnly": True}), "annotations must be an object with keys among"),
    ],
)
def test_a_malformed_tool_is_skipped_with_what_is_wrong(tmp_path: Path, entry: Any, message: str) -> None:
    good = tool(name="good")
    specs, problems = load_file(write(tmp_path, {"tools": [good, entry]}))
    assert [s.name for s in specs] == ["good"], "the file's other tools still load"
    assert len(problems) == 1
    assert message in problems[0]["message"]
    expected = entry.get("name") if isinstance(entry, dict) and isinstance(entry.get("name"), str) else "tools[1]"
    assert problems[0]["tool"] == expected


def test_unknown_top_level_keys_are_reported_but_harmless(tmp_path: Path) -> None:
    specs, problems = load_file(write(tmp_path, {"name": "n", "version": 2, "tols": [], "tools": [tool()]}))
    assert [s.name for s in specs] == ["t"]
    assert [p["message"] for p in problems] == [
        "Expected `str`, got `int` - at `$.version` (ignored)",
        "unknown top-level key 'tols' (ignored); did you mean 'tools'?",
    ]


def test_schema_is_derived_from_placeholders_and_defaults_fill_in(tmp_path: Path) -> None:
    specs, problems = load_file(write(tmp_path, {"tools": [
        tool(name="a", handler={"type": "shell", "command": "grep -- {{pattern}} {{dir}}"}),
        tool(name="b", handler={"type": "shell", "command": "ls {{dir}}"},
             inputSchema={"type": "object", "properties": {"dir": {"type": "string", "default": "."}}}),
    ]}))
    assert problems == []
    assert specs[0].input_schema == {
        "type": "object", "properties": {"pattern": {"type": "string"}, "dir": {"type": "string"}},
        "required": ["pattern", "dir"], "additionalProperties": False,
    }
    assert specs[1].parse_arguments(b"{}") == {"args": {"dir": "."}}
    with pytest.raises(msgspec.ValidationError, match="Expected `object`"):
        specs[1].parse_arguments(b"[1]")
    with pytest.raises(msgspec.ValidationError, match=r"\$.dir must be string"):
        specs[1].parse_arguments(b'{"dir": 1}')


def test_refs_are_inlined_for_clients_and_timeouts_leave_the_handler_room(tmp_path: Path) -> None:
    schema = {"type": "object", "properties": {"a": {"$ref": "#/$defs/short"}}, "$defs": {"short": {"type": "string", "maxLength": 3}}}
    specs, _ = load_file(write(tmp_path, {"tools": [tool(inputSchema=schema, handler={"type": "shell", "command": "x", "timeout": 2000})]}))
    definition = specs[0].definition()
    assert definition["inputSchema"] == {"type": "object", "properties": {"a": {"type": "string", "maxLength": 3}}}
    assert definition["timeout"] == 7.0
    with pytest.raises(msgspec.ValidationError, match="shorter than or equal to 3"):
        specs[0].parse_arguments(b'{"a": "long"}')


# -- templates ------------------------------------------------------------------------------------------


def test_shell_words_and_placeholders() -> None:
    shell = ShellHandler(command="git log '--format=%h {{fmt}}' -n {{count}} --author={{who}} -- {{paths}}")
    assert shell.params == ["fmt", "count", "who", "paths"]
    assert shell.argv("t", {"fmt": "%s", "count": 3, "who": "a b", "paths": ["x y", "z"]}) == [
        "git", "log", "--format=%h %s", "-n", "3", "--author=a b", "--", "x y", "z",
    ]
    assert shell.argv("t", {"count": 3}) == ["git", "log", "-n", "3", "--"], "words whose value is absent disappear"


@pytest.mark.parametrize(
    ("value", "text"),
    [("plain", "plain"), (True, "true"), (False, "false"), (3, "3"), (2.5, "2.5"), (None, ""), ({"a": [1]}, '{"a":[1]}')],
)
def test_value_text(value: Any, text: str) -> None:
    assert value_text("p", value) == text


def test_value_limits() -> None:
    with pytest.raises(ValueRejected, match="NUL byte"):
        value_text("p", "a\x00")
    with pytest.raises(ValueRejected, match="10001 characters long; the limit is 10000"):
        value_text("p", "x" * 10_001)
    with pytest.raises(ValueRejected, match="NUL byte"):  # each item of a list is an argument of its own
        ShellHandler(command="ls {{paths}}").argv("t", {"paths": ["ok", "a\x00"]})


def test_http_urls() -> None:
    base = HttpHandler(url="{{url}}/api/{{path}}?q={{q}}")
    assert base.build_url({"url": "https://h:8443/v1", "path": "a/b", "q": "x&y=z"}) == "https://h:8443/v1/api/a%2Fb?q=x%26y%3Dz"
    for url, message in [
        ("file:///etc/passwd", "not 'file'"),
        ("HTTP://h", None),
        ("http://user:pw@h", "credentials in the URL"),
        ("http://h x", "whitespace or control characters"),
        ("http:///nohost", "names no host"),
    ]:
        if message is None:
            assert base.build_url({"url": url, "path": "p", "q": "q"}).startswith("HTTP://h/api/p")
            continue
        with pytest.raises(ToolError, match=message):
            base.build_url({"url": url, "path": "p", "q": "q"})
    with pytest.raises(ToolError, match=r"Missing a value for \{\{path\}\}"):
        base.build_url({"url": "http://h"})
    with pytest.raises(TemplateError):
        HttpHandler(url="file:///{{x}}")


# -- confined reads -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp_path = tmp_path_factory.mktemp("confined")
    base = tmp_path / "base"
    (base / "sub").mkdir(parents=True)
    (base / "sub" / "inside.txt").write_text("inside\n")
    (tmp_path / "outside.txt").write_text("outside\n")
    (base / "out-link").symlink_to(tmp_path / "outside.txt")
    (base / "out-dir").symlink_to(tmp_path)
    (base / "in-link").symlink_to(base / "sub" / "inside.txt")
    (base / "loop").symlink_to(base / "loop")
    return base


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["..", ".", "sub", "inside.txt", "outside.txt", "out-link", "out-dir", "in-link",
                                 "loop", "base", "", "/"]), max_size=6))
def test_no_path_ever_reads_outside_the_base(tree: Path, parts: list[str]) -> None:
    path = "/".join(parts)
    try:
        text = read_inside(str(tree), path, 1024)
    except ToolError:
        return
    assert text == "inside\n"


def test_read_inside_names_the_limit(tree: Path) -> None:
    (tree / "big").write_text("x" * 11)  # a name the property test never draws
    with pytest.raises(ToolError, match="'big' is 11 bytes; the limit is 10 bytes"):
        read_inside(str(tree), "big", 10)
    assert read_inside(str(tree), "in-link", 10) == "inside\n"
    assert os.path.islink(tree / "in-link")


def test_definitions_are_valid_mcp_tools(tmp_path: Path) -> None:
    from mcp.types import Tool

    toolbox = Path(__file__).resolve().parents[2] / "examples" / "tools" / "toolbox.json"
    specs, problems = load_file(str(toolbox))
    assert problems == []
    for spec in specs:
        definition = spec.definition()
        definition.pop("timeout", None)  # the daemon's own field, never sent to clients
        tool_model = Tool.model_validate(definition)
        assert tool_model.input_schema["type"] == "object"


@pytest.mark.parametrize(("schema", "sent", "received"), [
    ({"type": "object", "properties": {"n": {"type": "integer"}}}, {"n": 2.0}, {"n": 2}),
    ({"type": "object", "additionalProperties": {"type": "integer"}}, {"a": 2.0, "b": 3.0}, {"a": 2, "b": 3}),
    ({"type": "object", "patternProperties": {"^n_": {"type": "integer"}}}, {"n_x": 2.0, "y": 2.0}, {"n_x": 2, "y": 2.0}),
    ({"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}]}, ["a", 2.0, 3.0], ["a", 2, 3.0]),
    ({"type": "array", "items": [{"type": "integer"}], "additionalItems": {"type": "integer"}}, [1.0, 2.0], [1, 2]),
    ({"allOf": [{"type": "object"}, {"properties": {"n": {"type": "integer"}}}]}, {"n": 4.0}, {"n": 4}),
    ({"type": "object", "properties": {"n": {"type": "number"}}}, {"n": 2.0}, {"n": 2.0}),
])
def test_an_integral_float_reaches_the_template_as_an_integer_wherever_the_schema_declares_one(
    schema: dict[str, Any], sent: Any, received: Any
) -> None:
    from atomictoolsd.worker.declarative.validation import compile_schema  # lazy: only this test

    result = compile_schema(schema)(sent)
    assert result == received
    assert [type(v) for v in (result.values() if isinstance(result, dict) else result)] == [
        type(v) for v in (received.values() if isinstance(received, dict) else received)
    ]
