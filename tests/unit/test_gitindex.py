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


def test_the_index_searched_is_that_of_the_repository_git_would_use(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """An empty ``.git`` in a subdirectory is passed by, as git passes it by: the submodules judged
    are those of the repository around it."""
    import subprocess

    from atomictoolsd.worker.gitindex import submodules_of

    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", "update-index", "--add", "--cacheinfo", f"160000,{'1' * 40},vendor/lib"], cwd=repo, check=True)
    (repo / "sub" / ".git").mkdir(parents=True)
    assert list(submodules_of(str(repo / "sub"))) == [str(repo / "vendor" / "lib" / ".git")]


def test_an_odd_git_config_count_is_not_a_crash(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from atomictoolsd.worker.declarative import shell

    monkeypatch.setenv("GIT_CONFIG_COUNT", "²")  # str.isdigit() says yes, int() says no
    shell._git_environment.cache_clear()
    try:
        environ = shell._git_environment()
    finally:
        shell._git_environment.cache_clear()
    assert environ["GIT_CONFIG_COUNT"] == "4" and environ["GIT_CONFIG_KEY_0"] == "diff.submodule"
