"""Faults around workers that must not leak or stick: a retiring worker whose last call will not stop,
cancellations that race a call's start, a fork server that dies or cannot fork, commands a tool
started, and what tools print."""

from __future__ import annotations

import textwrap
import threading
from pathlib import Path
from typing import Any

import psutil

from helpers import Daemon, Env, wait_for


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def module_status(client: Any, filename: str) -> dict[str, Any]:
    return next(m for m in client.status()["modules"] if Path(m["path"]).name == filename)


STUBBORN = '''
    import os, time
    from atomictools import tool

    @tool(timeout=3)
    def hang() -> str:
        time.sleep(300)  # ignores its cancellation
        return "never"

    @tool
    def pid() -> str:
        return str(os.getpid())
'''


def test_a_retiring_worker_whose_last_call_times_out_and_will_not_stop_is_stopped(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    path = env.write_tool(env.local_tools, "stub.py", "# v1\n" + textwrap.dedent(STUBBORN))
    daemon: Daemon = make_daemon({"ATOMICTOOLS_CANCEL_GRACE": "0.3"})
    answers: list[Any] = []
    with daemon.client() as client, daemon.client() as other:
        old = int(client.call("stub_pid").text)
        thread = threading.Thread(target=lambda: answers.append(other.call("stub_hang")))
        thread.start()
        wait_for(lambda: module_status(client, "stub.py")["inflight"] == 1, message="the call to run")
        path.write_text("# v2\n" + textwrap.dedent(STUBBORN))  # the old worker retires, its call still running
        wait_for(lambda: int(client.call("stub_pid").text) != old, message="the new generation")
        thread.join(15)
        assert answers[0].is_error and answers[0].text == "Tool 'stub_hang' timed out after 3 s"
        wait_for(lambda: not alive(old), timeout=10, message="the retired worker to be stopped")
        assert module_status(client, "stub.py")["retiring"] == []
