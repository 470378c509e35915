"""What a tool function's signature and docstring say, read alike by both schema builders (msgspec's
in ``schema``, pydantic's in ``pydantic_schema``): an ``Annotated`` type split into its type and
metadata, the ``Args:`` section's description of each parameter, and whether a signature speaks
pydantic.

Never imports pydantic: a module that uses it has imported it already (``uses_pydantic`` asks
``sys.modules``).
"""

from __future__ import annotations

import inspect
import re
import sys
import typing
from typing import Annotated, Any

__all__ = ["docstring_params", "old_pydantic", "pydantic_made", "split_annotated", "uses_pydantic"]

_PYDANTIC_MODULES = ("pydantic", "pydantic_core", "annotated_types")


def split_annotated(annotation: Any) -> tuple[Any, tuple[Any, ...]]:
    """``Annotated[T, *extras]`` as ``(T, extras)``; any other annotation as ``(annotation, ())``."""
    if typing.get_origin(annotation) is Annotated:
        base, *extras = typing.get_args(annotation)
        return base, tuple(extras)
    return annotation, ()


def pydantic_made(value: Any) -> bool:
    """Whether ``value`` (a type, or an object in ``Annotated``/a default) is pydantic's."""
    if "pydantic" not in sys.modules:
        return False
    if isinstance(value, type):
        return any(base.__module__.partition(".")[0] in _PYDANTIC_MODULES for base in value.__mro__[:-1])
    return type(value).__module__.partition(".")[0] in _PYDANTIC_MODULES


def old_pydantic() -> str | None:
    """The version of the pydantic imported, when it is pydantic 1 (a module that declares
    ``pydantic<2``): ``pydantic_schema`` reads pydantic 2's models only. None otherwise."""
    version = str(getattr(sys.modules.get("pydantic"), "VERSION", ""))
    return version if version.startswith(("0.", "1.")) else None


def uses_pydantic(annotation: Any, default: Any = inspect.Parameter.empty) -> bool:
    """Whether a parameter (or return) annotation, or a default, is or holds something of pydantic's."""
    if "pydantic" not in sys.modules:  # a module that uses pydantic has imported it
        return False
    if default is not inspect.Parameter.empty and pydantic_made(default):
        return True
    stack = [annotation]
    while stack:
        tp = stack.pop()
        if pydantic_made(tp):
            return True
        origin = typing.get_origin(tp)
        if origin is Annotated:
            inner, extras = split_annotated(tp)
            if any(pydantic_made(extra) for extra in extras):
                return True
            stack.append(inner)
        elif origin is not None and origin is not typing.Literal:
            stack.extend(typing.get_args(tp))
    return False


_SECTION = re.compile(r"^(Args|Arguments|Parameters|Params):\s*$")
_OTHER_SECTION = re.compile(r"^[A-Z][A-Za-z ]*:\s*$")
_PARAM_LINE = re.compile(r"^(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


def docstring_params(doc: str) -> dict[str, str]:
    """Per-parameter descriptions from a Google-style ``Args:`` section."""
    out: dict[str, str] = {}
    lines = doc.splitlines()
    in_args = False
    current: str | None = None
    indent: int | None = None
    for line in lines:
        if _SECTION.match(line.strip()) and not line.startswith((" ", "\t")):
            in_args, current, indent = True, None, None
            continue
        if not in_args:
            continue
        if not line.strip():
            current = None
            continue
        if not line.startswith((" ", "\t")) and _OTHER_SECTION.match(line.strip()):
            break
        depth = len(line) - len(line.lstrip())
        if indent is None:
            indent = depth
        match = _PARAM_LINE.match(line.strip())
        if depth == indent and match:
            current = match.group(1)
            out[current] = match.group(2).strip()
        elif current and depth > indent:
            out[current] = f"{out[current]} {line.strip()}".strip()
    return out
