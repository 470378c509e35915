"""The spawner when many workers are asked for at once: a scan of a thousand modules sends a thousand
requests to the fork server in one go, more than its socket's queue holds. Each must wait for room
and succeed, never fail with "Resource temporarily unavailable" (found by bench/scale.py). And when
its fork server answers with garbage: it is replaced at once, and the spawn served by a new one."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from atomictoolsd.pool.pool import PoolSettings
from atomictoolsd.pool.spawner import EarlyForkServer, Spawner

MODULE = "def tiny() -> str:\n    return 'tiny'\n"


def test_spawns_beyond_the_fork_servers_queue_wait_for_room(tmp_path: Path) -> None:
    module = tmp_path / "tiny.py"
    module.write_text(MODULE)
    spec = PoolSettings.from_config(spill_dir=str(tmp_path / "spill")).worker_spec(str(module), "python", str(tmp_path))
    count = 60

    async def scenario() -> tuple[list[int], list[int]]:
        spawner = Spawner()
        pid, first = await spawner.spawn(spec)  # starts the fork server
        first.close()
        assert spawner._server is not None
        control = spawner._server.control
        # A queue that holds a few requests, as a full one would: the rest must wait for room.
        control.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        channels: list[socket.socket] = []
        try:
            results = await asyncio.gather(*(spawner.spawn(spec) for _ in range(count)), return_exceptions=True)
            failures = [r for r in results if isinstance(r, BaseException)]
            assert not failures, f"{len(failures)} of {count} spawns failed, e.g. {failures[0]!r}"
            pids = [p for p, _ in results]  # type: ignore[misc]
            channels = [c for _, c in results]  # type: ignore[misc]
            alive = [p for p in pids if psutil.pid_exists(p)]
            for channel in channels:
                channel.close()  # each worker exits on end-of-file
            await asyncio.gather(*(spawner.exit_status(p) for p in [pid, *pids]))
            return pids, alive
        finally:
            for channel in channels:
                channel.close()
            await spawner.close()

    pids, alive = asyncio.run(scenario())
    print(f"{len(pids)} workers asked for at once through a 4 KB queue: all started ({len(alive)} seen alive)")
    assert len(set(pids)) == count


# A fork server that answers a spawn with what is not its message: bytes that are not msgpack, a
# message of its own invention, one without a pid, or a pid whose group or session would reach init
# or every process the daemon may signal.
HOSTILE_REPLIES = {
    "not msgpack": "b'\\xc1'",
    "an unknown message": "encode(['forked', request_id, 4242])",
    "a spawn without its pid": "encode(['spawned', request_id])",
    "init's pid": "encode(['spawned', request_id, 1])",
    "the pid of every process": "encode(['spawned', request_id, -1])",
}
HOSTILE = """
import socket, sys, time
from msgspec.msgpack import decode, encode
control = socket.socket(fileno=int(sys.argv[1]))
control.send(encode(["ready"]))
data, fds, _, _ = socket.recv_fds(control, 1 << 16, 2)
request_id = decode(data)[1]
control.send(eval(sys.argv[2]))
time.sleep(60)
"""


@pytest.mark.parametrize("reply", list(HOSTILE_REPLIES))
def test_a_fork_server_that_sends_garbage_is_replaced(tmp_path: Path, reply: str) -> None:
    module = tmp_path / "tiny.py"
    module.write_text(MODULE)
    spec = PoolSettings.from_config(spill_dir=str(tmp_path / "spill")).worker_spec(str(module), "python", str(tmp_path))

    async def scenario() -> tuple[Spawner, int, int]:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        alive_r, alive_w = os.pipe()
        hostile = subprocess.Popen(
            [sys.executable, "-c", HOSTILE, str(theirs.fileno()), HOSTILE_REPLIES[reply]],
            pass_fds=(theirs.fileno(), alive_w), stdin=subprocess.PIPE, cwd=tmp_path,
        )
        theirs.close()
        os.close(alive_w)
        ours.setblocking(False)
        # Told to wait long for an answer: only the garbage itself can get the fork server replaced in time.
        spawner = Spawner(answer_timeout=60, first=EarlyForkServer(hostile, ours, alive_r))  # type: ignore[arg-type]
        try:
            pid, channel = await asyncio.wait_for(spawner.spawn(spec), 15)
            channel.close()
            await spawner.exit_status(pid)
            return spawner, hostile.pid, pid
        finally:
            await spawner.close()
            if hostile.poll() is None:
                hostile.kill()
                hostile.wait()

    spawner, hostile_pid, pid = asyncio.run(scenario())
    assert pid != hostile_pid and pid > 1, "the spawn was served by a new fork server"
    assert spawner.replaced == 1
    assert spawner.last_problem is not None
    assert spawner.last_problem.startswith(f"the fork server (pid {hostile_pid}) sent what is not a fork server's message ")
