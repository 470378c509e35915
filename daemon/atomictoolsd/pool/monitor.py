"""The worker monitor: stop workers that use too much memory, and workers that sit idle.

A daemon component. Twice a second (more often when ``idle_timeout`` is short) it looks at every
live worker:

- **memory**: a worker whose resident set passes ``memory_limit_mb`` is killed with its process
  group. The rlimit inside the worker (``limits``) already turns most over-allocation into a
  ``MemoryError`` the tool's caller reads; this watch catches memory the rlimit does not count
  (shared mappings, memory a native library maps itself). Calls in flight on the worker are answered
  with an error that names the limit, and the kill counts as a crash for the module's back-off.
- **idle**: a worker with no call for ``idle_timeout`` seconds is retired; the next call starts a
  fresh one (listing never needs it: the registry keeps the definitions). And no more than
  ``max_idle_workers`` idle workers are kept at once: past that, the least recently used retire.
  A first scan of many modules loads each in a worker to learn its tools; without the cap every one
  of them would wait out ``idle_timeout`` (1,000 modules: ~3.5 GB of workers for ten minutes).

Daemon side: uses psutil, never imported by workers. Reads ``/proc`` (or the OS's equivalent) once
per live worker per tick, and nothing at all while no worker runs.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Protocol

from atomictoolsd.util.periodic import Scheduler
from atomictoolsd.worker.limits import describe_limit

if TYPE_CHECKING:
    from atomictoolsd.config.settings import Config
    from atomictoolsd.pool.pool import WorkerPool
    from atomictoolsd.pool.worker import Worker

__all__ = ["MonitorHost", "WorkerMonitor"]

log = logging.getLogger("atomictoolsd.monitor")

_MIB = 1024 * 1024


class MonitorHost(Protocol):
    """What the monitor is started with (the server meets it; see ``server/wiring.py``)."""

    pool: WorkerPool
    config: Config


class WorkerMonitor:
    """Component: the memory watch and the idle reaper.

    Args:
        interval: seconds between two looks (default: 0.5, or a quarter of ``idle_timeout`` when shorter).
    """

    def __init__(self, scheduler: Scheduler, interval: float | None = None) -> None:
        self.interval = interval
        self.pool: WorkerPool | None = None
        self.memory_limit = 0
        self.idle_timeout = 0.0
        self.max_idle = 0
        self._loop = scheduler.every("the worker monitor", self.tick, lambda: self.interval or 0.5, while_=self._watching, logger=log)
        self._fixed_interval = False
        self._processes: dict[int, Any] = {}  # pid → psutil.Process, made once per worker
        self.killed = 0
        self.reaped = 0
        self.capped = 0

    async def start(self, server: MonitorHost) -> None:
        self.pool = server.pool
        self._fixed_interval = self.interval is not None
        self.reconfigure(server.config)

    def reconfigure(self, config: Any) -> None:
        """Apply ``memory_limit_mb``, ``idle_timeout`` and ``max_idle_workers`` (at start, and on SIGHUP)."""
        self.memory_limit = config.memory_limit_mb * _MIB
        self.idle_timeout = config.idle_timeout
        self.max_idle = config.max_idle_workers
        if not self._fixed_interval:
            self.interval = 0.5 if not self.idle_timeout else max(0.05, min(0.5, self.idle_timeout / 4))
        if self._watching():
            self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()

    def _watching(self) -> bool:
        return bool(self.memory_limit or self.idle_timeout or self.max_idle)

    def tick(self) -> None:
        """One look at every worker."""
        assert self.pool is not None
        now = time.monotonic()
        if self.max_idle:
            self._cap_idle()
        alive: set[int] = set()
        for runner in (*self.pool.runners.values(), *self.pool.discarded):
            if self.idle_timeout and runner.reap_idle(self.idle_timeout, now):
                self.reaped += 1
                log.info("stopped the idle worker of %s", runner.spec.path)
            if not self.memory_limit:
                continue
            workers = [runner.current, *runner.retiring] if runner.current is not None else list(runner.retiring)
            for worker in workers:
                if worker.state != "dead":
                    alive.add(worker.pid)
                    self._check_memory(worker)
        for pid in [p for p in self._processes if p not in alive]:
            del self._processes[pid]

    def _cap_idle(self) -> None:
        assert self.pool is not None
        idle = [(since, runner) for runner in self.pool.runners.values() if (since := runner.idle_since()) is not None]
        if len(idle) <= self.max_idle:
            return
        idle.sort(key=lambda pair: pair[0])
        excess = idle[: len(idle) - self.max_idle]
        for _since, runner in excess:
            runner.retire()
        self.capped += len(excess)
        log.info("stopped %d idle worker(s): more than max_idle_workers (%d) were idle", len(excess), self.max_idle)

    def _check_memory(self, worker: Worker) -> None:
        process = self._processes.get(worker.pid)
        try:
            if process is None:
                import psutil  # lazy: only once a worker runs: the daemon starts without it

                process = self._processes[worker.pid] = psutil.Process(worker.pid)
            rss = process.memory_info().rss
        except Exception:  # psutil.Error: the worker has just ended
            return
        if rss <= self.memory_limit:
            return
        worker.cause = f"was killed for using {rss / _MIB:.0f} MiB, over {describe_limit(self.memory_limit)}"
        log.warning("worker %d of %s %s", worker.pid, worker.runner.spec.path, worker.cause)
        self.killed += 1
        worker.kill()

    def info(self) -> dict[str, Any]:
        return {
            "interval": self.interval, "killedForMemory": self.killed, "reapedIdle": self.reaped,
            "stoppedOverMaxIdle": self.capped,
        }
