"""Import tool code from its source, every time: no bytecode cache is read or written.

Python trusts a cached ``.pyc`` whose source has the same size and the same mtime in whole seconds,
so two saves of a tool file within one second that keep its length (``return "v1"`` → ``"v2"``)
would make the reloaded worker run the old code. Importing would also litter the user's tools dir
with ``__pycache__`` and wake the file watcher. A worker therefore loads its tool module, and every
helper it imports from the tools directory, through ``SourceOnlyLoader``; everything else (the
standard library, installed packages) imports as usual.

After the module loaded, ``imported_from(directory)`` names the files of that directory the worker
imported, so the daemon can reload a module when a helper it uses changes, and ``fingerprint(path)``
and ``fingerprints(directory)`` say which bytes of a file were loaded (``[size, crc32]``), so the
daemon can tell a module, or a helper it imported, read while it was being written from one read
whole.

Nothing is loaded that another user could have written (``check_writers``): a tool module or helper
owned by someone else (but root), writable by others, or in a directory others may write to (without
the sticky bit) would let them run their code as you. Group-writable files are allowed: on most
systems a user's group is theirs alone.

A worker of a fully trusted project loads from its tools dir only the content the daemon judged
trusted (``follow_content``: the SHA-256 of each file's bytes; registry/content.py): a file that came
through git and awaits the user's review, or that changed between the daemon's judgement and this
read, is refused (``ContentRefused``) and named in ``refused()``, so the daemon judges it again.

Runs inside workers: standard library only.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import os
import shlex
import stat
import sys
import zlib
from typing import Any

from atomictoolsd.protocol import MAX_REPORTED_FILES

__all__ = [
    "ContentRefused", "SourceOnlyLoader", "check_writers", "fingerprint", "fingerprints", "follow_content",
    "imported_from", "install_source_only_finder", "note_read", "refused",
]

_BUILTINS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "builtins") + os.sep
_read: dict[str, list[int]] = {}  # path → [size, crc32] of the bytes loaded from it, in this process
# The tools dir whose content is followed, and the SHA-256 of what may be loaded from each of its files.
_followed: tuple[str, dict[str, str]] | None = None
_refused: list[str] = []


class ContentRefused(ImportError):
    """A file of the tools dir whose bytes are not content the daemon judged trusted."""


def follow_content(directory: str, allowed: dict[str, str]) -> None:
    """Load from ``directory`` only files whose bytes have the SHA-256 ``allowed`` gives their path."""
    global _followed
    _followed = (os.path.abspath(directory) + os.sep, allowed)


def refused() -> list[str]:
    """The files of the followed tools dir that this worker refused to load."""
    return list(_refused)[:MAX_REPORTED_FILES]


def _check_content(path: str, data: bytes) -> None:
    if _followed is None:
        return
    prefix, allowed = _followed
    path = os.path.abspath(path)
    if not path.startswith(prefix):
        return
    if allowed.get(path) != hashlib.sha256(data).hexdigest():
        _refused.append(path)
        raise ContentRefused(
            f"refused to load {path}: its content is not what you trusted (it arrived through git and awaits "
            "your review, or it changed while the worker started)"
        )


def check_writers(path: str) -> None:
    """Refuse to load ``path`` when a user other than you (or root) could have written it.

    Raises:
        PermissionError: the file or its directory is open to other users; the message says the fix.
    """
    if os.path.abspath(path).startswith(_BUILTINS):
        return  # the built-in tools: whoever can write the daemon's own code runs as you anyway
    me = os.geteuid()
    info = os.stat(path)
    if info.st_uid not in (me, 0):
        raise PermissionError(f"refused to load {path}: it belongs to uid {info.st_uid}, not to you (uid {me})")
    if info.st_mode & stat.S_IWOTH:
        raise PermissionError(f"refused to load {path}: other users can write it; run: chmod o-w {shlex.quote(path)}")
    directory = os.path.dirname(os.path.abspath(path))
    info = os.stat(directory)
    if info.st_mode & stat.S_IWOTH and not info.st_mode & stat.S_ISVTX:
        raise PermissionError(
            f"refused to load {path}: other users can write to {directory}; run: chmod o-w {shlex.quote(directory)}"
        )


def note_read(path: str, data: bytes) -> None:
    """Remember which bytes of ``path`` a loader compiled or parsed.

    Raises:
        ContentRefused: they are not content the daemon judged trusted (``follow_content``).
    """
    _read[os.path.abspath(path)] = [len(data), zlib.crc32(data)]
    _check_content(path, data)


def fingerprint(path: str) -> list[int] | None:
    """``[size, crc32]`` of the bytes last loaded from ``path`` in this process, if any were."""
    return _read.get(os.path.abspath(path))


def fingerprints(directory: str, exclude: str) -> list[list[Any]]:
    """``[path, size, crc32]`` of the bytes loaded from each file under ``directory`` but ``exclude``
    (the helpers a module imported: ``_shared.py``, a ``_lib/`` package's files)."""
    prefix = os.path.abspath(directory) + os.sep
    exclude = os.path.abspath(exclude)
    return [[path, *read] for path, read in sorted(_read.items()) if path.startswith(prefix) and path != exclude][:MAX_REPORTED_FILES]


class SourceOnlyLoader(importlib.machinery.SourceFileLoader):
    """A source loader that never consults or writes the bytecode cache, and remembers what it loaded."""

    loaded: list[str] = []  # every file loaded through this class, in this process

    def path_stats(self, path: str) -> Any:
        # SourceLoader.get_code reads and writes bytecode only when it knows the source's mtime.
        raise OSError("tool sources are always compiled from source")

    def get_code(self, fullname: str) -> Any:
        SourceOnlyLoader.loaded.append(self.path)
        return super().get_code(fullname)

    def get_data(self, path: str) -> bytes:
        check_writers(path)
        data = super().get_data(path)
        note_read(path, data)
        return data


class _CheckedExtensionLoader(importlib.machinery.ExtensionFileLoader):
    """An extension module of a tools dir, loaded once its bytes are judged (``follow_content``)."""

    def create_module(self, spec: Any) -> Any:
        if _followed is not None:
            with open(self.path, "rb") as f:
                note_read(self.path, f.read())
        return super().create_module(spec)


def install_source_only_finder(directory: str) -> None:
    """Make imports from ``directory`` (and the packages inside it) use ``SourceOnlyLoader``."""
    root = os.path.abspath(directory)
    loaders = [
        (_CheckedExtensionLoader, importlib.machinery.EXTENSION_SUFFIXES),
        (SourceOnlyLoader, importlib.machinery.SOURCE_SUFFIXES),
    ]

    def hook(path: str) -> importlib.machinery.FileFinder:
        absolute = os.path.abspath(path or ".")
        if absolute != root and not absolute.startswith(root + os.sep):
            raise ImportError("not a tools directory")  # the next hook handles it
        return importlib.machinery.FileFinder(path, *loaders)

    sys.path_hooks.insert(0, hook)
    for cached in [p for p in sys.path_importer_cache if os.path.abspath(p or ".").startswith(root)]:
        del sys.path_importer_cache[cached]


def imported_from(directory: str, exclude: str) -> list[list[Any]]:
    """``[path, size, mtime_ns]`` of each file under ``directory`` that has been imported, but ``exclude``.

    Read from what ``SourceOnlyLoader`` loaded, not from ``sys.modules``: walking every module of a
    freshly forked worker touches (and so copies) hundreds of pages for nothing.
    """
    prefix = os.path.abspath(directory) + os.sep
    found = []
    for path in sorted(set(SourceOnlyLoader.loaded)):
        if not path.startswith(prefix) or path == exclude:
            continue
        try:
            st = os.stat(path)
        except OSError:
            continue
        found.append([path, st.st_size, st.st_mtime_ns])
        if len(found) == MAX_REPORTED_FILES:
            break
    return found
