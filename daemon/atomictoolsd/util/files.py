"""Reading a file whose owner may be hostile (a repository's, a worker's) without being held by it.

A file named in a repository can be a FIFO (an open that never returns), a device, ``/proc/kmsg``
or a sparse file of terabytes. ``read_bounded`` opens without blocking and reads only a regular
file, and only up to its limit, so the daemon's event loop is never held by what it reads.

Lives in ``util/``: used by the registry and the environments, below both. Never imported by a worker.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = ["read_bounded", "read_regular"]


def read_bounded(path: Path | str, limit: int) -> bytes | None:
    """The bytes of ``path`` if it is a regular file of at most ``limit`` bytes; None if absent.

    Raises:
        OSError: it is something else (a FIFO, a device, a directory), larger, or unreadable.
    """
    read = read_regular(path, limit)
    return None if read is None else read[0]


def read_regular(path: Path | str, limit: int) -> tuple[bytes, os.stat_result] | None:
    """``read_bounded``, with the file's stat as it was read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except FileNotFoundError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(f"{path} is not a regular file")
        if info.st_size > limit:
            raise OSError(f"{path} is larger than {limit} bytes")
        chunks = []
        left = limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if len(data) > limit:
            raise OSError(f"{path} is larger than {limit} bytes")
        return data, info
    finally:
        os.close(fd)
