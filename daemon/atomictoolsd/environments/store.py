"""The environments the daemon builds for the packages tool modules declare (PEP 723), and the one
question a worker's start asks of them: ``Environments.for_runner``.

An environment is a directory of installed packages for the daemon's own interpreter, put on a
worker's ``sys.path`` after the fork (``worker/environment.py``): the fork server stays the
one forked from the daemon, and a worker of an environment starts as fast as any other. It is built
once for the exact set of packages a declaration resolves to, and shared: every module whose
declaration resolves to that set uses it, and one build serves every module that asks while it runs.

On disk, under the daemon's cache dir (``envs/``):

- ``<set>/``: an environment, named by a hash of the resolved set and the interpreter (its
  ``.atomic-env.json`` says what it holds); made as ``.build-<set>-<n>/`` and renamed when whole, so
  a directory of that name is always complete;
- ``requests/<declared>.json``: which environment a declaration resolved to, so that a module whose
  environment exists starts with no installer run at all (one small file read).

A declaration is resolved once: an unpinned requirement keeps the version it first resolved to
until the declaration changes (pin it, or edit the block, to move). Only what the registry loads
gets here: a module of a project you have not trusted never has its dependencies installed.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import json
import logging
import os
import shutil
import sys
import sysconfig
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from atomictoolsd.config.discovery import local_tools_dir
from atomictoolsd.environments.installer import Installer, InstallError, find_installer
from atomictoolsd.environments.project import describe, project_env
from atomictoolsd.environments.script import ScriptError, ScriptMetadata, parse_metadata, python_meets
from atomictoolsd.protocol import EnvSpec, LoadFailure

if TYPE_CHECKING:
    from atomictoolsd.config.settings import Config
    from atomictoolsd.pool.pool import ModuleRunner

__all__ = ["Environments"]

log = logging.getLogger("atomictoolsd.environments")

_MARK = ".atomic-env.json"
_PYTHON = f"{sys.implementation.cache_tag}{sys.abiflags}-{sysconfig.get_platform()}"
_SCRIPT_MARK = b"# /// script"


def _key(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:20]


class _Build:
    """An environment being made for one declaration: what status shows, and when it is done."""

    def __init__(self, requirements: list[str]) -> None:
        self.info: dict[str, Any] = {
            "requirements": requirements, "step": "resolving", "progress": "", "since": time.time(), "modules": [],
        }
        self.task: asyncio.Future[EnvSpec] | None = None

    def progress(self, line: str) -> None:
        self.info["progress"] = line[:200]
        log.debug("%s: %s", ", ".join(self.info["requirements"]), line)


class Environments:
    """The daemon's environments of declared dependencies, under ``root``."""

    def __init__(
        self, root: Path, home: Path, config: Config,
        project_setting: Callable[[str], tuple[str, str] | None] | None = None,
    ) -> None:
        self.root = root
        self.home = home
        self.config = config
        # The environment the user chose for the project at a root: (its path, "trust" or "config").
        self.project_setting = project_setting
        self._used_projects: dict[str, str | None] = {}  # by project root: what its workers last started with
        self._metadata: dict[str, tuple[tuple[int, int], ScriptMetadata | None]] = {}
        self._ready: dict[str, EnvSpec] = {}  # by declaration: environments known whole
        self._builds: dict[str, _Build] = {}  # by declaration: builds under way
        self._making: dict[str, asyncio.Future[None]] = {}  # by resolved set: installs under way
        self._finding = asyncio.Lock()  # one installer lookup at a time: see _installer
        self._serial = itertools.count()
        self._swept = False
        self.built = 0
        self.failed = 0

    # A daemon component: started with the others, and stopped after the calls have drained.

    async def start(self, server: object) -> None:
        pass

    async def stop(self) -> None:
        """End the builds under way, and their installers with them (the daemon is stopping)."""
        tasks = [build.task for build in self._builds.values() if build.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def reconfigure(self, config: Config) -> None:
        """Apply the installer settings (at start, and on SIGHUP: for the next build)."""
        self.config = config

    # -- what a module declares -------------------------------------------------------------------

    def metadata(self, path: str) -> ScriptMetadata | None:
        """The ``# /// script`` block of the module at ``path``, read again only when it changed.

        Raises:
            ScriptError: the block cannot be read.
        """
        try:
            info = os.stat(path)
        except OSError:
            return None
        stamp = (info.st_size, info.st_mtime_ns)
        known = self._metadata.get(path)
        if known is not None and known[0] == stamp:
            return known[1]
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            return None
        metadata = parse_metadata(data.decode("utf-8", "replace")) if _SCRIPT_MARK in data else None
        self._metadata[path] = (stamp, metadata)
        return metadata

    async def for_runner(self, runner: ModuleRunner) -> EnvSpec | None:
        """The environment the next worker of ``runner``'s module runs with (None: the daemon's own),
        built first when it is not there; meanwhile ``runner.installing`` says how it goes.

        Raises:
            LoadFailure: the module's declaration cannot be met (the installer's words, the package
                named; a ``requires-python`` this interpreter does not meet).
        """
        spec = runner.spec
        if spec.kind != "python":
            return None
        project = self._project(spec.path, spec.cwd)
        try:
            metadata = self.metadata(spec.path)
        except ScriptError as exc:
            raise LoadFailure(spec.path, exc.line, str(exc)) from None
        if metadata is None:
            return project
        self._check_python(spec.path, metadata)
        if not metadata.dependencies:
            return project
        if spec.sandbox is not None:
            _no_direct_references(spec.path, metadata)
        declared = await self.declared(spec.path, metadata, runner)
        if project is None:
            return declared
        return msgspec.structs.replace(
            declared, site=[*declared.site, *project.site], code=project.code, python=project.python,
        )

    # -- the project's environment ------------------------------------------------------------------

    def _project(self, path: str, root: str) -> EnvSpec | None:
        """The environment the user chose for the project at ``root``, for its own tools' module at
        ``path`` (the global tools and the built-ins run in the daemon's).

        Raises:
            LoadFailure: the chosen environment cannot be used (another Python version, gone).
        """
        if (
            self.project_setting is None or root == str(self.home)  # the global tools: the daemon's
            or not path.startswith(str(local_tools_dir(Path(root))) + os.sep)
        ):
            return None
        chosen = self.project_setting(root)
        self._used_projects[root] = chosen[0] if chosen is not None else None
        if chosen is None:
            return None
        try:
            return project_env(root, chosen[0])
        except ValueError as exc:  # not the module's doing: never cached, tried again at the next load
            raise LoadFailure(path, None, str(exc), by_module=False) from None

    def project_moved(self, root: str) -> bool:
        """Whether the environment chosen for the project at ``root`` is not the one its workers last
        started with (``trust --python`` again, a new ``project_venv``): its modules load again."""
        if self.project_setting is None or root not in self._used_projects:
            return False
        chosen = self.project_setting(root)
        return self._used_projects[root] != (chosen[0] if chosen is not None else None)

    def describe_project(self, root: str) -> dict[str, Any] | None:
        """What ``list`` says of the project's environment (``project.describe``)."""
        if self.project_setting is None:
            return None
        return describe(root, self.project_setting(root))

    def _check_python(self, path: str, metadata: ScriptMetadata) -> None:
        if metadata.requires_python is None:
            return
        version = sys.version_info[:3]
        try:
            met = python_meets(metadata.requires_python, version)
        except ValueError as exc:
            raise LoadFailure(
                path, metadata.line, f"requires-python = {metadata.requires_python!r}: {exc}; write it as version "
                f"clauses, as uv and pip read it: requires-python = \">=3.11\" (or \">=3.10,<3.14\", \"==3.12.*\")",
            ) from None
        if not met:
            raise LoadFailure(
                path, metadata.line,
                f"the module requires Python {metadata.requires_python} (requires-python), and atomictoolsd runs on "
                f"Python {'.'.join(map(str, version))} ({sys.executable}): run atomictoolsd on a Python that meets it, "
                f"or change requires-python",
            )

    # -- environments -----------------------------------------------------------------------------

    async def declared(self, path: str, metadata: ScriptMetadata, runner: ModuleRunner | None = None) -> EnvSpec:
        """The environment of ``metadata``'s dependencies, built when it is not there yet.

        Raises:
            LoadFailure: it cannot be built.
        """
        requirements = sorted(set(metadata.dependencies))
        declaration = _key({"python": _PYTHON, "index": self.config.package_index, "requirements": requirements})
        env = self._ready.get(declaration)
        if env is not None and os.path.isdir(env.site[0]):
            return env
        env = self._recorded(declaration, requirements)
        if env is not None:
            self._ready[declaration] = env
            return env
        build = self._builds.get(declaration)
        if build is None:
            build = self._builds[declaration] = _Build(requirements)
            build.task = asyncio.ensure_future(self._build(declaration, build))
            build.task.add_done_callback(lambda _t, d=declaration: self._builds.pop(d, None))
        build.info["modules"].append(path)
        if runner is not None:
            runner.installing = build.info
        try:
            assert build.task is not None
            return await asyncio.shield(build.task)
        except InstallError as exc:
            declared = ", ".join(metadata.dependencies)
            raise LoadFailure(
                path, metadata.line, f"cannot install the dependencies it declares ({declared}): {exc}",
                by_module=not exc.transient,
            ) from None
        finally:
            if path in build.info["modules"]:
                build.info["modules"].remove(path)
            if runner is not None and runner.installing is build.info:
                runner.installing = None

    def _recorded(self, declaration: str, requirements: list[str]) -> EnvSpec | None:
        """The environment a declaration resolved to before, when it is still whole on disk."""
        try:
            record = json.loads((self.root / "requests" / f"{declaration}.json").read_text())
            directory = self.root / str(record["env"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if not (directory / _MARK).is_file():
            return None
        return _env_spec(directory, requirements)

    async def _installer(self) -> Installer:
        """The installer the setting names, as found now. In a thread, since finding uv reads the
        interpreter's configuration (sysconfig, ~5 ms the first time); one lookup at a time, since
        that first read is not safe from two threads at once (builds of two declarations starting
        together saw ``EXE`` still unset)."""
        async with self._finding:
            return await asyncio.get_running_loop().run_in_executor(None, find_installer, self.config.installer, self.home)

    async def _build(self, declaration: str, build: _Build) -> EnvSpec:
        started = time.monotonic()
        requirements = build.info["requirements"]
        self._sweep()
        try:
            installer = await self._installer()
        except InstallError as exc:
            self.failed += 1
            log.warning("cannot install %s: %s", ", ".join(requirements), exc,
                        extra={"event": "env.failed", "data": {"requirements": requirements, "error": str(exc)}})
            raise
        log.info(
            "installing %s with %s (for %s)", ", ".join(requirements), installer.kind, ", ".join(build.info["modules"]),
            extra={"event": "env.install", "data": {"requirements": requirements, "installer": installer.kind}},
        )
        work = self._private_dir(f".work-{os.getpid()}-{next(self._serial)}")
        try:
            timeout = self.config.install_timeout
            pinned = await installer.resolve(requirements, work, self.config.package_index, timeout, build.progress)
            name = _key({"python": _PYTHON, "packages": sorted(pinned)})
            directory = self.root / name
            if not (directory / _MARK).is_file():
                build.info["step"] = "installing"
                await self._make(name, directory, installer, pinned, work, build)
            self._record(declaration, name, requirements)
        except InstallError as exc:
            self.failed += 1
            log.warning(
                "cannot install %s: %s", ", ".join(requirements), exc,
                extra={"event": "env.failed", "data": {"requirements": requirements, "error": str(exc)}},
            )
            raise
        finally:
            shutil.rmtree(work, ignore_errors=True)
        env = self._ready[declaration] = _env_spec(directory, requirements)
        log.info(
            "the environment of %s is ready in %.2f s: %s", ", ".join(requirements), time.monotonic() - started,
            directory, extra={"event": "env.ready", "data": {
                "requirements": requirements, "packages": pinned, "dir": str(directory),
                "s": round(time.monotonic() - started, 3),
            }},
        )
        return env

    async def _make(self, name: str, directory: Path, installer: Any, pinned: list[str], work: Path, build: _Build) -> None:
        """Install ``pinned`` as the environment ``name``: once, whoever else resolved to the same set."""
        making = self._making.get(name)
        if making is not None:
            await asyncio.shield(making)
            if (directory / _MARK).is_file():
                return
        done = self._making[name] = asyncio.get_running_loop().create_future()
        target = self.root / f".build-{name}-{os.getpid()}-{next(self._serial)}"
        try:
            await installer.install(pinned, target, work, self.config.package_index, self.config.install_timeout, build.progress)
            mark = {"requirements": build.info["requirements"], "packages": pinned, "python": _PYTHON,
                    "installer": installer.kind, "built": time.time()}
            (target / _MARK).write_text(json.dumps(mark, indent=1) + "\n")
            with contextlib.suppress(FileNotFoundError):
                shutil.rmtree(directory)  # a directory of that name without its mark: not one of ours whole
            target.rename(directory)
            self.built += 1
        finally:
            shutil.rmtree(target, ignore_errors=True)
            del self._making[name]
            done.set_result(None)

    def _record(self, declaration: str, name: str, requirements: list[str]) -> None:
        requests = self.root / "requests"
        requests.mkdir(mode=0o700, parents=True, exist_ok=True)
        record = requests / f"{declaration}.json"
        partial = record.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(json.dumps({"env": name, "requirements": requirements}) + "\n")
        partial.replace(record)

    def _private_dir(self, name: str) -> Path:
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = self.root / name
        path.mkdir(mode=0o700)
        return path

    def _sweep(self) -> None:
        """Remove what a daemon that died while building left (one daemon runs per user: none is ours)."""
        if self._swept:
            return
        self._swept = True
        with contextlib.suppress(OSError):
            for entry in os.scandir(self.root):
                if entry.name.startswith((".build-", ".work-")):
                    shutil.rmtree(entry.path, ignore_errors=True)

    def info(self) -> dict[str, Any]:
        """For status: the builds under way (what, how far, for which modules), and counts."""
        return {
            "dir": str(self.root), "installer": self.config.installer, "built": self.built, "failed": self.failed,
            "installing": [dict(build.info, modules=list(build.info["modules"])) for build in self._builds.values()],
        }


def _env_spec(directory: Path, requirements: list[str]) -> EnvSpec:
    return EnvSpec(kind="declared", name=str(directory), site=[str(directory)], requirements=list(requirements))


def _no_direct_references(path: str, metadata: ScriptMetadata) -> None:
    """A confined module's dependencies come from the package index only: a direct reference
    (``name @ https://…``) would have the daemon fetch from anywhere, for a tool without the network."""
    for dependency in metadata.dependencies:
        if "@" in dependency.split(";", 1)[0]:
            raise LoadFailure(
                path, metadata.line,
                f"{dependency!r} is a direct reference; a project trusted with --sandbox declares packages of the "
                f"index only (name and version: \"{dependency.split('@', 1)[0].strip()}\")",
            )
