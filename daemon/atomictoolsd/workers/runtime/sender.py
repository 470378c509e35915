"""The worker's sending side of its channel: whole frames, never interleaved, whichever thread sends.

Any thread of a worker may send: the reader the results of the calls it runs inline (nearly every
call), pool threads theirs, the event loop thread an async tool's, and any thread of a tool what it
prints (``output.capture``) or asks. A frame is written with ``sendall``, which may take several
writes, so each send holds a lock: two senders at once never overlap.
"""

from __future__ import annotations

import os
import socket
import sys
import threading

__all__ = ["Sender", "exit_worker"]


def exit_worker() -> None:
    """End the worker now. Threads may be stuck inside a tool: leave without joining them."""
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(0)


class Sender:
    """Sends frames on the worker's channel ``sock``, one at a time."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._lock = threading.Lock()

    def send(self, frame: bytes) -> None:
        """Send ``frame`` (any thread).

        Raises:
            OSError: the channel is closed (the daemon is gone); the caller ends the worker, as it
                can (the output-capture thread must not flush the stdout only it empties).
        """
        with self._lock:
            self.sock.sendall(frame)
