"""Built-in tool ``workspace-info``: where the caller is, and which tools dirs serve it."""

from __future__ import annotations

import os
import urllib.parse
from typing import Literal

import msgspec

from atomictools import Context, tool
from atomictoolsd.config.discovery import escape_path, global_tools_dir, local_tools_dir
from atomictoolsd.registry.confinement import TRUSTED_ENV
from atomictoolsd.worker.builtins import BUILTIN_DIR
from atomictoolsd.worker.builtins._common import NotARepository, home, project_of, read_repository

__all__ = ["ToolsDirInfo", "WorkspaceInfo", "workspace_info"]


class ToolsDirInfo(msgspec.Struct):
    path: str
    scope: Literal["local", "global", "builtin"]
    exists: bool
    trusted: bool


class WorkspaceInfo(msgspec.Struct):
    directory: str
    project_root: str
    git_root: str | None
    branch: str | None
    remote_url: str | None
    trusted: bool
    tools_dirs: list[ToolsDirInfo]


@tool(name="workspace-info", annotations={"readOnlyHint": True})
async def workspace_info(ctx: Context) -> WorkspaceInfo:
    """Describe the workspace: the project root, its git branch and remote URL, whether the project
    is trusted to load its own tools, and the tools directories in use (highest precedence first)."""
    root = project_of(ctx)
    git_root = branch = remote = None
    try:
        found = await read_repository(root, "workspace", "workspace-info")
    except NotARepository:
        pass
    else:
        git_root, branch, remote = found["git_root"], found["branch"], _without_credentials(found["remote"])
    trusted = _trusted(root)
    dirs = []
    local = local_tools_dir(root)
    global_dir = global_tools_dir(home())
    if local != global_dir:
        dirs.append(ToolsDirInfo(str(local), "local", local.is_dir(), trusted))
    # Escaped: a home whose name is not UTF-8 could not be sent (the daemon reports its tools dir).
    dirs.append(ToolsDirInfo(escape_path(str(global_dir)), "global", global_dir.is_dir(), True))
    dirs.append(ToolsDirInfo(str(BUILTIN_DIR), "builtin", True, True))
    return WorkspaceInfo(
        directory=ctx.directory,
        project_root=str(root),
        git_root=git_root,
        branch=branch,
        remote_url=remote,
        trusted=trusted,
        tools_dirs=dirs,
    )


def _without_credentials(url: str | None) -> str | None:
    """``url`` without a user name or password in it: a token in a URL never reaches the model."""
    if url and "://" in url:
        parts = urllib.parse.urlsplit(url)
        if parts.username or parts.password:
            host = parts.hostname or ""
            netloc = f"{host}:{parts.port}" if parts.port else host
            url = urllib.parse.urlunsplit(parts._replace(netloc=netloc))
    return url or None


def _trusted(root: os.PathLike[str]) -> bool:
    """Whether the daemon loads this project's own tools (same rule as the daemon: config, then store).

    A confined worker (one per project) is told by the daemon: it cannot read the trust store."""
    told = os.environ.get(TRUSTED_ENV)
    if told is not None:
        return told == "1"
    from atomictoolsd.config.paths import PathError, Paths  # lazy: the worker's start-up cost
    from atomictoolsd.config.settings import ConfigError, load_config  # lazy: the worker's start-up cost
    from atomictoolsd.registry.trust import TrustStore  # lazy: the worker's start-up cost

    try:
        paths = Paths.from_env()
    except PathError:  # the daemon itself refused these places: it trusts nothing from them either
        return False
    try:
        if load_config(paths.config_file).trust_all:
            return True
    except ConfigError:
        pass
    return TrustStore(paths.state_dir).is_trusted(root)
