"""Project roots and tool module files (discovery)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from atomictoolsd.config.discovery import (
    MAX_MODULES,
    escape_path,
    escape_strings,
    git_worktree_root,
    list_module_files,
    may_hold_modules,
    project_root,
    scan_tools_dir,
)
from helpers import as_other_user


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


@pytest.mark.parametrize(
    ("raw", "escaped"),
    [
        (b"plain \xc3\xa9.py", "plain \u00e9.py"),  # printable non-ASCII stays as it is
        (b"bad\xff.py", "bad\\xff.py"),
        (b"new\nline\r\t.py", "new\\nline\\r\\t.py"),
        (b"esc\x1b[31m\x7f.py", "esc\\x1b[31m\\x7f.py"),
        ("rtl\u202e\u200b.py".encode(), "rtl\\u202e\\u200b.py"),
        (b"back\\slash\xfe", "back\\\\slash\\xfe"),  # doubled: never read as an escape
    ],
)
def test_escape_path_is_utf8_on_one_line(raw: bytes, escaped: str) -> None:
    result = escape_path(os.fsdecode(raw))
    assert result == escaped and escape_path(raw) == escaped
    result.encode("utf-8")  # strict
    assert result.isprintable()


def test_escape_strings_escapes_only_what_json_cannot_carry() -> None:
    value = {"file": os.fsdecode(b"/t/bad\xff.py"), "ok": "new\nline", "n": [1, os.fsdecode(b"\xfe")], "x": None}
    assert escape_strings(value) == {"file": "/t/bad\\xff.py", "ok": "new\nline", "n": [1, "\\xfe"], "x": None}


def test_odd_entries_are_skipped_with_a_reason(tmp_path: Path) -> None:
    base = os.fsencode(tmp_path)
    for raw in (b"good.py", b"bad\xff.py", b"new\nline.py", b"ok.json"):
        with open(base + b"/" + raw, "w") as f:
            f.write("")
    os.mkdir(base + b"/pkg.py")
    os.symlink(b"nowhere", base + b"/gone.py")
    os.symlink(b"loop.py", base + b"/loop.py")
    os.mkfifo(base + b"/pipe.py")
    os.symlink(b"_lib", base + b"/_lib")  # a helper: never reported
    os.symlink(b"good.py", base + b"/alias.py")  # a link to a module is a module
    modules, skipped = scan_tools_dir(tmp_path)
    assert [Path(m.path).name for m in modules] == ["alias.py", "good.py", "ok.json"]
    reasons = {Path(s.path).name: s.message for s in skipped}
    assert set(reasons) == {"bad\\xff.py", "new\\nline.py", "pkg.py", "gone.py", "loop.py", "pipe.py"}
    assert "not valid UTF-8" in reasons["bad\\xff.py"] and "control character" in reasons["new\\nline.py"]
    assert "directory" in reasons["pkg.py"] and "to nothing" in reasons["gone.py"]
    assert "loop" in reasons["loop.py"] and "not a regular file" in reasons["pipe.py"]
    assert all("rename or remove it" in m for m in reasons.values())


def test_a_tools_dir_past_max_modules_lists_the_first_by_name_and_reports_the_rest_once(tmp_path: Path) -> None:
    for i in range(MAX_MODULES + 5):
        (tmp_path / f"m{i:05}.py").write_text("")
    (tmp_path / "_helper.py").write_text("")  # helpers and other files do not count
    (tmp_path / "notes.txt").write_text("")
    modules, skipped = scan_tools_dir(tmp_path)
    assert [Path(m.path).name for m in modules] == [f"m{i:05}.py" for i in range(MAX_MODULES)]
    [crowded] = skipped
    assert crowded.path == str(tmp_path) and f"holds {MAX_MODULES + 5} entries named like tool modules" in crowded.message


def test_whether_a_tools_dir_may_hold_modules_is_told_from_its_first_entries(tmp_path: Path) -> None:
    assert not may_hold_modules(tmp_path / "missing") and not may_hold_modules(tmp_path)
    for name in ("a.txt", "_helper.py", ".hidden.py"):
        (tmp_path / name).write_text("")
    assert not may_hold_modules(tmp_path, look_at=3)
    (tmp_path / "b.txt").write_text("")
    assert may_hold_modules(tmp_path, look_at=3)  # more entries than it looks at: the rest may be modules
    (tmp_path / "b.txt").rename(tmp_path / "tool.json")
    assert may_hold_modules(tmp_path, look_at=3)


@pytest.mark.parametrize("case", ["loop", "file", "dangling", "missing", "not utf-8"])
def test_a_tools_dir_that_cannot_be_listed_is_reported_not_raised(tmp_path: Path, case: str) -> None:
    tools = tmp_path / "tools"
    if case == "loop":
        os.symlink("tools", tools)
    elif case == "file":
        tools.write_text("")
    elif case == "dangling":
        os.symlink("gone", tools)
    elif case == "not utf-8":
        tools = Path(os.fsdecode(os.fsencode(tmp_path) + b"/t\xff"))
        tools.mkdir()
        (tools / "a.py").write_text("")
    modules, skipped = scan_tools_dir(tools)
    assert modules == [] and list_module_files(tools) == []
    if case == "missing":
        assert skipped == []  # no tools dir is the usual case
        return
    [problem] = skipped
    assert problem.path == escape_path(str(tools)) and "no tools load from it" in problem.message
    word = {"loop": "loop", "file": "not a directory", "dangling": "to nothing", "not utf-8": "not valid UTF-8"}[case]
    assert word in problem.message


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to another uid needs root")
def test_an_unreadable_tools_dir_is_reported() -> None:
    """EACCES, as a user who may not read the dir (root may read anything)."""
    top = tempfile.mkdtemp(prefix="at-eacces-", dir="/tmp")
    try:
        os.chmod(top, 0o711)
        tools = Path(top) / "tools"
        tools.mkdir(mode=0o000)
        (tools / "a.py").write_text("")
        os.chmod(tools, 0o000)
        os.chown(tools, 65534, 65534)

        def attempt() -> str:
            modules, skipped = scan_tools_dir(tools)
            return f"{len(modules)}|" + "|".join(s.message for s in skipped)

        outcome = as_other_user(65534, 65534, [], attempt)
        assert outcome.startswith("0|") and "permission denied" in outcome, outcome
    finally:
        os.chmod(Path(top) / "tools", 0o700)
        shutil.rmtree(top)
