"""Read a declarative tool file (``*.json`` in a tools dir) into the tools a worker serves.

The file::

    {"name": "my-tools", "version": "1.0.0",
     "tools": [{"name": "...", "description": "...", "inputSchema": {...}, "handler": {"type": ...}}]}

is decoded by msgspec: the file as a ``ToolFile``, then each of its tools as a ``Tool``, whose
``handler`` is the tagged union of the handler kinds (``KINDS``: one Struct per kind, each in its
module). A file that is not JSON, or has no ``tools`` array, fails to load as a whole
(``LoadFailure``); a top-level key it does not know, or of the wrong type, is a problem and ignored.
A tool that is malformed (a bad name, a missing description, an unknown handler type, a schema that
does not compile, a placeholder the schema does not declare, …) is skipped with a problem naming the
tool, its line when it can be found, and what is wrong (msgspec's message, where it is in the file,
and what the key should hold); the file's other tools still load.

Runs inside a worker: nothing here may import the daemon's server side.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Union

import msgspec

from atomictools._authoring import ANNOTATION_KEYS, Context
from atomictools._jsonschema import inline_refs
from atomictools._protocol import WRITTEN_SCHEMA, check_tool_name
from atomictoolsd.protocol import NEEDS_TRUSTED_DIRECTORY, LoadFailure
from atomictoolsd.worker.declarative.file_read import FileReadHandler
from atomictoolsd.worker.declarative.handler import Handler
from atomictoolsd.worker.declarative.http_request import HttpHandler
from atomictoolsd.worker.declarative.shell import ShellHandler
from atomictoolsd.worker.declarative.templates import TemplateError
from atomictoolsd.worker.declarative.validation import SchemaProblem, compile_schema
from atomictoolsd.worker.portable import schema_problems, type_enums
from atomictoolsd.worker.schema import ToolSpec
from atomictoolsd.worker.sourceload import ContentRefused, check_writers, note_read

__all__ = ["KINDS", "MAX_FILE_BYTES", "DeclarativeSpec", "Tool", "ToolFile", "load_file"]

MAX_FILE_BYTES = 1024 * 1024
# The handler kinds, by the ``type`` a file names: a new kind is one module and one entry here.
KINDS: dict[str, type[Handler]] = {
    kind.__struct_config__.tag: kind for kind in (ShellHandler, HttpHandler, FileReadHandler)  # type: ignore[misc]
}
AnyHandler = Union[tuple(KINDS.values())]  # type: ignore[valid-type]  # noqa: UP007 - built from KINDS
TOO_DEEP = "the file nests arrays or objects too deep to be read"
TIMEOUT_MARGIN = 5.0  # seconds the daemon waits past a handler's own timeout, so the handler's message wins

_decode = msgspec.json.Decoder().decode


class ToolProblem(Exception):
    """One tool of a file cannot be served; the message says what is wrong."""


class ToolFile(msgspec.Struct, forbid_unknown_fields=True):
    """The file. Each tool stays undecoded here (``Raw``) and is decoded on its own (``Tool``), so
    that a malformed tool is skipped and the others load."""

    tools: list[msgspec.Raw]
    name: str = ""
    version: str = ""
    description: str = ""
    schema: str = msgspec.field(default="", name="$schema")


class _Tools(msgspec.Struct):
    """The file's tools alone: how a file whose other keys are wrong is read."""

    tools: list[msgspec.Raw]


class Tool(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    """One tool of the file."""

    name: Annotated[str, msgspec.Meta(description="letters, digits, '_' and '-', at most 64 characters")]
    description: Annotated[str, msgspec.Meta(description="what the model reads to choose the tool")]
    handler: AnyHandler
    title: str | None = None
    input_schema: Annotated[
        dict[str, Any] | None, msgspec.Meta(description='a JSON Schema object with "type": "object"')
    ] = None
    annotations: Annotated[
        dict[str, Any] | None, msgspec.Meta(description=f"an object with keys among {', '.join(sorted(ANNOTATION_KEYS))}")
    ] = None

    def __post_init__(self) -> None:
        problem = check_tool_name(self.name)
        if problem:
            raise ToolProblem(problem)
        if not self.description.strip():
            raise ToolProblem("description must be a non-empty string (the model reads it to choose the tool)")
        if self.annotations is not None and not set(self.annotations) <= ANNOTATION_KEYS:
            raise ToolProblem(f"annotations must be an object with keys among {', '.join(sorted(ANNOTATION_KEYS))}")


_read_file = msgspec.json.Decoder(ToolFile).decode
_read_tools = msgspec.json.Decoder(_Tools).decode
_read_tool = msgspec.json.Decoder(Tool).decode


@dataclass
class DeclarativeSpec(ToolSpec):
    """A tool from a JSON file: arguments are checked against its JSON Schema, then passed as one dict."""

    validate: Callable[[Any], Any] | None = None
    # The schema as the file wrote it, when that differs from the portable one served by default
    # ($defs/$ref inlined, enums typed): clients that take JSON Schema 2020-12 whole get it as written.
    written_schema: dict[str, Any] | None = None
    needs_trusted_directory: str | None = None  # see ``Handler.needs_trusted_directory``

    def definition(self) -> dict[str, Any]:
        out = super().definition()
        if self.written_schema is not None:
            out[WRITTEN_SCHEMA] = self.written_schema
        if self.needs_trusted_directory is not None:
            out[NEEDS_TRUSTED_DIRECTORY] = self.needs_trusted_directory
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
    raw = _read_bytes(path)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise LoadFailure(path, None, f"the file is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    tools, problems = _decode_file(path, raw, text)
    if not tools:
        raise LoadFailure(path, None, 'the "tools" array is empty')
    specs: list[ToolSpec] = []
    names: list[str | None] = []
    seen: dict[str, int] = {}
    skipped: list[tuple[int, str]] = []
    for index, entry in enumerate(tools):
        name, outcome = _build_entry(index, entry, seen)
        names.append(name)
        if isinstance(outcome, str):
            skipped.append((index, outcome))
            continue
        seen[outcome.name] = index
        specs.append(outcome)
    lines = _tool_lines(text, names)
    for index, message in skipped:
        problems.append({"tool": names[index] or f"tools[{index}]", "line": lines[index], "message": message})
    return specs, problems


def _build_entry(index: int, entry: msgspec.Raw, seen: dict[str, int]) -> tuple[str | None, DeclarativeSpec | str]:
    """The name tool ``index`` gives itself (None: none), and its spec or what is wrong with it."""
    name = None
    try:
        tool = _read_tool(entry)
        name = tool.name
        spec = build_tool(tool)
        if name in seen:
            raise ToolProblem(f"tools[{seen[name]}] already has this name; this one is skipped")
        return name, spec
    except (ToolProblem, TemplateError, msgspec.ValidationError) as exc:
        return name or _entry_name(entry), _explain(exc, index, entry)
    except RecursionError:
        return name, "the tool nests arrays or objects too deep to be read"


def _read_bytes(path: str) -> bytes:
    """The file's bytes, once its writers and its content may be read. Raises ``LoadFailure``."""
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
    return raw


def _decode_file(path: str, raw: bytes, text: str) -> tuple[list[msgspec.Raw], list[dict[str, Any]]]:
    """The file's tools, each undecoded, and the problems of its other keys (ignored).

    Raises:
        LoadFailure: the file is not JSON, or not an object with a ``tools`` array.
    """
    try:
        return _read_file(raw).tools, []
    except msgspec.ValidationError:
        pass  # below: its tools alone, and what is wrong with its other keys
    except msgspec.DecodeError as exc:
        raise _not_json(path, text, exc) from None
    except RecursionError:
        raise LoadFailure(path, None, TOO_DEEP) from None
    try:
        tools = _read_tools(raw).tools
        others = _top_level_problems(raw)
    except msgspec.ValidationError:
        raise LoadFailure(
            path, None, 'expected a JSON object with a "tools" array: {"name": …, "version": …, "tools": [ … ]}'
        ) from None
    except RecursionError:
        raise LoadFailure(path, None, TOO_DEEP) from None
    return tools, [{"tool": None, "line": None, "message": message} for message in others]


def _not_json(path: str, text: str, exc: msgspec.DecodeError) -> LoadFailure:
    """What is wrong with a file msgspec cannot read as JSON: as Python's parser says it, whose
    messages name the line and the column."""
    try:
        json.loads(text)
    except json.JSONDecodeError as error:
        return LoadFailure(path, error.lineno, f"not valid JSON: {error.msg} (line {error.lineno}, column {error.colno})")
    except RecursionError:
        pass
    at = re.search(r"\(byte (\d+)\)", str(exc))  # msgspec's place: where Python's reading differs (NaN)
    line = text.encode().count(b"\n", 0, int(at.group(1))) + 1 if at else None
    return LoadFailure(path, line, f"not valid JSON: {exc}" + (f" (line {line})" if line else ""))


def _top_level_problems(raw: bytes) -> list[str]:
    """Each top-level key that is not ``ToolFile``'s, or does not hold what it should."""
    fields = {field.encode_name: field.type for field in msgspec.structs.fields(ToolFile) if field.name != "tools"}
    problems = []
    for key, value in _decode(raw).items():
        if key == "tools":
            continue
        if key not in fields:
            problems.append(f"unknown top-level key {key!r} (ignored){_hint(key, [*fields, 'tools'])}")
            continue
        try:
            msgspec.convert(value, fields[key])
        except msgspec.ValidationError as exc:
            problems.append(f"{exc} - at `$.{key}` (ignored)")
    return problems


def _entry_name(entry: msgspec.Raw) -> str | None:
    """The name a tool that could not be decoded gives itself, if any."""
    try:
        data = _decode(entry)
    except (msgspec.DecodeError, RecursionError):
        return None
    name = data.get("name") if isinstance(data, dict) else None
    return name if isinstance(name, str) and name else None


def build_tool(tool: Tool) -> DeclarativeSpec:
    """The spec of one decoded tool: its schema checked against its handler. Raises ``ToolProblem``."""
    handler = tool.handler
    schema = tool.input_schema
    if schema is None:
        schema = handler.derived_schema()
    elif schema.get("type") != "object":
        raise ToolProblem('inputSchema must be a JSON Schema object with "type": "object"')
    properties = schema.get("properties", {})
    if not isinstance(properties, dict):
        raise ToolProblem("inputSchema.properties must be an object")
    for param in handler.params:
        if param not in properties:
            raise ToolProblem(handler.undeclared(param))
    try:
        validate = compile_schema(schema)
    except SchemaProblem as exc:
        raise ToolProblem(str(exc)) from None
    served = type_enums(inline_refs(copy.deepcopy(schema)))
    problems = schema_problems(served)
    if problems:
        raise ToolProblem(f"inputSchema: {'; '.join(problems)}: some agents (Gemini) refuse such a schema")
    handler.check_schema(served)  # where a template needs a value the schema constrains (shell)
    annotations = tool.annotations if tool.annotations is not None else handler.default_annotations()
    name = tool.name

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
        description=tool.description,
        title=tool.title,
        timeout=handler.seconds + TIMEOUT_MARGIN if handler.seconds is not None else None,
        annotations=annotations or None,
        validate=validate,
        written_schema=schema if served != schema else None,
        needs_trusted_directory=handler.needs_trusted_directory,
    )


def _explain(exc: Exception, index: int, entry: msgspec.Raw) -> str:
    """The message of a tool that cannot be served. msgspec's says what it expected where; the
    path is given from the file's root (``$.tools[1].handler.timeout``), and what the key should
    hold is added (its field's description, or the keys there may be)."""
    if not isinstance(exc, msgspec.ValidationError):
        return str(exc)
    what, at, where = str(exc).rpartition(" - at `$")  # the path is last: a value quoted before it may hold anything
    what, where = (what, where.rstrip("`")) if at else (where, "")
    path = re.sub(r"\[[^]]*\]", "", where).split(".")[1:]  # the keys down to the wrong value, without indexes
    field = re.fullmatch(r"Object (contains unknown|missing required) field `(.+)`", what)
    if field is not None:  # about the object at the path: a key it may not have, or lacks
        owner = _struct_at(path, entry)
        unknown = field.group(1) == "contains unknown"
        hint = (_hint(field.group(2), _keys(owner)) if owner else "") if unknown else _describe(owner, field.group(2))
    elif path:
        hint = _describe(_struct_at(path[:-1], entry), path[-1])
    else:
        hint = f" (a tool is {_shape(Tool)})"
    return f"{what} - at `$.tools[{index}]{where}`{hint}"


def _struct_at(path: list[str], entry: msgspec.Raw) -> type[msgspec.Struct] | None:
    """The Struct that decodes the object at ``path`` in a tool (a handler: the kind the tool
    names); None where none does, or the kind is unknown."""
    if not path:
        return Tool
    if path != ["handler"]:
        return None
    try:
        handler = _decode(entry).get("handler")
    except (msgspec.DecodeError, RecursionError):
        return None
    kind = handler.get("type") if isinstance(handler, dict) else None
    return KINDS.get(kind) if isinstance(kind, str) else None


def _keys(owner: type[msgspec.Struct]) -> list[str]:
    keys = [field.encode_name for field in msgspec.structs.fields(owner)]
    return ["type", *keys] if issubclass(owner, Handler) else keys


def _shape(owner: type[msgspec.Struct]) -> str:
    """``an object with keys a, b; and optionally c``."""
    fields = msgspec.structs.fields(owner)
    required = [f.encode_name for f in fields if f.required]
    optional = [f.encode_name for f in fields if not f.required]
    return f"an object with keys {', '.join(required)}" + (f"; and optionally {', '.join(optional)}" if optional else "")


def _describe(owner: type[msgspec.Struct] | None, key: str) -> str:
    """`` (key: what it holds)``, from the field's description; the kinds for a handler's type."""
    if key in ("handler", "type") and (owner is Tool or owner is None or issubclass(owner, Handler)):
        return f' (a handler is an object whose "type" is one of {", ".join(KINDS)})'
    for field in msgspec.structs.fields(owner) if owner is not None else ():
        if field.encode_name == key:
            notes = [m.description for m in getattr(field.type, "__metadata__", ()) if isinstance(m, msgspec.Meta)]
            return f" ({key}: {notes[0]})" if notes and notes[0] else ""
    return ""


def _hint(key: str, known: Any) -> str:
    import difflib  # lazy: only on this error path

    close = difflib.get_close_matches(key, list(known), n=1)
    return f"; did you mean {close[0]!r}?" if close else f"; known keys: {', '.join(sorted(known))}"


def _tool_lines(text: str, names: list[str | None]) -> list[int | None]:
    """Best effort: the line of each tool's ``"name"`` in the file, for error messages."""
    lines: list[int | None] = []
    position = max(text.find('"tools"'), 0)
    for name in names:
        match = None
        if name is not None:
            match = re.compile(r'"name"\s*:\s*' + re.escape(json.dumps(name))).search(text, position)
        if match is None:
            lines.append(None)
            continue
        lines.append(text.count("\n", 0, match.start()) + 1)
        position = match.end()
    return lines
