"""What a repository's own git config names in its work tree for git to run or read as config
(``confinement.git_named_entries``): the entries a confined tool must not write, since your next
``git`` would run them unconfined. Real repositories, real ``git config``."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from atomictoolsd.config.discovery import RepositoryRefused, locate_repository
from atomictoolsd.registry.confinement import git_named_entries


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True)


def test_hooks_programs_and_includes_in_the_work_tree_are_named(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "shared.gitconfig").write_text('[includeIf "onbranch:main"]\n\tpath = conf/more.gitconfig\n')
    (repo / "conf").mkdir()
    (repo / "conf" / "more.gitconfig").write_text("[diff \"x\"]\n\ttextconv = './bin/conv' --plain\n")
    for key, value in {
        "core.hooksPath": "scripts/hooks",
        "include.path": "../shared.gitconfig",  # relative to .git, where the config is
        "core.fsmonitor": "tools/fsmonitor --v2",
        "alias.up": "!scripts/up.sh --all",
        "filter.lfs.process": "git-lfs filter-process",  # a program on PATH: none of the repository's
        "core.sshCommand": "/usr/bin/ssh -o BatchMode=yes",  # outside the project
        "credential.helper": f"{tmp_path}/elsewhere/helper",  # outside the project
        "gpg.program": "../../escape",  # out of the project by '..'
        "user.name": "scripts/not-a-program",  # not a key git runs
    }.items():
        git(repo, "config", key, value)
    assert git_named_entries(repo, tmp_path / "home") == [
        "bin/conv", "conf/more.gitconfig", "scripts/hooks", "scripts/up.sh", "shared.gitconfig", "tools/fsmonitor",
    ]
    # An included file changed (by you: it is protected) is read again.
    (repo / "conf" / "more.gitconfig").write_text("[diff \"x\"]\n\ttextconv = bin/other-conv --plain\n")
    assert "bin/other-conv" in git_named_entries(repo, tmp_path / "home")


def test_a_directory_of_a_larger_repository_gets_what_lies_in_it(tmp_path: Path) -> None:
    """The project is a directory of a repository: paths are the work tree's, kept only inside the project."""
    repo = tmp_path / "repo"
    (repo / "app").mkdir(parents=True)
    git(repo, "init", "-q")
    git(repo, "config", "core.hooksPath", "app/hooks")
    git(repo, "config", "core.fsmonitor", "tools/fsmonitor")
    assert git_named_entries(repo / "app", tmp_path / "home") == ["hooks"]


def test_no_repository_names_nothing(tmp_path: Path) -> None:
    assert git_named_entries(tmp_path, tmp_path / "home") == []


def test_what_a_hostile_config_includes_is_read_bounded(tmp_path: Path) -> None:
    """A repository's config may include any file, and a policy is made on the event loop: sparse
    files of gigabytes (git read each until its 10 s timeout, 40 s for four) and a FIFO are not
    read, and what the rest names is still found at once."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    git(repo, "config", "core.hooksPath", "scripts/hooks")
    includes = [f"../huge{i}.gitconfig" for i in range(4)] + ["../fifo.gitconfig", "../small.gitconfig"]
    with open(repo / ".git" / "config", "a") as config:  # git config --add would read the includes itself
        config.write("[include]\n" + "".join(f"\tpath = {path}\n" for path in includes))
    for i in range(4):
        with open(repo / f"huge{i}.gitconfig", "wb") as huge:  # a comment of 4 GiB, on no disk
            huge.write(b"#")
            huge.seek(4 << 30)
            huge.write(b"\n[core]\n\tfsmonitor = tools/watch\n")
    os.mkfifo(repo / "fifo.gitconfig")
    (repo / "small.gitconfig").write_text("[alias]\n\tup = !scripts/up.sh\n")
    started = time.monotonic()
    named = git_named_entries(repo, tmp_path / "home")
    took = time.monotonic() - started
    assert "scripts/hooks" in named and "scripts/up.sh" in named, named
    assert "tools/watch" not in named  # past the bound: the huge files were not read
    assert took < 5.0, f"reading the config took {took:.1f} s"  # a few git runs of small files; unbounded: 40 s


def test_a_symlink_loop_the_repository_names_is_what_does_not_exist(tmp_path: Path) -> None:
    """A config including a symlink loop, or a ``.git`` file naming one: Path.resolve raised
    RuntimeError (no client could attach to the project) where an absent path names nothing."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "loop").symlink_to("loop")
    with open(repo / ".git" / "config", "a") as config:
        config.write("[include]\n\tpath = ../loop\n[core]\n\thooksPath = scripts/hooks\n")
    assert git_named_entries(repo, tmp_path / "home") == ["loop", "scripts/hooks"]
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "loop").symlink_to("loop")
    (linked / ".git").write_text("gitdir: loop\n")
    with pytest.raises(RepositoryRefused, match="not a directory"):
        locate_repository(linked)
    assert git_named_entries(linked, tmp_path / "home") == []


def test_the_scripts_an_interpreter_runs_for_git_are_named(tmp_path: Path) -> None:
    """A command git runs is often an interpreter and a script of the repository's: the script is
    what a confined tool would rewrite. A plain alias is git's own command: its paths are data."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "build.sh").write_text("make\n")
    for key, value in {
        "sequence.editor": "python3 tools/rebase-editor.py",
        "diff.x.textconv": "sh -c 'tools/conv --plain'",
        "alias.b": "!sh build.sh --fast",  # a file at the top of the work tree, by its bare name
        "merge.ours.driver": "python3 tools/merge.py %O %A %B",
        "credential.helper": "store --file=.secrets/creds",
        "alias.l": "log -- src/app",  # git log's paths: not run
        "core.pager": "less -R",  # on PATH
    }.items():
        git(repo, "config", key, value)
    assert git_named_entries(repo, tmp_path / "home") == [
        ".secrets/creds", "build.sh", "tools/conv", "tools/merge.py", "tools/rebase-editor.py",
    ]


def test_a_config_naming_thousands_of_paths_names_a_bounded_few(tmp_path: Path) -> None:
    """Each named path becomes an entry the sandbox keeps read-only: a config naming 20,000 (in an
    alias each) gives at most 256, whatever their order."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    with open(repo / ".git" / "config", "a") as config:
        config.write("[alias]\n" + "".join(f"\ta{i} = !scripts/s{i}.sh\n" for i in range(20_000)))
    named = git_named_entries(repo, tmp_path / "home")
    assert 0 < len(named) <= 256, len(named)
