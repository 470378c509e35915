"""Reload the modules whose environment changed under them: a package installed, upgraded or removed
in a site-packages dir they import from (``pip install`` or ``uv pip install`` into the daemon's own
environment or a project's), with no touch of their files.

A daemon component. A worker reports, with its load, the site-packages dirs its module imported
from: each with its mtime, and the top-level entry of each package it imported there (``yaml/``,
``six.py``) with its inode and mtime (``protocol.SiteDir``, ``ModuleRunner.site``); a worker whose
module failed reports every site dir on its path. Every ``INTERVAL`` seconds each such dir is
looked at (one ``stat``: an installer adds, removes or renames entries at its top level, which
changes the dir's mtime). Once a dir differs from what a module's worker saw and has stayed the
same since the last look (the install is over), the module is reloaded when an entry it imported
changed (another inode or mtime, or gone) or when it had failed (what was installed may be what
it lacked); the others are left alone.

Polling, not a watch: a few ``stat`` calls a second, nothing to set up per dir, any file system.
The environments the daemon builds for declared dependencies never change, and are not looked at.

Knows nothing of sessions: it asks the registry to load the modules again, which tells its listeners.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Protocol

from atomictoolsd.protocol import SiteDir, read_site
from atomictoolsd.util.periodic import Scheduler

if TYPE_CHECKING:
    from atomictoolsd.registry.model import Module, ToolsDir
    from atomictoolsd.registry.projects import Registry

__all__ = ["SiteWatchHost", "SiteWatcher"]

log = logging.getLogger("atomictoolsd.registry")


class SiteWatchHost(Protocol):
    """What the watcher is started with (the server meets it; see ``server/wiring.py``)."""

    registry: Registry


def _mtime(path: str) -> int | None:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


def _changed(entry: tuple[str, int, int]) -> bool:
    path, inode, mtime = entry
    try:
        info = os.stat(path)
    except OSError:
        return True
    return (info.st_ino, info.st_mtime_ns) != (inode, mtime)


def _site(module: Module) -> list[SiteDir]:
    """The site dirs ``module`` imported from: its last worker's report, else a cached failure's."""
    if module.runner.site:
        return module.runner.site
    if module.state == "failed" and module.error is not None:
        return read_site(module.error.get("site"))
    return []


class SiteWatcher:
    """Component: reloads a module when a package it imports is installed, upgraded or removed."""

    INTERVAL = 1.0

    def __init__(self, scheduler: Scheduler) -> None:
        self.registry: Registry | None = None
        self.reloaded = 0
        self._seen: dict[str, int | None] = {}  # each dir's mtime at the last look
        self._loop = scheduler.every("looking at the environments' site-packages", self._look, self.INTERVAL, logger=log)

    async def start(self, server: SiteWatchHost) -> None:
        self.registry = server.registry
        self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()

    async def _look(self) -> None:
        assert self.registry is not None
        now: dict[str, int | None] = {}
        due: dict[ToolsDir, dict[str, str]] = {}
        for tools_dir in list(self.registry.dirs.values()):
            for module in list(tools_dir.modules.values()):
                why = self._why_reload(module, now)
                if why is not None:
                    due.setdefault(tools_dir, {})[module.path] = why
        self._seen = now
        for tools_dir, modules in due.items():
            for path, directory in modules.items():
                log.info(
                    "reloading %s: what it imports from %s changed", path, directory,
                    extra={"event": "module.site_changed", "data": {"path": path, "site": directory}},
                )
            self.reloaded += len(modules)
            await self.registry.scan(tools_dir, only=set(modules), force=True)

    def _why_reload(self, module: Module, now: dict[str, int | None]) -> str | None:
        """The site dir whose change reloads ``module`` now, or None."""
        site = _site(module)
        for index, (directory, seen, entries) in enumerate(site):
            if directory not in now:
                now[directory] = _mtime(directory)
            mtime = now[directory]
            if mtime == seen or mtime != self._seen.get(directory, mtime):
                continue  # unchanged for it, or still changing (or first looked at): the next look decides
            if module.state == "failed" or any(_changed(entry) for entry in entries):
                return directory
            if module.runner.site is site:  # nothing of its own changed: no need to look again
                site[index] = (directory, mtime if mtime is not None else seen, entries)
        return None

    def info(self) -> dict[str, object]:
        return {"dirs": len(self._seen), "reloaded": self.reloaded}
