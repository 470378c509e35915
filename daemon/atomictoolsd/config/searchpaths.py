"""The environment's search paths for code, made absolute before the daemon runs anything.

A variable that says where a program loads code from (``LD_LIBRARY_PATH``, ``LD_PRELOAD``, …) may
hold an empty or relative entry: a shell's ``export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:/opt/lib``,
with the variable unset, leaves an empty one, which names the directory the program runs in. The
daemon's workers run commands in projects, so ``grep`` run in a repository would load the
repository's ``libpcre2-8.so.0``. The daemon drops such entries once, at start; its workers and
what they run inherit the result. ``PATH`` gets the same from ``command.with_own_bin``.

Standard library only.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

__all__ = ["absolute_search_paths"]

# Where a program finds code to load, by variable: its separators, and whether an entry may be a
# bare name (a library searched for in the system's directories). An empty or relative entry names
# a place in whatever directory the program runs in: the project a tool's command runs in.
_SEARCH_PATHS = {
    "LD_LIBRARY_PATH": (":;", False), "LD_PRELOAD": (": ", True), "LD_AUDIT": (":", True),
    "GCONV_PATH": (":", False), "DYLD_LIBRARY_PATH": (":", False), "DYLD_FALLBACK_LIBRARY_PATH": (":", False),
    "DYLD_FRAMEWORK_PATH": (":", False), "DYLD_INSERT_LIBRARIES": (":", False),
}


def absolute_search_paths(environ: MutableMapping[str, str]) -> None:
    """Drop from ``environ`` the empty and relative entries of ``_SEARCH_PATHS``; a variable left with
    none is removed."""
    for name, (separators, names) in _SEARCH_PATHS.items():
        value = environ.get(name)
        if value is None:
            continue
        for other in separators[1:]:
            value = value.replace(other, separators[0])
        entries = value.split(separators[0])
        kept = [e for e in entries if os.path.isabs(e) or (names and e and "/" not in e)]
        if len(kept) == len(entries):
            continue
        if kept:
            environ[name] = separators[0].join(kept)
        else:
            del environ[name]
