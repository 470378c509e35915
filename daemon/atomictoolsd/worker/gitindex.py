"""The submodules a git repository's index lists, read without running git: their ``.git`` stays
read-only to a confined worker (``sandbox``), as ``git status`` in the repository runs git in each
one checked out, with its ``.git``'s config. ``doctor`` reads whether the index lists a file (as
``git ls-files`` would say) the same way: it runs no git on a repository it checks.

A small reader of git's index format (versions 2 to 4, SHA-1 and SHA-256; git's
``Documentation/gitformat-index.txt``): it walks the entries for their mode and path, and nothing
else. What it cannot read lists no submodule. Standard library only: it runs in the confined
workers' fork server.
"""

from __future__ import annotations

import os
import stat
import struct
from collections.abc import Iterator

__all__ = ["MAX_INDEX_BYTES", "Unjudgeable", "gitlinks", "index_paths", "submodule_git_dirs", "submodules_of"]

# Per index file: its identity and the submodules it lists. Read again only once it changed.
_SUBMODULES: dict[str, tuple[tuple[int, ...], list[str]]] = {}
_GITLINK = 0o160000
_MAX_REPOSITORIES = 64  # submodules of submodules, each with an index of its own


def submodule_git_dirs(project: str) -> list[str]:
    """The ``.git`` of each submodule that the index of ``project``'s repository lists, there or
    not, and of theirs in turn: ``git status`` runs git in each one checked out, with its
    ``.git``'s config (core.fsmonitor)."""
    found = _repository_of(project)
    git_dirs: list[str] = []
    pending = [found] if found is not None else []
    seen: set[str] = set()
    while pending and len(seen) < _MAX_REPOSITORIES:
        worktree, index = pending.pop()
        if index in seen:
            continue
        seen.add(index)
        for path in _listed_gitlinks(index):
            submodule = os.path.join(worktree, path)
            git_dirs.append(os.path.join(submodule, ".git"))
            inner = _index_of(submodule)
            if inner is not None:
                pending.append((submodule, inner))
    return git_dirs


class Unjudgeable(Exception):
    """A repository whose submodules cannot all be known: its index cannot be read whole, or there
    are more repositories than ``_MAX_REPOSITORIES``. The argument is the work tree."""


MAX_INDEX_BYTES = 256 << 20  # an index larger than this is not read on the daemon's behalf


def submodules_of(directory: str) -> Iterator[str]:
    """The ``.git`` of each submodule the index of ``directory``'s repository lists (its shared
    index too: a split index keeps entries there), then of theirs in turn, for a judgement that
    must know them all: lazily, a submodule's own index read only once the caller took its
    ``.git`` and asked for more, and never failing open.

    Raises:
        Unjudgeable: an index is there but cannot be read whole (not a regular file, larger than
            ``MAX_INDEX_BYTES``, a format this reader does not know), or there are more than
            ``_MAX_REPOSITORIES`` repositories.
    """
    found = _repository_of(directory)
    pending = [found] if found is not None else []
    seen: set[str] = set()
    while pending:
        worktree, index = pending.pop()
        if index in seen:
            continue
        if len(seen) >= _MAX_REPOSITORIES:
            raise Unjudgeable(worktree)
        seen.add(index)
        for path in _every_gitlink(worktree, index):
            submodule = os.path.join(worktree, path)
            yield os.path.join(submodule, ".git")
            inner = _index_of(submodule)
            if inner is not None:
                pending.append((submodule, inner))


def _every_gitlink(worktree: str, index: str) -> list[str]:
    """The gitlinks of ``index`` and of every shared index beside it; ``Unjudgeable`` when one is
    there and cannot be read whole."""
    try:
        names = [n for n in os.listdir(os.path.dirname(index)) if n.startswith("sharedindex.")]
    except (OSError, ValueError):
        names = []
    links: dict[str, None] = {}
    for path in (index, *(os.path.join(os.path.dirname(index), n) for n in names)):
        try:
            info = os.stat(path)
        except FileNotFoundError:
            continue  # no index yet: nothing is listed
        except (OSError, ValueError):
            raise Unjudgeable(worktree) from None
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_INDEX_BYTES:
            raise Unjudgeable(worktree)
        key = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
        cached = _JUDGED.get(path)
        if cached is None or cached[0] != key:
            cached = _JUDGED[path] = (key, _judged_gitlinks(worktree, path))
        links.update(dict.fromkeys(cached[1]))
    return list(links)


# Per index file judged: its identity and its gitlinks (a large index takes ~0.5 s to parse: once).
_JUDGED: dict[str, tuple[tuple[int, ...], list[str]]] = {}


def _judged_gitlinks(worktree: str, path: str) -> list[str]:
    data = _read_regular(path)
    if data is None:
        raise Unjudgeable(worktree)
    if b"\x00\x00\xe0\x00" not in data:  # no gitlink's mode anywhere: nothing to parse
        return []
    entries = _entries(data)
    if entries is None:
        raise Unjudgeable(worktree)
    return [p for mode, p in entries if mode & 0o170000 == _GITLINK]


