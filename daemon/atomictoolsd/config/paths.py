"""Every file and directory the daemon uses, from platformdirs, each overridable by environment.

Setting ``HOME`` and the ``XDG_*`` variables (or the ``ATOMICTOOLS_*_DIR`` ones) isolates a daemon
completely, which is how the tests run theirs. Each such variable is honoured only where no repository
could have chosen it (``atomictools._paths.check_locations``): absolute, outside the project of the
working directory, in a directory only you can write. Anything else is a ``PathError``, never a
fallback to another directory.
"""

from __future__ import annotations

import os
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

import platformdirs

from atomictools._paths import APP_NAME, RuntimeDirError, check_locations, runtime_dir, socket_path
from atomictoolsd.config.errors import SetupError

__all__ = ["Paths", "PathError", "check_private_dir", "check_socket_path", "make_private", "make_private_dirs"]

# sun_path is 108 bytes on Linux and 104 on macOS, including the terminating NUL.
_SUN_PATH_MAX = 104 if sys.platform == "darwin" else 108


class PathError(SetupError):
    """A path the daemon needs is unusable; the message says how to fix it."""


@dataclass(frozen=True)
class Paths:
    home: Path
    runtime_dir: Path
    socket: Path
    lock: Path
    state_dir: Path
    log_dir: Path
    config_dir: Path
    cache_dir: Path

    @property
    def spill_dir(self) -> Path:
        """Full outputs of truncated tool results."""
        return self.state_dir / "spill"

    @property
    def bridges_dir(self) -> Path:
        """Generated bridge scripts."""
        return self.runtime_dir / "bridges"

    @property
    def config_file(self) -> Path:
        return self.config_dir / "config.toml"

    def create_private_dirs(self) -> None:
        """Create the daemon's state, log, spill and cache dirs (and missing parents) private to this
        user, before anything writes there. A failure is left for the part that writes there to report.
        """
        for directory in (self.state_dir, self.log_dir, self.spill_dir, self.cache_dir):
            try:
                make_private(directory)
            except OSError:
                pass

    @classmethod
    def from_env(cls) -> Paths:
        """Where everything is, by this process's environment.

        Raises:
            PathError: a variable places something where a repository could have chosen it, or the
                runtime dir is not private (the message names the variable and what to do).
        """
        env = os.environ
        try:
            check_locations(env)
            rundir = Path(runtime_dir())
            socket = Path(socket_path())
        except RuntimeDirError as exc:
            raise PathError(str(exc)) from None
        home = Path(env.get("HOME") or Path.home()).resolve()  # one spelling: a symlinked HOME is still home
        return cls(
            home=home,
            runtime_dir=rundir,
            socket=socket,
            lock=rundir / "atomictoolsd.lock",
            state_dir=Path(env.get("ATOMICTOOLS_STATE_DIR") or platformdirs.user_state_dir(APP_NAME)),
            log_dir=Path(env.get("ATOMICTOOLS_LOG_DIR") or platformdirs.user_log_dir(APP_NAME)),
            config_dir=Path(env.get("ATOMICTOOLS_CONFIG_DIR") or platformdirs.user_config_dir(APP_NAME)),
            cache_dir=Path(env.get("ATOMICTOOLS_CACHE_DIR") or platformdirs.user_cache_dir(APP_NAME)),
        )


def make_private_dirs(path: Path) -> list[Path]:
    """Create ``path`` and each missing directory above it with mode 0700, whatever the umask; return
    the ones it created, outermost first. Every private dir of the daemon is made here.

    ``Path.mkdir(parents=True)`` gives the parents it creates the umask's mode: under a umask of 000
    another user could rename them and put their own in place. The XDG spec asks for 0700 too.
    """
    missing = []
    while not path.exists():
        missing.append(path)
        if path.parent == path:
            break
        path = path.parent
    created = []
    for directory in reversed(missing):
        try:
            directory.mkdir(mode=0o700)
        except FileExistsError:
            continue
        os.chmod(directory, 0o700)  # mkdir's mode passes through the umask
        created.append(directory)
    return created


def make_private(path: Path) -> None:
    """Create ``path`` (and missing parents, each 0700) and make it 0700 if it is ours and open to others.

    For the daemon's own state, cache and log dirs, which hold tool output, the trust store and
    the call log. ``mkdir(parents=True, mode=…)`` gives the mode to the last directory only, so a
    dir first created as the parent of another would otherwise stay 0755.
    """
    make_private_dirs(path)
    info = os.stat(path)
    if info.st_uid == os.geteuid() and stat.S_IMODE(info.st_mode) & 0o077:
        os.chmod(path, 0o700)


def check_private_dir(path: Path, create: bool = True) -> None:
    """Make sure ``path`` is a directory owned by this user that no one else can enter.

    Permissions on the directory, not on the socket, are what every OS honours, so this is the
    check that keeps other users out.

    Raises:
        PathError: it is a symlink, not a directory, owned by someone else, or open to others.
    """
    if create:
        make_private_dirs(path)
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        raise PathError(f"{path} does not exist") from None
    if stat.S_ISLNK(info.st_mode):
        raise PathError(f"{path} is a symlink; remove it so the daemon can create a private directory there")
    if not stat.S_ISDIR(info.st_mode):
        raise PathError(f"{path} is not a directory; remove it or set ATOMICTOOLS_RUNTIME_DIR elsewhere")
    if info.st_uid != os.geteuid():
        raise PathError(
            f"{path} is owned by uid {info.st_uid}, not by you (uid {os.geteuid()}); "
            f"remove it or set ATOMICTOOLS_RUNTIME_DIR to a directory of your own"
        )
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o077:
        raise PathError(f"{path} has mode {mode:04o}, open to other users; run: chmod 700 {path}")


def check_socket_path(path: Path) -> None:
    """Raise ``PathError`` when ``path`` is too long for a Unix socket address."""
    size = len(os.fsencode(path))
    if size >= _SUN_PATH_MAX:
        raise PathError(
            f"socket path {path} is {size} bytes; Unix sockets allow {_SUN_PATH_MAX - 1} here. "
            f"Set ATOMICTOOLS_SOCKET (or XDG_RUNTIME_DIR) to a shorter path"
        )
