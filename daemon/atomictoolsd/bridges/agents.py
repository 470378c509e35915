"""What each coding agent needs to launch the shim: where its MCP config lives and the entry's shape.

``connect`` merges one server entry into an agent's config file (JSON, or TOML for Codex), keeping
every other key and server, writing atomically and backing up the file it changed; ``disconnect``
removes exactly that entry. Bridges use the same shapes for the snippet they print.

Must never: rewrite a file it could not parse (the user gets the snippet to add by hand instead),
touch any entry but the one named, or import tomlkit unless a TOML file is being written.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import stat
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from atomictools._launch import SEALED_FLAGS
from atomictools._paths import login_runtime_dir, runtime_dir
from atomictoolsd.config.paths import make_private_dirs
from atomictoolsd.config.statefile import StateWriteError, explain_write_error, write_atomic

__all__ = [
    "AGENTS",
    "BRIDGE_AGENTS",
    "DEFAULT_SCOPE",
    "DISPATCHER_BY_DEFAULT",
    "INFO",
    "HTTP_AGENTS",
    "SERVER_NAME",
    "TOKEN_VARIABLE",
    "TokenSource",
    "AgentInfo",
    "AgentConfigError",
    "ConfigFile",
    "Outcome",
    "add_server",
    "config_file",
    "entry_command",
    "entry_url",
    "http_entry",
    "project_command",
    "read_config",
    "read_server",
    "read_servers",
    "remove_server",
    "runtime_pin",
    "server_entry",
    "servers_key",
    "shim_command",
    "snippet",
    "token_source",
    "update_json",
    "update_toml",
]

Scope = Literal["project", "user"]
Refresh = Literal["yes", "partial", "no", "unknown"]

SERVER_NAME = "atomic"


@dataclass(frozen=True)
class AgentInfo:
    """What ``connect`` and ``doctor`` know of one agent (docs/agents.md has the same table)."""

    name: str
    title: str
    scopes: tuple[Scope, ...]  # the first is where ``connect`` writes by default: the agent's own default
    refreshes: Refresh  # does it re-list tools on notifications/tools/list_changed
    refresh_note: str
    # The environment it starts a server with: "full" (its own, plus the entry's env) or "minimal"
    # (HOME, LOGNAME, PATH, SHELL, TERM, USER, plus the entry's env: XDG_RUNTIME_DIR is dropped).
    environment: Literal["full", "minimal"]
    cli: str | None = None  # its command-line program, when it has one

    @property
    def dispatcher(self) -> bool:
        """Whether its entry gets the dispatcher's meta-tools by default: it does not surely re-list."""
        return self.refreshes != "yes"


_INFO = (
    AgentInfo("claude", "Claude Code", ("project", "user"), "partial",
              "re-lists on list_changed in some versions, not in others: often not until /mcp or a restart",
              "full", "claude"),
    AgentInfo("opencode", "OpenCode", ("project", "user"), "yes", "re-lists on list_changed", "full", "opencode"),
    AgentInfo("codex", "Codex", ("user", "project"), "no",
              "lists a server's tools once per session and ignores list_changed (documented)", "minimal", "codex"),
    AgentInfo("copilot", "Copilot CLI", ("user",), "yes", "re-lists on its next turn", "full", "copilot"),
    AgentInfo("cursor", "Cursor", ("project", "user"), "yes", "re-lists on list_changed", "full", None),
    AgentInfo("gemini", "Gemini CLI", ("project", "user"), "partial",
              "handles list_changed since 0.20, with open reports of tools that stay stale; /mcp refresh re-lists",
              "full", "gemini"),
    AgentInfo("qwen", "Qwen Code", ("project", "user"), "no",
              "receives list_changed and does not re-list (0.24); /mcp refresh or a restart does", "full", "qwen"),
    AgentInfo("vscode", "VS Code", ("project", "user"), "yes", "re-lists on list_changed", "full", "code"),
    AgentInfo("claude-desktop", "Claude Desktop", ("user",), "unknown",
              "not documented; a restart of the app re-lists", "minimal", None),
)
INFO: dict[str, AgentInfo] = {info.name: info for info in _INFO}
AGENTS: tuple[str, ...] = tuple(INFO)
BRIDGE_AGENTS: tuple[str, ...] = (*AGENTS, "generic")

# Where ``connect`` writes when neither --project nor --user is given: the scope each agent's own
# ``mcp add`` defaults to, or the only one it has.
DEFAULT_SCOPE: dict[str, Scope] = {info.name: info.scopes[0] for info in _INFO}

