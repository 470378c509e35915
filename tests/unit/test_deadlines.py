"""The deadline sweep: a call whose answer at its timeout fails does not stop the others' timeouts
or the sweep itself."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from atomictoolsd.pool.pool import Deadlines
from atomictoolsd.util.periodic import Scheduler


class _Due:
    """What the sweep reads of a call, past its deadline; ``broken`` makes its answer fail."""

    def __init__(self, call_id: int, broken: bool) -> None:
        self.id = call_id
        self.tool = f"tool{call_id}"
        self.deadline = time.monotonic() - 1
        self.done = False
        self.worker = None
        self.broken = broken
        self.expired = 0

    def expire(self) -> None:
        self.expired += 1
        if self.broken:
            raise RuntimeError("the owner's bug")
        self.done = True


def test_a_failing_answer_does_not_stop_the_other_calls_timeouts_or_the_sweep() -> None:
    calls: list[Any] = [_Due(1, broken=True), _Due(2, broken=False)]

    async def run() -> None:
        deadlines = Deadlines(Scheduler(), lambda: calls)
        deadlines.start()
        await asyncio.sleep(Deadlines.TICK * 3.5)
        assert deadlines.ticking  # the broken call is still unanswered: the sweep goes on
        deadlines.close()

    asyncio.run(run())
    assert calls[1].done and calls[1].expired == 1
    assert calls[0].expired >= 2, "the sweep stopped at the first failure"
