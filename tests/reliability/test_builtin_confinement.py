"""What a project's confined built-ins may read (docs/sandbox.md, "The built-in tools"): your git
configuration as it really is, and nothing a repository names outside itself.

Real files, real git, a real daemon, and processes confined by the kernel with the very policy the
daemon computes (``builtin_policy``), so a refusal is Landlock's.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from atomictoolsd.config.discovery import RepositoryRefused, locate_repository
from atomictoolsd.config.settings import Config
from atomictoolsd.pool.pool import PoolSettings, WorkerPool
from atomictoolsd.registry.confinement import builtin_policy, judge
from atomictoolsd.registry.model import ToolsDir
from atomictoolsd.registry.projects import GIT_CONFIG_INTERVAL, Registry
from atomictoolsd.registry.trust import TrustStore
from atomictoolsd.worker import sandbox
from atomictoolsd.worker.sandbox import REQUIRED_ABI, kernel_abi
from atomictoolsd.worker.truncate import remove_old_spills
from helpers import Daemon, Env, wait_for

pytestmark = pytest.mark.skipif(
    kernel_abi() < REQUIRED_ABI,
    reason=f"this machine's kernel offers Landlock ABI {kernel_abi()}; confining workers needs ABI {REQUIRED_ABI}",
)


def git(repo: Path, *args: str, env: dict[str, str] | None = None) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True, env=env).stdout


def read_confined(policy: dict[str, Any], path: Path) -> str:
    """What a process confined by ``policy`` gets when it reads ``path``."""
    temp = tempfile.mkdtemp()
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(reader)
        try:
            sandbox.confine(policy, sandbox.runtime_read_paths(), temp, temp)
            try:
                with open(path) as f:
                    answer = "read: " + f.read()
            except OSError as exc:
                answer = f"refused: errno {exc.errno}"
            os.write(writer, answer.encode())
        finally:
            os._exit(0)
    os.close(writer)
    with os.fdopen(reader) as f:
        answer = f.read()
    os.waitpid(pid, 0)
    os.rmdir(temp)
    return answer


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    for name in ("GIT_CONFIG_GLOBAL", "GIT_CONFIG_SYSTEM"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    (home / "secret.txt").write_text("TOP SECRET\n")
    return home


def allows(policy: dict[str, Any], target: Path) -> bool:
    """Whether a read rule of ``policy`` covers ``target`` (the file, or a directory above it)."""
    target = target.resolve()
    return any(target == Path(p) or Path(p) in target.parents for p in policy["read"])


def test_a_repository_cannot_widen_its_builtins_reads(tmp_path: Path, home: Path) -> None:
    """Symlinked .gitignore and .gitattributes on the way down to a project inside a larger
    repository, a .git file and a commondir that lead into the home: none puts the home into the
    policy, and a process confined by it cannot read the targets."""
    outer = tmp_path / "outer"
    git(tmp_path, "init", "-q", str(outer))
    project = outer / "mid" / "pkg"
    project.mkdir(parents=True)
    (outer / ".gitignore").symlink_to(home / "secret.txt")
    (outer / "mid" / ".gitattributes").symlink_to(home / "secret.txt")
    (outer / "mid" / ".gitignore").write_text("*.log\n")
    policy = builtin_policy(project, home, True)
    assert not allows(policy, home / "secret.txt")
    assert str((outer / "mid" / ".gitignore").resolve()) in policy["read"], "a plain ignore file is read"
    assert read_confined(policy, home / "secret.txt") == "refused: errno 13"
    assert read_confined(policy, outer / "mid" / ".gitignore") == "read: *.log\n"

    # The work tree's own, when the project is the work tree: the project's rule covers it, no other.
    (project / ".gitignore").symlink_to(home / "secret.txt")
    git(project, "init", "-q")
    policy = builtin_policy(project, home, True)
    assert not allows(policy, home / "secret.txt") and read_confined(policy, home / "secret.txt") == "refused: errno 13"

    # A .git file naming a git dir in the home.
    fake = home / "fake-git"
    git(home, "init", "-q", "--bare", str(fake))
    (fake / "gitdir").write_text(f"{tmp_path / 'elsewhere' / '.git'}\n")
    other = tmp_path / "other"
    other.mkdir()
    (other / ".git").write_text(f"gitdir: {fake}\n")
    policy = builtin_policy(other, home, True)
    assert not allows(policy, fake / "HEAD") and read_confined(policy, fake / "HEAD") == "refused: errno 13"

    # A commondir naming a directory in the home that holds worktrees/NAME, a symlink back here.
    third = tmp_path / "third"
    git(tmp_path, "init", "-q", str(third))
    (third / ".git" / "commondir").write_text(f"{home}\n")
    (home / "worktrees").mkdir()
    (home / "worktrees" / ".git").symlink_to(third / ".git")
    with pytest.raises(RepositoryRefused):
        locate_repository(third)
    policy = builtin_policy(third, home, True)
    assert not allows(policy, home / "secret.txt") and read_confined(policy, home / "secret.txt") == "refused: errno 13"


def test_a_submodule_git_dir_must_name_this_work_tree(tmp_path: Path, home: Path) -> None:
    """A .git file may lead into an enclosing repository's .git/modules only to the git dir made for
    this work tree (its core.worktree), not to another submodule's."""
    enclosing = tmp_path / "enclosing"
    git(tmp_path, "init", "-q", str(enclosing))
    modules = enclosing / ".git" / "modules"
    modules.mkdir()
    git(tmp_path, "init", "-q", "--separate-git-dir", str(modules / "a"), str(enclosing / "a"))
    git(enclosing / "a", "config", "core.worktree", "../../../a")  # as git submodule writes it
    (enclosing / "b").mkdir()
    (enclosing / "b" / ".git").write_text("gitdir: ../.git/modules/a\n")
    assert locate_repository(enclosing / "a").git_dir == (modules / "a").resolve()
    with pytest.raises(RepositoryRefused, match="neither a worktree nor a submodule"):
        locate_repository(enclosing / "b")
    assert str((modules / "a").resolve()) not in builtin_policy(enclosing / "b", home, True)["read"]
    # Without core.worktree nothing proves whose it is.
    git(enclosing / "a", "config", "--unset", "core.worktree")
    with pytest.raises(RepositoryRefused):
        locate_repository(enclosing / "a")


