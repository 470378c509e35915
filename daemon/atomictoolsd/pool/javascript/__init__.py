"""TypeScript and JavaScript tool modules, daemon side: which runtime runs them (``runtimes``), the
support packages they may import (``packages``), and what their workers report made servable
(``definitions``). The worker side is ``worker/jsexec.py`` and ``worker/js/``.

``JavaScript`` is the daemon component that ties them together: the pool asks it, as it starts the
worker of such a module, for the runtime to put in the worker's spec (``worker_spec``). The first
time a module needs the support packages and the daemon's own are not installed, it installs them
in the background, logging each line the package manager prints, and loads again the modules that
failed meanwhile; ``atomic/status`` shows the runtime and the packages (``info``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from atomictoolsd.pool.javascript.packages import Packages, PackagesInstallError
from atomictoolsd.pool.javascript.runtimes import find_runtime
from atomictoolsd.protocol import JsRuntime, WorkerSpec
from atomictoolsd.worker.jsexec import JS_DIR

if TYPE_CHECKING:
    from atomictoolsd.config.settings import Config

__all__ = ["JavaScript", "JavaScriptHost"]

log = logging.getLogger("atomictoolsd.javascript")


class JavaScriptHost(Protocol):
    """What the component is started with (the server meets it; see ``server/wiring.py``)."""

    registry: Any  # registry.projects.Registry: its dirs, and scan() (a layer up: not imported)
    config: Config


class JavaScript:
    """Component: the runtime and the support packages of TypeScript and JavaScript modules."""

    def __init__(self, cache_dir: Path, home: Path, config: Config) -> None:
        self.cache_dir = cache_dir
        self.home = home
        self.config = config
        self.host: JavaScriptHost | None = None
        self.packages = Packages(cache_dir, config.js_packages)
        self._runtime: tuple[tuple[str, str], JsRuntime] | None = None
        self._install: asyncio.Future[None] | None = None
        self.installs = 0

    async def start(self, host: JavaScriptHost) -> None:
        self.host = host

    async def stop(self) -> None:
        if self._install is not None and not self._install.done():
            self._install.cancel()

    def reconfigure(self, config: Config) -> None:
        if (config.js_runtime, config.js_packages) != (self.config.js_runtime, self.config.js_packages):
            self.packages = Packages(self.cache_dir, config.js_packages)
            self._runtime = None
        self.config = config

    def runtime(self) -> JsRuntime:
        """The runtime new workers run on, with where the support packages are (found once per
        setting, and again once the packages are installed)."""
        if self.host is not None and self.host.config is not self.config:
            self.reconfigure(self.host.config)
        key = (self.config.js_runtime, self.packages.path())
        if self._runtime is None or self._runtime[0] != key:
            runtime = find_runtime(self.config.js_runtime, self.home, key[1])
            self._runtime = (key, runtime)
            if runtime.problem:
                log.warning("%s", runtime.problem, extra={"event": "javascript.runtime", "data": {"problem": runtime.problem}})
            else:
                log.info(
                    "TypeScript and JavaScript tools run on %s %s (%s)", runtime.name, runtime.version, runtime.command[0],
                    extra={"event": "javascript.runtime", "data": {"name": runtime.name, "version": runtime.version,
                                                                   "path": runtime.command[0]}},
                )
        runtime = self._runtime[1]
        if not key[1] and not runtime.problem:
            self._install_once(runtime)
        return runtime

    def worker_spec(self, spec: WorkerSpec) -> WorkerSpec:
        """``spec`` (a TypeScript or JavaScript module's) with the runtime its worker starts, and, for
        a confined worker, a policy that also reads the runtime's files and the support packages."""
        runtime = self.runtime()
        sandbox = spec.sandbox
        if sandbox is not None:
            sandbox = {**sandbox, "read": sorted({*sandbox.get("read", ()), *runtime.read, JS_DIR})}
        return msgspec.structs.replace(spec, javascript=runtime, sandbox=sandbox)

    # -- the support packages ---------------------------------------------------------------------

    def _install_once(self, runtime: JsRuntime) -> None:
        """Install the daemon's own support packages in the background, once per daemon (after a
        failure, ``atomictoolsd js install`` tries again)."""
        if self._install is not None or not self.packages.own:
            return
        self._install = asyncio.get_running_loop().create_task(self._install_in_background(runtime))

    async def _install_in_background(self, runtime: JsRuntime) -> None:
        loop = asyncio.get_running_loop()
        started = time.monotonic()
        where = str(self.packages.directory)
        log.info("installing the JavaScript support packages into %s", where,
                 extra={"event": "javascript.install", "data": {"dir": where, "state": "started"}})

        def line(text: str) -> None:
            log.info("install: %s", text, extra={"event": "javascript.install", "data": {"dir": where, "line": text}})

        try:
            await loop.run_in_executor(None, self.packages.install, runtime, line)
        except PackagesInstallError as exc:
            log.warning("the JavaScript support packages were not installed: %s", exc,
                        extra={"event": "javascript.install", "data": {"dir": where, "state": "failed", "error": str(exc)}})
            return
        self.installs += 1
        seconds = time.monotonic() - started
        log.info("installed the JavaScript support packages into %s in %.1f s", where, seconds,
                 extra={"event": "javascript.install", "data": {"dir": where, "state": "installed", "seconds": round(seconds, 1)}})
        await self.retry_failed()

    async def retry_failed(self) -> None:
        """Load again every TypeScript or JavaScript module that failed (the packages came)."""
        if self.host is None:
            return
        registry = self.host.registry
        dirs = [d for d in list(registry.dirs.values())
                if any(m.kind == "javascript" and m.state == "failed" for m in d.modules.values())]
        for tools_dir in dirs:
            await registry.scan(tools_dir, retry_failed=True)

    def info(self) -> dict[str, Any]:
        """For status, one line a key: the runtime (as found last; looked for now if never), the
        setting, and the support packages (where, whether there, their versions, what went wrong)."""
        runtime = self._runtime[1] if self._runtime is not None else find_runtime(self.config.js_runtime, self.home, self.packages.path())
        packages = self.packages.info()
        versions = ", ".join(f"{name} {version}" for name, version in packages["versions"].items() if version)
        return {
            "runtime": f"{runtime.name} {runtime.version} ({runtime.command[0]})" if not runtime.problem else None,
            "runtimeProblem": runtime.problem or None,
            "setting": self.config.js_runtime,
            "packages": packages["state"] + (f": {versions}" if versions else ""),
            "packagesDir": packages["dir"] + ("" if packages["own"] else " (js_packages)"),
            "installError": packages["error"],
            "installLog": packages.get("log", []),
        }
