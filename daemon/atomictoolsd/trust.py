"""Project trust: which projects may load their own tools, and the daemon method that re-reads it.

A project's ``.atomic/tools/`` runs code from whatever repository the agent works in, so it loads only
once the user has trusted that project root (``atomictoolsd trust [DIR]``, like ``direnv allow``).
The global dir and the built-ins are always trusted. The trusted roots live in ``trust.json`` in the
state dir, mode 0600, written atomically under a lock; a store that another user could have written
is ignored, so it can only ever trust less.

Trust is by directory, not by content: a trusted project's tools load as they are now and as they
change later, like the rest of its code that you run.

Each trusted root has a level: ``full`` (its tools run with all the user's rights) or ``sandbox``
(its workers are confined: see ``workers/sandbox.py``), with what the user allowed it beyond the
sandbox's defaults (``allow``: ``net``, ``read``, ``write``). A store written before levels existed
reads as ``full``.

This module is light (standard library only, bar ``msgspec`` in the daemon method): the registry, the
CLI and the built-in tools' workers import it.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shlex
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from atomictoolsd.server import Server
    from atomictoolsd.session import Session

__all__ = ["LEVELS", "TRUST_FILE", "TrustError", "TrustService", "TrustStore", "trust_command"]

log = logging.getLogger("atomictoolsd.trust")

TRUST_FILE = "trust.json"
LEVELS = ("full", "sandbox")


def trust_command(root: Path | str, sandbox: bool = False) -> str:
    """The exact command that trusts ``root`` (confined with ``sandbox``), quoted for a POSIX shell."""
    from atomictoolsd.command import command_name

    return f"{command_name()} trust {'--sandbox ' if sandbox else ''}{shlex.quote(str(root))}"


class TrustError(Exception):
    """The trust store cannot be read or written; the message says how to fix it."""


class TrustStore:
    """The trusted project roots, in ``<state dir>/trust.json``.

    Reading is cheap enough to do on every question: the file is parsed again only when its inode,
    size or modification time changed, so a ``trust`` from another process is seen at once.
    """

    def __init__(self, state_dir: Path) -> None:
        self.path = Path(state_dir) / TRUST_FILE
        self._key: tuple[int, int, int] | None = None
        self._roots: dict[str, dict[str, Any]] = {}
        self.problem: str | None = None  # why the file on disk is being ignored, if it is

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
                roots = projects
            except (OSError, ValueError, KeyError, TypeError) as exc:
                problem = f"{self.path} is not a valid trust store ({type(exc).__name__}: {exc}); fix or remove it"
        if problem is not None and problem != self.problem:
            log.warning("ignoring the trust store: %s", problem)
        self._key, self._roots, self.problem = key, roots, problem
        return roots

    def is_trusted(self, root: Path | str) -> bool:
        """Whether the project at ``root`` (a resolved project root) may load its own tools."""
        return str(root) in self._read()

    def level(self, root: Path | str) -> str | None:
        """``full`` or ``sandbox`` for a trusted root (an entry without a level is ``full``), else None."""
        entry = self.entry(root)
        return None if entry is None else str(entry.get("level", "full"))

    def entry(self, root: Path | str) -> dict[str, Any] | None:
        """What was recorded about a trusted root (``trusted_at``, ``level``, ``allow``); None if untrusted."""
        if not self.is_trusted(root):
            return None
        return dict(self._read().get(str(root), {}))

    def entries(self) -> dict[str, dict[str, Any]]:
        """Every trusted root with what was recorded about it (``trusted_at``)."""
        roots = self._read()
        if self.problem is not None:
            raise TrustError(self.problem)
        return dict(roots)

    def trust(self, root: Path | str, level: str = "full", allow: dict[str, Any] | None = None) -> bool:
        """Trust ``root`` at ``level`` (``full`` or ``sandbox``, with ``allow`` widening the sandbox);
        False when it already was, at that level with that allowance."""
        if level not in LEVELS:
            raise TrustError(f"unknown trust level {level!r}; use one of {', '.join(LEVELS)}")

        def add(roots: dict[str, dict[str, Any]]) -> bool:
            entry = roots.get(str(root))
            wanted = {"level": level, **({"allow": allow} if level == "sandbox" and allow else {})}
            if entry is not None and entry.get("level", "full") == level and entry.get("allow") == wanted.get("allow"):
                return False
            roots[str(root)] = {"trusted_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **wanted}
            return True

        return self._update(add)

    def untrust(self, root: Path | str) -> bool:
        """Stop trusting ``root``; False when it was not trusted."""
        return self._update(lambda roots: roots.pop(str(root), None) is not None)

    def _update(self, change: Callable[[dict[str, dict[str, Any]]], bool]) -> bool:
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        lock = os.open(self.path.with_name(TRUST_FILE + ".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)  # two CLIs at once must not lose each other's change
            self._key = None
            roots = dict(self._read())
            if self.problem is not None:
                raise TrustError(self.problem)
            if not change(roots):
                return False
            temporary = self.path.with_name(f".{TRUST_FILE}.{os.getpid()}")
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump({"version": 1, "projects": dict(sorted(roots.items()))}, fh, indent=2)
                fh.write("\n")
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(temporary, self.path)
            return True
        finally:
            os.close(lock)


class TrustService:
    """Daemon component: ``atomic/trust/refresh`` re-reads the store and loads, or blocks, every
    project whose trust changed, telling attached sessions (``tools/list_changed``).

    ``atomictoolsd trust`` and ``untrust`` call it after writing the store, so trusting takes effect
    without a restart.
    """

    def __init__(self) -> None:
        self.server: Server | None = None

    async def start(self, server: Server) -> None:
        self.server = server
        server.methods["atomic/trust/refresh"] = self.on_refresh

    async def stop(self) -> None:
        self.server = None

    def on_refresh(self, session: Session, id_json: bytes, raw: Any) -> Awaitable[None]:
        return self._refresh(session, id_json)

    async def _refresh(self, session: Session, id_json: bytes) -> None:
        import msgspec

        assert self.server is not None
        changed = await self.server.registry.refresh_trust()
        result = {"changed": [{"root": str(d.cwd), "trusted": d.trusted} for d in changed]}
        session.send_result(id_json, msgspec.json.encode(result))
