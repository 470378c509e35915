"""Faults injected into a running daemon: it or its workers die, tools hide children or eat memory,
and nothing is lost or left over: no wrong answer, no orphan process, no stale bridge."""

from __future__ import annotations

import json
import os
import random
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

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

# A tool that starts a descendant in every way a tool can, noting each pid, then hangs and ignores
# its cancellation. Only the first two stay in the worker's process group; the others leave it (a
# new session, a new group, a daemonizing double fork whose middle process exits at once).
HIDE = '''
    import os, subprocess, time

    PIDS = {pid_file!r}

    def note(kind: str, pid: int) -> None:
        with open(PIDS, "a") as f:
            f.write(f"{{kind}} {{pid}}\\n")

    def hide() -> str:
        note("worker", os.getpid())
        note("child", subprocess.Popen(["sleep", "300"]).pid)
        pid = os.fork()
        if pid == 0:  # a copy of the worker itself, holding its channel to the daemon
            time.sleep(300)
            os._exit(0)
        note("fork", pid)
        note("session", subprocess.Popen(["sleep", "300"], start_new_session=True).pid)
        note("group", subprocess.Popen(["sleep", "300"], process_group=0).pid)
        shell = subprocess.Popen(["sh", "-c", "trap '' TERM HUP INT; sleep 300 & echo $!; wait"],
                                 start_new_session=True, stdout=subprocess.PIPE, text=True)
        note("deaf-shell", shell.pid)
        note("deaf-shell's child", int(shell.stdout.readline()))
        read, write = os.pipe()
        middle = os.fork()
        if middle == 0:
            os.setsid()
            if os.fork() == 0:
                os.write(write, str(os.getpid()).encode())
                time.sleep(300)
            os._exit(0)
        os.waitpid(middle, 0)
        note("daemonized", int(os.read(read, 20)))
        time.sleep(300)
        return "never"
'''

# A declarative tool whose command the shell handler starts in a session of its own. Its duration
# is this run's own, so the test finds (and at the end stops) only the command it started, never
# another process that happens to run `sleep 300` on the machine.
SNOOZE_SECONDS = f"300.{random.randrange(10**6):06d}"
SNOOZE = json.dumps({"tools": [{
    "name": "snooze", "description": "Sleep for a long time.",
    "handler": {"type": "shell", "command": f"sleep {SNOOZE_SECONDS}", "timeout": 600_000},
}]})


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def noted(pid_file: Path) -> dict[str, int]:
    """The pids a HIDE tool noted, by kind (once it has noted them all)."""
    lines = pid_file.read_text().splitlines() if pid_file.exists() else []
    return {kind: int(pid) for kind, pid in (line.rsplit(" ", 1) for line in lines)}


def sleepers(argv: list[str]) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["cmdline"]):
        if process.info["cmdline"] == argv and alive(process.pid):
            found.append(process)
    return found


@pytest.fixture
def pid_file(env: Env) -> Iterator[Path]:
    """Where a HIDE tool notes its pids; whatever it noted is killed at teardown, should a test fail."""
    path = env.root / "hidden.pids"
    yield path
    for pid in noted(path).values():
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


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


