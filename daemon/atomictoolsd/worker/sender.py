"""The worker's sending side of its channel: whole frames, never interleaved, whichever thread sends.

Any thread of a worker may send: the reader the results of the calls it runs inline (nearly every
call), pool threads theirs, the event loop thread an async tool's, and any thread of a tool what it
prints (``output.capture``) or asks. A frame is written with ``sendall``, which may take several
writes, so two senders at once must not overlap.

``send`` takes a lock. ``send_inline``, for the reader's own results, takes none while no other
thread is sending, because pinned to one core with the daemon and its client the lock measured
~0.6 µs a call (with the runtime's other lock-free steps, 5 % of the call: ``Runtime``). The two
meet as in Peterson's algorithm: the reader raises ``_inline`` and then looks at ``_others``;
another sender raises ``_others`` (under the lock) and then waits while ``_inline`` is up. Every
step is a single attribute read or write made while holding the GIL, so both threads see them in
one order, and at least one of the two sees the other's flag: either the reader takes the locked
way, or the other sender waits until the reader's frame is out.

That argument holds for one thread in ``send_inline`` at a time. Only a reader calls it, and when
the reading role moves to a new thread while the old one still runs a call, ``Runtime`` pauses it
(``pause_inline``) until the old reader has ended: meanwhile the new reader sends with the lock
without touching the flag, and so waits out an old reader already inside its lock-free send.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time

__all__ = ["Sender", "exit_worker"]


def exit_worker() -> None:
    """End the worker now. Threads may be stuck inside a tool: leave without joining them."""
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(0)


class Sender:
    """Sends frames on the worker's channel ``sock``; exits the worker when the daemon is gone."""

    WAIT = 0.00005  # seconds between looks while the reader's frame goes out

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._lock = threading.Lock()
        self._others = 0  # senders in send(), counted under the lock
        self._inline = False  # the reader is in send_inline() without the lock
        self._paused = 0  # readers whose role moved on, still running: send_inline takes the lock

    def send(self, frame: bytes) -> None:
        """Send ``frame`` (any thread).

        Raises:
            OSError: the channel is closed (the daemon is gone); the caller ends the worker, as it
                can (the output-capture thread must not flush the stdout only it empties).
        """
        with self._lock:
            self._others += 1
            try:
                while self._inline:
                    time.sleep(self.WAIT)
                self.sock.sendall(frame)
            finally:
                self._others -= 1

    def send_inline(self, frame: bytes) -> None:
        """Send ``frame`` from the one thread allowed to (the reader): without the lock unless
        another thread is sending, or lock-free sends are paused. Exits the worker when the
        daemon is gone."""
        try:
            if self._paused:  # first: while paused, an old reader may be in its lock-free send
                self.send(frame)
                return
            self._inline = True
            if self._others:
                self._inline = False
                self.send(frame)
                return
            try:
                self.sock.sendall(frame)
            finally:
                self._inline = False
        except OSError:
            exit_worker()  # the daemon is gone

    # Called with the runtime's lock held (Runtime._watch, Runtime.run), which orders them.

    def pause_inline(self) -> None:
        """The reading role moved on while its old reader still runs: no lock-free sends until it
        ends (``resume_inline``). Called before the new reader starts."""
        self._paused += 1

    def resume_inline(self) -> None:
        """An old reader ended (after its last send)."""
        self._paused -= 1