# Agents that do not surely re-list tools on notifications/tools/list_changed get the dispatcher
# meta-tools by default (docs/agents.md).
DISPATCHER_BY_DEFAULT = frozenset(info.name for info in _INFO if info.dispatcher)

# Agents that start servers from wherever they happen to be, but expand this in their config.
_WORKSPACE_VARIABLE = {"cursor": "${workspaceFolder}", "vscode": "${workspaceFolder}"}


class AgentConfigError(Exception):
    """A config file cannot be changed safely; the message says why and what to do."""


@dataclass(frozen=True)
class ConfigFile:
    """One agent's MCP config file and where the servers sit in it."""

    agent: str
    scope: Scope
    path: Path
    format: Literal["json", "toml"]
    key: str  # the table of servers: mcpServers, mcp, mcp_servers or servers


@dataclass(frozen=True)
class Outcome:
    """What ``add_server`` / ``remove_server`` did."""

    changed: bool
    path: Path
    backup: Path | None
    action: Literal["added", "updated", "unchanged", "removed", "absent"]


def config_file(agent: str, scope: Scope, *, home: Path, root: Path, environ: Mapping[str, str] | None = None,
                platform: str | None = None) -> ConfigFile:
    """The config file ``agent`` reads MCP servers from, for ``scope``.

    Args:
        home: the user's home directory.
        root: the project root (for ``project`` scope).
        environ: the environment (``XDG_CONFIG_HOME``, ``CODEX_HOME``, ``APPDATA``).
        platform: ``sys.platform`` (for the apps whose user config lives per OS).

    Raises:
        AgentConfigError: the agent has no config file of that scope.
    """
    env = os.environ if environ is None else environ
    platform = platform or sys.platform
    info = INFO.get(agent)
    if info is None:
        raise AgentConfigError(f"unknown agent {agent!r}; choose one of {', '.join(AGENTS)}")
    if scope not in info.scopes:
        other = "--user" if scope == "project" else "--project"
        raise AgentConfigError(f"{info.title} reads MCP servers only from its {info.scopes[0]} config: use {other}")
    config_home = Path(env.get("XDG_CONFIG_HOME") or home / ".config")
    if agent == "claude":
        if scope == "project":
            return ConfigFile(agent, scope, root / ".mcp.json", "json", "mcpServers")
        return ConfigFile(agent, scope, home / ".claude.json", "json", "mcpServers")
    if agent == "opencode":
        if scope == "project":
            return ConfigFile(agent, scope, _opencode_file(root), "json", "mcp")
        return ConfigFile(agent, scope, _opencode_file(config_home / "opencode"), "json", "mcp")
    if agent == "codex":
        if scope == "project":  # read by Codex only in projects it trusts
            return ConfigFile(agent, scope, root / ".codex" / "config.toml", "toml", "mcp_servers")
        codex_home = Path(env.get("CODEX_HOME") or home / ".codex")
        return ConfigFile(agent, scope, codex_home / "config.toml", "toml", "mcp_servers")
    if agent == "copilot":
        return ConfigFile(agent, scope, home / ".copilot" / "mcp-config.json", "json", "mcpServers")
    if agent in ("cursor", "gemini", "qwen"):
        folder = {"cursor": ".cursor", "gemini": ".gemini", "qwen": ".qwen"}[agent]
        name = "mcp.json" if agent == "cursor" else "settings.json"
        return ConfigFile(agent, scope, (root if scope == "project" else home) / folder / name, "json", "mcpServers")
    if agent == "vscode":
        if scope == "project":
            return ConfigFile(agent, scope, root / ".vscode" / "mcp.json", "json", "servers")
        return ConfigFile(agent, scope, _app_config_dir("Code", home, env, platform, config_home) / "User" / "mcp.json",
                          "json", "servers")
    # claude-desktop
    return ConfigFile(agent, scope, _app_config_dir("Claude", home, env, platform, config_home)
                      / "claude_desktop_config.json", "json", "mcpServers")


def _app_config_dir(app: str, home: Path, env: Mapping[str, str], platform: str, config_home: Path) -> Path:
    """Where a desktop app (VS Code, Claude Desktop) keeps its settings on this OS."""
    if platform == "darwin":
        return home / "Library" / "Application Support" / app
    if platform.startswith("win"):
        return Path(env.get("APPDATA") or home / "AppData" / "Roaming") / app
    return config_home / app


