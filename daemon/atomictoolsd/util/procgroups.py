"""Ending what a worker started: its process group and, on Linux, the rest of its session.

A worker leads a session and a process group of its own (the fork server calls ``setsid`` in it). A
program a tool starts stays in the worker's group unless it is given a group of its own, as the
``shell`` handler does (``process_group=0``) so that its timeout can end the command with its
children; such a group is still in the worker's session. So a dead worker's group and its session
are ended together, before the worker is reaped: until then its pid holds both ids, and no other
process can have them. A program that made a session of its own (``setsid``,
``start_new_session=True``) left on purpose and is not followed.

Where processes cannot be listed by session (no ``/proc``: macOS), only the group is ended.

The fork server imports this module: ``os``, ``signal`` and ``sys`` only, nothing to pay for at each
fork.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterable

from atomictoolsd.util.procstat import SESSION, STATE, proc_stat

__all__ = ["kill_worker_processes", "session_members"]

_BY_SESSION = sys.platform.startswith("linux")


def session_members(sessions: set[int]) -> list[int]:
    """Processes (not zombies, not this one) whose session id is in ``sessions``; Linux only."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    me = os.getpid()
    members = []
    for name in names:
        if not name.isdigit():
            continue
        fields = proc_stat(name, SESSION + 1)  # runs once per worker exit: split no further than needed
        if fields is None:
            continue  # it ended meanwhile
        try:
            if fields[STATE] != b"Z" and int(fields[SESSION]) in sessions and int(name) != me:
                members.append(int(name))
        except (IndexError, ValueError):
            continue
    return members


def kill_worker_processes(workers: Iterable[int]) -> None:
    """SIGKILL the process group of each worker pid in ``workers`` and, on Linux, every other
    process of its session. Call it before the workers are reaped."""
    pids = set(workers)
    for pid in pids:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    if not _BY_SESSION or not pids:
        return
    for _ in range(5):  # a member may fork while the list is read: look again until none is left
        members = session_members(pids)
        if not members:
            return
        for member in members:
            try:
                os.kill(member, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
