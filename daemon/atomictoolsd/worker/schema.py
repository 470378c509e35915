"""Derive a tool's schemas and argument validator from its Python signature.

Runs inside a tool worker when a tool module loads. The input schema is JSON Schema with
``type: object``, every ``$ref`` inlined (several agents reject refs) and
``additionalProperties: false``; arguments are decoded and validated in one pass by msgspec against
a struct built from the same signature, so the schema and the validation cannot disagree. A
signature that speaks pydantic (a ``BaseModel``, ``pydantic.Field``) is built by pydantic instead
(``pydantic_schema``, imported only then), with the same portable pass over its schema.
"""

from __future__ import annotations

import inspect
import pathlib
import sys
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

import msgspec

from atomictools._authoring import Context, FieldDefault, ToolOptions
from atomictools._jsonschema import inline_refs
from atomictools._protocol import check_tool_name
from atomictoolsd.worker.portable import schema_problems, type_enums
from atomictoolsd.worker.signature import docstring_params, old_pydantic, split_annotated, uses_pydantic

__all__ = ["SchemaError", "ToolSpec", "build_tool", "collect_tools", "enc_hook", "tool_name"]


class SchemaError(Exception):
    """A tool cannot be served as written; the message says what to change."""


_asdict = msgspec.structs.asdict
_NO_OUTPUT = (str, type(None), Any, inspect.Signature.empty)


def _schema_hook(tp: Any) -> dict[str, Any]:
    if isinstance(tp, type) and issubclass(tp, pathlib.PurePath):
        return {"type": "string"}
    raise NotImplementedError


def _dec_hook(tp: Any, obj: Any) -> Any:
    if isinstance(tp, type) and issubclass(tp, pathlib.PurePath) and isinstance(obj, str):
        return tp(obj)
    raise NotImplementedError


def enc_hook(obj: Any) -> Any:
    """Encode values msgspec does not know natively (paths, sets, arbitrary objects) for results."""
    if isinstance(obj, pathlib.PurePath):
        return str(obj)
    if isinstance(obj, (set, frozenset)):
        return list(obj)
    if "pydantic" in sys.modules and old_pydantic() is None:  # a model returned without a structured annotation
        from atomictoolsd.worker import pydantic_schema  # lazy: pydantic's, for its modules only

        value = pydantic_schema.to_json(obj)
        if value is not NotImplemented:
            return value
    return repr(obj)


@dataclass
class ToolSpec:
    """One tool as a worker serves it: the function, how to call it, and its MCP definition."""

    name: str
    fn: Callable[..., Any]
    is_async: bool
    param_names: tuple[str, ...]
    context_param: str | None
    decoder: msgspec.json.Decoder
    input_schema: dict[str, Any]
    description: str
    output_schema: dict[str, Any] | None = None
    output_type: Any = None
    wrap_output: bool = False
    title: str | None = None
    timeout: float | None = None
    annotations: dict[str, Any] | None = None
    dump_output: Callable[[Any], Any] | None = None  # a pydantic result's check and dump (``pydantic_schema``)
    # Its decoded arguments can be passed by position (``msgspec.structs.astuple``): it is the
    # function itself (a wrapper may take keywords only), every parameter may be passed by position,
    # and the decoder's fields are the parameters in their order. A call by position costs a third of
    # one by keyword (which builds a dict, then binds it by name): ``Runtime.run`` does so.
    positional: bool = False

    def definition(self) -> dict[str, Any]:
        """The MCP tool object, plus the ``timeout`` the daemon enforces (not sent to clients)."""
        out: dict[str, Any] = {"name": self.name}
        if self.title:
            out["title"] = self.title
        if self.description:  # none without a docstring: a tool's own name says nothing more
            out["description"] = self.description
        out["inputSchema"] = self.input_schema
        if self.output_schema is not None:
            out["outputSchema"] = self.output_schema
        if self.annotations:
            out["annotations"] = self.annotations
        if self.timeout is not None:
            out["timeout"] = self.timeout
        return out

    def structured(self, value: Any) -> Any:
        """What a tool with an output schema returned, checked against its return annotation (as
        that type); raises ``ValueError`` or ``TypeError`` when it does not match."""
        if self.dump_output is not None:
            return self.dump_output(value)
        if isinstance(self.output_type, type) and type(value) is self.output_type:
            return value
        return msgspec.convert(value, self.output_type, from_attributes=True)

    def parse_arguments(self, raw: bytes) -> dict[str, Any]:
        """Validate JSON arguments and return keyword arguments; raises ``msgspec.ValidationError``."""
        return _asdict(self.decoder.decode(raw))  # the struct's fields are the parameters, in order


