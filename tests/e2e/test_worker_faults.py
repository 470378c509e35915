"""Faults around workers that must not leak or stick: a retiring worker whose last call will not stop,
cancellations that race a call's start, a fork server that dies or cannot fork, commands a tool
started, and what tools print."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import sysconfig
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from atomictoolsd.eventlog.reader import read_events
from atomictoolsd.pool.pool import PoolSettings
from atomictoolsd.pool.spawner import Spawner
from atomictoolsd.protocol import FrameReader
from atomictoolsd.worker.output import BURST_BYTES, CHUNK_BYTES, RATE_BYTES
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


@pytest.mark.parametrize("change", ["rewritten", "deleted"])
def test_a_call_whose_module_changes_under_it_times_out_and_its_stubborn_worker_is_stopped(env: Env, make_daemon, change: str) -> None:  # type: ignore[no-untyped-def]
    path = env.write_tool(env.local_tools, "stub.py", "# v1\n" + textwrap.dedent(STUBBORN))
    daemon: Daemon = make_daemon({"ATOMICTOOLS_CANCEL_GRACE": "0.3"})
    answers: list[Any] = []
    with daemon.client() as client, daemon.client() as other:
        old = int(client.call("stub_pid").text)
        thread = threading.Thread(target=lambda: answers.append(other.call("stub_hang")))
        thread.start()
        wait_for(lambda: module_status(client, "stub.py")["inflight"] == 1, message="the call to run")
        if change == "rewritten":
            path.write_text("# v2\n" + textwrap.dedent(STUBBORN))  # the old worker retires, its call still running
            wait_for(lambda: int(client.call("stub_pid").text) != old, message="the new generation")
        else:
            # The deadline sweep finds calls where they wait: here on a worker that retires with a
            # runner the pool no longer lists among its modules.
            path.unlink()
            wait_for(lambda: all(Path(m["path"]).name != "stub.py" for m in client.status()["modules"]),
                     message="the module to be forgotten")
        thread.join(15)
        assert answers and answers[0].is_error and answers[0].text == "Tool 'stub_hang' timed out after 3 s"
        wait_for(lambda: not alive(old), timeout=10, message="the retired worker to be stopped")
        if change == "rewritten":
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


def names(client: Any) -> list[str]:
    return sorted(t["name"] for t in client.list_tools())


def test_a_killed_fork_server_is_noticed_at_once_and_the_next_worker_starts_a_new_one(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    env.write_tool(env.global_tools, "a.py", "import os\n\ndef a() -> str:\n    return str(os.getpid())\n")
    env.write_tool(env.global_tools, "h.py", "import time\n\ndef h() -> str:\n    time.sleep(60)\n    return 'never'\n")
    daemon: Daemon = make_daemon()
    answers: list[Any] = []
    with daemon.client(env.home) as client, daemon.client(env.home) as other:
        old_worker = int(client.call("a").text)
        forkserver = client.status()["forkserver"]["pid"]
        thread = threading.Thread(target=lambda: answers.append(other.call("h")))
        thread.start()
        wait_for(lambda: module_status(client, "h.py")["inflight"] == 1, message="the call to run")
        os.kill(forkserver, signal.SIGKILL)
        thread.join(15)
        # The daemon learns of the death from the pipe at once, so it knows how the worker ended
        # (a worker's exit status only ever came from the fork server).
        assert answers[0].is_error and answers[0].text == "Tool 'h' failed: its worker process was killed with the fork server"
        new_worker = int(client.call("a").text)
        assert new_worker != old_worker and not alive(old_worker)
        assert client.status()["forkserver"]["pid"] not in (None, forkserver)
        info = module_status(client, "a.py")
        assert info["state"] == "ready" and info["crashes"] == 0, "dying with the fork server is not the module's crash"

        env.write_tool(env.global_tools, "new.py", "def new() -> str:\n    return 'new'\n")
        wait_for(lambda: "new" in names(client), message="a module added afterwards to load")
        assert client.call("new").text == "new"
        assert client.request("atomic/list")["errors"] == []
    daemon.stop()
    with make_daemon().client(env.home) as client:
        assert names(client) == ["a", "h", "new"] and client.request("atomic/list")["errors"] == []


FAIL_ONE_FORK = """
import os

