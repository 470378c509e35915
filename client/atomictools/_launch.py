"""How this project starts a Python process of its own: sealed against the starter's directory and
environment.

Owns the one rule every launch follows (the daemon's autostart, the fork server, the daemon that
re-executes itself): the child runs with ``-P``, from ``/``, in an environment without the starter's
``PYTHON*`` variables (but a few ``HARMLESS`` ones). ``python -m`` would otherwise put the starter's working directory first on
``sys.path``, so a repository that commits ``uvloop.py`` or ``json.py`` would be imported into the
shared daemon; ``PYTHONPATH``, ``PYTHONUSERBASE`` (a ``.pth`` or ``usercustomize`` there),
``PYTHONWARNINGS`` (which imports the module its filter names) and the rest are the same door.

Why not ``-I``: it also drops the user's site directory, where a ``pip install --user`` puts this
package. Why not ``-E`` here: the environment is ours to build, and ``-E`` would also drop the one
``PYTHONPATH`` we keep on purpose, the directories this very code was imported from when it was
found through ``PYTHONPATH`` (a source checkout; the benchmarks compare two that way). That keeps the
children running the same code as their parent and adds nothing the parent did not already run.
Launch lines written for someone else to run (service units, agent configs) cannot build their
environment, and use ``-E -P`` instead (``SEALED_FLAGS``).

Standard library only, and nothing imported at module level beyond what the shim already has: the
shim imports this on its slow path.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

__all__ = ["HARMLESS", "SEALED_CWD", "SEALED_FLAGS", "is_sealed", "own_roots", "python_command", "sealed_environ"]

# Flags for a command line that runs in an environment we do not build (an agent's, a service
# manager's): the interpreter ignores every PYTHON* variable and puts no directory first on sys.path.
SEALED_FLAGS = ("-E", "-P")

# Where our children start: a directory no repository controls.
SEALED_CWD = "/"

# PYTHON* variables a child may keep: they change buffering, bytecode writing, the text encoding
# mode and crash reports, and never what is imported or run. Every other one (PYTHONPATH, PYTHONHOME,
# PYTHONUSERBASE, PYTHONSTARTUP, PYTHONWARNINGS, PYTHONPYCACHEPREFIX, PYTHONBREAKPOINT, any added
# later, ...) is dropped: an allowlist, so that a new variable is closed until someone looks at it.
HARMLESS = frozenset({"PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "PYTHONUTF8", "PYTHONFAULTHANDLER"})


def python_command(module: str, *args: str) -> list[str]:
    """``python -P -m module args`` with this interpreter; run it with ``sealed_environ()`` and ``SEALED_CWD``."""
    return [sys.executable, "-P", "-m", module, *args]


def own_roots(environ: Mapping[str, str] | None = None) -> list[str]:
    """The ``PYTHONPATH`` entries this code itself was imported from (absolute, in their order)."""
    environ = os.environ if environ is None else environ
    if sys.flags.ignore_environment:
        return []  # this process never read PYTHONPATH: everything it runs came from the installation
    roots = set()
    for name in ("atomictools", "atomictoolsd"):
        module = sys.modules.get(name)
        origin = getattr(module, "__file__", None)
        if origin is None and module is None:
            from importlib.util import find_spec  # lazy: only for a package not imported yet

            spec = find_spec(name)
            origin = spec.origin if spec is not None else None
        if origin:
            roots.add(os.path.dirname(os.path.dirname(os.path.realpath(origin))))
    kept = []
    for entry in environ.get("PYTHONPATH", "").split(os.pathsep):
        if entry and os.path.realpath(entry) in roots and os.path.abspath(entry) not in kept:
            kept.append(os.path.abspath(entry))
    return kept


def sealed_environ(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``environ`` without its ``PYTHON*`` variables but the ``HARMLESS`` ones, and ``PYTHONPATH``
    naming only this code's own roots."""
    environ = os.environ if environ is None else environ
    sealed = {key: value for key, value in environ.items() if not key.startswith("PYTHON") or key in HARMLESS}
    roots = own_roots(environ)
    if roots:
        sealed["PYTHONPATH"] = os.pathsep.join(roots)
    return sealed


def is_sealed(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process started as ``python_command()`` and ``sealed_environ()`` start one (or as
    a unit's ``-E -P``): no directory of the starter's on ``sys.path``, no variable of theirs read."""
    if not sys.flags.safe_path:
        return False
    if sys.flags.ignore_environment:
        return True
    environ = os.environ if environ is None else environ
    ours = {key: value for key, value in environ.items() if key.startswith("PYTHON")}
    return ours == {key: value for key, value in sealed_environ(environ).items() if key.startswith("PYTHON")}
