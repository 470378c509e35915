"""What each coding agent needs to launch the shim: where its MCP config lives and the entry's shape.

``connect`` merges one server entry into an agent's config file (JSON, or TOML for Codex), keeping
every other key and server, writing atomically and backing up the file it changed; ``disconnect``
removes exactly that entry. Bridges use the same shapes for the snippet they print.

Must never: rewrite a file it could not parse (the user gets the snippet to add by hand instead),
touch any entry but the one named, or import tomlkit unless a TOML file is being written.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from atomictoolsd.statefile import write_atomic

__all__ = [
    "AGENTS",
    "BRIDGE_AGENTS",
    "DEFAULT_SCOPE",
    "SERVER_NAME",
    "ConfigError",
    "ConfigFile",
    "Outcome",
    "add_server",
    "config_file",
    "remove_server",
    "server_entry",
    "shim_command",
    "snippet",
]

Agent = Literal["claude", "opencode", "codex", "copilot", "cursor"]
Scope = Literal["project", "user"]

AGENTS: tuple[str, ...] = ("claude", "opencode", "codex", "copilot", "cursor")
BRIDGE_AGENTS: tuple[str, ...] = (*AGENTS, "generic")
SERVER_NAME = "atomic"

# Where ``connect`` writes when neither --project nor --user is given: the scope each agent's own
# ``mcp add`` defaults to, or the only one it has.
DEFAULT_SCOPE: dict[str, Scope] = {
    "claude": "project",
    "opencode": "project",
    "codex": "user",
    "copilot": "user",
    "cursor": "project",
}

# Agents that do not re-list tools on notifications/tools/list_changed get the dispatcher meta-tools
# by default (docs/agents.md).
DISPATCHER_BY_DEFAULT = frozenset({"codex"})


class ConfigError(Exception):
    """A config file cannot be changed safely; the message says why and what to do."""


@dataclass(frozen=True)
class ConfigFile:
    """One agent's MCP config file and where the servers sit in it."""

    agent: str
    scope: Scope
    path: Path
    format: Literal["json", "toml"]
    key: str  # the table of servers: mcpServers, mcp or mcp_servers


@dataclass(frozen=True)
class Outcome:
    """What ``add_server`` / ``remove_server`` did."""

    changed: bool
    path: Path
    backup: Path | None
    action: Literal["added", "updated", "unchanged", "removed", "absent"]


def config_file(agent: str, scope: Scope, *, home: Path, root: Path, environ: dict[str, str] | None = None) -> ConfigFile:
    """The config file ``agent`` reads MCP servers from, for ``scope``.

    Args:
        home: the user's home directory.
        root: the project root (for ``project`` scope).
        environ: the environment (``XDG_CONFIG_HOME`` for OpenCode, ``CODEX_HOME`` for Codex).

    Raises:
        ConfigError: the agent has no config file of that scope.
    """
    env = os.environ if environ is None else environ
    if agent == "claude":
        if scope == "project":
            return ConfigFile(agent, scope, root / ".mcp.json", "json", "mcpServers")
        return ConfigFile(agent, scope, home / ".claude.json", "json", "mcpServers")
    if agent == "opencode":
        if scope == "project":
            return ConfigFile(agent, scope, _opencode_file(root), "json", "mcp")
        config_home = Path(env.get("XDG_CONFIG_HOME") or home / ".config")
        return ConfigFile(agent, scope, _opencode_file(config_home / "opencode"), "json", "mcp")
    if agent == "codex":
        if scope == "project":  # read by Codex only in projects it trusts
            return ConfigFile(agent, scope, root / ".codex" / "config.toml", "toml", "mcp_servers")
        codex_home = Path(env.get("CODEX_HOME") or home / ".codex")
        return ConfigFile(agent, scope, codex_home / "config.toml", "toml", "mcp_servers")
    if agent == "copilot":
        if scope == "project":
            raise ConfigError("Copilot CLI reads MCP servers only from ~/.copilot/mcp-config.json: use --user")
        return ConfigFile(agent, scope, home / ".copilot" / "mcp-config.json", "json", "mcpServers")
    if agent == "cursor":
        base = root if scope == "project" else home
        return ConfigFile(agent, scope, base / ".cursor" / "mcp.json", "json", "mcpServers")
    raise ConfigError(f"unknown agent {agent!r}; choose one of {', '.join(AGENTS)}")


