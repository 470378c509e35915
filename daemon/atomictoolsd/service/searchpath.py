"""The ``PATH`` an installed service runs with: the installer's, each directory once, without the
shim directories of version managers.

A shim (pyenv, asdf, rbenv, nodenv, mise, …) chooses a version from the directory it is run in and
the shell's variables; under a service manager neither is the user's, and each costs ~70 ms a start.
The real directories behind them stay wherever the installer's PATH named them.
"""

from __future__ import annotations

import os

__all__ = ["SHIM_MARKERS", "service_path"]

# Path endings of version managers' shim directories: every one of pyenv (and pyenv-virtualenv),
# asdf, rbenv, nodenv, jenv, goenv, mise and rtx names it `shims`; Volta's shims are its bin.
SHIM_MARKERS = ("/shims", "/.volta/bin")


def service_path(path: str) -> str:
    """``path`` with duplicates, empty entries (the current directory, unknown to a service) and
    version-manager shim directories removed; the order of the rest kept."""
    kept: list[str] = []
    for entry in path.split(os.pathsep):
        normal = os.path.normpath(entry) if entry else ""
        if not normal or normal in kept or normal.endswith(SHIM_MARKERS):
            continue
        kept.append(normal)
    return os.pathsep.join(kept) or os.defpath
