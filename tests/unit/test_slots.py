"""Worker slots: a slot that comes free goes to the projects in turn, a cancelled wait holds none,
idle workers are stopped for waiting spawns, and a stopping daemon fails every wait."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from atomictoolsd.config.settings import Config, max_workers_default
from atomictoolsd.pool.pool import PoolSettings
from atomictoolsd.pool.slots import WorkerSlots


def _run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


class _Idle:
    """Idle workers to stop for waiting spawns, as the pool's ``make_room`` gives them."""

    def __init__(self, count: int) -> None:
        self.left = [f"idle{n}" for n in range(count)]
        self.stopped: list[str] = []

    def __call__(self) -> str | None:
        if not self.left:
            return None
        self.stopped.append(self.left.pop(0))
        return self.stopped[-1]


def test_a_freed_slot_goes_to_the_projects_in_turn() -> None:
    async def scenario() -> list[str]:
        slots = WorkerSlots(1, _Idle(0))
        await slots.take("a")
        order: list[str] = []

        async def spawn(project: str, n: int) -> None:
            await slots.take(project)
            order.append(f"{project}{n}")

        tasks = [asyncio.create_task(spawn("a", n)) for n in range(3)]
        await asyncio.sleep(0)
        tasks += [asyncio.create_task(spawn("b", n)) for n in range(2)]
        await asyncio.sleep(0)
        for _ in range(5):
            slots.give_back()  # the worker holding the slot ended
            await asyncio.sleep(0)
        await asyncio.gather(*tasks)
        assert slots.used == 1 and not slots.waiting()
        return order

    assert _run(scenario()) == ["a0", "b0", "a1", "b1", "a2"]


def test_a_cancelled_wait_holds_no_slot() -> None:
    async def scenario() -> None:
        slots = WorkerSlots(1, _Idle(0))
        await slots.take("a")
        waiting = asyncio.create_task(slots.take("b"))
        await asyncio.sleep(0)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert not slots.waiting()
        # Handed the slot and cancelled in the same turn: it passes on, not lost.
        handed = asyncio.create_task(slots.take("b"))
        after = asyncio.create_task(slots.take("c"))
        await asyncio.sleep(0)
        slots.give_back()
        handed.cancel()
        with pytest.raises(asyncio.CancelledError):
            await handed
        await after
        assert slots.used == 1

    _run(scenario())


def test_idle_workers_are_stopped_for_waiting_spawns_and_looked_for_again() -> None:
    async def scenario() -> None:
        idle = _Idle(1)
        slots = WorkerSlots(2, idle)
        await slots.take("a")
        await slots.take("a")
        first = asyncio.create_task(slots.take("b"))
        second = asyncio.create_task(slots.take("b"))
        await asyncio.sleep(0)
        assert idle.stopped == ["idle0"], "one idle worker stopped, for the first waiting spawn"
        idle.left.append("idle1")  # a busy worker went idle meanwhile
        await asyncio.sleep(WorkerSlots.RETRY * 1.5)
        assert idle.stopped == ["idle0", "idle1"]
        slots.give_back("idle0")
        slots.give_back("idle1")
        await asyncio.gather(first, second)
        assert slots.used == 2

    _run(scenario())


def test_a_stopping_daemon_fails_every_wait_and_every_later_spawn() -> None:
    async def scenario() -> None:
        slots = WorkerSlots(1, _Idle(0))
        await slots.take("a")
        waiting = asyncio.create_task(slots.take("b"))
        await asyncio.sleep(0)
        slots.close("the daemon is stopping", RuntimeError)
        with pytest.raises(RuntimeError, match="stopping"):
            await waiting
        with pytest.raises(RuntimeError, match="stopping"):
            await slots.take("c")

    _run(scenario())


def test_more_room_lets_waiting_spawns_go() -> None:
    async def scenario() -> None:
        slots = WorkerSlots(1, _Idle(0))
        await slots.take("a")
        waiting = [asyncio.create_task(slots.take("b")) for _ in range(2)]
        await asyncio.sleep(0)
        slots.resize(3)
        await asyncio.gather(*waiting)
        assert slots.used == 3

    _run(scenario())


def test_max_workers_zero_is_sized_to_the_machine() -> None:
    assert PoolSettings.from_config(Config()).max_workers == max_workers_default() >= 16
    assert PoolSettings.from_config(Config(max_workers=5)).max_workers == 5