def _listed_gitlinks(index: str) -> list[str]:
    try:
        info = os.stat(index)
    except (OSError, ValueError):  # ValueError: a NUL in the path a .git file names
        return []
    key = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
    cached = _SUBMODULES.get(index)
    if cached is None or cached[0] != key:
        cached = _SUBMODULES[index] = (key, gitlinks(index))
    return cached[1]


def _repository_of(directory: str) -> tuple[str, str] | None:
    """The work tree and the index file of the git repository holding ``directory``, found as git
    finds it (the nearest ``.git``); None when there is none."""
    while True:
        index = _index_of(directory)
        if index is not None and _usable(os.path.dirname(index)):
            return directory, index
        parent = os.path.dirname(directory)
        if parent == directory:
            return None
        directory = parent


def _usable(git_dir: str) -> bool:
    """Whether git could take ``git_dir`` for its repository (``objects/``, ``refs/``, ``HEAD``):
    git passes by a ``.git`` that is not, and so does the search for the index."""
    return all(os.path.isdir(os.path.join(git_dir, d)) for d in ("objects", "refs")) and os.path.lexists(
        os.path.join(git_dir, "HEAD"))


def _index_of(directory: str) -> str | None:
    """The index file of the repository whose ``.git`` is in ``directory`` (a directory, or a file
    naming one: a worktree's, a submodule's); None when it has none."""
    dot_git = os.path.join(directory, ".git")
    try:
        info = os.stat(dot_git)
    except (OSError, ValueError):
        return None
    if stat.S_ISDIR(info.st_mode):
        return os.path.join(dot_git, "index")
    data = _read_regular(dot_git, 4096)
    # As git reads a .git file: "gitdir: " and the path up to the trailing line ends.
    if data is None or not data.startswith(b"gitdir: "):
        return None
    return os.path.join(directory, os.fsdecode(data[8:].rstrip(b"\r\n")), "index")


def _read_regular(path: str, limit: int | None = None) -> bytes | None:
    """The bytes of ``path`` (at most ``limit``) when it is a regular file; None otherwise: a FIFO
    would block the reader, the daemon's event loop among them."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except (OSError, ValueError):
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None
        chunks = []
        left = info.st_size if limit is None else min(limit, info.st_size)
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def gitlinks(index: str) -> list[str]:
    """The paths of the submodules (gitlinks) a git index file lists; [] when it cannot be read."""
    data = _read_regular(index)
    if data is None:
        return []
    # Each entry holds its mode in 4 bytes: an index without a gitlink's (most) needs no parsing.
    if b"\x00\x00\xe0\x00" not in data:
        return []
    return [path for mode, path in _entries(data) or () if mode & 0o170000 == _GITLINK]


def index_paths(index: str) -> list[str] | None:
    """Every path a git index file lists (what ``git ls-files`` prints); None when it cannot be read
    or is not a regular file (a FIFO would block)."""
    data = _read_regular(index)
    if data is None:
        return None
    entries = _entries(data)
    return None if entries is None else [path for _mode, path in entries]


def _entries(data: bytes) -> list[tuple[int, str]] | None:
    """The mode and path of each entry of an index file's ``data``; None when it is not one."""
    if data[:4] != b"DIRC" or len(data) < 12:
        return None
    version, count = struct.unpack_from(">II", data, 4)
    for hash_size in (20, 32):  # SHA-1, SHA-256: the wrong one fails the first entry's checks
        try:
            return _index_entries(data, version, count, hash_size)
        except (ValueError, IndexError):
            continue
    return None


def _index_entries(data: bytes, version: int, count: int, hash_size: int) -> list[tuple[int, str]]:
    """Walk the entries of an index (git's index-format.txt, versions 2 to 4)."""
    if version not in (2, 3, 4):
        raise ValueError(f"index version {version}")
    fixed = 40 + hash_size + 2  # stat data and mode, the object's hash, the flags
    entries: list[tuple[int, str]] = []
    previous = b""
    pos = 12
    for _ in range(count):
        mode = int.from_bytes(data[pos + 24:pos + 28], "big")
        flags = int.from_bytes(data[pos + fixed - 2:pos + fixed], "big")
        start = pos + fixed + (2 if version >= 3 and flags & 0x4000 else 0)
        if version == 4:
            strip, start = _varint(data, start)
            end = data.index(b"\0", start)
            if strip > len(previous):
                raise ValueError("bad path prefix")
            path = previous[:len(previous) - strip] + data[start:end]
            pos = end + 1
        else:
            end = data.index(b"\0", start)
            path = data[start:end]
            pos += (end - pos + 8) & ~7
            if pos > len(data) or data[end:pos].strip(b"\0"):
                raise ValueError("bad padding")
        if not path or flags & 0xFFF != min(len(path), 0xFFF):
            raise ValueError("bad path length")
        entries.append((mode, os.fsdecode(path)))
        previous = path
    return entries


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """git's offset varint (an index v4 entry's prefix length): its value and where it ends."""
    byte = data[pos]
    value = byte & 0x7F
    pos += 1
    while byte & 0x80:
        byte = data[pos]
        value = ((value + 1) << 7) | (byte & 0x7F)
        pos += 1
    return value, pos
