"""The agents' own CLIs check the entry ``connect`` wrote: Claude Code, OpenCode, Gemini CLI and Qwen
Code each list their MCP servers offline, without a login, starting our shim as they do. Qwen Code
also calls tools through it, TypeScript and Python, its model a scripted one on 127.0.0.1
(``scripted_model.py``).

The CLIs come from npm into ``.ci/agents/node_modules`` (``.ci/run`` installs them; by hand:
``npm install --prefix .ci/agents --no-audit --no-fund``). A test skips, saying so, when its CLI is
not installed there or on PATH.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from helpers import Env
from javascript_helpers import js_settings
from scripted_model import FINAL_TEXT, ScriptedCall, ScriptedModel
from shim_helpers import SHIM

NODE_BIN = Path(__file__).resolve().parents[2] / ".ci" / "agents" / "node_modules" / ".bin"
ANSI = re.compile(r"\x1b\[[0-9;]*m")
JS_FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "javascript"


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


QWEN_CALLS = {  # tool: (arguments, the result the tool computes from them)
    "lint": ({"filePath": "src/app.ts"}, "lint-ok src/app.ts\n"),  # Atomic's lint.ts, a default export
    "weather_getTemp": ({"city": "Oslo", "unit": "fahrenheit"}, "Oslo: 69.8°F"),  # a named export, a Zod enum
    "greet": ({"name": "Ada", "enthusiastic": True}, "HELLO, ADA!"),  # an OpenCode plugin's tool
    "patterns": ({  # OpenCode's Zod patterns: the tool echoes its arguments with the default and transform applied
        "email": "a@b.co", "limited": "x", "pattern": "555-123-4567", "age": 30, "score": 99.5, "tags": ["a"],
        "coords": [1, 2], "items": [{"id": "i", "quantity": 2}], "config": {"host": "h", "port": 80},
        "format": "yaml", "mode": "auto", "name": "MiXeD",
    }, None),
    "squad_decide": ({"title": "Use Bun", "body": "Because.", "agentName": "fenster"},  # a Copilot SDK defineTool
                     'Decision "Use Bun" written to inbox as fenster-use-bun.md. Scribe will merge to decisions.md.'),
    "hello": ({"name": "Ada"}, "hello Ada, from Python"),  # a Python tool, for contrast
}


@pytest.fixture
def js_agent_env(env: Env, make_daemon) -> Env:  # type: ignore[no-untyped-def]
    """As ``agent_env``, with the example tools of Atomic, OpenCode and the Copilot SDK served on Bun
    beside a Python tool, in a project trusted as its user trusts it."""
    settings = js_settings("bun")
    _agent_project(env)
    # No docstring: Qwen Code offers its model no tool without a description, so the daemon gives
    # the agents of the portable form one.
    env.write_tool(env.local_tools, "hello.py", 'def hello(name: str) -> str:\n    return f"hello {name}, from Python"\n')
    shutil.copytree(JS_FIXTURES / "atomic", env.local_tools, dirs_exist_ok=True)
    shutil.copytree(JS_FIXTURES / "opencode", env.project / ".opencode" / "tools")
    # What Atomic's lint example runs: `bun lint FILE`, the project's own lint script.
    (env.project / "package.json").write_text(json.dumps({"scripts": {"lint": "echo lint-ok"}}))
    env.vars["PATH"] = os.pathsep.join([settings["PATH"].split(os.pathsep)[0], env.vars["PATH"]])
    make_daemon({**settings, "PATH": env.vars["PATH"], "ATOMICTOOLS_LOAD_WAIT": "15"})
    done = subprocess.run([SHIM, "trust", "--yes", str(env.project)], env=env.vars, cwd=env.project,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return env


def run_headless(env: Env, *command: str, timeout: float = 60) -> str:
    """Run an agent in a process group of its own, and kill what is left of the group after it."""
    proc = subprocess.Popen(command, env=env.vars, cwd=env.project, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    return ANSI.sub("", output)


def test_qwen_code_calls_typescript_and_python_tools_through_the_shim(js_agent_env: Env) -> None:
    """Qwen Code, headless, against a scripted model on 127.0.0.1: the model calls each tool by the
    name Qwen Code gives it (after its tool search, which defers MCP tools), and each result the tool
    computed from the model's arguments comes back to the model in Qwen Code's next request."""
    qwen = agent_cli("qwen")
    env = js_agent_env
    connect(env, "qwen")
    connect(env, "qwen", "--trust-folder")
    calls = [ScriptedCall(tool, arguments) for tool, (arguments, _result) in QWEN_CALLS.items()]
    with ScriptedModel(calls) as model:
        output = run_headless(env, qwen, "--auth-type", "openai", "--openai-base-url", model.base_url,
                              "--openai-api-key", "scripted", "--model", model.model, "--approval-mode", "yolo",
                              "Call the tools.")
    assert not model.missing, f"tools Qwen Code did not offer (and what it offered): {model.missing}\n{output}"
    results = {call.tool: call.result for call in calls}
    assert {call.tool: call.name for call in calls} == {tool: f"mcp__atomic__{tool}" for tool in QWEN_CALLS}
    for tool, (_arguments, expected) in QWEN_CALLS.items():
        if expected is not None:
            assert results[tool] == expected, (tool, results[tool], output)
    echoed = json.loads(results["patterns"] or "{}")
    assert (echoed["count"], echoed["name"]) == (10, "mixed"), echoed  # Zod's default and transform, in the tool
    inbox = env.project / ".squad" / "decisions" / "inbox" / "fenster-use-bun.md"
    assert "**Category:** general" in inbox.read_text()
    assert FINAL_TEXT in output, output
