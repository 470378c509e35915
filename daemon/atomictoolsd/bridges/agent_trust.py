"""What an agent asks before it uses a project's own MCP entries: that the project folder is trusted
(Claude Code, Gemini CLI, Qwen Code, Codex) and, for Claude Code, that the ``.mcp.json`` server is
approved. Read as each agent reads it, and written where the agent's own prompt writes it.

Claude Code (2.1) shows a project server as ``Pending approval`` until it is approved, and then
decides so: a name in ``disabledMcpjsonServers`` of any of its settings rejects the server; in a
folder whose trust dialog was accepted (``~/.claude.json`` ``projects[KEY].hasTrustDialogAccepted``,
KEY the repository's main work tree, else the folder), ``enabledMcpjsonServers`` or
``enableAllProjectMcpServers`` in any of its settings approves it; in a folder not trusted, only your
user settings and the project's ``.claude/settings.local.json`` count, and the latter only where
the project could not have shipped it: a git repository whose index does not list it, with no
symlink on the way to it.

Must never: trust a folder or approve a server unless asked to (``connect --trust-folder``,
``connect`` and ``--approve``), run git on a project (its index is read), or write through a symlink
of a project's (a repository chooses where it points).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from atomictoolsd.bridges.agents import INFO, AgentConfigError, Outcome, read_config, update_json, update_toml
from atomictoolsd.config.discovery import RepositoryRefused, git_worktree_root, locate_repository

__all__ = [
    "TRUSTING_AGENTS",
    "Approval",
    "approve_claude_server",
    "claude_approval",
    "claude_project_key",
    "folder_trusted",
    "local_settings_ignored",
    "trust_folder",
    "withdraw_claude_approval",
]

# The agents that read a project's MCP entries only in a folder you trust.
TRUSTING_AGENTS = ("claude", "gemini", "qwen", "codex")
_LOCAL = Path(".claude") / "settings.local.json"
_MANAGED = (Path("/etc/claude-code/managed-settings.json"),
            Path("/Library/Application Support/ClaudeCode/managed-settings.json"))


@dataclass(frozen=True)
class Approval:
    """What Claude Code shows for a project's ``.mcp.json`` server, and why."""

    state: Literal["approved", "pending", "rejected"]
    detail: str
    needs_trust: bool = False  # pending until the folder is trusted, whatever settings.local.json says
    rejected_by: Path | None = None  # the settings file whose disabledMcpjsonServers names it


def claude_project_key(root: Path) -> Path:
    """The folder Claude Code keys a project by in ``~/.claude.json``: the top of the git work tree
    holding ``root`` (a linked worktree's main one), else ``root`` itself."""
    try:
        repository = locate_repository(root)
    except (RepositoryRefused, OSError):
        return git_worktree_root(root) or root
    if repository is None:
        return root
    if repository.git_dir == repository.common_dir:
        return repository.worktree
    common = repository.common_dir  # a linked worktree: its main repository's
    return common.parent if common.name == ".git" else common


def _read_json(path: Path) -> Any:
    """The JSON in ``path``, or None when it is missing or cannot be read as JSON (a FIFO included:
    a project's files are the repository's to make)."""
    try:
        text = read_config(path)
        return None if text is None else json.loads(text)
    except (AgentConfigError, ValueError):
        return None


def _claude_trusted(root: Path, home: Path) -> bool:
    config = _read_json(home / ".claude.json")
    projects = config.get("projects") if isinstance(config, dict) else None
    entry = projects.get(str(claude_project_key(root))) if isinstance(projects, dict) else None
    return isinstance(entry, dict) and entry.get("hasTrustDialogAccepted") is True


def local_settings_ignored(root: Path) -> str | None:
    """Why Claude Code ignores ``root``'s ``.claude/settings.local.json`` in a folder not trusted
    (the project may have shipped it), or None when it counts."""
    for path in (root / ".claude", root / _LOCAL):
        if path.is_symlink():
            return f"{path} is a symlink"
    if os.path.lexists(root / ".claude" / ".git"):
        return f"{root / '.claude'} is a git repository of its own"
    if shutil.which("git") is None:
        return None  # Claude Code asks git; without one, it counts the file
    from atomictoolsd.worker.gitindex import index_paths  # lazy: only for a Claude Code project entry

    try:
        repository = locate_repository(root)
    except (RepositoryRefused, OSError) as exc:
        return f"its git repository cannot be read ({exc})"
    if repository is None:
        return f"{root} is not in a git repository"
    wanted = os.path.relpath(root / _LOCAL, repository.worktree).lower()
    if any(path.lower() == wanted for path in index_paths(str(repository.git_dir / "index")) or ()):
        return f"git tracks {_LOCAL} (a file the repository ships)"
    return None


