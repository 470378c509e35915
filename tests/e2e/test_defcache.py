"""The definition cache: after a restart, listing starts no worker; stale entries are re-derived."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from listener import Listener

from atomictoolsd.worker.forkserver import FORKSERVER_NAME
from helpers import Daemon, Env


def modules(client: Any) -> dict[str, dict[str, Any]]:
    return {Path(m["path"]).name: m for m in client.status()["modules"]}


def cli_list(env: Env, daemon: Daemon) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "atomictoolsd", "list", "--json", "-C", str(env.project)],
        env={**env.vars, **daemon.extra_env}, capture_output=True, text=True, check=True, timeout=60,
    )
    return json.loads(out.stdout)


def restart(env: Env, make_daemon: Any, daemon: Daemon) -> Daemon:
    daemon.stop()
    assert daemon.leftovers() == []
    return make_daemon()


def test_list_after_a_restart_starts_no_worker_and_the_first_call_does(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    env.write_tool(env.local_tools, "alpha.py", "def alpha(x: int) -> str:\n    '''First.'''\n    return f'a{x}'\n")
    env.write_tool(env.global_tools, "beta.py", "def beta() -> str:\n    '''Second.'''\n    return 'b'\n")
    env.write_tool(env.local_tools, "broken.py", "def broken(:\n")
    daemon = make_daemon()
    first = cli_list(env, daemon)
    assert daemon.workers(), "the first daemon derived the definitions in workers"

    daemon = restart(env, make_daemon, daemon)
    second = cli_list(env, daemon)
    assert second == first, "the same listing, errors included"
    # No worker: only the fork server forked at start, which has forked nothing.
    assert [p.name() for p in daemon.descendants()] == [FORKSERVER_NAME], "no worker was started to list"
    with Listener(env.socket, env.project) as listener, daemon.client() as client:
        assert [t["name"] for t in client.list_tools()] == ["alpha", "beta"]
        states = modules(client)
        assert {name: (m["state"], m["definitionsFrom"], m["worker"]) for name, m in states.items()} == {
            "alpha.py": ("ready", "cache", None),
            "beta.py": ("ready", "cache", None),
            "broken.py": ("failed", "cache", None),
        }
        assert states["broken.py"]["error"]["line"] == 1
        assert client.call("alpha", x=1).text == "a1"
        workers = daemon.workers()
        assert len(workers) == 1 and modules(client)["alpha.py"]["worker"] == workers[0].pid
        assert modules(client)["beta.py"]["worker"] is None, "only the module called has a worker"
        assert modules(client)["alpha.py"]["definitionsFrom"] == "cache", "the worker confirmed the cached definitions"
        assert "notifications/tools/list_changed" not in listener.methods(listener.sync()), (
            "the worker reported what the cache said: nothing changed for the agent"
        )


def test_entries_go_stale_with_the_module_its_helpers_or_a_new_file_and_nothing_else(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    env.write_tool(env.local_tools, "_words.py", "WORD = 'old'\n")
    env.write_tool(env.local_tools, "helped.py", "from _words import WORD\n\ndef helped() -> str:\n    return WORD\n\nhelped.__doc__ = f'Says {WORD}.'\n")
    env.write_tool(env.local_tools, "plain.py", "def plain() -> str:\n    '''Plain v1.'''\n    return 'p'\n")
    env.write_tool(env.local_tools, "steady.py", "def steady() -> str:\n    '''Steady.'''\n    return 's'\n")
    env.write_tool(env.local_tools, "needy.py", "from _missing import X\n\ndef needy() -> str:\n    return X\n")
    daemon = make_daemon()
    cli_list(env, daemon)
    daemon.stop()

    env.write_tool(env.local_tools, "_words.py", "WORD = 'new'\n")  # a helper of helped.py
    env.write_tool(env.local_tools, "plain.py", "def plain(n: int = 1) -> str:\n    '''Plain v2.'''\n    return 'p'\n")
    env.write_tool(env.local_tools, "_missing.py", "X = 'found'\n")  # what needy.py lacked
    daemon = make_daemon()
    listing = {t["name"]: t for t in cli_list(env, daemon)["tools"]}
    assert listing["helped"]["description"] == "Says new."
    assert "n" in listing["plain"]["inputSchema"]["properties"]
    assert "needy" in listing
    with daemon.client() as client:
        sources = {name: m["definitionsFrom"] for name, m in modules(client).items()}
        assert sources == {"helped.py": "worker", "plain.py": "worker", "needy.py": "worker", "steady.py": "cache"}
        assert client.call("needy").text == "found"


def test_a_worker_that_reports_other_definitions_than_the_cache_updates_the_listing(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    """The cache cannot see a data file a module reads at import; the worker's report wins."""
    data = env.local_tools / "names.txt"
    env.write_tool(env.local_tools, "names.py", f'''
        from pathlib import Path

        def names() -> str:
            return "ok"

        names.__doc__ = "Knows " + Path({str(data)!r}).read_text().strip()
    ''')
    data.write_text("alice\n")
    daemon = make_daemon()
    cli_list(env, daemon)
    daemon.stop()

    data.write_text("alice and bob\n")
    daemon = make_daemon()
    with Listener(env.socket, env.project) as listener, daemon.client() as client:
        assert client.list_tools()[0]["description"] == "Knows alice", "served from the cache"
        assert client.call("names").text == "ok"
        listener.next("notifications/tools/list_changed")
        assert client.list_tools()[0]["description"] == "Knows alice and bob"
    daemon.stop()
    daemon = make_daemon()
    with daemon.client() as client:
        assert client.list_tools()[0]["description"] == "Knows alice and bob", "the cache learned it"
        assert daemon.workers() == [], "listed from the cache, with no worker"


