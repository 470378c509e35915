"""``atomictoolsd status`` as a person and a script read it: short, within the terminal's width,
details behind --verbose; --json with every section; a setting's source true to
where its value in force came from."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from typing import Any

from helpers import Env, RawConnection, wait_for

LONG = "a-project-whose-name-goes-on-and-on-" * 3


def cli(env: Env, *args: str, columns: int | None = None, cwd: Any = None) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in env.vars.items() if k != "COLUMNS"}
    if columns is not None:
        environ["COLUMNS"] = str(columns)
    return subprocess.run([sys.executable, "-m", "atomictoolsd", *args], env=environ, cwd=cwd or env.root,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)


def own_lines(out: str) -> list[str]:
    """The lines of this daemon's status (other tests' daemons, listed at the end, vary)."""
    lines = out.splitlines()
    return lines[: next((i for i, line in enumerate(lines) if line.startswith("other daemons of yours")), len(lines))]


def test_status_is_short_and_fits_the_terminal(env: Env, make_daemon: Any) -> None:
    projects = [env.root / name for name in ("alpha", "beta", LONG)]
    for project in projects:
        for stem in ("lint", "fmt", "test"):
            env.write_tool(project / ".atomic" / "tools", f"{stem}.py", f"def {stem}(path: str) -> str:\n    return path\n")
    env.write_tool(project / ".atomic" / "tools", "broken.py", "def broken(:\n")
    env.write_tool(env.global_tools, "greet.py", "def greet(name: str) -> str:\n    return name\n")
    daemon = make_daemon({"ATOMICTOOLS_HTTP": "127.0.0.1:0"})
    for project in projects:
        with daemon.client(project) as client:
            client.call("lint", path="x")

    for columns in (100, 72):
        out = cli(env, "status", columns=columns)
        assert out.returncode == 0, out.stderr
        lines = own_lines(out.stdout)
        assert max(map(len, lines)) <= columns, out.stdout
        # Long temporary paths (pytest-xdist adds a level) wrap the log line at 72 columns: a bound
        # that says "a screenful", not "one line per module".
        assert len(lines) <= 34, out.stdout
        table = [line.split() for line in lines if line.startswith("PROJECT ") or line.split(" ", 1)[0].endswith("/alpha")]
        assert table[0] == ["PROJECT", "TRUST", "MODULES", "TOOLS"] and table[1][1:] == ["trusted", "3", "4"], out.stdout
        assert any(f"{LONG[-20:]}  trusted  4 (1 failed)" in line for line in lines), out.stdout
        assert any("broken.py:1: SyntaxError" in line for line in lines), "a load error is a problem, said at once"
        assert not any(line.startswith("MODULE ") for line in lines) and "watcher" not in lines, "details: --verbose"

    for columns in (100, 60):
        verbose = cli(env, "status", "--verbose", columns=columns)
        lines = own_lines(verbose.stdout)
        assert max(map(len, lines)) <= columns, verbose.stdout
        assert any(line.startswith("MODULE ") for line in lines) and "watcher" in lines and "monitor" in lines
    assert sum(line.startswith("MODULE ") for line in lines) >= 2, "a table too wide for the terminal is wrapped"
    piped = cli(env, "status")  # no terminal, no COLUMNS: nothing is cut for a script
    assert str(projects[2] / ".atomic" / "tools" / "broken.py") in piped.stdout


def test_status_json_holds_every_section(env: Env, make_daemon: Any) -> None:
    env.write_tool(env.global_tools, "greet.py", "def greet(name: str) -> str:\n    return name\n")
    daemon = make_daemon({"ATOMICTOOLS_HTTP": "127.0.0.1:0"})
    with daemon.client() as client:
        client.call("greet", name="x")
    with RawConnection(env.socket) as raw:
        raw.request("atomic/bridges/create", {"agent": "claude", "directory": str(env.project)})
    daemon.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: json.loads(cli(env, "status", "--json").stdout).get("reload"), message="the reload")
    status = json.loads(cli(env, "status", "--json").stdout)
    assert status["modules"] and status["bridges"] and status["http"]["url"] and status["watcher"]

    seen: set[str] = set()

    def check(value: Any) -> None:
        if isinstance(value, list):
            for item in value:
                check(item)
        elif isinstance(value, dict):
            seen.update(value)
            for item in value.values():
                check(item)

    check(status)
    assert {"configSources", "configFile", "tokenFile", "failedCalls", "p50Ms", "ownerPid"} <= seen


def test_a_setting_waiting_for_a_restart_keeps_the_source_of_the_value_in_force(env: Env, make_daemon: Any) -> None:
    """The file asks for http and builtins after the daemon started: they wait for a restart, and
    the values in force (the defaults) are not said to come from the file."""
    env.vars.pop("ATOMICTOOLS_BUILTINS")
    config = env.write_config()
    daemon = make_daemon()
    config.write_text(config.read_text() + 'builtins = false\nhttp = "127.0.0.1:0"\ncall_timeout = 7\n')
    daemon.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: json.loads(cli(env, "status", "--json").stdout).get("reload"), message="the reload")
    status = json.loads(cli(env, "status", "--json").stdout)
    assert status["reload"]["waiting"] == {"builtins": False, "http": "127.0.0.1:0"}
    assert (status["config"]["builtins"], status["config"]["http"]) == (True, "")
    assert "builtins" not in status["configSources"] and "http" not in status["configSources"], status["configSources"]
    assert status["configSources"]["call_timeout"] == str(config)  # what did apply is the file's
    shown = cli(env, "status").stdout
    lines = shown.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("SETTING "))
    settings = [line.split()[0] for line in lines[start + 1:] if line[:1].isalpha()]
    assert "builtins" not in settings and "http" not in settings and "call_timeout" in settings, shown
    assert "builtins = false waits for a restart (in force: true" in shown
