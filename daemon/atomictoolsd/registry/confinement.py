"""How each tools directory may run: with the user's full rights, confined, or not at all.

The daemon asks this for every tools dir whenever trust may have changed (``Registry.judge``). It
reads the trust level of a project (``trust --sandbox`` or plain ``trust``), the user's widening of
the sandbox (``trust --sandbox --allow-…`` in the trust store, ``sandbox_allow_*`` in the
configuration: both the user's, never a repository's) and what the kernel can enforce
(``workers/runtime/sandbox.support``). A project trusted with ``--sandbox`` on a machine that cannot confine
it is blocked with the reason: nothing here ever hands a worker less confinement than was chosen.

It never applies a confinement (the worker does, ``workers/runtime/sandbox.confine``) and never writes trust.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from atomictoolsd.config.settings import Config
    from atomictoolsd.registry.model import Judgement, ToolsDir
    from atomictoolsd.registry.trust import TrustStore

__all__ = ["judge", "policy"]

_FULL: Judgement = (True, None, None)


def _dirs(value: str | list[str] | None, home: Path) -> list[str]:
    if not value:
        return []
    items = value.split(os.pathsep) if isinstance(value, str) else value
    out = []
    for item in items:
        item = str(item).strip()
        if item:
            path = home / item[2:] if item == "~" or item.startswith("~/") else Path(item)
            out.append(os.path.realpath(path))  # Landlock binds the directory, not the path to it
    return out


def policy(read: list[str], write: list[str], allow: dict[str, Any], config: Config, home: Path) -> dict[str, Any]:
    """The policy a confined worker applies: what it reads, writes, and whether it has the network."""
    write = [*write, *_dirs(config.sandbox_allow_write, home), *_dirs(allow.get("write"), home)]
    read = [*read, *_dirs(config.sandbox_allow_read, home), *_dirs(allow.get("read"), home)]
    return {
        "read": sorted(set(read)),
        "write": sorted(set(write)),
        "net": bool(config.sandbox_allow_net or allow.get("net")),
    }


def judge(tools_dir: ToolsDir, config: Config, store: TrustStore, home: Path) -> Judgement:
    """``(loads, policy or None, why blocked or None)`` for ``tools_dir`` now."""
    if tools_dir.scope == "builtin":
        return _FULL
    if tools_dir.scope == "global":
        if not config.sandbox_global:
            return _FULL
        read, write, allow = [str(tools_dir.path)], [], {}
        what = "the global tools are confined (sandbox_global)"
    else:
        if config.trust_all:
            return _FULL
        entry = store.entry(tools_dir.cwd)
        if entry is None:
            return (False, None, None)
        if entry.get("level", "full") != "sandbox":
            return _FULL
        read = write = [str(tools_dir.cwd)]
        allow = entry.get("allow") or {}
        what = "this project is trusted with --sandbox"
    from atomictoolsd.workers.runtime import sandbox  # ctypes, only once a dir is to be confined

    support = sandbox.support()
    if not support["available"]:
        return (False, None, f"{what}, but {support['reason']}: its tools do not run unconfined")
    return (True, policy(read, write, allow, config, home), None)
