"""The trust boundary under hostile conditions, through a real daemon and the real CLI.

- A state file write that fails (a full disk: a 64 KiB tmpfs where the test may mount one, and
  everywhere RLIMIT_FSIZE on the CLI process, which fails a write the same way and needs no root)
  says what to do, changes nothing and leaves no temporary file; one left by a writer killed with
  SIGKILL mid-write is swept.
- Trust is bound to the directory, not its path: a trusted directory removed and made again, or
  another renamed into its place, does not load its tools, and the CLI says why and how to trust it
  again; a trusted directory that is gone is untrusted by its path.
- The built-in git tools under hostile repository configurations answer within a bound, with
  nothing from outside the project, and one project's hanging calls do not delay another's.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from helpers import Daemon, Env, wait_for

Record = Callable[[str], None]

TOOL = '''
    import pathlib

    pathlib.Path({marker!r}).write_text("imported")  # runs the moment the module is imported

    def {name}() -> str:
        return "{name} ran"
'''


def cli(env: Env, *args: str, cwd: Path | None = None, preexec: Callable[[], None] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "atomictoolsd", *args], env=env.vars, cwd=cwd or env.root,
        capture_output=True, text=True, timeout=60, preexec_fn=preexec,
    )


def temporaries(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith(".")) if directory.is_dir() else []


@pytest.fixture
def untrusted(env: Env) -> Env:
    env.set_trust_all(False)
    return env


def tool_names(daemon: Daemon, directory: Path) -> set[str]:
    with daemon.client(directory) as client:
        return {tool["name"] for tool in client.list_tools()}


# -- state files on a full disk ---------------------------------------------------------------------


def _limit_file_size() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (16, 16))  # any trust store is larger than 16 bytes


def test_trust_on_a_full_disk_fails_cleanly_and_leaves_nothing(untrusted: Env, record: Record) -> None:
    env = untrusted
    project = env.project.resolve()
    result = cli(env, "trust", "--yes", str(project), preexec=_limit_file_size)
    assert result.returncode == 1, result
    assert "Traceback" not in result.stderr
    assert "cannot write" in result.stderr and "trust.json" in result.stderr and "nothing was changed" in result.stderr
    assert temporaries(env.state_dir) == []
    assert not (env.state_dir / "trust.json").exists()
    # Once there is room, the same command works, and an untrust that fails keeps the trust.
    assert cli(env, "trust", "--yes", str(project)).returncode == 0
    before = (env.state_dir / "trust.json").read_bytes()
    result = cli(env, "untrust", str(project), preexec=_limit_file_size)
    assert result.returncode == 1 and "Traceback" not in result.stderr and "nothing was changed" in result.stderr
    assert (env.state_dir / "trust.json").read_bytes() == before and temporaries(env.state_dir) == []
    record("trust and untrust with writes failing (RLIMIT_FSIZE): clear error, store unchanged, no temporary file")


def test_connect_on_a_full_disk_keeps_the_agent_config_whole(env: Env, record: Record) -> None:
    """``connect`` writes an agent's config (here ``~/.claude.json``): a write that fails leaves
    the file as it was, no temporary file beside it, and says what to do."""
    config = env.home / ".claude.json"
    original = json.dumps({"mcpServers": {"other": {"command": "x"}}, "padding": "p" * 4096}, indent=2)
    config.write_text(original)
    result = cli(env, "connect", "claude", "--user", preexec=_limit_file_size)
    assert result.returncode == 1, result
    assert "Traceback" not in result.stderr and "cannot write" in result.stderr and "nothing was changed" in result.stderr
    assert config.read_text() == original
    assert [p.name for p in env.home.iterdir() if p.name.startswith(".claude.json.")] == []
    ok = cli(env, "connect", "claude", "--user")
    assert ok.returncode == 0, ok
    assert "atomic" in json.loads(config.read_text())["mcpServers"]
    record("connect with writes failing: the agent's config unchanged, no temporary file, a clear error")


@pytest.fixture
def tiny_state_dir(untrusted: Env) -> Iterator[Path]:
    """The state dir on a full 64 KiB tmpfs, where this process may mount one (root, no container
    rule against it); skipped elsewhere (the RLIMIT_FSIZE test covers the same path)."""
    state = untrusted.state_dir
    state.mkdir(parents=True)
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs", str(state)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        fd = os.open(state / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            while os.write(fd, b"\0" * 512):
                pass
        except OSError:
            pass  # full: an empty file can still be made (the lock), no byte can be written
        finally:
            os.close(fd)
        yield state
    finally:
        subprocess.run(["umount", str(state)], check=False)


def test_trust_on_a_really_full_disk(untrusted: Env, tiny_state_dir: Path, record: Record) -> None:
    result = cli(untrusted, "trust", "--yes", str(untrusted.project.resolve()))
    assert result.returncode == 1, result
    assert "Traceback" not in result.stderr and "disk holding it is full" in result.stderr
    assert "df -h" in result.stderr
    assert temporaries(tiny_state_dir) == [] and not (tiny_state_dir / "trust.json").exists()
    record("trust on a full tmpfs (ENOSPC): says the disk is full and what to do; no temporary file")


def test_a_writer_killed_mid_write_leaves_a_temporary_file_that_is_swept(untrusted: Env, record: Record) -> None:
    """A CLI stopped (SIGSTOP) between creating its temporary file and renaming it, then SIGKILLed,
    leaves ``.trust.json.atomictoolsd-<pid>.tmp``; the next command removes it. A live writer's file is kept."""
    env = untrusted
    env.state_dir.mkdir(parents=True)
    # Stop the writer right after it created its temporary file: fsync is the next thing it does.
    stopper = (
        "import os, signal, sys\n"
        "real = os.fsync\n"
        "def fsync(fd):\n"
        "    os.kill(os.getpid(), signal.SIGSTOP)\n"
        "    real(fd)\n"
        "os.fsync = fsync\n"
        "from atomictoolsd.cli import main\n"
        "sys.exit(main(['trust', '--yes', sys.argv[1]]))\n"
    )
    writer = subprocess.Popen([sys.executable, "-c", stopper, str(env.project.resolve())], env=env.vars,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: temporaries(env.state_dir), message="the writer's temporary file")
        left = temporaries(env.state_dir)
        assert len(left) == 1 and left[0].startswith(".trust.json.") and str(writer.pid) in left[0], left
        # While the writer lives, nobody removes its file.
        assert cli(env, "trust", "--list").returncode == 0
        assert temporaries(env.state_dir) == left
    finally:
        writer.kill()
        writer.wait()
    (env.state_dir / ".trust.json.999999999").write_text("{}")  # the name an older version used
    result = cli(env, "trust", "--list")
    assert result.returncode == 0, result
    assert temporaries(env.state_dir) == []
    record("trust writer SIGKILLed mid-write: its temporary file (and an older version's) swept by the next command")


