"""Loading the one module a worker serves: a Python file or a declarative ``.json`` file, into its
tools (``ToolSpec``), or a ``LoadFailure`` saying where and why.

Each module kind has a loader (``LOADERS``); what a loader needs beyond this module is imported by
the fork server before it forks the first worker of the kind (``prepare``), and ``warm_up`` builds
one tool there so that every worker it forks starts with warm caches. A Python module is imported
from its source only (never a stale ``.pyc``), under a name that never shadows the standard
library; what it declares of itself (``__atomic_sandbox__``) is kept in ``declared``.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

from atomictoolsd.protocol import LoadFailure, WorkerSpec
from atomictoolsd.worker.environment import activate, missing_module_hint
from atomictoolsd.worker.schema import SchemaError, ToolSpec, collect_tools
from atomictoolsd.worker.sourceload import SourceOnlyLoader, install_source_only_finder

__all__ = ["LOADERS", "LOADER_IMPORTS", "LoaderResult", "declared", "load_module", "prepare", "warm_up"]


def _module_name(stem: str) -> str:
    # A tool file may be named like a stdlib module (json.py): never shadow the real one.
    if stem in sys.modules or stem in sys.stdlib_module_names:
        return f"_atomic_tool_{stem}"
    return stem


def _error_line(exc: BaseException, path: str) -> int | None:
    if isinstance(exc, SyntaxError) and exc.filename == path:
        return exc.lineno
    line = None
    for frame, lineno in traceback.walk_tb(exc.__traceback__):
        if frame.f_code.co_filename == path:
            line = lineno
    return line


def _load_python(path: str) -> list[ToolSpec]:
    directory, filename = os.path.split(path)
    stem = filename.rsplit(".", 1)[0]
    # Appended, not prepended: helpers (_util.py) import by name, but never shadow the stdlib. This
    # is the one directory of a project on sys.path: the fork server is started sealed (no cwd, no
    # PYTHONPATH), and the worker's move into the project root (spec.cwd) adds nothing to it.
    if directory not in sys.path:
        sys.path.append(directory)
    install_source_only_finder(directory)
    name = _module_name(stem)
    declared.clear()
    spec = importlib.util.spec_from_file_location(name, path, loader=SourceOnlyLoader(name, path))
    if spec is None or spec.loader is None:
        raise LoadFailure(path, None, "not a loadable Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:  # noqa: BLE001 - a tool module may raise anything, SystemExit included
        message = (
            f"SyntaxError: {exc.msg}" if isinstance(exc, SyntaxError) else f"{type(exc).__name__}: {exc}"
        )
        hint = missing_module_hint(exc)
        if hint:
            message = f"{message}: {hint}"
        raise LoadFailure(path, _error_line(exc, path), message, traceback.format_exc()) from None
    if hasattr(module, "__atomic_sandbox__"):
        declared["sandbox"] = module.__atomic_sandbox__
    try:
        return collect_tools(vars(module), name, stem)
    except SchemaError as exc:
        raise LoadFailure(path, None, str(exc)) from None


declared: dict[str, Any] = {}  # what the module just loaded declared of itself (__atomic_sandbox__)


def _load_declarative(path: str) -> tuple[list[ToolSpec], list[dict[str, Any]]]:
    from atomictoolsd.worker.declarative import load_file  # lazy: usually imported already: see prepare()

    return load_file(path)


# Loaders by module kind. A loader returns the module's tools, or (tools, problems) when it can
# skip a malformed tool and serve the rest.
LoaderResult = list[ToolSpec] | tuple[list[ToolSpec], list[dict[str, Any]]]
LOADERS: dict[str, Callable[[str], LoaderResult]] = {"python": _load_python, "declarative": _load_declarative}

# Modules a loader needs beyond this one, by module kind. The fork server imports them just before it
# forks the first worker of that kind, so every later worker of the kind starts warm, and a daemon
# that serves no module of the kind never pays for them.
LOADER_IMPORTS: dict[str, tuple[str, ...]] = {"declarative": ("atomictoolsd.worker.declarative",)}


def prepare(kind: str) -> None:
    """Import what the loader of ``kind`` needs (in the fork server, before forking a worker)."""
    for name in LOADER_IMPORTS.get(kind, ()):
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - the worker imports it again and reports the failure as a load error
            pass


def load_module(spec: WorkerSpec) -> tuple[list[ToolSpec], list[dict[str, Any]]]:
    """Load the module a worker serves: its tools, and the problems of tools it skipped.

    Raises:
        LoadFailure: the module cannot be served at all.
    """
    loader = LOADERS.get(spec.kind)
    if loader is None:
        raise LoadFailure(spec.path, None, f"unknown module kind {spec.kind!r}")
    activate(spec)
    loaded = loader(spec.path)
    return loaded if isinstance(loaded, tuple) else (loaded, [])


_WARM_UP = '''
from typing import Annotated, Literal

import msgspec
from atomictools import Context, Field, tool


class Point(msgspec.Struct):
    x: int
    y: float = 0.0


@tool
def warm(
    name: Annotated[str, Field("A name", max_length=8, pattern="^[a-z]+$")],
    ctx: Context,
    count: Annotated[int, Field(ge=0)] = 1,
    mode: Literal["a", "b"] = "a",
    points: list[Point] | None = None,
) -> dict[str, int]:
    """Warm the caches."""
    return {}
'''


def warm_up() -> None:
    """Build one tool in the fork server, so that every worker it forks starts with the compiler's,
    the regex module's and msgspec's caches warm (a small module then loads in ~1.7 ms, not ~4.3)."""
    namespace: dict[str, Any] = {"__name__": "_atomic_warm_up"}
    try:
        exec(compile(_WARM_UP, "<atomictoolsd warm-up>", "exec"), namespace)
        for spec in collect_tools(namespace, "_atomic_warm_up", "warm"):
            spec.definition()
            spec.parse_arguments(b'{"name":"abc","points":[{"x":1}]}')
    except Exception:  # noqa: BLE001 - only an optimisation: workers load as well without it
        pass
