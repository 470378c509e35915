"""Faults injected into a running daemon: it or its workers die, and nothing is lost or left over."""

from __future__ import annotations

import os
import signal
import threading
import time

import psutil

from atomictools import ConnectError
from helpers import Daemon, Env, wait_for

TOOLS = '''
    import os, time
    from atomictools import tool

    @tool
    def work(n: int) -> str:
        return str(n * 2)

    @tool
    def hang(seconds: float) -> str:
        time.sleep(seconds)
        return "woke"

    @tool
    def pid() -> str:
        return str(os.getpid())
'''


def _hammer(daemon: Daemon, stop: threading.Event, outcomes: dict) -> None:  # type: ignore[type-arg]
    """Call until told to stop or the daemon goes; count what happened."""
    try:
        client = daemon.client()
    except ConnectError:
        outcomes["connect_failed"] += 1
        return
    n = 0
    try:
        while not stop.is_set():
            n += 1
            result = client.call("f_work", n=n)
            outcomes["ok" if result.text == str(n * 2) else "wrong"] += 1
    except (ConnectError, OSError):
        outcomes["cut"] += 1  # the daemon died under us: expected here
    finally:
        client.close()


def test_kill_9_under_load_then_restart(env: Env, make_daemon, record) -> None:  # type: ignore[no-untyped-def]
    env.write_tool(env.global_tools, "f.py", TOOLS)
    first: Daemon = make_daemon()
    outcomes = {"ok": 0, "wrong": 0, "cut": 0, "connect_failed": 0}
    stop = threading.Event()
    threads = [threading.Thread(target=_hammer, args=(first, stop, outcomes)) for _ in range(8)]
    for thread in threads:
        thread.start()
    wait_for(lambda: outcomes["ok"] > 200, message="load to build up")
    processes = first.descendants()
    first.kill()
    for thread in threads:
        thread.join(10)
    stop.set()
    assert outcomes["wrong"] == 0 and outcomes["connect_failed"] == 0, outcomes
    assert first.leftovers() == [], "no worker or fork server outlives a killed daemon"
    assert all(not psutil.pid_exists(p.pid) or p.status() == psutil.STATUS_ZOMBIE for p in processes)

    second: Daemon = make_daemon()
    with second.client() as client:
        assert client.call("f_work", n=21).text == "42"
    record(
        f"kill -9 after {outcomes['ok']} calls by 8 clients: {outcomes['cut']} connections cut, "
        f"{len(processes)} child processes gone, restart served at once"
    )


def test_worker_killed_mid_call(env: Env, make_daemon, record) -> None:  # type: ignore[no-untyped-def]
    env.write_tool(env.global_tools, "f.py", TOOLS)
    env.write_tool(env.global_tools, "other.py", "def other() -> str:\n    return 'unaffected'\n")
    daemon: Daemon = make_daemon()
    results: list = []  # type: ignore[type-arg]
    with daemon.client() as client:
        worker_pid = int(client.call("f_pid").text)
        client.call("other")
        def hang() -> None:
            with daemon.client() as other:
                results.append(other.call("f_hang", seconds=30))

        thread = threading.Thread(target=hang)
        thread.start()
        wait_for(lambda: any(m["inflight"] for m in client.status()["modules"]), message="the hanging call")
        started = time.monotonic()
        os.kill(worker_pid, signal.SIGKILL)
        thread.join(10)
        assert results, "the call was answered"
        assert results[0].is_error
        assert results[0].text == "Tool 'f_hang' failed: its worker process was killed by SIGKILL (9)"
        assert time.monotonic() - started < 5
        assert client.call("other").text == "unaffected"
        assert client.call("f_work", n=2).text == "4"
        assert int(client.call("f_pid").text) != worker_pid
    assert daemon.proc.poll() is None
    record("1 worker SIGKILLed mid-call: the call answered isError naming the signal; other module unaffected; module respawned")