# -- trust is bound to the directory ----------------------------------------------------------------


def test_untrust_of_a_deleted_project_works_by_path(untrusted: Env, make_daemon, record: Record) -> None:  # type: ignore[no-untyped-def]
    env = untrusted
    project = env.root / "gone"
    project.mkdir()
    assert cli(env, "trust", "--yes", str(project)).returncode == 0
    shutil.rmtree(project)
    listing = cli(env, "trust", "--list")
    assert "(missing)" in listing.stdout
    result = cli(env, "untrust", str(project))
    assert result.returncode == 0, result
    assert f"untrusted: {project.resolve()}" in result.stdout
    assert json.loads(cli(env, "trust", "--list", "--json").stdout) == []
    # A directory made at that path later is not trusted.
    project.mkdir()
    env.write_tool(project / ".atomic" / "tools", "later.py", TOOL.format(marker=str(env.root / "later-ran"), name="later"))
    daemon = make_daemon()
    assert "later" not in tool_names(daemon, project)
    assert not (env.root / "later-ran").exists()
    record("untrust by path of a deleted project; a directory made there later does not load")


def _replace_by_rmtree(project: Path) -> None:
    shutil.rmtree(project)
    project.mkdir()


def _replace_by_rename(project: Path) -> None:
    other = project.with_name(project.name + "-other")
    other.mkdir()
    project.rename(project.with_name(project.name + "-old"))
    other.rename(project)


