"""Built-in tool ``workspace-info``: where the caller is, and which tools dirs serve it."""

from __future__ import annotations

import os
import urllib.parse
from typing import Literal

import msgspec

from atomictools import Context, tool
from atomictoolsd.builtins import BUILTIN_DIR
from atomictoolsd.builtins._common import GitCall, NotARepository, git_call, home, project_of
from atomictoolsd.config.discovery import escape_path, global_tools_dir, local_tools_dir
from atomictoolsd.registry.confinement import TRUSTED_ENV

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
    async with git_call(root, "workspace-info") as call:
        try:
            top = await call.run(["rev-parse", "--show-toplevel"], check=False)
        except NotARepository:
            top = None
        if top is not None and top.returncode == 0:
            git_root = top.stdout.strip()
            head = await call.run(["symbolic-ref", "--short", "-q", "HEAD"], check=False)
            if head.returncode == 0:
                branch = head.stdout.strip()
            else:
                commit = await call.run(["rev-parse", "--short", "HEAD"], check=False)
                branch = f"(detached at {commit.stdout.strip()})" if commit.returncode == 0 else None
            remote = await _remote_url(call)
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


async def _remote_url(call: GitCall) -> str | None:
    names = (await call.run(["remote"], check=False)).stdout.split()
    if not names:
        return None
    name = "origin" if "origin" in names else names[0]
    url = (await call.run(["remote", "get-url", name], check=False)).stdout.strip() or None
    if url and "://" in url:
        parts = urllib.parse.urlsplit(url)
        if parts.username or parts.password:  # never hand a token in a URL to the model
            host = parts.hostname or ""
            netloc = f"{host}:{parts.port}" if parts.port else host
            url = urllib.parse.urlunsplit(parts._replace(netloc=netloc))
    return url


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
