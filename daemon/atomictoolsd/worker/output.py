"""What a tool prints: captured in its worker, forwarded over the worker's channel, logged by the daemon.

In a worker, ``capture(send)`` points file descriptors 1 and 2 at two pipes that one thread reads, so
a tool's ``print()``, its warnings and tracebacks, and the output of programs it starts with the
descriptors they inherit, all arrive as ``["output", fd, data, dropped]`` messages. The daemon writes
each as a ``tool.output`` event of the worker's module (``Worker``). Nothing a tool prints can reach
a protocol stream or a file that grows without bound.

The bounds are kept here, in the worker, so that a flood costs neither the channel nor the daemon:
one message carries at most ``CHUNK_BYTES`` (the rest of what one read returned is counted as
dropped); on average at most ``RATE_BYTES`` a second are forwarded, in bursts of up to
``BURST_BYTES``; what is over is still read, so the tool never blocks on a full pipe, and counted.
``dropped`` is the number of bytes of that descriptor's output left out since its previous message,
this one's cut included; once a flood stops, a message with no data says how much it dropped.

Runs inside workers: standard library only.
"""

from __future__ import annotations

import os
import select
import sys
import threading
import time
from collections.abc import Callable

from atomictoolsd.protocol import Output

__all__ = ["BURST_BYTES", "CHUNK_BYTES", "RATE_BYTES", "capture"]

CHUNK_BYTES = 8192  # at most this much of one read is forwarded
RATE_BYTES = 8192  # forwarded per second, on average
BURST_BYTES = 65536  # forwarded at once after a quiet spell
_QUIET = 1.0  # seconds without output after which a flood's dropped count is reported


def capture(send: Callable[[Output], None]) -> None:
    """Send what is written to descriptors 1 and 2 from now on as ``output`` messages.

    ``send`` writes one message to the channel (under the lock every sender takes) and raises
    ``OSError`` once the channel is closed.
    """
    pipes: dict[int, int] = {}
    for fd in (1, 2):
        read_end, write_end = os.pipe()
        os.dup2(write_end, fd)  # inheritable: programs the tool starts write here too
        os.close(write_end)
        pipes[read_end] = fd
    for name, fd in (("stdout", 1), ("stderr", 2)):
        stream = getattr(sys, name, None)
        try:
            stream.reconfigure(line_buffering=True)  # type: ignore[union-attr]  # a line is logged when printed
        except (AttributeError, ValueError, OSError):
            setattr(sys, name, open(fd, "w", buffering=1, errors="backslashreplace", closefd=False))  # noqa: SIM115
    threading.Thread(target=_forward, args=(pipes, send), name="tool-output", daemon=True).start()


def _forward(pipes: dict[int, int], send: Callable[[Output], None]) -> None:
    dropped = dict.fromkeys(pipes.values(), 0)
    tokens = float(BURST_BYTES)
    last = time.monotonic()
    open_pipes = list(pipes)
    while open_pipes:
        readable, _, _ = select.select(open_pipes, [], [], _QUIET if any(dropped.values()) else None)
        now = time.monotonic()
        tokens = min(float(BURST_BYTES), tokens + (now - last) * RATE_BYTES)
        last = now
        if not readable:  # quiet again: say what the flood cost
            for fd, count in dropped.items():
                if count:
                    _send(send, Output(fd, b"", count))
                    dropped[fd] = 0
            continue
        for read_end in readable:
            fd = pipes[read_end]
            data = os.read(read_end, 65536)
            if not data:  # every writer closed it (cannot happen while this process holds fd 1 and 2)
                open_pipes.remove(read_end)
                os.close(read_end)
                continue
            if tokens < 1:
                dropped[fd] += len(data)
                continue
            kept = data[:CHUNK_BYTES]
            tokens -= len(kept)
            _send(send, Output(fd, kept, dropped[fd] + len(data) - len(kept)))
            dropped[fd] = 0


def _send(send: Callable[[Output], None], message: Output) -> None:
    try:
        send(message)
    except OSError:
        # The channel is closed: the worker is ending. Not through a flush of stdout, which could
        # wait for room in the pipe that only this thread empties.
        os._exit(0)