@pytest.mark.parametrize("replace", [_replace_by_rmtree, _replace_by_rename], ids=["rm-rf-mkdir", "rename-swap"])
@pytest.mark.parametrize("daemon_running", [False, True], ids=["daemon-later", "daemon-running"])
def test_a_directory_replaced_after_trust_is_not_trusted(  # type: ignore[no-untyped-def]
    untrusted: Env, make_daemon, record: Record, replace: Callable[[Path], None], daemon_running: bool
) -> None:
    env = untrusted
    project = (env.root / "proj").resolve()
    project.mkdir()
    env.write_tool(project / ".atomic" / "tools", "good.py", TOOL.format(marker=str(env.root / "good-ran"), name="good"))
    assert cli(env, "trust", "--yes", str(project)).returncode == 0
    daemon = make_daemon() if daemon_running else None
    if daemon is not None:
        assert "good" in tool_names(daemon, project)
    replace(project)
    evil_marker = env.root / "evil-ran"
    env.write_tool(project / ".atomic" / "tools", "evil.py", TOOL.format(marker=str(evil_marker), name="evil"))
    # Same file name as the trusted one, so a worker started for a call to it would load the new file.
    env.write_tool(project / ".atomic" / "tools", "good.py", TOOL.format(marker=str(evil_marker), name="good"))
    if daemon is None:
        daemon = make_daemon()
    else:
        time.sleep(1.0)  # let the watcher see the new files: the scan it starts must block them
    with daemon.client(project) as client:
        names = {tool["name"] for tool in client.list_tools()}
        assert "evil" not in names and "good" not in names, names
    assert not evil_marker.exists(), "code of the replacing directory ran"
    listing = cli(env, "list", cwd=project)
    assert "another one" in listing.stdout and f"atomictoolsd trust {project}" in listing.stdout, listing.stdout
    trusted = cli(env, "trust", "--list")
    assert "replaced" in trusted.stdout and f"atomictoolsd trust {project}" in trusted.stdout, trusted.stdout
    # Trusting it again, for the directory there now, loads it.
    again = cli(env, "trust", "--yes", str(project))
    assert again.returncode == 0 and "replaced" in again.stdout, again
    wait_for(lambda: {"evil", "good"} <= tool_names(daemon, project), message="the re-trusted tools")
    record(f"{replace.__name__.strip('_')} after trust ({'daemon running' if daemon_running else 'daemon started after'}): blocked, and the CLI says why")


def test_a_store_of_the_previous_version_still_trusts_its_projects(untrusted: Env, make_daemon, record: Record) -> None:  # type: ignore[no-untyped-def]
    env = untrusted
    project = env.project.resolve()
    env.write_tool(env.local_tools, "old.py", TOOL.format(marker=str(env.root / "old-ran"), name="old"))
    env.state_dir.mkdir(parents=True)
    store = env.state_dir / "trust.json"
    store.write_text(json.dumps({"version": 1, "projects": {str(project): {"trusted_at": "2025-01-01T00:00:00+0000"}}}))
    os.chmod(store, 0o600)
    daemon = make_daemon()
    assert "old" in tool_names(daemon, project)
    upgraded = json.loads(store.read_text())
    assert upgraded["version"] == 2 and "ino" in upgraded["projects"][str(project)]
    assert upgraded["projects"][str(project)]["trusted_at"] == "2025-01-01T00:00:00+0000"
    record("a version-1 trust store: its projects stay trusted, bound to their directories on first read")


# -- the built-in git tools under hostile repositories ----------------------------------------------

SECRET = "LEAKED"  # in the names of the outside repository's files: only git could show them
GIT_TOOLS = [("git-status", {}), ("git-diff-summary", {}), ("git-diff-summary", {"staged": True}), ("workspace-info", {})]
BOUND = 25.0  # the built-ins' own deadline (10 s) and ample room: a hang would take far longer


def run_git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=T", "-c", "user.email=t@example.com", *args], cwd=repo, check=True,
                   capture_output=True, env={**os.environ, "GIT_CONFIG_NOSYSTEM": "1"})


