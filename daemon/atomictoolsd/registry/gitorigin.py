"""Whether a file's content came through git: what a checkout, a pull or a merge wrote, as opposed
to your own edit.

A file of a project's tools dir came through git when its bytes are the blob committed for its path
(in the index, at any stage, or in ``HEAD``), or when the index still holds the file's stat data as
git recorded it when it wrote the file (the same mtime to the nanosecond, size and inode: nobody has
touched it since). The second rule covers what git converts on the way out (``eol``, ``ident``, a
filter such as Git LFS): the bytes on disk are then not the blob's, but git wrote them.

Read without running git and without executing anything of the repository. The index is parsed
here (versions 2 to 4, SHA-1 and SHA-256 repositories): every file is opened non-blocking, refused
unless regular, and read up to a bound, so a hostile ``.git`` (a FIFO, a device, a huge index)
cannot hang the reader. The index answers whenever it can be read: git writes an entry for every
file a checkout, a pull or a merge writes. ``HEAD``'s tree is read only when it cannot (no index,
a split index, one that does not parse), through pygit2 (libgit2, which runs no hook, filter or
helper) in a process of its own that is killed after ``HEAD_TIMEOUT``: libgit2 reads the
repository's config, whose includes may name a FIFO, and blocks on it holding the interpreter's
lock, which would freeze any process it ran in.

Standard library only: the CLI uses it too.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Literal, NamedTuple

from atomictoolsd.config.discovery import RepositoryRefused, locate_repository
from atomictoolsd.util.files import read_bounded

__all__ = ["Origin", "Repo", "blob_id", "origins", "stop_readers"]

Origin = Literal["git", "own", "unknown"]

MAX_INDEX_BYTES = 256 * 1024 * 1024  # a repository of a million files has an index of ~100 MB
HEAD_TIMEOUT = 3.0  # seconds the process that reads HEAD's tree may take
_MAX_CONFIG_BYTES = 64 * 1024
# Run as ``python -E -P -c _READ_HEAD GIT_DIR PATH…``: the ids HEAD's tree has at those paths, as JSON.
_READ_HEAD = """
import json, sys
if sys.platform.startswith("linux"):  # killed with the thread that started it: never outlives the daemon
    import ctypes
    ctypes.CDLL(None).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
import pygit2
repo = pygit2.Repository(sys.argv[1], pygit2.enums.RepositoryOpenFlag.NO_SEARCH)
found = {}
if not repo.head_is_unborn:
    tree = repo.head.peel(pygit2.Tree)
    for path in sys.argv[2:]:
        try:
            found[path] = str(tree[path].id)
        except (KeyError, ValueError):
            pass
