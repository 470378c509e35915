"""Removing what lies in a directory a worker can write (its temporary dir, its spill dir).

A confined worker writes there, and so may what it started, while the daemon or the fork server
removes: it may put links, FIFOs and directories of its making there, and swap a directory for a
link or a FIFO at any moment (``renameat2``). So nothing is reached by path: each directory is
opened by descriptor without following a link and without blocking (``O_NOFOLLOW``, ``O_NONBLOCK``,
``O_DIRECTORY``: a FIFO in a directory's place fails at once), entered only when it is still the
directory that was looked at, and its entries are looked at and removed relative to it, a link as a
link, never followed. The walk goes a bounded number of levels down; what lies deeper stays.

Runs in the daemon (spill housekeeping) and in the fork server; standard library only.
"""

from __future__ import annotations

import math
import os
import stat

__all__ = ["DIR_FLAGS", "remove_older", "remove_tree", "walk_dir"]

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_TREE_DEPTH = 64  # levels ``remove_tree`` walks; a deeper tree is left (it cannot be removed then)


def remove_older(fd: int, cutoff: float, depth: int) -> int:
    """In the directory ``fd``: remove each entry older than ``cutoff`` (an mtime) that is not a
    directory, and walk each directory, ``depth`` more levels down (``walk_dir``); return how many
    entries were removed."""
    try:
        names = os.listdir(fd)
    except OSError:
        return 0
    removed = 0
    for name in names:
        try:
            info = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISDIR(info.st_mode):
            if depth > 0:
                removed += walk_dir(fd, name, info, cutoff, depth - 1)
        elif info.st_mtime < cutoff:
            try:
                os.unlink(name, dir_fd=fd)  # the name itself: a link goes, what it points to stays
                removed += 1
            except OSError:
                continue
    return removed


def walk_dir(parent: int, name: str, info: os.stat_result, cutoff: float, depth: int) -> int:
    """``remove_older`` in the directory ``name`` of ``parent`` (looked at as ``info``), then
    remove it if it is empty and older than ``cutoff``."""
    try:
        fd = os.open(name, DIR_FLAGS, dir_fd=parent)
    except OSError:
        return 0  # swapped for a link or a FIFO, or gone, since it was looked at: not entered
    try:
        now = os.fstat(fd)
        if (now.st_dev, now.st_ino) != (info.st_dev, info.st_ino):
            return 0  # another directory than the one looked at
        removed = remove_older(fd, cutoff, depth)
    finally:
        os.close(fd)
    if info.st_mtime < cutoff:
        try:
            os.rmdir(name, dir_fd=parent)  # fails while it holds an entry still young enough
        except OSError:
            pass
    return removed


def remove_tree(path: str) -> None:
    """Remove the directory ``path`` and everything in it, as far as it can be done safely (see the
    module docstring); never raises."""
    parent, name = os.path.split(os.path.abspath(path))
    try:
        parent_fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        info = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
        if stat.S_ISDIR(info.st_mode):
            walk_dir(parent_fd, name, info, math.inf, _TREE_DEPTH)
    except OSError:
        pass
    finally:
        os.close(parent_fd)
