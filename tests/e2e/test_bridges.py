"""Bridge scripts: created by the daemon, used by agents, and never outliving the daemon."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from helpers import Daemon, Env, wait_for
from shim_helpers import SHIM, mcp_session, run

ECHO = '''
    def echo(text: str) -> str:
        """Echo the text back."""
        return text
'''
SHOUT = '''
    def shout(text: str) -> str:
        """Shout the text back."""
        return text.upper()
'''


@pytest.fixture
def tools_daemon(env: Env, make_daemon) -> Daemon:  # type: ignore[no-untyped-def]
    env.write_tool(env.global_tools, "echo.py", ECHO)
    env.write_tool(env.global_tools, "shout.py", SHOUT)
    return make_daemon()


def cli(env: Env, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([SHIM, *args], env=env.vars, cwd=env.project, capture_output=True, text=True, timeout=60)
    if check:
        assert done.returncode == 0, done.stderr
    return done


def create(env: Env, *args: str) -> dict[str, Any]:
    return json.loads(cli(env, "bridge", "create", "--json", *args).stdout)


def manifest(env: Env) -> Path:
    return env.runtime_dir / "bridges.json"


def bridges_dir(env: Env) -> Path:
    return env.runtime_dir / "bridges"


def test_create_prints_the_agents_snippet_and_the_bridge_serves_through_the_official_client(
    tools_daemon: Daemon, env: Env
) -> None:
    done = cli(env, "bridge", "create", "--agent", "claude", "--allow", "ec*", "--no-dispatcher")
    snippet = json.loads(done.stdout)  # stdout is exactly the snippet; the rest went to stderr
    entry = snippet["mcpServers"]["atomic"]
    assert entry["type"] == "stdio" and entry["args"] == [] and entry["env"] == {}
    path = Path(entry["command"])
    assert path.parent == bridges_dir(env) and os.access(path, os.X_OK)
    assert "claude mcp add" in done.stderr
    text = path.read_text()
    assert text.startswith(f"#!{sys.executable} -IS\n")
    assert str(env.project) in text and str(env.socket) in text and "'ec*'" in text
    recorded = json.loads(manifest(env).read_text())
    assert recorded["pid"] == tools_daemon.pid and [b["path"] for b in recorded["bridges"]] == [str(path)]

    async def scenario() -> None:
        async with mcp_session(env, command=str(path), cwd=env.root) as (session, _):
            assert [t.name for t in (await session.list_tools()).tools] == ["echo"]  # the baked allowlist
            assert (await session.call_tool("echo", {"text": "via bridge"})).content[0].text == "via bridge"

    run(scenario)


@pytest.mark.parametrize("agent", ["opencode", "codex", "copilot", "cursor", "gemini", "qwen", "vscode", "claude-desktop", "generic"])
def test_each_agent_gets_its_own_config_shape(tools_daemon: Daemon, env: Env, agent: str) -> None:
    bridge = create(env, "--agent", agent)
    path = bridge["path"]
    snippet = bridge["snippet"]
    if agent == "codex":
        assert snippet == f'[mcp_servers.atomic]\ncommand = "{path}"\nargs = []\n'
    elif agent == "opencode":
        assert json.loads(snippet)["mcp"]["atomic"] == {
            "type": "local", "command": [path], "environment": {}, "enabled": True,
        }
    elif agent == "copilot":
        assert json.loads(snippet)["mcpServers"]["atomic"] == {"type": "local", "command": path, "args": [], "tools": ["*"]}
    elif agent == "vscode":
        assert json.loads(snippet)["servers"]["atomic"] == {"type": "stdio", "command": path, "args": []}
    else:
        assert json.loads(snippet)["mcpServers"]["atomic"] == {"command": path, "args": []}


def test_list_and_remove(tools_daemon: Daemon, env: Env) -> None:
    first = create(env, "--agent", "cursor")
    second = create(env, "--agent", "codex")  # Codex never re-lists: the dispatcher by default
    listed = json.loads(cli(env, "bridge", "list", "--json").stdout)["bridges"]
    assert {b["id"] for b in listed} == {first["id"], second["id"]}
    assert "--dispatcher" in Path(second["path"]).read_text()
    assert "--dispatcher" not in Path(first["path"]).read_text()  # Cursor re-lists
    assert f"removed bridge {first['id']}" in cli(env, "bridge", "remove", first["id"]).stdout
    assert not Path(first["path"]).exists() and Path(second["path"]).exists()
    missing = cli(env, "bridge", "remove", "nope", check=False)
    assert missing.returncode == 2 and "no bridge with id" in missing.stderr
    cli(env, "bridge", "remove", "--all")
    assert not Path(second["path"]).exists()
    assert not manifest(env).exists() and not bridges_dir(env).exists()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_the_daemon_deletes_its_bridges_when_it_stops(tools_daemon: Daemon, env: Env, sig: int) -> None:
    paths = [Path(create(env, "--agent", agent)["path"]) for agent in ("claude", "cursor", "generic")]
    paths[1].unlink()  # deleted by hand meanwhile: the cleanup must not mind
    assert all(p.exists() for p in (paths[0], paths[2]))
    assert tools_daemon.stop(sig) == 0
    assert not any(p.exists() for p in paths)
    assert not manifest(env).exists() and not bridges_dir(env).exists()
    assert "Traceback" not in tools_daemon.stderr()


def test_a_normal_shutdown_deletes_the_bridges_too(tools_daemon: Daemon, env: Env) -> None:
    path = Path(create(env, "--agent", "opencode")["path"])
    cli(env, "stop")
    tools_daemon.proc.wait(timeout=30)  # type: ignore[union-attr]
    assert not path.exists() and not bridges_dir(env).exists()


def test_the_next_daemon_sweeps_the_bridges_of_a_killed_one(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    env.write_tool(env.global_tools, "echo.py", ECHO)
    first = make_daemon()
    paths = [Path(create(env, "--agent", agent)["path"]) for agent in ("claude", "codex")]
    stray = bridges_dir(env) / "notes.txt"  # not the daemon's: a sweep must leave it alone
    stray.write_text("mine")
    first.kill()
    assert all(p.exists() for p in paths) and manifest(env).exists()
    make_daemon()
    assert not any(p.exists() for p in paths)
    assert not manifest(env).exists()
    assert stray.read_text() == "mine"  # so the dir stays, with only that file
    assert [p.name for p in bridges_dir(env).iterdir()] == ["notes.txt"]


def test_a_bridge_goes_when_its_owner_exits(tools_daemon: Daemon, env: Env) -> None:
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        owned = create(env, "--agent", "claude", "--owner-pid", str(owner.pid))
        unowned = create(env, "--agent", "claude")
        assert Path(owned["path"]).exists() and owned["ownerPid"] == owner.pid
    finally:
        owner.kill()
        owner.wait()
    wait_for(lambda: not Path(owned["path"]).exists(), timeout=15, message="the owned bridge to go")
    assert Path(unowned["path"]).exists()
    listed = json.loads(cli(env, "bridge", "list", "--json").stdout)["bridges"]
    assert [b["id"] for b in listed] == [unowned["id"]]


def test_an_owner_that_does_not_exist_gets_no_bridge(tools_daemon: Daemon, env: Env) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    done = cli(env, "bridge", "create", "--agent", "claude", "--owner-pid", str(gone.pid), check=False)
    assert done.returncode == 2 and f"no process with pid {gone.pid}" in done.stderr
    assert not bridges_dir(env).exists() and not manifest(env).exists()


def test_bad_create_parameters_are_refused(tools_daemon: Daemon, env: Env) -> None:
    with tools_daemon.raw() as raw:
        for params, text in [
            ({"agent": "vim", "directory": str(env.project)}, "agent must be one of"),
            ({"agent": "claude", "directory": str(env.root / "missing")}, "not an existing absolute directory"),
            ({"agent": "claude", "directory": str(env.project), "name": "a.b"}, "server name"),
        ]:
            reply = raw.request("atomic/bridges/create", params)
            assert reply["error"]["code"] == -32602 and text in reply["error"]["message"], reply
    assert not bridges_dir(env).exists()


def test_an_interpreter_path_no_shebang_can_hold_still_works(tools_daemon: Daemon, env: Env) -> None:
    """Spaces (or a path too long for the kernel) in the interpreter's path: the bridge starts as sh."""
    from atomictoolsd.bridges.scripts import Bridge, bridge_script

    spaced = env.root / "my python" / "bin"
    spaced.mkdir(parents=True)
    (spaced / "python3").symlink_to(os.path.realpath(sys.executable))
    bridge = Bridge(id="t", path="", agent="generic", directory=str(env.project))
    text = bridge_script(bridge, python=str(spaced / "python3"), socket=str(env.socket),
                         runtime_dir=str(env.runtime_dir))
    assert text.startswith("#!/bin/sh\n")
    script = env.root / "bridge"
    script.write_text(text)
    script.chmod(0o700)
    done = subprocess.run(
        [str(script)], input=b'{"jsonrpc":"2.0","id":1,"method":"ping"}\n', capture_output=True, timeout=30,
        env=env.vars, cwd=env.root,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"jsonrpc": "2.0", "id": 1, "result": {}}
