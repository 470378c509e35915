"""The daemon's one loop for periodic work (``util/periodic.py``): a failing tick is logged and the
job goes on, the interval is read before each wait, ``while_`` ends the job, ``stop`` waits for the
end, and one slow job holds up no other."""

from __future__ import annotations

import asyncio
import logging

import pytest

from atomictoolsd.util.periodic import Scheduler


def test_a_failing_tick_is_logged_and_the_loop_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    ticks: list[int] = []

    def tick() -> None:
        ticks.append(len(ticks))
        if len(ticks) == 1:
            raise RuntimeError("one surprise")

    async def main() -> None:
        loop = Scheduler().every("the test tick", tick, 0.001, immediately=True)
        loop.start()
        while len(ticks) < 3:
            await asyncio.sleep(0.001)
        await loop.stop()
        assert not loop.running

    with caplog.at_level(logging.ERROR):
        asyncio.run(main())
    assert "the test tick failed" in caplog.text and "one surprise" in caplog.text


def test_interval_is_read_anew_and_while_ends_the_loop() -> None:
    intervals: list[float] = []
    seen: list[str] = []

    def interval() -> float:
        intervals.append(0.001)
        return 0.001

    async def tick() -> None:
        seen.append("tick")

    async def main() -> None:
        loop = Scheduler().every("ticks", tick, interval, while_=lambda: len(seen) < 3)
        loop.start()
        for _ in range(1000):
            if not loop.running:
                break
            await asyncio.sleep(0.001)
        assert not loop.running
        await loop.stop()  # stopping an ended loop is harmless

    asyncio.run(main())
    assert seen == ["tick"] * 3
    assert len(intervals) == 3


def test_the_jobs_of_one_scheduler_run_from_one_loop_and_a_slow_tick_holds_up_no_other() -> None:
    """Two jobs at their own intervals: a coroutine tick that takes far longer than the other job's
    interval runs in a task of its own, and the fast job keeps its pace meanwhile; stopped, the
    slow job's tick under way ends, and with no job waiting the scheduler's loop ends."""
    fast: list[float] = []
    scheduler = Scheduler()

    async def main() -> None:
        started = asyncio.Event()

        async def slow() -> None:
            started.set()
            await asyncio.sleep(10)

        quick = scheduler.every("quick", lambda: fast.append(asyncio.get_running_loop().time()), 0.01)
        long = scheduler.every("long", slow, 0.001)
        quick.start()
        long.start()
        await started.wait()
        during = len(fast)
        await asyncio.sleep(0.2)
        assert len(fast) - during >= 5, "the quick job kept its pace while the slow tick ran"
        assert scheduler.jobs == ["quick"], "the slow job waits for its tick, not for its time"
        await long.stop()
        await quick.stop()
        assert not long.running and not quick.running and scheduler.jobs == []
        await asyncio.sleep(0.02)
        assert scheduler._task is not None and scheduler._task.done(), "no job waits: the loop has ended"

    asyncio.run(main())