def _opencode_file(directory: Path) -> Path:
    # OpenCode reads opencode.json or opencode.jsonc; write to whichever exists.
    jsonc = directory / "opencode.jsonc"
    return jsonc if jsonc.exists() and not (directory / "opencode.json").exists() else directory / "opencode.json"


def shim_command(python: str | None = None) -> list[str]:
    """The command that starts the shim with this installation's interpreter (user-scoped entries).

    ``python -E -P -m atomictoolsd mcp``, not the ``atomictoolsd`` console script: an agent starts
    it from whatever repository it is in, with whatever environment its config or the repository's
    tooling gives it, and a console script's interpreter reads ``PYTHONPATH`` (a planted
    ``sitecustomize.py``) before any line of ours runs. ``-E`` ignores every ``PYTHON*`` variable;
    ``-P`` keeps the working directory off ``sys.path``, which ``-m`` alone would put first. The
    interpreter path is used as it is, never resolved: a virtualenv's ``bin/python`` is a symlink out
    of the virtualenv.
    """
    return [python or sys.executable, *SEALED_FLAGS, "-m", "atomictoolsd", "mcp"]


PROJECT_PROGRAM = "atomictoolsd"
# A project file is committed and read on a teammate's machine, where this interpreter's path means
# nothing: the entry names the console script, found on PATH. Its interpreter reads the agent's
# PYTHON* variables (there is no -E for a console script; Gemini CLI refuses an entry that would
# override PYTHONPATH), so what they plant runs in the shim, in the agent's own session with the
# agent's rights; never in the daemon, which the shim starts sealed (atomictools._launch).


def project_command() -> list[str]:
    """The portable command of project-scoped entries: ``atomictoolsd mcp``, found on PATH."""
    return [PROJECT_PROGRAM, "mcp"]


def entry_command(agent: str, scope: Scope, *, dispatcher: bool | None = None, allow: Sequence[str] = (),
                  deny: Sequence[str] = ()) -> list[str]:
    """The command (program and arguments) of ``agent``'s entry for ``scope``."""
    command = project_command() if scope == "project" else shim_command()
    command += ["--agent", agent]
    if INFO[agent].dispatcher if dispatcher is None else dispatcher:
        command.append("--dispatcher")
    if agent in _WORKSPACE_VARIABLE:
        command += ["--directory", _WORKSPACE_VARIABLE[agent]]
    for glob in allow:
        command += ["--allow", glob]
    for glob in deny:
        command += ["--deny", glob]
    return command


