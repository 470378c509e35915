"""What a worker says it read, judged against the disk by the daemon without trusting either.

A worker reports the bytes it loaded from its module and from each helper it imported (``_shared.py``,
a ``_lib/`` package's files); the registry commits a load only when those bytes are still on disk
(``scanning.Scanner._reload_torn``). The report is the worker's word and the tools dir is the project's
files: a confined worker may write both. So the daemon:

- looks only at files of the module's own tools dir (``Worker`` drops every other path a report
  names), reached from that dir by descriptors, one component at a time, never following a link (a
  module or helper that is a link is judged by its size and mtime only);
- reads regular files only, opened without blocking (a FIFO, socket or device there is not what a
  worker read: the load is torn), and at most ``MAX_BYTES`` of each (a larger file goes unjudged);
- does it in a thread, for at most ``CHECK_SECONDS``: a check that does not finish by then counts as
  torn, and the event loop never waits on a file.
"""

from __future__ import annotations

import asyncio
import errno
import os
import stat
import time
import zlib
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from atomictoolsd.pool.worker import Worker

__all__ = [
    "CHECK_SECONDS", "HELPER_SETTLE", "MAX_BYTES", "off_loop", "read_back", "read_whole", "read_worker_back", "same_bytes",
    "settle_helpers", "youngest_mtime",
]

MAX_BYTES = 16 * 1024 * 1024  # a module or helper larger than this is not read back
CHECK_SECONDS = 5.0  # the longest the daemon spends judging one scan's loads
# Seconds a helper a load read must have been left alone before the load is judged whole: a writer
# that truncates and then writes in several steps shows the same half-written bytes to the worker
# and to a check made at once.
HELPER_SETTLE = 0.2
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_LINK = errno.ELOOP, errno.ENOTDIR  # what O_NOFOLLOW (with O_DIRECTORY: ENOTDIR) says of a link

T = TypeVar("T")


async def off_loop(work: Callable[[], T], default: T, seconds: float = CHECK_SECONDS) -> T:
    """``work()`` in a thread; ``default`` when it takes longer than ``seconds`` (it then finishes
    unobserved: a thread cannot be stopped, the loop goes on)."""
    try:
        return await asyncio.wait_for(asyncio.to_thread(work), seconds)
    except TimeoutError:
        return default


def read_whole(root: str, loads: Sequence[tuple[str, list[int] | None, list[list[Any]]]]) -> list[bool]:
    """For each ``(module path, fingerprint, helpers)`` of a load from the tools dir ``root``, whether
    the bytes its worker read (``fingerprint``: ``[size, crc32]`` of the module, None if it read none;
    ``helpers``: ``[path, size, crc32]``) are the bytes on disk now."""
    return [
        (fingerprint is None or same_bytes(root, path, fingerprint))
        and all(same_bytes(root, helper, [size, crc]) for helper, size, crc in helpers)
        for path, fingerprint, helpers in loads
    ]


def same_bytes(root: str, path: str, read: list[int]) -> bool:
    """Whether the file at ``path`` (inside ``root``) holds what was read (``[size, crc32]``).

    False when it differs, is gone, or is not a regular file; True too when it cannot be judged
    without following a link or reading more than ``MAX_BYTES``.
    """
    parts = os.path.relpath(path, root).split(os.sep)
    if not parts or ".." in parts or "." in parts:
        return False
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return _same_below(fd, parts, read)
    finally:
        os.close(fd)


def _same_below(fd: int, parts: list[str], read: list[int]) -> bool:
    """``same_bytes`` for ``parts`` below the directory ``fd`` (which this closes or leaves to the caller)."""
    opened: list[int] = []
    try:
        for part in parts[:-1]:
            try:
                fd = os.open(part, _DIR, dir_fd=fd)
            except OSError as exc:
                return exc.errno in _LINK and _is_link(part, fd)
            opened.append(fd)
        try:
            file_fd = os.open(parts[-1], _FILE, dir_fd=fd)
        except OSError as exc:
            return exc.errno in _LINK and _is_link(parts[-1], fd)
        try:
            return _holds(file_fd, read)
        finally:
            os.close(file_fd)
    finally:
        for opened_fd in opened:
            os.close(opened_fd)


def _is_link(name: str, dir_fd: int) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _holds(fd: int, read: list[int]) -> bool:
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        return False  # a FIFO, a socket or a device: nothing a worker loaded a module from
    if info.st_size > MAX_BYTES:
        return True
    chunks = []
    size = 0
    while size <= MAX_BYTES:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    if size > MAX_BYTES:
        return True  # it grew past the bound while read
    data = b"".join(chunks)
    return read == [len(data), zlib.crc32(data)]


def youngest_mtime(paths: Iterable[str]) -> float:
    """The latest modification time among ``paths`` (0 when none can be read), without following a link."""
    youngest = 0.0
    for path in paths:
        try:
            youngest = max(youngest, os.stat(path, follow_symlinks=False).st_mtime)
        except (OSError, ValueError):
            continue
    return youngest


async def read_back(root: Path, loads: list[tuple[str, list[int] | None, list[list[Any]]]]) -> list[bool]:
    """``read_whole`` off the loop, bounded in time: a check that does not finish is torn."""
    if not loads:
        return []
    return await off_loop(lambda: read_whole(str(root), loads), [False] * len(loads))


async def read_worker_back(root: Path, path: str, worker: Worker) -> bool:
    """Whether a worker started for a call read the module at ``path`` and its helpers whole, once
    those have settled (``settle_helpers``)."""
    await settle_helpers(helper[0] for helper in worker.helpers)
    return (await read_back(root, [(path, worker.fingerprint, worker.helpers)]))[0]


async def settle_helpers(helpers: Iterable[str]) -> None:
    """Wait until none of ``helpers`` was written in the last ``HELPER_SETTLE`` seconds (at most that
    long: a file still being written then differs from what was read, and the load is torn)."""
    paths = list(helpers)
    if not paths:
        return
    youngest = await off_loop(lambda: youngest_mtime(paths), 0.0)
    wait = youngest + HELPER_SETTLE - time.time()
    if wait > 0:
        await asyncio.sleep(min(wait, HELPER_SETTLE))