def tool_name(stem: str, function_name: str, override: str | None = None) -> str:
    """The public name: the override, else the stem for the stem-named function, else stem_func."""
    if override:
        return override
    return stem if function_name == stem else f"{stem}_{function_name}"


def _no_tools_message(namespace: dict[str, Any], module_name: str, stem: str) -> str:
    """Why a module has no tools, and the one change that gives it one."""
    found = sorted(
        name for name, obj in namespace.items()
        if inspect.isfunction(obj) and obj.__module__ == module_name and not name.startswith("_")
    )
    mark = "mark functions with @tool (from atomictools import tool)"
    if not stem.isidentifier():
        # `my-tool.py`: no Python function can be named `my-tool`, so naming one after the file is no way out.
        advice = (
            f"{mark}, e.g. @tool(name={stem!r}); or rename the file to {stem.replace('-', '_')!r}.py"
            if stem.replace("-", "_").isidentifier() else f"{mark}"
        )
        return f"no tools found: {stem!r} cannot be a Python function name; {advice}"
    if found:
        listed = ", ".join(repr(n) for n in found)
        return (
            f"no tools found: this file defines {listed} but no function named {stem!r}; "
            f"rename one to {stem!r}, or {mark}"
        )
    return f"no tools found: {mark}, or define a function named {stem!r}"


def collect_tools(namespace: dict[str, Any], module_name: str, stem: str) -> list[ToolSpec]:
    """Find and build every tool a loaded module defines.

    Tools are the functions marked with ``@tool`` that the module itself defines (not ones it
    imported). A module with no marked function may instead define a plain function named like its
    file, which is then its single tool.

    Raises:
        SchemaError: a tool cannot be built, two tools share a name, or the module defines none.
    """
    marked = [
        obj
        for obj in namespace.values()
        if callable(obj)
        and isinstance(getattr(obj, "__atomic_tool__", None), ToolOptions)
        and getattr(obj, "__module__", None) == module_name
    ]
    if not marked:
        plain = namespace.get(stem)
        if inspect.isfunction(plain) and plain.__module__ == module_name:
            marked = [plain]
    if not marked:
        raise SchemaError(_no_tools_message(namespace, module_name, stem))
    specs: list[ToolSpec] = []
    seen: dict[str, str] = {}
    for fn in marked:
        options = getattr(fn, "__atomic_tool__", None) or ToolOptions()
        name = tool_name(stem, fn.__name__, options.name)
        problem = check_tool_name(name)
        if problem:
            raise SchemaError(f"{problem} (function {fn.__name__!r})")
        if name in seen:
            raise SchemaError(
                f"two tools are named {name!r}: functions {seen[name]!r} and {fn.__name__!r}"
            )
        seen[name] = fn.__name__
        specs.append(build_tool(fn, name, options))
    return specs


