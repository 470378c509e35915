"""The agents' own CLIs check the entry ``connect`` wrote: Claude Code, OpenCode, Gemini CLI and Qwen
Code each list their MCP servers offline, without a login, starting our shim as they do.

The CLIs come from npm into ``.ci/agents/node_modules`` (``.ci/run`` installs them; by hand:
``npm install --prefix .ci/agents --no-audit --no-fund``). A test skips, saying so, when its CLI is
not installed there or on PATH.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from helpers import Env
from shim_helpers import SHIM

NODE_BIN = Path(__file__).resolve().parents[2] / ".ci" / "agents" / "node_modules" / ".bin"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def agent_cli(name: str) -> str:
    local = NODE_BIN / name
    if local.exists():
        return str(local)
    found = shutil.which(name)
    if found is None:
        pytest.skip(f"the {name!r} CLI is not installed: run `npm install --prefix .ci/agents --no-audit "
                    f"--no-fund` (.ci/run does)")
    return found


@pytest.fixture
def agent_env(env: Env, make_daemon) -> Env:  # type: ignore[no-untyped-def]
    """A project with a tool, a running daemon, and ``atomictoolsd`` on PATH (project entries need it)."""
    _agent_project(env)
    make_daemon()
    return env


def _agent_project(env: Env) -> None:
    """The project the agents run in, and an environment in which their CLIs run offline."""
    env.write_tool(env.local_tools, "hello.py", "def hello() -> str:\n    return 'hi'\n")
    # A repository: the project root the agents look for (Claude Code reads .claude/ settings there).
    subprocess.run(["git", "init", "-q", str(env.project)], check=True, timeout=30)
    env.vars["PATH"] = os.pathsep.join([str(Path(SHIM).parent), env.vars.get("PATH", "")])
    env.vars["XDG_CONFIG_HOME"] = str(env.home / ".config")
    # No telemetry, update checks or prompts: the CLIs run offline, as in CI.
    env.vars.update(DISABLE_AUTOUPDATER="1", DISABLE_TELEMETRY="1", CI="1", NO_COLOR="1",
                    OPENCODE_DISABLE_AUTOUPDATE="1", GEMINI_CLI_NO_RELAUNCH="true")


def run(env: Env, *command: str, timeout: float = 120) -> str:
    done = subprocess.run(command, env=env.vars, cwd=env.project, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)
    return ANSI.sub("", done.stdout + done.stderr)


def connect(env: Env, agent: str, *flags: str) -> None:
    done = subprocess.run([SHIM, "connect", agent, *flags], env=env.vars, cwd=env.project, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def connected_line(output: str, name: str = "atomic") -> str:
    lines = [line for line in output.splitlines() if re.search(rf"\b{name}\b", line)]
    assert lines, output
    return " ".join(lines)


def test_claude_code_connects_to_the_project_and_the_user_entry(agent_env: Env) -> None:
    claude = agent_cli("claude")
    env = agent_env
    connect(env, "claude")  # .mcp.json, and its approval where Claude Code's prompt writes it
    assert "Connected" in connected_line(run(env, claude, "mcp", "list"))
    connect(env, "claude", "--user", "--name", "atomic_user")
    assert "Connected" in connected_line(run(env, claude, "mcp", "list"), "atomic_user")


def doctor_approval(env: Env, server: str = "atomic") -> dict[str, object]:
    done = subprocess.run([SHIM, "doctor", "claude", "--json"], env=env.vars, cwd=env.project, capture_output=True,
                          text=True, timeout=120)
    report = next(r for r in json.loads(done.stdout)["agents"] if r["server"] == server)
    return next(c for c in report["checks"] if c["name"] == "approval")


def test_doctor_says_what_claude_mcp_list_shows_and_its_fix_makes_it_connect(agent_env: Env) -> None:
    """Pending outside a git repository (Claude Code counts settings.local.json there only once the
    folder is trusted), rejected by disabledMcpjsonServers: doctor says what Claude Code shows, and
    the command it gives makes Claude Code connect, without a prompt."""
    claude = agent_cli("claude")
    env = agent_env
    shutil.rmtree(env.project / ".git")
    connect(env, "claude")
    line = connected_line(run(env, claude, "mcp", "list"))
    approval = doctor_approval(env)
    assert "Pending approval" in line and not approval["ok"] and "Pending approval" in str(approval["detail"]), line
    fix = str(approval["fix"]).split("   (")[0].split()
    assert fix[:3] == ["atomictoolsd", "connect", "claude"] and "--trust-folder" in fix
    connect(env, *fix[2:])
    assert "Connected" in connected_line(run(env, claude, "mcp", "list")) and doctor_approval(env)["ok"]

    local = env.project / ".claude" / "settings.local.json"
    local.write_text(json.dumps({"disabledMcpjsonServers": ["atomic"]}))
    listed = run(env, claude, "mcp", "list")
    approval = doctor_approval(env)
    assert "atomic" not in listed and "Rejected" in run(env, claude, "mcp", "get", "atomic"), listed
    assert not approval["ok"] and "`claude mcp list` leaves 'atomic' out" in str(approval["detail"]), approval
    connect(env, *str(approval["fix"]).split()[2:])
    assert "Connected" in connected_line(run(env, claude, "mcp", "list")) and doctor_approval(env)["ok"]


def test_opencode_connects(agent_env: Env) -> None:
    opencode = agent_cli("opencode")
    connect(agent_env, "opencode")
    line = connected_line(run(agent_env, opencode, "mcp", "list"))
    assert "connected" in line and "failed" not in line, line


@pytest.mark.parametrize("agent", ["gemini", "qwen"])
def test_gemini_and_qwen_connect_once_the_folder_is_trusted(agent_env: Env, agent: str) -> None:
    program = agent_cli(agent)
    env = agent_env
    connect(env, agent)
    before = connected_line(run(env, program, "mcp", "list"))
    if agent == "gemini":  # Gemini CLI ignores a project's settings until the folder is trusted
        assert "Connected" not in before, before
    connect(env, agent, "--trust-folder")  # as its trust prompt records it
    assert "Connected" in connected_line(run(env, program, "mcp", "list"))
    connect(env, agent, "--user", "--name", "atomic_user")
    assert "Connected" in connected_line(run(env, program, "mcp", "list"), "atomic_user")


@pytest.fixture
def http_agent_env(env: Env, make_daemon) -> Env:  # type: ignore[no-untyped-def]
    """As ``agent_env``, with the daemon serving HTTP and the token in $ATOMICTOOLS_TOKEN."""
    _agent_project(env)
    daemon = make_daemon({"ATOMICTOOLS_HTTP": "127.0.0.1:0"})
    with daemon.raw() as raw:
        info = raw.request("atomic/status")["result"]["http"]
    env.vars["ATOMICTOOLS_TOKEN"] = Path(info["tokenFile"]).read_text().strip()
    return env


@pytest.mark.parametrize("agent", ["claude", "opencode", "gemini", "qwen"])
def test_agents_connect_by_url_with_the_token_from_the_environment(http_agent_env: Env, agent: str) -> None:
    program = agent_cli(agent)
    env = http_agent_env
    connect(env, agent, "--http")  # Claude Code's entry approved as it is written
    if agent in ("gemini", "qwen"):
        connect(env, agent, "--trust-folder")
    line = connected_line(run(env, program, "mcp", "list"))
    assert "onnected" in line and "failed" not in line.lower() and "disconnected" not in line.lower(), line
    # Without the token in the environment the same entry is refused: the token is really checked.
    token = env.vars.pop("ATOMICTOOLS_TOKEN")
    try:
        line = connected_line(run(env, program, "mcp", "list"))
        print(agent, "without the token:", line)
        assert re.search(r"fail|disconnected|error|needs auth|unauthori", line.lower()), line
    finally:
        env.vars["ATOMICTOOLS_TOKEN"] = token


def test_claude_code_ignores_an_approval_the_repository_ships_and_doctor_says_so(agent_env: Env) -> None:
    """settings.local.json tracked by git could come from whoever wrote the repository: Claude Code
    ignores it in a folder not trusted, and doctor says the server is pending for that reason."""
    claude = agent_cli("claude")
    env = agent_env
    connect(env, "claude")
    assert "Connected" in connected_line(run(env, claude, "mcp", "list")) and doctor_approval(env)["ok"]
    subprocess.run(["git", "-C", str(env.project), "add", "-f", ".claude/settings.local.json"], check=True, timeout=30)
    approval = doctor_approval(env)
    assert "Pending approval" in connected_line(run(env, claude, "mcp", "list"))
    assert not approval["ok"] and "git tracks .claude/settings.local.json" in str(approval["detail"]), approval