def test_kill_9_under_load_then_restart(env: Env, make_daemon, record, pid_file: Path) -> None:  # type: ignore[no-untyped-def]
    env.write_tool(env.global_tools, "f.py", TOOLS)
    env.write_tool(env.global_tools, "hide.py", HIDE.format(pid_file=str(pid_file)))
    env.write_tool(env.global_tools, "snooze.json", SNOOZE)
    first: Daemon = make_daemon()
    owner = subprocess.Popen(["sleep", "300"])  # a live owner: its bridge must still be swept
    try:
        with first.raw() as raw:
            raw.request("atomic/attach", {"directory": str(env.project)})
            created = [raw.request("atomic/bridges/create", params)["result"] for params in (
                {"agent": "claude"}, {"agent": "codex", "allow": ["f_*"]}, {"agent": "generic", "ownerPid": owner.pid},
            )]
        bridges = [Path(b["path"]) for b in created]
        assert all(path.exists() for path in bridges)

        # Two calls that will be running when the daemon dies: one whose tool hid its children,
        # one whose command the shell handler runs in a session of its own.
        busy = [first.raw(), first.raw()]
        busy[0].send({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "hide", "arguments": {}}})
        busy[1].send({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "snooze", "arguments": {}}})
        hidden = wait_for(lambda: (lambda p: p if "daemonized" in p else None)(noted(pid_file)), message="hidden children")
        command = wait_for(
            lambda: sleepers(["sleep", SNOOZE_SECONDS]),
            message="the shell command to run",
        )

        outcomes = {"ok": 0, "wrong": 0, "cut": 0, "connect_failed": 0}
        stop = threading.Event()
        threads = [threading.Thread(target=_hammer, args=(first, stop, outcomes)) for _ in range(8)]
        for thread in threads:
            thread.start()
        wait_for(lambda: outcomes["ok"] > 200, message="load to build up")
        with first.client() as client:
            workers = [m["worker"] for m in client.status()["modules"] if m["worker"]]
        first.kill()
        for thread in threads:
            thread.join(10)
        stop.set()
        for raw in busy:
            raw.close()
        assert outcomes["wrong"] == 0 and outcomes["connect_failed"] == 0, outcomes
        assert first.leftovers() == [], "no worker or fork server outlives a killed daemon"
        orphans = {pid: kind for kind, pid in hidden.items() if alive(pid)}
        orphans.update({p.pid: "shell command" for p in command if alive(p.pid)})
        wait_for(lambda: not any(alive(pid) for pid in orphans), timeout=5,
                 message=f"what the tools started to die with the daemon: {orphans}")
        assert all(path.exists() for path in bridges), "a killed daemon cannot clean up: the sweep has work"
        # What a kill between writing the next manifest and renaming it into place leaves behind.
        (env.runtime_dir / f".bridges.json.{first.pid}").write_text(f'{{"pid": {first.pid}, "bridges": []}}')

        second: Daemon = make_daemon()
        with second.client() as client:
            assert client.call("f_work", n=21).text == "42"
            assert client.request("atomic/bridges/list") == {"bridges": []}
            assert client.status()["bridges"] == []
        assert [path for path in bridges if path.exists()] == [], "the next daemon swept every stale bridge"
        assert sorted(os.listdir(env.runtime_dir)) == ["atomictoolsd.lock", "atomictoolsd.sock"], "nothing else is left"
        assert stat.S_IMODE(os.stat(env.socket).st_mode) == 0o600
    finally:
        owner.kill()
        owner.wait()
        for process in locals().get("command", []):
            if alive(process.pid):
                process.kill()
    record(
        f"kill -9 after {outcomes['ok']} calls by 8 clients with 3 bridges and 2 calls in flight: "
        f"{outcomes['cut']} connections cut, 0 wrong answers; fork server, {len(workers)} workers and the "
        f"{len(hidden) - 1 + len(command)} processes their tools started all gone; restart swept 3 bridges and served at once"
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


def test_fork_server_killed_under_load(env: Env, make_daemon, record) -> None:  # type: ignore[no-untyped-def]
    """The process every worker comes from dies: calls in flight end as errors naming the death, its
    workers die with it, and the next calls get a new fork server and new workers."""
    env.write_tool(env.global_tools, "f.py", TOOLS)
    daemon: Daemon = make_daemon()
    outcomes = {"ok": 0, "wrong": 0, "failed": 0, "cut": 0, "connect_failed": 0}
    failures: list[str] = []
    stop = threading.Event()

    def hammer() -> None:
        with daemon.client() as client:
            n = 0
            while not stop.is_set():
                n += 1
                result = client.call("f_work", n=n)
                if result.is_error:
                    outcomes["failed"] += 1
                    failures.append(result.text)
                else:
                    outcomes["ok" if result.text == str(n * 2) else "wrong"] += 1

    with daemon.client() as client:
        client.call("f_work", n=1)
        old = client.status()["forkserver"]["pid"]
        old_workers = [m["worker"] for m in client.status()["modules"] if m["worker"]]
        threads = [threading.Thread(target=hammer) for _ in range(6)]
        for thread in threads:
            thread.start()
        wait_for(lambda: outcomes["ok"] > 200, message="load to build up")
        os.kill(old, signal.SIGKILL)
        wait_for(lambda: not any(alive(pid) for pid in old_workers), timeout=10, message="the old workers to die")
        seen = outcomes["ok"]
        wait_for(lambda: outcomes["ok"] > seen + 200, timeout=30, message="calls to succeed again")
        stop.set()
        for thread in threads:
            thread.join(15)
        new = client.status()["forkserver"]["pid"]
    assert new not in (None, old) and alive(new)
    assert outcomes["wrong"] == 0, outcomes
    # The daemon names the cause: the worker went with its fork server (PR_SET_PDEATHSIG's SIGKILL).
    assert all(text == "Tool 'f_work' failed: its worker process was killed with the fork server" for text in failures), set(failures)
    assert daemon.proc.poll() is None
    record(f"fork server SIGKILLed under 6 clients: {outcomes['failed']} calls in flight answered isError naming "
           f"the fork server's death, its {len(old_workers)} worker(s) gone, {outcomes['ok']} calls right, a new fork server served at once")


def test_a_tool_that_hides_its_children_and_hangs_loses_them_all(env: Env, make_daemon, record, pid_file: Path) -> None:  # type: ignore[no-untyped-def]
    env.write_tool(env.global_tools, "hide.py", HIDE.format(pid_file=str(pid_file)))
    env.write_tool(env.global_tools, "other.py", "def other() -> str:\n    return 'unaffected'\n")
    daemon: Daemon = make_daemon({"ATOMICTOOLS_CANCEL_GRACE": "0.3"})
    gone_after = []
    with daemon.client() as client:
        for _round in range(2):  # the module serves again from a fresh worker, which is cleaned up too
            pid_file.unlink(missing_ok=True)
            result = client.call_tool("hide", {}, timeout=1.0)
            assert result.is_error and result.text == "Tool 'hide' timed out after 1 s", result.text
            hidden = noted(pid_file)
            assert len(hidden) == 8, hidden
            started = time.monotonic()
            wait_for(lambda h=hidden: not any(alive(pid) for pid in h.values()), timeout=10,
                     message=f"every process the tool started to be gone: {hidden}")
            gone_after.append(time.monotonic() - started)
            assert client.call("other").text == "unaffected"
    assert daemon.proc.poll() is None
    record(
        f"2 timed-out calls of a tool that started 7 processes 6 ways (same group, fork, new session, new group, "
        f"a shell ignoring SIGTERM, a double-fork daemon): all 16 processes gone within {max(gone_after):.1f} s"
    )


HOG = '''
    import mmap, os, resource, time
    from atomictools import Context, tool

    @tool
    def creep() -> str:
        """Grow a megabyte at a time until something gives."""
        hoard = []
        while True:
            hoard.append(bytearray(1 << 20))

    @tool
    async def burst(mb: int) -> str:
        return str(len(bytearray(mb << 20)))

    @tool
    def unlimited(mb: int) -> str:
        """Lift the rlimit (root may), else use memory it does not count: only the RSS watch is left."""
        try:
            resource.setrlimit(resource.RLIMIT_DATA, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
            region = bytearray(mb << 20)
        except (ValueError, OSError):
            region = mmap.mmap(-1, mb << 20)
            for offset in range(0, len(region), 4096):
                region[offset] = 1
        time.sleep(30)
        return str(len(region))

    @tool
    def huge(n: int) -> list[int]:
        return list(range(n))

    @tool
    def chatty(n: int, ctx: Context) -> str:
        for _ in range(n):
            ctx.log("info", "x" * 2000)
        return f"logged {n}"
'''


def test_tools_that_exhaust_memory_never_reach_the_daemon(env: Env, make_daemon, record) -> None:  # type: ignore[no-untyped-def]
    env.write_tool(env.global_tools, "hog.py", HOG)
    env.write_tool(env.global_tools, "f.py", TOOLS)
    limit = "the worker memory limit of 150 MiB (memory_limit_mb)"
    daemon: Daemon = make_daemon({"ATOMICTOOLS_MEMORY_LIMIT_MB": "150", "ATOMICTOOLS_MAX_MESSAGE_BYTES": str(4 << 20)})
    process = psutil.Process(daemon.pid)
    peak = [0]
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.is_set():
            peak[0] = max(peak[0], process.memory_info().rss)
            time.sleep(0.005)

    with daemon.client() as client:
        assert client.call("hog_burst", mb=1).text == str(1 << 20)
        assert client.call("f_work", n=1).text == "2"
        before = process.memory_info().rss
        sampler = threading.Thread(target=sample)
        sampler.start()
        try:
            creep = client.call("hog_creep")
            assert creep.is_error and creep.text == f"Tool 'hog_creep' ran out of memory: it tried to allocate past {limit}"
            burst = client.call("hog_burst", mb=400)
            assert burst.is_error and burst.text == f"Tool 'hog_burst' ran out of memory: it tried to allocate past {limit}"
            unlimited = client.call("hog_unlimited", mb=300)
            assert unlimited.is_error and "its worker process was killed for using" in unlimited.text and limit in unlimited.text
            huge = client.call("hog_huge", n=700_000)
            assert huge.is_error and "more than the 4,194,304 bytes a message may carry (max_message_bytes)" in huge.text
            spilled = Path(huge.text.rsplit("the whole result is in ", 1)[1])
            huge_mb = spilled.stat().st_size / 1e6
            assert spilled.stat().st_size > 4 << 20 and stat.S_IMODE(spilled.stat().st_mode) == 0o600
            spilled.unlink()

            # 100 MB of log notifications for a client that has stopped reading.
            def calls() -> int:
                return next(m["calls"] for m in client.status()["modules"] if m["path"].endswith("hog.py"))

            calls_before = calls()
            with daemon.raw() as stalled:
                stalled.send({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                              "params": {"name": "hog_chatty", "arguments": {"n": 50_000}}})
                wait_for(lambda: calls() > calls_before, timeout=60, message="the chatty call to finish")
                stalled_rss = process.memory_info().rss
                assert stalled_rss - before < 48 << 20, f"daemon RSS {before / 1e6:.0f} → {stalled_rss / 1e6:.0f} MB under the log flood"
                logs, dropped, answer = 0, 0, None
                while answer is None:
                    message = stalled.recv()
                    if message.get("id") == 1:
                        answer = message["result"]["content"][0]["text"]
                    elif message["params"]["level"] == "warning":
                        dropped = int(message["params"]["data"].split()[0])
                    else:
                        logs += 1
                assert answer == "logged 50000"
                if not dropped:  # the warning comes once the backlog has drained: after the answer
                    warning = stalled.recv()
                    dropped = int(warning["params"]["data"].split()[0])
                assert dropped > 0 and logs + dropped == 50_000, (logs, dropped)
            assert client.call("f_work", n=21).text == "42", "the other module never noticed"
        finally:
            sampling.set()
            sampler.join()
    after = process.memory_info().rss
    assert daemon.proc.poll() is None
    assert peak[0] - before < 64 << 20, f"daemon RSS peaked at {peak[0] / 1e6:.0f} MB (from {before / 1e6:.0f})"
    record(
        f"5 ways to exhaust memory (1 MiB at a time, a 400 MiB async burst, 300 MiB past a lifted rlimit, "
        f"a {huge_mb:.1f} MB result over a 4 MiB message limit, 100 MB of logs to a client not reading): each an "
        f"isError naming its limit, or {dropped} logs dropped and counted; daemon RSS {before / 1e6:.0f} → peak "
        f"{peak[0] / 1e6:.0f} → {after / 1e6:.0f} MB"
    )
