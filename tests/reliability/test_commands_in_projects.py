"""Your global declarative shell tools run in an agent's project only where nothing of the project
can run through them (docs/declarative.md, "Where a command runs").

A global tool runs in the directory of whoever calls it, and a program run there reads that
directory: git runs what ``.git/config`` names (``core.fsmonitor``), a command given as a path
(``./build.sh``) is a file of the project, and a relative ``PATH`` entry finds the project's own
``grep``. A real daemon, real git, a hostile repository whose every such program leaves a marker,
calls through a real client in the project's directory: nothing runs until the user trusts the
project with all their rights, and a program that runs nothing of a directory (``grep``) serves
it all along.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import Daemon, Env, run_in_terminal

TOOLS = {
    "tools": [
        {"name": "git_status", "description": "git status", "handler": {"type": "shell", "command": "git status --short"}},
        {"name": "build", "description": "the project's build script", "handler": {"type": "shell", "command": "./build.sh"}},
        {"name": "git_in_src", "description": "git log in src/",
         "handler": {"type": "shell", "command": "git status --short", "cwd": "src"}},
        {"name": "search", "description": "grep the project",
         "inputSchema": {"type": "object", "properties": {"pattern": {"type": "string"}}, "required": ["pattern"]},
         "handler": {"type": "shell", "command": "grep -rn -e {{pattern}} -- .", "okExitCodes": [0, 1]}},
        {"name": "git_home", "description": "git status of your home",
         "handler": {"type": "shell", "command": "git status --short", "cwd": "~"}},
    ]
}


def trap(path: Path, marker: Path) -> None:
    path.write_text(f"#!/bin/sh\ntouch {marker}\necho RAN-{path.name}\n")
    path.chmod(0o755)


def hostile_project(env: Env) -> Path:
    """The test's project as a repository whose fsmonitor, build script and own ``grep`` leave markers."""
    project = env.project
    markers = env.root / "markers"
    markers.mkdir()
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run([*git, "init", "-q"], cwd=project, check=True)
    (project / "src").mkdir()
    (project / "src" / "notes.txt").write_text("the needle is here\n")
    subprocess.run([*git, "add", "-A"], cwd=project, check=True)
    subprocess.run([*git, "commit", "-qm", "first"], cwd=project, check=True)
    trap(project / ".git" / "fsmonitor", markers / "fsmonitor")
    subprocess.run(["git", "config", "core.fsmonitor", str(project / ".git" / "fsmonitor")], cwd=project, check=True)
    trap(project / "build.sh", markers / "build.sh")
    trap(project / "grep", markers / "grep")
    return markers


def ran(markers: Path) -> list[str]:
    return sorted(p.name for p in markers.iterdir())


def call(daemon: Daemon, env: Env, name: str, **arguments: str) -> tuple[bool, str]:
    with daemon.client(directory=env.project) as client:
        result = client.call_tool(name, arguments)
    return result.is_error, "".join(block.get("text", "") for block in result.content)


def trust(env: Env, *options: str) -> None:
    typed = run_in_terminal([sys.executable, "-m", "atomictoolsd", "trust", *options, str(env.project)], env=env.vars)
    assert typed.returncode == 0, typed.stdout + typed.stderr


@pytest.mark.parametrize("own_tools_dir", [False, True], ids=["a-clone", "with-atomic-dir"])
def test_a_global_command_runs_nothing_of_a_project_until_it_is_fully_trusted(  # type: ignore[no-untyped-def]
    env: Env, make_daemon, own_tools_dir: bool
) -> None:
    env.set_trust_all(False)
    if not own_tools_dir:  # a repository as cloned: the project is its git worktree
        (env.project / ".atomic").rmdir()
    markers = hostile_project(env)
    env.write_tool(env.global_tools, "here.json", json.dumps(TOOLS))
    # A relative PATH entry first, as an agent's entry may set it: the project's own grep would be found.
    daemon = make_daemon({"PATH": f".:{os.environ['PATH']}"})
    root = env.project.resolve()

    for name in ("git_status", "build", "git_in_src"):
        failed, text = call(daemon, env, name)
        assert failed, text
        assert text.startswith(f"Tool {name!r} did not run: it runs a program in {root}, and the project there "
                               f"({root}) is not trusted."), text
        assert f"trust {root}" in text and "ask the user" in text, text
    failed, text = call(daemon, env, "search", pattern="needle")
    assert not failed and "./src/notes.txt:1:the needle is here" in text, text
    failed, text = call(daemon, env, "git_home")  # it names its directory: not the project's
    assert "did not run" not in text, text
    assert ran(markers) == [], "nothing of the untrusted project ran"

    trust(env, "--sandbox")
    failed, text = call(daemon, env, "git_status")
    assert failed and "did not run" in text and "--sandbox" not in text.split("ask the user")[1], text
    assert ran(markers) == []

    trust(env)
    failed, text = call(daemon, env, "build")
    assert not failed and "RAN-build.sh" in text, text
    call(daemon, env, "git_status")
    assert ran(markers) == ["build.sh", "fsmonitor"], "trusted, the project's programs run: the traps are live"
    failed, text = call(daemon, env, "search", pattern="needle")
    assert not failed and "needle" in text and "grep" not in ran(markers), "a relative PATH entry finds nothing"


def test_the_mark_never_reaches_a_client(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    env.write_tool(env.global_tools, "here.json", json.dumps(TOOLS))
    with make_daemon().client() as client:
        listed = client.request("tools/list")["tools"]
        every = client.request("atomic/list")["tools"]
    assert {t["name"] for t in listed} == {t["name"] for t in TOOLS["tools"]}
    assert not any(key.startswith("atomic/") for tool in [*listed, *every] for key in tool)


def test_the_search_paths_of_code_hold_no_place_in_a_project(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    """An empty or relative entry of ``LD_LIBRARY_PATH`` (what ``export X=$X:/opt/lib`` leaves when X
    was unset), ``LD_PRELOAD`` or ``GCONV_PATH`` names the directory a command runs in: the project,
    whose libraries ``grep`` would load. The worker's environment, what every command inherits,
    keeps only the absolute ones."""
    env.write_tool(env.global_tools, "environment.py", (
        "import os, json\n"
        "def environment() -> str:\n"
        "    return json.dumps({k: os.environ.get(k) for k in ('LD_LIBRARY_PATH', 'LD_PRELOAD', 'GCONV_PATH', 'PATH')})\n"
    ))
    daemon = make_daemon({
        "LD_LIBRARY_PATH": ":/opt/vendor/lib;lib", "LD_PRELOAD": "./evil.so libc_malloc_debug.so.0", "GCONV_PATH": ".",
        "PATH": f"bin::{os.environ['PATH']}",
    })
    with daemon.client() as client:
        seen = json.loads(client.call("environment").text)
    assert seen["LD_LIBRARY_PATH"] == "/opt/vendor/lib"
    assert seen["LD_PRELOAD"] == "libc_malloc_debug.so.0"  # a bare name is searched for in the system's directories
    assert seen["GCONV_PATH"] is None
    assert all(os.path.isabs(entry) for entry in seen["PATH"].split(":")), seen["PATH"]
