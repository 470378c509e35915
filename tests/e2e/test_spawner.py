"""The spawner when many workers are asked for at once: a scan of a thousand modules sends a thousand
requests to the fork server in one go, more than its socket's queue holds. Each must wait for room
and succeed, never fail with "Resource temporarily unavailable" (found by bench/scale.py)."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import psutil

from atomictoolsd.workers.pool import PoolSettings
from atomictoolsd.workers.spawner import Spawner

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
