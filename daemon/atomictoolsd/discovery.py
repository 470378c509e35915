"""Where tool modules are: project roots, tools directories, and the module files in them.

Pure filesystem logic with no daemon state, so it is cheap to test and to reuse (the CLI and the
bridges use it too).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = [
    "MODULE_KINDS",
    "ModuleFile",
    "git_worktree_root",
    "global_tools_dir",
    "list_module_files",
    "local_tools_dir",
    "project_root",
]

# File suffix → module kind (the worker loader that serves it).
MODULE_KINDS = {".py": "python", ".json": "declarative"}


def global_tools_dir(home: Path) -> Path:
    """``~/.atomic/tools``: tools every project sees."""
    return home / ".atomic" / "tools"


def local_tools_dir(root: Path) -> Path:
    """``<project root>/.atomic/tools``: tools of one project."""
    return root / ".atomic" / "tools"


def git_worktree_root(directory: Path) -> Path | None:
    """The nearest ancestor (or ``directory`` itself) holding ``.git`` (a directory, or a file in a
    linked worktree or submodule), without running git."""
    for candidate in (directory, *directory.parents):
        if (candidate / ".git").exists():
            return candidate
    return None


def project_root(directory: Path, home: Path) -> Path:
    """The project a directory belongs to.

    The nearest ancestor with an ``.atomic/`` directory of this user's (the home directory does not
    count: its ``.atomic/`` holds the global tools), else the git worktree root, else the directory
    itself. An ``.atomic/`` owned by someone else (anyone can create ``/tmp/.atomic``) is ignored.
    """
    directory = directory.resolve()
    home = home.resolve()
    uid = os.geteuid()
    for candidate in (directory, *directory.parents):
        if candidate != home and _own_dir(candidate / ".atomic", uid):
            return candidate
    return git_worktree_root(directory) or directory


def _own_dir(path: Path, uid: int) -> bool:
    try:
        info = path.stat()
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == uid


class ModuleFile:
    """A tool module on disk, and the stat values that tell whether it changed."""

    __slots__ = ("kind", "mtime_ns", "path", "size")

    def __init__(self, path: str, kind: str, size: int, mtime_ns: int) -> None:
        self.path = path
        self.kind = kind
        self.size = size
        self.mtime_ns = mtime_ns

    @property
    def key(self) -> tuple[int, int]:
        return (self.size, self.mtime_ns)

    def __repr__(self) -> str:
        return f"ModuleFile({self.path!r}, {self.kind!r})"


def list_module_files(tools_dir: Path) -> list[ModuleFile]:
    """The tool modules in a tools directory, sorted by file name.

    Files whose suffix is in ``MODULE_KINDS`` count; names starting with ``_`` are helpers that tools import, and
    names starting with ``.`` are editor and temporary files: neither is a module.
    """
    try:
        entries = list(os.scandir(tools_dir))
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return []
    found = []
    for entry in entries:
        name = entry.name
        if name.startswith(("_", ".")):
            continue
        kind = MODULE_KINDS.get(os.path.splitext(name)[1])
        if kind is None:
            continue
        try:
            if not entry.is_file():
                continue
            st = entry.stat()
        except OSError:
            continue
        found.append(ModuleFile(entry.path, kind, st.st_size, st.st_mtime_ns))
    found.sort(key=lambda m: os.path.basename(m.path))
    return found