def _opencode_file(directory: Path) -> Path:
    # OpenCode reads opencode.json or opencode.jsonc; write to whichever exists.
    jsonc = directory / "opencode.jsonc"
    return jsonc if jsonc.exists() and not (directory / "opencode.json").exists() else directory / "opencode.json"


def shim_command(python: str | None = None) -> list[str]:
    """The command that starts the shim with this installation's interpreter.

    ``python -E -P -m atomictoolsd mcp``, not the ``atomictoolsd`` console script: an agent starts
    it from whatever repository it is in, with whatever environment its config or the repository's
    tooling gives it, and a console script's interpreter reads ``PYTHONPATH`` (a planted
    ``sitecustomize.py``) before any line of ours runs. ``-E`` ignores every ``PYTHON*`` variable;
    ``-P`` keeps the working directory off ``sys.path``, which ``-m`` alone would put first. The
    interpreter path is used as it is, never resolved: a virtualenv's ``bin/python`` is a symlink out
    of the virtualenv.
    """
    from atomictools._launch import SEALED_FLAGS

    return [python or sys.executable, *SEALED_FLAGS, "-m", "atomictoolsd", "mcp"]


def server_entry(agent: str, command: list[str]) -> dict[str, Any]:
    """The server entry, in ``agent``'s shape, that runs ``command`` (program and arguments)."""
    program, args = command[0], list(command[1:])
    if agent == "claude":
        return {"type": "stdio", "command": program, "args": args, "env": {}}
    if agent == "opencode":
        return {"type": "local", "command": [program, *args], "environment": {}, "enabled": True}
    if agent == "copilot":
        return {"type": "local", "command": program, "args": args, "tools": ["*"]}
    return {"command": program, "args": args}  # codex, cursor, generic


def snippet(agent: str, command: list[str], name: str = SERVER_NAME) -> str:
    """Config text to paste into ``agent``'s MCP config (for ``generic``: a JSON server entry)."""
    entry = server_entry(agent, command)
    if agent == "codex":
        return _toml_table(name, entry)
    key = "mcp" if agent == "opencode" else "mcpServers"
    return json.dumps({key: {name: entry}}, indent=2)


def _toml_table(name: str, entry: dict[str, Any]) -> str:
    lines = [f"[mcp_servers.{name}]"]  # server names follow the tool-name rule: valid bare TOML keys
    for key, value in entry.items():
        lines.append(f"{key} = {json.dumps(value)}")  # a JSON string or array of strings is valid TOML
    return "\n".join(lines) + "\n"


# -- reading and writing config files ---------------------------------------------------------------


def add_server(target: ConfigFile, entry: dict[str, Any], *, name: str = SERVER_NAME, backup_dir: Path) -> Outcome:
    """Merge server ``name`` into ``target`` (created when missing); back up the file first.

    Raises:
        ConfigError: the file exists but cannot be parsed, or its servers table is not a table.
    """
    text = _read(target.path)
    if target.format == "toml":
        new_text, action = _toml_add(target, text, name, entry)
    else:
        new_text, action = _json_add(target, text, name, entry)
    if action == "unchanged":
        return Outcome(False, target.path, None, action)
    backup = _write(target.path, text, new_text, backup_dir)
    return Outcome(True, target.path, backup, action)


def remove_server(target: ConfigFile, *, name: str = SERVER_NAME, backup_dir: Path) -> Outcome:
    """Remove exactly server ``name`` from ``target``, leaving everything else as it was."""
    text = _read(target.path)
    if text is None:
        return Outcome(False, target.path, None, "absent")
    if target.format == "toml":
        new_text = _toml_remove(target, text, name)
    else:
        new_text = _json_remove(target, text, name)
    if new_text is None:
        return Outcome(False, target.path, None, "absent")
    backup = _write(target.path, text, new_text, backup_dir)
    return Outcome(True, target.path, backup, "removed")


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None


def _json_document(target: ConfigFile, text: str | None) -> dict[str, Any]:
    if text is None or not text.strip():
        return {}
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{target.path} is not plain JSON ({exc}); nothing was changed. Add the entry by hand"
        ) from None
    if not isinstance(document, dict):
        raise ConfigError(f"{target.path} does not hold a JSON object; nothing was changed")
    return document


