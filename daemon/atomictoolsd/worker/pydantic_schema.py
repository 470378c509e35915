"""Tools whose signature speaks pydantic: ``BaseModel`` parameters and results, ``pydantic.Field``
as a default or in ``Annotated[..., Field(...)]``, pydantic's types and constraints — served as
FastMCP serves them.

The arguments are one pydantic model built from the signature (``create_model``, extra arguments
forbidden), so the schema is pydantic's own JSON Schema of it, then the same portable pass every tool
gets (``$ref`` inlined, enums typed, the root an object without a title); the arguments are validated
by pydantic (lax, as FastMCP validates), and an error names each field by its path (``point.x:
Input should be greater than or equal to 0``). A result annotated with a pydantic type is checked
and dumped to JSON by pydantic (``TypeAdapter``). ``atomictools.Field`` and a plain string in
``Annotated`` keep their meaning: they become pydantic ``Field``s.

Imported only for a module that imported pydantic (``signature.uses_pydantic`` says which, and
``schema`` imports this module then), so a worker never imports pydantic for a module that does not
use it.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from typing import Annotated, Any

import msgspec
import pydantic
import pydantic_core

from atomictools._authoring import FieldDefault
from atomictoolsd.worker.signature import pydantic_made, split_annotated

__all__ = ["ArgumentsDecoder", "build_arguments", "describe_errors", "dump_output", "output_schema", "to_json"]


def _v1_model(annotation: Any) -> str | None:
    """The name of a pydantic 1 model in ``annotation`` (``pydantic.v1.BaseModel``), if any."""
    stack = [annotation]
    while stack:
        tp = stack.pop()
        if isinstance(tp, type) and any(base.__module__.startswith("pydantic.v1") for base in tp.__mro__):
            return tp.__name__
        if typing.get_origin(tp) is not typing.Literal:
            stack.extend(typing.get_args(tp))
    return None


class ArgumentsDecoder:
    """Decodes a call's JSON arguments as the worker's call path expects of a msgspec decoder:
    ``decode(raw)`` returns a struct whose fields are the parameters (pydantic's values: a model
    parameter is its model), and a refusal is a ``msgspec.ValidationError`` naming each field."""

    def __init__(self, model: Any, names: list[str], struct: type[msgspec.Struct]) -> None:
        self._validate = model.model_validate_json
        self._error = pydantic.ValidationError
        self._names = names
        self._struct = struct

    def decode(self, raw: bytes) -> msgspec.Struct:
        try:
            validated = self._validate(raw)
        except self._error as exc:
            raise msgspec.ValidationError(describe_errors(exc)) from None
        return self._struct(**{name: getattr(validated, name) for name in self._names})


def describe_errors(exc: Any) -> str:
    """pydantic's errors, one per field, each named by its path: ``point.x: Input should be …``."""
    parts = []
    for error in exc.errors(include_url=False):
        where = ".".join(str(part) for part in error.get("loc", ())) or "the arguments"
        message = error.get("msg", "invalid")
        if error.get("type") == "missing":
            message = "Field required"
        elif error.get("type") == "extra_forbidden":
            message = "not a parameter of this tool"
        elif "input" in error and error.get("type") not in ("json_invalid",):
            message = f"{message} (got {_shown(error['input'])})"
        parts.append(f"`{where}`: {message}")
    return "; ".join(parts)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _field(annotation: Any, default: Any, description: str | None) -> tuple[Any, Any]:
    """A parameter as ``create_model`` takes it: ``(type, FieldInfo)``, with ``atomictools.Field``
    and a plain string in ``Annotated`` turned into pydantic's."""
    base, extras = split_annotated(annotation)
    metadata: list[Any] = []
    for extra in extras:
        if isinstance(extra, str):
            metadata.append(pydantic.Field(description=extra))
        elif isinstance(extra, msgspec.Meta):
            metadata.append(_from_meta(extra))
        elif isinstance(extra, FieldDefault):
            metadata.append(_from_meta(extra.meta))
            if default is inspect.Parameter.empty:
                default = extra.default
        else:
            metadata.append(extra)
    if isinstance(default, msgspec.Meta):
        metadata.append(_from_meta(default))
        default = inspect.Parameter.empty
    elif isinstance(default, FieldDefault):
        metadata.append(_from_meta(default.meta))
        default = default.default
    if isinstance(default, pydantic.fields.FieldInfo):
        field = default
    else:
        field = pydantic.Field() if default is inspect.Parameter.empty else pydantic.Field(default=default)
    if description and not _described(field, metadata):
        metadata.append(pydantic.Field(description=description))
    return (Annotated[(base, *metadata)] if metadata else base), field


