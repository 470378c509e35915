"""Project trust: which projects may load their own tools (the store; ``atomic/trust/refresh``, which
re-reads it in a running daemon, is in ``sessions/trust_refresh.py``).

A project's ``.atomic/tools/`` runs code from whatever repository the agent works in, so it loads only
once the user has trusted that project root (``atomictoolsd trust [DIR]``, like ``direnv allow``).
The global dir and the built-ins are always trusted. The trusted roots live in ``trust.json`` in the
state dir, mode 0600, written atomically under a lock; a store that another user could have written
is ignored, so it can only ever trust less.

Trust is by directory, not by content: a trusted project's tools load as they are now and as they
change later, like the rest of its code that you run.

This module is light (standard library only): the registry, the CLI and the built-in tools' workers
import it. It never knows the server or the sessions.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shlex
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["TRUST_FILE", "TrustError", "TrustStore", "trust_command"]

log = logging.getLogger("atomictoolsd.trust")

TRUST_FILE = "trust.json"


def trust_command(root: Path | str) -> str:
    """The exact command that trusts ``root``, quoted for a POSIX shell."""
    from atomictoolsd.config.command import command_name  # lazy: for a message only (start-up cost)

    return f"{command_name()} trust {shlex.quote(str(root))}"


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

    def entries(self) -> dict[str, dict[str, Any]]:
        """Every trusted root with what was recorded about it (``trusted_at``)."""
        roots = self._read()
        if self.problem is not None:
            raise TrustError(self.problem)
        return dict(roots)

    def trust(self, root: Path | str) -> bool:
        """Trust ``root``; False when it already was."""

        def add(roots: dict[str, dict[str, Any]]) -> bool:
            if str(root) in roots:
                return False
            roots[str(root)] = {"trusted_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
            return True

        return self._update(add)

    def untrust(self, root: Path | str) -> bool:
        """Stop trusting ``root``; False when it was not trusted."""
        return self._update(lambda roots: roots.pop(str(root), None) is not None)

    def _update(self, change: Callable[[dict[str, dict[str, Any]]], bool]) -> bool:
        from atomictoolsd.config.paths import make_private_dirs  # lazy: platformdirs, a start-up cost in workers

        make_private_dirs(self.path.parent)
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
