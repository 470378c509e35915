"""Where the daemon's socket lives, computed the same way by the daemon, the client and the shim.

Standard library on the common path: the stdio shim imports this and must start in milliseconds.
The location is platformdirs' user runtime dir (``$XDG_RUNTIME_DIR/atomictools`` on Linux); when
``XDG_RUNTIME_DIR`` is unusable we defer to platformdirs itself (imported only then), so the two
can never disagree.
"""

from __future__ import annotations

import os
import stat

__all__ = ["APP_NAME", "SOCKET_NAME", "runtime_dir", "socket_path"]

APP_NAME = "atomictools"
SOCKET_NAME = "atomictoolsd.sock"


def _usable_xdg_runtime_dir() -> str | None:
    # The checks platformdirs applies before it accepts XDG_RUNTIME_DIR (the XDG spec's).
    path = os.environ.get("XDG_RUNTIME_DIR", "").strip()
    if not path or not os.path.isabs(path):
        return None
    try:
        info = os.lstat(path.rstrip("/") or "/")
    except OSError:
        return None
    if (
        not stat.S_ISDIR(info.st_mode)
        or info.st_uid != os.geteuid()
        or stat.S_IMODE(info.st_mode) != 0o700
    ):
        return None
    return path


def runtime_dir() -> str:
    """The daemon's runtime directory: ``ATOMICTOOLS_RUNTIME_DIR``, else platformdirs' user runtime dir."""
    override = os.environ.get("ATOMICTOOLS_RUNTIME_DIR")
    if override:
        return os.path.abspath(override)
    xdg = _usable_xdg_runtime_dir()
    if xdg is not None:
        return os.path.join(xdg, APP_NAME)
    import platformdirs  # only when XDG_RUNTIME_DIR is missing or unusable (macOS, bare sessions)

    return platformdirs.user_runtime_dir(APP_NAME)


def socket_path() -> str:
    """The daemon's socket: ``ATOMICTOOLS_SOCKET``, else ``atomictoolsd.sock`` in the runtime dir."""
    override = os.environ.get("ATOMICTOOLS_SOCKET")
    if override:
        return os.path.abspath(override)
    return os.path.join(runtime_dir(), SOCKET_NAME)
