"""Project roots and tool module files (discovery)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from atomictoolsd.discovery import git_worktree_root, list_module_files, project_root


def test_nearest_atomic_dir_is_the_root(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (tmp_path / "repo" / ".git").mkdir(parents=True)
    (tmp_path / "repo" / "pkg" / ".atomic").mkdir(parents=True)
    deep = tmp_path / "repo" / "pkg" / "src" / "x"
    deep.mkdir(parents=True)
    assert project_root(deep, home) == tmp_path / "repo" / "pkg"


def test_git_worktree_root_when_no_atomic_dir(tmp_path: Path) -> None:
    (tmp_path / "repo" / "src").mkdir(parents=True)
    (tmp_path / "repo" / ".git").write_text("gitdir: /elsewhere\n")  # a linked worktree
    assert git_worktree_root(tmp_path / "repo" / "src") == tmp_path / "repo"
    assert project_root(tmp_path / "repo" / "src", tmp_path / "home") == tmp_path / "repo"


def test_the_directory_itself_when_nothing_else(tmp_path: Path) -> None:
    (tmp_path / "plain").mkdir()
    assert project_root(tmp_path / "plain", tmp_path / "home") == tmp_path / "plain"


def test_home_atomic_dir_is_global_not_a_project_marker(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".atomic" / "tools").mkdir(parents=True)
    (home / "code" / "thing").mkdir(parents=True)
    assert project_root(home / "code" / "thing", home) == home / "code" / "thing"


def test_module_files_skip_helpers_hidden_and_other_files(tmp_path: Path) -> None:
    for name in ("b.py", "a.py", "_helpers.py", ".a.py.swp", ".#a.py", "notes.txt", "c.pyc"):
        (tmp_path / name).write_text("")
    (tmp_path / "pkg.py").mkdir()
    assert [Path(m.path).name for m in list_module_files(tmp_path)] == ["a.py", "b.py"]
    assert list_module_files(tmp_path / "missing") == []


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another user needs root")
def test_an_atomic_dir_of_another_user_marks_no_project(tmp_path: Path) -> None:
    """Anyone can create /tmp/.atomic; it must not make every directory under /tmp one project."""
    shared = tmp_path / "shared"
    (shared / ".atomic").mkdir(parents=True)
    os.chown(shared / ".atomic", 65534, 65534)
    work = shared / "mine"
    work.mkdir()
    assert project_root(work, tmp_path / "home") == work
