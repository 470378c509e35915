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
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import Daemon, Env, pinging, run_in_terminal

TOOLS = {
    "tools": [
        {"name": "git_status", "description": "git status", "handler": {"type": "shell", "command": "git status --short"}},
        {"name": "build", "description": "the project's build script", "handler": {"type": "shell", "command": "./build.sh"}},
        {"name": "git_in_src", "description": "git log in src/",
         "handler": {"type": "shell", "command": "git status --short", "cwd": "src"}},
        {"name": "search", "description": "grep the project",
         "inputSchema": {"type": "object", "properties": {"pattern": {"type": "string"}}, "required": ["pattern"]},
         "handler": {"type": "shell", "command": "grep -rn -e {{pattern}} -- .", "okExitCodes": [0, 1]}},
        {"name": "make", "description": "make", "handler": {"type": "shell", "command": "make"}},
        {"name": "make_above", "description": "make in the parent", "handler": {"type": "shell", "command": "make", "cwd": ".."}},
        {"name": "git_home", "description": "git status of your home",
         "handler": {"type": "shell", "command": "git status --short", "cwd": "~"}},
    ]
}


def trap(path: Path, marker: Path) -> None:
    """An executable that leaves ``marker`` and says it ran."""
    path.write_text(f"#!/bin/sh\ntouch {marker}\necho RAN-{path.name}\n")
    path.chmod(0o755)