def build_tool(fn: Callable[..., Any], name: str, options: ToolOptions | None = None) -> ToolSpec:
    """Build the schemas and the argument decoder of one tool function.

    Raises:
        SchemaError: the signature cannot be turned into a schema; the message names the parameter.
    """
    options = options or ToolOptions()
    target = inspect.unwrap(fn)
    try:
        signature = inspect.signature(target)
        hints = typing.get_type_hints(target, include_extras=True)
    except (NameError, TypeError, ValueError) as exc:
        raise SchemaError(f"cannot read the signature of {fn.__name__!r}: {exc}") from exc

    doc = inspect.getdoc(target) or ""
    param_docs = docstring_params(doc)
    parameters: list[tuple[str, Any, Any]] = []
    context_param: str | None = None
    by_position = True  # every parameter but the ctx may be passed by position
    for param in signature.parameters.values():
        annotation = hints.get(param.name, Any)
        if _is_context(annotation):
            context_param = param.name
            continue
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise SchemaError(f"{fn.__name__}: *args and **kwargs cannot be described as tool inputs")
        if param.kind is param.POSITIONAL_ONLY:
            raise SchemaError(f"{fn.__name__}: positional-only parameter {param.name!r} is not supported")
        if param.name not in hints:
            raise SchemaError(_unannotated(fn.__name__, param))
        by_position = by_position and param.kind is param.POSITIONAL_OR_KEYWORD
        parameters.append((param.name, annotation, param.default))

    output_type = hints.get("return", inspect.Signature.empty)
    if any(uses_pydantic(annotation, default) for _name, annotation, default in parameters) or uses_pydantic(output_type):
        _refuse_pydantic_1(fn.__name__)
        from atomictoolsd.worker import pydantic_schema  # lazy: pydantic's, for its modules only

        try:
            schema, decoder = pydantic_schema.build_arguments(name, parameters, param_docs)
        except TypeError as exc:
            raise SchemaError(f"{fn.__name__}: {exc}") from None
        input_schema: dict[str, Any] = _object_root(type_enums(inline_refs(schema)))
    else:
        input_schema, decoder = _msgspec_arguments(fn.__name__, name, parameters, param_docs)
    problems = schema_problems(input_schema)
    if problems:
        raise SchemaError(
            f"{fn.__name__}: {'; '.join(problems)}: some agents (Gemini) refuse such a schema; "
            f"give it a concrete type (str, int, a Struct, …) instead of Any"
        )

    output_schema, wrap, dump_output = _output_schema(output_type)
    names = tuple(parameter[0] for parameter in parameters)
    fields = getattr(getattr(decoder, "type", None), "__struct_fields__", None)  # pydantic's decoder has none
    return ToolSpec(
        name=name,
        fn=fn,
        is_async=inspect.iscoroutinefunction(target),
        param_names=names,
        context_param=context_param,
        decoder=decoder,
        input_schema=input_schema,
        description=options.description or doc or "",
        output_schema=output_schema,
        output_type=output_type if output_schema is not None else None,
        wrap_output=wrap,
        title=options.title,
        timeout=options.timeout,
        annotations=dict(options.annotations) if options.annotations else None,
        dump_output=dump_output,
        positional=by_position and fn is target and context_param is None and fields == names,
    )


def _msgspec_arguments(
    function: str, tool: str, parameters: list[tuple[str, Any, Any]], descriptions: dict[str, str],
) -> tuple[dict[str, Any], msgspec.json.Decoder]:
    """The input schema and the argument decoder of ``parameters``, by msgspec."""
    empty = inspect.Parameter.empty
    fields: list[tuple[Any, ...]] = []
    for name, annotation, default in parameters:
        try:
            annotation, default = _as_msgspec(annotation, default, empty)
        except SchemaError as exc:
            raise SchemaError(f"{function}: parameter {name!r}: {exc}") from None
        if name in descriptions and not _has_description(annotation):
            annotation = Annotated[annotation, msgspec.Meta(description=descriptions[name])]
        fields.append((name, annotation) if default is empty else (name, annotation, _default(default)))
    try:
        args_type = msgspec.defstruct(f"{tool}_arguments", fields, kw_only=True, forbid_unknown_fields=True)
        return _object_root(type_enums(_json_schema(args_type))), msgspec.json.Decoder(args_type, dec_hook=_dec_hook)
    except (TypeError, ValueError) as exc:
        raise SchemaError(_unsupported(function, fields, exc)) from None


def _unsupported(function: str, fields: list[tuple[Any, ...]], exc: Exception) -> str:
    """Why a parameter's type cannot be a tool input, naming the parameter and the forms that can."""
    for field in fields:
        try:
            _json_schema(field[1])
            msgspec.json.Decoder(field[1], dec_hook=_dec_hook)
        except (TypeError, ValueError) as own:
            culprit, exc = field, own
            break
    else:
        culprit = None
    reason = str(exc).splitlines()[-1].strip() if str(exc) else type(exc).__name__
    where = f"parameter {culprit[0]!r}" if culprit is not None else "a parameter"
    return (
        f"{function}: {where} cannot be a tool input ({reason}); a parameter's type must be one the schema "
        f"can describe: str, int, float, bool, a list, dict or Literal of them, a msgspec.Struct, a @dataclass, "
        f"a TypedDict, an Enum, or a pydantic BaseModel where pydantic is installed in the module's environment"
    )


