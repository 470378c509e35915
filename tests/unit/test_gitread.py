"""The repository reader answers as git does: ``git status --porcelain`` and ``git diff --stat``
of the same repository, byte for byte, for names git quotes, long names, binary files, renames
across directories, a project inside a larger repository, and an untracked project directory.

Real git makes the repositories and gives the expected text; the reader runs as the built-ins run
it (``python -P -m atomictoolsd.worker.builtins._gitread``, its request on stdin, from ``/``, with
nothing of this environment but ``PYTHONPATH``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from atomictoolsd.worker.builtins._gitreader import READER, reader_environ


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "HOME": str(repo.parent / "home")}
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args], cwd=repo,
                          check=True, capture_output=True, text=True, env=env).stdout


def read(root: Path, op: str, **arguments: Any) -> dict[str, Any]:
    home = root.parent / "home" if (root.parent / "home").is_dir() else root.parents[1] / "home"
    request = {"op": op, "root": str(root), "config": {"home": str(home), "xdg": "", "files": []}, **arguments}
    done = subprocess.run([sys.executable, "-P", "-m", READER], input=json.dumps(request).encode(),
                          capture_output=True, cwd="/", env=reader_environ(), check=True, timeout=60)
    return json.loads(done.stdout)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """Names git quotes, a name too long for 80 columns, a binary file, a rename across
    directories, big and small edits, a deletion, a staged file and untracked ones."""
    (tmp_path / "home").mkdir()
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    long_dir = repo / "dir" / "sub"
    long_dir.mkdir(parents=True)
    files = {
        "big.txt": "".join(f"{i}\n" for i in range(100)),
        "small.txt": "a\n",
        "sp ace.txt": "".join(f"{i}\n" for i in range(20)),
        "\u00fcn\u00ef.txt": "".join(f"{i}\n" for i in range(30)),
        "tab\there.txt": "t\n",
        "gone.txt": "g\n",
        "old/place/name.txt": "".join(f"moved {i}\n" for i in range(10)),
        f"dir/sub/{'very_long_name_' * 6}.txt": "".join(f"{i}\n" for i in range(10)),
    }
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    (repo / "bin.dat").write_bytes(b"\0\1\2")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "first")
    (repo / "big.txt").write_text("".join(f"{i}x\n" for i in range(1000)))
    (repo / "small.txt").write_text("b\n")
    (repo / "bin.dat").write_bytes(b"\0\3\4\5")
    (repo / "sp ace.txt").write_text("".join(f"{i}\n" for i in range(2, 22)))
    (repo / "\u00fcn\u00ef.txt").write_text("".join(f"{i}\n" for i in range(31)))
    (repo / f"dir/sub/{'very_long_name_' * 6}.txt").write_text("".join(f"{i}\n" for i in range(5, 16)))
    (repo / "gone.txt").unlink()
    (repo / "old" / "other").mkdir()
    git(repo, "mv", "old/place/name.txt", "old/other/name.txt")
    (repo / "staged.txt").write_text("staged\n")
    git(repo, "add", "staged.txt", "old")
    (repo / "untracked dir" / "deep").mkdir(parents=True)
    (repo / "untracked dir" / "deep" / "f").write_text("f\n")
    (repo / "new\u00e9.txt").write_text("n\n")
    return repo


def test_status_and_diff_stat_match_git(repo: Path) -> None:
    assert read(repo, "status")["text"] == git(repo, "status", "--porcelain")
    assert read(repo, "diff")["text"] == git(repo, "diff", "--stat")
    git(repo, "add", "-A")
    assert read(repo, "diff", staged=True)["text"] == git(repo, "diff", "--stat", "--staged")
    assert read(repo, "status")["text"] == git(repo, "status", "--porcelain")


def test_a_project_inside_a_larger_repository_and_a_subdirectory(repo: Path) -> None:
    project = repo / "dir"
    assert read(project, "status")["text"] == git(project, "status", "--porcelain", "--", ".")
    assert read(project, "diff")["text"] == git(project, "diff", "--stat", "--", ".")
    assert read(repo, "status", path="untracked dir")["text"] == git(repo, "status", "--porcelain", "--", "untracked dir")
    deep = repo / "untracked dir" / "deep"  # inside an untracked directory: git names the project's own
    assert read(deep, "status")["text"] == git(deep, "status", "--porcelain", "--", ".") == '?? "untracked dir/deep/"\n'


def test_workspace_and_a_repository_without_commits(tmp_path: Path) -> None:
    (tmp_path / "home").mkdir()
    repo = tmp_path / "fresh"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "trunk")
    (repo / "a.txt").write_text("a\n")
    git(repo, "add", "a.txt")
    assert read(repo, "status")["text"] == git(repo, "status", "--porcelain") == "A  a.txt\n"
    assert read(repo, "diff", staged=True)["text"] == git(repo, "diff", "--stat", "--staged")
    assert read(repo, "workspace") == {"git_root": str(repo.resolve()), "branch": "trunk", "remote": None}
    git(repo, "commit", "-qm", "one")
    git(repo, "checkout", "-q", "--detach")
    short = git(repo, "rev-parse", "--short", "HEAD").strip()
    assert read(repo, "workspace")["branch"] == f"(detached at {short})"
