"""``atomictoolsd doctor``: each connected agent's entry checked the way that agent starts the shim
(Codex with a scrubbed environment), against the daemon the CLI started; every problem with its fix."""

from __future__ import annotations

import json
import os
import subprocess
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import tomlkit

from atomictoolsd.bridges import agents
from helpers import Env
from shim_helpers import SHIM


def cli(env: Env, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SHIM, *args], env=env.vars, cwd=env.project, capture_output=True, text=True, timeout=120)


def doctor(env: Env, *args: str) -> tuple[int, dict[str, Any]]:
    done = cli(env, "doctor", "--json", *args)
    return done.returncode, json.loads(done.stdout)


def checks(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in report["checks"]}


def by_agent(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["agent"]: r for r in result["agents"]}


def test_doctor_checks_entries_as_each_agent_starts_them(detached: Env) -> None:
    env = detached
    env.vars["PATH"] = f"{Path(SHIM).parent}{os.pathsep}{env.vars.get('PATH', '')}"  # atomictoolsd installed
    env.write_tool(env.local_tools, "hello.py", "def hello() -> str:\n    return 'hi'\n")
    assert cli(env, "start").returncode == 0
    assert cli(env, "connect", "codex").returncode == 0
    assert cli(env, "connect", "gemini").returncode == 0

    status, result = doctor(env)
    assert status == 1 and result["ok"] is False
    agents = by_agent(result)
    assert set(agents) == {"codex", "gemini"}
    codex = checks(agents["codex"])
    assert all(c["ok"] for c in codex.values()), codex
    assert "from your CLI's daemon" in codex["shim"]["detail"]
    gemini = checks(agents["gemini"])
    assert gemini["shim"]["ok"] and gemini["refresh"]["ok"]
    assert not gemini["trust"]["ok"] and gemini["trust"]["fix"].startswith("atomictoolsd connect gemini --trust-folder ")

    assert cli(env, "connect", "gemini", "--trust-folder").returncode == 0  # the fix, as Gemini CLI's prompt writes it
    assert json.loads((env.home / ".gemini" / "trustedFolders.json").read_text()) == {str(env.project): "TRUST_FOLDER"}
    status, result = doctor(env)
    assert status == 0 and result["ok"], result
    human = cli(env, "doctor")
    assert human.returncode == 0 and "Everything is fine." in human.stdout and "Gemini CLI" in human.stdout


def test_each_problem_comes_with_the_command_that_fixes_it(detached: Env) -> None:
    env = detached
    assert cli(env, "start").returncode == 0
    assert cli(env, "connect", "codex").returncode == 0
    config = env.home / ".codex" / "config.toml"
    # An entry without the runtime dir, as an older connect wrote it, and no pointer to the daemon's
    # (as a daemon of an older version left none): Codex's scrubbed environment leads the shim to
    # another runtime dir, where no daemon listens.
    # (Its temporary directory in the test's: the runtime dir the shim then falls back to is
    # runtime-UID there, never this machine's own, where a daemon of the user's may listen.)
    document = tomlkit.parse(config.read_text())
    document["mcp_servers"]["atomic"]["env"] = {"TMPDIR": str(env.root)}
    config.write_text(tomlkit.dumps(document))
    (env.home / ".atomic" / "runtime-dir").unlink()
    status, result = doctor(env, "codex")
    shim = checks(by_agent(result)["codex"])["shim"]
    assert status == 1 and not shim["ok"] and shim["fix"].startswith("atomictoolsd connect codex --user")
    assert cli(env, "connect", "codex").returncode == 0  # the fix it names
    assert tomllib.loads(config.read_text())["mcp_servers"]["atomic"]["env"]
    assert doctor(env, "codex")[0] == 0

    assert cli(env, "connect", "qwen", "--user", "--no-dispatcher").returncode == 0
    refresh = checks(by_agent(doctor(env, "qwen")[1])["qwen"])["refresh"]
    assert not refresh["ok"] and refresh["fix"] == "atomictoolsd connect qwen --user --dispatcher"

    settings = env.home / ".qwen" / "settings.json"
    document = json.loads(settings.read_text())
    document["mcpServers"]["atomic"]["command"] = str(env.root / "gone" / "python")
    settings.write_text(json.dumps(document))
    command = checks(by_agent(doctor(env, "qwen")[1])["qwen"])["command"]
    assert not command["ok"] and command["fix"] == "atomictoolsd connect qwen --user --no-dispatcher"  # as it was

    status, result = doctor(env, "cursor")
    entry = checks(by_agent(result)["cursor"])["entry"]
    assert status == 1 and not entry["ok"] and entry["fix"] == "atomictoolsd connect cursor"


