"""JSON Schema as every agent takes it: ``inline_refs`` replaces each ``$ref`` into ``$defs`` with
the definition itself (several agents cannot resolve references).

Standard library only. ``ctx.elicit`` builds its form's schema with it, and the worker runtime the
schemas of the tools it serves (``atomictoolsd.worker.schema``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["inline_refs"]


def inline_refs(schema: dict[str, Any]) -> dict[str, Any]:
    """Replace every ``$ref`` into ``$defs`` with the definition itself.

    A recursive type cannot be inlined; the recursion point becomes ``{"type": "object"}`` (msgspec
    still validates the full structure).
    """
    defs: dict[str, Any] = schema.pop("$defs", {})

    def resolve(node: Any, stack: tuple[str, ...]) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                key = ref[len("#/$defs/"):]
                if key in stack:
                    return {"type": "object"}
                target = dict(defs[key])
                merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
                return resolve(merged, (*stack, key))
            return {k: resolve(v, stack) for k, v in node.items()}
        if isinstance(node, list):
            return [resolve(v, stack) for v in node]
        return node

    return resolve(schema, ())
