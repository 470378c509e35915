"""Workers at once are bounded (``max_workers``), and the spawns that wait take turns by project.

A project of many modules loads each in a worker to learn its tools. What holds: no more workers
run at once than ``max_workers``, every module still loads, idle workers stop to make room, and
another project's first call does not wait behind the whole scan.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import psutil

from helpers import Daemon, Env, RawConnection, wait_for

# Each module takes a while to import, so that the loads of a scan overlap.
SLOW_IMPORT = '''
    import time
    time.sleep({seconds})

    def {name}() -> str:
        return "{name}"
'''


def _write_modules(env: Env, tools_dir: Path, prefix: str, count: int, seconds: float) -> None:
    for n in range(count):
        name = f"{prefix}{n:03d}"
        env.write_tool(tools_dir, f"{name}.py", SLOW_IMPORT.format(name=name, seconds=seconds))


class _WorkerCount:
    """Counts the daemon's live workers every 20 ms in a thread; ``peak`` is the most seen at once."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> _WorkerCount:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            live = 0
            for worker in self.daemon.workers():
                try:
                    live += worker.status() != psutil.STATUS_ZOMBIE
                except psutil.Error:
                    continue
            self.peak = max(self.peak, live)
            time.sleep(0.02)


def _listed(raw: RawConnection, directory: Path) -> set[str]:
    return {tool["name"] for tool in raw.result("atomic/list", {"directory": str(directory)})["tools"]}


def test_a_project_of_many_modules_runs_at_most_max_workers(env: Env, make_daemon, record) -> None:  # type: ignore[no-untyped-def]
    """The attach waits for every module (``load_wait`` long enough): the workers a scan loaded make
    room for its other modules' before the scan installs them, or it would wait for ever."""
    count, limit = 60, 6
    _write_modules(env, env.local_tools, "m", count, 0.2)
    env.write_config(max_workers=limit, load_wait=120)
    daemon: Daemon = make_daemon()
    with _WorkerCount(daemon) as workers, RawConnection(env.socket, timeout=60) as raw:
        started = time.monotonic()
        attached = raw.result("atomic/attach", {"directory": str(env.project)})
        took = time.monotonic() - started
        assert attached["toolCount"] == count and not attached["loading"], attached
        assert {f"m{n:03d}" for n in range(count)} <= _listed(raw, env.project)
        slots = raw.result("atomic/status")["workerSlots"]
        assert raw.result("tools/call", {"name": "m000", "arguments": {}})["content"][0]["text"] == "m000"
    assert 1 < workers.peak <= limit, f"{workers.peak} workers at once, max_workers {limit}"
    assert slots["max"] == limit and slots["waited"] >= count - limit, slots
    record(f"{count} modules importing 0.2 s each, max_workers {limit}: at most {workers.peak} workers at once, "
           f"every module loaded in {took:.1f} s ({slots['waited']} spawns waited for a slot)")


def test_spawns_take_turns_by_project(env: Env, make_daemon, record) -> None:  # type: ignore[no-untyped-def]
    """While a project of 40 slow modules scans under max_workers 4, another project's first call
    gets a slot in its turn, not after the 36 loads queued before it."""
    count, limit, seconds = 40, 4, 0.5
    _write_modules(env, env.local_tools, "m", count, seconds)
    other = env.root / "other"
    (other / ".atomic").mkdir(parents=True)
    _write_modules(env, other / ".atomic" / "tools", "o", 1, seconds)
    env.write_config(max_workers=limit)
    make_daemon()
    with RawConnection(env.socket, timeout=60) as busy, RawConnection(env.socket, timeout=60) as raw:
        busy.send({"jsonrpc": "2.0", "id": "attach", "method": "atomic/attach", "params": {"directory": str(env.project)}})
        wait_for(lambda: raw.result("atomic/status")["workerSlots"]["waiting"] > count // 2, timeout=15,
                 message="the scan's spawns to wait for slots")
        started = time.monotonic()  # the attach loads its module (within load_wait), then the call
        raw.request("atomic/attach", {"directory": str(other)})
        answer = raw.result("tools/call", {"name": "o000", "arguments": {}})
        took = time.monotonic() - started
        still_waiting = raw.result("atomic/status")["workerSlots"]["waiting"]
    assert answer["content"][0]["text"] == "o000", answer
    # Its turn comes after at most a slot's worth of the scan's loads (each imports for 0.5 s);
    # behind the whole queue it would wait about count / limit * 0.5 = 5 s.
    assert took < 3 * seconds + 1.0, f"the other project's call waited {took:.1f} s"
    assert still_waiting > 0, "the scan was over before the other project's call: nothing was shown"
    record(f"a project of {count} modules importing {seconds:g} s each under max_workers {limit}: another project's "
           f"first call answered in {took:.2f} s, with {still_waiting} of the scan's spawns still waiting")


NAP = '''
    import time

    def nap(seconds: float) -> str:
        time.sleep(seconds)
        return "rested"
'''


def test_a_call_that_waits_for_a_slot_past_its_timeout_says_so(env: Env, make_daemon, record) -> None:  # type: ignore[no-untyped-def]
    """Every slot busy with a call: another module's call waits for a worker, and at its timeout it
    says what it waited for and what to do."""
    env.write_tool(env.local_tools, "nap.py", NAP)
    _write_modules(env, env.local_tools, "m", 1, 0)
    env.write_config(max_workers=1)
    make_daemon()
    with RawConnection(env.socket, timeout=30) as busy, RawConnection(env.socket, timeout=30) as raw:
        busy.request("atomic/attach", {"directory": str(env.project)})
        raw.request("atomic/attach", {"directory": str(env.project)})
        busy.send({"jsonrpc": "2.0", "id": "nap", "method": "tools/call", "params": {"name": "nap", "arguments": {"seconds": 4}}})
        wait_for(lambda: any(m["inflight"] for m in raw.result("atomic/status")["modules"]), message="the nap to start")
        answer = raw.result("tools/call", {"name": "m000", "arguments": {}, "_meta": {"atomic/timeout": 1}})
        assert busy.reply("nap")["result"]["content"][0]["text"] == "rested"
    text = answer["content"][0]["text"]
    assert answer.get("isError") and "waiting for a worker: the 1 that may run at once (max_workers)" in text, answer
    record(f"every slot busy (max_workers 1): a call needing a worker answered at its 1 s timeout: {text!r}")
