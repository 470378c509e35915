"""``connect AGENT --http``: each agent's URL entry, the token never written, the daemon asked for its
URL, and clear refusals (an agent with no URL entries, a daemon not serving HTTP)."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from helpers import Env


def _connect(env: Env, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "atomictoolsd", "connect", *args], env=env.vars, cwd=env.project,
                          capture_output=True, text=True, timeout=60)


@pytest.fixture
def http_env(env: Env, make_daemon: Any) -> tuple[Env, str, str]:
    daemon = make_daemon({"ATOMICTOOLS_HTTP": "127.0.0.1:0"})
    with daemon.raw() as raw:
        info = raw.request("atomic/status")["result"]["http"]
    return env, info["url"], Path(info["tokenFile"]).read_text().strip()


@pytest.mark.parametrize("agent, reference", [
    ("claude", "${ATOMICTOOLS_TOKEN}"), ("copilot", "${ATOMICTOOLS_TOKEN}"), ("cursor", "${env:ATOMICTOOLS_TOKEN}"),
    ("vscode", "${env:ATOMICTOOLS_TOKEN}"), ("gemini", "$ATOMICTOOLS_TOKEN"), ("qwen", "$ATOMICTOOLS_TOKEN"),
    ("opencode", "{env:ATOMICTOOLS_TOKEN}"),
])
def test_each_agent_gets_its_url_entry_with_the_token_from_the_environment(http_env: tuple[Env, str, str], agent: str,
                                                                          reference: str) -> None:
    env, url, token = http_env
    done = _connect(env, agent, "--http", "--deny", "rm*")
    assert done.returncode == 0, done.stderr
    assert "export ATOMICTOOLS_TOKEN" in done.stdout
    written = next(line for line in done.stdout.splitlines() if "server 'atomic' in" in line).rsplit(" in ", 1)[1]
    text = Path(written).read_text()
    assert token not in text  # never the token itself
    document = json.loads(text)
    entry = next(v["atomic"] for v in document.values() if isinstance(v, dict) and "atomic" in v)
    entry_url = entry.get("url") or entry.get("httpUrl")
    assert entry_url.startswith(url + "?")
    assert f"directory={env.project}" in entry_url  # a user-wide entry (Copilot CLI's) too: a URL names its project
    assert "deny=rm%2A" in entry_url or "deny=rm*" in entry_url
    assert entry["headers"] == {"Authorization": f"Bearer {reference}"}


def test_codex_names_the_variable(http_env: tuple[Env, str, str]) -> None:
    env, url, token = http_env
    done = _connect(env, "codex", "--http")
    assert done.returncode == 0, done.stderr
    path = Path(done.stdout.split(" in ", 1)[1].split("\n", 1)[0])
    entry = tomllib.loads(path.read_text())["mcp_servers"]["atomic"]
    assert entry["url"].startswith(url) and entry["bearer_token_env_var"] == "ATOMICTOOLS_TOKEN"
    assert token not in path.read_text()
    # Codex's entry is user-wide, and the URL still names the project whose tools connect promised.
    assert f"directory={env.project}" in entry["url"]
    assert f"for the project {env.project} in every session" in done.stdout


def test_an_http_entry_made_outside_any_project_serves_none_and_says_so(http_env: tuple[Env, str, str]) -> None:
    env, url, _ = http_env
    plain = env.root / "plain"  # no .git, .atomic or agent config here or above
    plain.mkdir()
    done = subprocess.run([sys.executable, "-m", "atomictoolsd", "connect", "codex", "--http"], env=env.vars,
                          cwd=plain, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "for no project: your global tools only" in done.stdout
    path = Path(done.stdout.split(" in ", 1)[1].split("\n", 1)[0])
    assert "directory=" not in tomllib.loads(path.read_text())["mcp_servers"]["atomic"]["url"]


def test_claude_desktop_and_a_daemon_without_http_are_refused_clearly(env: Env, make_daemon: Any) -> None:
    make_daemon()
    done = _connect(env, "claude", "--http")
    assert done.returncode == 2 and "start --http" in done.stderr
    assert not (env.project / ".mcp.json").exists()
    done = _connect(env, "claude-desktop", "--http")
    assert done.returncode == 2 and "without --http" in done.stderr
