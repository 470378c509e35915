"""A project's own environment: the virtual environment its tools run with, when the user says so.

The choice is the user's, never a repository's: the project's trust entry (``atomictoolsd trust
--python .venv``) or the user's config file (``project_venv = ".venv"``: every trusted project that
has one). A file of the repository (``.atomic/config.toml``, ``pyproject.toml``) cannot turn it on:
what a project's environment holds runs in its tools' workers (its ``.pth`` files too).

Its tools then import the project's packages (the environment's site-packages) and its own code:
the project's root and its ``src/``, as pytest finds them. The workers still fork from the daemon's
fork server, so the environment must be for the daemon's Python version (its ``pyvenv.cfg`` says);
one of another version is refused with the reason, naming the two versions.

Reads files only (``pyvenv.cfg``, directory listings): nothing here runs the environment's code.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from atomictoolsd.config.command import command_name, shell_quote
from atomictoolsd.protocol import EnvSpec
from atomictoolsd.util.files import read_bounded

__all__ = ["Venv", "describe", "find_venv", "project_env", "read_venv"]

_VENV_NAMES = (".venv", "venv")
_MAX_CFG_BYTES = 64 * 1024  # of a pyvenv.cfg: a real one is a few hundred bytes


@dataclass(frozen=True)
class Venv:
    """A virtual environment as its ``pyvenv.cfg`` and its directories say."""

    path: str
    version: tuple[int, ...]  # its Python's, from pyvenv.cfg
    site: list[str]  # its site-packages dirs that exist
    python: str  # its interpreter (the one an install command names)

    @property
    def version_text(self) -> str:
        return ".".join(map(str, self.version))

    def matches(self) -> bool:
        """Whether its Python is the daemon's version (what its workers fork from)."""
        return self.version[:2] == sys.version_info[:2]


def find_venv(path: str | Path) -> str | None:
    """The virtual environment ``path`` names: the directory itself, or the one of an interpreter in
    its ``bin/``; None when it is neither."""
    path = Path(path).expanduser()
    for candidate in (path, path.parent.parent if path.parent.name in ("bin", "Scripts") else None):
        if candidate is not None and (candidate / "pyvenv.cfg").is_file():
            return os.path.abspath(candidate)
    return None


def read_venv(path: str) -> Venv | None:
    """The environment at ``path``; None when it has no readable ``pyvenv.cfg``."""
    text = _read_cfg(os.path.join(path, "pyvenv.cfg"))
    if text is None:
        return None
    values = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key.strip().lower()] = value.strip()
    raw = values.get("version_info") or values.get("version") or ""
    try:
        version = tuple(int(part) for part in raw.split(".")[:3] if part.isdigit())
    except ValueError:
        version = ()
    if len(version) < 2:
        return None
    lib = f"python{version[0]}.{version[1]}"
    site = []
    for base in ("lib", "lib64"):
        candidate = os.path.join(path, base, lib, "site-packages")
        if os.path.isdir(candidate) and os.path.realpath(candidate) not in {os.path.realpath(s) for s in site}:
            site.append(candidate)
    return Venv(path, version, site, os.path.join(path, "bin", "python"))


def _read_cfg(path: str) -> str | None:
    """The text of ``path`` when it is a regular file of at most ``_MAX_CFG_BYTES``, else None.

    A repository's ``.venv/pyvenv.cfg`` is read on the daemon's event loop (``list`` describes the
    environment a project has): opened without blocking (a FIFO never answers) and read only as far
    as a real one goes (a few hundred bytes), so that no file there holds up every client."""
    try:
        data = read_bounded(path, _MAX_CFG_BYTES)
    except OSError:
        return None
    return None if data is None else data.decode(errors="replace")


def project_env(root: str, venv_path: str) -> EnvSpec:
    """What a worker of the project at ``root`` imports from with the environment ``venv_path``.

    Raises:
        ValueError: it is not an environment a worker can use; the message says why and what to do.
    """
    venv = read_venv(venv_path)
    if venv is None:
        raise ValueError(
            f"the project's environment {venv_path} is not a virtual environment (no readable pyvenv.cfg); make one "
            f"(uv venv, or python -m venv .venv) or trust the project again with another: "
            f"{command_name()} trust --python PATH {shell_quote(root)}"
        )
    if not venv.matches():
        mine = f"{sys.version_info.major}.{sys.version_info.minor}"
        raise ValueError(
            f"the project's environment {venv_path} is Python {venv.version_text}, and atomictoolsd runs on Python "
            f"{mine}: its workers fork from the daemon, so a project's environment must be Python {mine} too; make it "
            f"with that version (uv venv --python {mine}), or run atomictoolsd on Python {venv.version_text}"
        )
    code = [root, *([os.path.join(root, "src")] if os.path.isdir(os.path.join(root, "src")) else [])]
    return EnvSpec(kind="project", name=venv_path, site=venv.site, code=code, python=venv.python)


def describe(root: str, chosen: tuple[str, str] | None) -> dict[str, object] | None:
    """What ``list`` says of the project's environment: the one in use (``chosen``: its path and
    where the choice is, ``trust`` or ``config``), or one it has that could be (with the command that
    turns it on); None when there is neither."""
    if chosen is not None:
        path, source = chosen
        venv = read_venv(path)
        described: dict[str, object] = {"path": path, "from": source}
        if venv is None or not venv.matches():
            try:
                project_env(root, path)
            except ValueError as exc:
                described["problem"] = str(exc)
        if venv is not None:
            described["version"] = venv.version_text
        return described
    for name in _VENV_NAMES:
        path = os.path.join(root, name)
        venv = read_venv(path)
        if venv is None:
            continue
        offer: dict[str, object] = {"offer": path, "version": venv.version_text}
        if venv.matches():
            offer["command"] = f"{command_name()} trust --python {shell_quote(path)} {shell_quote(root)}"
        else:
            offer["problem"] = (
                f"it is Python {venv.version_text}; atomictoolsd runs on Python "
                f"{sys.version_info.major}.{sys.version_info.minor}, which a project's environment must match"
            )
        return offer
    return None
