"""The support packages: what TypeScript and JavaScript tools import that the daemon provides when
their own directory does not (``zod``, ``@opencode-ai/plugin``, ``@github/copilot-sdk``).

A tool module resolves them as it resolves any package: its tools dir's ``node_modules`` and those
above it first (OpenCode's layout: it runs ``bun add @opencode-ai/plugin`` in ``.opencode/``). When
none has them, from here: the daemon installs them once, from the lockfile it ships
(``worker/js/packages``: pinned versions, every file's integrity hash), into
``<cache dir>/javascript/<digest of the lockfile>``, with npm (``npm ci``) or Bun (``bun install
--frozen-lockfile``), lifecycle scripts off, in a directory of its own: never in a user's directory,
and nothing of a repository's (no ``.npmrc`` of a project, no ``bunfig.toml``) is read. A new
lockfile installs beside the old one, which is removed once the new one is in place; an install is
made in a temporary directory and renamed into place whole, so a worker never sees half of one.

``js_packages`` names a directory of the user's instead (its ``node_modules`` holds them): the
daemon never installs there.

Daemon side: never imported by workers.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from atomictoolsd.config.paths import make_private
from atomictoolsd.protocol import JsRuntime
from atomictoolsd.worker.jsexec import JS_DIR

__all__ = ["LOCK_DIR", "SUPPORT_PACKAGES", "PackagesInstallError", "Packages", "install_command"]

LOCK_DIR = Path(JS_DIR) / "packages"
SUPPORT_PACKAGES = ("zod", "@opencode-ai/plugin", "@github/copilot-sdk")
INSTALL_TIMEOUT = 600.0
_LOCK_FILES = ("package.json", "package-lock.json")
_DROPPED = ("NODE_OPTIONS", "BUN_OPTIONS", "NODE_PATH")


class PackagesInstallError(Exception):
    """The support packages could not be installed; the message says why and what to do."""


def lock_digest() -> str:
    digest = hashlib.sha256()
    for name in _LOCK_FILES:
        digest.update((LOCK_DIR / name).read_bytes())
    return digest.hexdigest()[:16]


def install_command(runtime: JsRuntime | None) -> list[str] | None:
    """How to install the lockfile where it has been copied: with the chosen runtime's own package
    manager (Bun's), else npm; None when neither is there."""
    if runtime is not None and runtime.name == "bun" and runtime.command:
        return [runtime.command[0], "install", "--frozen-lockfile", "--ignore-scripts", "--no-progress"]
    npm = shutil.which("npm")
    if npm is None and runtime is not None and runtime.command:
        beside = Path(runtime.command[0]).parent / "npm"
        npm = str(beside) if beside.is_file() else None
    if npm is None:
        return None
    return [
        npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund", "--fetch-retries=1", "--fetch-retry-mintimeout=1000",
        "--fetch-retry-maxtimeout=5000", "--loglevel=http",
    ]


def _versions(directory: Path) -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in SUPPORT_PACKAGES:
        try:
            versions[name] = json.loads((directory / "node_modules" / name / "package.json").read_text()).get("version")
        except (OSError, ValueError):
            versions[name] = None
    return versions


class Packages:
    """Where the support packages are, whether they are there, and installing them.

    Args:
        cache_dir: the daemon's cache dir (its own packages go under ``javascript/``).
        setting: ``js_packages`` (a directory of the user's; empty: the daemon's own).
    """

    def __init__(self, cache_dir: Path, setting: str = "") -> None:
        self.own = not setting.strip()
        self.base = cache_dir / "javascript"
        self.directory = self.base / lock_digest() if self.own else Path(os.path.expanduser(setting.strip()))
        self.state = "unknown"  # installing, failed, or what ``installed()`` last found
        self.error: str | None = None
        self.installed_at: float | None = None
        self.log: list[str] = []  # the last lines the installer printed

    def installed(self) -> bool:
        """Whether the directory holds the support packages (one of them, for a user's own)."""
        modules = self.directory / "node_modules"
        present = [name for name in SUPPORT_PACKAGES if (modules / name / "package.json").is_file()]
        found = len(present) == len(SUPPORT_PACKAGES) if self.own else bool(present)
        if self.state not in ("installing", "failed") or found:
            self.state = "installed" if found else "missing"
        return found

    def path(self) -> str:
        """The directory a worker reads them from ("" while they are not installed)."""
        return str(self.directory) if self.installed() else ""

    def install(self, runtime: JsRuntime | None, line: Callable[[str], None] = lambda text: None) -> None:
        """Install the packages into the daemon's own directory (blocking: the daemon runs it in a
        thread). ``line`` gets each line the package manager prints.

        Raises:
            PackagesInstallError: no package manager, the directory is not the daemon's, or the install failed.
        """
        if not self.own:
            raise PackagesInstallError(
                f"js_packages names {self.directory}, which the daemon does not install into: run "
                f"`npm install {' '.join(SUPPORT_PACKAGES)}` there, or unset js_packages"
            )
        command = install_command(runtime)
        if command is None:
            raise PackagesInstallError(
                "neither npm nor Bun was found to install them: install Node.js with npm, or Bun, and run "
                "`atomictoolsd js install`"
            )
        self.state, self.error, self.log = "installing", None, []
        make_private(self.base)
        staging = Path(tempfile.mkdtemp(prefix=".install-", dir=self.base))
        try:
            try:
                for name in _LOCK_FILES:
                    shutil.copyfile(LOCK_DIR / name, staging / name)
                self._run(command, staging, line)
                try:
                    os.rename(staging, self.directory)
                except OSError:
                    if not self.installed():  # not another install's, finished meanwhile
                        raise
            finally:
                # Before the state says how it went: status is read from another thread, and a
                # failed install leaves nothing behind once it says "failed".
                shutil.rmtree(staging, ignore_errors=True)
        except PackagesInstallError as exc:
            self.state, self.error = "failed", str(exc)
            raise
        except OSError as exc:
            self.state, self.error = "failed", f"cannot install into {self.base}: {exc}"
            raise PackagesInstallError(self.error) from exc
        self.state, self.installed_at = "installed", time.time()
        self._remove_others()

    def _run(self, command: list[str], cwd: Path, line: Callable[[str], None]) -> None:
        env = {key: value for key, value in os.environ.items() if key not in _DROPPED}
        try:
            process = subprocess.Popen(
                command, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                text=True, errors="replace", start_new_session=True,
            )
        except OSError as exc:
            raise PackagesInstallError(f"cannot run {command[0]}: {exc.strerror}") from exc
        deadline = time.monotonic() + INSTALL_TIMEOUT
        assert process.stdout is not None
        for text in process.stdout:
            text = text.rstrip()
            if text:
                self.log = [*self.log[-19:], text]
                line(text)
            if time.monotonic() > deadline:
                break
        try:
            code = process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)
            process.wait()
            raise PackagesInstallError(f"{' '.join(command[:2])} took longer than {INSTALL_TIMEOUT:g} s; run `atomictoolsd js install`") from None
        if code != 0:
            # npm's error code line (ECONNREFUSED, ENOTFOUND, ETIMEDOUT) says most; else the last line.
            coded = [text for text in self.log if re.search(r"\b(code )?E[A-Z]{3,}\b", text)]
            last = coded[0] if coded else self.log[-1] if self.log else f"exit code {code}"
            raise PackagesInstallError(
                f"`{' '.join(command[:2])}` failed ({last}); are you offline? run `atomictoolsd js install` when the "
                f"registry can be reached"
            )

    def _remove_others(self) -> None:
        """Remove the installs of other lockfiles (older daemons'), and leftovers of failed ones."""
        try:
            entries = list(os.scandir(self.base))
        except OSError:
            return
        for entry in entries:
            if entry.is_dir(follow_symlinks=False) and entry.path != str(self.directory):
                shutil.rmtree(entry.path, ignore_errors=True)

    def info(self) -> dict[str, Any]:
        installed = self.installed()
        return {
            "dir": str(self.directory),
            "own": self.own,
            "state": self.state,
            "versions": _versions(self.directory) if installed else {},
            "error": self.error,
            **({"log": self.log[-5:]} if self.state in ("installing", "failed") else {}),
        }
