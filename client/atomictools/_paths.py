"""Where the daemon's socket lives, computed the same way by the daemon, the client and the shim.

Standard library on the common path: the stdio shim imports this and must start in milliseconds.
One rule, everywhere (docs/configuration.md#the-runtime-directory):

1. ``ATOMICTOOLS_SOCKET`` / ``ATOMICTOOLS_RUNTIME_DIR`` when set (``connect`` and bridges bake the
   latter into an agent's entry when a process without our environment would land elsewhere);
2. else ``$XDG_RUNTIME_DIR/atomictools`` when ``XDG_RUNTIME_DIR`` is set. It must be an absolute
   path to a directory of yours with mode 0700 (or not exist yet): anything else is refused with
   ``RuntimeDirError``, never silently replaced by another directory, where a second daemon would
   start that the user's CLI cannot see;
3. else (the variable was scrubbed, as Codex and the MCP SDKs do for the servers they start) the
   runtime dir the user's daemon left in ``~/.atomic/runtime-dir`` when it started, while that
   directory is there (``pointer_path``), so the shim finds the daemon the user runs wherever their
   own ``XDG_RUNTIME_DIR`` put it, and starts one there when it stopped;
4. else ``/run/user/<uid>/atomictools`` on Linux when that directory is yours and private: it is
   where a login session's ``XDG_RUNTIME_DIR`` points; failing that, platformdirs' user runtime dir
   (imported only then).

Must never fall back silently from a ``XDG_RUNTIME_DIR`` that is set.

Every variable that says where the daemon keeps its files, or where your home is
(``LOCATION_VARIABLES``), is also checked by ``check_location``: an agent's config entry, which a
repository can write, sets the environment of the shim and of the daemon it starts, so a value is
honoured only where no repository could have put files for the daemon to read
(docs/configuration.md#where-the-environment-may-move-the-daemons-files).
"""

from __future__ import annotations

