"""The built-in tools, served by a real daemon against a real temporary git repository."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from helpers import Daemon, Env

BUILTINS = ["file-reader", "git-diff-summary", "git-status", "workspace-info"]


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout


@pytest.fixture
def repo(env: Env) -> Path:
    """The test project as a git repository: a commit, an unstaged edit, a staged file, an untracked file."""
    root = env.project
    git(root, "init", "-q", "-b", "main")
    git(root, "config", "user.email", "t@example.com")
    git(root, "config", "user.name", "T")
    (root / "src").mkdir()
    (root / "src" / "app.py").write_text("print('one')\n")
    (root / "README.md").write_text("# demo\n")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "first")
    (root / "src" / "app.py").write_text("print('one')\nprint('two')\n")
    (root / "staged.txt").write_text("new\n")
    git(root, "add", "staged.txt")
    (root / "src" / "untracked.py").write_text("x = 1\n")
    git(root, "remote", "add", "origin", "https://someone:s3cret-token@example.com/team/demo.git")
    return root


@pytest.fixture
def builtin_env(env: Env) -> Env:
    del env.vars["ATOMICTOOLS_BUILTINS"]  # the default: what the README promises
    return env


@pytest.fixture
def builtin_daemon(builtin_env: Env, repo: Path, make_daemon) -> Daemon:  # type: ignore[no-untyped-def]
    return make_daemon()


def test_the_daemon_serves_the_builtins_by_default(builtin_daemon: Daemon) -> None:
    with builtin_daemon.client() as client:
        listing = client.request("atomic/list")
    assert [t["name"] for t in listing["tools"]] == BUILTINS
    assert {t["scope"] for t in listing["tools"]} == {"builtin"}
    assert listing["counts"] == {"builtin": 4}
    modules = {Path(m["path"]).name: m for m in builtin_daemon.client().status()["modules"]}
    assert {name for name, m in modules.items() if m["scope"] == "builtin"} == {"git_tools.py", "workspace.py", "file_reader.py"}
    assert all(m["worker"] for m in modules.values()), "they run in workers like any tool"


def test_git_status(builtin_daemon: Daemon, repo: Path) -> None:
    with builtin_daemon.client() as client:
        status = client.call("git-status")
        assert not status.is_error
        assert set(status.text.splitlines()) == {"?? src/untracked.py", "A  staged.txt", " M src/app.py"}
        sub = client.call("git-status", subdirectory="src")
        assert set(sub.text.splitlines()) == {"?? src/untracked.py", " M src/app.py"}
        outside = client.call("git-status", subdirectory="../..")
        assert outside.is_error and outside.text.startswith("Refused: '../..' is outside the project root")


def test_git_status_reports_a_clean_tree(builtin_daemon: Daemon, repo: Path) -> None:
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "all")
    with builtin_daemon.client() as client:
        assert client.call("git-status").text == f"Clean: nothing to commit in {repo.resolve()}"


def test_git_diff_summary_unstaged_and_staged(builtin_daemon: Daemon, repo: Path) -> None:
    with builtin_daemon.client() as client:
        unstaged = client.call("git-diff-summary").text
        assert "src/app.py | 1 +" in unstaged and "staged.txt" not in unstaged
        staged = client.call("git-diff-summary", staged=True).text
        assert "staged.txt | 1 +" in staged and "app.py" not in staged
        git(repo, "add", "-A")
        git(repo, "commit", "-qm", "all")
        assert client.call("git-diff-summary").text == f"No unstaged changes in {repo.resolve()}"


def test_workspace_info(builtin_daemon: Daemon, builtin_env: Env, repo: Path) -> None:
    with builtin_daemon.client(directory=repo / "src") as client:
        result = client.call("workspace-info")
    info = result.structured
    assert info["directory"] == str((repo / "src").resolve())
    assert info["project_root"] == str(repo.resolve()) == info["git_root"]
    assert info["branch"] == "main"
    assert info["remote_url"] == "https://example.com/team/demo.git", "credentials never reach the model"
    assert info["trusted"] is True  # the test environment trusts every project
    assert [(d["scope"], d["path"]) for d in info["tools_dirs"]] == [
        ("local", str(repo.resolve() / ".atomic" / "tools")),
        ("global", str(builtin_env.global_tools)),
        ("builtin", info["tools_dirs"][2]["path"]),
    ]
    assert Path(info["tools_dirs"][2]["path"], "git_tools.py").is_file()


def test_file_reader_stays_inside_the_project(builtin_daemon: Daemon, builtin_env: Env, repo: Path) -> None:
    (builtin_env.root / "secret.txt").write_text("secret\n")
    (repo / "link").symlink_to(builtin_env.root / "secret.txt")
    with builtin_daemon.client(directory=repo / "src") as client:
        assert client.call("file-reader", path="src/app.py").text == "print('one')\nprint('two')\n"
        assert client.call("file-reader", path="src/app.py", start_line=2).text == "print('two')\n"
        for path in ("../secret.txt", "link", str(builtin_env.root / "secret.txt")):
            refused = client.call("file-reader", path=path)
            assert refused.is_error and refused.text.startswith("Refused:") and "secret\n" not in refused.text


def test_file_reader_limits_the_size(builtin_daemon: Daemon, repo: Path) -> None:
    (repo / "huge.txt").write_bytes(b"x" * (1024 * 1024 + 1))
    with builtin_daemon.client() as client:
        result = client.call("file-reader", path="huge.txt")
    assert result.is_error and result.text == "Refused: 'huge.txt' is 1048577 bytes; the limit is 1048576 bytes"


def test_git_tools_outside_a_repository(builtin_env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    daemon = make_daemon()
    with daemon.client() as client:
        result = client.call("git-status")
        assert result.is_error and result.text == f"{builtin_env.project.resolve()} is not inside a git repository"
        info = client.call("workspace-info").structured
        assert (info["git_root"], info["branch"], info["remote_url"]) == (None, None, None)


def test_a_user_tool_shadows_a_builtin_and_counts_by_source(builtin_env: Env, repo: Path, make_daemon) -> None:  # type: ignore[no-untyped-def]
    builtin_env.write_tool(builtin_env.global_tools, "mine.py", '''
        from atomictools import tool

        @tool(name="git-status")
        def status() -> str:
            return "my own status"

        @tool
        def other() -> str:
            return "other"
    ''')
    builtin_env.write_tool(builtin_env.local_tools, "local.py", "def local() -> str:\n    return 'l'\n")
    builtin_env.write_tool(builtin_env.local_tools, "decl.json",
                           '{"tools": [{"name": "decl", "description": "d", "handler": {"type": "shell", "command": "true"}}]}')
    daemon = make_daemon()
    with daemon.client() as client:
        assert client.call("git-status").text == "my own status"
        listing = client.request("atomic/list", {"all": True})
    sources = {t["name"]: t["scope"] for t in listing["tools"]}
    assert sources["git-status"] == "global" and sources["git-diff-summary"] == "builtin"
    assert [(t["name"], t["scope"], t["shadowedBy"]["scope"]) for t in listing["shadowed"]] == [
        ("git-status", "builtin", "global"),
    ]
    assert listing["counts"] == {"builtin": 3, "global": 2, "local": 1, "declarative": 1}


def test_builtins_can_be_switched_off_in_the_config(builtin_env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    builtin_env.write_config("builtins = false\n")
    daemon = make_daemon()
    with daemon.client() as client:
        assert client.list_tools() == []
        assert not [m for m in client.status()["modules"] if m["scope"] == "builtin"]


def test_git_tools_never_run_commands_the_repository_configures(builtin_env: Env, repo: Path, make_daemon) -> None:  # type: ignore[no-untyped-def]
    """A repository's own .git/config can name filter commands; git runs them on diff and status.
    The built-ins serve any project, trusted or not, so they must switch every filter off."""
    marker = builtin_env.root / "repo-command-ran"
    git(repo, "config", "filter.evil.clean", f"touch {marker}; cat")
    git(repo, "config", "filter.evil.smudge", f"touch {marker}; cat")
    git(repo, "config", "filter.evil.process", f"touch {marker}; cat")
    git(repo, "config", "filter.a.b.clean", f"touch {marker}; cat")  # a driver name with a dot
    (repo / ".gitattributes").write_text("* filter=evil\n*.py filter=a.b\n")
    builtin_env.set_trust_all(False)
    daemon = make_daemon()
    with daemon.client() as client:
        (repo / "src" / "app.py").touch()  # a stale index entry makes status read the file through filters
        status = client.call("git-status")
        diff = client.call("git-diff-summary")
        staged = client.call("git-diff-summary", staged=True)
    assert not status.is_error and "src/app.py" in status.text
    assert not diff.is_error and "src/app.py" in diff.text
    assert not staged.is_error
    assert not marker.exists(), "a command from the repository's config ran"
