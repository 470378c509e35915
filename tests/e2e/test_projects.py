"""Projects in a long-running daemon: held while a session is attached, forgotten some time after the
last one left (with their watch, tools dir and workers), rebuilt cheaply when attached again; and
attaching one more project costs the watcher that project's directory only."""

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


def test_a_project_no_session_uses_is_forgotten_and_rebuilt_from_the_cache(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    held, idle = (env.root / "held").resolve(), (env.root / "idle").resolve()
    for root in (held, idle):
        env.write_tool(root / ".atomic" / "tools", f"{root.name}.py",
                       f"import os\n\ndef {root.name}() -> str:\n    return str(os.getpid())\n")
    daemon: Daemon = make_daemon({"ATOMICTOOLS_IDLE_TIMEOUT": "0.5"})
    with daemon.client(held) as holder:
        assert holder.call("held").text
        with daemon.client(idle) as client:
            worker = int(client.call("idle").text)
            assert roots(holder) == {str(held), str(idle)}
        # Nobody holds idle/ now: it goes. held/ stays, though its session has been quiet longer.
        wait_for(lambda: roots(holder) == {str(held)}, timeout=30, message="the unused project to be forgotten")
        status = holder.status()
        assert module_info(holder, tool_module(idle, "idle")) is None
        assert not [p for p in status["watcher"]["watching"] if Path(p).is_relative_to(idle)]
        assert [p for p in status["watcher"]["watching"] if Path(p).is_relative_to(held)]
        wait_for(lambda: worker not in {p.pid for p in daemon.workers()}, timeout=30,
                 message="the forgotten project's worker to exit")
        assert [t["name"] for t in holder.list_tools()] == ["held"]

    with daemon.client(idle) as client:  # attached again: rebuilt, its listing from the cache
        assert [t["name"] for t in client.list_tools()] == ["idle"]
        info = module_info(client, tool_module(idle, "idle"))
        assert info is not None and info["definitionsFrom"] == "cache" and info["worker"] is None
        assert int(client.call("idle").text) != worker
        assert str(idle) in roots(client)


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


def test_a_change_made_while_the_watch_is_replaced_is_not_lost(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    # No rescan covers the global dir when another project is attached: the watch being replaced
    # must report what it saw, or these saves would never be noticed.
    daemon: Daemon = make_daemon()
    with daemon.client() as client:
        for i in range(5):
            root = env.root / f"repo{i}"
            (root / ".git").mkdir(parents=True)
            env.write_tool(env.global_tools, f"tool{i}.py", f"def tool{i}() -> str:\n    return '{i}'\n")
            with daemon.client(root):  # attached at once: the watcher restarts while the save is news
                pass
        wait_for(lambda: {f"tool{i}" for i in range(5)} <= {t["name"] for t in client.list_tools()},
                 timeout=30, message="every save made during a rewatch to be loaded")
        assert client.call("tool4").text == "4"
