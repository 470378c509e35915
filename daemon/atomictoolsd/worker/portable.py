"""What every agent accepts in a tool's input schema, checked where a tool loads.

The strictest of the agents this project serves set the rules: Gemini skips a tool whose schema has a
property without a type ("missing types in its parameter schema"), cannot resolve ``$ref`` into
``$defs``, and rejects an ``enum`` without a ``type``; Claude, Copilot and Codex reject tool names
over 64 characters or with dots; the Gemini API wants a name to start with a letter or ``_``
(``atomictools._protocol.check_tool_name`` holds the name rule). A schema that breaks one of these
works in some agents and silently loses the tool in others, so it is a load error, not a warning.

Standard library only (the worker runtime imports it). It reports problems and the one repair that
keeps a schema's meaning (an ``enum``'s type, read from its values); it must never loosen a schema.
"""

from __future__ import annotations

from typing import Any

__all__ = ["schema_problems", "type_enums"]

_JSON_TYPES = ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"), (type(None), "null"))


def _json_type(value: Any) -> str | None:
    for python_type, name in _JSON_TYPES:
        if type(value) is python_type:
            return name
    return None


def type_enums(schema: Any) -> Any:
    """Give every ``enum`` without a ``type`` the type of its values (in place; returns ``schema``).

    msgspec describes ``Literal["a", "b"]`` and an ``Enum`` as a bare ``enum``. Values of mixed
    types become ``anyOf`` one typed ``enum`` per type, which means the same.
    """
    if isinstance(schema, dict):
        for value in schema.values():
            type_enums(value)
        values = schema.get("enum")
        if isinstance(values, list) and values and "type" not in schema:
            types: dict[str, list[Any]] = {}
            for value in values:
                types.setdefault(_json_type(value) or "", []).append(value)
            if "" not in types:
                if len(types) == 1:
                    schema["type"] = next(iter(types))
                else:
                    del schema["enum"]
                    schema["anyOf"] = [{"type": name, "enum": group} for name, group in types.items()]
    elif isinstance(schema, list):
        for value in schema:
            type_enums(value)
    return schema


def schema_problems(schema: Any) -> list[str]:
    """Why ``schema`` (a tool's input schema) would be refused by some agent; empty when none would.

    Each problem names where it is: ``property 'path'``, ``property 'opts.level'``, ``items of
    'paths'``.
    """
    problems: list[str] = []
    if not isinstance(schema, dict) or schema.get("type") != "object":
        return ['the input schema must be an object schema ("type": "object")']
    for key in ("$defs", "definitions"):
        if key in schema:
            problems.append(f"{key} (some agents cannot resolve references; inline them)")
    _check_properties(schema, "", problems)
    return problems


def _check_properties(schema: dict[str, Any], prefix: str, problems: list[str]) -> None:
    properties = schema.get("properties")
    if isinstance(properties, dict):
        for name, sub in properties.items():
            _check(sub, f"property {prefix + name!r}", problems, f"{prefix}{name}.")


def _check(node: Any, where: str, problems: list[str], prefix: str) -> None:
    if node is True or node == {}:
        problems.append(f"{where} has no type")
        return
    if not isinstance(node, dict):
        return  # `false`: nothing may be there, which every agent accepts
    if "$ref" in node:
        problems.append(f"{where} is a $ref (some agents cannot resolve references; inline it)")
        return
    branches = [b for key in ("anyOf", "oneOf", "allOf") if isinstance(node.get(key), list) for b in node[key]]
    if "type" not in node and not branches:
        what = "an enum without a type" if "enum" in node else "no type"
        problems.append(f"{where} has {what}")
    for index, branch in enumerate(branches):
        _check(branch, f"{where} (choice {index + 1})", problems, prefix)
    items = node.get("items")
    if items is not None and items is not False:
        _check(items, f"items of {where}", problems, prefix)
    for index, item in enumerate(node.get("prefixItems") or []):
        _check(item, f"item {index} of {where}", problems, prefix)
    _check_properties(node, prefix, problems)
