"""The built-in git tools run no program a repository names, fetch nothing, and never hand the
daemon's environment or your files to the model (docs/builtins.md, "How they read a repository").

Real hostile repositories made with real git, a real daemon with the built-ins on, calls through a
real client. Each repository plants programs ("traps") where git would run them: the transport of
a partial clone's lazy fetch (``remote.<name>.uploadpack``, ``core.sshCommand``, ``core.gitProxy``,
``ext::`` URLs, a credential helper and askpass behind an HTTP 401), fsmonitor, hooks, filter
drivers, an external diff, textconv, a diff driver's command, a pager. A trap leaves a marker file
and prints ``RAN-<name>`` (with the environment) to both outputs, so it is seen unconfined (the
marker) and confined, where it could write nothing but its words would come back in the tool's
error. Each plant is shown live: after the tools, real git on the same repository runs it.

Every test runs twice: with the sandbox ABI lowered below what the built-ins' confinement needs
(``sandbox_abi = 5`` in the configuration, as on macOS or an older kernel: the built-ins then run
unconfined), and at the kernel's.
"""

from __future__ import annotations

import http.server
import os
import pty
import re
import shlex
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from atomictoolsd.worker.sandbox import REQUIRED_ABI, kernel_abi
from helpers import Daemon, Env, command_line

Record = Callable[[str], None]

CALLS = [("git-status", {}), ("git-diff-summary", {}), ("git-diff-summary", {"staged": True}), ("workspace-info", {})]
HOOKS = (
    "post-index-change", "pre-commit", "post-checkout", "post-merge", "reference-transaction", "pre-auto-gc",
    "fsmonitor-watchman", "post-rewrite", "pre-push", "push-to-checkout",
)
SECRETS = {"GITHUB_TOKEN": "ghp_PLANTEDgithubTOKEN1234567890", "ATOMICTOOLS_TOKEN": "PLANTED-atomictools-token-0987"}
HOME_SECRET = "HOME-SECRET-do-not-show-4711"

ABIS = [
    pytest.param("5", id="sandbox-abi-5"),
    pytest.param(None, id="kernel-abi", marks=pytest.mark.skipif(
        kernel_abi() < REQUIRED_ABI, reason=f"the kernel offers Landlock ABI {kernel_abi()}, below {REQUIRED_ABI}")),
]


def git(repo: Path, *args: str, check: bool = True, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "GIT_TERMINAL_PROMPT": "0", **kwargs.pop("env", {})}
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args], cwd=repo,
                          check=check, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60, env=env,
                          **kwargs)


class Traps:
    """Programs that say they ran: ``path(name)`` makes one (an executable script) in ``self.dir``,
    ``ran()`` names those that did.

    A hostile repository ships its programs itself: ``inside(repo)`` puts the next ones in its
    ``.git``, where a worker confined to the project may run them too (elsewhere the kernel would
    refuse to execute them, and the test would prove nothing confined)."""

    def __init__(self, root: Path) -> None:
        self.dir = root / "traps"
        self.markers = root / "markers"
        self.dir.mkdir()
        self.markers.mkdir()

    def inside(self, repo: Path) -> Traps:
        self.dir = repo / ".git" / "traps"
        self.dir.mkdir(exist_ok=True)
        return self

    def path(self, name: str) -> str:
        script = self.dir / re.sub(r"[^A-Za-z0-9_.-]", "_", name)
        marker = self.markers / script.name
        script.write_text(
            "#!/bin/sh\n"
            f"touch {shlex.quote(str(marker))} 2>/dev/null\n"
            f'echo "RAN-{script.name} $(env | tr "\\n" " ")" >&2\n'
            f'echo "RAN-{script.name}"\n'
            "exit 1\n"
        )
        script.chmod(0o755)
        return str(script)

    def hooks(self, name: str) -> str:
        """A hooks directory whose every hook is a trap."""
        hooks = self.dir / f"hooks-{name}"
        hooks.mkdir()
        for hook in HOOKS:
            (hooks / hook).symlink_to(self.path(f"{name}-{hook}"))
        return str(hooks)

    def ran(self) -> list[str]:
        return sorted(p.name for p in self.markers.iterdir())


