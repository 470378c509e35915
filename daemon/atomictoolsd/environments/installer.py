"""The installer the daemon runs to build an environment: uv where it has one, pip otherwise.

Two steps, each one subprocess: ``resolve`` turns what a module declares into the exact set of
packages (``name==version``, for the daemon's own interpreter), and ``install`` puts exactly those
(no dependencies of their own: the set is whole) into a new directory.

Nothing of a repository steers it, nor of the environment an agent started the daemon with: the
installer runs from an empty directory of the daemon's own, with an environment made here
(``installer_environ``: where your home and cache are, the locale, the proxy and certificate
settings, and nothing of ``UV_*``, ``PIP_*`` or ``PYTHON*``), told to read no configuration file
(``--no-config`` and ``UV_NO_CONFIG``; ``PIP_CONFIG_FILE=/dev/null`` and ``python -I``), to
download no interpreter, and to install wheels only: building a source distribution runs its code,
with your rights. The package index is PyPI's unless your config file names another
(``package_index``).

uv is the one installed beside the daemon (the ``uv`` package, a dependency of atomictoolsd) or
uv's own install (``~/.local/bin/uv``, ``~/.cargo/bin/uv``): never one found on ``PATH``, which a
project's environment can put first. pip is the daemon's interpreter's (``python -I -m pip``).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import re
import signal
import sys
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

__all__ = ["InstallError", "Installer", "find_installer", "installer_environ"]

_PASSED = (
    "HOME", "XDG_CACHE_HOME", "LANG", "LC_ALL", "LC_CTYPE", "TMPDIR", "SSL_CERT_FILE", "SSL_CERT_DIR",
    "http_proxy", "https_proxy", "no_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY",
)
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_TAIL = 40  # lines of the installer's output kept for a failure's message


class InstallError(Exception):
    """An environment could not be built; the message is the installer's (the package named).
    ``transient``: not the module's doing (a timeout, no installer), so it is tried again."""

    def __init__(self, message: str, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


def installer_environ(environ: dict[str, str] | os._Environ[str]) -> dict[str, str]:
    """What an installer is started with: the few variables it needs of ``environ``, and those that
    keep it to its command line."""
    env = {key: environ[key] for key in _PASSED if key in environ}
    env.update(
        PATH=os.defpath, NO_COLOR="1", UV_NO_CONFIG="1", UV_PYTHON_DOWNLOADS="never", UV_NO_PROGRESS="1",
        PIP_CONFIG_FILE=os.devnull, PIP_NO_INPUT="1", PIP_DISABLE_PIP_VERSION_CHECK="1", PYTHONNOUSERSITE="1",
    )
    return env


def _uv(home: Path) -> str | None:
    if importlib.util.find_spec("uv") is not None:
        from uv import find_uv_bin  # lazy: only when an environment is built

        with contextlib.suppress(FileNotFoundError):
            return find_uv_bin()
    for path in (home / ".local" / "bin" / "uv", home / ".cargo" / "bin" / "uv"):
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    return None


def find_installer(choice: str, home: Path) -> Installer:
    """The installer ``choice`` (``auto``, ``uv``, ``pip``) names, as found here.

    Raises:
        InstallError: it is not there (``auto``: neither is).
    """
    if choice in ("auto", "uv"):
        uv = _uv(home)
        if uv is not None:
            return Installer("uv", uv)
        if choice == "uv":
            raise InstallError("installer = \"uv\", but atomictoolsd finds no uv (pip install uv in its environment)", True)
    if importlib.util.find_spec("pip") is not None:
        return Installer("pip", sys.executable)
    raise InstallError(
        f"no installer: atomictoolsd's environment ({sys.prefix}) has neither uv nor pip; install one "
        f"there: {sys.executable} -m ensurepip, or uv pip install --python {sys.executable} uv", True,
    )


@dataclass(frozen=True)
class Installer:
    """uv or pip, and the program that runs it."""

    kind: Literal["uv", "pip"]
    program: str

    async def resolve(
        self, requirements: list[str], work: Path, index: str, timeout: float, progress: Callable[[str], None],
    ) -> list[str]:
        """The exact packages ``requirements`` come to for this interpreter: ``name==version`` lines.

        Raises:
            InstallError: it cannot be resolved (the installer's words), or took longer than ``timeout``.
        """
        (work / "requirements.in").write_text("\n".join(requirements) + "\n")
        if self.kind == "uv":
            out = await self._run(
                [self.program, "pip", "compile", "requirements.in", "--python", sys.executable, "--no-config",
                 "--no-header", "--no-annotate", "--no-build", "--no-python-downloads", "--color", "never",
                 *self._index(index)],
                work, timeout, progress,
            )
            return [line.strip() for line in out.splitlines() if line.strip() and not line.startswith("#")]
        await self._run(
            [self.program, "-I", "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
             "--report", "report.json", "--only-binary=:all:", "-r", "requirements.in", *self._index(index)],
            work, timeout, progress,
        )
        report = json.loads((work / "report.json").read_text())
        return sorted(f"{item['metadata']['name']}=={item['metadata']['version']}" for item in report.get("install", []))

    async def install(
        self, pinned: list[str], target: Path, work: Path, index: str, timeout: float, progress: Callable[[str], None],
    ) -> None:
        """Install exactly ``pinned`` (as ``resolve`` made it) into the new directory ``target``.

        Raises:
            InstallError: it failed (the installer's words), or took longer than ``timeout``.
        """
        (work / "requirements.txt").write_text("\n".join(pinned) + "\n")
        if self.kind == "uv":
            command = [
                self.program, "pip", "install", "-r", "requirements.txt", "--target", str(target), "--python",
                sys.executable, "--no-config", "--no-deps", "--no-build", "--no-python-downloads", "--compile-bytecode",
                "--color", "never", *self._index(index),
            ]
        else:
            command = [
                self.program, "-I", "-m", "pip", "install", "-r", "requirements.txt", "--target", str(target),
                "--no-deps", "--only-binary=:all:", "--progress-bar", "off", *self._index(index),
            ]
        await self._run(command, work, timeout, progress)

    def _index(self, index: str) -> list[str]:
        options = []
        if index:
            options += ["--default-index", index] if self.kind == "uv" else ["--index-url", index]
        cert = os.environ.get("SSL_CERT_FILE")
        if self.kind == "pip" and cert:
            options += ["--cert", cert]  # pip's own bundle otherwise, which knows no local authority
        return options

    async def _run(self, command: list[str], work: Path, timeout: float, progress: Callable[[str], None]) -> str:
        """Run the installer; return its stdout. Its stderr's lines go to ``progress`` as they come."""
        try:
            process = await asyncio.create_subprocess_exec(
                *command, cwd=work, env=installer_environ(os.environ), stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True,
            )
        except OSError as exc:
            raise InstallError(f"cannot run {self.kind} ({command[0]}): {exc}", True) from None
        tail: deque[str] = deque(maxlen=_TAIL)

        async def read_stderr() -> None:
            assert process.stderr is not None
            async for raw in process.stderr:
                line = _ANSI.sub("", raw.decode(errors="replace")).rstrip()
                if line.strip():
                    tail.append(line)
                    progress(line.strip())

        assert process.stdout is not None
        readers = [asyncio.ensure_future(process.stdout.read()), asyncio.ensure_future(read_stderr())]
        try:
            await asyncio.wait_for(process.wait(), timeout)
            out = await readers[0]
            await readers[1]
        except TimeoutError:
            _kill(process.pid)
            await process.wait()
            raise InstallError(f"{self.kind} did not finish within {timeout:g} s (install_timeout)", True) from None
        except BaseException:
            _kill(process.pid)
            raise
        finally:
            for reader in readers:
                reader.cancel()
            await asyncio.gather(*readers, return_exceptions=True)
        if process.returncode != 0:
            raise InstallError("\n".join(_unindent(tail)) or f"{self.kind} exited with code {process.returncode}")
        return out.decode(errors="replace")


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)  # its own session and group: it and what it started


def _unindent(lines: deque[str]) -> list[str]:
    """The installer's failure as it printed it, without its progress lines (uv) and its box drawing."""
    kept = [line for line in lines if not re.match(r"^\s*(Resolved|Prepared|Installed|Using|Audited) ", line)]
    return [re.sub(r"^[\s×╰─▶│]+", "", line).rstrip() for line in kept]
