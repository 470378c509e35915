"""Project trust: which projects may load their own tools (the store; ``atomic/trust/refresh``, which
re-reads it in a running daemon, is in ``sessions/trust_refresh.py``).

A project's ``.atomic/tools/`` runs code from whatever repository the agent works in, so it loads only
once the user has trusted that project root (``atomictoolsd trust [DIR]``, like ``direnv allow``).
The global dir and the built-ins are always trusted. The trusted roots live in ``trust.json`` in the
state dir, mode 0600, written atomically under a lock; a store that another user could have written
is ignored, so it can only ever trust less.

Trust is of a directory and, for a project trusted fully, of the content of its tools as you trusted
it: content that arrives later through git is held until reviewed (``content.py``, ``holding.py``).
It is by the directory itself, not only its path: each root is stored with the directory's identity
(device, inode, birth time), so a directory removed and made again, or another one renamed into its
place, is not trusted until trusted again.

Each trusted root has a level: ``full`` (its tools run with all the user's rights) or ``sandbox``
(its workers are confined: see ``worker/sandbox.py``), with what the user set for its sandbox
beyond the defaults (``allow``: ``net``, ``read``, ``write`` and ``env`` widen it, ``protect`` keeps
more of the project read-only). A store written before levels existed reads as ``full``.

This module is light (standard library only): the registry, the CLI and the built-in tools' workers
import it. It never knows the server or the sessions.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shlex
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from atomictoolsd.config.statefile import StateWriteError, explain_write_error, sweep, write_atomic

__all__ = [
    "LEVELS",
    "TRUST_FILE",
    "TrustError",
    "TrustState",
    "TrustStore",
    "dir_identity",
    "replaced_message",
    "trust_command",
    "trust_offer",
]

log = logging.getLogger("atomictoolsd.trust")

TRUST_FILE = "trust.json"
LEVELS = ("full", "sandbox")


def trust_command(root: Path | str, sandbox: bool = False) -> str:
    """The exact command that trusts ``root`` (confined with ``sandbox``), quoted for a shell and fit to
    print (``config.command.shell_quote``: a path holding control characters is escaped)."""
    from atomictoolsd.config.command import command_name, shell_quote  # lazy: for a message only (start-up cost)

    return f"{command_name()} trust {'--sandbox ' if sandbox else ''}{shell_quote(str(root))}"


def trust_offer(root: Path | str) -> dict[str, str]:
    """What unblocks the tools of ``root``, a project not trusted (or trusted with ``--sandbox`` where
    it cannot be): the one wording of it, for the ``blocked`` entries of ``atomic/list``, an agent's
    instructions and errors, a worker refused, the CLI. ``command`` is the command to offer,
    ``fullCommand`` the full trust, ``message`` the advice to the user (the CLI prints it),
    ``agentMessage`` the same advice for an agent, about the user: trusting is the user's decision,
    and ``trust`` refuses to run without a terminal, so an agent is told to ask, never to run it.

    The confined trust comes first where this machine can enforce it: the safer of the two. Where it
    cannot, ``trust --sandbox`` would leave the tools blocked: the message says why, and offers the
    full trust for what it is.
    """
    from atomictoolsd.worker.sandbox import support  # lazy: ctypes, for a message only (start-up cost)

    full = trust_command(root)
    offered = support()
    ask = "only the user can trust a project (`trust` needs their terminal): ask the user"
    if offered["available"]:
        confined = trust_command(root, sandbox=True)
        return {
            "command": confined, "fullCommand": full,
            "message": f"to load them confined (no network, nothing outside the project), run: {confined}; "
                       f"or, with all your rights: {full}",
            "agentMessage": f"{ask} whether to run {confined} (loads them confined: no network, nothing outside "
                            f"the project), or {full} (loads them with all the user's rights)",
        }
    return {
        "command": full, "fullCommand": full,
        "message": f"this machine cannot confine them ({offered['reason']}), so trust --sandbox would leave them "
                   f"blocked; to load them, run: {full} (their code then runs with all your rights)",
        "agentMessage": f"{ask} whether to run {full}, which loads them with all the user's rights (this machine "
                        f"cannot confine them: {offered['reason']})",
    }


class TrustError(Exception):
    """The trust store cannot be read or written; the message says how to fix it."""


def _birth_time_ns(path: str, info: os.stat_result) -> int | None:
    """When the file at ``path`` was created, in ns, where the system can tell (None elsewhere).

    An inode number alone does not tell two directories apart: ext4 hands the number of a directory
    just removed to the next one made, so ``rm -rf p && mkdir p`` often gives the same (device,
    inode). The birth time does. macOS has it in ``stat``; Linux only through ``statx`` (glibc
    2.28+), which Python's ``os`` does not wrap.
    """
    birth = getattr(info, "st_birthtime_ns", None) or getattr(info, "st_birthtime", None)
    if birth is not None:
        return int(birth * 1_000_000_000) if isinstance(birth, float) else int(birth)
    statx = _statx()
    if statx is None:
        return None
    import ctypes  # lazy: only where os.stat has no birth time and statx is called directly

    buffer = ctypes.create_string_buffer(256)
    if statx(-100, os.fsencode(path), 0, 0x800, buffer) != 0:  # AT_FDCWD, follow links, STATX_BTIME
        return None
    mask = int.from_bytes(buffer.raw[0:4], "little" if _LITTLE else "big")
    if not mask & 0x800:
        return None  # this filesystem keeps no birth time
    order = "little" if _LITTLE else "big"
    seconds = int.from_bytes(buffer.raw[80:88], order, signed=True)
    nanoseconds = int.from_bytes(buffer.raw[88:92], order)
    return seconds * 1_000_000_000 + nanoseconds


_LITTLE = __import__("sys").byteorder == "little"
_STATX: Any = None


def _statx() -> Any:
    global _STATX
    if _STATX is None:
        _STATX = False
        if hasattr(os, "uname") and os.uname().sysname == "Linux":
            try:
                import ctypes  # lazy: once, to find statx

                libc = ctypes.CDLL(None, use_errno=True)
                function = libc.statx
                function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.c_char_p]
                function.restype = ctypes.c_int
                _STATX = function
            except (OSError, AttributeError):
                pass
    return _STATX or None


def dir_identity(path: Path | str) -> dict[str, int] | None:
    """What tells the directory now at ``path`` from another one later made at the same path:
    device, inode and, where the filesystem keeps it, birth time. None when no directory is there."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISDIR(info.st_mode):
        return None
    identity = {"dev": info.st_dev, "ino": info.st_ino}
    birth = _birth_time_ns(str(path), info)
    if birth is not None:
        identity["birth_ns"] = birth
    generation = _generation(path)
    if generation is not None:
        identity["gen"] = generation
    return identity


