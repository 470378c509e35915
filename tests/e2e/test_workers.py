"""Workers that cannot hurt the daemon: timeouts, cancellation, runaway children, memory, crashes,
idle reaping, orphans, and the notifications a call sends on its way."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from listener import Listener

from atomictools._launch import sealed_environ
from atomictoolsd.worker.forkserver import FORKSERVER_NAME, WORKER_NAME
from helpers import Daemon, Env, RawConnection, code_address, wait_for

HANG = '''
    import os, time
    from atomictools import Context, tool

    @tool
    def hang(seconds: float, ctx: Context) -> str:
        """Wait, but stop when cancelled."""
        if ctx.cancel_event.wait(seconds):
            return "stopped early"
        return "done"

    @tool(timeout=0.3)
    def quick(seconds: float, ctx: Context) -> str:
        ctx.cancel_event.wait(seconds)
        return "done"

    @tool
    def pid() -> str:
        return str(os.getpid())
'''


def worker_pid(client: Any) -> int:
    return int(client.call("hang_pid").text)


def describe(process: psutil.Process) -> str:
    try:
        return f"{' '.join(process.cmdline())}, {process.status()}, parent {process.ppid()}"
    except psutil.Error:
        return "gone"


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def call_raw(raw: RawConnection, name: str, arguments: dict[str, Any], meta: dict[str, Any] | None = None) -> dict[str, Any]:
    params: dict[str, Any] = {"name": name, "arguments": arguments}
    if meta:
        params["_meta"] = meta
    return raw.request("tools/call", params)["result"]


@pytest.fixture
def hang_daemon(env: Env, make_daemon) -> Daemon:  # type: ignore[no-untyped-def]
    env.write_tool(env.local_tools, "hang.py", HANG)
    return make_daemon({"ATOMICTOOLS_CALL_TIMEOUT": "0.5", "ATOMICTOOLS_MAX_CALL_TIMEOUT": "1.5", "ATOMICTOOLS_CANCEL_GRACE": "0.3"})


def test_default_per_tool_and_per_call_timeouts(hang_daemon: Daemon) -> None:
    with hang_daemon.client() as client:
        result = client.call("hang", seconds=30)
        assert result.is_error and result.text == "Tool 'hang' timed out after 0.5 s"
        result = client.call("hang_quick", seconds=30)
        assert result.is_error and result.text == "Tool 'hang_quick' timed out after 0.3 s", "@tool(timeout=) wins"
        result = client.call_tool("hang", {"seconds": 30}, timeout=0.2)
        assert result.is_error and result.text == "Tool 'hang' timed out after 0.2 s", "a caller may shorten it"
        result = client.call_tool("hang", {"seconds": 30}, timeout=100)
        assert result.is_error and result.text == "Tool 'hang' timed out after 1.5 s", "capped by max_call_timeout"
        result = client.call_tool("hang", {"seconds": 0.7}, timeout=1.5)
        assert not result.is_error and result.text == "done", "a caller may lengthen it up to the cap"


def test_a_timed_out_sync_tool_sees_its_cancellation_and_keeps_its_worker(hang_daemon: Daemon) -> None:
    with hang_daemon.client() as client:
        pid = worker_pid(client)
        assert client.call("hang", seconds=30).is_error
        time.sleep(0.6)  # longer than cancel_grace: a worker whose call would not stop is gone by now
        assert worker_pid(client) == pid, "the tool stopped when its flag was set, so its worker lives on"


def test_cancel_sets_the_flag_of_a_sync_tool_and_cancels_an_async_one_without_an_answer(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    marks = env.root / "marks"
    marks.mkdir()
    env.write_tool(env.local_tools, "stop.py", f'''
        import asyncio, os
        from pathlib import Path
        from atomictools import Context, tool

        MARKS = Path({str(marks)!r})

        @tool
        def sync_wait(ctx: Context) -> str:
            (MARKS / "sync-started").touch()
            while not ctx.cancelled:
                ctx.cancel_event.wait(0.05)
            (MARKS / "sync-cancelled").touch()
            return "sync saw the flag"

        @tool
        async def async_wait() -> str:
            (MARKS / "async-started").touch()
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                (MARKS / "async-cancelled").touch()
                raise
            return "never"

        @tool
        def pid() -> str:
            return str(os.getpid())
    ''')
    daemon = make_daemon()
    with daemon.raw() as raw:
        raw.request("atomic/attach", {"directory": str(env.project)})
        pid = call_raw(raw, "stop_pid", {})["content"][0]["text"]
        for request_id, tool, kind in ((101, "stop_sync_wait", "sync"), (102, "stop_async_wait", "async")):
            raw.send({"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": {"name": tool, "arguments": {}}})
            wait_for(lambda k=kind: (marks / f"{k}-started").exists(), message=f"the {kind} tool to start")
            raw.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": request_id, "reason": "test"}})
            wait_for(lambda k=kind: (marks / f"{k}-cancelled").exists(), message=f"the {kind} tool to see the cancellation")
        # Both tools have ended; their results (a value, a cancelled task) reached the daemon and were dropped.
        assert call_raw(raw, "stop_pid", {})["content"][0]["text"] == pid, "cooperative tools cost no worker"
        raw.send({"jsonrpc": "2.0", "id": 103, "method": "ping"})
        seen = []
        while True:
            message = raw.recv()
            seen.append(message)
            if message.get("id") == 103:
                break
        assert [m for m in seen if m.get("id") in (101, 102)] == [], "a cancelled call is never answered"


def test_a_tool_that_forks_a_sleeping_child_and_hangs_loses_both(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    pid_file = env.root / "child.pid"
    env.write_tool(env.local_tools, "runaway.py", f'''
        import os, subprocess, time

        def runaway() -> str:
            child = subprocess.Popen(["sleep", "300"])
            with open({str(pid_file)!r}, "w") as f:
                f.write(f"{{os.getpid()}} {{child.pid}}")
            time.sleep(300)  # ignores its cancellation flag
            return "never"
    ''')
    daemon = make_daemon({"ATOMICTOOLS_CANCEL_GRACE": "0.3"})
    with daemon.client() as client:
        result = client.call_tool("runaway", {}, timeout=0.5)
        assert result.is_error and result.text == "Tool 'runaway' timed out after 0.5 s"
        worker, child = map(int, pid_file.read_text().split())
        wait_for(lambda: not alive(child) and not alive(worker), timeout=10, message="the worker and its child to be killed")
        pid_file.unlink()
        result = client.call_tool("runaway", {}, timeout=0.5)  # the module still serves, from a fresh worker
        assert result.is_error
        new_worker, new_child = map(int, pid_file.read_text().split())
        assert new_worker != worker
        wait_for(lambda: not alive(new_child), timeout=10, message="the second child to be killed")


def test_memory_past_the_limit_is_an_error_naming_it_and_the_daemon_is_unaffected(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    env.write_tool(env.local_tools, "hog.py", '''
        import mmap, os, time
        from atomictools import tool

        @tool
        def hog(mb: int) -> str:
            data = bytearray(mb * 1024 * 1024)
            return str(len(data))

        @tool
        def shared(mb: int) -> str:
            """Memory an rlimit on the data segment does not count: the RSS watch stops it."""
            region = mmap.mmap(-1, mb * 1024 * 1024)
            for offset in range(0, len(region), 4096):
                region[offset] = 1
            time.sleep(30)
            return "survived"

        @tool
        def pid() -> str:
            return str(os.getpid())
    ''')
    daemon = make_daemon({"ATOMICTOOLS_MEMORY_LIMIT_MB": "200"})
    daemon_rss = psutil.Process(daemon.pid).memory_info().rss
    with daemon.client() as client:
        assert client.call("hog", mb=10).text == str(10 * 1024 * 1024)
        pid = int(client.call("hog_pid").text)
        result = client.call("hog", mb=400)
        assert result.is_error
        assert result.text == "Tool 'hog' ran out of memory: it tried to allocate past the worker memory limit of 200 MiB (memory_limit_mb)"
        assert int(client.call("hog_pid").text) == pid, "a MemoryError costs the call, not the worker"

        result = client.call("hog_shared", mb=400)
        assert result.is_error
        assert "its worker process was killed for using" in result.text
        assert "over the worker memory limit of 200 MiB (memory_limit_mb)" in result.text
        assert int(client.call("hog_pid").text) != pid, "the next call gets a fresh worker"
    assert psutil.Process(daemon.pid).memory_info().rss < daemon_rss + 50 * 1024 * 1024


def test_a_module_that_keeps_crashing_backs_off_and_shows_as_failing(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    env.write_tool(env.local_tools, "crashy.py", '''
        import os

        def crashy(code: int) -> str:
            if code:
                os._exit(code)
            return "fine"
    ''')
    daemon = make_daemon()
    with Listener(env.socket, env.project) as listener, daemon.client() as client:
        for _ in range(3):
            result = client.call("crashy", code=3)
            assert result.is_error and result.text == "Tool 'crashy' failed: its worker process exited with code 3"
        spawns = module_info(client)["spawns"]
        result = client.call("crashy", code=0)
        assert result.is_error, "while backing off, calls fail at once"
        assert "its module keeps crashing (3 times in a row; last: worker" in result.text
        assert "exited with code 3" in result.text and "the next try is in" in result.text
        assert module_info(client)["spawns"] == spawns, "no worker was started for it"

        info = module_info(client)
        assert info["state"] == "failing" and info["crashes"] == 3 and info["retryIn"] > 0
        assert "keeps crashing" in info["error"]["message"]
        (error,) = client.request("atomic/list")["errors"]
        assert Path(error["file"]).name == "crashy.py" and "keeps crashing" in error["message"]
        log = listener.next("notifications/message")
        assert log["params"]["level"] == "error" and "keeps crashing" in log["params"]["data"]["message"]
        assert [t["name"] for t in client.list_tools()] == ["crashy"], "its tools stay listed: they may recover"

        # After the back-off a worker is tried again; a call it answers ends the streak.
        wait_for(lambda: not client.call("crashy", code=0).is_error, timeout=10, message="the back-off to pass")
        info = module_info(client)
        assert info["state"] == "ready" and info["crashes"] == 0 and info["error"] is None
        assert client.request("atomic/list")["errors"] == []


def module_info(client: Any, name: str = "crashy.py") -> dict[str, Any]:
    return next(m for m in client.status()["modules"] if Path(m["path"]).name == name)


def test_an_idle_worker_is_reaped_and_the_next_call_starts_another(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    env.write_tool(env.local_tools, "nap.py", "import os\n\ndef nap() -> str:\n    return str(os.getpid())\n")
    daemon = make_daemon({"ATOMICTOOLS_IDLE_TIMEOUT": "0.5"})
    with daemon.client() as client:
        first = int(client.call("nap").text)
        wait_for(lambda: not alive(first), timeout=10, message="the idle worker to be reaped")
        assert module_info(client, "nap.py")["worker"] is None
        assert [t["name"] for t in client.list_tools()] == ["nap"], "listing needs no worker"
        second = int(client.call("nap").text)
        assert second != first and alive(second)


def test_no_more_than_max_idle_workers_stay_idle_and_the_least_recently_used_go(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    """A first scan loads every module in a worker to learn its tools; without a cap each would wait
    out idle_timeout (ten minutes). With max_idle_workers=2 the scan's five workers shrink to two,
    and after calls the two kept are the two used last."""
    for n in range(5):
        env.write_tool(env.local_tools, f"t{n}.py", f"import os\n\ndef t{n}() -> str:\n    return str(os.getpid())\n")
    daemon = make_daemon({"ATOMICTOOLS_MAX_IDLE_WORKERS": "2"})
    with daemon.client() as client:
        assert len(client.list_tools()) == 5
        wait_for(lambda: len(daemon.workers()) == 2, message="the scan's idle workers to shrink to two")
        assert client.status()["monitor"]["stoppedOverMaxIdle"] == 3
        pids = {f"t{n}": int(client.call(f"t{n}").text) for n in (0, 1, 2, 3, 4)}  # t4 is used last
        wait_for(lambda: {p.pid for p in daemon.workers()} == {pids["t3"], pids["t4"]},
                 message="the two workers used last to be the ones kept")
        assert [m["worker"] is not None for m in sorted(client.status()["modules"], key=lambda m: m["path"])] == [
            False, False, False, True, True,
        ]
        assert client.call("t0").text != str(pids["t0"]), "a stopped module starts a fresh worker"


def test_kill_9_of_the_daemon_leaves_no_worker_not_even_a_busy_one_with_a_child(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    pid_file = env.root / "child.pid"
    env.write_tool(env.local_tools, "busy.py", f'''
        import os, subprocess, time

        def busy() -> str:
            child = subprocess.Popen(["sleep", "300"])
            with open({str(pid_file)!r}, "w") as f:
                f.write(f"{{os.getpid()}} {{child.pid}}")
            time.sleep(300)
            return "never"

        def idle() -> str:
            return "ok"
    ''')
    env.write_tool(env.global_tools, "other.py", "def other() -> str:\n    return 'ok'\n")
    daemon = make_daemon()
    raw = daemon.raw()
    raw.request("atomic/attach", {"directory": str(env.project)})
    assert call_raw(raw, "other", {})["content"][0]["text"] == "ok"
    raw.send({"jsonrpc": "2.0", "id": 50, "method": "tools/call", "params": {"name": "busy", "arguments": {}}})
    wait_for(pid_file.exists, message="the busy tool to start its child")
    worker, child = map(int, wait_for(lambda: pid_file.read_text().split() or None, message="the pids"))
    processes = [psutil.Process(p.pid) for p in daemon.descendants()]
    assert {worker, child} <= {p.pid for p in processes} and len(processes) >= 4  # fork server, 2 workers, child
    daemon.kill()
    raw.close()
    for process in processes:
        wait_for(lambda p=process: not alive(p.pid), timeout=10, message=f"{process.pid} ({describe(process)}) to go")
    assert daemon.leftovers() == []


def test_progress_and_log_notifications_reach_a_socket_client(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    env.write_tool(env.local_tools, "report.py", '''
        from atomictools import Context

        def report(steps: int, ctx: Context) -> str:
            for i in range(1, steps + 1):
                ctx.progress(i, steps, f"step {i}")
            ctx.log("warning", {"note": "half way", "steps": steps})
            return "reported"
    ''')
    daemon = make_daemon()
    with daemon.raw() as raw:
        raw.request("atomic/attach", {"directory": str(env.project)})
        raw.send({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                  "params": {"name": "report", "arguments": {"steps": 3}, "_meta": {"progressToken": "tok-1"}}})
        messages = []
        while True:
            message = raw.recv()
            messages.append(message)
            if message.get("id") == 7:
                break
    progress = [m["params"] for m in messages if m.get("method") == "notifications/progress"]
    assert progress == [
        {"progressToken": "tok-1", "progress": i, "total": 3, "message": f"step {i}"} for i in (1, 2, 3)
    ]
    (log,) = [m["params"] for m in messages if m.get("method") == "notifications/message"]
    assert log == {"level": "warning", "logger": "report", "data": {"note": "half way", "steps": 3}}
    assert messages[-1]["result"]["content"][0]["text"] == "reported"
    assert json.dumps(messages[-1]).count("progressToken") == 0, "nothing about progress in the result"


def test_no_progress_without_a_token(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    env.write_tool(env.local_tools, "report.py", '''
        from atomictools import Context

        def report(ctx: Context) -> str:
            ctx.progress(1, 1, "done")
            return "reported"
    ''')
    daemon = make_daemon()
    with daemon.raw() as raw:
        raw.request("atomic/attach", {"directory": str(env.project)})
        raw.send({"jsonrpc": "2.0", "id": 8, "method": "tools/call", "params": {"name": "report", "arguments": {}}})
        assert raw.recv()["id"] == 8, "the first message is the result: no progress was asked for"


def _descriptors(pid: int) -> dict[int, str]:
    return {int(fd): os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the first fork server is forked on Linux only")
def test_the_first_fork_server_is_a_sealed_fork_of_the_daemon_and_a_replacement_is_execd(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    env.write_tool(env.local_tools, "who.py", "import os\n\ndef who() -> str:\n    return str(os.getpid())\n")
    env.write_tool(env.local_tools, "environment.py", (
        "import json, os\n\ndef environment() -> str:\n    return json.dumps(dict(os.environ))\n"
    ))
    daemon = make_daemon({"PYTHONWARNINGS": "error", "SOME_SETTING": "kept"})  # the daemon re-executes itself sealed
    with daemon.client() as client:
        worker = psutil.Process(int(client.call("who").text))
        forkserver = worker.parent()
        assert forkserver is not None and forkserver.ppid() == daemon.pid
        assert (forkserver.name(), worker.name()) == (FORKSERVER_NAME, WORKER_NAME)
        # Forked from the daemon: the interpreter's code at the daemon's addresses, in it and its workers.
        if Path("/proc/sys/kernel/randomize_va_space").read_text().strip() != "0":
            assert code_address(forkserver.pid) == code_address(daemon.pid) == code_address(worker.pid)
        # ...and sealed as an exec'd one: nothing of the daemon's open but its stdio, from /, no PYTHON* of the starter's.
        daemon_fds = set(_descriptors(daemon.pid).values())
        held = {fd: target for fd, target in _descriptors(forkserver.pid).items() if fd > 2}
        assert all(target.startswith(("socket:", "pipe:")) for target in held.values()), held
        assert len(held) <= 4, held  # control socket, liveness pipe, its own wake-up pipe
        # No socket of the daemon's (its listening socket, its clients'): a socket pair's two ends differ.
        assert not {t for t in held.values() if t.startswith("socket:")} & daemon_fds, held
        assert forkserver.cwd() == "/"
        # What a tool runs with: the sealed environment, as an exec'd fork server's...
        tool_environment = json.loads(client.call("environment").text)
        assert tool_environment == sealed_environ(tool_environment) and tool_environment["SOME_SETTING"] == "kept"
        assert "PYTHONWARNINGS" not in tool_environment
        # ...and the daemon's own starting environment, which a fork keeps in memory, wiped.
        assert forkserver.environ() == {} and worker.environ() == {}
        # A fork server that replaces a lost one is exec'd (the daemon has threads by then).
        forkserver.kill()
        forkserver.wait(10)
        wait_for(lambda: client.call("who").text != str(worker.pid), message="a new worker on a new fork server")
        new = psutil.Process(int(client.call("who").text)).parent()
        assert new is not None and new.pid != forkserver.pid and new.name() == FORKSERVER_NAME
        command = new.cmdline()
        assert command[1:4] == ["-P", "-m", "atomictoolsd.worker.forkserver"]  # sealed: see docs/trust.md
        assert command[0] == psutil.Process(daemon.pid).cmdline()[0], "sys.executable, never a pyenv/asdf shim"


def test_sighup_applies_a_new_idle_timeout_and_memory_limit_to_the_monitor(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    env.write_tool(env.local_tools, "nap.py", "import os\n\ndef nap() -> str:\n    return str(os.getpid())\n")
    daemon = make_daemon()
    with daemon.client() as client:
        assert client.status()["monitor"]["interval"] == 0.5
        env.write_config("idle_timeout = 0.4\nmemory_limit_mb = 300\n")
        daemon.proc.send_signal(signal.SIGHUP)  # type: ignore[union-attr]
        wait_for(lambda: client.status()["monitor"]["interval"] == 0.1, message="the monitor to take the new settings")
        pid = int(client.call("nap").text)
        wait_for(lambda: not alive(pid), timeout=10, message="the idle worker to be reaped under the new timeout")