def test_doctor_never_starts_a_daemon(env: Env) -> None:
    assert cli(env, "connect", "codex").returncode == 0
    status, result = doctor(env)
    shim = checks(by_agent(result)["codex"])["shim"]
    assert status == 1 and not shim["ok"] and shim["fix"] == "atomictoolsd start"
    assert not env.socket.exists() and not (env.runtime_dir / "atomictoolsd.lock").exists()


FOREIGN = "#!/bin/sh\necho \"$0 $*\" >> {marker}\n"
PROJECT_AGENTS = [name for name in agents.AGENTS if "project" in agents.INFO[name].scopes]


def test_doctor_never_runs_a_command_a_projects_entry_names(detached: Env) -> None:
    """A cloned repository's agent configs name its own program, with `mcp` among the arguments and an
    environment: doctor reports each entry as not our shim and runs none of them."""
    env = detached
    marker = env.root / "foreign-command-ran"
    script = env.project / "bin" / "atomictoolsd"  # named like ours, and put first on PATH by some entries
    script.parent.mkdir()
    script.write_text(FOREIGN.format(marker=marker))
    script.chmod(0o755)
    assert cli(env, "start").returncode == 0
    root = env.project.resolve()
    for index, agent in enumerate(PROJECT_AGENTS):
        target = agents.config_file(agent, "project", home=env.home, root=root, environ=env.vars)
        if index % 2:  # our program's name, found on the PATH the entry sets
            command = ["atomictoolsd", "mcp", "--agent", agent]
            entry_env = {"PATH": f"{script.parent}{os.pathsep}{env.vars['PATH']}", "ATOMICTOOLS_TRUST_ALL": "1"}
        else:
            command = [str(script), "mcp", "--agent", agent]
            entry_env = {"ATOMICTOOLS_RUNTIME_DIR": str(env.runtime_dir), "ATOMICTOOLS_TRUST_ALL": "1"}
        agents.add_server(target, agents.server_entry(agent, command, entry_env), backup_dir=env.root / "backups")

    status, result = doctor(env)
    assert status == 1
    reports = by_agent(result)
    assert set(reports) == set(PROJECT_AGENTS)
    for agent, report in reports.items():
        found = checks(report)
        assert list(found) == ["entry"], (agent, found)
        assert "not atomictoolsd's shim; doctor does not run it (a project's file" in found["entry"]["detail"], found
        assert str(script) in found["entry"]["detail"] and found["entry"]["fix"] == f"atomictoolsd connect {agent} --project"
    human = cli(env, "doctor")
    assert human.returncode == 1 and human.stdout.count("doctor does not run it") == len(PROJECT_AGENTS), human.stdout
    assert not marker.exists(), marker.read_text()


