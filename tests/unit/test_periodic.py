"""The one timer-loop shape (``workers/periodic.py``): a failing tick is logged and the loop goes on,
the interval is read before each wait, ``while_`` ends the loop, and ``stop`` waits for the end."""

from __future__ import annotations

import asyncio
import logging

import pytest

from atomictoolsd.workers.periodic import Periodic


def test_a_failing_tick_is_logged_and_the_loop_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    ticks: list[int] = []

    def tick() -> None:
        ticks.append(len(ticks))
        if len(ticks) == 1:
            raise RuntimeError("one surprise")

    async def main() -> None:
        loop = Periodic("the test tick", tick, 0.001, immediately=True)
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
        loop = Periodic("ticks", tick, interval, while_=lambda: len(seen) < 3)
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
