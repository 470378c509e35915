"""What wakes the file watcher: an inotify descriptor that becomes readable when a watched directory
changes, so the watcher sleeps in ``select`` while nothing happens.

watchfiles reports changes from a loop that wakes every ``step`` milliseconds and takes the GIL each
time; with the 5–10 ms step a quick reload needs, that loop alone costs ~0.4–1 % of a core around
the clock (bench/reload.py). The watcher therefore calls watchfiles only after the descriptor
became readable, and watchfiles then groups and reports the changes as usual. The descriptor
watches the same directories (``inotify_init1`` and ``inotify_add_watch`` through ctypes; no events
are decoded). Off Linux ``Inotify.create`` returns None and the watcher keeps watchfiles' loop
running.

Knows nothing of tools or the registry.
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys
from collections.abc import Iterable

__all__ = ["Inotify"]

# <sys/inotify.h>
_IN_MODIFY = 0x002
_IN_ATTRIB = 0x004
_IN_CLOSE_WRITE = 0x008
_IN_MOVED_FROM = 0x040
_IN_MOVED_TO = 0x080
_IN_CREATE = 0x100
_IN_DELETE = 0x200
_IN_DELETE_SELF = 0x400
_IN_MOVE_SELF = 0x800
_IN_ONLYDIR = 0x01000000
_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC
# What changes a directory's entries or a file's content; never reads or opens (workers read tools).
_MASK = (
    _IN_MODIFY | _IN_ATTRIB | _IN_CLOSE_WRITE | _IN_MOVED_FROM | _IN_MOVED_TO | _IN_CREATE | _IN_DELETE
    | _IN_DELETE_SELF | _IN_MOVE_SELF | _IN_ONLYDIR
)

_libc: ctypes.CDLL | None = None


class Inotify:
    """An inotify descriptor over some directories, readable after any of them changed."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    @classmethod
    def create(cls, directories: Iterable[str]) -> Inotify | None:
        """An inotify descriptor over ``directories``; None off Linux.

        Raises:
            FileNotFoundError: one of the directories does not exist (any more).
            OSError: the kernel refused (for one, the per-user inotify limits).
        """
        global _libc
        if not sys.platform.startswith("linux"):
            return None
        if _libc is None:
            _libc = ctypes.CDLL(None, use_errno=True)
        fd = _libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            code = ctypes.get_errno()
            raise OSError(code, f"inotify_init1: {os.strerror(code)}")
        try:
            for directory in directories:
                if _libc.inotify_add_watch(fd, os.fsencode(directory), _MASK) < 0:
                    code = ctypes.get_errno()
                    if code in (errno.ENOENT, errno.ENOTDIR):
                        raise FileNotFoundError(code, os.strerror(code), directory)
                    raise OSError(code, f"inotify_add_watch: {os.strerror(code)}", directory)
        except BaseException:
            os.close(fd)
            raise
        return cls(fd)

    def drain(self) -> None:
        """Read away the events that made it readable (what they say does not matter)."""
        while True:
            try:
                if not os.read(self.fd, 65536):
                    return
            except BlockingIOError:
                return

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