def hostile_repository(repo: Path, markers: Path, name: str = "") -> None:
    """``repo`` made a repository whose fsmonitor, ``build.sh``, ``Makefile`` and own ``grep`` each
    leave a marker (named ``name`` and what it is)."""
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]
    repo.mkdir(parents=True, exist_ok=True)
    subprocess.run([*git, "init", "-q"], cwd=repo, check=True)
    (repo / "src").mkdir(exist_ok=True)
    (repo / "src" / "notes.txt").write_text("the needle is here\n")
    subprocess.run([*git, "add", "-A"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-qm", "first"], cwd=repo, check=True)
    trap(repo / ".git" / "fsmonitor", markers / f"{name}fsmonitor")
    subprocess.run(["git", "config", "core.fsmonitor", str(repo / ".git" / "fsmonitor")], cwd=repo, check=True)
    trap(repo / "build.sh", markers / f"{name}build.sh")
    trap(repo / "grep", markers / f"{name}grep")
    (repo / "Makefile").write_text(f"all:\n\ttouch {markers / (name + 'make')}\n")


def hostile_project(env: Env) -> Path:
    """The test's project as a hostile repository; the directory its markers go to."""
    markers = env.root / "markers"
    markers.mkdir(exist_ok=True)
    hostile_repository(env.project, markers)
    return markers


def ran(markers: Path) -> list[str]:
    return sorted(p.name for p in markers.iterdir())


def call(daemon: Daemon, env: Env, name: str, directory: Path | None = None, **arguments: str) -> tuple[bool, str]:
    with daemon.client(directory=directory or env.project) as client:
        result = client.call_tool(name, arguments)
    return result.is_error, "".join(block.get("text", "") for block in result.content)


def trust(env: Env, *options: str, directory: Path | None = None) -> None:
    typed = run_in_terminal([sys.executable, "-m", "atomictoolsd", "trust", *options, str(directory or env.project)],
                            env=env.vars)
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

    for name, where in (("git_status", root), ("build", root), ("git_in_src", root / "src")):
        failed, text = call(daemon, env, name)
        assert failed, text
        assert text.startswith(f"Tool {name!r} did not run: it runs a program in {where}, and {root} is not trusted."), text
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


def test_a_trusted_project_inside_an_untrusted_repository_runs_nothing_of_the_repository(  # type: ignore[no-untyped-def]
    env: Env, make_daemon
) -> None:
    """git in a project with its own ``.atomic/`` reads the config of the repository around it, and a
    ``cwd`` of ``..`` leaves the project: both must be trusted too, and the message names which."""
    env.set_trust_all(False)
    markers = env.root / "markers"
    markers.mkdir()
    mono = env.root / "mono"
    hostile_repository(mono, markers, "mono-")
    app = mono / "app"
    (app / ".atomic").mkdir(parents=True)
    env.write_tool(env.global_tools, "here.json", json.dumps(TOOLS))
    daemon = make_daemon()
    trust(env, directory=app)
    for name, where in (("git_status", app), ("make_above", mono)):
        failed, text = call(daemon, env, name, directory=app)
        assert failed and text.startswith(f"Tool {name!r} did not run: it runs a program in {where}, and {mono} "
                                          f"is not trusted."), text
    assert ran(markers) == []
    trust(env, directory=mono)
    call(daemon, env, "git_status", directory=app)
    call(daemon, env, "make_above", directory=app)
    assert ran(markers) == ["mono-fsmonitor", "mono-make"], "both trusted, the traps run: they are live"


def test_a_directory_under_a_home_that_is_a_repository_is_not_the_home(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    """A dotfiles repository in the home makes it the git root of every unmarked directory below: an
    archive unpacked in ~/Downloads is not the user's own for that. The home itself is."""
    env.set_trust_all(False)
    markers = env.root / "markers"
    markers.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=env.home, check=True)
    unpacked = env.home / "Downloads" / "unpacked"
    unpacked.mkdir(parents=True)
    (unpacked / "Makefile").write_text(f"all:\n\ttouch {markers / 'make'}\n")
    env.write_tool(env.global_tools, "here.json", json.dumps(TOOLS))
    daemon = make_daemon()
    home = env.home.resolve()
    failed, text = call(daemon, env, "make", directory=unpacked)
    assert failed and text.startswith(f"Tool 'make' did not run: it runs a program in {unpacked.resolve()}, and {home} "
                                      f"is not trusted."), text
    assert ran(markers) == []
    failed, text = call(daemon, env, "git_status", directory=env.home)
    assert not failed, text


def test_a_trusted_directory_replaced_under_an_open_session_is_not_trusted(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    """Trust names a directory, not a path: one removed and made again in its place, while a session
    is attached to it, runs nothing at the very next call."""
    env.set_trust_all(False)
    markers = env.root / "markers"
    markers.mkdir()
    (env.project / ".atomic").rmdir()
    hostile_repository(env.project, markers)
    env.write_tool(env.global_tools, "here.json", json.dumps(TOOLS))
    daemon = make_daemon()
    trust(env)
    with daemon.client(directory=env.project) as client:
        assert not client.call_tool("git_status", {}).is_error
        shutil.rmtree(env.project)
        env.project.mkdir()
        trap(env.project / "build.sh", markers / "replaced")
        result = client.call_tool("build", {})
    assert result.is_error and "did not run" in result.content[0]["text"], result
    assert "replaced" not in ran(markers)


def test_a_directory_that_cannot_be_resolved_is_not_trusted(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    """A ``cwd`` through a symlink loop of the project: the call is refused with the reason, not failed
    inside the daemon (trust_all: everything else there is trusted)."""
    (env.project / "loop").symlink_to(env.project / "loop")
    env.write_tool(env.global_tools, "looped.json", json.dumps({"tools": [
        {"name": "looped", "description": "d", "handler": {"type": "shell", "command": "make", "cwd": "loop/x"}}]}))
    daemon = make_daemon()
    failed, text = call(daemon, env, "looped")
    assert failed and text.startswith(f"Tool 'looped' did not run: it runs a program in {env.project / 'loop' / 'x'}"), text


def bare_lookalike(directory: Path, markers: Path) -> None:
    """``directory`` made what git takes for a bare repository whose work tree is itself, with an
    fsmonitor (an unpacked archive can hold this: it is only files)."""
    subprocess.run(["git", "init", "-q", "--bare", str(directory)], check=True)
    trap(directory / "fsm", markers / "bare-fsmonitor")
    for key, value in (("core.bare", "false"), ("core.worktree", "."), ("core.fsmonitor", "./fsm")):
        subprocess.run(["git", "config", "--file", str(directory / "config"), key, value], check=True)


def test_git_finds_no_repository_the_daemon_did_not_judge(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    """git finds its repository its own way: a repository cloned into a trusted project, a bare
    repository around one, a ``.git`` that git passes by (not a repository) so that it looks further
    up, a ``.git`` file naming another repository's worktree. Each is judged as git would take it;
    a submodule and a linked worktree of a trusted repository are the trusted repository's own."""
    env.set_trust_all(False)
    markers = env.root / "markers"
    markers.mkdir()
    env.write_tool(env.global_tools, "here.json", json.dumps(TOOLS))
    daemon = make_daemon()
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "protocol.file.allow=always"]

    # A repository inside a trusted project that has an .atomic/ of its own.
    workspace = env.root / "workspace"
    (workspace / ".atomic").mkdir(parents=True)
    nested = workspace / "vendor" / "evil"
    hostile_repository(nested, markers, "nested-")
    # A bare repository (only files) around a trusted project.
    around = env.root / "unpacked"
    bare_lookalike(around, markers)
    inside_bare = around / "proj"
    (inside_bare / ".atomic").mkdir(parents=True)
    # A .git that is not a repository, in a trusted project inside a hostile one.
    hostile_repository(env.root / "decoy", markers, "decoy-")
    decoyed = env.root / "decoy" / "proj"
    (decoyed / ".atomic").mkdir(parents=True)
    (decoyed / ".git").mkdir()
    # A linked worktree of a hostile repository.
    hostile_repository(env.root / "origin", markers, "origin-")
    subprocess.run([*git, "worktree", "add", "-q", str(env.root / "linked")], cwd=env.root / "origin", check=True,
                   capture_output=True)
    for trap_marker in markers.iterdir():  # git worktree add itself ran the origin's fsmonitor
        trap_marker.unlink()
    for directory in (workspace, inside_bare, decoyed, env.root / "linked"):
        trust(env, directory=directory)

    refused = {
        nested: f"{nested} is not trusted (a repository inside the project {workspace}",
        inside_bare: f"{around} is not trusted.",
        decoyed: f"{env.root / 'decoy'} is not trusted.",
        env.root / "linked": f"{env.root / 'origin'} is not trusted.",
    }
    for directory, why in refused.items():
        failed, text = call(daemon, env, "git_status", directory=directory)
        assert failed and why in text, (directory, text)
    assert ran(markers) == []
    assert f"mkdir {nested / '.atomic'}" in call(daemon, env, "git_status", directory=nested)[1]

    # The trusted repository's own: a submodule (a project of its own, trusted as one), a linked worktree.
    main = env.root / "main"
    hostile_repository(main, markers, "main-")
    subprocess.run([*git, "submodule", "add", "-q", str(env.root / "origin"), "sub"], cwd=main, check=True,
                   capture_output=True)
    subprocess.run([*git, "worktree", "add", "-q", str(env.root / "main-linked")], cwd=main, check=True,
                   capture_output=True)
    trust(env, directory=main)
    trust(env, directory=main / "sub")
    trust(env, directory=env.root / "main-linked")
    for directory in (main / "sub", env.root / "main-linked"):
        failed, text = call(daemon, env, "git_status", directory=directory)
        assert not failed, (directory, text)


def test_what_git_reads_is_what_was_judged_to_the_byte(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    """Where git's own reading could lead elsewhere, each from a directory inside a trusted project: a ``.git``
    file whose path has a space git keeps (two files, ``y`` and ``y ``, lead to different
    repositories), a ``.git`` symlink to the trusted project beside a bare repository (git, finding
    no repository there, takes the directory itself for one), a repository cloned in place and
    recorded as a submodule (``git status`` in the project runs git in it), a tree 600 deep with a
    ``.git`` at every level (the check stops at the first: the daemon serves others meanwhile), and a
    NUL in a ``.git`` file. None runs anything; the refusals name the untrusted repository."""
    env.set_trust_all(False)
    markers = env.root / "markers"
    markers.mkdir()
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]
    tools = {"tools": [
        {"name": "git_status", "description": "d", "handler": {"type": "shell", "command": "git status --short"}},
        {"name": "git_log", "description": "d", "handler": {"type": "shell", "command": "git log -p -1"}},
    ]}
    env.write_tool(env.global_tools, "here.json", json.dumps(tools))
    project = env.project
    hostile_repository(project, markers, "project-")
    vendor = project / "vendor"

    # A path with a trailing space: "y" is the trusted project's .git, "y " the attacker's.
    trail = vendor / "trail"
    hostile_repository(trail / "e", markers, "trail-")
    trail.joinpath("y").symlink_to(project / ".git")
    trail.joinpath("y ").symlink_to(trail / "e" / ".git")
    trail.joinpath(".git").write_text("gitdir: y \n")
    # A .git symlink to the trusted project, in a bare repository whose attributes run a textconv.
    bare = vendor / "bare"
    origin = env.root / "origin"
    hostile_repository(origin, markers, "origin-")
    (origin / "file.txt").write_text("one\n")
    subprocess.run([*git, "add", "-A"], cwd=origin, check=True)
    subprocess.run([*git, "commit", "-qm", "second"], cwd=origin, check=True)
    subprocess.run(["git", "clone", "-q", "--bare", str(origin), str(bare)], check=True)
    for marker in markers.iterdir():
        marker.unlink()
    trap(bare / "tc", markers / "bare-textconv")
    subprocess.run(["git", "config", "--file", str(bare / "config"), "diff.x.textconv", str(bare / "tc")], check=True)
    (bare / "info").mkdir(exist_ok=True)
    (bare / "info" / "attributes").write_text("* diff=x\n")
    bare.joinpath(".git").symlink_to(project)
    # A repository cloned in place and recorded in the project's index as a submodule.
    embedded = vendor / "embedded"
    hostile_repository(embedded, markers, "embedded-")
    subprocess.run([*git, "add", "vendor/embedded"], cwd=project, check=True, capture_output=True)
    (markers / "project-fsmonitor").unlink()  # that git add ran the project's own, as it should
    # A deep tree with an empty .git at each level (not deeper: shutil.rmtree recurses once a level),
    # and a .git file with a NUL.
    deep = vendor / "deep"
    levels = [deep / Path(*["a"] * i) for i in range(600)]
    for level in levels:
        (level / ".git").mkdir(parents=True)
    level = levels[-1] / "a"
    level.mkdir()
    nul = vendor / "nul"
    nul.mkdir()
    (nul / ".git").write_bytes(b"gitdir: x\x00y\n")

    daemon = make_daemon()
    trust(env)
    for name, directory, untrusted in (
        ("git_status", trail, trail / "e"), ("git_log", bare, bare), ("git_status", project, embedded),
        ("git_status", level, level.parent), ("git_status", nul, nul),
    ):
        with pinging(env.socket) as pauses:
            failed, text = call(daemon, env, name, directory=directory)
        assert failed and f", and {untrusted} is not trusted" in text, (name, directory, text[:300])
        assert max(pauses, default=0) < 5, f"the daemon stalled {max(pauses):.1f} s judging {directory}"
    assert ran(markers) == []


def test_submodules_are_judged_all_or_the_call_is_refused(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    """How git could reach a submodule nobody judged, from a trusted project: a repository cloned where a
    submodule once was (only history lists it; your ``diff.submodule = diff`` would have ``git log
    -p`` run git there), a split index (its entries in a shared index beside it), more submodules
    than are judged (the limit refuses, never allows), and an index of 1 GiB in a hostile submodule
    (refused before it is read: no other client waits)."""
    env.set_trust_all(False)
    markers = env.root / "markers"
    markers.mkdir()
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "protocol.file.allow=always"]
    tools = {"tools": [
        {"name": "git_status", "description": "d", "handler": {"type": "shell", "command": "git status --short"}},
        {"name": "git_log", "description": "d", "handler": {"type": "shell", "command": "git log -p -3"}},
    ]}
    env.write_tool(env.global_tools, "here.json", json.dumps(tools))
    (env.home / ".gitconfig").write_text("[diff]\n\tsubmodule = diff\n")

    def commit(repo: Path, message: str) -> None:
        subprocess.run([*git, "add", "-A"], cwd=repo, check=True, capture_output=True)
        subprocess.run([*git, "commit", "-qm", message], cwd=repo, check=True, capture_output=True)

    def textconv_trap(repo: Path, name: str) -> None:
        trap(repo / ".git" / "tc", markers / name)
        subprocess.run(["git", "config", "diff.x.textconv", str(repo / ".git" / "tc")], cwd=repo, check=True)
        (repo / ".git" / "info").mkdir(exist_ok=True)
        (repo / ".git" / "info" / "attributes").write_text("* diff=x\n")

    # History only: a submodule added, committed, then dropped from the index; a clone in its place.
    history = env.root / "history"
    hostile_repository(env.root / "upstream", markers, "upstream-")
    (env.root / "upstream" / "f.txt").write_text("1\n")
    commit(env.root / "upstream", "f")
    hostile_repository(history, markers, "history-")
    subprocess.run([*git, "submodule", "add", "-q", str(env.root / "upstream"), "vendor/evil"], cwd=history,
                   check=True, capture_output=True)
    commit(history, "submodule")
    subprocess.run([*git, "rm", "-q", "--cached", "vendor/evil"], cwd=history, check=True, capture_output=True)
    subprocess.run([*git, "commit", "-qm", "dropped"], cwd=history, check=True, capture_output=True)
    shutil.rmtree(history / "vendor" / "evil")
    subprocess.run(["git", "clone", "-q", str(env.root / "upstream"), str(history / "vendor" / "evil")], check=True)
    textconv_trap(history / "vendor" / "evil", "history-textconv")
    (history / "vendor" / "evil" / "f.txt").write_text("2\n")
    commit(history / "vendor" / "evil", "two")
    # A split index listing a hostile repository cloned in place.
    split = env.root / "split"
    hostile_repository(split, markers, "split-")
    hostile_repository(split / "vendor" / "emb", markers, "split-emb-")
    commit(split, "embedded")
    subprocess.run(["git", "config", "core.splitIndex", "true"], cwd=split, check=True)
    subprocess.run(["git", "update-index", "--split-index"], cwd=split, check=True)
    # More submodules than are judged, each the trusted repository's own.
    many = env.root / "many"
    hostile_repository(many, markers, "many-")
    lines = []
    for i in range(70):
        (many / ".git" / "modules" / f"s{i:02d}").mkdir(parents=True)
        (many / f"s{i:02d}").mkdir()
        (many / f"s{i:02d}" / ".git").write_text(f"gitdir: ../.git/modules/s{i:02d}\n")
        lines.append(f"160000 {'1' * 40}\ts{i:02d}\n")
    subprocess.run(["git", "update-index", "--index-info"], cwd=many, input="".join(lines), text=True, check=True)
    # A hostile submodule whose index is 1 GiB (a sparse file: no disk).
    huge = env.root / "huge"
    hostile_repository(huge, markers, "huge-")
    hostile_repository(huge / "vendor" / "emb", markers, "huge-emb-")
    commit(huge, "embedded")
    with open(huge / "vendor" / "emb" / ".git" / "index", "r+b") as index:
        index.truncate(1 << 30)
    for marker in markers.iterdir():  # what setting up ran
        marker.unlink()

    daemon = make_daemon()
    for directory in (history, split, many, huge):
        trust(env, directory=directory)
    failed, text = call(daemon, env, "git_log", directory=history)
    assert not failed and "Subproject commit" in text, text  # the gitlink itself, not git run in the clone
    for directory, why in (
        (split, f", and {split / 'vendor' / 'emb'} is not trusted"),
        (many, "whose submodules cannot all be known"),
        (huge, f", and {huge / 'vendor' / 'emb'} is not trusted"),
    ):
        with pinging(env.socket) as pauses:
            failed, text = call(daemon, env, "git_status", directory=directory)
        assert failed and why in text, (directory, text[:300])
        assert max(pauses, default=0) < 5, f"the daemon stalled {max(pauses):.1f} s judging {directory}"
    trusted_own = {"history-fsmonitor", "split-fsmonitor", "many-fsmonitor", "huge-fsmonitor"}  # trusted: may run
    assert [name for name in ran(markers) if name not in trusted_own] == []