def _claude_settings(root: Path, home: Path) -> list[tuple[str, Path, dict[str, Any]]]:
    """Claude Code's settings that hold approvals: (source, file, settings)."""
    found = []
    for source, path in (("user", home / ".claude" / "settings.json"), ("project", root / ".claude" / "settings.json"),
                         ("local", root / _LOCAL), *(("policy", p) for p in _MANAGED)):
        settings = _read_json(path)
        if isinstance(settings, dict):
            found.append((source, path, settings))
    return found


def _approves(settings: dict[str, Any], name: str, key: str = "enabledMcpjsonServers") -> bool:
    """Whether ``settings`` list ``name`` under ``key`` (or approve every server), by Claude Code's
    comparison: each character but letters, digits, ``_`` and ``-`` counts as ``_``."""
    names = settings.get(key)
    if key == "enabledMcpjsonServers" and settings.get("enableAllProjectMcpServers") is True:
        return True
    return isinstance(names, list) and _claude_name(name) in (_claude_name(str(n)) for n in names)


def _claude_name(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_-]", "_", name)


def claude_approval(root: Path, name: str, home: Path) -> Approval:
    """What Claude Code shows for the server ``name`` of ``root``'s ``.mcp.json`` (see the module's
    docstring for its rule)."""
    settings = _claude_settings(root, home)
    for _source, path, values in settings:
        if _approves(values, name, "disabledMcpjsonServers"):
            return Approval("rejected", f"disabledMcpjsonServers in {path} rejects it", rejected_by=path)
    trusted = _claude_trusted(root, home)
    ignored = None if trusted else local_settings_ignored(root)
    for source, path, values in settings:
        counts = trusted or source in ("user", "policy") or (source == "local" and ignored is None) or (
            source == "project" and root == home)
        if counts and _approves(values, name):
            return Approval("approved", f"approved in {path}" + ("" if trusted else " (the folder is not trusted)"))
    if ignored is None:
        return Approval("pending", "no settings file approves it")
    local = root / _LOCAL
    said = f"{local} approves it, but" if any(
        source == "local" and _approves(values, name) for source, _path, values in settings) else "and"
    return Approval("pending", f"{said} Claude Code counts {_LOCAL} only in a folder you trust: {ignored}",
                    needs_trust=True)


def approve_claude_server(root: Path, name: str, *, backup_dir: Path) -> Outcome:
    """Approve ``root``'s ``.mcp.json`` server ``name`` in ``.claude/settings.local.json``, as Claude
    Code's prompt does (and take it out of that file's ``disabledMcpjsonServers``).

    Raises:
        AgentConfigError: the file or its directory is a symlink, or the file is not a JSON object.
    """
    for path in (root / ".claude", root / _LOCAL):
        if path.is_symlink():
            raise AgentConfigError(f"{path} is a symlink: not written through (Claude Code ignores it too); "
                                   f"approve the server in Claude Code (/mcp)")

    def approve(settings: dict[str, Any]) -> bool:
        enabled = settings.get("enabledMcpjsonServers")
        disabled = settings.get("disabledMcpjsonServers")
        if not isinstance(enabled, list):
            enabled = settings["enabledMcpjsonServers"] = []
        changed = name not in enabled
        if changed:
            enabled.append(name)
        if isinstance(disabled, list) and name in disabled:
            disabled.remove(name)
            changed = True
        return changed

    return update_json(root / _LOCAL, approve, backup_dir=backup_dir)


def withdraw_claude_approval(root: Path, name: str, *, backup_dir: Path) -> Outcome:
    """Take ``name`` out of ``enabledMcpjsonServers`` in ``root``'s ``.claude/settings.local.json``
    (``disconnect``): Claude Code approves by name, and a server of that name a pulled ``.mcp.json``
    brings later must be asked about again."""
    path = root / _LOCAL
    if not os.path.lexists(path) or any(p.is_symlink() for p in (root / ".claude", path)):
        return Outcome(False, path, None, "absent")

    def withdraw(settings: dict[str, Any]) -> bool:
        enabled = settings.get("enabledMcpjsonServers")
        if not isinstance(enabled, list) or name not in enabled:
            return False
        enabled.remove(name)
        return True

    return update_json(path, withdraw, backup_dir=backup_dir)


