"""Argument validation against a declarative tool's ``inputSchema`` (fastjsonschema).

fastjsonschema compiles each schema to a Python function once, when the file loads (~2 ms a
schema), and then validates a call in about a microsecond; importing it costs ~5 ms, against ~50 ms
for ``jsonschema``. The fork server imports this module before it forks the first worker of a
declarative file (see ``runtime.prepare``), so later workers pay neither.

A ``$ref`` to another document is never fetched: schemas stay self-contained.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import fastjsonschema

__all__ = ["SchemaProblem", "Validator", "compile_schema"]

Validator = Callable[[Any], Any]


class SchemaProblem(Exception):
    """An ``inputSchema`` that cannot be used; the message says why."""


class _NoRemoteRefs(dict):  # type: ignore[type-arg]
    """URI handlers for fastjsonschema that refuse every scheme instead of fetching over the network."""

    def __contains__(self, scheme: object) -> bool:
        return True

    def __missing__(self, scheme: str) -> Callable[[str], Any]:
        def refuse(uri: str) -> Any:
            raise fastjsonschema.JsonSchemaDefinitionException(
                f"$ref {uri!r} points outside the schema; remote references are not fetched"
            )

        return refuse


def compile_schema(schema: dict[str, Any]) -> Callable[[Any], Any]:
    """A function that validates arguments (filling in defaults) or raises ``ValueError`` whose
    message names the field and the rule, e.g. ``$.count must be bigger than or equal to 0``.

    Raises:
        SchemaProblem: the schema is not valid JSON Schema (or refers to another document).
    """
    try:
        check = fastjsonschema.compile(schema, handlers=_NoRemoteRefs(), use_default=True)
    except fastjsonschema.JsonSchemaDefinitionException as exc:
        raise SchemaProblem(f"inputSchema is not a valid JSON Schema: {exc}") from None
    except Exception as exc:  # a bad regex, an unhashable enum: anything the generator chokes on
        raise SchemaProblem(f"inputSchema is not a valid JSON Schema: {type(exc).__name__}: {exc}") from None

    def validate(arguments: Any) -> Any:
        try:
            return _integers(schema, check(arguments))
        except fastjsonschema.JsonSchemaValueException as exc:
            message = exc.message
            if message.startswith("data"):
                message = "$" + message[len("data"):]
            raise ValueError(message) from None

    return validate


def _integers(schema: Any, value: Any) -> Any:
    """``value`` with each integral float that ``schema`` declares an ``integer`` made an ``int``,
    through ``properties`` and ``items``: ``2.0`` is a JSON Schema integer (Python clients send it),
    and a template must write it ``2`` (``head -n 2.0`` fails)."""
    if type(value) is float:
        kind = schema.get("type") if isinstance(schema, dict) else None
        integer = kind == "integer" or (isinstance(kind, list) and "integer" in kind and "number" not in kind)
        return int(value) if integer and value.is_integer() else value
    if not isinstance(schema, dict):
        return value
    properties = schema.get("properties")
    if type(value) is dict and isinstance(properties, dict):
        return {key: _integers(properties.get(key), item) for key, item in value.items()}
    items = schema.get("items")
    if type(value) is list and isinstance(items, dict):
        return [_integers(items, item) for item in value]
    return value
