"""Crash-loop back-off for one tool module: count its workers' crashes, and say when to try again.

A worker that dies on its own (a crash, a tool calling ``os._exit``, a kill for memory) is a crash;
a worker the daemon retires (reload, idle, a call that would not stop) is not. Below ``THRESHOLD``
crashes in a row the next call simply gets a fresh worker. From there on the module is *failing*:
calls are answered at once with the last error until the back-off delay (0.5 s, doubling, at most
30 s) has passed, then one worker is tried again. Any call answered by a worker, or a reload of the
module, ends the streak.

Daemon side; knows nothing of workers beyond the error text it is given.
"""

from __future__ import annotations

import time

__all__ = ["CrashBackoff"]


class CrashBackoff:
    """Consecutive crashes of one module's workers, and when the next worker may start."""

    THRESHOLD = 3  # crashes in a row before the module counts as failing
    BASE = 0.5  # seconds of back-off after the THRESHOLD-th crash; doubles with each further one
    CAP = 30.0

    __slots__ = ("crashes", "last_error", "until")

    def __init__(self) -> None:
        self.crashes = 0
        self.last_error: str | None = None
        self.until = 0.0  # time.monotonic() before which no worker starts

    @property
    def failing(self) -> bool:
        return self.crashes >= self.THRESHOLD

    def crashed(self, error: str) -> None:
        """Count one more crash in a row."""
        self.crashes += 1
        self.last_error = error
        if self.failing:
            self.until = time.monotonic() + min(self.CAP, self.BASE * 2 ** (self.crashes - self.THRESHOLD))

    def remaining(self) -> float:
        """Seconds until a worker may start again (0 when it may start now)."""
        if not self.until:
            return 0.0
        left = self.until - time.monotonic()
        return left if left > 0 else 0.0

    def reset(self) -> bool:
        """End the streak; True when the module was failing."""
        was = self.failing
        self.crashes = 0
        self.until = 0.0
        return was

    def describe(self) -> str:
        """What a caller reads while the module is failing."""
        return f"its module keeps crashing ({self.crashes} times in a row; last: {self.last_error})"