def _from_meta(meta: msgspec.Meta) -> Any:
    keys = ("gt", "ge", "lt", "le", "multiple_of", "pattern", "min_length", "max_length", "description", "title", "examples")
    return pydantic.Field(**{key: getattr(meta, key) for key in keys if getattr(meta, key, None) is not None})


def _described(field: Any, metadata: list[Any]) -> bool:
    return bool(field.description) or any(getattr(m, "description", None) for m in metadata)


def build_arguments(
    tool: str, parameters: list[tuple[str, Any, Any]], descriptions: dict[str, str],
) -> tuple[dict[str, Any], ArgumentsDecoder]:
    """The input schema (pydantic's JSON Schema of the arguments, before the portable pass) and the
    decoder of a tool's ``parameters`` (``(name, annotation, default)``, ``ctx`` left out).

    Raises:
        TypeError: pydantic cannot make a model of them (its message says why; a pydantic 1 model
            is named).
    """
    for name, annotation, _default in parameters:
        old = _v1_model(annotation)
        if old is not None:
            raise TypeError(
                f"parameter {name!r}: {old} is a pydantic 1 model (pydantic.v1.BaseModel), which cannot be a tool "
                f"input; make it a pydantic 2 BaseModel (from pydantic import BaseModel)"
            )
    fields = {
        name: _field(annotation, default, descriptions.get(name)) for name, annotation, default in parameters
    }
    try:
        model = pydantic.create_model(
            f"{tool}_arguments", __config__=pydantic.ConfigDict(extra="forbid"), **fields,  # type: ignore[call-overload]
        )
        schema = model.model_json_schema()
    except (pydantic.PydanticUserError, pydantic.errors.PydanticSchemaGenerationError, TypeError, ValueError) as exc:
        raise TypeError(str(exc).split("\n\nFor further information", 1)[0]) from None
    names = [name for name, _annotation, _default in parameters]
    struct = msgspec.defstruct(f"{tool}_values", [(name, Any) for name in names])
    return schema, ArgumentsDecoder(model, names, struct)


def output_schema(annotation: Any) -> dict[str, Any] | None:
    """pydantic's JSON Schema of what a tool returns (as it is sent: serialization), or None when
    pydantic cannot describe it."""
    try:
        return pydantic.TypeAdapter(annotation).json_schema(mode="serialization")
    except (pydantic.PydanticUserError, pydantic.errors.PydanticSchemaGenerationError, TypeError, ValueError):
        return None


def dump_output(annotation: Any) -> Callable[[Any], Any]:
    """A function that checks a tool's result against ``annotation`` (a model from a dict too, as
    FastMCP reads it) and returns it as JSON values; it raises ``ValueError`` when it does not match."""
    adapter = pydantic.TypeAdapter(annotation)

    def dump(value: Any) -> Any:
        try:
            checked = adapter.validate_python(value, from_attributes=True)
        except pydantic.ValidationError as exc:
            raise ValueError(describe_errors(exc)) from None
        return adapter.dump_python(checked, mode="json")

    return dump


def to_json(value: Any) -> Any:
    """A pydantic model (or other pydantic value) a tool returned without a structured annotation, as
    JSON values; ``NotImplemented`` when ``value`` is not pydantic's."""
    if not pydantic_made(type(value)):
        return NotImplemented
    return pydantic_core.to_jsonable_python(value)

