"""What a new user meets in the first hour: errors that say what is wrong and what to do, the CLI's
help, output and exit codes, and the tool scaffold — each through a real daemon and the real command."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from mcp.shared.exceptions import MCPError

from atomictools import RPCError
from helpers import Daemon, Env, wait_for
from shim_helpers import mcp_session
from shim_helpers import run as run_async

GREET = '''
    def greet(name: str) -> str:
        """Greet someone."""
        return f"Hello, {name}!"
'''


def run(env: Env, *args: str, cwd: Path | None = None, extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "atomictoolsd", *args],
        env={**env.vars, **(extra or {})}, cwd=cwd or env.project, capture_output=True, text=True, timeout=60,
    )


# 1. Errors that say what is wrong


def test_a_call_of_a_tool_whose_module_failed_names_the_load_error_everywhere(env: Env, make_daemon: object) -> None:
    env.write_tool(env.global_tools, "greet.py", "\n\n\ndef greet(:\n    pass\n")
    daemon = make_daemon()  # type: ignore[operator]
    cli = run(env, "call", "greet", "name=Ada")
    assert cli.returncode == 2
    assert "greet.py:4: SyntaxError" in cli.stderr and "Unknown tool" not in cli.stderr

    with daemon.client() as client:
        with pytest.raises(RPCError) as raised:
            client.call("greet", name="Ada")
    assert raised.value.code == -32602 and "greet.py:4: SyntaxError" in raised.value.message
    assert raised.value.data["loadError"]["line"] == 4 and raised.value.data["loadError"]["file"].endswith("greet.py")

    async def over_mcp() -> None:
        async with mcp_session(env) as (session, _seen):
            with pytest.raises(MCPError) as failed:
                await session.call_tool("greet", {"name": "Ada"})
            assert "greet.py:4: SyntaxError" in failed.value.error.message

    run_async(over_mcp)


@pytest.mark.parametrize(("typed", "meant"), [("gret", "greet"), ("Greet", "greet"), ("git_status", "git-status")])
def test_an_unknown_tool_suggests_the_near_names(env: Env, make_daemon: object, typed: str, meant: str) -> None:
    env.write_tool(env.global_tools, "greet.py", GREET)
    daemon = make_daemon({"ATOMICTOOLS_BUILTINS": "1"})  # type: ignore[operator]
    cli = run(env, "call", typed)
    assert cli.returncode == 2 and f"did you mean {meant!r}?" in cli.stderr, cli.stderr
    with daemon.client() as client:
        with pytest.raises(RPCError) as raised:
            client.call(typed)
    assert meant in raised.value.data["suggestions"]
    assert f"did you mean {meant!r}?" in str(raised.value)


def test_a_misspelled_setting_is_answered_with_the_right_one(env: Env) -> None:
    config = env.root / "config" / "atomictools" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text("call_timout = 5\n")
    result = run(env, "config")
    assert result.returncode == 2
    assert "unknown setting 'call_timout'; did you mean 'call_timeout'?" in result.stderr
    assert "max_idle_workers" not in result.stderr  # not the whole list of settings


def test_a_file_with_no_tool_is_told_what_it_defines_and_what_to_do(env: Env, make_daemon: object) -> None:
    env.write_tool(env.global_tools, "my-tool.py", "def run() -> str:\n    return 'x'\n")
    env.write_tool(env.global_tools, "mismatch.py", "def hello() -> str:\n    return 'x'\n\ndef _private():\n    pass\n")
    make_daemon()  # type: ignore[operator]
    listing = json.loads(run(env, "list", "--json").stdout)
    errors = {Path(e["file"]).name: e["message"] for e in listing["errors"]}
    assert "'my-tool' cannot be a Python function name" in errors["my-tool.py"]
    assert "@tool(name='my-tool')" in errors["my-tool.py"] and "'my_tool'.py" in errors["my-tool.py"]
    assert "defines 'hello' but no function named 'mismatch'" in errors["mismatch.py"]
    assert "_private" not in errors["mismatch.py"]


def test_an_automatic_start_that_fails_leads_with_the_cause_in_one_line(env: Env) -> None:
    config = env.root / "config" / "atomictools" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text("call_timeout = 'never'\n")
    env.runtime_dir.mkdir(mode=0o700, parents=True)
    (env.runtime_dir / "atomictoolsd.stderr").write_text("atomictoolsd: a complaint of an earlier daemon\n")
    called = run(env, "call", "greet")
    assert called.returncode == 1
    first, *rest = called.stderr.splitlines()
    assert first.startswith("atomictoolsd: the daemon did not start: bad configuration: call_timeout (from "), first
    assert "expected a number" in first and not rest
    assert "earlier daemon" not in called.stderr

    probe = "from atomictools import Client, ConnectError\ntry:\n    Client().connect()\nexcept ConnectError as e:\n    print(e)\n"
    said = subprocess.run([sys.executable, "-c", probe], env=env.vars, capture_output=True, text=True, timeout=60)
    assert said.stdout.startswith("the daemon did not start: bad configuration: call_timeout"), said.stdout
    assert len(said.stdout.splitlines()) == 1


def test_status_tells_settings_in_force_from_those_waiting_and_a_config_that_failed(env: Env, make_daemon: object) -> None:
    env.vars.pop("ATOMICTOOLS_BUILTINS")
    config = env.root / "config" / "atomictools" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text("builtins = true\n")
    daemon = make_daemon()  # type: ignore[operator]
    config.write_text("builtins = false\ncall_timeout = 7\n")
    daemon.proc.send_signal(signal.SIGHUP)
    status = _status_once(env, "reloaded at")
    assert "builtins = false waits for a restart (in force: true" in status
    with daemon.client() as client:
        assert "git-status" in [t["name"] for t in client.list_tools()]  # what status says is in force
        assert client.status()["config"]["call_timeout"] == 7  # the rest applied at once

    config.write_text("builtins = [\n")
    daemon.proc.send_signal(signal.SIGHUP)
    status = _status_once(env, "NOT reloaded")
    assert "is not valid TOML" in status and "the previous configuration stays in force" in status
    assert "builtins = false waits for a restart" in status  # still waiting: the bad file changed nothing


def _status_once(env: Env, says: str) -> str:
    def status() -> str | None:
        out = run(env, "status").stdout
        return out if says in out else None

    return wait_for(status, timeout=20, message=f"status to say {says!r}")
