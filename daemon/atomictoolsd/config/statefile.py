"""Writing a state file whole or not at all: the trust store, the bridges manifest, the definition
cache, an agent's config, a service unit.

A file is written to a temporary sibling named ``.<name>.atomictoolsd-<pid>.tmp``, synced, and renamed over the
target, so a reader sees the old file or the new one, never half of either. A write that fails (a
full disk, a used-up quota, a read-only filesystem, no permission) removes its temporary file and
raises ``StateWriteError``, whose message names the file and says what to do. A writer killed
between creating its temporary file and renaming it leaves one behind: ``sweep`` removes those
whose writer is gone, and every ``write_atomic`` sweeps its target's before writing.

This module must never write the target in place, and never remove a temporary file a live
writer may still rename. Standard library only: the CLI and the workers import it.
"""

from __future__ import annotations

import errno
import os
import re
import shlex
import time
from pathlib import Path

__all__ = ["STALE_AFTER", "StateWriteError", "explain_write_error", "sweep", "write_atomic"]

STALE_AFTER = 600.0
"""Seconds after which a temporary file is stale even if a process with its writer's pid runs (a
write takes milliseconds; the pid may have been reused)."""


class StateWriteError(OSError):
    """A state file could not be written; nothing was changed, and the message says what to do."""

    def __str__(self) -> str:
        return str(self.strerror)


def explain_write_error(path: Path | str, exc: OSError) -> str:
    """Why writing ``path`` failed, in words, and what to do about it."""
    where = Path(path)
    directory = shlex.quote(str(where.parent))
    code = exc.errno
    if code in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        what = {
            errno.ENOSPC: "the disk holding it is full",
            errno.EDQUOT: "your disk quota there is used up",
            errno.EFBIG: "the file size limit of this process was reached (ulimit -f)",
        }[code]
        advice = f"free some space (df -h {directory}) and run the command again"
    elif code == errno.EROFS:
        what = "its filesystem is mounted read-only"
        advice = "point the state at a writable place (XDG_STATE_HOME, ATOMICTOOLS_STATE_DIR) or remount it"
    elif code in (errno.EACCES, errno.EPERM):
        what = "you may not write in its directory"
        advice = f"check the owner and mode of {directory} (ls -ld {directory})"
    else:
        what = exc.strerror or str(exc)
        advice = "fix that and run the command again"
    return f"cannot write {where}: {what}; nothing was changed; {advice}"


def _temporary_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.atomictoolsd-{os.getpid()}.tmp")


_OURS = re.compile(r"atomictoolsd-(\d+)(?:\.tmp)?")
# In a directory of our own, also the names earlier versions used (``.<name>.<pid>``, ``….tmp``).
_OURS_AND_OLDER = re.compile(r"(?:atomictoolsd-)?(\d+)(?:\.tmp)?")


def _writer_pid(name: str, target: str, pattern: re.Pattern[str]) -> int | None:
    """The pid in a temporary file name of ``target``, None when the name is not one of ours."""
    prefix = f".{target}."
    if not name.startswith(prefix):
        return None
    match = pattern.fullmatch(name[len(prefix):])
    return int(match.group(1)) if match else None


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: not ours to judge
    return True


def sweep(path: Path | str, *, shared_dir: bool = False) -> list[Path]:
    """Remove the temporary files of ``path`` left by writers that were killed; return them.

    One is stale when no process has its writer's pid any more, or when it is older than
    ``STALE_AFTER`` seconds. Our own pid's file is left alone: it may be being written now. In a
    ``shared_dir`` (an agent's config in the home directory) only names with our tag count: another
    program's ``.<name>.<pid>.tmp`` is not ours to judge.
    """
    pattern = _OURS if shared_dir else _OURS_AND_OLDER
    path = Path(path)
    removed = []
    try:
        entries = list(os.scandir(path.parent))
    except OSError:
        return removed
    now = time.time()
    for entry in entries:
        pid = _writer_pid(entry.name, path.name, pattern)
        if pid is None or pid == os.getpid():
            continue
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if _alive(pid) and now - info.st_mtime < STALE_AFTER:
            continue
        try:
            os.unlink(entry.path)
        except OSError:
            continue
        removed.append(Path(entry.path))
    return removed


def write_atomic(path: Path | str, data: bytes, mode: int = 0o600, *, fsync: bool = True, shared_dir: bool = False) -> None:
    """Replace ``path`` with ``data`` atomically (its mode: ``mode``).

    ``shared_dir``: the directory is not ours alone (see ``sweep``).

    Raises:
        StateWriteError: the file could not be written; it is as it was, and no temporary file is
            left. ``errno`` is the cause's.
    """
    path = Path(path)
    sweep(path, shared_dir=shared_dir)
    temporary = _temporary_name(path)
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, mode)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if fsync:
                os.fsync(fd)
            os.fchmod(fd, mode)  # the umask may have taken bits from the mode the file was created with
        finally:
            os.close(fd)
        os.replace(temporary, path)
    except OSError as exc:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise StateWriteError(exc.errno, explain_write_error(path, exc)) from exc
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise
