"""Faults around workers that must not leak or stick: a retiring worker whose last call will not stop,
cancellations that race a call's start, a fork server that dies or cannot fork, commands a tool
started, and what tools print."""

from __future__ import annotations

import json
import os
import random
import signal
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
        wait_for(lambda: module_status(client, "stub.py")["retiring"] == [], message="the daemon to see it end")


def test_an_async_call_cancelled_right_after_it_was_sent_is_cancelled(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    marks = env.root / "marks"
    marks.mkdir()
    env.write_tool(env.local_tools, "slow.py", f'''
        import asyncio
        from pathlib import Path

        async def slow(n: int, seconds: float = 1.0) -> str:
            await asyncio.sleep(seconds)
            (Path({str(marks)!r}) / f"finished-{{n}}").touch()
            return "done"
    ''')
    daemon: Daemon = make_daemon()
    with daemon.raw() as raw:
        raw.request("atomic/attach", {"directory": str(env.project)})
        assert raw.request("tools/call", {"name": "slow", "arguments": {"n": 0, "seconds": 0}})["result"]["content"]
        batch = b""
        for request_id in range(101, 106):  # each cancel right behind its call, in one write
            batch += json.dumps({"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
                                 "params": {"name": "slow", "arguments": {"n": request_id}}}).encode() + b"\n"
            batch += json.dumps({"jsonrpc": "2.0", "method": "notifications/cancelled",
                                 "params": {"requestId": request_id}}).encode() + b"\n"
        raw.send_bytes(batch)
        # A later call sleeps on the same event loop past the cancelled calls' deadlines: any of them
        # still running would have finished, and left its mark, before this one answers.
        reply = raw.request("tools/call", {"name": "slow", "arguments": {"n": 99, "seconds": 1.5}})
        assert reply["result"]["content"][0]["text"] == "done"
    assert sorted(p.name for p in marks.iterdir()) == ["finished-0", "finished-99"]


def sleepers(seconds: str) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["cmdline"]):
        if process.info["cmdline"] == ["sleep", seconds]:
            found.append(process)
    return found


def test_commands_a_shell_tool_started_die_with_a_killed_worker_and_a_killed_daemon(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    env.global_tools.mkdir(parents=True)
    (env.global_tools / "ops.json").write_text(json.dumps({"name": "ops", "version": "1", "tools": [{
        "name": "nap", "description": "Sleep.",
        "inputSchema": {"type": "object", "properties": {"seconds": {"type": "string"}}, "required": ["seconds"]},
        "handler": {"type": "shell", "command": "sleep {{seconds}}", "timeout": 600000},
    }]}))
    token = f"{random.randrange(10**6)}"
    first, second = f"301.{token}", f"302.{token}"  # no other test's sleep looks like these
    daemon: Daemon = make_daemon()

    def nap(seconds: str) -> None:
        try:
            with daemon.raw() as raw:
                raw.request("tools/call", {"name": "nap", "arguments": {"seconds": seconds}})
        except (OSError, EOFError):
            pass  # the daemon was killed

    try:
        threading.Thread(target=nap, args=(first,), daemon=True).start()
        (command,) = wait_for(lambda: sleepers(first), message="the command to run")
        with daemon.client(env.home) as client:
            worker = module_status(client, "ops.json")["worker"]
            os.kill(worker, signal.SIGKILL)
            wait_for(lambda: not alive(command.pid), timeout=10, message="the command to die with its worker")

            threading.Thread(target=nap, args=(second,), daemon=True).start()
            (command,) = wait_for(lambda: sleepers(second), message="the second command to run")
        daemon.kill()
        wait_for(lambda: not alive(command.pid), timeout=10, message="the command to die with the daemon")
    finally:
        for process in sleepers(first) + sleepers(second):
            process.kill()
