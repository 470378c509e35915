"""What a person sees: ``status`` (table and JSON), ``logs`` and ``config``, after real calls,
failures, worker deaths and reloads (cli.daemon, cli.observe, eventlog, reconfigure)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from helpers import Daemon, Env, RawConnection, wait_for

TOOLS = '''
    import os
    from atomictools import tool

    @tool
    def greet(name: str) -> str:
        """Greet someone."""
        if name == "nobody":
            raise ValueError("nobody to greet")
        return f"Hello, {name}"

    @tool
    def crash() -> str:
        """Die mid-call."""
        os._exit(3)
'''


def run(env: Env, *args: str, extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "atomictoolsd", *args],
        env={**env.vars, **(extra or {})}, cwd=env.project, capture_output=True, text=True, timeout=60,
    )


def log_dir(env: Env) -> Path:
    return env.root / "state" / "atomictools" / "log"


def events(env: Env, *args: str) -> list[dict]:  # type: ignore[type-arg]
    result = run(env, "logs", "--json", *args)
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def wait_for_event(env: Env, predicate, message: str) -> list[dict]:  # type: ignore[no-untyped-def,type-arg]
    # The daemon flushes its log every quarter second.
    return wait_for(lambda: [e for e in events(env) if predicate(e)], timeout=15, interval=0.1, message=message)


def test_status_and_logs_reflect_calls_failures_deaths_and_reloads(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    module = env.write_tool(env.global_tools, "greet.py", TOOLS)
    daemon: Daemon = make_daemon()
    with daemon.client() as client:
        for name in ("Ada", "Bob", "Cy"):
            assert client.call("greet", name=name).text == f"Hello, {name}"
        failed = client.call("greet", name="nobody")
        assert failed.is_error
        status = client.status()
    (entry,) = status["modules"]
    assert entry["calls"] == 4 and entry["failedCalls"] == 1
    assert entry["p50Ms"] is not None and entry["p99Ms"] >= entry["p50Ms"]
    assert "greet: Tool 'greet' raised ValueError: nobody to greet" in entry["lastError"]
    worker = entry["worker"]
    assert worker and entry["workerState"] == "ready" and entry["state"] == "ready"
    assert psutil.Process(worker).is_running() and entry["rss"] > 1_000_000, "the worker's resident memory"

    table = run(env, "status", "--verbose")
    assert table.returncode == 0
    out = table.stdout
    assert f"pid {daemon.pid}" in out and f"socket    {env.socket}" in out and "service   none" in out
    header = next(line for line in out.splitlines() if line.startswith("MODULE"))
    assert header.split() == [
        "MODULE", "SCOPE", "STATE", "TOOLS", "WORKER", "RSS", "CALLS", "FAILED", "CANCELLED", "P50", "MS", "P99", "MS",
    ]
    row = next(line for line in out.splitlines() if line.startswith(str(module)))
    assert row.split()[1:9] == ["global", "ready", "2", str(worker), row.split()[5], "4", "1", "0"]
    assert row.split()[5].endswith("M")
    assert "last error: greet: Tool 'greet' raised ValueError: nobody to greet" in out
    assert "PROJECT" in out and str(env.project) in out

    started = wait_for_event(env, lambda e: e["event"] == "tool.failed", "the failed call in the log")
    (failure,) = started
    assert failure["tool"] == "greet" and failure["level"] == "warning" and failure["ms"] > 0
    assert "nobody to greet" in failure["error"]
    greet_events = events(env, "--tool", "greet")
    # Quick calls are one line each (a call still running at a flush also gets a tool.start line).
    assert [e["event"] for e in greet_events] == ["tool.complete"] * 3 + ["tool.failed"]
    assert all(e["module"] == str(module) and e["ms"] > 0 for e in greet_events if e["event"] != "tool.start")
    assert [e["event"] for e in events(env, "--tool", "greet", "--level", "warning")] == ["tool.failed"]
    human = run(env, "logs", "--tool", "greet", "-n", "1")
    assert human.stdout.count("\n") >= 1 and "WARNING  tool.failed" in human.stdout and "tool=greet" in human.stdout

    # A worker that dies mid-call: the death and its cause are logged, and the next call respawns.
    with daemon.client() as client:
        crashed = client.call("greet_crash")
        assert crashed.is_error and "exited with code 3" in crashed.text
        assert client.call("greet", name="again").text == "Hello, again"
    death = wait_for_event(env, lambda e: e["event"] == "worker.exit" and e["pid"] == worker, "the worker's death")
    assert death[0]["level"] == "warning" and death[0]["cause"] == "exited with code 3"
    spawns = wait_for_event(env, lambda e: e["event"] == "worker.spawn", "two spawns")
    assert len(spawns) >= 2 and all(e["module"] == str(module) and e["ms"] > 0 for e in spawns)

    # A reload (SIGHUP) after an edit: the module's reload and the daemon's, with their timings.
    module.write_text(module.read_text().replace("Hello", "Hi"))
    os.kill(daemon.pid, signal.SIGHUP)
    reload_event = wait_for_event(env, lambda e: e["event"] == "daemon.reload", "the reload")[0]
    assert reload_event["tools"] == 2 and reload_event["ms"] > 0
    module_reload = [e for e in events(env, "--event", "module.") if e["event"] == "module.reload"]
    assert module_reload and module_reload[0]["path"] == str(module) and module_reload[0]["ms"] > 0
    loads = [e for e in events(env, "--event", "module.load")]
    assert loads and loads[0]["tools"] == ["greet", "greet_crash"]
    with daemon.client() as client:
        assert client.call("greet", name="x").text == "Hi, x"


def test_logs_follow_across_rotation(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    env.write_tool(env.global_tools, "greet.py", TOOLS)
    env.write_config("log_max_bytes = 4096\nlog_backups = 1\n")
    daemon = make_daemon()
    follower = subprocess.Popen(
        [sys.executable, "-m", "atomictoolsd", "logs", "-f", "--json", "--tool", "greet"],
        env=env.vars, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    seen: list[dict] = []  # type: ignore[type-arg]

    def read() -> None:
        assert follower.stdout is not None
        for line in follower.stdout:
            seen.append(json.loads(line))

    try:
        threading.Thread(target=read, daemon=True).start()
        current = log_dir(env) / "atomictoolsd.log"
        wait_for(current.exists, message="the log")
        first_inode = current.stat().st_ino
        calls = 0
        with daemon.client() as client:
            # Two events of ~250 bytes per call, written in batches every quarter second: keep
            # calling until the 4 KiB log has rotated.
            deadline = time.monotonic() + 30
            while calls < 40 or current.stat().st_ino == first_inode:
                client.call("greet", name=f"n{calls}")
                calls += 1
                assert time.monotonic() < deadline, "the log never rotated"
            wait_for(lambda: sum(e["event"] == "tool.complete" for e in seen) >= calls, timeout=20,
                     message="every completed call, through the rotations")
    finally:
        # SIGKILL: a run started in the background inherits SIGINT as ignored, and then the follower
        # would outlive the test. What it printed is read already; how it ends does not matter.
        follower.kill()
        follower.wait(10)
    ids = [e["call"] for e in seen if e["event"] == "tool.complete"]
    assert len(ids) == len(set(ids)) == calls, "each event once, none lost at a rotation"
    assert (log_dir(env) / "atomictoolsd.log.1").exists() and not (log_dir(env) / "atomictoolsd.log.2").exists()
    daemon.stop()


def test_config_shows_values_and_where_each_came_from(env: Env) -> None:
    config = env.write_config("call_timeout = 5\npage_size = 10\n")
    result = run(env, "config", "--json", extra={"ATOMICTOOLS_CALL_TIMEOUT": "7.5"})
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)
    assert shown["file"] == str(config) and shown["exists"]
    by_key = {item["key"]: item for item in shown["settings"]}
    assert (by_key["call_timeout"]["value"], by_key["call_timeout"]["source"]) == (7.5, "ATOMICTOOLS_CALL_TIMEOUT")
    assert (by_key["page_size"]["value"], by_key["page_size"]["source"]) == (10, str(config))
    assert (by_key["truncate_lines"]["value"], by_key["truncate_lines"]["source"]) == (2000, "default")
    table = run(env, "config", extra={"ATOMICTOOLS_CALL_TIMEOUT": "7.5"}).stdout
    assert f"config file: {config}\n" in table
    row = next(line for line in table.splitlines() if line.startswith("call_timeout"))
    assert row.split()[:3] == ["call_timeout", "7.5", "ATOMICTOOLS_CALL_TIMEOUT"]

    config.write_text("page_size = 'many'\n")
    bad = run(env, "config")
    assert bad.returncode == 2
    assert f"bad configuration: page_size (from {config}): expected an integer, got 'many'" in bad.stderr


def test_status_shows_the_running_configuration_and_its_sources(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    config = env.write_config("page_size = 10\n")
    make_daemon({"ATOMICTOOLS_CALL_TIMEOUT": "9"})
    with RawConnection(env.socket) as raw:
        status = raw.request("atomic/status")["result"]
    assert status["config"]["page_size"] == 10 and status["config"]["call_timeout"] == 9.0
    sources = status["configSources"]
    assert (sources["page_size"], sources["call_timeout"]) == (str(config), "ATOMICTOOLS_CALL_TIMEOUT")
    assert "truncate_lines" not in sources, "only the settings not at their defaults"
    out = run(env, "status").stdout
    assert any(line.split() == ["page_size", "10", str(config)] for line in out.splitlines()), out
    assert any(line.split() == ["call_timeout", "9.0", "ATOMICTOOLS_CALL_TIMEOUT"] for line in out.splitlines())


def test_status_prints_sections_other_parts_add() -> None:
    # Bridges (another part of the daemon) add their own status section; the table shows any such.
    from atomictoolsd.cli.status import render

    status = {
        "pid": 1, "version": "0", "uptime": 5, "socket": "/s", "forkserver": {"pid": None, "workers": 0},
        "sessions": [], "projects": [], "modules": [], "config": {}, "configSources": {},
        "bridges": [{"agent": "claude", "path": "/run/b/claude"}],
    }
    out = "\n".join(render(status, verbose=True))
    assert "AGENT   PATH" in out and "claude  /run/b/claude" in out


def test_logs_into_a_closed_pipe_ends_quietly(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    env.write_tool(env.global_tools, "greet.py", TOOLS)
    daemon = make_daemon()
    with daemon.client() as client:
        for i in range(300):
            client.call("greet", name=f"n{i}")
    wait_for_event(env, lambda e: e["event"] == "tool.complete" and e["call"] >= 300, "the calls in the log")
    piped = subprocess.run(
        f"{sys.executable} -m atomictoolsd logs | head -n 1", shell=True, env=env.vars,
        capture_output=True, text=True, timeout=60,
    )
    assert piped.stdout.count("\n") == 1 and piped.stderr == ""


def test_status_lists_the_bridges(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    make_daemon()
    with RawConnection(env.socket) as raw:
        assert raw.request("atomic/status")["result"]["bridges"] == []
        created = raw.request(
            "atomic/bridges/create", {"agent": "claude", "directory": str(env.project), "ownerPid": os.getpid()}
        )["result"]
        bridges = raw.request("atomic/status")["result"]["bridges"]
    assert bridges == [{
        "id": created["id"], "agent": "claude", "directory": str(env.project), "ownerPid": os.getpid(),
        "path": created["path"],
    }]
    out = run(env, "status", "--verbose").stdout
    header = next(line for line in out.splitlines() if line.startswith("ID "))
    assert header.split() == ["ID", "AGENT", "DIRECTORY", "OWNER", "PID", "PATH"]
    assert any(line.split() == [created["id"], "claude", str(env.project), str(os.getpid()), created["path"]]
               for line in out.splitlines())


def test_a_log_dir_that_cannot_be_made_costs_the_event_log_not_the_daemon(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    blocker = env.root / "not-a-dir"
    blocker.write_text("a file where the log dir should go")
    env.write_tool(env.global_tools, "echo.py", "def echo(text: str) -> str:\n    return text\n")
    daemon = make_daemon({"ATOMICTOOLS_LOG_DIR": str(blocker / "logs")})
    with daemon.client() as client:
        assert client.call("echo", text="still serving").text == "still serving"
    assert "no event log" in daemon.stderr()
