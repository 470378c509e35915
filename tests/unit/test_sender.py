"""The worker's Sender: frames sent by two threads at once never interleave."""

from __future__ import annotations

import socket
import struct
import threading
import time

from atomictoolsd.workers.runtime.sender import Sender

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


def two_sends() -> list[tuple[bytes, int, int]]:
    """Send an 8 MiB frame of ``a`` on a thread and, once it waits for room (the peer reads nothing
    yet), a 1000-byte frame of ``b`` on another; then read both: (first byte, size, distinct bytes)
    of each."""
    ours, theirs = socket.socketpair()
    try:
        sender = Sender(ours)
        one = threading.Thread(target=sender.send, args=(frame(b"a", 8 << 20),))
        one.start()
        time.sleep(0.3)
        assert one.is_alive(), "the first send should still be waiting for room in the channel"
        two = threading.Thread(target=sender.send, args=(frame(b"b", 1000),))
        two.start()
        time.sleep(0.1)
        frames = read_frames(theirs, 2)
        one.join(5)
        two.join(5)
        return [(f[:1], len(f), len(set(f))) for f in frames]
    finally:
        ours.close()
        theirs.close()


def test_a_send_waits_out_another_threads_send_under_way() -> None:
    # A large result still going out when another thread (a pool thread, the output capture, the
    # reader after a hand-over) sends: the second frame must not be written into the first.
    assert two_sends() == [(b"a", 8 << 20, 1), (b"b", 1000, 1)]