def _json_servers(target: ConfigFile, document: dict[str, Any], create: bool) -> dict[str, Any] | None:
    servers = document.get(target.key)
    if servers is None:
        if not create:
            return None
        servers = document[target.key] = {}
    if not isinstance(servers, dict):
        raise ConfigError(f"{target.path}: {target.key!r} is not an object; nothing was changed")
    return servers


def _json_add(target: ConfigFile, text: str | None, name: str, entry: dict[str, Any]) -> tuple[str, str]:
    document = _json_document(target, text)
    if not document and target.agent == "opencode":
        document["$schema"] = "https://opencode.ai/config.json"
    servers = _json_servers(target, document, create=True)
    assert servers is not None
    previous = servers.get(name)
    if previous == entry:
        return text or "", "unchanged"
    servers[name] = entry
    return _json_dump(document, text), "updated" if previous is not None else "added"


def _json_remove(target: ConfigFile, text: str, name: str) -> str | None:
    document = _json_document(target, text)
    servers = _json_servers(target, document, create=False)
    if servers is None or name not in servers:
        return None
    del servers[name]
    return _json_dump(document, text)


def _json_dump(document: dict[str, Any], original: str | None) -> str:
    return json.dumps(document, indent=_indent_of(original), ensure_ascii=False) + "\n"


def _indent_of(text: str | None) -> int | str:
    """The indentation the file already uses (two spaces for a new file)."""
    for line in (text or "").splitlines()[1:]:
        stripped = line.lstrip(" \t")
        if stripped and stripped != line:
            prefix = line[: len(line) - len(stripped)]
            return "\t" if prefix.startswith("\t") else len(prefix)
    return 2


def _toml_add(target: ConfigFile, text: str | None, name: str, entry: dict[str, Any]) -> tuple[str, str]:
    import tomlkit  # only here: a style-preserving TOML writer, so comments and layout survive

    document = _toml_parse(target, text)
    servers = document.get(target.key)
    if servers is None:
        servers = tomlkit.table(is_super_table=True)
        document[target.key] = servers
    elif not isinstance(servers, dict):
        raise ConfigError(f"{target.path}: {target.key!r} is not a table; nothing was changed")
    previous = servers.get(name)
    if previous is not None and _plain(previous) == entry:
        return text or "", "unchanged"
    table = tomlkit.table()
    for key, value in entry.items():
        table[key] = value
    table.add(tomlkit.nl())
    if previous is not None:
        del servers[name]
    servers[name] = table
    return tomlkit.dumps(document), "updated" if previous is not None else "added"


def _toml_remove(target: ConfigFile, text: str, name: str) -> str | None:
    import tomlkit

    document = _toml_parse(target, text)
    servers = document.get(target.key)
    if not isinstance(servers, dict) or name not in servers:
        return None
    del servers[name]
    return tomlkit.dumps(document)


def _toml_parse(target: ConfigFile, text: str | None) -> Any:
    import tomlkit
    from tomlkit.exceptions import ParseError

    try:
        return tomlkit.parse(text or "")
    except ParseError as exc:
        raise ConfigError(f"{target.path} is not valid TOML ({exc}); nothing was changed") from None


def _plain(value: Any) -> Any:
    unwrap = getattr(value, "unwrap", None)
    return unwrap() if unwrap is not None else value


def _write(path: Path, old_text: str | None, new_text: str, backup_dir: Path) -> Path | None:
    """Write ``new_text`` atomically, keeping the file's mode; back up ``old_text`` first.

    A config that is a symlink (``~/.claude.json`` kept in a dotfiles repository) is written where it
    points and stays a link: replacing the link itself would cut it off from the file it shares.
    """
    backup = None
    if old_text is not None:
        backup_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        tag = hashlib.sha256(str(path).encode()).hexdigest()[:8]
        stamp = time.strftime("%Y%m%d-%H%M%S")
        backup = backup_dir / f"{stamp}-{tag}-{path.name}"
        write_atomic(backup, old_text.encode("utf-8"), 0o600)
    path = Path(os.path.realpath(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = path.stat().st_mode & 0o7777
    except FileNotFoundError:
        mode = 0o644
    write_atomic(path, new_text.encode("utf-8"), mode, shared_dir=True)
    return backup
