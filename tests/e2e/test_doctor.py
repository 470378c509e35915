"""``atomictoolsd doctor``: each connected agent's entry checked the way that agent starts the shim
(Codex with a scrubbed environment), against the daemon the CLI started; every problem with its fix."""

from __future__ import annotations

import json
import os
import subprocess
import tomllib
from pathlib import Path
from typing import Any

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
    assert not gemini["trust"]["ok"] and gemini["trust"]["fix"] == f"cd {env.project} && gemini   (and choose to trust the folder)"

    (env.home / ".gemini").mkdir()
    (env.home / ".gemini" / "trustedFolders.json").write_text(json.dumps({str(env.project): "TRUST_FOLDER"}))
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
    document = tomlkit.parse(config.read_text())
    del document["mcp_servers"]["atomic"]["env"]
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
    assert not command["ok"] and command["fix"] == "atomictoolsd connect qwen --user"

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
