"""``atomictoolsd connect`` / ``disconnect``: each agent's config file, merged and never clobbered."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from helpers import Daemon, Env
from shim_helpers import SHIM, mcp_session, run

# The interpreter's flags and module before the shim's own arguments (see docs/trust.md).
SEALED = ["-E", "-P", "-m", "atomictoolsd"]
OTHER_JSON = {"command": "npx", "args": ["-y", "other-server"]}


def cli(env: Env, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SHIM, *args], env=env.vars, cwd=cwd or env.project, capture_output=True, text=True,
                          timeout=60)


def backups(env: Env) -> list[Path]:
    directory = env.state_dir / "backups"
    return sorted(directory.iterdir()) if directory.exists() else []


# (agent, scope flag, config path relative to the project or home, the servers key, other top-level keys)
JSON_CASES = [
    ("claude", "--project", "project:.mcp.json", "mcpServers", {}),
    ("claude", "--user", "home:.claude.json", "mcpServers", {"numStartups": 12, "projects": {"/x": {"a": 1}}}),
    ("opencode", "--project", "project:opencode.json", "mcp", {"$schema": "https://opencode.ai/config.json", "model": "m"}),
    ("opencode", "--user", "home:.config/opencode/opencode.json", "mcp", {"theme": "dark"}),
    ("copilot", "--user", "home:.copilot/mcp-config.json", "mcpServers", {}),
    ("cursor", "--project", "project:.cursor/mcp.json", "mcpServers", {}),
    ("cursor", "--user", "home:.cursor/mcp.json", "mcpServers", {}),
    ("gemini", "--project", "project:.gemini/settings.json", "mcpServers", {"general": {"vimMode": True}}),
    ("gemini", "--user", "home:.gemini/settings.json", "mcpServers", {"security": {"auth": {"selectedType": "x"}}}),
    ("qwen", "--project", "project:.qwen/settings.json", "mcpServers", {}),
    ("qwen", "--user", "home:.qwen/settings.json", "mcpServers", {"model": {"name": "q"}}),
    ("vscode", "--project", "project:.vscode/mcp.json", "servers", {"inputs": []}),
    ("vscode", "--user", "home:.config/Code/User/mcp.json", "servers", {}),
    ("claude-desktop", "--user", "home:.config/Claude/claude_desktop_config.json", "mcpServers", {"globalShortcut": ""}),
]


def locate(env: Env, where: str) -> Path:
    base, _, relative = where.partition(":")
    return (env.project if base == "project" else env.home) / relative


@pytest.mark.parametrize(("agent", "scope", "where", "key", "extra"), JSON_CASES)
def test_connect_merges_into_json_and_disconnect_restores_it(
    env: Env, agent: str, scope: str, where: str, key: str, extra: dict[str, Any]
) -> None:
    if scope == "--user":
        env.vars["XDG_CONFIG_HOME"] = str(env.home / ".config")
    path = locate(env, where)
    path.parent.mkdir(parents=True, exist_ok=True)
    original = {**extra, key: {"other": OTHER_JSON}}
    path.write_text(json.dumps(original, indent=4) + "\n")

    done = cli(env, "connect", agent, scope)
    assert done.returncode == 0, done.stderr
    document = json.loads(path.read_text())
    assert document[key]["other"] == OTHER_JSON  # the other server survives
    assert {k: v for k, v in document.items() if k != key} == extra  # and every other setting
    entry = document[key]["atomic"]
    command = entry["command"] if agent != "opencode" else entry["command"][0]
    if scope == "--user":  # this machine's file: this installation's interpreter
        assert Path(command).is_absolute() and Path(command).exists()
    else:  # shared with the team: the console script on PATH, never this machine's paths
        assert command == "atomictoolsd"
        assert str(env.root) not in json.dumps(entry) and sys.prefix not in json.dumps(entry)
    assert "\n    " in path.read_text()  # the file's own indentation is kept
    [backup] = backups(env)
    assert json.loads(backup.read_text()) == original

    again = cli(env, "connect", agent, scope)
    assert again.returncode == 0 and "already connected" in again.stdout
    assert len(backups(env)) == 1  # nothing changed, nothing backed up

    gone = cli(env, "disconnect", agent, scope)
    assert gone.returncode == 0, gone.stderr
    assert json.loads(path.read_text()) == original


def test_a_symlinked_config_is_written_through_the_link(env: Env) -> None:
    # ~/.claude.json kept in a dotfiles repository: the link must survive, the file it points to change.
    dotfiles = env.home / "dotfiles"
    dotfiles.mkdir()
    real = dotfiles / "claude.json"
    original = {"numStartups": 3, "mcpServers": {"other": OTHER_JSON}}
    real.write_text(json.dumps(original, indent=2) + "\n")
    real.chmod(0o600)
    link = env.home / ".claude.json"
    link.symlink_to(Path("dotfiles") / "claude.json")  # relative, as dotfile managers make them

    done = cli(env, "connect", "claude", "--user")
    assert done.returncode == 0, done.stderr
    assert link.is_symlink() and link.readlink() == Path("dotfiles") / "claude.json"
    assert set(json.loads(real.read_text())["mcpServers"]) == {"other", "atomic"}
    assert real.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in dotfiles.iterdir()) == ["claude.json"]  # no temporary file left

    gone = cli(env, "disconnect", "claude", "--user")
    assert gone.returncode == 0, gone.stderr
    assert link.is_symlink() and json.loads(link.read_text()) == original


def test_connect_writes_each_agents_shape(env: Env) -> None:
    for agent in ("claude", "opencode", "copilot", "cursor"):
        assert cli(env, "connect", agent).returncode == 0
    claude = json.loads((env.project / ".mcp.json").read_text())["mcpServers"]["atomic"]
    assert claude["type"] == "stdio" and claude["command"] == "atomictoolsd"
    assert claude["args"] == ["mcp", "--agent", "claude", "--dispatcher"]  # its re-listing is unreliable
    assert claude["env"] == {}  # no path of this machine
    opencode = json.loads((env.project / "opencode.json").read_text())["mcp"]["atomic"]
    assert opencode["type"] == "local" and opencode["enabled"] is True and "args" not in opencode
    assert opencode["command"] == ["atomictoolsd", "mcp", "--agent", "opencode"]
    copilot = json.loads((env.home / ".copilot" / "mcp-config.json").read_text())["mcpServers"]["atomic"]
    assert copilot["tools"] == ["*"] and copilot["type"] == "local"
    cursor = json.loads((env.project / ".cursor" / "mcp.json").read_text())["mcpServers"]["atomic"]
    assert cursor["args"][-2:] == ["--directory", "${workspaceFolder}"]
    for agent in ("gemini", "qwen", "vscode"):
        assert cli(env, "connect", agent).returncode == 0
    gemini = json.loads((env.project / ".gemini" / "settings.json").read_text())["mcpServers"]["atomic"]
    assert gemini == {"command": "atomictoolsd", "args": ["mcp", "--agent", "gemini", "--dispatcher"]}
    qwen = json.loads((env.project / ".qwen" / "settings.json").read_text())["mcpServers"]["atomic"]
    assert qwen["args"] == ["mcp", "--agent", "qwen", "--dispatcher"]  # Qwen Code never re-lists
    vscode = json.loads((env.project / ".vscode" / "mcp.json").read_text())["servers"]["atomic"]
    assert vscode["type"] == "stdio" and vscode["args"] == ["mcp", "--agent", "vscode", "--directory", "${workspaceFolder}"]
    env.vars["XDG_CONFIG_HOME"] = str(env.home / ".config")
    assert cli(env, "connect", "claude-desktop").returncode == 0  # user scope: its only one
    desktop = json.loads((env.home / ".config" / "Claude" / "claude_desktop_config.json").read_text())
    assert desktop["mcpServers"]["atomic"]["args"] == [*SEALED, "mcp", "--agent", "claude-desktop", "--dispatcher"]


CODEX_CONFIG = '''\
# my Codex settings
model = "o3"  # keep this comment

[mcp_servers.other]
command = "npx"
args = ["-y", "other-server"]

[mcp_servers.other.env]
TOKEN_VAR = "X"

[profiles.fast]
model = "small"
'''


def test_connect_codex_keeps_the_toml_as_the_user_wrote_it(env: Env) -> None:
    path = env.home / ".codex" / "config.toml"
    path.parent.mkdir()
    path.write_text(CODEX_CONFIG)
    done = cli(env, "connect", "codex")
    assert done.returncode == 0, done.stderr
    text = path.read_text()
    assert "# keep this comment" in text and "# my Codex settings" in text
    config = tomllib.loads(text)
    assert config["mcp_servers"]["other"] == {"command": "npx", "args": ["-y", "other-server"], "env": {"TOKEN_VAR": "X"}}
    assert config["profiles"] == {"fast": {"model": "small"}}
    atomic = config["mcp_servers"]["atomic"]
    assert atomic["args"] == [*SEALED, "mcp", "--agent", "codex", "--dispatcher"]  # Codex ignores list_changed
    assert cli(env, "disconnect", "codex").returncode == 0
    assert path.read_text() == CODEX_CONFIG


def test_connect_codex_honours_codex_home_and_creates_the_file(env: Env) -> None:
    env.vars["CODEX_HOME"] = str(env.root / "codex-home")
    assert cli(env, "connect", "codex", "--no-dispatcher").returncode == 0
    config = tomllib.loads((env.root / "codex-home" / "config.toml").read_text())
    assert config["mcp_servers"]["atomic"]["args"] == [*SEALED, "mcp", "--agent", "codex"]
    assert backups(env) == []  # there was no file to back up


def test_a_file_that_does_not_parse_is_left_alone(env: Env) -> None:
    path = env.project / ".mcp.json"
    path.write_text('{"mcpServers": {"other": {} // a comment\n}')
    done = cli(env, "connect", "claude")
    assert done.returncode == 1
    assert "nothing was changed" in done.stderr and '"atomic"' in done.stderr  # and the entry to add by hand
    assert path.read_text() == '{"mcpServers": {"other": {} // a comment\n}'
    codex = env.home / ".codex" / "config.toml"
    codex.parent.mkdir()
    codex.write_text("[mcp_servers\n")
    assert cli(env, "connect", "codex").returncode == 1
    assert codex.read_text() == "[mcp_servers\n"


def test_scopes_an_agent_lacks_are_refused(env: Env) -> None:
    done = cli(env, "connect", "copilot", "--project")
    assert done.returncode == 2 and "--user" in done.stderr


def test_project_scope_writes_at_the_project_root_from_a_subdirectory(env: Env) -> None:
    (env.project / ".git").mkdir()
    sub = env.project / "src" / "pkg"
    sub.mkdir(parents=True)
    assert cli(env, "connect", "claude", cwd=sub).returncode == 0
    assert (env.project / ".mcp.json").exists() and not (sub / ".mcp.json").exists()


def test_disconnect_when_not_connected_changes_nothing(env: Env) -> None:
    path = env.project / ".mcp.json"
    path.write_text(json.dumps({"mcpServers": {"other": OTHER_JSON}}))
    before = path.read_text()
    done = cli(env, "disconnect", "claude")
    assert done.returncode == 0 and "was not connected" in done.stdout
    assert path.read_text() == before and backups(env) == []


def test_the_connected_entry_launches_a_working_shim(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    env.write_tool(env.global_tools, "echo.py", '''
        def echo(text: str) -> str:
            """Echo the text back."""
            return text
    ''')
    daemon: Daemon = make_daemon()
    assert cli(env, "connect", "claude").returncode == 0
    entry = json.loads((env.project / ".mcp.json").read_text())["mcpServers"]["atomic"]
    env.vars["PATH"] = f"{Path(SHIM).parent}{os.pathsep}{env.vars.get('PATH', '')}"  # installed, on PATH

    async def scenario() -> None:
        async with mcp_session(env, *entry["args"], command=entry["command"]) as (session, _):
            assert (await session.call_tool("echo", {"text": "connected"})).content[0].text == "connected"
            with daemon.client() as client:
                assert "claude" in {s["agent"] for s in client.status()["sessions"]}

    run(scenario)