import os
import stat
import sys

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (the shim's start-up)
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

__all__ = [
    "APP_NAME",
    "LOCATION_VARIABLES",
    "PROGRAM_VARIABLES",
    "SOCKET_NAME",
    "LocationError",
    "RuntimeDirError",
    "check_location",
    "check_locations",
    "login_runtime_dir",
    "pointer_path",
    "project_area",
    "project_free_path",
    "runtime_dir",
    "socket_path",
    "write_pointer",
]

APP_NAME = "atomictools"
SOCKET_NAME = "atomictoolsd.sock"

# Variables that move the daemon's files (socket, runtime, state, configuration, logs, cache) or your
# home (the global tools, platformdirs' defaults). ATOMICTOOLS_SOCKET names a file: its directory counts.
LOCATION_VARIABLES = (
    "ATOMICTOOLS_SOCKET", "ATOMICTOOLS_RUNTIME_DIR", "ATOMICTOOLS_STATE_DIR", "ATOMICTOOLS_LOG_DIR",
    "ATOMICTOOLS_CONFIG_DIR", "ATOMICTOOLS_CACHE_DIR",
    "XDG_RUNTIME_DIR", "XDG_STATE_HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "HOME",
)

# Settings that may name by path what the daemon runs for every project, unconfined for a global
# tool: the JavaScript runtime and the directory of the packages its tools import. A path there is
# checked as the location variables are (``check_locations``); a runtime's name is not a path.
PROGRAM_VARIABLES = ("ATOMICTOOLS_JS_RUNTIME", "ATOMICTOOLS_JS_PACKAGES")
_RUNTIME_NAMES = ("auto", "bun", "node")

# What makes a directory a project a repository fills: its git metadata, its tools, and every
# project config file through which an agent can be told to start a server with an environment.
PROJECT_MARKERS = (
    ".git", ".atomic", ".mcp.json", ".claude", ".codex", ".cursor", ".gemini", ".qwen", ".vscode",
    "opencode.json", "opencode.jsonc",
)


class RuntimeDirError(Exception):
    """A variable names a place for the daemon's files that cannot be used; the message says what to do."""


class LocationError(RuntimeDirError):
    """A variable names a place for the daemon's files (or your home) that a repository could have
    chosen: relative, inside the working directory's project, or open to other users."""


def _shown(text: str) -> str:
    """``text`` for a message a terminal may show: its control characters escaped."""
    return text if text.isprintable() else ascii(text)[1:-1]


def _within(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


_HOME: list[str | None] = []  # the account's home, once looked up


def _account_home() -> str | None:
    """Your home as the account database has it: no variable of a process's environment moves it."""
    if not _HOME:
        try:
            import pwd  # lazy: absent where there is no account database (the ImportError below)

            _HOME.append(os.path.realpath(pwd.getpwuid(os.geteuid()).pw_dir))
        except (ImportError, KeyError):
            _HOME.append(None)
    return _HOME[0]


def project_area(directory: str) -> str | None:
    """The outermost directory around ``directory`` a repository there may have filled: the farthest
    ancestor (or itself) holding one of ``PROJECT_MARKERS``, below your home; None for your home, a
    directory above it, or one in no project.

    The outermost, not the nearest: a submodule or a nested checkout sits inside another repository's
    files. Your home is never a project (its ``.atomic`` holds the global tools).
    """
    home = _account_home()
    candidate = os.path.realpath(directory)
    area = None
    while home is None or not _within(home, candidate):
        if any(os.path.lexists(os.path.join(candidate, marker)) for marker in PROJECT_MARKERS):
            area = candidate
        parent = os.path.dirname(candidate)
        if parent == candidate:
            break
        candidate = parent
    return area


def _owner_problem(path: str) -> str | None:
    """Why the directory at ``path`` (or, while it does not exist, the nearest one above it, where it
    would be made) could hold another user's files, or None. Root's directories are as safe as yours;
    a sticky one (``/tmp``) only as the place a new directory is made."""
    current = path
    while True:
        try:
            info = os.stat(current)
            break
        except (FileNotFoundError, NotADirectoryError):  # not there (yet): judged by where it would be made
            parent = os.path.dirname(current)
            if parent == current:
                return None
            current = parent
        except OSError as exc:
            return f"cannot be read ({exc.strerror})"
    subject = "" if current == path else f"does not exist yet, and {_shown(current)}, where it would be made, "
    if info.st_uid not in (os.geteuid(), 0):
        return f"{subject}belongs to uid {info.st_uid}, not to you"
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o022 and not (subject and info.st_mode & stat.S_ISVTX):
        return f"{subject}can be written by other users (mode {mode:04o})"
    return None


def check_location(variable: str, value: str, areas: Iterable[str]) -> str:
    """``value`` of ``variable`` as an absolute path, when no repository could have chosen it.

    It must be absolute (a relative one resolves against the working directory: the project an agent
    runs in), outside each of ``areas`` (the projects of the working directory and of the directory a
    client attaches; see ``project_area``), symlinks followed or not, and a directory that only you
    (or root) can write.

    Raises:
        LocationError: it is not, with the reason and what to do.
    """
    a_file = variable in ("ATOMICTOOLS_SOCKET", "ATOMICTOOLS_JS_RUNTIME")
    path = os.path.dirname(value) if a_file else value
    if not os.path.isabs(path):
        problem = "is a relative path, which would be resolved in the working directory"
    else:
        path = os.path.normpath(path)
        real = os.path.realpath(path)
        itself = os.path.realpath(value)  # a file of yours may be a link into the project
        inside = next((a for a in areas if _within(path, a) or _within(real, a) or _within(itself, a)), None)
        if inside is not None:
            problem = (f"is inside the project {_shown(inside)}, where a repository's files are; a process an agent "
                       f"starts there takes its environment from the project's agent config")
        else:
            problem = _owner_problem(real)
    if problem is None:
        return path if not a_file else os.path.normpath(value)
    use = "for what the daemon runs" if variable in PROGRAM_VARIABLES else "for the daemon's files"
    raise LocationError(
        f"{variable}={_shown(value)} {problem}, so it is not used {use}; set it to an absolute path "
        f"of your own outside any project (your shell profile or the service unit), or unset it"
    )


def _areas(anchors: Iterable[str] | None) -> list[str]:
    if anchors is None:
        try:
            anchors = (os.getcwd(),)
        except OSError:  # the working directory was removed: it holds no project any more
            anchors = ()
    found = []
    for anchor in anchors:
        area = project_area(anchor)
        if area is not None and area not in found:
            found.append(area)
    return found


def check_locations(environ: Mapping[str, str] | None = None, anchors: Iterable[str] | None = None) -> None:
    """``check_location`` for every one of ``LOCATION_VARIABLES`` that is set, and each of
    ``PROGRAM_VARIABLES`` that holds a path, against the projects of ``anchors`` (default: the working
    directory). Asked before a daemon is started: it runs from ``/``, where it cannot tell which
    project its starter was in.

    Raises:
        LocationError: the first variable refused.
    """
    environ = os.environ if environ is None else environ
    areas = _areas(anchors)
    for variable in LOCATION_VARIABLES:
        value = environ.get(variable, "")
        if value.strip():
            check_location(variable, value, areas)
    for variable in PROGRAM_VARIABLES:
        value = environ.get(variable, "").strip()
        if value and value not in _RUNTIME_NAMES:
            check_location(variable, os.path.expanduser(value), areas)


def project_free_path(value: str, anchors: Iterable[str] | None = None) -> tuple[str, list[str]]:
    """``value``, a ``PATH``, without its entries inside the projects of ``anchors`` (default: the
    working directory), symlinks followed or not; and the entries left out.

    An agent's config entry, which a repository writes, sets the ``PATH`` of the shim; a daemon
    started with it would run the repository's ``git``, ``node`` or ``bun`` unconfined, for every
    project, whenever it runs one of those by name. A relative entry is kept: the daemon runs from
    ``/``, where it names no project's directory.
    """
    areas = _areas(anchors)
    kept: list[str] = []
    left_out: list[str] = []
    for entry in value.split(os.pathsep):
        inside = os.path.isabs(entry) and any(
            _within(os.path.normpath(entry), a) or _within(os.path.realpath(entry), a) for a in areas)
        (left_out if inside else kept).append(entry)
    return os.pathsep.join(kept), left_out


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


POINTER_NAME = "runtime-dir"


def pointer_path() -> str | None:
    """``~/.atomic/runtime-dir``: the daemon writes its runtime dir there when it starts, so a client
    whose environment names none (an MCP SDK passes a server only ``HOME`` and ``PATH``) finds the
    daemon the user runs, wherever their own ``XDG_RUNTIME_DIR`` put it."""
    home = os.environ.get("HOME", "").strip()
    return os.path.join(home, ".atomic", POINTER_NAME) if os.path.isabs(home) else None


def write_pointer(directory: str) -> None:
    """Leave ``directory`` (the runtime dir a daemon serves in) in ``pointer_path()``, replaced whole."""
    path = pointer_path()
    if path is None:
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    temporary = f"{path}.{os.getpid()}"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, os.fsencode(directory) + b"\n")
    finally:
        os.close(fd)
    os.replace(temporary, path)


def _pointed_runtime_dir(areas: list[str]) -> str | None:
    """The runtime dir ``pointer_path()`` names, while that directory is there (its daemon serves
    there, or served there and stopped, so the next one starts where the user's CLI looks; it goes
    with the login session that made it): a regular file of yours that no one else can write,
    naming a private directory of yours outside the projects of ``areas``. Anything else is no
    pointer (the rule goes on as if there were none)."""
    path = pointer_path()
    if path is None:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
            return None
        named = os.fsdecode(os.read(fd, 4096)).strip()
    finally:
        os.close(fd)
    if not os.path.isabs(named) or _private_dir_problem(named) is not None:
        return None
    if not os.path.isdir(named):
        return None
    try:
        return check_location("the runtime dir in " + path, named, areas)
    except LocationError:
        return None


def runtime_dir(anchors: Iterable[str] | None = None) -> str:
    """The daemon's runtime directory, by the rule above.

    Args:
        anchors: the directories whose projects a variable may not point into (``check_location``);
            default: the working directory.

    Raises:
        RuntimeDirError: ``XDG_RUNTIME_DIR`` is set to a directory that is not private to you, or a
            variable is refused by ``check_location`` (``LocationError``).
    """
    override = os.environ.get("ATOMICTOOLS_RUNTIME_DIR")
    if override:
        return check_location("ATOMICTOOLS_RUNTIME_DIR", override, _areas(anchors))
    xdg = _xdg_runtime_dir()
    if xdg is not None:
        check_location("XDG_RUNTIME_DIR", xdg, _areas(anchors))
    if xdg is not None:
        return os.path.join(xdg, APP_NAME)
    pointed = _pointed_runtime_dir(_areas(anchors))
    if pointed is not None:
        return pointed
    base = login_runtime_dir()
    if base is not None:
        return os.path.join(base, APP_NAME)
    import warnings  # lazy: as platformdirs

    import platformdirs  # lazy: only without a runtime dir of the session (macOS, containers, cron)

    with warnings.catch_warnings():  # its "XDG_RUNTIME_DIR is not set" warning is expected here
        warnings.simplefilter("ignore")
        return platformdirs.user_runtime_dir(APP_NAME)


def socket_path(anchors: Iterable[str] | None = None) -> str:
    """The daemon's socket: ``ATOMICTOOLS_SOCKET``, else ``atomictoolsd.sock`` in the runtime dir.

    Raises:
        RuntimeDirError: as ``runtime_dir``.
    """
    override = os.environ.get("ATOMICTOOLS_SOCKET")
    if override:
        return check_location("ATOMICTOOLS_SOCKET", override, _areas(anchors))
    return os.path.join(runtime_dir(anchors), SOCKET_NAME)