def changed_repository(repo: Path, *, missing: bool) -> Path:
    """A repository with every kind of change git has to look into: an unstaged edit, a file whose
    stat changed but not its content, a staged edit, a staged rename with an edit (rename detection
    reads both blobs), a staged new file and an untracked one. With ``missing``, it is a partial
    clone whose blobs of the edited and renamed files are gone: git fetches them to diff."""
    repo.mkdir(parents=True, exist_ok=True)
    git(repo, "init", "-q", "-b", "main")
    body = "".join(f"line {i}\n" for i in range(40))
    for name in ("edited.txt", "touched.txt", "staged.txt", "renamed.txt"):
        (repo / name).write_text(f"{name}\n{body}")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "first")
    blobs = [git(repo, "rev-parse", f"HEAD:{name}").stdout.strip() for name in ("edited.txt", "staged.txt", "renamed.txt")]
    (repo / "edited.txt").write_text(f"edited\n{body}more\n")
    os.utime(repo / "touched.txt", (1, 1))
    (repo / "staged.txt").write_text(f"staged\n{body}")
    git(repo, "mv", "renamed.txt", "moved.txt")
    with open(repo / "moved.txt", "a") as f:
        f.write("one more\n")
    (repo / "new.txt").write_text("new\n")
    git(repo, "add", "staged.txt", "moved.txt", "new.txt")
    (repo / "untracked.txt").write_text("untracked\n")
    if missing:
        for blob in blobs:
            (repo / ".git" / "objects" / blob[:2] / blob[2:]).unlink()
        git(repo, "config", "core.repositoryformatversion", "1")
        git(repo, "config", "extensions.partialClone", "origin")
        git(repo, "config", "remote.origin.promisor", "true")
        git(repo, "config", "remote.origin.partialclonefilter", "blob:none")
    return repo


class Unauthorized(http.server.BaseHTTPRequestHandler):
    """Answers every request 401, so git asks a credential helper or askpass for a password."""

    def do_GET(self) -> None:  # noqa: N802 - the standard library's name
        self.send_response(401)
        self.send_header("WWW-Authenticate", 'Basic realm="trap"')
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def http_401() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Unauthorized)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/repo.git"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def _lazy_fetch(url: Callable[[Traps, str], str], **config: Callable[[Traps], str]) -> Callable[..., None]:
    def plant(repo: Path, traps: Traps, http_url: str) -> None:
        git(repo, "config", "remote.origin.url", url(traps, http_url))
        for key, value in config.items():
            git(repo, "config", key.replace("__", "."), value(traps))
    plant.missing = True  # type: ignore[attr-defined]
    return plant


def _config(**config: Callable[[Traps], str]) -> Callable[..., None]:
    def plant(repo: Path, traps: Traps, http_url: str) -> None:
        for key, value in config.items():
            git(repo, "config", key.replace("__", "."), value(traps))
    return plant


def _with_attributes(attributes: str, plant: Callable[..., None]) -> Callable[..., None]:
    def both(repo: Path, traps: Traps, http_url: str) -> None:
        (repo / ".git" / "info" / "attributes").write_text(attributes)
        plant(repo, traps, http_url)
    return both


