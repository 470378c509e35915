"""The worker's Sender: frames from a lock-free send by the reader and from locked sends of other
threads never interleave, also while lock-free sends are paused for a reading-role hand-over."""

from __future__ import annotations

import socket
import struct
import threading
import time

from atomictoolsd.worker.sender import Sender

HEADER = struct.Struct(">I")


def frame(fill: bytes, size: int) -> bytes:
    return HEADER.pack(size) + fill * size


def read_frames(sock: socket.socket, count: int) -> list[bytes]:
    sock.settimeout(10)  # a cut frame announces a length that never comes
    data = b""
    frames = []
    while len(frames) < count:
        chunk = sock.recv(1 << 20)
        assert chunk, "the channel closed before every frame came"
        data += chunk
        while len(data) >= 4 and len(data) >= 4 + HEADER.unpack_from(data)[0]:
            size = HEADER.unpack_from(data)[0]
            frames.append(data[4 : 4 + size])
            data = data[4 + size :]
    return frames


def two_sends(first: str, second: str, pause: bool = False) -> list[tuple[bytes, int, int]]:
    """Send an 8 MiB frame of ``a`` with ``first`` on a thread and, once it waits for room (the peer
    reads nothing yet), a 1000-byte frame of ``b`` with ``second`` on another (after a hand-over's
    ``pause_inline`` when ``pause``); then read both: (first byte, size, distinct bytes) of each."""
    ours, theirs = socket.socketpair()
    try:
        sender = Sender(ours)
        one = threading.Thread(target=getattr(sender, first), args=(frame(b"a", 8 << 20),))
        one.start()
        time.sleep(0.3)
        assert one.is_alive(), "the first send should still be waiting for room in the channel"
        if pause:
            sender.pause_inline()  # the hand-over, before the new reader starts
        two = threading.Thread(target=getattr(sender, second), args=(frame(b"b", 1000),))
        two.start()
        time.sleep(0.1)
        frames = read_frames(theirs, 2)
        one.join(5)
        two.join(5)
        return [(f[:1], len(f), len(set(f))) for f in frames]
    finally:
        ours.close()
        theirs.close()


EACH_SEND_INTACT = [(b"a", 8 << 20, 1), (b"b", 1000, 1)]


def test_a_paused_reader_waits_out_an_old_readers_lock_free_send() -> None:
    # The reading role moved on while the old reader was in its lock-free send of a large result
    # (a send that lingers is what makes the watchdog hand the role on). The new reader's send
    # must wait for it, not clear the old reader's flag and write into the middle of its frame.
    assert two_sends("send_inline", "send_inline", pause=True) == EACH_SEND_INTACT


def test_another_thread_waits_out_the_readers_lock_free_send() -> None:
    assert two_sends("send_inline", "send") == EACH_SEND_INTACT


def test_the_reader_takes_the_lock_while_another_thread_sends() -> None:
    assert two_sends("send", "send_inline") == EACH_SEND_INTACT
