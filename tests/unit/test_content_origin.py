"""Where a tool file's content came from (registry/gitorigin.py) and what of it was trusted
(registry/content.py), against real repositories made by the git installed here: every index version
git writes, SHA-1 and SHA-256 object formats, content git converts on checkout, and a hostile index."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from atomictoolsd.registry.content import ContentStore, judge
from atomictoolsd.registry.gitorigin import Repo


def git(where: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=T", "-c", "user.email=t@example.invalid", *args], cwd=where, check=True,
        capture_output=True, env={**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "HOME": str(where)},
    )


def repository(root: Path, *init: str) -> Path:
    tools = root / ".atomic" / "tools"
    (tools / "_lib").mkdir(parents=True)
    (tools / "probe.py").write_text("VERSION = 1\n")
    (tools / "_lib" / "helper.py").write_text("HELP = 1\n")
    git(root, "init", "-q", *init)
    return tools


def origins(root: Path, *paths: Path) -> dict[str, str]:
    files = {str(p): (p.read_bytes(), os.stat(p)) for p in paths}
    return {Path(path).name: origin for path, origin in Repo(root).origins(files).items()}


@pytest.mark.parametrize("version", ["2", "3", "4"])
def test_each_index_version_tells_committed_content_from_an_edit(tmp_path: Path, version: str) -> None:
    tools = repository(tmp_path)
    git(tmp_path, "add", "-A")
    git(tmp_path, "update-index", "--index-version", version)
    git(tmp_path, "commit", "-qm", "tools")
    (tools / "probe.py").write_text("VERSION = 2\n")  # your edit
    (tools / "new.py").write_text("NEW = 1\n")  # a file git does not track
    assert origins(tmp_path, tools / "probe.py", tools / "_lib" / "helper.py", tools / "new.py") == {
        "probe.py": "own", "helper.py": "git", "new.py": "own",
    }


def test_a_sha256_repository(tmp_path: Path) -> None:
    tools = repository(tmp_path, "--object-format=sha256")
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-qm", "tools")
    assert Repo(tmp_path).format == "sha256"
    assert origins(tmp_path, tools / "probe.py") == {"probe.py": "git"}


def test_content_converted_on_checkout_is_what_git_wrote(tmp_path: Path) -> None:
    upstream = tmp_path / "upstream"
    tools = repository(upstream)
    (upstream / ".gitattributes").write_text("*.py ident eol=crlf\n")
    (tools / "probe.py").write_text("# $Id$\nVERSION = 1\n")
    git(upstream, "add", "-A")
    git(upstream, "commit", "-qm", "tools")
    git(tmp_path, "clone", "-q", str(upstream), "clone")
    clone_tools = tmp_path / "clone" / ".atomic" / "tools"
    assert b"$Id: " in (clone_tools / "probe.py").read_bytes() and b"\r\n" in (clone_tools / "probe.py").read_bytes()
    assert origins(tmp_path / "clone", clone_tools / "probe.py") == {"probe.py": "git"}
    (clone_tools / "probe.py").write_bytes((clone_tools / "probe.py").read_bytes() + b"# mine\r\n")
    assert origins(tmp_path / "clone", clone_tools / "probe.py") == {"probe.py": "own"}


def test_an_index_that_is_a_fifo_is_refused_without_waiting(tmp_path: Path) -> None:
    tools = repository(tmp_path)
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-qm", "tools")
    (tmp_path / ".git" / "index").unlink()
    os.mkfifo(tmp_path / ".git" / "index")
    # No index to read: HEAD's tree (read in a process of its own) says what git wrote.
    assert origins(tmp_path, tools / "probe.py") == {"probe.py": "git"}


def test_a_held_file_stays_held_when_edited_until_approved_or_put_back(tmp_path: Path) -> None:
    tools = repository(tmp_path)
    store = ContentStore(tmp_path / "state")
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-qm", "v1")
    first = judge(tmp_path, tools, store, "T", Repo(tmp_path).origins)
    assert first.first and not first.held
    (tools / "probe.py").write_text("VERSION = 2\n")
    git(tmp_path, "commit", "-qam", "v2")  # as if a pull wrote it: committed, never seen
    probe = str(tools / "probe.py")
    assert list(judge(tmp_path, tools, store, "T", Repo(tmp_path).origins).held) == [probe]
    (tools / "probe.py").write_text("VERSION = 2  # touched\n")  # edited after it arrived: still held
    assert list(judge(tmp_path, tools, store, "T", Repo(tmp_path).origins).held) == [probe]
    (tools / "probe.py").write_text("VERSION = 1\n")  # back to what you trusted
    assert judge(tmp_path, tools, store, "T", Repo(tmp_path).origins).held == {}
    (tools / "probe.py").write_text("VERSION = 2\n")
    assert list(judge(tmp_path, tools, store, "T", Repo(tmp_path).origins).held) == [probe]
    store.update(tmp_path, "T", seen={"probe.py": b"VERSION = 2\n"})  # approved
    assert judge(tmp_path, tools, store, "T", Repo(tmp_path).origins).held == {}
    assert store.copy(store.record(tmp_path, "T")["seen"]["probe.py"][-1]) == b"VERSION = 2\n"
    assert judge(tmp_path, tools, store, "another trust", Repo(tmp_path).origins).first, "a new trust entry: a new record"
