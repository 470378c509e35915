"""Agents that start the shim with a scrubbed environment (Codex, Claude Desktop and the MCP SDKs
drop XDG_RUNTIME_DIR) reach the one daemon the user's CLI talks to, and a XDG_RUNTIME_DIR open to
other users is refused everywhere, never replaced by another directory."""

from __future__ import annotations

import json
import os
import subprocess
import tomllib

import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.stdio import get_default_environment

from atomictools import Client, ConnectError
from helpers import Env, stop_detached
from shim_helpers import SHIM, run


def cli(env: Env, *args: str, environ: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SHIM, *args], env=environ or env.vars, cwd=env.project, capture_output=True, text=True,
                          timeout=60)


def sessions_of(env: Env) -> list[dict[str, object]]:
    done = cli(env, "status", "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["sessions"]


def agent_sees_the_clis_daemon(env: Env, command: str, args: list[str], entry_env: dict[str, str], agent: str) -> None:
    """Start ``command`` as the MCP SDK does by default (its scrubbed environment plus the entry's)."""
    scrubbed = get_default_environment()
    assert "XDG_RUNTIME_DIR" not in scrubbed and not any(k.startswith("ATOMICTOOLS_") for k in scrubbed)
    params = StdioServerParameters(command=command, args=args, env=entry_env, cwd=str(env.project))

    async def scenario() -> None:
        with open(env.root / "shim.stderr", "a") as errlog:
            async with stdio_client(params, errlog=errlog) as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    tools = await session.list_tools()
                    assert "echo" in {t.name for t in tools.tools}
                    assert agent in {s["agent"] for s in sessions_of(env)}, "attached to the CLI's daemon"

    run(scenario)


def test_a_connected_entry_and_a_bridge_reach_the_clis_daemon_from_a_scrubbed_environment(detached: Env) -> None:
    env = detached
    env.write_tool(env.global_tools, "echo.py", "def echo(text: str) -> str:\n    return text\n")
    assert cli(env, "start").returncode == 0
    assert cli(env, "connect", "codex").returncode == 0
    entry = tomllib.loads((env.home / ".codex" / "config.toml").read_text())["mcp_servers"]["atomic"]
    assert entry["env"] == {"ATOMICTOOLS_RUNTIME_DIR": str(env.runtime_dir)}  # this shell's runtime dir, pinned
    # --no-autostart: a shim that looked elsewhere would fail here rather than start a second daemon.
    agent_sees_the_clis_daemon(env, entry["command"], [*entry["args"], "--no-autostart"], entry["env"], "codex")

    made = cli(env, "bridge", "create", "--agent", "claude-desktop", "--json")
    assert made.returncode == 0, made.stderr
    bridge = json.loads(made.stdout)
    agent_sees_the_clis_daemon(env, bridge["path"], [], {}, "claude-desktop")


def test_a_xdg_runtime_dir_open_to_others_is_refused_by_shim_cli_client_and_daemon(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    open_dir = env.root / "run-open"
    open_dir.mkdir()
    os.chmod(open_dir, 0o755)
    environ = {**env.vars, "XDG_RUNTIME_DIR": str(open_dir)}
    shim = subprocess.run([SHIM, "mcp"], env=environ, cwd=env.project, input="", capture_output=True, text=True,
                          timeout=60)
    assert shim.returncode == 1 and shim.stdout == ""
    assert f"XDG_RUNTIME_DIR={open_dir} has mode 0755" in shim.stderr and f"chmod 700 {open_dir}" in shim.stderr
    for command in (["status"], ["start"], ["list"]):
        done = cli(env, *command, environ=environ)
        assert done.returncode == 1 and "has mode 0755" in done.stderr, (command, done.stderr)
    assert list(open_dir.iterdir()) == [], "nothing was created there"
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(open_dir))
    with pytest.raises(ConnectError, match="has mode 0755"):
        Client()


def test_a_shim_started_with_only_home_and_path_finds_the_users_daemon(detached: Env) -> None:
    """The MCP SDK passes a server only HOME and PATH: the shim of a project entry (no runtime dir
    pinned) finds the daemon the user's CLI started from the pointer it left under HOME, instead
    of starting a second daemon elsewhere that status would not show."""
    env = detached
    env.write_tool(env.global_tools, "echo.py", "def echo(text: str) -> str:\n    return text\n")
    assert cli(env, "start").returncode == 0
    assert (env.home / ".atomic" / "runtime-dir").read_text().strip() == str(env.runtime_dir)
    # --no-autostart: a shim that looked elsewhere would fail here rather than start a second daemon.
    agent_sees_the_clis_daemon(env, SHIM, ["mcp", "--agent", "sdk-default", "--no-autostart"], {}, "sdk-default")


def test_a_shim_with_only_home_and_path_starts_the_stopped_daemon_where_the_users_cli_looks(detached: Env) -> None:
    """The user's daemon stopped (``stop``, an upgrade, a crash): the shim an MCP SDK starts with only
    HOME and PATH starts the next one in the runtime dir the pointer names, which the user's CLI
    asks, not in another one where status would say "not running" beside a second daemon."""
    env = detached
    env.write_tool(env.global_tools, "echo.py", "def echo(text: str) -> str:\n    return text\n")
    assert cli(env, "start").returncode == 0
    assert cli(env, "stop").returncode == 0
    # TMPDIR in the test's tree: a shim that fell back would start its daemon there (runtime-UID),
    # never in this machine's own fallback dir.
    fallback = env.root / f"runtime-{os.geteuid()}" / "atomictools"
    try:
        agent_sees_the_clis_daemon(env, SHIM, ["mcp", "--agent", "sdk-default"], {"TMPDIR": str(env.root)}, "sdk-default")
    finally:
        stop_detached(env, fallback)
    assert not (fallback / "atomictoolsd.sock").exists()


def test_status_shows_every_daemon_of_the_user(detached: Env, tmp_path) -> None:  # type: ignore[no-untyped-def]
    env = detached
    assert cli(env, "start").returncode == 0
    elsewhere = tmp_path / "other-runtime"
    elsewhere.mkdir(mode=0o700)
    other = {**env.vars, "ATOMICTOOLS_RUNTIME_DIR": str(elsewhere)}
    assert cli(env, "start", environ=other).returncode == 0
    try:
        shown = cli(env, "status")
        assert shown.returncode == 0, shown.stderr
        assert "other daemons of yours" in shown.stdout and str(elsewhere / "atomictoolsd.sock") in shown.stdout
        status = json.loads(cli(env, "status", "--json").stdout)
        sockets = [d["socket"] for d in status["otherDaemons"]]  # other tests' daemons may run too
        assert str(elsewhere / "atomictoolsd.sock") in sockets and status["socket"] not in sockets
    finally:
        cli(env, "stop", environ=other)