def runtime_pin(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``ATOMICTOOLS_RUNTIME_DIR`` for a user-scoped entry, when an agent that starts the shim
    without ``XDG_RUNTIME_DIR`` (Codex, Claude Desktop, the MCP SDKs) would otherwise look for the
    daemon somewhere else than this shell does; else nothing.

    Without the variable, the shim finds ``/run/user/<uid>`` (atomictools._paths), which is where a
    login session's ``XDG_RUNTIME_DIR`` points: that common case needs no pin.
    """
    env = os.environ if environ is None else environ
    explicit = env.get("ATOMICTOOLS_RUNTIME_DIR") or env.get("ATOMICTOOLS_SOCKET")
    xdg = env.get("XDG_RUNTIME_DIR", "").strip()
    if not explicit and (not xdg or (login_runtime_dir() or "") == xdg.rstrip("/")):
        return {}
    return {"ATOMICTOOLS_RUNTIME_DIR": runtime_dir()}


def server_entry(agent: str, command: list[str], env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The server entry, in ``agent``'s shape, that runs ``command`` (program and arguments)."""
    program, args = command[0], list(command[1:])
    environment = dict(env or {})
    if agent == "claude":
        return {"type": "stdio", "command": program, "args": args, "env": environment}
    if agent == "opencode":
        return {"type": "local", "command": [program, *args], "environment": environment, "enabled": True}
    if agent == "copilot":
        entry: dict[str, Any] = {"type": "local", "command": program, "args": args, "tools": ["*"]}
    elif agent == "vscode":
        entry = {"type": "stdio", "command": program, "args": args}
    else:  # codex, cursor, gemini, qwen, claude-desktop, generic
        entry = {"command": program, "args": args}
    if environment:
        entry["env"] = environment
    return entry


# The variable an HTTP entry reads the daemon's token from (`atomictoolsd http token --show`): the
# token itself is never written into a config file, which may be committed or synced.
TOKEN_VARIABLE = "ATOMICTOOLS_TOKEN"
# How each agent's config expands an environment variable in a header (or names the variable).
_TOKEN_REFERENCE = {
    "claude": "${%s}", "copilot": "${%s}", "cursor": "${env:%s}", "vscode": "${env:%s}",
    "gemini": "$%s", "qwen": "$%s", "opencode": "{env:%s}",
}
HTTP_AGENTS = (*_TOKEN_REFERENCE, "codex")


def http_entry(agent: str, url: str) -> dict[str, Any]:
    """The server entry, in ``agent``'s shape, for the daemon's Streamable HTTP endpoint ``url``,
    its bearer token read from ``TOKEN_VARIABLE``.

    Raises:
        AgentConfigError: the agent's config cannot name an HTTP server (Claude Desktop).
    """
    if agent == "codex":
        return {"url": url, "bearer_token_env_var": TOKEN_VARIABLE}
    reference = _TOKEN_REFERENCE.get(agent)
    if reference is None:
        raise AgentConfigError(
            f"{INFO[agent].title if agent in INFO else agent} cannot connect to an MCP server by URL in its config "
            f"file: connect it without --http (it launches the shim)"
        )
    headers = {"Authorization": "Bearer " + reference % TOKEN_VARIABLE}
    if agent in ("gemini", "qwen"):
        return {"httpUrl": url, "headers": headers}
    if agent == "opencode":
        return {"type": "remote", "url": url, "headers": headers, "enabled": True}
    if agent == "copilot":
        return {"type": "http", "url": url, "headers": headers, "tools": ["*"]}
    if agent == "cursor":
        return {"url": url, "headers": headers}
    return {"type": "http", "url": url, "headers": headers}  # claude, vscode


def servers_key(agent: str) -> str:
    """The key (table) of MCP servers in ``agent``'s config."""
    return {"opencode": "mcp", "codex": "mcp_servers", "vscode": "servers"}.get(agent, "mcpServers")


def snippet(agent: str, command: list[str], name: str = SERVER_NAME, env: Mapping[str, str] | None = None,
            entry: dict[str, Any] | None = None) -> str:
    """Config text to paste into ``agent``'s MCP config (for ``generic``: a JSON server entry);
    ``entry`` instead of the shim's for another kind of entry (HTTP)."""
    entry = entry if entry is not None else server_entry(agent, command, env)
    if agent == "codex":
        return _toml_table(name, entry)
    return json.dumps({servers_key(agent): {name: entry}}, indent=2)


def _toml_value(value: Any) -> str:
    if isinstance(value, dict):  # an inline table; keys are environment variable names
        return "{ " + ", ".join(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in value.items()) + " }"
    return json.dumps(value)  # a JSON string or array of strings is valid TOML


def _toml_table(name: str, entry: dict[str, Any]) -> str:
    lines = [f"[mcp_servers.{name}]"]  # server names follow the tool-name rule: valid bare TOML keys
    for key, value in entry.items():
        lines.append(f"{key} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"


def read_servers(target: ConfigFile) -> dict[str, Any]:
    """Every server entry in ``target`` by name, as plain data; {} when the file or its table of
    servers is missing.

    Raises:
        AgentConfigError: the file exists but does not parse.
    """
    text = read_config(target.path)
    if text is None:
        return {}
    if target.format == "toml":
        servers = _toml_parse(target, text).get(target.key)
    else:
        servers = _json_document(target.path, text).get(target.key)
    if not isinstance(servers, dict):
        return {}
    return {str(name): json.loads(json.dumps(_plain(value))) for name, value in servers.items()}


def read_server(target: ConfigFile, name: str = SERVER_NAME) -> dict[str, Any] | None:
    """Server ``name``'s entry in ``target`` as plain data, or None when the file or entry is missing.

    Raises:
        AgentConfigError: the file exists but does not parse.
    """
    entry = read_servers(target).get(name)
    return entry if isinstance(entry, dict) else None


def entry_url(entry: dict[str, Any]) -> str | None:
    """The URL of an entry that connects by URL (``url``; Gemini CLI's and Qwen Code's ``httpUrl``),
    or None for one that starts a command."""
    for key in ("httpUrl", "url"):
        if isinstance(entry.get(key), str):
            return str(entry[key])
    return None


@dataclass(frozen=True)
class TokenSource:
    """Where the agent takes the bearer token of a URL entry from."""

    variable: str | None = None  # the environment variable it expands (the way ``connect`` writes)
    literal: str | None = None  # a token written in the entry itself
    problem: str | None = None  # why the agent sends no usable token, in words


# The forms of a variable each agent expands in a header's value (the first is what connect writes).
_TOKEN_FORMS = {
    "claude": (r"\$\{(\w+)\}", r"\$\{(\w+):-[^}]*\}"),
    "copilot": (r"\$\{(\w+)\}",),
    "cursor": (r"\$\{env:(\w+)\}",),
    "vscode": (r"\$\{env:(\w+)\}",),
    "gemini": (r"\$(\w+)", r"\$\{(\w+)\}"),
    "qwen": (r"\$(\w+)", r"\$\{(\w+)\}"),
    "opencode": (r"\{env:(\w+)\}",),
}


def token_source(agent: str, entry: dict[str, Any]) -> TokenSource:
    """Where ``agent`` takes the bearer token of its URL entry ``entry`` from."""
    import re  # lazy: only doctor reads tokens (start-up cost)

    if agent == "codex":
        variable = entry.get("bearer_token_env_var")
        if isinstance(variable, str) and variable:
            return TokenSource(variable=variable)
        headers = entry.get("http_headers")
    else:
        headers = entry.get("headers")
    value = next((v for k, v in headers.items() if k.lower() == "authorization"), None) if isinstance(
        headers, dict) else None
    if not isinstance(value, str):
        return TokenSource(problem="it sends no Authorization header: the daemon answers 401")
    scheme, _, token = value.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return TokenSource(problem="its Authorization header is not \"Bearer <token>\": the daemon answers 401")
    token = token.strip()
    for form in _TOKEN_FORMS.get(agent, ()):
        match = re.fullmatch(form, token)
        if match:
            return TokenSource(variable=match.group(1))
    if re.search(r"\$|\{env:", token):
        expands = f" (it expands {_TOKEN_REFERENCE[agent] % 'VAR'})" if agent in _TOKEN_REFERENCE else ""
        return TokenSource(problem=f"{INFO[agent].title} does not expand {token!r} in a header: it sends it as "
                                   f"written{expands}")
    return TokenSource(literal=token)


# -- reading and writing config files ---------------------------------------------------------------


def add_server(target: ConfigFile, entry: dict[str, Any], *, name: str = SERVER_NAME, backup_dir: Path) -> Outcome:
    """Merge server ``name`` into ``target`` (created when missing); back up the file first.

    Raises:
        AgentConfigError: the file exists but cannot be parsed, or its servers table is not a table.
    """
    text = read_config(target.path)
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
    text = read_config(target.path)
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


MAX_CONFIG_BYTES = 16 * 1024 * 1024  # ~/.claude.json grows with every project Claude Code opens


def read_config(path: Path) -> str | None:
    """The text of a config file (None when it is missing). A project's is the repository's to make:
    a FIFO or a device, which would block or never end, is refused, as is a file past
    ``MAX_CONFIG_BYTES``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise AgentConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_CONFIG_BYTES:
            what = "not a regular file" if not stat.S_ISREG(info.st_mode) else f"{info.st_size} bytes long"
            raise AgentConfigError(f"{path} is {what}; it was not read, and nothing was changed")
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read(MAX_CONFIG_BYTES + 1).decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise AgentConfigError(f"cannot read {path}: {exc}") from None
    finally:
        os.close(fd)


def _json_document(path: Path, text: str | None) -> dict[str, Any]:
    if text is None or not text.strip():
        return {}
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise AgentConfigError(f"{path} is not plain JSON ({exc}); nothing was changed. Add the entry by hand") from None
    if not isinstance(document, dict):
        raise AgentConfigError(f"{path} does not hold a JSON object; nothing was changed")
    return document


def update_json(path: Path, change: Callable[[dict[str, Any]], bool], *, backup_dir: Path) -> Outcome:
    """Apply ``change`` to the JSON object in ``path`` (created when missing) and write it back as
    ``add_server`` writes a config, when ``change`` says it changed something.

    Raises:
        AgentConfigError: the file exists but does not hold a JSON object.
    """
    text = read_config(path)
    document = _json_document(path, text)
    if not change(document):
        return Outcome(False, path, None, "unchanged")
    backup = _write(path, text, _json_dump(document, text), backup_dir)
    return Outcome(True, path, backup, "updated" if text is not None else "added")


def _json_servers(target: ConfigFile, document: dict[str, Any], create: bool) -> dict[str, Any] | None:
    servers = document.get(target.key)
    if servers is None:
        if not create:
            return None
        servers = document[target.key] = {}
    if not isinstance(servers, dict):
        raise AgentConfigError(f"{target.path}: {target.key!r} is not an object; nothing was changed")
    return servers


def _json_add(target: ConfigFile, text: str | None, name: str, entry: dict[str, Any]) -> tuple[str, str]:
    document = _json_document(target.path, text)
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
    document = _json_document(target.path, text)
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


def update_toml(path: Path, change: Callable[[Any], bool], *, backup_dir: Path) -> Outcome:
    """``update_json`` for a TOML file: ``change`` gets its tomlkit document, comments and layout kept.

    Raises:
        AgentConfigError: the file exists but is not valid TOML.
    """
    import tomlkit  # lazy: TOML configurations only (Codex)

    text = read_config(path)
    document = _toml_parse(ConfigFile("codex", "user", path, "toml", ""), text)
    if not change(document):
        return Outcome(False, path, None, "unchanged")
    backup = _write(path, text, tomlkit.dumps(document), backup_dir)
    return Outcome(True, path, backup, "updated" if text is not None else "added")


def _toml_add(target: ConfigFile, text: str | None, name: str, entry: dict[str, Any]) -> tuple[str, str]:
    import tomlkit  # lazy: only here, a style-preserving TOML writer, so comments and layout survive

    document = _toml_parse(target, text)
    servers = document.get(target.key)
    if servers is None:
        servers = tomlkit.table(is_super_table=True)
        document[target.key] = servers
    elif not isinstance(servers, dict):
        raise AgentConfigError(f"{target.path}: {target.key!r} is not a table; nothing was changed")
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
    import tomlkit  # lazy: TOML configurations only (Codex)

    document = _toml_parse(target, text)
    servers = document.get(target.key)
    if not isinstance(servers, dict) or name not in servers:
        return None
    del servers[name]
    return tomlkit.dumps(document)


def _toml_parse(target: ConfigFile, text: str | None) -> Any:
    import tomlkit  # lazy: TOML configurations only (Codex)
    from tomlkit.exceptions import ParseError  # lazy: with tomlkit

    try:
        return tomlkit.parse(text or "")
    except ParseError as exc:
        raise AgentConfigError(f"{target.path} is not valid TOML ({exc}); nothing was changed") from None


def _plain(value: Any) -> Any:
    unwrap = getattr(value, "unwrap", None)
    return unwrap() if unwrap is not None else value


def _back_up(path: Path, text: str, backup_dir: Path) -> Path:
    """Keep ``text``, the content of ``path`` before a change, in a new file of ``backup_dir``:
    named by the time, the path's hash and its name, and never one that exists (two changes in
    the same second keep both contents)."""
    make_private_dirs(backup_dir)
    tag = hashlib.sha256(str(path).encode()).hexdigest()[:8]
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for number in itertools.count(1):
        backup = backup_dir / (f"{stamp}-{tag}-{path.name}" if number == 1 else f"{stamp}-{tag}-{number}-{path.name}")
        try:
            fd = os.open(backup, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        except FileExistsError:
            continue
        try:
            with os.fdopen(fd, "wb") as file:
                file.write(text.encode("utf-8"))
                file.flush()
                os.fsync(file.fileno())
        except OSError as exc:  # the disk is full: no backup half written, and the config untouched
            backup.unlink(missing_ok=True)
            raise StateWriteError(exc.errno, explain_write_error(backup, exc)) from exc
        return backup
    raise AssertionError("unreachable")


def _write(path: Path, old_text: str | None, new_text: str, backup_dir: Path) -> Path | None:
    """Write ``new_text`` atomically, keeping the file's mode; back up ``old_text`` first.

    A config that is a symlink (``~/.claude.json`` kept in a dotfiles repository) is written where it
    points and stays a link: replacing the link itself would cut it off from the file it shares.
    """
    backup = None if old_text is None else _back_up(path, old_text, backup_dir)
    path = Path(os.path.realpath(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = path.stat().st_mode & 0o7777
    except FileNotFoundError:
        mode = 0o644
    write_atomic(path, new_text.encode("utf-8"), mode, shared_dir=True)
    return backup