def make_repo(path: Path, files: dict[str, str]) -> Path:
    path.mkdir(parents=True)
    run_git(path, "init", "-q", "-b", "main")
    for name, text in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    run_git(path, "add", "-A")
    run_git(path, "commit", "-qm", "first")
    return path


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A repository of the user's outside the project, whose names must never show: a committed
    file, a staged one and an untracked one."""
    repo = make_repo(tmp_path / "outside", {f"{SECRET}_committed.txt": "secret\n"})
    (repo / f"{SECRET}_staged.txt").write_text("staged\n")
    run_git(repo, "add", f"{SECRET}_staged.txt")
    (repo / f"{SECRET}_untracked.txt").write_text("untracked\n")
    (repo / "outside.cfg").write_text("[core]\n\tworktree = " + str(repo) + "\n")
    return repo


def _config(key: str, value: str) -> Callable[[Path, Path], None]:
    def apply(project: Path, outside: Path) -> None:
        run_git(project, "config", key, value.format(project=project, outside=outside))
    return apply


def _fifo(where: str, then: Callable[[Path, Path], None] | None = None) -> Callable[[Path, Path], None]:
    def apply(project: Path, outside: Path) -> None:
        path = project / where
        path.unlink(missing_ok=True)
        os.mkfifo(path)
        if then is not None:
            then(project, outside)
    return apply


def _git_file(project: Path, outside: Path) -> None:
    shutil.rmtree(project / ".git")
    (project / ".git").write_text(f"gitdir: {outside / '.git'}\n")


def _git_symlink(project: Path, outside: Path) -> None:
    shutil.rmtree(project / ".git")
    (project / ".git").symlink_to(outside / ".git")


def _commondir(project: Path, outside: Path) -> None:
    (project / ".git" / "commondir").write_text(str(outside / ".git") + "\n")


def _huge_config(project: Path, outside: Path) -> None:
    with open(project / ".git" / "config", "a") as f:
        f.write("[huge]\n" + "".join(f"\tk{i} = {'v' * 100}\n" for i in range(20_000)))


def _submodule_elsewhere(project: Path, outside: Path) -> None:
    sub = project / "sub"
    sub.mkdir()
    (sub / ".git").write_text(f"gitdir: {outside / '.git'}\n")
    (sub / "x").write_text("x")
    subprocess.run(["git", "update-index", "--add", "--cacheinfo", "160000,"
                    + subprocess.run(["git", "rev-parse", "HEAD"], cwd=outside, capture_output=True, text=True).stdout.strip()
                    + ",sub"], cwd=project, check=True, capture_output=True)


def _other_owner(project: Path, outside: Path) -> None:
    run_git(project, "config", "safe.directory", "*")  # a repository cannot vouch for itself
    for path in [project, *project.rglob("*")]:
        os.lchown(path, 54321, 54321)


HOSTILE = {
    "core.worktree outside": _config("core.worktree", "{outside}"),
    "core.bare and core.worktree": lambda p, o: (_config("core.bare", "true")(p, o), _config("core.worktree", "{outside}")(p, o)),
    "include.path FIFO": _fifo("hang.cfg", _config("include.path", "{project}/hang.cfg")),
    "include.path outside": _config("include.path", "{outside}/outside.cfg"),
    "includeIf outside": _config("includeIf.gitdir:/.path", "{outside}/outside.cfg"),
    "include.path relative escape": _config("include.path", "../../../outside/outside.cfg"),
    "core.excludesFile FIFO": _fifo("ex", _config("core.excludesFile", "{project}/ex")),
    "core.attributesFile FIFO": _fifo("at", _config("core.attributesFile", "{project}/at")),
    "diff.orderFile FIFO": _fifo("order", _config("diff.orderFile", "{project}/order")),
    "core.excludesFile outside": _config("core.excludesFile", "{outside}/outside.cfg"),
    ".git/config FIFO": _fifo(".git/config"),
    ".git/index FIFO": _fifo(".git/index"),
    ".git/HEAD FIFO": _fifo(".git/HEAD"),
    ".git/info/exclude FIFO": _fifo(".git/info/exclude"),
    "root .gitignore FIFO": _fifo(".gitignore"),
    "root .gitattributes FIFO": _fifo(".gitattributes"),
    "alternates FIFO": _fifo(".git/objects/info/alternates"),
    ".git file to another repository": _git_file,
    ".git symlink to another repository": _git_symlink,
    "commondir to another repository": _commondir,
    "huge config": _huge_config,
    "submodule whose .git points elsewhere": _submodule_elsewhere,
    "another owner, safe.directory in its own config": _other_owner,
}


@pytest.fixture
def builtin_env(env: Env) -> Env:
    del env.vars["ATOMICTOOLS_BUILTINS"]
    return env


def hostile_project(root: Path, name: str, outside: Path) -> Path:
    project = make_repo(root / name.replace(" ", "_").replace("/", "_"), {"a.txt": "a\n", "src/b.txt": "b\n"})
    (project / "a.txt").write_text("a\nchanged\n")
    (project / "new.txt").write_text("new\n")
    HOSTILE[name](project, outside)
    return project


def test_hostile_repository_configs_never_reach_outside_nor_hang(  # type: ignore[no-untyped-def]
    builtin_env: Env, outside: Path, make_daemon, record: Record
) -> None:
    projects = {name: hostile_project(builtin_env.root / "hostile", name, outside) for name in HOSTILE}
    daemon = make_daemon()
    slowest = 0.0
    answers = 0
    problems = []
    timings: list[str] = []
    for name, project in projects.items():
        with daemon.client(project, timeout=60) as client:
            for tool, arguments in GIT_TOOLS:
                started = time.monotonic()
                result = client.call(tool, **arguments)
                took = time.monotonic() - started
                slowest = max(slowest, took)
                answers += 1
                text = result.text if result.text else json.dumps(result.structured)
                timings.append(f"{took:5.2f} s  {name}: {tool} {arguments or ''}: {text[:120]!r}")
                if took > BOUND:
                    problems.append(f"{name}: {tool} took {took:.1f} s")
                if SECRET in text:
                    problems.append(f"{name}: {tool} showed what is outside the project: {text[:300]}")
    print("\n".join(timings))
    assert not problems, "\n".join(problems)
    record(f"{len(HOSTILE)} hostile repository setups x {len(GIT_TOOLS)} git built-in calls: "
           f"{answers} answered, none showed anything outside the project, slowest {slowest:.1f} s")


def readings(daemon: Daemon) -> list[int]:
    """The repository readings alive under the daemon: children of a reader's server."""
    found = []
    for process in daemon.descendants():
        try:
            if "_gitread" in " ".join(process.cmdline()) and "_gitread" in " ".join(process.parent().cmdline()):
                found.append(process.pid)
        except Exception:  # noqa: BLE001 - gone while we looked
            continue
    return found


