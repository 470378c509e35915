"""What an agent asks before it uses a project's entries, read as the agent reads it
(``bridges/agent_trust.py``) against real git repositories, and the token reference of each agent's
URL entry (``agents.token_source``). The real Claude Code agrees: tests/e2e/test_real_agents.py."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from atomictoolsd.bridges import agent_trust, agents


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, timeout=30)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    git(root, "init", "-q")
    git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "first")
    return root


def approve_locally(root: Path, name: str = "atomic") -> None:
    agent_trust.approve_claude_server(root, name, backup_dir=root.parent / "backups")


def test_claude_keys_a_project_by_its_main_work_tree(repo: Path, tmp_path: Path) -> None:
    (repo / "sub").mkdir()
    assert agent_trust.claude_project_key(repo / "sub") == repo
    git(repo, "worktree", "add", "-q", str(tmp_path / "linked"))
    assert agent_trust.claude_project_key(tmp_path / "linked") == repo
    assert agent_trust.claude_project_key(tmp_path) == tmp_path  # no repository


def test_a_local_approval_counts_untrusted_only_where_the_repository_cannot_have_shipped_it(repo: Path,
                                                                                           tmp_path: Path) -> None:
    home = tmp_path / "home"
    approve_locally(repo)
    assert agent_trust.local_settings_ignored(repo) is None
    assert agent_trust.claude_approval(repo, "atomic", home).state == "approved"

    git(repo, "add", "-f", ".claude/settings.local.json")
    assert "git tracks" in str(agent_trust.local_settings_ignored(repo))
    pending = agent_trust.claude_approval(repo, "atomic", home)
    assert (pending.state, pending.needs_trust) == ("pending", True)
    agent_trust.trust_folder("claude", repo, home, backup_dir=tmp_path / "backups")
    assert agent_trust.claude_approval(repo, "atomic", home).state == "approved"

    plain = tmp_path / "plain"
    plain.mkdir()
    approve_locally(plain)
    assert "not in a git repository" in str(agent_trust.local_settings_ignored(plain))
    linked = tmp_path / "elsewhere"
    linked.mkdir()
    (linked / ".git").mkdir()
    (linked / ".claude").symlink_to(plain / ".claude")
    assert "is a symlink" in str(agent_trust.local_settings_ignored(linked))
    with pytest.raises(agents.AgentConfigError, match="symlink"):
        approve_locally(linked)


def test_a_rejection_anywhere_wins_and_names_compare_as_claude_code_compares_them(repo: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".claude").mkdir(parents=True)
    (home / ".claude" / "settings.json").write_text(json.dumps({"enabledMcpjsonServers": ["my.tools"]}))
    assert agent_trust.claude_approval(repo, "my_tools", home).state == "approved"  # user settings: untrusted too
    approve_locally(repo, "other")
    (repo / ".claude" / "settings.json").write_text(json.dumps({"disabledMcpjsonServers": ["other"]}))
    rejected = agent_trust.claude_approval(repo, "other", home)
    assert rejected.state == "rejected" and rejected.rejected_by == repo / ".claude" / "settings.json"
    approve_locally(repo, "third")
    local = json.loads((repo / ".claude" / "settings.local.json").read_text())
    assert local == {"enabledMcpjsonServers": ["other", "third"]}


def test_folder_trust_is_written_where_each_agent_keeps_it(tmp_path: Path) -> None:
    home, root = tmp_path / "home", tmp_path / "project"
    home.mkdir()
    root.mkdir()
    (home / ".claude.json").write_text(json.dumps({"numStartups": 3, "projects": {"/x": {"a": 1}}}))
    codex = home / ".codex" / "config.toml"
    codex.parent.mkdir()
    codex.write_text('# mine\nmodel = "o3"\n')
    environ = {"HOME": str(home)}
    for agent in ("claude", "gemini", "qwen", "codex"):
        assert not agent_trust.folder_trusted(agent, root, home, environ)
        assert agent_trust.trust_folder(agent, root, home, backup_dir=tmp_path / "b", environ=environ).changed
        assert agent_trust.folder_trusted(agent, root, home, environ), agent
        assert not agent_trust.trust_folder(agent, root, home, backup_dir=tmp_path / "b", environ=environ).changed
    claude = json.loads((home / ".claude.json").read_text())
    assert claude["numStartups"] == 3 and claude["projects"] == {"/x": {"a": 1}, str(root): {"hasTrustDialogAccepted": True}}
    assert json.loads((home / ".gemini" / "trustedFolders.json").read_text()) == {str(root): "TRUST_FOLDER"}
    assert codex.read_text().startswith('# mine\nmodel = "o3"\n') and 'trust_level = "trusted"' in codex.read_text()
    with pytest.raises(agents.AgentConfigError, match="no folder trust"):
        agent_trust.trust_folder("cursor", root, home, backup_dir=tmp_path / "b")


@pytest.mark.parametrize("agent", agents.HTTP_AGENTS)
def test_the_token_reference_connect_writes_is_the_one_each_agent_expands(agent: str) -> None:
    entry = agents.http_entry(agent, "http://127.0.0.1:1/mcp")
    assert agents.token_source(agent, entry) == agents.TokenSource(variable=agents.TOKEN_VARIABLE)


def test_a_token_reference_the_agent_does_not_expand_is_a_problem() -> None:
    headers = {"Authorization": "Bearer ${ATOMICTOOLS_TOKEN}"}
    assert "does not expand" in str(agents.token_source("opencode", {"headers": headers}).problem)
    assert agents.token_source("claude", {"headers": {"authorization": "Bearer abc"}}).literal == "abc"
    assert "no Authorization" in str(agents.token_source("cursor", {"url": "x"}).problem)
    assert "does not expand" in str(agents.token_source("codex", {"http_headers": {"Authorization": "Bearer $T"}}).problem)
