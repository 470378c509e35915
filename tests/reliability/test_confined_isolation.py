"""One project's confined tools cannot delay or end another project's: a setsid'd fork chain that
its fork server adopts, and that fork server stopped outright.

What holds: another project's call in flight answers with its own result, its built-ins and its new
modules answer within seconds, and its workers and fork server are the same ones after; the
project's own new modules answer too while the chain runs; no fork server is replaced for the chain.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from atomictools import Client
from atomictoolsd.worker.sandbox import REQUIRED_ABI, kernel_abi
from helpers import Daemon, Env, wait_for

pytestmark = pytest.mark.skipif(
    kernel_abi() < REQUIRED_ABI,
    reason=f"this machine's kernel offers Landlock ABI {kernel_abi()}; confining workers needs ABI {REQUIRED_ABI}",
)

# Chains of processes (``chains`` at once), each in a session of its own, each forking the next and
# exiting, for ``seconds`` or until the file ``stop`` exists; the tool then ends its worker, so that
# every later member is adopted by the fork server (each one's parent has exited, and the worker,
# their subreaper, is gone).
CHAIN = '''
    import os, time

    def chain(seconds: float, chains: int, stop: str) -> str:
        deadline = time.monotonic() + seconds
        for _ in range(chains):
            if os.fork() == 0:
                while time.monotonic() < deadline and not os.path.exists(stop):
                    if os.fork() != 0:
                        os._exit(0)
                    os.setsid()
                os._exit(0)
        time.sleep(0.5)
        os._exit(0)
'''

NAP = '''
    import os, time

    def nap(seconds: float) -> str:
        time.sleep(seconds)
        return f"rested in {os.getpid()}"
'''

FRESH = '''
    def {name}() -> str:
        return "fresh"
'''


def cli(env: Env, *args: str) -> subprocess.CompletedProcess[str]:
    if args[:1] == ("trust",):
        args = (*args, "--yes")  # no terminal here: trust asks for one otherwise
    return subprocess.run([sys.executable, "-m", "atomictoolsd", *args], env=env.vars, cwd=env.project,
                          capture_output=True, text=True, timeout=60)


def _two_confined_projects(env: Env) -> tuple[Path, Path]:
    """The test's project (the attacker's) and another, both trusted with --sandbox, with their
    built-ins (confined to each)."""
    env.set_trust_all(False)
    del env.vars["ATOMICTOOLS_BUILTINS"]
    other = env.root / "other"
    (other / ".atomic" / "tools").mkdir(parents=True)
    env.write_tool(env.local_tools, "chain.py", CHAIN)
    env.write_tool(other / ".atomic" / "tools", "nap.py", NAP)
    for project in (env.project, other):
        assert cli(env, "trust", "--sandbox", str(project)).returncode == 0
    return env.project, other


def _fork_servers(client: Client) -> dict[str, dict[str, Any]]:
    return {entry["project"]: entry for entry in client.status()["confinedForkservers"]}


def _nap_in_flight(client: Client, seconds: float) -> tuple[threading.Thread, list[str]]:
    answer: list[str] = []

    def call() -> None:
        result = client.call("nap", seconds=seconds)
        answer.append(result.text)

    thread = threading.Thread(target=call)
    thread.start()
    return thread, answer


def _timed_call(client: Client, name: str, **arguments: Any) -> float:
    started = time.monotonic()
    result = client.call(name, **arguments)
    assert not result.is_error, result.text
    return time.monotonic() - started


def _first_answer(env: Env, client: Client, tools_dir: Path, name: str) -> float:
    """Seconds from writing a new module to its first answer (a worker spawned for it)."""
    started = time.monotonic()
    env.write_tool(tools_dir, f"{name}.py", FRESH.format(name=name))
    wait_for(lambda: name in {t["name"] for t in client.list_tools()}, timeout=15, message=f"{name} to be listed")
    assert client.call(name).text == "fresh"
    return time.monotonic() - started


def test_a_fork_chain_delays_no_project(env: Env, make_daemon, record) -> None:  # type: ignore[no-untyped-def]
    # The chain runs until every timing is taken (at most its 10 s): then this file tells it to end.
    stop = env.project / "chain" / "stop"
    stop.parent.mkdir()
    attacker, other = _two_confined_projects(env)
    daemon: Daemon = make_daemon()
    with daemon.client(directory=other) as victim, daemon.client(directory=other) as caller, \
            daemon.client(directory=attacker) as client:
        first = victim.call("nap", seconds=0).text
        thread, answer = _nap_in_flight(victim, 8)
        wait_for(lambda: any(m["inflight"] for m in caller.status()["modules"]), message="the nap to start")
        before = _fork_servers(caller)
        chained = client.call("chain", seconds=10, chains=32, stop=str(stop))
        assert chained.is_error and "exited with code 0" in chained.text, chained.text
        time.sleep(1)  # the chain runs, adopted by the attacker's fork server
        timings = {
            "a new module of the chain's project": _first_answer(env, client, env.local_tools, "fresh_here"),
            "a new module of the other project": _first_answer(env, caller, other / ".atomic" / "tools", "fresh_there"),
            "the other project's built-in": _timed_call(caller, "workspace-info"),
        }
        stop.write_text("")
        thread.join(30)
        after = _fork_servers(caller)
    assert answer and answer[0] == first, f"the other project's call in flight: {answer}"
    assert all(seconds < 5 for seconds in timings.values()), timings
    for project, entry in after.items():
        assert entry["replaced"] == 0 and entry["lost"] == 0, (project, entry)
    assert after[str(other)]["pid"] == before[str(other)]["pid"]
    record("a setsid'd fork chain adopted by a confined fork server, while it ran: the other project's call in flight "
           "answered from the same worker; " + ", ".join(f"{what} {s:.2f} s" for what, s in timings.items())
           + "; no fork server replaced")


def test_one_projects_fork_server_stopped_ends_no_other_projects_worker(env: Env, make_daemon, record) -> None:  # type: ignore[no-untyped-def]
    attacker, other = _two_confined_projects(env)
    env.write_tool(env.local_tools, "nap.py", NAP)
    daemon: Daemon = make_daemon()
    stopped: list[int] = []
    try:
        with daemon.client(directory=other) as victim, daemon.client(directory=other) as caller, \
                daemon.client(directory=attacker) as client:
            first = victim.call("nap", seconds=0).text
            assert client.call("nap", seconds=0).text != first
            servers = _fork_servers(caller)
            assert servers[str(attacker)]["pid"] != servers[str(other)]["pid"], servers
            thread, answer = _nap_in_flight(victim, 6)
            wait_for(lambda: any(m["inflight"] for m in caller.status()["modules"]), message="the nap to start")
            os.kill(servers[str(attacker)]["pid"], signal.SIGSTOP)
            stopped.append(servers[str(attacker)]["pid"])
            wait_for(lambda: _fork_servers(caller)[str(attacker)]["replaced"] >= 1, timeout=10,
                     message="the stopped fork server to be replaced")
            took = _timed_call(caller, "workspace-info")
            thread.join(30)
            assert client.call("nap", seconds=0).text.startswith("rested"), "the stopped one's project is served again"
            after = _fork_servers(caller)
    finally:
        for pid in stopped:
            try:
                if psutil.Process(pid).status() == psutil.STATUS_STOPPED:
                    os.kill(pid, signal.SIGCONT)
            except psutil.NoSuchProcess:
                pass
    assert answer == [first], f"the other project's call in flight: {answer}"
    assert after[str(other)] == {**servers[str(other)], "workers": after[str(other)]["workers"]}, (servers, after)
    record(f"one project's confined fork server stopped and replaced: the other project's call in flight answered "
           f"from the same worker, its built-in in {took:.2f} s, its fork server untouched")
