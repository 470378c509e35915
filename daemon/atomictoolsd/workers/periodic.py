"""The one shape of a timer loop in the daemon: run a tick every so often until stopped.

The monitor, the project reaper, the watcher's polling sweep, the spill housekeeping and the
socket-file guard all use it, so each has the same three properties: the interval is read anew
before every wait (a SIGHUP that changes it applies from the next wait), a tick that raises is
logged and the loop goes on (one surprise must not end a watch for the daemon's life), and
``stop`` cancels the loop and waits until it has ended.

Lives in the workers layer because that is the lowest daemon-side layer that runs timers (the
monitor); the registry and the server above use it from here. Never imported by a worker.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable

__all__ = ["Periodic"]

log = logging.getLogger("atomictoolsd")


class Periodic:
    """Call ``tick`` (a function or a coroutine function) every ``interval`` seconds.

    ``interval`` is a number or a function read before each wait. ``immediately`` runs the first
    tick before the first wait. ``while_`` is asked before each wait: once it says False the loop
    ends (``start`` begins it again). ``what`` names the tick in ``logger`` when it fails.
    """

    def __init__(
        self,
        what: str,
        tick: Callable[[], object] | Callable[[], Awaitable[object]],
        interval: float | Callable[[], float],
        *,
        immediately: bool = False,
        while_: Callable[[], bool] | None = None,
        logger: logging.Logger = log,
    ) -> None:
        self.what = what
        self._tick = tick
        self._interval = interval
        self._immediately = immediately
        self._while = while_
        self._log = logger
        self._task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        """Begin the loop (nothing if it already runs)."""
        if not self.running:
            self._task = asyncio.get_running_loop().create_task(self._run())

    def cancel(self) -> None:
        """End the loop without waiting (for a caller that cannot await)."""
        if self._task is not None:
            self._task.cancel()

    async def stop(self) -> None:
        """End the loop and wait until it has ended."""
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass

    async def _run(self) -> None:
        if self._immediately:
            await self._once()
        while self._while is None or self._while():
            interval = self._interval() if callable(self._interval) else self._interval
            await asyncio.sleep(interval)
            await self._once()

    async def _once(self) -> None:
        try:
            result = self._tick()
            if inspect.isawaitable(result):
                await result
        except Exception:  # a surprise in one tick must not end the loop
            self._log.exception("%s failed", self.what)