def test_doctor_starts_our_own_shim_without_the_rest_of_the_entrys_environment(detached: Env) -> None:
    """A project entry that runs `atomictoolsd mcp` and sets PYTHONPATH (a planted sitecustomize.py)
    and ATOMICTOOLS_TRUST_ALL: doctor checks our shim as the agent starts it, without them, and says so."""
    env = detached
    env.vars["PATH"] = f"{Path(SHIM).parent}{os.pathsep}{env.vars.get('PATH', '')}"  # atomictoolsd installed
    marker = env.root / "sitecustomize-ran"
    planted = env.project / "py"
    planted.mkdir()
    (planted / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    env.write_tool(env.local_tools, "hello.py", "def hello() -> str:\n    return 'hi'\n")
    assert cli(env, "start").returncode == 0
    target = agents.config_file("claude", "project", home=env.home, root=env.project.resolve(), environ=env.vars)
    entry = agents.server_entry("claude", ["atomictoolsd", "mcp", "--agent", "claude", "--dispatcher"],
                                {"PYTHONPATH": str(planted), "ATOMICTOOLS_TRUST_ALL": "1"})
    agents.add_server(target, entry, backup_dir=env.root / "backups")

    status, result = doctor(env, "claude")
    found = checks(by_agent(result)["claude"])
    assert status == 1 and found["entry"]["ok"] and found["command"]["ok"], found
    assert found["command"]["detail"] == f"found: {SHIM}"
    assert found["shim"]["ok"] and "3 tools listed" in found["shim"]["detail"], found["shim"]  # hello and the dispatcher's two
    assert not found["env"]["ok"] and "the entry sets ATOMICTOOLS_TRUST_ALL, PYTHONPATH" in found["env"]["detail"]
    assert not marker.exists(), "the entry's PYTHONPATH reached the shim doctor started"

    entry["args"] = ["mcp", "--evil"]  # the shim's own parser judges the arguments
    entry["env"] = {}
    agents.add_server(target, entry, backup_dir=env.root / "backups")
    status, result = doctor(env, "claude")
    found = checks(by_agent(result)["claude"])
    assert status == 1 and list(found) == ["entry"] and "unrecognized argument: --evil" in found["entry"]["detail"]


def report_of(result: dict[str, Any], agent: str, server: str) -> dict[str, dict[str, Any]]:
    return checks(next(r for r in result["agents"] if (r["agent"], r["server"]) == (agent, server)))


def test_every_entry_of_ours_is_found_whatever_its_name(detached: Env) -> None:
    """`connect --name` entries are checked and reported under their name; another server in the same
    file is not ours and is left out."""
    env = detached
    assert cli(env, "start").returncode == 0
    assert cli(env, "connect", "codex", "--name", "tools_a", "--no-dispatcher").returncode == 0
    assert cli(env, "connect", "claude", "--user", "--name", "mine").returncode == 0
    config = env.home / ".claude.json"
    document = json.loads(config.read_text())
    document["mcpServers"]["other"] = {"type": "stdio", "command": "npx", "args": ["-y", "some-server"]}
    config.write_text(json.dumps(document))

    status, result = doctor(env)
    assert {(r["agent"], r["server"]) for r in result["agents"]} == {("codex", "tools_a"), ("claude", "mine")}
    claude = report_of(result, "claude", "mine")
    assert all(c["ok"] for c in claude.values()), claude
    codex = report_of(result, "codex", "tools_a")
    assert codex["shim"]["ok"] and "from your CLI's daemon" in codex["shim"]["detail"]
    # The one problem: its fix writes the entry again under its own name, with the dispatcher.
    assert status == 1 and not codex["refresh"]["ok"]
    assert codex["refresh"]["fix"] == "atomictoolsd connect codex --user --name tools_a --dispatcher"
    human = cli(env, "doctor").stdout
    assert "Claude Code, server 'mine' (user:" in human and "Codex, server 'tools_a' (user:" in human


@pytest.fixture
def http_project(env: Env, make_daemon: Any) -> tuple[Env, str, str]:
    """A git repository with a tool, a daemon serving HTTP; its URL and token."""
    subprocess.run(["git", "init", "-q", str(env.project)], check=True, timeout=30)
    env.write_tool(env.local_tools, "hello.py", "def hello() -> str:\n    return 'hi'\n")
    daemon = make_daemon({"ATOMICTOOLS_HTTP": "127.0.0.1:0"})
    with daemon.raw() as raw:
        info = raw.request("atomic/status")["result"]["http"]
    return env, info["url"], Path(info["tokenFile"]).read_text().strip()


def test_url_entries_are_checked_as_the_agent_uses_them(http_project: tuple[Env, str, str]) -> None:
    """`connect --http` entries: the endpoint answers at the entry's URL with the daemon's token, and
    the variable the entry names must hold that token where the agent runs; a working entry gets no
    fix that would replace it."""
    env, url, token = http_project
    for agent, *flags in (("claude",), ("codex",), ("gemini", "--name", "web")):
        assert cli(env, "connect", agent, "--http", *flags).returncode == 0
    gemini_trust = cli(env, "connect", "gemini", "--trust-folder")
    assert gemini_trust.returncode == 0, gemini_trust.stderr

    status, result = doctor(env)
    assert status == 1 and {(r["agent"], r["server"], r["transport"]) for r in result["agents"]} == {
        ("claude", "atomic", "http"), ("codex", "atomic", "http"), ("gemini", "web", "http")}
    for report in result["agents"]:
        found = checks(report)
        assert found["entry"]["ok"] and found["endpoint"]["ok"], found
        assert f"tools listed for {env.project}" in found["endpoint"]["detail"]
        assert not found["token"]["ok"] and "from ITS environment" in found["token"]["detail"]
        assert found["token"]["fix"].startswith("export ATOMICTOOLS_TOKEN=$(atomictoolsd http token --show)")
        assert [c["name"] for c in report["checks"] if not c["ok"]] == ["token"], report  # nothing else to fix
    assert report_of(result, "claude", "atomic")["approval"]["ok"]

    env.vars["ATOMICTOOLS_TOKEN"] = "0" * 43  # set, but not the daemon's
    token_check = report_of(doctor(env, "codex")[1], "codex", "atomic")["token"]
    assert not token_check["ok"] and "not the daemon's token" in token_check["detail"]
    env.vars["ATOMICTOOLS_TOKEN"] = token
    status, result = doctor(env)
    assert status == 0 and result["ok"], result
    assert "Everything is fine." in cli(env, "doctor").stdout

    # The daemon moved to another port: the entry is broken, and its fix writes it again by its name.
    settings = env.project / ".gemini" / "settings.json"
    document = json.loads(settings.read_text())
    old_url = document["mcpServers"]["web"]["httpUrl"]
    document["mcpServers"]["web"]["httpUrl"] = old_url.replace(url, "http://127.0.0.1:9/mcp")
    settings.write_text(json.dumps(document))
    endpoint = report_of(doctor(env, "gemini")[1], "gemini", "web")["endpoint"]
    assert not endpoint["ok"] and f"the daemon serves HTTP at {url}" in endpoint["detail"]
    assert endpoint["fix"] == "atomictoolsd connect gemini --project --name web --http"
    assert cli(env, *endpoint["fix"].split()[1:]).returncode == 0
    assert json.loads(settings.read_text())["mcpServers"]["web"]["httpUrl"] == old_url
    # Gemini CLI reads "url" as an SSE server, which the daemon does not serve.
    document = json.loads(settings.read_text())
    document["mcpServers"]["web"]["url"] = document["mcpServers"]["web"].pop("httpUrl")
    settings.write_text(json.dumps(document))
    entry = report_of(doctor(env, "gemini")[1], "gemini", "web")["entry"]
    assert not entry["ok"] and 'Gemini CLI reads "url" as another transport (SSE)' in entry["detail"]

    # A project directory that is gone: the daemon would answer 400.
    config = env.home / ".codex" / "config.toml"
    document = tomlkit.parse(config.read_text())
    document["mcp_servers"]["atomic"]["url"] = f"{url}?directory={env.root / 'gone'}"
    config.write_text(tomlkit.dumps(document))
    endpoint = report_of(doctor(env, "codex")[1], "codex", "atomic")["endpoint"]
    assert not endpoint["ok"] and f"{env.root / 'gone'} is not a directory" in endpoint["detail"]


def test_url_entries_of_a_daemon_that_no_longer_serves_http_name_the_restart(env: Env, make_daemon: Any) -> None:
    daemon = make_daemon({"ATOMICTOOLS_HTTP": "127.0.0.1:0"})
    assert cli(env, "connect", "opencode", "--http").returncode == 0
    port = urlsplit(json.loads((env.project / "opencode.json").read_text())["mcp"]["atomic"]["url"]).port
    daemon.stop()
    make_daemon()
    status, result = doctor(env, "opencode")
    endpoint = report_of(result, "opencode", "atomic")["endpoint"]
    assert status == 1 and not endpoint["ok"] and endpoint["detail"] == "the daemon does not serve HTTP"
    assert endpoint["fix"].startswith(f"atomictoolsd restart --http {port}")


def test_claude_codes_approval_is_reported_and_fixed_without_a_prompt(detached: Env) -> None:
    """A project's .mcp.json server runs only once Claude Code approves it: connect approves what it
    writes; outside a git repository Claude Code counts that only in a trusted folder, and doctor says
    so with the command that trusts it; a rejection is reported and undone by --approve."""
    env = detached
    env.vars["PATH"] = f"{Path(SHIM).parent}{os.pathsep}{env.vars.get('PATH', '')}"  # atomictoolsd installed
    assert cli(env, "start").returncode == 0
    done = cli(env, "connect", "claude")  # the project is no git repository
    assert done.returncode == 0 and "approved in" in done.stdout and "--trust-folder" in done.stdout, done.stdout
    assert json.loads((env.project / ".claude" / "settings.local.json").read_text()) == {
        "enabledMcpjsonServers": ["atomic"]}
    status, result = doctor(env, "claude")
    approval = report_of(result, "claude", "atomic")["approval"]
    assert status == 1 and not approval["ok"] and "Pending approval" in approval["detail"]
    assert "not in a git repository" in approval["detail"]
    assert approval["fix"].startswith("atomictoolsd connect claude --approve --trust-folder   (")
    fixed = cli(env, *approval["fix"].split("   (")[0].split()[1:])
    assert fixed.returncode == 0, fixed.stderr
    assert json.loads((env.home / ".claude.json").read_text())["projects"][str(env.project)] == {
        "hasTrustDialogAccepted": True}
    assert doctor(env, "claude")[0] == 0

    local = env.project / ".claude" / "settings.local.json"
    local.write_text(json.dumps({"enabledMcpjsonServers": [], "disabledMcpjsonServers": ["atomic"]}))
    approval = report_of(doctor(env, "claude")[1], "claude", "atomic")["approval"]
    assert not approval["ok"] and "Rejected" in approval["detail"] and approval["fix"] == "atomictoolsd connect claude --approve"
    assert cli(env, "connect", "claude", "--approve").returncode == 0
    assert json.loads(local.read_text()) == {"enabledMcpjsonServers": ["atomic"], "disabledMcpjsonServers": []}
    assert doctor(env, "claude")[0] == 0
    refused = cli(env, "connect", "claude", "--approve", "--name", "nothing")
    assert refused.returncode == 1 and "no server 'nothing'" in refused.stderr
    # Claude Code approves by name: disconnect takes the approval back with the entry.
    assert "and its approval from" in cli(env, "disconnect", "claude").stdout
    assert json.loads(local.read_text())["enabledMcpjsonServers"] == []


def test_fifos_a_repository_plants_block_neither_doctor_nor_connect(detached: Env) -> None:
    """A project's .mcp.json, .claude/settings.local.json and git index are the repository's to make:
    as FIFOs they would block a reader forever; they are refused, and said so."""
    env = detached
    env.vars["PATH"] = f"{Path(SHIM).parent}{os.pathsep}{env.vars.get('PATH', '')}"  # atomictoolsd installed
    assert cli(env, "start").returncode == 0
    (env.project / ".git").mkdir()
    os.mkfifo(env.project / ".git" / "index")
    (env.project / ".claude").mkdir()
    os.mkfifo(env.project / ".claude" / "settings.local.json")
    os.mkfifo(env.project / ".mcp.json")
    done = subprocess.run([SHIM, "doctor", "claude", "--json"], env=env.vars, cwd=env.project, capture_output=True,
                          text=True, timeout=30)
    entry = checks(by_agent(json.loads(done.stdout))["claude"])["entry"]
    assert done.returncode == 1 and not entry["ok"] and "is not a regular file" in entry["detail"], entry
    refused = subprocess.run([SHIM, "connect", "claude"], env=env.vars, cwd=env.project, capture_output=True,
                             text=True, timeout=30)
    assert refused.returncode == 1 and "is not a regular file" in refused.stderr

    (env.project / ".mcp.json").unlink()
    agents.add_server(agents.config_file("claude", "project", home=env.home, root=env.project.resolve()),
                      agents.server_entry("claude", ["atomictoolsd", "mcp"]), backup_dir=env.root / "backups")
    done = subprocess.run([SHIM, "doctor", "claude", "--json"], env=env.vars, cwd=env.project, capture_output=True,
                          text=True, timeout=30)
    approval = report_of(json.loads(done.stdout), "claude", "atomic")["approval"]
    assert not approval["ok"] and "Pending approval" in approval["detail"], approval
