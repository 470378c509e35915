"""The submodules a confined worker's sandbox finds in a repository's index (their ``.git`` stays
read-only: ``worker/gitindex.py``), read from indexes real git wrote, in each format."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from atomictoolsd.worker.gitindex import gitlinks


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout


@pytest.mark.parametrize(("version", "object_format"), [(2, "sha1"), (3, "sha1"), (4, "sha1"), (2, "sha256"), (4, "sha256")])
def test_the_gitlinks_of_an_index_in_each_format(tmp_path: Path, version: int, object_format: str) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", f"--object-format={object_format}")
    for name in ("a.txt", "docs/guide.md", "vendor/README", "vendor/zz.txt"):
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(name)
    git(repo, "add", "-A")
    blob = git(repo, "hash-object", "-w", "a.txt").strip()
    long = "/".join(["d" * 200] * 21)  # longer than an entry's 12-bit name length can say
    for link in ("vendor/lib", "third_party/deep/mod", long):
        git(repo, "update-index", "--add", "--cacheinfo", f"160000,{blob},{link}")
    if version == 3:
        (repo / "later.txt").write_text("later")
        git(repo, "add", "--intent-to-add", "later.txt")  # an entry with extended flags
    git(repo, "update-index", f"--index-version={version}")
    index = repo / ".git" / "index"
    assert index.read_bytes()[4:8] == version.to_bytes(4, "big")
    assert gitlinks(str(index)) == [long, "third_party/deep/mod", "vendor/lib"]


def test_an_index_without_gitlinks_or_not_an_index_lists_none(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "a.txt").write_text("a")
    git(repo, "add", "-A")
    assert gitlinks(str(repo / ".git" / "index")) == []
    (tmp_path / "garbage").write_bytes(b"DIRC\x00\x00\x00\x02\x00\x00\x00\x05" + b"\x00\x00\xe0\x00" * 40)
    assert gitlinks(str(tmp_path / "garbage")) == []
    assert gitlinks(str(tmp_path / "missing")) == []