_fork = os.fork


def fork():
    # Test fault injection: the next fork fails as if the user's process limit were reached.
    trigger = os.environ.get("FAIL_FORK_TRIGGER")
    if trigger:
        try:
            os.unlink(trigger)
        except FileNotFoundError:
            pass
        else:
            raise BlockingIOError(11, "Resource temporarily unavailable (injected)")
    return _fork()


os.fork = fork
"""


def faulty_interpreter(root: Path) -> str:
    """An interpreter whose installation carries FAIL_ONE_FORK as its sitecustomize, with this one's
    packages. The daemon's processes run what their installation holds and nothing a PYTHONPATH
    names (docs/trust.md), so the fault goes where a user's own installation would put it."""
    venv = root / "faulty-python"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    [site_dir] = (venv / "lib").glob("python*/site-packages")
    (site_dir / "ours.pth").write_text(f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
    (site_dir / "sitecustomize.py").write_text(FAIL_ONE_FORK)
    return str(venv / "bin" / "python")


def test_a_fork_that_fails_costs_only_what_needed_that_worker_and_is_never_cached(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    python = faulty_interpreter(env.root)
    trigger = env.root / "fail-the-next-fork"
    extra = {"FAIL_FORK_TRIGGER": str(trigger)}
    env.write_tool(env.global_tools, "a.py", "import os, time\n\ndef a(s: float = 0) -> str:\n    time.sleep(s)\n    return str(os.getpid())\n")
    env.write_tool(env.global_tools, "b.py", "import os\n\ndef b() -> str:\n    return str(os.getpid())\n")
    env.write_tool(env.global_tools, "c.py", "def c() -> str:\n    return 'c'\n")

    daemon: Daemon = make_daemon(extra, python=python)
    answers: list[Any] = []
    with daemon.client(env.home) as client, daemon.client(env.home) as other:
        pid_a, pid_b = client.call("a").text, client.call("b").text
        thread = threading.Thread(target=lambda: answers.append(other.call("a", s=2)))
        thread.start()
        wait_for(lambda: module_status(client, "a.py")["inflight"] == 1, message="the call to run")
        trigger.touch()
        env.write_tool(env.global_tools, "d.py", "def d() -> str:\n    return 'd'\n")  # its load needs a fork
        errors = wait_for(lambda: client.request("atomic/list")["errors"], message="d.py to fail")
        assert [(Path(e["file"]).name, e["message"]) for e in errors] == [(
            "d.py", "no worker could be started to load it "
                    "(cannot fork a worker process: [Errno 11] Resource temporarily unavailable (injected))",
        )]
        thread.join(15)
        assert not answers[0].is_error and answers[0].text == pid_a, "the call in flight elsewhere finished"
        assert (client.call("a").text, client.call("b").text) == (pid_a, pid_b), "every worker lives on"
    daemon.stop()

    # The failure was not d.py's: nothing was cached, and the next daemon loads it. The others are
    # listed from the cache, without a worker until their first call.
    daemon = make_daemon(extra, python=python)
    with daemon.client(env.home) as client:
        assert names(client) == ["a", "b", "c", "d"] and client.request("atomic/list")["errors"] == []
        assert module_status(client, "c.py")["worker"] is None
        trigger.touch()
        result = client.call("c")
        assert result.is_error and result.text == (
            "Tool 'c' is unavailable: no worker could be started "
            "(cannot fork a worker process: [Errno 11] Resource temporarily unavailable (injected))"
        )
        assert names(client) == ["a", "b", "c", "d"] and client.request("atomic/list")["errors"] == [], "c keeps its listing"
        assert client.call("c").text == "c"

        trigger.touch()  # a new module whose load fails so is tried again by the next scan
        env.write_tool(env.global_tools, "e.py", "def e() -> str:\n    return 'e'\n")
        wait_for(lambda: client.request("atomic/list")["errors"], message="e.py to fail")
        assert client.request("atomic/reload")["success"] is True
        assert client.call("e").text == "e"


def test_a_spawn_whose_send_finds_the_fork_server_dead_is_tried_again_on_a_new_one(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def m() -> str:\n    return 'm'\n")
    spec = PoolSettings.from_config().worker_spec(str(module), "python", str(tmp_path))
    started: list[int] = []

    async def main() -> None:
        spawner = Spawner()
        try:
            pid, sock = await spawner.spawn(spec)
            started.append(pid)
            first = spawner.pid
            assert first is not None
            started.append(first)
            os.kill(first, signal.SIGKILL)
            # Blocking the loop while it dies keeps the pipe's end-of-file unread: the next send is
            # the first news of the death.
            wait_for(lambda: not alive(first), message="the fork server to die")
            pid, sock = await spawner.spawn(spec)
            started.append(pid)
            assert spawner.pid not in (None, first)
            started.append(spawner.pid)
            sock.settimeout(10)
            assert FrameReader().feed(sock.recv(65536))[0][0] == "loaded"
            sock.close()
            await asyncio.wait_for(spawner.exit_status(pid), 10)
        finally:
            await spawner.close()

    asyncio.run(main())
    wait_for(lambda: not any(alive(pid) for pid in started), message="every process to end")


NOISY = '''
    import subprocess, sys
    from atomictools import tool

    print("loading noisy")

    @tool
    def noisy() -> str:
        print("to stdout")
        print("to stderr", file=sys.stderr)
        subprocess.run(["echo", "from a program it started"])
        return "ok"

    @tool
    def flood() -> str:
        for _ in range(50):
            print("x" * 100_000)
        return "flooded"
'''


def output_events(env: Env) -> list[dict[str, Any]]:
    return [e for e in read_events(env.state_dir / "log") if e.get("event") == "tool.output"]


def test_what_a_tool_prints_goes_to_the_event_log_as_its_modules_output_bounded(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    module = str(env.write_tool(env.global_tools, "noisy.py", NOISY))
    daemon: Daemon = make_daemon()
    with daemon.client(env.home) as client:
        assert client.call("noisy").text == "ok"
        expected = {
            ("info", "stdout", "loading noisy"), ("info", "stdout", "to stdout"),
            ("warning", "stderr", "to stderr"), ("info", "stdout", "from a program it started"),
        }

        def seen() -> set[tuple[str, str, str]]:
            # One event per chunk the worker read (docs/service.md): lines written close together
            # (the print, then the program's line) can share one event when the worker's reader
            # thread runs late, as it does on a loaded machine. Each line keeps its level and stream.
            return {
                (e["level"], e["stream"], line)
                for e in output_events(env) if e["module"] == module for line in e["message"].split("\n")
            }

        wait_for(lambda: expected <= seen(), timeout=15, interval=0.1, message=lambda: f"{expected} in the log (seen {seen()})")

        started = time.monotonic()
        assert client.call("noisy_flood").text == "flooded"
        total = 50 * 100_001
        flood: list[dict[str, Any]] = []

        def accounted() -> bool:
            flood[:] = [e for e in output_events(env) if set(e["message"]) <= {"x", "\n"} or e["message"].startswith("(")]
            logged = sum(len(e["message"]) for e in flood if not e["message"].startswith("("))
            # Every byte is logged or counted as dropped (a logged chunk's last newline is not kept).
            return total - len(flood) <= logged + sum(e.get("dropped", 0) for e in flood) <= total

        wait_for(accounted, timeout=15, interval=0.1, message="the whole flood to be accounted for")
        elapsed = time.monotonic() - started
    logged = sum(len(e["message"]) for e in flood if not e["message"].startswith("("))
    assert all(len(e["message"]) <= CHUNK_BYTES for e in flood)
    assert logged <= BURST_BYTES + RATE_BYTES * elapsed + CHUNK_BYTES, "a flood is rate-limited"
    assert flood[-1]["message"].endswith("bytes of output not logged)") and flood[-1]["dropped"] > 0
    stderr = daemon.stderr()
    assert "to stdout" not in stderr and "xxxxxxxxxx" not in stderr, "nothing a tool prints reaches the daemon's stderr"