# Each plant, and the git commands (beyond status and diff --stat, staged or not) that run it.
VARIANTS: dict[str, tuple[Callable[..., None], tuple[str, ...]]] = {
    "partial clone, remote.origin.uploadpack": (_lazy_fetch(
        lambda t, h: "/nonexistent/origin.git", remote__origin__uploadpack=lambda t: t.path("uploadpack")), ()),
    "partial clone, core.sshCommand": (_lazy_fetch(
        lambda t, h: "ssh://git.example.invalid/repo.git", core__sshCommand=lambda t: t.path("sshCommand")), ()),
    "partial clone, core.gitProxy": (_lazy_fetch(
        lambda t, h: "git://git.example.invalid/repo.git", core__gitProxy=lambda t: t.path("gitProxy")), ()),
    "partial clone, ext:: URL": (_lazy_fetch(
        lambda t, h: f"ext::{t.path('ext-url')} %S", protocol__ext__allow=lambda t: "always"), ()),
    "partial clone, url.insteadOf an ext:: URL": (_lazy_fetch(
        lambda t, h: "https://git.example.invalid/repo.git", protocol__ext__allow=lambda t: "always",
        **{f"url.ext::{'{}'} %S.insteadOf".replace("{}", "TRAP"): lambda t: "https://git.example.invalid/"}), ()),
    "partial clone, credential.helper": (_lazy_fetch(
        lambda t, h: h, credential__helper=lambda t: t.path("credential-helper")), ()),
    "partial clone, core.askPass": (_lazy_fetch(lambda t, h: h, core__askPass=lambda t: t.path("askPass")), ()),
    "core.fsmonitor": (_config(core__fsmonitor=lambda t: t.path("fsmonitor")), ()),
    "hooks in core.hooksPath": (_config(core__hooksPath=lambda t: t.hooks("hooksPath")), ()),
    "filter clean, smudge, process": (_with_attributes("* filter=trap\n", _config(
        filter__trap__clean=lambda t: t.path("filter-clean"), filter__trap__smudge=lambda t: t.path("filter-smudge"),
        filter__trap__process=lambda t: t.path("filter-process"))), ()),
    "diff.external": (_config(diff__external=lambda t: t.path("diff-external")), ("diff",)),
    "textconv": (_with_attributes("* diff=trap\n", _config(diff__trap__textconv=lambda t: t.path("textconv"))), ("diff",)),
    "diff driver command": (_with_attributes("* diff=trap\n", _config(diff__trap__command=lambda t: t.path("diff-command"))), ("diff",)),
    "core.pager and pager.<cmd>": (_config(core__pager=lambda t: t.path("core-pager"), pager__diff=lambda t: t.path("pager-diff"),
                                           pager__status=lambda t: t.path("pager-status")), ("tty",)),
}


def plant(root: Path, name: str, traps: Traps, http_url: str) -> Path:
    planter, _ = VARIANTS[name]
    repo = changed_repository(root / re.sub(r"[^A-Za-z0-9]+", "-", name), missing=getattr(planter, "missing", False))
    traps.inside(repo)
    if "insteadOf" in name:  # the key names the trap itself
        git(repo, "config", f"url.ext::{traps.path('insteadof-ext')} %S.insteadOf", "https://git.example.invalid/")
        git(repo, "config", "protocol.ext.allow", "always")
        git(repo, "config", "remote.origin.url", "https://git.example.invalid/repo.git")
    else:
        planter(repo, traps, http_url)
    return repo


def run_real_git(repo: Path, extra: tuple[str, ...]) -> None:
    """What makes git run the plants: the commands the built-ins ran before they read with
    libgit2 (status, diff --stat, staged or not), and what each plant needs besides."""
    for args in (("status", "--porcelain"), ("diff", "--stat"), ("diff", "--stat", "--staged"), ("diff",), ("diff", "--staged")):
        if args[0] == "diff" and len(args) < 3 and args != ("diff", "--stat") and "diff" not in extra:
            continue
        git(repo, *args, check=False)
    if "tty" in extra:  # a pager runs only for a terminal
        leader, follower = pty.openpty()
        try:
            subprocess.run(["git", "diff"], cwd=repo, stdin=subprocess.DEVNULL, stdout=follower, stderr=follower,
                           timeout=60, env={**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "TERM": "dumb"})
        finally:
            os.close(follower)
            os.close(leader)


def call_all(daemon: Daemon, repo: Path) -> dict[str, str]:
    """Every git built-in's answer in ``repo``, keyed by call."""
    answers = {}
    with daemon.client(repo, timeout=60) as client:
        for tool, arguments in CALLS:
            result = client.call(tool, **arguments)
            answers[f"{tool} {arguments or ''}"] = result.text or str(result.structured)
    return answers


