"""Forget the projects no session uses any more, so a long-running daemon does not grow with every
directory an agent ever opened.

A daemon component. Each attachment holds its project (``Registry.acquire``/``release``); once no
session has held a project for ``idle_timeout`` seconds, the registry forgets it: its entry, its
own tools dir (and so that dir's file watch), the modules' cached definitions in memory, and their
workers, which finish the calls they are running and exit. The global and built-in tools stay.
A session that attaches to the project later gets it rebuilt, its listing from the definition
cache on disk, so no worker starts until a call.

``idle_timeout`` is the setting that already lets idle workers go: by the time a project is
forgotten its workers have usually gone too, and ``0`` keeps both for the daemon's life.

Knows nothing of sessions: the server acquires and releases; this only asks the registry.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Protocol

from atomictoolsd.util.periodic import Scheduler

if TYPE_CHECKING:
    from atomictoolsd.config.settings import Config
    from atomictoolsd.registry.projects import Registry

__all__ = ["ProjectReaper", "ReaperHost"]


class ReaperHost(Protocol):
    """What the reaper is started with (the server meets it; see ``server/wiring.py``)."""

    registry: Registry
    config: Config

log = logging.getLogger("atomictoolsd.registry")


class ProjectReaper:
    """Component: forgets projects nobody has held for ``idle_timeout`` seconds (0: never)."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.registry: Registry | None = None
        self.idle_timeout = 0.0
        self.forgotten = 0
        self._loop = scheduler.every("forgetting idle projects", self._forget, lambda: self.interval, logger=log)

    async def start(self, server: ReaperHost) -> None:
        self.registry = server.registry
        self.reconfigure(server.config)
        self._loop.start()

    def reconfigure(self, config: Any) -> None:
        """Apply ``idle_timeout`` (at start, and on SIGHUP: from the next look)."""
        self.idle_timeout = config.idle_timeout

    async def stop(self) -> None:
        await self._loop.stop()

    @property
    def interval(self) -> float:
        # Forgetting a project a little late costs nothing; looking costs a pass over the projects.
        return max(0.05, min(5.0, self.idle_timeout / 4)) if self.idle_timeout else 5.0

    async def _forget(self) -> None:
        assert self.registry is not None
        if self.idle_timeout:
            self.forgotten += len(await self.registry.forget_idle(self.idle_timeout))