def _generation(path: Path | str) -> int | None:
    """The inode's generation number (Linux ``FS_IOC_GETVERSION``: ext4, btrfs, xfs), which a
    filesystem changes whenever it reuses an inode: it tells directories apart even where birth
    times are as coarse as a clock tick."""
    if not hasattr(os, "O_DIRECTORY") or __import__("sys").platform != "linux":
        return None
    import array  # lazy: Linux only (FS_IOC_GETVERSION)

    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        buffer = array.array("l", [0])
        fcntl.ioctl(fd, 0x80087601 if buffer.itemsize == 8 else 0x80047601, buffer, True)  # FS_IOC_GETVERSION
        return int(buffer[0]) & 0xFFFFFFFF
    except OSError:
        return None  # this filesystem keeps none (tmpfs)
    finally:
        os.close(fd)


def _same_dir(recorded: dict[str, Any], now: dict[str, int]) -> bool:
    if recorded.get("dev") != now["dev"] or recorded.get("ino") != now["ino"]:
        return False
    # What one side could not tell (a store written elsewhere, another filesystem) is not compared.
    return all(key not in recorded or key not in now or recorded[key] == now[key] for key in ("birth_ns", "gen"))


TrustState = Literal["trusted", "untrusted", "replaced", "missing"]


class TrustStore:
    """The trusted project roots, in ``<state dir>/trust.json``.

    Each root is trusted together with the identity of the directory it named when it was trusted
    (``dir_identity``): a directory removed and made again at that path, or another one renamed
    into its place, is another directory and is not trusted until trusted again.

    Reading is cheap enough to do on every question: the file is parsed again only when its inode,
    size or modification time changed, so a ``trust`` from another process is seen at once.
    A store of version 1 (roots without identities) is read, its roots bound to the directories
    there when it is first read, and written back as version 2 (best effort: a read never fails
    for want of a write).
    """

    def __init__(self, state_dir: Path) -> None:
        self.path = Path(state_dir) / TRUST_FILE
        self._key: tuple[int, int, int] | None = None
        self._roots: dict[str, dict[str, Any]] = {}
        self._legacy = False  # roots read without identities, bound in memory but not yet written
        self._upgrade_tried: tuple[int, int, int] | None = None
        self._warned: set[str] = set()  # roots whose replacement was logged
        self.problem: str | None = None  # why the file on disk is being ignored, if it is
        # A writer killed mid-write left its temporary file; one whose writer lives is left alone,
        # so this needs no lock.
        sweep(self.path)

    def _read(self) -> dict[str, dict[str, Any]]:
        try:
            info = os.stat(self.path)
        except FileNotFoundError:
            self._key, self._roots, self.problem = None, {}, None
            return self._roots
        key = (info.st_ino, info.st_size, info.st_mtime_ns)
        if key == self._key:
            return self._roots
        roots: dict[str, dict[str, Any]] = {}
        problem = None
        legacy = False
        if info.st_uid != os.geteuid():
            problem = f"{self.path} belongs to uid {info.st_uid}, not to you; remove it"
        elif info.st_mode & 0o022:
            problem = f"{self.path} can be written by other users; run: chmod 600 {shlex.quote(str(self.path))}"
        else:
            try:
                data = json.loads(self.path.read_text(encoding="utf-8"))
                projects = data["projects"]
                if not isinstance(projects, dict) or not all(isinstance(v, dict) for v in projects.values()):
                    raise ValueError('"projects" must map paths to objects')
                roots = {path: dict(entry) for path, entry in projects.items()}
                for path, entry in roots.items():
                    if "ino" not in entry and not entry.get("missing_when_upgraded"):
                        # Version 1 knew only the path: bind it to the directory there now. One
                        # that is gone has no directory to bind to; whatever appears there later is
                        # not the one that was trusted.
                        legacy = True
                        identity = dir_identity(path)
                        if identity is None:
                            entry["missing_when_upgraded"] = True
                        else:
                            entry.update(identity)
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
                problem = f"{self.path} is not a valid trust store ({type(exc).__name__}: {exc}); fix or remove it"
        if problem is not None and problem != self.problem:
            log.warning("ignoring the trust store: %s", problem)
        self._key, self._roots, self.problem, self._legacy = key, roots, problem, legacy
        return roots

    def _read_upgraded(self) -> dict[str, dict[str, Any]]:
        roots = self._read()
        if self._legacy and self.problem is None and self._key != self._upgrade_tried:
            self._upgrade_tried = self._key  # once per file: a full disk must not be retried on every question
            try:
                self._update(lambda roots: True)  # bind for good: the next reader must agree with this one
            except (TrustError, OSError) as exc:
                log.warning("cannot upgrade the trust store (its roots are bound in memory only): %s", exc)
            roots = self._read()
        return roots

    def state(self, root: Path | str) -> TrustState:
        """Whether the project at ``root`` (a resolved project root) may load its own tools:
        ``trusted``; ``untrusted``; ``replaced`` (trusted, but the directory there now is another
        one); ``missing`` (trusted, and no directory is there)."""
        entry = self._read_upgraded().get(str(root))
        if entry is None:
            return "untrusted"
        now = dir_identity(root)
        if now is None:
            return "missing"
        if entry.get("missing_when_upgraded") or not _same_dir(entry, now):
            return "replaced"
        return "trusted"

    def is_trusted(self, root: Path | str) -> bool:
        """Whether the project at ``root`` (a resolved project root) may load its own tools."""
        state = self.state(root)
        if state == "replaced" and str(root) not in self._warned:
            self._warned.add(str(root))
            log.warning("%s", replaced_message(root))
        elif state == "trusted":
            self._warned.discard(str(root))
        return state == "trusted"

    def level(self, root: Path | str) -> str | None:
        """``full`` or ``sandbox`` for a trusted root (an entry without a level is ``full``), else None."""
        entry = self.entry(root)
        return None if entry is None else str(entry.get("level", "full"))

    def entry(self, root: Path | str) -> dict[str, Any] | None:
        """What was recorded about a trusted root (``trusted_at``, ``level``, ``allow``, ``python``); None if untrusted."""
        if not self.is_trusted(root):
            return None
        return dict(self._read().get(str(root), {}))

    def entries(self) -> dict[str, dict[str, Any]]:
        """Every trusted root with what was recorded about it (``trusted_at``, the identity)."""
        roots = self._read_upgraded()
        if self.problem is not None:
            raise TrustError(self.problem)
        return {root: dict(entry) for root, entry in roots.items()}

    def trust(
        self, root: Path | str, level: str = "full", allow: dict[str, Any] | None = None, python: str | None = None,
    ) -> bool:
        """Trust the directory now at ``root`` at ``level`` (``full`` or ``sandbox``, with ``allow``
        widening the sandbox; ``python``: the virtual environment its tools run with); False when it
        already was, at that level with that allowance and environment. A root trusted for a
        directory that has been replaced since is trusted again, for the one there now.

        Raises:
            TrustError: no directory is at ``root``, an unknown level, or the store cannot be read
                or written.
        """
        if level not in LEVELS:
            raise TrustError(f"unknown trust level {level!r}; use one of {', '.join(LEVELS)}")
        identity = dir_identity(root)
        if identity is None:
            raise TrustError(f"{root} is not a directory; only an existing directory can be trusted")
        wanted = {
            "level": level, **({"allow": allow} if level == "sandbox" and allow else {}),
            **({"python": python} if python else {}),
        }

        def add(roots: dict[str, dict[str, Any]]) -> bool:
            entry = roots.get(str(root))
            if (
                entry is not None and not entry.get("missing_when_upgraded") and _same_dir(entry, identity)
                and entry.get("level", "full") == level and entry.get("allow") == wanted.get("allow")
                and entry.get("python") == wanted.get("python")
            ):
                return False
            roots[str(root)] = {"trusted_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **identity, **wanted}
            return True

        self._warned.discard(str(root))
        return self._update(add)

    def untrust(self, root: Path | str) -> bool:
        """Stop trusting ``root`` (by path: its directory may be gone); False when it was not trusted."""
        return self._update(lambda roots: roots.pop(str(root), None) is not None)

    def _update(self, change: Callable[[dict[str, dict[str, Any]]], bool]) -> bool:
        from atomictoolsd.config.paths import make_private_dirs  # lazy: platformdirs, a start-up cost in workers

        try:
            make_private_dirs(self.path.parent)
            lock = os.open(self.path.with_name(TRUST_FILE + ".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise TrustError(explain_write_error(self.path, exc)) from None
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)  # two CLIs at once must not lose each other's change
            self._key = None
            roots = {path: dict(entry) for path, entry in self._read().items()}
            if self.problem is not None:
                raise TrustError(self.problem)
            if not change(roots) and not self._legacy:
                return False
            data = json.dumps({"version": 2, "projects": dict(sorted(roots.items()))}, indent=2) + "\n"
            try:
                write_atomic(self.path, data.encode("utf-8"), 0o600)
            except StateWriteError as exc:
                raise TrustError(str(exc)) from None
            self._key = None
            return True
        finally:
            os.close(lock)


def replaced_message(root: Path | str) -> str:
    """What to tell the user about a trusted root that now holds another directory (the path escaped:
    it goes to logs and terminals)."""
    from atomictoolsd.config.discovery import escape_path  # lazy: for a message only (start-up cost)

    return (
        f"{escape_path(str(root))} was trusted, but the directory there now is another one (it was removed or replaced "
        f"since); its tools do not load until you trust it again: {trust_command(root)}"
    )