def daemon_for(env: Env, make_daemon: Callable[..., Daemon], abi: str | None, **extra: str) -> Daemon:
    env.write_config(**({"sandbox_abi": int(abi)} if abi else {}))
    return make_daemon({**SECRETS, **extra})


@pytest.fixture
def builtin_env(env: Env) -> Env:
    del env.vars["ATOMICTOOLS_BUILTINS"]
    env.set_trust_all(False)  # the repositories are nobody's trusted projects
    return env


@pytest.mark.parametrize("abi", ABIS)
def test_no_program_a_repository_names_runs(  # type: ignore[no-untyped-def]
    builtin_env: Env, make_daemon, http_401: str, abi: str | None, record: Record,
) -> None:
    """Each plant in a repository of its own; both git tools (and workspace-info) called on each:
    no trap runs, and each answer is right, the missing blobs an error that says so."""
    traps = Traps(builtin_env.root)
    repos = {name: plant(builtin_env.root / "hostile", name, traps, http_401) for name in VARIANTS}
    daemon = daemon_for(builtin_env, make_daemon, abi)
    answers = {name: call_all(daemon, repo) for name, repo in repos.items()}
    assert traps.ran() == [], f"programs the repositories name ran: {traps.ran()}"
    said = {f"{name}: {call}": text for name, calls in answers.items() for call, text in calls.items() if "RAN-" in text}
    assert not said, f"a program the repository names ran and its words came back: {said}"
    for name, calls in answers.items():
        status = calls["git-status "]
        if name.startswith("partial clone"):
            assert "never fetch" in status and "RAN-" not in status, f"{name}: {status}"
        else:
            assert status.splitlines() == [
                " M edited.txt", "R  renamed.txt -> moved.txt", "A  new.txt", "M  staged.txt", "?? untracked.txt",
            ] or set(status.splitlines()) == {
                " M edited.txt", "R  renamed.txt -> moved.txt", "A  new.txt", "M  staged.txt", "?? untracked.txt",
            }, f"{name}: {status}"
    # The plants are live: real git, run as the built-ins once ran it, runs each of them.
    for name, repo in repos.items():
        before = set(traps.ran())
        run_real_git(repo, VARIANTS[name][1])
        assert set(traps.ran()) - before, f"{name}: real git ran none of its plants, so the test proves nothing"
    record(f"{len(VARIANTS)} hostile repositories x {len(CALLS)} built-in calls with the sandbox "
           f"{'ABI at ' + abi if abi else 'at the kernel ABI'}: no program ran; real git then ran "
           f"{len(traps.ran())} of the plants")


# -- every command-running key of the installed git ---------------------------------------------------

# The last part of a key whose value git runs (or that names a program or a hooks directory).
_COMMAND_KEY = re.compile(
    r"(?i)\.(cmd|command|\w*command|helper|uploadpack|receivepack|proxy|gitproxy|fsmonitor|hookspath|textconv|"
    r"external|clean|smudge|process|driver|program|askpass|editor|pager|packobjectshook|tocmd|cccmd)$"
)
_NOT_COMMANDS = re.compile(r"(?i)^(advice|color|column|completion|rebase|uploadpackfilter|notes)\.")
_PLACEHOLDERS = {"<driver>": "trap", "<tool>": "trap", "<name>": "origin", "<format>": "openpgp"}
# Known to run a program, whether or not this git's `git help --config` lists them.
_FLOOR = ("filter.<driver>.process", "credential.helper", "core.sshCommand", "core.gitProxy", "core.fsmonitor",
          "core.hooksPath", "core.pager", "diff.external", "diff.<driver>.textconv", "diff.<driver>.command",
          "filter.<driver>.clean", "filter.<driver>.smudge", "remote.<name>.uploadpack", "core.askPass")


def command_keys() -> list[str]:
    """Every key of the installed git's configuration whose value is a command, placeholders
    filled in (``pager.<cmd>`` for each command the built-ins once ran)."""
    listed = subprocess.run(["git", "help", "--config"], capture_output=True, text=True, check=True).stdout.split()
    keys = []
    for key in dict.fromkeys([k for k in listed if "." in k and "*" not in k] + list(_FLOOR)):
        if key.startswith("pager.<"):
            keys += ["pager.status", "pager.diff"]
        elif _COMMAND_KEY.search(key) and not _NOT_COMMANDS.match(key):
            for placeholder, value in _PLACEHOLDERS.items():
                key = key.replace(placeholder, value)
            if "<" not in key:
                keys.append(key)
    return sorted(set(keys))


