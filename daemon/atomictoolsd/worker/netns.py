"""A confined worker's own network: a user and network namespace that holds only its loopback, whose
one way out is the daemon's filtering proxy.

A confined worker allowed the network (``trust --sandbox --allow-net``) calls ``isolate()`` right
after the fork, while it is still its only thread and before Landlock and seccomp: it moves into a
new user namespace (its uid and gid mapped to themselves) and a new network namespace, brings up
that namespace's ``lo``, listens on ``127.0.0.1:PROXY_PORT`` there, and hands the listening socket
to the daemon over the socket the fork server gave it (``SCM_RIGHTS``). A socket stays in the
namespace it was made in: the daemon accepts on it, and relays what the worker asks for from the
host's network, to the hosts the user allowed (``pool/netproxy.py``). From the new namespace no
address of the host can be reached: not its loopback (the daemon's HTTP endpoint, the user's local
services), not the LAN. The capabilities the new user namespace gave the worker are dropped before
anything else runs (its bounding set too, so no program it starts gets them back).

Its environment names the proxy (``proxy_environ``: ``HTTP_PROXY``, ``HTTPS_PROXY``, ``ALL_PROXY``
and their lower-case forms), and Landlock lets it connect to that port and no other
(``sandbox.py``). Every worker has a namespace of its own, so the port is the same in each.

``support()`` tells the daemon whether this machine lets a process make these namespaces (some
distributions forbid unprivileged user namespaces, or deny capabilities in them): it runs this file
as a small program that tries. Where it cannot, a worker allowed the network runs with none
(``registry/confinement.py``), and ``list`` and ``status`` say why.

Standard library and ``ctypes`` only: it runs in workers, and as that program (``python -I -S``).
"""

from __future__ import annotations

import ctypes
import fcntl
import functools
import os
import socket
import struct
import sys
import threading
from typing import Any

__all__ = ["PROXY_HOST", "PROXY_PORT", "USERNS_ENV", "isolate", "proxy_environ", "support", "warm_up"]

PROXY_HOST = "127.0.0.1"
PROXY_PORT = 3128  # in the worker's own namespace: no other process listens there
# "0" makes the daemon believe user namespaces are unavailable (tests; it only takes the network away).
USERNS_ENV = "ATOMICTOOLS_SANDBOX_USERNS"

_CLONE_NEWUSER, _CLONE_NEWNET = 0x10000000, 0x40000000
_SIOCGIFFLAGS, _SIOCSIFFLAGS = 0x8913, 0x8914
_IFF_UP, _IFF_RUNNING = 0x1, 0x40
_PR_SET_PDEATHSIG, _PR_CAPBSET_DROP, _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 1, 24, 47, 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
_SIGKILL = 9


