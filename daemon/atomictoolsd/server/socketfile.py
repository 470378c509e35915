"""The socket and lock files: the single-instance lock, binding the socket or adopting the service
manager's, and who is at the other end of a connection.

asyncio and uvloop silently delete an existing socket file when they bind, so the lock is taken
before the socket is touched, and a socket file is replaced only when nothing answers on it (a killed
daemon's). Knows nothing of sessions, the registry or the workers.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import socket
import stat
import struct
import sys
import time
from pathlib import Path
from typing import Any

from atomictoolsd.config.paths import PathError

__all__ = [
    "AlreadyRunning", "InstanceLock", "adopt_socket", "bind_socket", "listener_pid", "peer_credentials",
    "wait_until_served",
]

log = logging.getLogger("atomictoolsd")


class AlreadyRunning(Exception):
    """Another daemon holds the instance lock."""

    def __init__(self, pid: int | None) -> None:
        super().__init__(f"atomictoolsd is already running (pid {pid})" if pid else "atomictoolsd is already running")
        self.pid = pid


def peer_credentials(sock: Any) -> tuple[int | None, int | None]:
    """The (pid, uid) of the process at the other end of a Unix socket, where the OS tells."""
    if hasattr(socket, "SO_PEERCRED"):
        pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
        return pid, uid
    if sys.platform == "darwin":
        # LOCAL_PEERCRED (1) at SOL_LOCAL (0) gives a struct xucred: version, uid, ngroups, groups.
        data = sock.getsockopt(0, 0x001, struct.calcsize("IIh16I"))
        _version, uid = struct.unpack_from("II", data)
        pid_data = sock.getsockopt(0, 0x002, 4)  # LOCAL_PEERPID
        return struct.unpack("i", pid_data)[0], uid
    return None, None


class InstanceLock:
    """``flock`` on a pid file in the runtime dir, held for the daemon's life."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or raise ``AlreadyRunning`` with the holder's pid."""
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                os.close(fd)
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise AlreadyRunning(self.read_pid()) from None
                raise
            # The previous holder may have unlinked the file between our open and our lock.
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self.fd = fd

    def read_pid(self) -> int | None:
        try:
            text = self.path.read_text().strip()
        except OSError:
            return None
        return int(text) if text.isdigit() else None

    def holder(self) -> int | None:
        """The pid written by the process that holds this lock now, or None when no process holds
        it (no file, or a killed daemon's file that anyone could lock). For a process that does not
        hold the lock: the CLI finds a daemon this way when its socket is gone."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    return None
            else:
                return None  # we could lock it: nobody holds it
            text = os.read(fd, 32).decode(errors="replace").strip()
        finally:
            os.close(fd)
        return int(text) if text.isdigit() else None

    def held(self) -> bool:
        """Whether the file at the lock's path is still the one this daemon locked (not deleted)."""
        if self.fd is None:
            return False
        try:
            return os.fstat(self.fd).st_ino == os.stat(self.path).st_ino
        except OSError:
            return False

    def retake(self) -> None:
        """Lock a new file at the path after ours was deleted; ``AlreadyRunning`` if another took it."""
        old = self.fd
        self.fd = None
        try:
            self.acquire()
        except BaseException:
            self.fd = old
            raise
        if old is not None:
            os.close(old)

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            self.path.unlink()  # while still locked: a newcomer then locks a fresh file
        except FileNotFoundError:
            pass
        os.close(self.fd)
        self.fd = None


def adopt_socket(sock: socket.socket, expected: Path) -> Path:
    """Serve on the service manager's socket: its path (the manager owns the file, so it is never
    unlinked here)."""
    name = sock.getsockname()
    if isinstance(name, str) and name:
        if Path(name) != expected:
            log.warning(
                "the service manager's socket is %s, but clients look for %s: set ATOMICTOOLS_SOCKET",
                name, expected,
            )
        return Path(name)
    return expected


def bind_socket(path: Path, lock_path: Path) -> tuple[socket.socket, int]:
    """Bind a new socket at ``path``, mode 0600 (the caller holds the lock at ``lock_path``); return
    it, non-blocking, and the inode of its file. A stale socket (nothing answers) is replaced; anything
    else at the path is a ``PathError``."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISSOCK(info.st_mode):
            raise PathError(f"{path} exists and is not a socket; remove it")
        holder = listener_pid(path)
        if holder is not False:
            # Someone serves it without holding our lock: not a daemon of ours (a service
            # manager's socket, another program). Never take it over.
            who = f" (pid {holder})" if holder else ""
            raise PathError(
                f"{path} is served by another process{who} that does not hold {lock_path}; "
                f"stop it (if it is a systemd socket unit: systemctl --user stop atomictoolsd.socket) "
                f"or set ATOMICTOOLS_SOCKET to another path"
            )
        path.unlink()  # we hold the lock and nothing answers: a killed daemon's socket
        log.info("removed the stale socket of a previous daemon")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)  # created 0600: never a moment when others could connect
    try:
        sock.bind(str(path))
    finally:
        os.umask(old_umask)
    ino = os.stat(path).st_ino
    sock.setblocking(False)
    return sock, ino


def wait_until_served(path: Path, lock: InstanceLock, timeout: float) -> int | None:
    """Wait (blocking: nothing else runs yet) until the lock holder serves; return its pid."""
    deadline = time.monotonic() + timeout
    while listener_pid(path) is False and time.monotonic() < deadline:
        time.sleep(0.01)
    return lock.read_pid()


def listener_pid(path: Path) -> int | None | bool:
    """False when nothing accepts connections on ``path``; else the listener's pid (None if unknown)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        return False
    except OSError:
        return None  # a full backlog or a timeout: alive but busy
    try:
        return peer_credentials(probe)[0]
    except OSError:
        return None
    finally:
        probe.close()