def _refuse_pydantic_1(function: str) -> None:
    """A module's own pydantic 1 (a declared ``pydantic<2``) is said so, rather than failing on an
    attribute pydantic 1 lacks: the schema and the validation are built with pydantic 2's."""
    version = old_pydantic()
    if version is not None:
        raise SchemaError(
            f"{function}: the module's pydantic is {version}, and a tool's pydantic types need pydantic 2, as "
            f"FastMCP's do: declare pydantic>=2 (dependencies = [\"pydantic>=2\"]) or install it in the module's "
            f"environment, or make them a msgspec.Struct, a @dataclass or a TypedDict"
        )


def _unannotated(function: str, param: inspect.Parameter) -> str:
    # Refused rather than guessed: a type read from the default would reject values the function
    # takes today, and an untyped property makes Gemini skip the tool (``portable``).
    default = param.default
    guess = type(default).__name__ if type(default) in (str, int, float, bool, list, dict) else "str"
    example = f"{param.name}: {guess}" + ("" if default is param.empty else f" = {default!r}")
    return (
        f"{function}: parameter {param.name!r} has no type annotation, and agents such as Gemini "
        f"refuse an untyped parameter; annotate it, e.g. `{example}`"
    )


def _is_context(annotation: Any) -> bool:
    """``Context``, or an optional ``Context`` (``Context | None``)."""
    if annotation is Context:
        return True
    args = typing.get_args(annotation)
    return typing.get_origin(annotation) in (typing.Union, types.UnionType) and Context in args and all(
        a in (Context, type(None)) for a in args
    )


def _as_msgspec(annotation: Any, default: Any, empty: Any) -> tuple[Any, Any]:
    """The idioms authors bring from FastMCP and pydantic, in the terms msgspec reads:

    - a ``Field(...)``/``msgspec.Meta`` as the default (``count: int = Field(ge=0)``) is the
      parameter's constraints, and the parameter is required (msgspec would try to encode the
      ``Meta`` as a default value, "Encoding objects of type msgspec.Meta is unsupported");
    - ``Field(..., default=x)``, there or in ``Annotated``, is the constraints and the default ``x``;
    - a plain string in ``Annotated`` (``Annotated[str, "The path"]``) is the description, at any
      depth (``list[Annotated[str, "A path"]]``): msgspec ignores metadata it does not know, so it
      would vanish from the schema;
    - for an optional parameter (``int | None``) the description is the parameter's and the
      constraints its value's: msgspec refuses ``ge`` on a union ("Can only set `ge` on a numeric
      type"), and an agent reads the description beside the parameter's name, not in an ``anyOf``.

    pydantic's own ``Field`` never gets here: a signature that holds one is pydantic's to build.
    """
    base, extras = split_annotated(annotation)
    metadata: list[Any] = []
    for extra in extras:
        metadata.append(_meta(extra))
        if isinstance(extra, FieldDefault) and default is empty:
            default = extra.default
    if isinstance(default, msgspec.Meta):
        metadata.append(default)
        default = empty
    elif isinstance(default, FieldDefault):
        metadata.append(default.meta)
        default = default.default
    described = _described(base)
    members = typing.get_args(described)
    if typing.get_origin(described) in (typing.Union, types.UnionType) and type(None) in members:
        values = [m for m in members if m is not type(None)]
        if len(values) == 1 and typing.get_origin(values[0]) is Annotated:
            # Annotated[int, "How many"] | None: the description is the parameter's too.
            inner, *inner_metas = typing.get_args(values[0])
            values, metadata = [inner], [*inner_metas, *metadata]
        outer = [part for meta in metadata if (part := _part(meta, _OUTER))]
        constraints = [part for meta in metadata if (part := _part(meta, _CONSTRAINTS))]
        if constraints:
            values = [Annotated[(value, *constraints)] for value in values]
        if metadata:  # else nothing moved: keep the type as written
            described, metadata = typing.Union[(*values, type(None))], outer
    if described is base and metadata == list(extras):
        return annotation, default
    return (Annotated[(described, *metadata)] if metadata else described), default


