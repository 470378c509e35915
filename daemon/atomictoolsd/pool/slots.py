"""How many workers run at once: ``max_workers`` slots, and the spawns waiting for one, by project.

Every worker holds a slot from before its spawn until its end has been handled (its process gone),
whether it loads, serves, idles or retires; a spawn that finds none free waits. A slot that comes
free goes to the project whose turn it is, round robin, and within a project to its oldest waiting
spawn: a project scanning hundreds of modules takes one slot in turn with every other project
that waits, never all of them.

While spawns wait, workers that serve no one make room, one for each waiting spawn (``make_room``),
at once and again every ``RETRY`` seconds while spawns wait (a worker that was busy may have gone
idle meanwhile): first a generation a scan has loaded and not installed yet (a scan installs its
modules together, when all have loaded: were the loaded ones to keep their slots, the rest could
wait for them for ever), then the idle worker unused the longest. Either costs nothing to stop: the
module's definitions are kept, and its next call starts a worker.

Daemon side; knows a worker only as what ``make_room`` returned, to tell when that one has ended.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any

__all__ = ["WorkerSlots"]


class WorkerSlots:
    """The slots of ``limit`` workers, and the spawns that wait for one.

    Args:
        make_room: stops a worker that serves no one and returns it; None when there is none.
    """

    RETRY = 0.25  # seconds between two looks for an idle worker to stop while spawns wait

    def __init__(self, limit: int, make_room: Callable[[], Any]) -> None:
        self.limit = limit
        self.used = 0
        self._make_room = make_room
        self._waiting: dict[str, deque[asyncio.Future[None]]] = {}  # by project; the dict's order is the turn
        self._freeing: set[Any] = set()  # idle workers retired for waiting spawns, not ended yet
        self._retry: asyncio.TimerHandle | None = None
        self._closed: Exception | None = None  # what every spawn gets once the daemon stops
        self.waited = 0  # spawns that had to wait, since the start

    def waiting(self) -> int:
        return sum(len(queue) for queue in self._waiting.values())

    async def take(self, project: str) -> None:
        """Wait for a slot for a worker of ``project``; the caller gives it back (``give_back``)
        when that worker has ended, or its spawn failed.

        Raises:
            Exception: the one ``close`` was given: the daemon is stopping.
            asyncio.CancelledError: the wait was cancelled; no slot is held.
        """
        if self._closed is not None:
            raise self._closed
        if self.used < self.limit and not self._waiting:
            self.used += 1
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(project, deque()).append(future)
        self.waited += 1
        self._free_some()
        try:
            await future
        except BaseException:
            if future.done() and not future.cancelled() and future.exception() is None:
                self.give_back()  # handed a slot as it was cancelled: the next one gets it
            else:
                self._forget(project, future)
            raise

    def give_back(self, worker: Any = None) -> None:
        """A worker has ended (``worker``, when it had a slot), or a spawn failed: its slot goes to
        the next waiting spawn in turn."""
        self._freeing.discard(worker)
        while self._waiting:
            project, queue = next(iter(self._waiting.items()))
            future = queue.popleft()
            del self._waiting[project]
            if queue:
                self._waiting[project] = queue  # to the back of the turn
            if not future.done():
                future.set_result(None)  # the slot passes on, still counted
                return
        self.used -= 1

    def resize(self, limit: int) -> None:
        """A new ``max_workers``: more room lets waiting spawns go at once; less waits for workers to end."""
        self.limit = limit
        while self._waiting and self.used < self.limit:
            self.used += 1
            self.give_back()

    def close(self, why: str, error: type[Exception]) -> None:
        """Fail every waiting spawn, and every later one, with ``error(why)`` (the daemon is stopping)."""
        self._closed = error(why)
        waiting, self._waiting = self._waiting, {}
        for queue in waiting.values():
            for future in queue:
                if not future.done():
                    future.set_exception(error(why))
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None

    def info(self) -> dict[str, Any]:
        return {"running": self.used, "max": self.limit, "waiting": self.waiting(), "waited": self.waited}

    def _forget(self, project: str, future: asyncio.Future[None]) -> None:
        queue = self._waiting.get(project)
        if queue is not None and future in queue:
            queue.remove(future)
            if not queue:
                del self._waiting[project]

    def _look_again(self) -> None:
        self._retry = None
        self._free_some()

    def _free_some(self) -> None:
        """Retire idle workers until one is on its way out for each waiting spawn; look again soon
        while that falls short."""
        wanted = self.waiting()
        while len(self._freeing) < wanted:
            worker = self._make_room()
            if worker is None:
                break
            self._freeing.add(worker)
        if self._waiting and len(self._freeing) < wanted and self._retry is None:
            self._retry = asyncio.get_running_loop().call_later(self.RETRY, self._look_again)