@pytest.mark.parametrize("abi", ABIS)
def test_every_command_key_of_the_installed_git_is_planted_and_none_runs(  # type: ignore[no-untyped-def]
    builtin_env: Env, make_daemon, abi: str | None, record: Record,
) -> None:
    """`git help --config` of the git installed here lists its configuration; every key whose value
    is a command (a newer git's new ones included) gets a trap, in a partial clone that lacks blobs
    it needs, with attributes that send every file through the trapped drivers."""
    keys = command_keys()
    assert {"core.sshcommand", "core.fsmonitor", "remote.origin.uploadpack", "credential.helper",
            "diff.trap.textconv", "filter.trap.process", "core.gitproxy"} <= {k.lower() for k in keys}, keys
    traps = Traps(builtin_env.root)
    repo = changed_repository(builtin_env.root / "every-key", missing=True)
    traps.inside(repo)
    (repo / ".git" / "info" / "attributes").write_text("* filter=trap diff=trap merge=trap\n")
    git(repo, "config", "remote.origin.url", "/nonexistent/origin.git")
    for key in keys:
        value = traps.hooks("hooksPath") if key.lower() == "core.hookspath" else traps.path(key)
        git(repo, "config", key, value)
    for hook in HOOKS:  # and the hooks where git looks by default
        (repo / ".git" / "hooks" / hook).symlink_to(traps.path(f"dot-git-{hook}"))
    daemon = daemon_for(builtin_env, make_daemon, abi)
    answers = call_all(daemon, repo)
    assert traps.ran() == [], f"programs the repository names ran: {traps.ran()}"
    assert not [text for text in answers.values() if "RAN-" in text], answers
    run_real_git(repo, ("diff",))
    assert traps.ran(), "real git ran none of the plants, so the test proves nothing"
    record(f"{len(keys)} command-running keys of git {subprocess.run(['git', '--version'], capture_output=True, text=True).stdout.split()[-1]} "
           f"planted: no program ran through the built-ins; real git then ran {len(traps.ran())} of them")


# -- what an error may say -----------------------------------------------------------------------------


def _leaky_repositories(root: Path, home: Path, traps: Traps) -> dict[str, Path]:
    """Repositories whose reading fails in a way that could carry a file of the home or the
    daemon's environment into the error."""
    secret = home / "token.txt"
    secret.write_text(f"[core]\n\ttoken = {HOME_SECRET}\n")
    repos = {}

    def make(name: str) -> Path:
        repos[name] = changed_repository(root / name.replace(" ", "-"), missing=False)
        return repos[name]

    git(make("include of a home file"), "config", "include.path", "~/token.txt")
    git(make("excludesFile in the home"), "config", "core.excludesFile", "~/token.txt")
    head = make("HEAD a symlink into the home") / ".git" / "HEAD"
    head.unlink()
    head.symlink_to(secret)
    with open(make("bad config") / ".git" / "config", "a") as f:
        f.write("[broken\n\tkey = value\n")
    uploadpack = changed_repository(root / "uploadpack-prints-env", missing=True)
    traps.inside(uploadpack)
    git(uploadpack, "config", "remote.origin.url", "/nonexistent/origin.git")
    git(uploadpack, "config", "remote.origin.uploadpack", f"cat {secret}; {traps.path('uploadpack-env')}")
    repos["uploadpack prints the environment and a home file"] = uploadpack
    return repos


