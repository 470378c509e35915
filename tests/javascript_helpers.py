"""What the TypeScript and JavaScript tool tests need: Bun, Node 22 and the packages tools import
(zod 4, @opencode-ai/plugin, @github/copilot-sdk), all from npm into ``.ci/agents/node_modules``
(``.ci/run`` installs them; by hand: ``npm install --prefix .ci/agents --no-audit --no-fund``). A
test skips, saying how to install, when what it needs is not there.

The daemon is pointed at them by its settings: ``js_runtime`` (the executable) and ``js_packages``
(``.ci/agents``, whose ``node_modules`` holds the packages), so it never installs anything itself.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

__all__ = ["AGENTS", "PACKAGES", "bun", "js_settings", "node"]

AGENTS = Path(__file__).resolve().parents[1] / ".ci" / "agents"
PACKAGES = AGENTS / "node_modules"
_INSTALL = "run `npm install --prefix .ci/agents --no-audit --no-fund` (.ci/run does)"


def _require_packages() -> None:
    missing = [name for name in ("zod", "@opencode-ai/plugin", "@github/copilot-sdk") if not (PACKAGES / name / "package.json").is_file()]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed in .ci/agents: {_INSTALL}")


def bun() -> str:
    """Bun from npm (``.ci/agents/node_modules/.bin/bun``); skips when it is not installed."""
    _require_packages()
    path = PACKAGES / ".bin" / "bun"
    if not path.exists() or not os.access(path, os.X_OK):
        pytest.skip(f"Bun is not installed in .ci/agents: {_INSTALL}")
    return str(path)


def node() -> str:
    """Node 22 from npm (``node@22`` in ``.ci/agents``); skips when it is not installed."""
    _require_packages()
    path = PACKAGES / "node" / "bin" / "node"
    if not path.exists():
        pytest.skip(f"Node 22 is not installed in .ci/agents: {_INSTALL}")
    return str(path)


def js_settings(runtime: str) -> dict[str, str]:
    """The daemon's environment for TypeScript tools on ``runtime``: "bun", "node", or "node-thread"
    (Node with the module hooks of Node before 22.15, which run in a thread of their own)."""
    executable = bun() if runtime == "bun" else node()
    extra = {"ATOMICTOOLS_NODE_HOOKS": "thread"} if runtime == "node-thread" else {}
    # The runtime's directory first on PATH: a tool that runs `bun` (Atomic's lint example) finds it.
    path = os.pathsep.join([str(Path(executable).parent), os.environ.get("PATH", "")])
    return {
        "ATOMICTOOLS_JS_RUNTIME": executable, "ATOMICTOOLS_JS_PACKAGES": str(AGENTS), "ATOMICTOOLS_OPENCODE_DIRS": "1",
        "PATH": path, **extra,
    }
