"""The definition cache: each tool module's definitions (or load error), kept across daemon restarts.

Listing tools must never need a live worker. After a restart the registry takes a module's tools
from here when the entry is fresh, and its worker starts only on the first call. An entry is fresh
when all of these still match:

- the module file's path, size and mtime;
- the size and mtime of every other file of its tools directory that the module imported when it
  last loaded (helpers such as ``_shared.py`` or a ``_lib/`` package: the worker reports them), so
  an edit to a helper re-derives the modules that use it, and only those;
- for a module that failed to load, also its directory's mtime: failures are often a helper that
  did not exist yet, and creating a file changes the directory;
- the runtime version: this daemon's version, the Python that runs workers, msgspec's version and a
  digest of the code that turns signatures into schemas.

What the cache cannot see (a module that reads a data file at import, an installed package that
changed) is corrected when the worker starts: the registry compares the definitions it reports
with the cached ones and updates the listing.

One JSON file per tools directory under the cache dir, written whole (temp file + rename) after a
directory's modules change. A missing, unreadable or foreign file is an empty cache, never an error.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
from pathlib import Path
from typing import Any

import msgspec

from atomictoolsd import __version__
from atomictoolsd.discovery import ModuleFile

__all__ = ["CacheEntry", "DefinitionCache", "runtime_version"]

log = logging.getLogger("atomictoolsd.defcache")


class CacheEntry(msgspec.Struct, omit_defaults=True):
    """What one module looked like when it last loaded."""

    size: int
    mtime_ns: int
    deps: list[tuple[str, int, int]] = []
    dir_mtime_ns: int | None = None  # failures only
    definitions: list[dict[str, Any]] = []
    problems: list[dict[str, Any]] = []  # tools the module skipped (a declarative file's malformed ones)
    error: dict[str, Any] | None = None
    load_ms: float | None = None


class _CacheFile(msgspec.Struct):
    runtime: str
    tools_dir: str
    modules: dict[str, CacheEntry]


_decode_file = msgspec.json.Decoder(_CacheFile).decode
_encode = msgspec.json.encode


def runtime_version() -> str:
    """A digest of everything besides the module's own files that shapes its definitions."""
    import atomictools._authoring
    import atomictools._schema
    import atomictoolsd.workers.runtime
    import atomictoolsd.workers.sourceload

    digest = hashlib.sha256(f"{__version__}\0{sys.version}\0{sys.executable}\0{msgspec.__version__}".encode())
    for module in (atomictools._schema, atomictools._authoring, atomictoolsd.workers.runtime, atomictoolsd.workers.sourceload):
        try:
            digest.update(Path(module.__file__ or "").read_bytes())
        except OSError:
            digest.update(b"?")
    return digest.hexdigest()[:24]


def _stat_key(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


class DefinitionCache:
    """Cached definitions for every tools directory, under ``directory``.

    Args:
        directory: where the cache files live (created on the first write).
        runtime: the runtime version entries must carry; by default ``runtime_version()``.
    """

    def __init__(self, directory: Path, runtime: str | None = None) -> None:
        self.directory = directory
        self.runtime = runtime if runtime is not None else runtime_version()
        self._dirs: dict[Path, dict[str, CacheEntry]] = {}
        self.hits = 0
        self.misses = 0

    def _file(self, tools_dir: Path) -> Path:
        name = hashlib.sha256(os.fsencode(tools_dir)).hexdigest()[:24]
        return self.directory / f"{name}.json"

    def entries(self, tools_dir: Path) -> dict[str, CacheEntry]:
        """The entries stored for ``tools_dir`` (read from disk on first use)."""
        entries = self._dirs.get(tools_dir)
        if entries is None:
            entries = {}
            try:
                data = _decode_file(self._file(tools_dir).read_bytes())
            except FileNotFoundError:
                pass
            except (OSError, msgspec.DecodeError, msgspec.ValidationError) as exc:
                log.warning("ignoring the unreadable definition cache of %s: %s", tools_dir, exc)
            else:
                if data.runtime == self.runtime and data.tools_dir == str(tools_dir):
                    entries = data.modules
            self._dirs[tools_dir] = entries
        return entries

    def lookup(self, tools_dir: Path, file: ModuleFile) -> CacheEntry | None:
        """The entry for ``file`` if it is still fresh, else None."""
        entry = self.entries(tools_dir).get(file.path)
        if entry is None or (entry.size, entry.mtime_ns) != file.key or not self._deps_fresh(tools_dir, entry):
            self.misses += 1
            return None
        self.hits += 1
        return entry

    @staticmethod
    def _deps_fresh(tools_dir: Path, entry: CacheEntry) -> bool:
        for path, size, mtime_ns in entry.deps:
            if _stat_key(path) != (size, mtime_ns):
                return False
        if entry.error is not None:
            try:
                return os.stat(tools_dir).st_mtime_ns == entry.dir_mtime_ns
            except OSError:
                return False
        return True

    def store(self, tools_dir: Path, entries: dict[str, CacheEntry]) -> None:
        """Replace the entries of ``tools_dir`` and write them out (a failed write is only logged)."""
        self._dirs[tools_dir] = entries
        target = self._file(tools_dir)
        temp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(_encode(_CacheFile(self.runtime, str(tools_dir), entries)))
            os.replace(temp, target)
        except OSError as exc:
            log.warning("cannot write the definition cache of %s: %s", tools_dir, exc)
            try:
                temp.unlink()
            except OSError:
                pass

    @staticmethod
    def failure_entry(tools_dir: Path, file: ModuleFile, error: dict[str, Any]) -> CacheEntry:
        """An entry for a module that failed to load, keyed also by its directory's mtime."""
        try:
            dir_mtime: int | None = os.stat(tools_dir).st_mtime_ns
        except OSError:
            dir_mtime = None
        deps = [tuple(d) for d in error.get("deps", [])]
        stored = {k: v for k, v in error.items() if k != "deps"}
        return CacheEntry(file.size, file.mtime_ns, deps=deps, dir_mtime_ns=dir_mtime, error=stored)  # type: ignore[arg-type]

    def info(self) -> dict[str, Any]:
        return {"directory": str(self.directory), "hits": self.hits, "misses": self.misses}
