"""The daemon's one loop for periodic work: a ``Scheduler`` runs every job registered with it
(``Periodic``) when it is due, from one task that sleeps until the earliest due time.

The monitor, the project reaper, the watcher's polling sweep, the look at the environments'
site-packages, the look at your git configuration, the spill housekeeping, the socket-file guard
and the sweep of calls past their deadline are all jobs of the daemon's one scheduler
(``server/wiring.py`` makes it), so a reader finds the daemon's periodic work in one place, and
each job has the same properties: the interval is read anew before every wait (a SIGHUP that changes
it applies from the next wait), ``while_`` is asked before every wait and ends the job when it says
False, a tick that raises is logged and the job goes on (one surprise must not end a watch for the
daemon's life), and ``stop`` ends the job and waits for a tick under way.

A tick that is a coroutine runs in a task of its own, so a slow one (a scan) holds up no other job;
its next wait begins when it is done. A plain function runs in the scheduler's loop.

Lives in ``util/``, below every daemon-side layer that runs timers: the pool (the monitor, the call
deadlines), the registry and the server. Never imported by a worker.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["Periodic", "Scheduler"]

log = logging.getLogger("atomictoolsd")


class Scheduler:
    """Runs its jobs when they are due, from one task (started when a job waits, ended when none does)."""

    def __init__(self) -> None:
        self._waiting: list[Periodic] = []  # jobs with a due time (a handful: a list is enough)
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._next: float | None = None  # the due time the loop sleeps until

    def every(
        self,
        what: str,
        tick: Callable[[], object] | Callable[[], Awaitable[object]],
        interval: float | Callable[[], float],
        *,
        immediately: bool = False,
        while_: Callable[[], bool] | None = None,
        logger: logging.Logger = log,
    ) -> Periodic:
        """A job that calls ``tick`` every ``interval`` seconds once started (see ``Periodic``)."""
        return Periodic(self, what, tick, interval, immediately=immediately, while_=while_, logger=logger)

    @property
    def jobs(self) -> list[str]:
        """What the jobs waiting for their time do (for tests and status)."""
        return sorted(job.what for job in self._waiting)

    def _due_at(self, job: Periodic, when: float) -> None:
        job.due = when
        if job not in self._waiting:
            self._waiting.append(job)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())
        elif self._wake is not None and (self._next is None or when < self._next):
            self._wake.set()

    def _drop(self, job: Periodic) -> None:
        if job in self._waiting:
            self._waiting.remove(job)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        wake = self._wake = asyncio.Event()
        while self._waiting:
            now = loop.time()
            for job in [job for job in self._waiting if job.due <= now]:
                self._waiting.remove(job)
                job.fire()
            if not self._waiting:
                break
            self._next = min(job.due for job in self._waiting)
            timer = loop.call_at(self._next, wake.set)
            try:
                await wake.wait()
            finally:
                timer.cancel()
                wake.clear()
                self._next = None


class Periodic:
    """Call ``tick`` (a function or a coroutine function) every ``interval`` seconds, from the
    ``scheduler``'s loop, between ``start`` and ``stop``.

    ``interval`` is a number or a function read before each wait. ``immediately`` runs the first
    tick before the first wait. ``while_`` is asked before each wait: once it says False the job
    ends (``start`` begins it again). ``what`` names the tick in ``logger`` when it fails.
    """

    def __init__(
        self,
        scheduler: Scheduler,
        what: str,
        tick: Callable[[], object] | Callable[[], Awaitable[object]],
        interval: float | Callable[[], float],
        *,
        immediately: bool = False,
        while_: Callable[[], bool] | None = None,
        logger: logging.Logger = log,
    ) -> None:
        self.what = what
        self.due = 0.0  # loop time of its next tick, while it waits for it
        self._scheduler = scheduler
        self._tick = tick
        self._interval = interval
        self._immediately = immediately
        self._while = while_
        self._log = logger
        self._active = False
        self._ticking: asyncio.Future[Any] | None = None  # a coroutine tick under way

    @property
    def running(self) -> bool:
        return self._active

    def start(self) -> None:
        """Begin the job (nothing if it already runs)."""
        if self._active:
            return
        self._active = True
        if self._immediately:
            self._scheduler._due_at(self, asyncio.get_running_loop().time())
        else:
            self._wait()

    def cancel(self) -> None:
        """End the job without waiting (for a caller that cannot await)."""
        self._active = False
        self._scheduler._drop(self)
        if self._ticking is not None:
            self._ticking.cancel()

    async def stop(self) -> None:
        """End the job and wait until a tick under way has ended."""
        ticking = self._ticking
        self.cancel()
        if ticking is not None:
            try:
                await ticking
            except (asyncio.CancelledError, Exception):
                pass

    def fire(self) -> None:
        """Run one tick (the scheduler calls this when it is due)."""
        try:
            result = self._tick()
        except Exception:  # a surprise in one tick must not end the job
            self._log.exception("%s failed", self.what)
            result = None
        if not inspect.isawaitable(result):
            self._wait()
            return
        self._ticking = asyncio.ensure_future(result)
        self._ticking.add_done_callback(self._ticked)

    def _ticked(self, task: asyncio.Future[Any]) -> None:
        if task is self._ticking:
            self._ticking = None
        if task.cancelled():
            return
        error = task.exception()
        if isinstance(error, Exception):
            self._log.error("%s failed", self.what, exc_info=error)
        self._wait()

    def _wait(self) -> None:
        """Before each wait: end the job if ``while_`` says so, else wait ``interval`` seconds."""
        if not self._active:
            return
        if self._while is not None and not self._while():
            self._active = False
            return
        interval = self._interval() if callable(self._interval) else self._interval
        self._scheduler._due_at(self, asyncio.get_running_loop().time() + interval)