@pytest.mark.parametrize("abi", ABIS)
def test_errors_carry_neither_the_environment_nor_your_files(  # type: ignore[no-untyped-def]
    builtin_env: Env, make_daemon, abi: str | None, record: Record,
) -> None:
    """Planted tokens in the daemon's environment, a secret in a file of the home; repositories
    that point at it, or whose lazy fetch would print both: every answer is an error in our words
    (or a right answer), and none holds a token or the file's content."""
    traps = Traps(builtin_env.root)
    repos = _leaky_repositories(builtin_env.root / "leaky", builtin_env.home, traps)
    daemon = daemon_for(builtin_env, make_daemon, abi)
    answers = {name: call_all(daemon, repo) for name, repo in repos.items()}
    leaks = {
        f"{name}: {call}": text for name, calls in answers.items() for call, text in calls.items()
        if HOME_SECRET in text or any(value in text for value in SECRETS.values()) or "RAN-" in text
    }
    assert not leaks, leaks
    for name in ("include of a home file", "excludesFile in the home", "HEAD a symlink into the home"):
        assert all(text.startswith("Refused: ") for text in answers[name].values()), answers[name]
    bad = answers["bad config"]["git-status "]
    assert bad.startswith("git-status: libgit2 could not read the repository") and "failed to parse config" in bad, bad
    fetch = answers["uploadpack prints the environment and a home file"]
    assert all("never fetch" in fetch[call] for call in ("git-status ", "git-diff-summary ")), fetch
    record(f"{len(repos)} repositories whose errors could leak x {len(CALLS)} calls: no token of the daemon's "
           "environment, no content of a home file in any answer")


# -- git itself --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("abi", ABIS)
def test_the_builtins_never_run_git(builtin_env: Env, make_daemon, abi: str | None) -> None:  # type: ignore[no-untyped-def]
    """A ``git`` first on the daemon's PATH, in the project (where a confined worker may run it
    too), logs each run where it can and fails saying so: the git tools run it never. (The daemon
    reads your own git config files with ``git config --file`` to confine a project's built-ins;
    that reads one named file of yours and nothing of a repository.)"""
    repo = changed_repository(builtin_env.project, missing=False)
    bin_dir = repo / ".git" / "bin"
    bin_dir.mkdir()
    log = builtin_env.root / "git-runs"
    (bin_dir / "git").write_text(
        f'#!/bin/sh\necho "$PWD: $*" >> {shlex.quote(str(log))} 2>/dev/null\necho "THE-GIT-BINARY-RAN" >&2\nexit 1\n'
    )
    (bin_dir / "git").chmod(0o755)
    (builtin_env.home / ".gitconfig").write_text("[core]\n\tquotepath = true\n")
    daemon = daemon_for(builtin_env, make_daemon, abi, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    answers = call_all(daemon, repo)
    assert "M  staged.txt" in answers["git-status "], answers
    assert not [text for text in answers.values() if "THE-GIT-BINARY-RAN" in text], answers
    runs = log.read_text().splitlines() if log.exists() else []
    assert [run for run in runs if " config --file " not in run] == [], runs
    # What read the repository had nothing of the daemon's environment: no token, no PATH, no HOME.
    readers = [p for p in daemon.descendants() if "_gitread" in command_line(p)]
    assert readers, "the repository reader's server runs for the worker that used it"
    for reader in readers:
        assert [key for key in reader.environ() if not key.startswith("PYTHON")] == [], reader.environ()


@pytest.mark.parametrize("abi", ABIS)
def test_your_own_broken_git_config_is_not_shown(builtin_env: Env, make_daemon, abi: str | None) -> None:  # type: ignore[no-untyped-def]
    """Your ~/.gitconfig with a bad line that holds a secret: the built-ins fail as git would, and
    say where in our words, the file's path and content left out."""
    repo = changed_repository(builtin_env.project, missing=False)
    (builtin_env.home / ".gitconfig").write_text(f"[user]\n\tname = me\n[{HOME_SECRET}\n")
    daemon = daemon_for(builtin_env, make_daemon, abi)
    answers = call_all(daemon, repo)
    status = answers["git-status "]
    assert status.startswith("git-status: libgit2 could not read the repository"), status
    assert "<a path outside the repository>" in status, status
    assert not [text for text in answers.values() if HOME_SECRET in text or str(builtin_env.home) in text], answers