def folder_trusted(agent: str, root: Path, home: Path, environ: dict[str, str] | None = None) -> bool:
    """Whether ``agent`` trusts the project folder ``root`` (Claude Code: for its approvals)."""
    if agent == "claude":
        return _claude_trusted(root, home)
    if agent in ("gemini", "qwen"):
        return _folder_rule(home / f".{agent}" / "trustedFolders.json", root)
    if agent == "codex":
        return _codex_trusts(_codex_config(home, environ), root)
    return True


def _folder_rule(store: Path, folder: Path) -> bool:
    """Gemini CLI's (and Qwen Code's) rule: a TRUST_FOLDER entry covers it and what is below it,
    TRUST_PARENT the entry's parent; the longest matching entry decides."""
    rules = _read_json(store)
    best: tuple[int, bool] | None = None
    for path, level in rules.items() if isinstance(rules, dict) else ():
        base = Path(path).parent if level == "TRUST_PARENT" else Path(path)
        if folder == base or base in folder.parents:
            depth = len(base.parts)
            if best is None or depth > best[0]:
                best = (depth, level in ("TRUST_FOLDER", "TRUST_PARENT"))
    return bool(best and best[1])


def _codex_config(home: Path, environ: dict[str, str] | None) -> Path:
    env = os.environ if environ is None else environ
    return Path(env.get("CODEX_HOME") or home / ".codex") / "config.toml"


def _codex_trusts(config_file: Path, root: Path) -> bool:
    import tomllib  # lazy: only for Codex

    try:
        config = tomllib.loads(config_file.read_text())
    except (OSError, ValueError):
        return False
    projects = config.get("projects") or {}
    return any(
        isinstance(v, dict) and v.get("trust_level") == "trusted" and (root == Path(k) or Path(k) in root.parents)
        for k, v in projects.items()
    )


def trust_folder(agent: str, root: Path, home: Path, *, backup_dir: Path,
                 environ: dict[str, str] | None = None) -> Outcome:
    """Record that ``agent`` trusts the project folder ``root``, where its own trust prompt does.

    Raises:
        AgentConfigError: the agent has no folder trust, or its file cannot be changed safely.
    """
    if agent == "claude":
        key = str(claude_project_key(root))

        def accept(config: dict[str, Any]) -> bool:
            projects = config.setdefault("projects", {})
            if not isinstance(projects, dict):
                raise AgentConfigError(f"{home / '.claude.json'}: 'projects' is not an object; nothing was changed")
            entry = projects.setdefault(key, {})
            if not isinstance(entry, dict) or entry.get("hasTrustDialogAccepted") is True:
                return False
            entry["hasTrustDialogAccepted"] = True
            return True

        return update_json(home / ".claude.json", accept, backup_dir=backup_dir)
    if agent in ("gemini", "qwen"):
        def add(rules: dict[str, Any]) -> bool:
            if rules.get(str(root)) == "TRUST_FOLDER":
                return False
            rules[str(root)] = "TRUST_FOLDER"
            return True

        return update_json(home / f".{agent}" / "trustedFolders.json", add, backup_dir=backup_dir)
    if agent == "codex":
        return _codex_trust(_codex_config(home, environ), root, backup_dir)
    raise AgentConfigError(f"{INFO[agent].title} has no folder trust: nothing to do")


def _codex_trust(config_file: Path, root: Path, backup_dir: Path) -> Outcome:
    """``[projects."ROOT"] trust_level = "trusted"`` in Codex's config.toml, comments kept."""

    def trust(document: Any) -> bool:
        import tomlkit  # lazy: only here, a style-preserving TOML writer

        projects = document.get("projects")
        if projects is None:
            projects = document["projects"] = tomlkit.table(is_super_table=True)
        elif not isinstance(projects, dict):
            raise AgentConfigError(f"{config_file}: 'projects' is not a table; nothing was changed")
        entry = projects.get(str(root))
        if isinstance(entry, dict) and entry.get("trust_level") == "trusted":
            return False
        if not isinstance(entry, dict):
            entry = projects[str(root)] = tomlkit.table()
        entry["trust_level"] = "trusted"
        return True

    return update_toml(config_file, trust, backup_dir=backup_dir)
