"""Argument validation against a declarative tool's ``inputSchema`` (fastjsonschema).

fastjsonschema compiles each schema to a Python function once, when the file loads (~2 ms a
schema), and then validates a call in about a microsecond; importing it costs ~5 ms, against ~50 ms
for ``jsonschema``. The fork server imports this module before it forks the first worker of a
declarative file (see ``runtime.prepare``), so later workers pay neither.

A ``$ref`` to another document is never fetched: schemas stay self-contained.
"""

from __future__ import annotations

import json
import re
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

    # Only a schema that says "integer" somewhere can have an integral float to turn into an int.
    integers = "integer" in json.dumps(schema)

    def validate(arguments: Any) -> Any:
        try:
            checked = check(arguments)
            return _integers(schema, checked, schema) if integers else checked
        except fastjsonschema.JsonSchemaValueException as exc:
            message = exc.message
            if message.startswith("data"):
                message = "$" + message[len("data"):]
            raise ValueError(message) from None

    return validate


def _integers(schema: Any, value: Any, root: dict[str, Any]) -> Any:
    """``value`` with each integral float that ``schema`` declares an ``integer`` made an ``int``,
    wherever the schema places it (``properties``, ``patternProperties``, ``additionalProperties``,
    ``items``, ``prefixItems``, ``additionalItems``, a local ``$ref``, a union's options, ``allOf``):
    ``2.0`` is a JSON Schema integer (Python clients send it), and a template must write it ``2``
    (``head -n 2.0`` fails)."""
    schema = _resolved(schema, root)
    if not isinstance(schema, dict):
        return value
    if type(value) is float:
        return int(value) if value.is_integer() and _integer_only(schema, root) else value
    if type(value) is dict:
        return {key: _integers(_member_schema(schema, key, root), item, root) for key, item in value.items()}
    if type(value) is list:
        return [_integers(_item_schema(schema, index, root), item, root) for index, item in enumerate(value)]
    return value


def _member_schema(schema: dict[str, Any], key: str, root: dict[str, Any]) -> Any:
    """The schema that applies to an object's member ``key`` (the first that says so)."""
    for part in _parts(schema, root):
        properties = part.get("properties")
        if isinstance(properties, dict) and key in properties:
            return properties[key]
        patterns = part.get("patternProperties")
        for pattern, member in patterns.items() if isinstance(patterns, dict) else ():
            try:
                if re.search(pattern, key):
                    return member
            except re.error:
                continue
        if isinstance(part.get("additionalProperties"), dict):
            return part["additionalProperties"]
    return None


def _item_schema(schema: dict[str, Any], index: int, root: dict[str, Any]) -> Any:
    """The schema that applies to an array's item ``index``: a tuple's place (``prefixItems``, or
    ``items`` as a list), else what applies to the rest (``items``, ``additionalItems``)."""
    for part in _parts(schema, root):
        places = part.get("prefixItems")
        if not isinstance(places, list) and isinstance(part.get("items"), list):
            places, rest = part["items"], part.get("additionalItems")
        else:
            rest = part.get("items")
        if isinstance(places, list) and index < len(places):
            return places[index]
        if isinstance(rest, dict):
            return rest
    return None


def _parts(schema: dict[str, Any], root: dict[str, Any]) -> list[dict[str, Any]]:
    """``schema`` and what ``allOf`` adds to it, local references followed."""
    parts = [schema]
    for extra in schema.get("allOf") or []:
        extra = _resolved(extra, root)
        if isinstance(extra, dict):
            parts.append(extra)
    return parts


def _integer_only(schema: dict[str, Any], root: dict[str, Any]) -> bool:
    """Whether a number matching ``schema`` must be an integer: its ``type`` (or one of its union's
    options') says ``integer``, and none says ``number``."""
    kinds: list[Any] = []
    for option in [schema, *(schema.get("anyOf") or []), *(schema.get("oneOf") or [])]:
        option = _resolved(option, root)
        kind = option.get("type") if isinstance(option, dict) else None
        kinds += kind if isinstance(kind, list) else [kind]
    return "integer" in kinds and "number" not in kinds


def _resolved(schema: Any, root: dict[str, Any]) -> Any:
    """``schema`` with a local ``$ref`` (``#/$defs/NAME``, ``#/definitions/NAME``) followed once."""
    ref = schema.get("$ref") if isinstance(schema, dict) else None
    for prefix in ("#/$defs/", "#/definitions/"):
        if isinstance(ref, str) and ref.startswith(prefix):
            return (root.get(prefix[2:-1]) or {}).get(ref[len(prefix):], schema)
    return schema
