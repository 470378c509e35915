"""Read a declarative tool file (``*.json`` in a tools dir) into the tools a worker serves.

The file::

    {"name": "my-tools", "version": "1.0.0",
     "tools": [{"name": "...", "description": "...", "inputSchema": {...}, "handler": {"type": ...}}]}

A file that is not JSON, or has no ``tools`` array, fails to load as a whole (``LoadFailure``). A tool
that is malformed (a bad name, a missing description, an unknown handler type, a schema that does not
compile, a placeholder the schema does not declare, …) is skipped with a problem naming the tool,
its line when it can be found, and what is wrong; the file's other tools still load.

Runs inside a worker: nothing here may import the daemon's server side.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from atomictools._authoring import ANNOTATION_KEYS, Context
from atomictools._jsonschema import inline_refs
from atomictools._protocol import WRITTEN_SCHEMA, check_tool_name
from atomictoolsd.declarative.file_read import FileReadHandler, default_schema
from atomictoolsd.declarative.http_request import HttpHandler
from atomictoolsd.declarative.shell import ShellHandler
from atomictoolsd.declarative.templates import TemplateError
from atomictoolsd.declarative.validation import SchemaProblem, compile_schema
from atomictoolsd.workers.protocol import LoadFailure
from atomictoolsd.workers.runtime.portable import schema_problems, type_enums
from atomictoolsd.workers.runtime.schema import ToolSpec
from atomictoolsd.workers.runtime.sourceload import ContentRefused, check_writers, note_read

__all__ = ["DeclarativeSpec", "HANDLERS", "MAX_FILE_BYTES", "load_file"]

MAX_FILE_BYTES = 1024 * 1024
HANDLERS: dict[str, Any] = {"shell": ShellHandler, "http": HttpHandler, "file-read": FileReadHandler}
FILE_KEYS = ("$schema", "name", "version", "description", "tools")
TOOL_KEYS = ("name", "title", "description", "inputSchema", "handler", "annotations")
TIMEOUT_MARGIN = 5.0  # seconds the daemon waits past a handler's own timeout, so the handler's message wins

_decode = msgspec.json.Decoder().decode


class ToolProblem(Exception):
    """One tool of a file cannot be served; the message says what is wrong."""


@dataclass
class DeclarativeSpec(ToolSpec):
    """A tool from a JSON file: arguments are checked against its JSON Schema, then passed as one dict."""

    validate: Callable[[Any], Any] | None = None
    # The schema as the file wrote it, when that differs from the portable one served by default
    # ($defs/$ref inlined, enums typed): clients that take JSON Schema 2020-12 whole get it as written.
    written_schema: dict[str, Any] | None = None

    def definition(self) -> dict[str, Any]:
        out = super().definition()
        if self.written_schema is not None:
            out[WRITTEN_SCHEMA] = self.written_schema
        return out

    def parse_arguments(self, raw: bytes) -> dict[str, Any]:
        arguments = _decode(raw)
        if not isinstance(arguments, dict):
            raise msgspec.ValidationError(f"Expected `object`, got `{type(arguments).__name__}`")
        assert self.validate is not None
        try:
            arguments = self.validate(arguments)
        except ValueError as exc:
            raise msgspec.ValidationError(str(exc)) from None
        return {"args": arguments}


def load_file(path: str) -> tuple[list[ToolSpec], list[dict[str, Any]]]:
    """The tools of a declarative file, and the problems of the tools that were skipped.

    Raises:
        LoadFailure: the file cannot be read, is not JSON, or has no ``tools`` array.
    """
    try:
        check_writers(path)
    except PermissionError as exc:
        raise LoadFailure(path, None, str(exc)) from None
    except OSError:
        pass  # reading it says what is wrong
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise LoadFailure(path, None, f"cannot read the file: {exc.strerror}") from None
    try:
        note_read(path, raw)
    except ContentRefused as exc:
        raise LoadFailure(path, None, str(exc)) from None
    if len(raw) > MAX_FILE_BYTES:
        raise LoadFailure(path, None, f"the file is larger than {MAX_FILE_BYTES} bytes")
    try:
        text = raw.decode("utf-8")
        data = json.loads(text)
    except UnicodeDecodeError as exc:
        raise LoadFailure(path, None, f"the file is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise LoadFailure(
            path, exc.lineno, f"not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
        ) from None
    if not isinstance(data, dict) or not isinstance(data.get("tools"), list):
        raise LoadFailure(
            path, None, 'expected a JSON object with a "tools" array: {"name": …, "version": …, "tools": [ … ]}'
        )
    if not data["tools"]:
        raise LoadFailure(path, None, 'the "tools" array is empty')

    problems: list[dict[str, Any]] = []
    for key in data:
        if key not in FILE_KEYS:
            problems.append({"tool": None, "line": None, "message": f"unknown top-level key {key!r} (ignored){_hint(key, FILE_KEYS)}"})
    for key in ("name", "version", "description"):
        if key in data and not isinstance(data[key], str):
            problems.append({"tool": None, "line": None, "message": f"top-level {key!r} must be a string"})

    lines = _tool_lines(text, data["tools"])
    specs: list[ToolSpec] = []
    seen: dict[str, int] = {}
    for index, entry in enumerate(data["tools"]):
        name = entry.get("name") if isinstance(entry, dict) else None
        label = name if isinstance(name, str) and name else f"tools[{index}]"
        try:
            spec = build_tool(entry)
            if spec.name in seen:
                raise ToolProblem(f"tools[{seen[spec.name]}] already has this name; this one is skipped")
        except ToolProblem as exc:
            problems.append({"tool": label, "line": lines[index], "message": str(exc)})
            continue
        seen[spec.name] = index
        specs.append(spec)
    return specs, problems


def build_tool(entry: Any) -> DeclarativeSpec:
    """Build one tool from its entry in a file. Raises ``ToolProblem``."""
    if not isinstance(entry, dict):
        raise ToolProblem("a tool must be an object with name, description, inputSchema and handler")
    for key in entry:
        if key not in TOOL_KEYS:
            raise ToolProblem(f"unknown key {key!r}{_hint(key, TOOL_KEYS)}")
    name = entry.get("name")
    if not isinstance(name, str):
        raise ToolProblem("name must be a string")
    problem = check_tool_name(name)
    if problem:
        raise ToolProblem(problem)
    description = entry.get("description")
    if not isinstance(description, str) or not description.strip():
        raise ToolProblem("description must be a non-empty string (the model reads it to choose the tool)")
    title = entry.get("title")
    if title is not None and not isinstance(title, str):
        raise ToolProblem("title must be a string")

    handler_def = entry.get("handler")
    if not isinstance(handler_def, dict):
        raise ToolProblem('handler must be an object with a "type"')
    kind = handler_def.get("type")
    handler_class = HANDLERS.get(kind) if isinstance(kind, str) else None
    if handler_class is None:
        raise ToolProblem(f"handler.type must be one of {', '.join(HANDLERS)}; got {kind!r}")
    for key in handler_def:
        if key not in handler_class.KEYS:
            raise ToolProblem(f"unknown key handler.{key} for a {kind} handler{_hint(key, handler_class.KEYS)}")
    try:
        handler = handler_class(handler_def)
    except TemplateError as exc:
        raise ToolProblem(str(exc)) from None

    schema = entry.get("inputSchema")
    if schema is None:
        schema = _derived_schema(handler)
    elif not isinstance(schema, dict) or schema.get("type") != "object":
        raise ToolProblem('inputSchema must be a JSON Schema object with "type": "object"')
    properties = schema.get("properties", {})
    if not isinstance(properties, dict):
        raise ToolProblem("inputSchema.properties must be an object")
    for param in handler.params:
        if param not in properties:
            what = "the handler reads argument" if kind == "file-read" else "the handler uses"
            shown = param if kind == "file-read" else f"{{{{{param}}}}}"
            raise ToolProblem(f"{what} {shown} but inputSchema.properties does not declare {param!r}")
    try:
        validate = compile_schema(schema)
    except SchemaProblem as exc:
        raise ToolProblem(str(exc)) from None
    served = type_enums(inline_refs(copy.deepcopy(schema)))
    problems = schema_problems(served)
    if problems:
        raise ToolProblem(f"inputSchema: {'; '.join(problems)}: some agents (Gemini) refuse such a schema")
    check_schema = getattr(handler, "check_schema", None)
    if check_schema is not None:
        try:
            check_schema(served)  # where a template needs a value the schema constrains (shell)
        except TemplateError as exc:
            raise ToolProblem(str(exc)) from None

    annotations = entry.get("annotations")
    if annotations is None:
        annotations = _default_annotations(handler)
    elif not isinstance(annotations, dict) or not set(annotations) <= ANNOTATION_KEYS:
        raise ToolProblem(f"annotations must be an object with keys among {', '.join(sorted(ANNOTATION_KEYS))}")

    timeout = getattr(handler, "timeout", None)

    def call(args: dict[str, Any], ctx: Context) -> str:
        return handler(name, args, ctx)

    return DeclarativeSpec(
        name=name,
        fn=call,
        is_async=False,
        param_names=("args",),
        context_param="ctx",
        decoder=msgspec.json.Decoder(),
        input_schema=served,
        description=description,
        title=title,
        timeout=timeout + TIMEOUT_MARGIN if timeout is not None else None,
        annotations=annotations or None,
        validate=validate,
        written_schema=schema if served != schema else None,
    )


def _derived_schema(handler: Any) -> dict[str, Any]:
    """The schema of a tool whose file gives none: its placeholders, as required strings."""
    if isinstance(handler, FileReadHandler):
        return default_schema(handler.base)
    return {
        "type": "object",
        "properties": {p: {"type": "string"} for p in handler.params},
        "required": list(handler.params),
        "additionalProperties": False,
    }


def _default_annotations(handler: Any) -> dict[str, Any]:
    if isinstance(handler, FileReadHandler):
        return {"readOnlyHint": True}
    if isinstance(handler, HttpHandler):
        return {"openWorldHint": True, **({"readOnlyHint": True} if handler.method == "GET" else {})}
    return {}


def _hint(key: str, known: Any) -> str:
    import difflib  # lazy: only on this error path

    close = difflib.get_close_matches(key, list(known), n=1)
    return f"; did you mean {close[0]!r}?" if close else f"; known keys: {', '.join(sorted(known))}"


def _tool_lines(text: str, tools: list[Any]) -> list[int | None]:
    """Best effort: the line of each tool's ``"name"`` in the file, for error messages."""
    lines: list[int | None] = []
    position = max(text.find('"tools"'), 0)
    for entry in tools:
        name = entry.get("name") if isinstance(entry, Mapping) else None
        match = None
        if isinstance(name, str):
            match = re.compile(r'"name"\s*:\s*' + re.escape(json.dumps(name))).search(text, position)
        if match is None:
            lines.append(None)
            continue
        lines.append(text.count("\n", 0, match.start()) + 1)
        position = match.end()
    return lines
