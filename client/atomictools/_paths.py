"""Where the daemon's socket lives, computed the same way by the daemon, the client and the shim.

Standard library on the common path: the stdio shim imports this and must start in milliseconds.
One rule, everywhere (docs/configuration.md#the-runtime-directory):

1. ``ATOMICTOOLS_SOCKET`` / ``ATOMICTOOLS_RUNTIME_DIR`` when set (``connect`` and bridges bake the
   latter into an agent's entry when a process without our environment would land elsewhere);
2. else ``$XDG_RUNTIME_DIR/atomictools`` when ``XDG_RUNTIME_DIR`` is set. It must be an absolute
   path to a directory of yours with mode 0700 (or not exist yet): anything else is refused with
   ``RuntimeDirError``, never silently replaced by another directory, where a second daemon would
   start that the user's CLI cannot see;
3. else (the variable was scrubbed, as Codex and the MCP SDKs do for the servers they start)
   ``/run/user/<uid>/atomictools`` on Linux when that directory is yours and private: it is where a
   login session's ``XDG_RUNTIME_DIR`` points, so the shim finds the daemon the user's shell
   started; failing that, platformdirs' user runtime dir (imported only then).

Must never fall back silently from a ``XDG_RUNTIME_DIR`` that is set.
"""

from __future__ import annotations

import os
import stat
import sys

__all__ = ["APP_NAME", "SOCKET_NAME", "RuntimeDirError", "login_runtime_dir", "runtime_dir", "socket_path"]

APP_NAME = "atomictools"
SOCKET_NAME = "atomictoolsd.sock"


class RuntimeDirError(Exception):
    """``XDG_RUNTIME_DIR`` is set but unusable; the message says what to run."""


def _private_dir_problem(path: str) -> str | None:
    """Why ``path`` cannot hold the socket (not yet existing is fine), or None."""
    try:
        info = os.lstat(path.rstrip("/") or "/")
    except FileNotFoundError:
        return None  # the daemon creates it with mode 0700
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    if stat.S_ISLNK(info.st_mode):
        return "is a symlink"
    if not stat.S_ISDIR(info.st_mode):
        return "is not a directory"
    if info.st_uid != os.geteuid():
        return f"is owned by uid {info.st_uid}, not by you (uid {os.geteuid()})"
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o077:
        return f"has mode {mode:04o}, open to other users"
    return None


def _xdg_runtime_dir() -> str | None:
    path = os.environ.get("XDG_RUNTIME_DIR", "").strip()
    if not path:
        return None
    if not os.path.isabs(path):
        problem = "is not an absolute path"
    else:
        problem = _private_dir_problem(path)
    if problem is None:
        return path
    fix = f"run: chmod 700 {path}" if "mode" in problem else "point it at a private directory of yours"
    raise RuntimeDirError(
        f"XDG_RUNTIME_DIR={path} {problem}, so the daemon's socket cannot live there; {fix}, "
        f"or set ATOMICTOOLS_RUNTIME_DIR to a directory only you can enter"
    )


def login_runtime_dir() -> str | None:
    """``/run/user/<uid>`` when it exists and is private to you (Linux), else None."""
    if not sys.platform.startswith("linux"):
        return None
    path = f"/run/user/{os.geteuid()}"
    return path if os.path.isdir(path) and _private_dir_problem(path) is None else None


def runtime_dir() -> str:
    """The daemon's runtime directory, by the rule above.

    Raises:
        RuntimeDirError: ``XDG_RUNTIME_DIR`` is set to a directory that is not private to you.
    """
    override = os.environ.get("ATOMICTOOLS_RUNTIME_DIR")
    if override:
        return os.path.abspath(override)
    base = _xdg_runtime_dir() or login_runtime_dir()
    if base is not None:
        return os.path.join(base, APP_NAME)
    import warnings

    import platformdirs  # only without a runtime dir of the session (macOS, containers, cron)

    with warnings.catch_warnings():  # its "XDG_RUNTIME_DIR is not set" warning is expected here
        warnings.simplefilter("ignore")
        return platformdirs.user_runtime_dir(APP_NAME)


def socket_path() -> str:
    """The daemon's socket: ``ATOMICTOOLS_SOCKET``, else ``atomictoolsd.sock`` in the runtime dir.

    Raises:
        RuntimeDirError: as ``runtime_dir``.
    """
    override = os.environ.get("ATOMICTOOLS_SOCKET")
    if override:
        return os.path.abspath(override)
    return os.path.join(runtime_dir(), SOCKET_NAME)