def with_dotfiles(env: Env) -> Path:
    """The project as a repository holding a.swp and b.txt, and common dotfiles: ~/.gitconfig
    includes ~/.gitconfig.local, which names ~/.gitignore_global (``*.swp``) and an absent
    attributes file; ~/.other_ignore (``*.txt``) is there for an edit to name. Returns the local file."""
    git(env.project, "init", "-q", "-b", "main", env=env.vars)
    (env.project / "a.swp").write_text("x\n")
    (env.project / "b.txt").write_text("x\n")
    (env.home / ".gitconfig").write_text("[include]\n\tpath = ~/.gitconfig.local\n")
    local = env.home / ".gitconfig.local"
    local.write_text("[core]\n\texcludesfile = ~/.gitignore_global\n\tattributesfile = ~/absent\n")
    (env.home / ".gitignore_global").write_text("*.swp\n")
    (env.home / ".other_ignore").write_text("*.txt\n")
    return local


def test_confined_builtins_read_the_files_your_git_config_names(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    """An included ~/.gitconfig.local and a core.excludesFile in the home (common dotfiles) work
    confined; an edit that names another file is followed by the next worker."""
    del env.vars["ATOMICTOOLS_BUILTINS"]
    local = with_dotfiles(env)
    daemon: Daemon = make_daemon()
    with daemon.client() as client:
        status = client.call("git-status")
        assert (status.is_error, status.text) == (False, "?? b.txt\n")
        info = client.call("workspace-info")
        assert not info.is_error and info.structured["branch"] == "main", info.text
        assert all(m["confined"] for m in client.status()["modules"] if m.get("project"))
        with open(local, "a") as f:  # in place: the same file, now naming another
            f.write("[core]\n\texcludesfile = ~/.other_ignore\n")
        wait_for(lambda: client.call("git-status").text == "?? a.swp\n", timeout=15,
                 message="a built-in worker made for the edited git configuration")


def test_the_shared_builtins_run_unconfined_and_a_home_session_has_its_own(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    """The shared built-ins (what has no confined dir of its own: a path that is not UTF-8, no
    project) run with full rights, as docs/sandbox.md says; a session at the home gets its own,
    confined to the home."""
    del env.vars["ATOMICTOOLS_BUILTINS"]
    daemon: Daemon = make_daemon()
    with daemon.client(directory=env.home) as client:
        (env.home / "note.txt").write_text("at home\n")
        assert client.call("file-reader", path="note.txt").text == "at home\n"
        modules = wait_for(lambda: [m for m in client.status()["modules"] if m["scope"] == "builtin"][5:] and [
            m for m in client.status()["modules"] if m["scope"] == "builtin"], message="the shared built-ins' scan")
    shared = [m for m in modules if "project" not in m]
    home = [m for m in modules if m.get("project") == str(env.home.resolve())]
    assert shared and not any(m["confined"] for m in shared), modules
    assert home and all(m["confined"] for m in home), modules


def test_confined_workers_spill_dirs_are_young_when_handed_out_and_gone_when_empty(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    """Each confined worker writes its results' full text in a spill dir of its own, made ahead of
    time: handed out, it is made young, so the spill housekeeping (which removes empty old ones)
    leaves it to its worker; the worker gone, an empty one goes too."""
    del env.vars["ATOMICTOOLS_BUILTINS"]
    git(env.project, "init", "-q", "-b", "main", env=env.vars)
    (env.project / "big.txt").write_text("line\n" * 5000)
    (env.project / "small.txt").write_text("small\n")
    daemon: Daemon = make_daemon({"ATOMICTOOLS_IDLE_TIMEOUT": "1"})

    def own_workers(client: Any) -> list[int]:
        return [m["worker"] for m in client.status()["modules"] if m.get("project") and m["worker"]]

    with daemon.client() as client:
        kept = Path(client.call("file-reader", path="big.txt").meta["atomic/fullOutput"])
        mine = kept.parent
        kept.unlink()
        assert client.call("git-status").text
        wait_for(lambda: not own_workers(client), timeout=15, message="the idle built-in workers to be reaped")
        wait_for(lambda: not mine.exists(), message=f"{mine.name}, empty, removed with its worker")
        spill = mine.parent
        for spare in [d for d in spill.glob("sandbox-*") if not any(d.iterdir())]:  # as if made a day ago
            os.utime(spare, (1, 1))
        assert client.call("file-reader", path="small.txt").text == "small\n"  # a new worker: a spare
        remove_old_spills(str(spill), 3600)  # what the daemon's housekeeping runs
        big = client.call("file-reader", path="big.txt")
    assert not big.is_error, big.text
    assert Path(big.meta["atomic/fullOutput"]).read_text() == "line\n" * 5000


class SlowGit:
    """A ``git`` ahead of the real one on PATH that answers ``config --file`` (how the daemon reads
    your git configuration: ``git_config_paths``) ``delay`` seconds late, the file read at once;
    anything else is the real git at once. A confined worker cannot execute it (it reads only its
    project and the system): its git is the real one, further on PATH."""

    def __init__(self, root: Path, delay: float) -> None:
        real_git = shutil.which("git")  # before PATH leads to this one
        assert real_git is not None
        self.bin = root / "bin"
        self.bin.mkdir()
        self.runs_file = root / "git-config-runs"
        self.delay_file = root / "git-config-delay"
        self.delay(delay)
        script = self.bin / "git"
        script.write_text(
            "#!/bin/sh\n"
            'case " $* " in *" config --file "*)\n'
            f"  wait=$(cat {shlex.quote(str(self.delay_file))}); out=$(mktemp)\n"
            f'  {shlex.quote(real_git)} "$@" > "$out"; code=$?\n'
            f"  echo run >> {shlex.quote(str(self.runs_file))}; sleep \"$wait\"\n"
            '  cat "$out"; rm -f "$out"; exit $code;;\n'
            "esac\n"
            f'exec {shlex.quote(real_git)} "$@"\n'
        )
        script.chmod(0o755)

    def delay(self, seconds: float) -> None:
        self.delay_file.write_text(str(seconds))

    def runs(self) -> int:
        """How many ``config --file`` runs have read their file."""
        return len(self.runs_file.read_text().splitlines()) if self.runs_file.exists() else 0

    def path(self, path: str) -> str:
        return f"{self.bin}{os.pathsep}{path}"


def test_judging_a_projects_builtins_freezes_no_other_client(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    """A project's built-ins are judged by running git on each file of your git configuration
    (``builtin_policy``): a git that takes seconds (a network file system, a huge file) holds up
    that project's built-ins and nothing else. Another client's listing and call on its own
    connection answer at once while it runs, and a built-in called meanwhile waits for the
    judgement and runs confined."""
    del env.vars["ATOMICTOOLS_BUILTINS"]
    slow = SlowGit(env.root, 3)
    (env.home / ".gitconfig").write_text("[core]\n\tquotepath = false\n")  # a file for git to read
    env.write_tool(env.global_tools, "clock.py", """
        from atomictools import tool

        @tool
        def clock() -> str:
            return "tick"
    """)
    (env.project / "note.txt").write_text("judged\n")
    other = env.root / "other"
    other.mkdir()
    daemon: Daemon = make_daemon({"PATH": slow.path(env.vars["PATH"]), "GIT_CONFIG_NOSYSTEM": "1"})

    with daemon.client(directory=other) as onlooker:
        assert onlooker.call("clock").text == "tick"  # its own project judged, the global worker started
        assert slow.runs() >= 1, "the slow git judged the other project's built-ins"
        before = slow.runs()
        answer: list[Any] = []

        def call_a_builtin() -> None:
            with daemon.client() as client:
                answer.append(client.call("file-reader", path="note.txt"))
                answer.append([m for m in client.status()["modules"] if m.get("project") == str(env.project.resolve())])

        caller = threading.Thread(target=call_a_builtin)
        caller.start()
        try:
            wait_for(lambda: slow.runs() > before, message="the project's built-ins being judged")
            started = time.monotonic()
            listing = onlooker.request("tools/list")
            assert onlooker.call("clock").text == "tick"
            took = time.monotonic() - started
        finally:
            caller.join(30)
        # Not a speed: the listing and the call did not wait for a judgement that sleeps 3 s.
        assert took < 1.5, f"another client waited {took:.2f} s while a project's built-ins were judged"
        assert "clock" in [t["name"] for t in listing["tools"]]
    assert not caller.is_alive()
    result, modules = answer
    assert (result.is_error, result.text) == (False, "judged\n")
    assert modules and all(m["confined"] for m in modules), modules


def test_a_judgement_asked_for_during_another_is_the_one_that_stays(
    tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A scan judges a project's built-ins (its git reads your configuration, then takes 3 s to
    answer); meanwhile ~/.gitconfig is edited, and the two-second look at your git configuration
    asks for another judgement. That one, made from the edited file, is the one that stays: the
    older, slower one applied last would keep a policy whose recorded files look current (they are
    stat'ed after git ran), so nothing would judge them again."""
    slow = SlowGit(tmp_path, 0)
    monkeypatch.setenv("PATH", slow.path(os.environ["PATH"]))
    (home / ".gitconfig").write_text("[core]\n\tquotepath = false\n")
    extra = home / ".gitconfig.extra"
    project = tmp_path / "project"
    project.mkdir()
    builtins = tmp_path / "builtins"  # a built-in dir without modules: only its judgement matters here
    builtins.mkdir()
    config, store = Config(), TrustStore(tmp_path / "state")

    async def scenario() -> list[str]:
        pool = WorkerPool(PoolSettings.from_config(spill_dir=str(tmp_path / "spill")))
        registry = Registry(
            pool, home, builtin_dirs=[ToolsDir(builtins, "builtin", Path("/"))],
            judge=lambda tools_dir: judge(tools_dir, config, store, home),
        )
        try:
            found = registry.project(project)
            await found.ready()
            own = found.dirs[-1]
            assert own.cwd == project and own.sandbox is not None, "the project's own built-in dir, confined"
            slow.delay(3)
            before = slow.runs()
            scan = asyncio.ensure_future(registry.scan(own))
            while slow.runs() == before:  # the scan's git has read the file
                await asyncio.sleep(0.01)
            (home / ".gitconfig").write_text(f"[include]\n\tpath = {extra}\n")
            slow.delay(0)
            await scan
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 2 * GIT_CONFIG_INTERVAL + 1
            while str(extra) not in own.sandbox["git_files"] and loop.time() < deadline:
                await asyncio.sleep(0.05)
            assert slow.runs() >= before + 2, "judged again for the edit"
            return own.sandbox["git_files"]
        finally:
            registry.close()
            await pool.close()

    assert str(extra) in asyncio.run(scenario()), "the judgement made from the edited configuration"


def test_a_builtin_called_while_your_edited_git_config_is_judged_waits_for_it(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    """An edit of your git configuration is judged again in a thread (here its git takes a second
    a file); a call that comes meanwhile waits for a worker made for the edited files rather than
    go to the one made before, whose git cannot read the file the edit names."""
    del env.vars["ATOMICTOOLS_BUILTINS"]
    slow = SlowGit(env.root, 1)
    local = with_dotfiles(env)
    daemon: Daemon = make_daemon({"PATH": slow.path(env.vars["PATH"]), "GIT_CONFIG_NOSYSTEM": "1"})

    with daemon.client() as client:
        assert client.call("git-status").text == "?? b.txt\n"
        before = slow.runs()
        with open(local, "a") as f:  # in place: the same file, now naming another
            f.write("[core]\n\texcludesfile = ~/.other_ignore\n")
        wait_for(lambda: slow.runs() > before, timeout=10, message="your edited git configuration being judged")
        status = client.call("git-status")
    assert (status.is_error, status.text) == (False, "?? a.swp\n")
