"""Socket activation: serve on the listening socket the service manager created.

systemd passes sockets as file descriptors 3, 4, … (``LISTEN_FDS``, meant for the pid in
``LISTEN_PID``); launchd hands them out through ``launch_activate_socket(name)`` for the names in
the plist's ``Sockets`` dictionary. Either way the daemon adopts the socket instead of binding one,
and because it did not create the socket file it never unlinks it: the manager owns it, keeps it
listening while the daemon restarts, and queues the connections that arrive meanwhile.

Adopted descriptors are made close-on-exec, so the fork server and the workers never inherit a
listening socket. Standard library only.
"""

from __future__ import annotations

import errno
import os
import socket
import sys
from collections.abc import Callable

from atomictoolsd.config.errors import SetupError
from atomictoolsd.service.manager import ServiceContext

__all__ = [
    "LAUNCHD_SOCKET_NAME",
    "SYSTEMD_FD_NAME",
    "ActivationError",
    "adopt",
    "inherited_listener",
    "launch_activate_socket",
    "launchd_listener",
    "systemd_listener",
]

SD_LISTEN_FDS_START = 3
SYSTEMD_FD_NAME = "atomictoolsd"  # FileDescriptorName= in atomictoolsd.socket
LAUNCHD_SOCKET_NAME = "Listeners"  # the key under Sockets in the plist


class ActivationError(SetupError):
    """The service manager passed something the daemon cannot serve on; the message says what."""


def adopt(fd: int, source: str) -> socket.socket:
    """Wrap an inherited descriptor as a non-blocking, close-on-exec listening Unix stream socket.

    Raises:
        ActivationError: ``fd`` is not open, not a socket, or not a listening Unix stream socket.
    """
    try:
        sock = socket.socket(fileno=fd)
    except OSError as exc:
        raise ActivationError(f"{source} passed file descriptor {fd}, which is not a socket ({exc.strerror})") from None
    try:
        listening = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) if hasattr(socket, "SO_ACCEPTCONN") else 1
    except OSError:
        listening = 1  # the option is not readable everywhere (macOS): trust the manager
    if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM or not listening:
        kind = f"{sock.family.name}/{sock.type.name}{'' if listening else ', not listening'}"
        sock.detach()  # not ours to close
        raise ActivationError(
            f"{source} passed file descriptor {fd} ({kind}); atomictoolsd needs a listening Unix stream "
            f"socket: use ListenStream=/path/to/atomictoolsd.sock (systemd) or SockPathName (launchd)"
        )
    sock.set_inheritable(False)
    sock.setblocking(False)
    return sock


def systemd_listener(context: ServiceContext) -> socket.socket | None:
    """The Unix stream socket systemd passed (the one named ``atomictoolsd`` when names are given).

    Other passed descriptors are made close-on-exec and left alone.
    """
    if not context.listen_fds:
        return None
    fds = range(SD_LISTEN_FDS_START, SD_LISTEN_FDS_START + context.listen_fds)
    for fd in fds:
        try:
            os.set_inheritable(fd, False)
        except OSError:
            pass
    names = context.listen_fdnames
    if len(names) == len(fds) and SYSTEMD_FD_NAME in names:
        return adopt(fds[names.index(SYSTEMD_FD_NAME)], "systemd")
    return adopt(fds[0], "systemd")


def launch_activate_socket(name: str) -> list[int]:
    """launchd's ``launch_activate_socket()``: the descriptors of socket ``name`` of this job.

    Raises:
        OSError: ``ESRCH`` when launchd did not start this process, ``ENOENT`` when the plist has no
            such socket, ``ENOSYS`` where there is no launchd.
    """
    if sys.platform != "darwin":
        raise OSError(errno.ENOSYS, "launchd is only on macOS")
    import ctypes  # lazy: launchd's socket activation only

    libc = ctypes.CDLL(None)
    function = libc.launch_activate_socket
    function.argtypes = [
        ctypes.c_char_p,
        ctypes.POINTER(ctypes.POINTER(ctypes.c_int)),
        ctypes.POINTER(ctypes.c_size_t),
    ]
    function.restype = ctypes.c_int
    fds = ctypes.POINTER(ctypes.c_int)()
    count = ctypes.c_size_t(0)
    error = function(name.encode(), ctypes.byref(fds), ctypes.byref(count))
    if error:
        raise OSError(error, os.strerror(error))
    try:
        return [fds[i] for i in range(count.value)]
    finally:
        libc.free(fds)


def launchd_listener(
    name: str = LAUNCHD_SOCKET_NAME, activate: Callable[[str], list[int]] = launch_activate_socket
) -> socket.socket | None:
    """The Unix stream socket launchd created for ``name``, or None when launchd offers none."""
    try:
        fds = activate(name)
    except OSError as exc:
        if exc.errno in (errno.ESRCH, errno.ENOENT, errno.ENOSYS):
            return None
        raise ActivationError(f"launchd did not hand over socket {name!r}: {exc}") from None
    adopted = None
    for fd in fds:
        if adopted is None:
            adopted = adopt(fd, "launchd")
        else:
            os.set_inheritable(fd, False)
    return adopted


def inherited_listener(
    context: ServiceContext, activate: Callable[[str], list[int]] = launch_activate_socket
) -> socket.socket | None:
    """The socket the service manager created for the daemon, if it created one."""
    if context.manager == "systemd":
        return systemd_listener(context)
    if context.manager == "launchd":
        return launchd_listener(activate=activate)
    return None
