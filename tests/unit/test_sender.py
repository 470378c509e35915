"""The worker's Sender: frames from a lock-free send by the reader and from locked sends of other
threads never interleave, also while lock-free sends are paused for a reading-role hand-over."""

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


def blocked_in_send(thread: threading.Thread) -> None:
    time.sleep(0.3)  # the peer reads nothing: a frame this size fills the channel and the send blocks
    assert thread.is_alive(), "the first send should still be waiting for room in the channel"


def test_a_paused_reader_waits_out_an_old_readers_lock_free_send() -> None:
    # The reading role moved on while the old reader was in its lock-free send of a large result
    # (a send that lingers is what makes the watchdog hand the role on). The new reader's send
    # must wait for it, not clear the old reader's flag and write into the middle of its frame.
    ours, theirs = socket.socketpair()
    try:
        sender = Sender(ours)
        old = threading.Thread(target=sender.send_inline, args=(frame(b"a", 8 << 20),))
        old.start()
        blocked_in_send(old)
        sender.pause_inline()  # the hand-over, before the new reader starts
        new = threading.Thread(target=sender.send_inline, args=(frame(b"b", 1000),))
        new.start()
        time.sleep(0.1)
        frames = read_frames(theirs, 2)
        old.join(5)
        new.join(5)
        sender.resume_inline()
        assert [(f[:1], len(f), len(set(f))) for f in frames] == [(b"a", 8 << 20, 1), (b"b", 1000, 1)]
    finally:
        ours.close()
        theirs.close()


def test_another_thread_waits_out_the_readers_lock_free_send() -> None:
    ours, theirs = socket.socketpair()
    try:
        sender = Sender(ours)
        reader = threading.Thread(target=sender.send_inline, args=(frame(b"a", 8 << 20),))
        reader.start()
        blocked_in_send(reader)
        other = threading.Thread(target=sender.send, args=(frame(b"b", 1000),))
        other.start()
        time.sleep(0.1)
        frames = read_frames(theirs, 2)
        reader.join(5)
        other.join(5)
        assert [(f[:1], len(f), len(set(f))) for f in frames] == [(b"a", 8 << 20, 1), (b"b", 1000, 1)]
    finally:
        ours.close()
        theirs.close()


def test_the_reader_takes_the_lock_while_another_thread_sends() -> None:
    ours, theirs = socket.socketpair()
    try:
        sender = Sender(ours)
        other = threading.Thread(target=sender.send, args=(frame(b"a", 8 << 20),))
        other.start()
        blocked_in_send(other)
        reader = threading.Thread(target=sender.send_inline, args=(frame(b"b", 1000),))
        reader.start()
        time.sleep(0.1)
        frames = read_frames(theirs, 2)
        other.join(5)
        reader.join(5)
        assert [(f[:1], len(f), len(set(f))) for f in frames] == [(b"a", 8 << 20, 1), (b"b", 1000, 1)]
    finally:
        ours.close()
        theirs.close()
