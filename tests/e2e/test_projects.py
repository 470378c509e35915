"""Projects in a long-running daemon: attaching one more project costs the watcher that project's
directory only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from helpers import Daemon, Env, wait_for


def roots(client: Any) -> set[str]:
    return {p["root"] for p in client.status()["projects"]}


def tool_module(root: Path, name: str) -> Path:
    return root / ".atomic" / "tools" / f"{name}.py"


def module_info(client: Any, path: Path) -> dict[str, Any] | None:
    return next((m for m in client.status()["modules"] if m["path"] == str(path)), None)


def test_attaching_another_project_rescans_only_its_own_tools_dir(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    daemon: Daemon = make_daemon()
    with daemon.client() as client:

        def rescans() -> int:
            return client.status()["watcher"]["rescans"]

        wait_for(lambda: rescans() >= 2, message="the global dir's and the first project's rescans")
        start = rescans()
        for i in range(6):
            root = env.root / f"repo{i}"
            (root / ".git").mkdir(parents=True)
            before = rescans()
            with daemon.client(root):
                pass
            # The new project's tools dir (not there yet: its root is watched for it) is rescanned;
            # the dirs watched before are not (the old watch reported what it saw before it went).
            wait_for(lambda before=before: rescans() > before, message=f"repo{i}'s rescan")
        assert rescans() - start <= 6 + 2, "each attach rescans one directory, not every one in use"