@pytest.mark.parametrize("corrupt", [b"{not json", b'{"runtime":"\xff"}'], ids=["not JSON", "not UTF-8"])
def test_an_unreadable_cache_is_ignored_and_rewritten(env: Env, make_daemon, corrupt: bytes) -> None:  # type: ignore[no-untyped-def]
    env.write_tool(env.local_tools, "solid.py", "def solid() -> str:\n    return 'ok'\n")
    daemon = make_daemon()
    cli_list(env, daemon)
    daemon.stop()
    (cache_file,) = (env.root / "cache" / "atomictools" / "definitions").glob("*.json")
    cache_file.write_bytes(corrupt)
    daemon = make_daemon()
    with daemon.client() as client:
        assert [t["name"] for t in client.list_tools()] == ["solid"]
        assert modules(client)["solid.py"]["definitionsFrom"] == "worker"
    daemon.stop()
    assert list(json.loads(cache_file.read_text())["modules"]) == [str(env.local_tools / "solid.py")]


def test_the_cache_is_per_runtime_version(env: Env, tmp_path: Path) -> None:
    from atomictoolsd.config.discovery import list_module_files
    from atomictoolsd.registry.cache import CacheEntry, DefinitionCache

    tools = env.write_tool(env.local_tools, "one.py", "def one() -> str:\n    return '1'\n").parent
    (file,) = list_module_files(tools)
    cache = DefinitionCache(tmp_path / "c", runtime="r1")
    cache.store(tools, {file.path: CacheEntry(file.size, file.mtime_ns, definitions=[{"name": "one"}])})
    assert DefinitionCache(tmp_path / "c", runtime="r1").lookup(tools, file) is not None
    assert DefinitionCache(tmp_path / "c", runtime="r2").lookup(tools, file) is None
    os.utime(file.path, ns=(file.mtime_ns, file.mtime_ns + 1))
    (touched,) = list_module_files(tools)
    assert DefinitionCache(tmp_path / "c", runtime="r1").lookup(tools, touched) is None
