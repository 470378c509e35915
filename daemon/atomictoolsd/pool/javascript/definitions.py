"""The definitions a JavaScript worker reports, made what the daemon serves: the same portable-schema
pass a Python or declarative tool's schema gets (``$defs`` inlined, every ``enum`` typed, then
refused where some agent would refuse it: ``worker/portable.py``), the name rule, and the runtime
kept aside for listings.

A worker runs a tool's code and can report anything: a definition that is not an object with a
name and an object schema is a problem of that tool, never of the daemon.

Daemon side: never imported by workers.
"""

from __future__ import annotations

import copy
from typing import Any

from atomictools._jsonschema import inline_refs
from atomictools._protocol import WRITTEN_SCHEMA, check_tool_name
from atomictoolsd.worker.portable import schema_problems, type_enums

__all__ = ["RUNTIME_KEY", "served_definitions"]

RUNTIME_KEY = "atomic/runtime"  # "bun 1.4.5": which runtime loaded the tool (listed, never sent to clients)


def _served(definition: Any) -> tuple[dict[str, Any] | None, str | None]:
    """The definition as served, or why the tool cannot be."""
    if not isinstance(definition, dict) or not isinstance(definition.get("name"), str):
        return None, "the worker reported a tool without a name"
    problem = check_tool_name(definition["name"])
    if problem:
        return None, problem
    schema = definition.get("inputSchema")
    if not isinstance(schema, dict):
        return None, "its input schema is not a JSON object"
    schema = {key: value for key, value in schema.items() if key != "$schema"}
    try:
        served = type_enums(inline_refs(copy.deepcopy(schema)))
    except (KeyError, TypeError, RecursionError) as exc:
        return None, f"its input schema cannot be made portable ({exc!r})"
    problems = schema_problems(served)
    if problems:
        return None, f"inputSchema: {'; '.join(problems)}: some agents (Gemini) refuse such a schema; give it a concrete type"
    out = {key: value for key, value in definition.items() if key in ("name", "title", "description", RUNTIME_KEY)}
    out["inputSchema"] = served
    if served != schema:
        out[WRITTEN_SCHEMA] = schema
    return out, None


def served_definitions(
    definitions: list[dict[str, Any]], problems: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(definitions the daemon serves, problems)``: each tool whose definition cannot be served is
    left out with a problem naming it; the rest serve."""
    served: list[dict[str, Any]] = []
    problems = list(problems)
    for definition in definitions:
        out, problem = _served(definition)
        if out is not None:
            served.append(out)
        else:
            name = definition.get("name") if isinstance(definition, dict) else None
            problems.append({"tool": name if isinstance(name, str) else None, "line": None, "message": problem})
    return served, problems