def test_a_fifo_deep_in_the_tree_is_cut_at_the_deadline(builtin_env: Env, make_daemon, record: Record) -> None:  # type: ignore[no-untyped-def]
    project = make_repo(builtin_env.root / "deep", {"a.txt": "a\n", "deep/er/b.txt": "b\n"})
    os.mkfifo(project / "deep" / "er" / ".gitignore")
    daemon = make_daemon()
    with daemon.client(project, timeout=60) as client:
        started = time.monotonic()
        result = client.call("git-status")
        took = time.monotonic() - started
    assert result.is_error and "did not finish within" in result.text and ".gitignore" in result.text, result.text
    assert took < BOUND
    # A reading is a child of the repository reader's server (the same command line): none is left.
    wait_for(lambda: not readings(daemon), timeout=5, message="the late reading to be killed")
    record(f"a FIFO .gitignore deep in the tree: git-status cut at its deadline ({took:.1f} s), its reading killed")


def test_one_project_hanging_its_git_calls_does_not_delay_another(builtin_env: Env, make_daemon, record: Record) -> None:  # type: ignore[no-untyped-def]
    import threading

    hanging = make_repo(builtin_env.root / "a", {"a.txt": "a\n", "d/b.txt": "b\n"})
    os.mkfifo(hanging / "d" / ".gitignore")
    healthy = make_repo(builtin_env.root / "b", {"b.txt": "b\n"})
    (healthy / "b.txt").write_text("changed\n")
    daemon = make_daemon()
    with daemon.client(healthy) as client:  # the built-in worker is up before the storm
        assert "b.txt" in client.call("git-status").text
    finished: list[float] = []
    lock = threading.Lock()

    def hang() -> None:
        with daemon.client(hanging, timeout=60) as client:
            client.call("git-status")
        with lock:
            finished.append(time.monotonic())

    threads = [threading.Thread(target=hang) for _ in range(20)]
    for thread in threads:
        thread.start()
    time.sleep(1.0)  # all 20 are in the worker, hanging
    with daemon.client(healthy, timeout=60) as client:
        result = client.call("git-status")
        answered = time.monotonic()
    for thread in threads:
        thread.join(60)
    assert not result.is_error and "b.txt" in result.text, result.text
    assert len(finished) == 20
    assert answered < min(finished), "project B's git-status waited for project A's hanging calls"
    record("20 hanging git-status calls in one project: another project's git-status answered before any of them ended")


def test_your_own_safe_directory_still_vouches_for_another_owners_repository(  # type: ignore[no-untyped-def]
    builtin_env: Env, outside: Path, make_daemon
) -> None:
    project = hostile_project(builtin_env.root / "owned", "another owner, safe.directory in its own config", outside)
    daemon = make_daemon()
    with daemon.client(project) as client:
        refused = client.call("git-status")
        assert refused.is_error and "safe.directory" in refused.text, refused.text
        (builtin_env.home / ".gitconfig").write_text(f"[safe]\n\tdirectory = {project}\n")
        # A confined built-in's worker is made for your git configuration as it was: the next one,
        # within the daemon's look every GIT_CONFIG_INTERVAL seconds, for it as it is.
        allowed = wait_for(lambda: (r := client.call("git-status")) and not r.is_error and r, timeout=15,
                           message="a worker made for the new ~/.gitconfig")
    assert not allowed.is_error and "a.txt" in allowed.text, allowed.text