print(json.dumps(found))
"""


def blob_id(data: bytes, algorithm: str = "sha1") -> str:
    """The id git gives a blob of ``data`` (``sha1`` or ``sha256``, the repository's object format)."""
    return hashlib.new(algorithm, b"blob %d\0" % len(data) + data).hexdigest()


class _Entry(NamedTuple):
    oid: str
    mtime: tuple[int, int]
    size: int
    ino: int


class _Index(NamedTuple):
    """The entries of an index under one prefix: stage 0 by path, and the ids of the other stages."""

    stage0: dict[str, _Entry]
    others: dict[str, set[str]]


# The entries under a prefix of the last index files parsed, by (path, prefix), with the index's
# (inode, size, mtime): an edit is judged without parsing a large repository's index again.
_INDEXES: dict[tuple[str, str], tuple[tuple[int, int, int], _Index]] = {}
_MAX_INDEXES = 64


def _object_format(common_dir: Path) -> str:
    """``sha1`` or ``sha256``: the repository's ``extensions.objectformat``, read without git."""
    data = read_bounded(common_dir / "config", _MAX_CONFIG_BYTES) or b""
    section = ""
    for raw in data.decode("utf-8", "replace").splitlines():
        line = raw.split("#", 1)[0].split(";", 1)[0].strip()
        if line.startswith("["):
            section = line.strip("[]").strip().lower()
        elif section == "extensions" and "=" in line:
            key, _, value = line.partition("=")
            if key.strip().lower() == "objectformat":
                return "sha256" if value.strip().strip('"').lower() == "sha256" else "sha1"
    return "sha1"


def _varint(data: bytes, at: int) -> tuple[int, int]:
    """Git's offset encoding (the index v4 path prefix length): the value and the next position."""
    byte = data[at]
    at += 1
    value = byte & 0x7F
    while byte & 0x80:
        value += 1
        byte = data[at]
        at += 1
        value = (value << 7) | (byte & 0x7F)
    return value, at


def _parse_index(data: bytes, hash_size: int, prefix: str) -> _Index:
    """The entries of an index file (``data``) whose path starts with ``prefix``.

    Raises:
        ValueError: not an index this understands (its signature, version, an entry past its end, a
            split index whose entries live in another file).
    """
    if len(data) < 12 + hash_size or data[:4] != b"DIRC":
        raise ValueError("not a git index")
    version, count = struct.unpack(">II", data[4:12])
    if version not in (2, 3, 4):
        raise ValueError(f"index version {version}")
    end = len(data) - hash_size
    at = 12
    fixed = 40 + hash_size + 2  # ctime, mtime, dev, ino, mode, uid, gid, size, id, flags
    stage0: dict[str, _Entry] = {}
    others: dict[str, set[str]] = {}
    previous = b""
    for _ in range(count):
        if at + fixed > end:
            raise ValueError("an entry runs past the end of the index")
        start = at
        _cs, _cn, mtime_s, mtime_n, _dev, ino, _mode, _uid, _gid, size = struct.unpack(">10I", data[at:at + 40])
        oid = data[at + 40:at + 40 + hash_size].hex()
        (flags,) = struct.unpack(">H", data[at + 40 + hash_size:at + fixed])
        at += fixed
        if flags & 0x4000:
            if version < 3:
                raise ValueError("extended flags in a version 2 index")
            at += 2
        stage = (flags >> 12) & 0x3
        if version == 4:
            strip, at = _varint(data, at)
            nul = data.index(b"\0", at, end)
            if strip > len(previous):
                raise ValueError("a path prefix longer than the previous path")
            name = previous[:len(previous) - strip] + data[at:nul]
            at = nul + 1
        else:
            nul = data.index(b"\0", at, end)
            name = data[at:nul]
            at = start + ((at - start + len(name) + 8) & ~7)  # NUL-padded to a multiple of 8
        previous = name
        path = name.decode("utf-8", "surrogateescape")
        if not path.startswith(prefix):
            continue
        if stage == 0:
            stage0[path] = _Entry(oid, (mtime_s, mtime_n), size, ino)
        else:
            others.setdefault(path, set()).add(oid)
    while at + 8 <= end:  # extensions: one names the shared index of a split index
        signature, length = data[at:at + 4], struct.unpack(">I", data[at + 4:at + 8])[0]
        if signature == b"link":
            raise ValueError("a split index (core.splitIndex): its entries live in another file")
        at += 8 + length
    return _Index(stage0, others)


class Repo:
    """One repository's answers about the files of a project's tools dir.

    Args:
        root: the project root (its repository is located as the built-ins locate it).
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.problem: str | None = None
        try:
            self.repository = locate_repository(root)
        except (RepositoryRefused, OSError) as exc:
            self.repository = None
            self.problem = str(exc)
        self._index: _Index | None = None
        self._index_problem: str | None = None
        self._format = "sha1"
        if self.repository is not None:
            try:
                self._format = _object_format(self.repository.common_dir)
            except OSError as exc:
                self.problem = f"cannot read the repository's config: {exc}"

    @property
    def format(self) -> str:
        return self._format

    def _load_index(self, prefix: str) -> _Index | None:
        assert self.repository is not None
        if self._index is None and self._index_problem is None:
            path = self.repository.git_dir / "index"
            try:
                self._index = _cached_index(path, prefix, 32 if self._format == "sha256" else 20)
            except (OSError, ValueError) as exc:
                self._index_problem = f"cannot read the index: {exc}"
        return self._index

    def _head_blobs(self, paths: list[str]) -> dict[str, str] | None:
        """The ids ``HEAD``'s tree has at ``paths`` (absent paths left out); None when it cannot be
        read (in time: ``HEAD_TIMEOUT``)."""
        assert self.repository is not None
        if self._format != "sha1":
            return None  # libgit2 as pygit2 ships it reads SHA-1 repositories only
        try:
            reader = subprocess.Popen(
                [sys.executable, "-E", "-P", "-c", _READ_HEAD, str(self.repository.git_dir), *paths],
                cwd="/", stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            )
        except OSError:
            return None
        _READERS.add(reader)
        try:
            out, _ = reader.communicate(timeout=HEAD_TIMEOUT)
            found = json.loads(out) if reader.returncode == 0 else None
        except (subprocess.TimeoutExpired, ValueError):
            return None
        finally:
            if reader.poll() is None:
                reader.kill()
                reader.wait()
            _READERS.discard(reader)
        return found if isinstance(found, dict) else None

    def origins(self, files: dict[str, tuple[bytes, os.stat_result]]) -> dict[str, Origin]:
        """Where each file's content came from, by absolute path: ``git`` (a blob committed for its
        path, or written by git and untouched since), ``own`` (anything else: your edit, a file git
        does not track), ``unknown`` (the repository cannot be read)."""
        if self.repository is None:
            return {path: ("unknown" if self.problem else "own") for path in files}
        worktree = os.path.realpath(self.repository.worktree)
        # Where git keeps it: a symlinked tools dir or module (committed as a link) is the file it names.
        relative = {path: Path(os.path.relpath(os.path.realpath(path), worktree)).as_posix() for path in files}
        inside = {path: rel for path, rel in relative.items() if not rel.startswith("../")}
        prefix = os.path.commonprefix(list(inside.values())) if inside else ""
        index = self._load_index(prefix[: prefix.rfind("/") + 1])
        verdicts: dict[str, Origin] = {path: "own" for path in files}
        undecided = []
        for path, rel in inside.items():
            data, info = files[path]
            blob = blob_id(data, self._format)
            if index is not None and _in_index(index, rel, blob, info):
                verdicts[path] = "git"
            elif index is None:
                undecided.append(path)  # without an index, HEAD says what git wrote
        if not undecided:
            return verdicts
        head = self._head_blobs([inside[path] for path in undecided])
        for path in undecided:
            if head is None:
                verdicts[path] = "unknown"  # neither the index nor HEAD could be read
            elif head.get(inside[path]) == blob_id(files[path][0], self._format):
                verdicts[path] = "git"
        return verdicts


_READERS: set[subprocess.Popen[bytes]] = set()


def stop_readers() -> None:
    """Kill the processes reading ``HEAD`` now (the daemon is stopping)."""
    for reader in list(_READERS):
        try:
            reader.kill()
        except OSError:
            pass


def _cached_index(path: Path, prefix: str, hash_size: int) -> _Index:
    """The entries under ``prefix`` of the index at ``path``, parsed again only when the file changed.

    Raises:
        OSError: there is no index, or it cannot be read.
        ValueError: it does not parse.
    """
    info = os.stat(path)
    key = (info.st_ino, info.st_size, info.st_mtime_ns)
    cached = _INDEXES.get((str(path), prefix))
    if cached is not None and cached[0] == key:
        return cached[1]
    data = read_bounded(path, MAX_INDEX_BYTES)
    if data is None:
        raise FileNotFoundError(f"no index at {path}")
    index = _parse_index(data, hash_size, prefix)
    if len(_INDEXES) >= _MAX_INDEXES:
        _INDEXES.clear()
    _INDEXES[(str(path), prefix)] = (key, index)
    return index


def _in_index(index: _Index, rel: str, blob: str, info: os.stat_result) -> bool:
    entry = index.stage0.get(rel)
    if entry is not None:
        if entry.oid == blob:
            return True
        mtime = (int(info.st_mtime_ns // 1_000_000_000) & 0xFFFFFFFF, info.st_mtime_ns % 1_000_000_000)
        if entry.mtime == mtime and entry.size == info.st_size & 0xFFFFFFFF and entry.ino == info.st_ino & 0xFFFFFFFF:
            return True  # git wrote it (converted on the way out) and nobody has touched it since
    return blob in index.others.get(rel, ())


def origins(root: Path, files: dict[str, tuple[bytes, os.stat_result]]) -> dict[str, Origin]:
    """``Repo(root).origins(files)``: where the content of each file of ``root``'s tools came from."""
    return Repo(root).origins(files)