def proxy_environ() -> dict[str, str]:
    """The variables that send a worker's HTTP and HTTPS clients to the daemon's proxy."""
    url = f"http://{PROXY_HOST}:{PROXY_PORT}"
    env = {name: url for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")}
    env.update(NO_PROXY="", no_proxy="")  # nothing goes around it: nothing else can be reached
    return env


@functools.cache
def _libc() -> Any:
    return ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def isolate(handoff: int) -> None:
    """Move this process into a network namespace of its own and hand its proxy listener to the
    daemon over ``handoff`` (closed here). For a new worker: one thread, before Landlock.

    Raises:
        OSError: a step failed; the worker must not run (it would have more network than allowed,
            or less than the daemon expects).
    """
    listener = _enter()
    try:
        with socket.socket(fileno=handoff) as channel:
            socket.send_fds(channel, [b"listener"], [listener.fileno()])
    finally:
        listener.close()  # the daemon's copy is the one that accepts
    _drop_capabilities()
    # Set again: a change of credentials can clear it, and the worker must die with the fork server.
    _libc().prctl(_PR_SET_PDEATHSIG, _SIGKILL, 0, 0, 0)


def _enter() -> socket.socket:
    """The new namespaces, their loopback up, and the proxy's listener in them."""
    uid, gid = os.getuid(), os.getgid()  # before: in the new namespace, unmapped, they read 65534
    _check(_libc().unshare(_CLONE_NEWUSER | _CLONE_NEWNET), "unshare(CLONE_NEWUSER|CLONE_NEWNET)")
    _map_ids(uid, gid)
    _loopback_up()
    return _listen()


def _write(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def _map_ids(uid: int, gid: int) -> None:
    """Be the same user and group in the new user namespace (``setgroups`` denied, as the kernel
    requires of an unprivileged mapping)."""
    _write("/proc/self/setgroups", b"deny")
    _write("/proc/self/uid_map", f"{uid} {uid} 1".encode())
    _write("/proc/self/gid_map", f"{gid} {gid} 1".encode())


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH14x", b"lo", _IFF_UP | _IFF_RUNNING)
        fcntl.ioctl(sock.fileno(), _SIOCSIFFLAGS, request)


def _listen() -> socket.socket:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.bind((PROXY_HOST, PROXY_PORT))
        listener.listen(128)
    except BaseException:
        listener.close()
        raise
    return listener


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


@functools.cache
def _capabilities() -> range:
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            return range(int(f.read()) + 1)
    except (OSError, ValueError):
        return range(64)


@functools.cache
def _capset_args() -> tuple[Any, Any]:
    return ctypes.byref(_CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)), (_CapData * 2)()


def _drop_capabilities() -> None:
    """Drop every capability the new user namespace gave: the bounding set (no program started later
    regains one, even as uid 0 in it), the ambient set, then the process's own sets."""
    prctl = _libc().prctl
    for capability in _capabilities():
        if prctl(_PR_CAPBSET_DROP, capability, 0, 0, 0) != 0 and ctypes.get_errno() != 22:  # EINVAL: none such
            _check(-1, f"dropping capability {capability} from the bounding set")
    prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)  # EINVAL before Linux 4.3: nothing to clear
    _check(_libc().capset(*_capset_args()), "capset")


def warm_up() -> None:
    """Do once, in the fork server, what every worker with the network would otherwise do after its
    fork (each first touch of a page there copies it)."""
    libc = _libc()
    for name in ("unshare", "prctl", "capset"):
        getattr(libc, name)
    _capabilities()
    _capset_args()
    struct.pack("16sH14x", b"lo", _IFF_UP | _IFF_RUNNING)


# -- can this machine do it? ----------------------------------------------------------------------


def support() -> dict[str, Any]:
    """``{available, reason}``: whether a worker can be given a network namespace of its own here,
    tried once by running this file as a program (~20 ms, once per process; the daemon tries in a
    thread as it starts where a tool may have the network)."""
    with _SUPPORT_LOCK:
        if not _SUPPORT:
            _SUPPORT.append(_support())
        return _SUPPORT[0]


_SUPPORT: list[dict[str, Any]] = []
_SUPPORT_LOCK = threading.Lock()


def _support() -> dict[str, Any]:
    if not sys.platform.startswith("linux"):
        return {"available": False, "reason": f"network namespaces need Linux; this is {sys.platform}"}
    if os.environ.get(USERNS_ENV, "").strip() == "0":
        return {"available": False, "reason": f"user namespaces are turned off ({USERNS_ENV}=0)"}
    import subprocess  # lazy: the daemon's one probe; workers never need it

    try:
        done = subprocess.run(
            [sys.executable, "-I", "-S", os.path.abspath(__file__)], cwd="/", stdin=subprocess.DEVNULL,
            capture_output=True, text=True, timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"available": False, "reason": f"cannot try a user namespace: {exc}"}
    if done.returncode != 0:
        detail = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        return {"available": False, "reason": f"this machine does not let a process make a user and network namespace ({detail})"}
    return {"available": True, "reason": None}


def _try() -> int:
    """What ``support`` runs: every step of ``isolate`` but the hand-over."""
    try:
        _enter().close()
        _drop_capabilities()
    except OSError as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_try())