_CONSTRAINTS = ("gt", "ge", "lt", "le", "multiple_of", "pattern", "min_length", "max_length", "tz")
_OUTER = ("title", "description", "examples", "extra_json_schema", "extra")


def _part(meta: Any, keys: tuple[str, ...]) -> Any:
    """The part of a ``msgspec.Meta`` with ``keys`` (a Meta), or None when it sets none of them;
    metadata that is not a Meta goes with the parameter."""
    if not isinstance(meta, msgspec.Meta):
        return meta if keys is _OUTER else None
    values = {key: getattr(meta, key) for key in keys if getattr(meta, key) is not None}
    return msgspec.Meta(**values) if values else None


def _meta(extra: Any) -> Any:
    """One item of ``Annotated``'s metadata as msgspec reads it."""
    if isinstance(extra, str):
        return msgspec.Meta(description=extra)
    if isinstance(extra, FieldDefault):
        return extra.meta
    return extra


def _described(tp: Any) -> Any:
    """``tp`` with the ``Annotated`` types nested in it (``list[Annotated[str, "A path"]]``,
    ``Optional[Annotated[...]]``) rewritten by ``_meta``; ``tp`` itself when none needs it."""
    origin = typing.get_origin(tp)
    if origin is None or origin is typing.Literal:  # a Literal's arguments are values, not types
        return tp
    args = typing.get_args(tp)
    if origin is Annotated:
        inner, *extras = args
        new = (_described(inner), *(_meta(extra) for extra in extras))
        return tp if all(a is b for a, b in zip(new, args, strict=True)) else Annotated[new]
    new = tuple(_described(arg) for arg in args)
    if all(a is b for a, b in zip(new, args, strict=True)):
        return tp
    if origin in (typing.Union, types.UnionType):
        return typing.Union[new]  # noqa: UP007 - from a tuple of members, which `|` cannot take
    if isinstance(tp, types.GenericAlias):
        return types.GenericAlias(origin, new)
    return tp.copy_with(new)


def _default(value: Any) -> Any:
    # msgspec accepts only empty mutable defaults; copy others per call, as a dataclass factory would.
    if isinstance(value, (list, dict, set)) and value:
        return msgspec.field(default_factory=lambda v=value: type(v)(v))
    return value


def _has_description(annotation: Any) -> bool:
    if typing.get_origin(annotation) is not Annotated:
        return False
    return any(isinstance(m, msgspec.Meta) and m.description for m in annotation.__metadata__)


def _json_schema(tp: Any) -> dict[str, Any]:
    return inline_refs(msgspec.json.schema(tp, schema_hook=_schema_hook))


def _object_root(schema: dict[str, Any]) -> dict[str, Any]:
    schema.pop("title", None)
    schema.setdefault("properties", {})
    if not schema.get("required"):
        schema.pop("required", None)
    schema["additionalProperties"] = False
    return schema


def _output_schema(tp: Any) -> tuple[dict[str, Any] | None, bool, Callable[[Any], Any] | None]:
    """The output schema of a return annotation, whether results are wrapped in ``result``, and for
    a pydantic type the function that checks and dumps a result (``ToolSpec.dump_output``).

    MCP wants an object at the root, so other structured types are wrapped as
    ``{"result": value}``. Text-like and unannotated returns have no output schema.
    """
    if tp in _NO_OUTPUT or tp is None:
        return None, False, None
    dump = None
    if uses_pydantic(tp):
        from atomictoolsd.worker import pydantic_schema  # lazy: pydantic's, for its modules only

        described = pydantic_schema.output_schema(tp)
        if described is None:
            return None, False, None
        schema = inline_refs(described)
        dump = pydantic_schema.dump_output(tp)
    else:
        try:
            schema = _json_schema(tp)
        except (TypeError, ValueError):
            return None, False, None  # a type msgspec cannot describe: send the value as text only
    if schema.get("type") == "object" and "anyOf" not in schema:
        schema.pop("title", None)
        return schema, False, dump
    return {"type": "object", "properties": {"result": schema}, "required": ["result"]}, True, dump
