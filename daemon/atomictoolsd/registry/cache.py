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
  digest of the code that turns a module into definitions: signatures into schemas, the Python and
  declarative loaders, a JavaScript worker's code, and fastjsonschema (``runtime_files``).

What the cache cannot see (a module that reads a data file at import, an installed package that
changed) is corrected when the worker starts: the registry compares the definitions it reports
with the cached ones and updates the listing.

One JSON file per tools directory under the cache dir, written whole (temp file + rename) after a
directory's modules change. A missing, unreadable or foreign file is an empty cache, never an error.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import msgspec

import atomictools
from atomictoolsd import __version__
from atomictoolsd.config.discovery import ModuleFile
from atomictoolsd.config.paths import make_private_dirs
from atomictoolsd.config.statefile import write_atomic

__all__ = ["CacheEntry", "DefinitionCache", "deps_fresh", "runtime_files", "runtime_version"]

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


def runtime_files() -> list[Path]:
    """The source files besides a module's own that shape the definitions a worker derives from it:
    schemas from signatures, the worker's loaders (Python and declarative, whose checks decide which
    tools a JSON file keeps), and fastjsonschema, which compiles a JSON tool's schema or refuses it
    (its code stands for its version). Found by path: nothing is imported."""
    client = Path(atomictools.__file__).parent
    daemon = Path(__file__).parent.parent
    files = [client / name for name in ("_authoring.py", "_jsonschema.py", "_protocol.py")]
    files += [daemon / "worker" / name for name in (
        "main.py", "sourceload.py", "schema.py", "signature.py", "pydantic_schema.py", "portable.py",
    )]
    files.append(daemon / "protocol.py")  # what a worker reports of a load (LoadFailure, the messages)
    files += sorted((daemon / "worker" / "declarative").glob("*.py"))
    # A TypeScript or JavaScript module's: its worker's code, and the pass its definitions take.
    files += sorted((daemon / "worker" / "js").glob("*.mjs"))
    files += [daemon / "worker" / "jsexec.py", daemon / "pool" / "javascript" / "definitions.py"]
    spec = importlib.util.find_spec("fastjsonschema")
    if spec is not None and spec.origin:
        files += sorted(Path(spec.origin).parent.glob("*.py"))
    return files


def runtime_version() -> str:
    """A digest of everything besides the module's own files that shapes its definitions."""
    digest = hashlib.sha256(f"{__version__}\0{sys.version}\0{sys.executable}\0{msgspec.__version__}".encode())
    for path in runtime_files():
        digest.update(os.fsencode(path.name) + b"\0")
        try:
            digest.update(path.read_bytes())
        except OSError:
            digest.update(b"?")
    return digest.hexdigest()[:24]


def deps_fresh(deps: Iterable[Sequence[Any]]) -> bool:
    """Whether every ``[path, size, mtime_ns]`` in ``deps`` (the helpers a module imported) still
    has that size and mtime; a file gone is a change."""
    for path, size, mtime_ns in deps:
        try:
            st = os.stat(path)
        except OSError:
            return False
        if (st.st_size, st.st_mtime_ns) != (size, mtime_ns):
            return False
    return True


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
            except (OSError, msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError) as exc:
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
        if not deps_fresh(entry.deps):
            return False
        if entry.error is not None:
            try:
                return os.stat(tools_dir).st_mtime_ns == entry.dir_mtime_ns
            except OSError:
                return False
        return True

    def forget(self, tools_dir: Path) -> None:
        """Drop the entries of ``tools_dir`` from memory (its project is no longer in use); the file
        stays, and is read again if the dir comes back into use."""
        self._dirs.pop(tools_dir, None)

    def store(self, tools_dir: Path, entries: dict[str, CacheEntry]) -> None:
        """Replace the entries of ``tools_dir`` and write them out (a failed write is only logged)."""
        self._dirs[tools_dir] = entries
        target = self._file(tools_dir)
        try:
            make_private_dirs(self.directory)
            write_atomic(target, _encode(_CacheFile(self.runtime, str(tools_dir), entries)), 0o600, fsync=False)
        except (OSError, UnicodeEncodeError) as exc:  # a cache: listing starts workers instead, nothing is lost
            log.warning("cannot write the definition cache of %s: %s", tools_dir, exc)

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
