"""Trust follows the content (docs/trust.md): in a fully trusted project, tool code that arrives
through git (a pull, a checkout) and was never reviewed runs confined where the sandbox is available,
and not at all where it is not, until ``atomictoolsd trust --review`` approves it; the user's own
edits keep reloading at once, with all their rights.

Real daemon, real git (a second clone pushes, the project pulls), real Landlock, the real CLI. The
module under test writes a marker outside the project when it is imported and, when called with a
target, writes there: a write that gets through is code running with the user's full rights.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from atomictools import Client, RPCError
from atomictoolsd.config.command import command_name
from atomictoolsd.worker.sandbox import REQUIRED_ABI, kernel_abi
from helpers import Daemon, Env, wait_for
from shim_helpers import SHIM

PROBE = '''
import pathlib

from _shared import SHARED

VERSION = {version!r}
try:  # runs the moment the module is imported
    pathlib.Path({marker!r}).write_text(VERSION)
except OSError:
    pass


def probe(target: str = "") -> str:
    """Say which version runs; write ``target`` if asked."""
    if not target:
        return f"{{VERSION}}{{SHARED}}"
    try:
        pathlib.Path(target).write_text(VERSION)
    except OSError as exc:
        return f"{{VERSION}}: refused {{type(exc).__name__}}"
    return f"{{VERSION}}: wrote"
'''

needs_sandbox = pytest.mark.skipif(
    kernel_abi() < REQUIRED_ABI, reason=f"the kernel offers Landlock ABI {kernel_abi()}; confining needs {REQUIRED_ABI}"
)


def lowered_abi(env: Env) -> dict[str, str]:
    """Make the daemon believe in a kernel whose Landlock cannot confine a tool (its configuration's
    ``sandbox_abi``); no variable is needed for it."""
    env.write_config(sandbox_abi=REQUIRED_ABI - 1)
    return {}


def run(env: Env, *args: str, cwd: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        list(args), cwd=cwd, env={**env.vars, "GIT_CONFIG_NOSYSTEM": "1"}, capture_output=True, text=True, timeout=60,
    )
    assert not check or done.returncode == 0, f"{args}: {done.stdout}{done.stderr}"
    return done


def git(env: Env, where: Path, *args: str) -> str:
    return run(env, "git", "-c", "user.name=T", "-c", "user.email=t@example.invalid", *args, cwd=where).stdout


def cli(env: Env, *args: str) -> subprocess.CompletedProcess[str]:
    if args[:1] == ("trust",) and "--review" not in args and "--list" not in args:
        args = (*args, "--yes")  # no terminal here: trust asks for one otherwise
    return subprocess.run([sys.executable, "-m", "atomictoolsd", *args], env=env.vars, cwd=env.project,
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


class World:
    """The project (a clone of ``origin``) and a second clone of the same repository, a teammate's."""

    def __init__(self, env: Env) -> None:
        self.env = env
        self.marker = env.root / "imported"  # outside the project: the import-time write lands here
        self.outside = env.root / "outside.txt"
        self.origin = env.root / "origin.git"
        self.other = env.root / "other"
        self.tools = env.local_tools

    def probe(self, version: str) -> str:
        return PROBE.format(version=version, marker=str(self.marker))

    def write(self, where: Path, version: str, shared: str | None = None) -> None:
        tools = where / ".atomic" / "tools"
        tools.mkdir(parents=True, exist_ok=True)
        (tools / "probe.py").write_text(self.probe(version))
        if shared is not None:
            (tools / "_shared.py").write_text(f"SHARED = {shared!r}\n")

    def push_from_other(self, version: str | None = None, shared: str | None = None, branch: str = "main") -> None:
        """The teammate commits a change to the tools and pushes it."""
        git(self.env, self.other, "checkout", "-q", "-B", branch)
        if version is not None:
            self.write(self.other, version)
        if shared is not None:
            (self.other / ".atomic" / "tools" / "_shared.py").write_text(f"SHARED = {shared!r}\n")
        git(self.env, self.other, "commit", "-qam", f"tools {version or shared}")
        git(self.env, self.other, "push", "-q", "origin", branch)


@pytest.fixture
def world(env: Env) -> World:
    env.set_trust_all(False)
    w = World(env)
    w.write(env.project, "v1", shared="")
    run(env, "git", "init", "-q", "--bare", "-b", "main", str(w.origin), cwd=env.root)
    git(env, env.project, "init", "-q", "-b", "main")
    git(env, env.project, "add", "-A")
    git(env, env.project, "commit", "-qm", "tools v1")
    git(env, env.project, "remote", "add", "origin", str(w.origin))
    git(env, env.project, "push", "-q", "-u", "origin", "main")
    git(env, env.root, "clone", "-q", str(w.origin), str(w.other))
    trusted = cli(env, "trust")
    assert trusted.returncode == 0, trusted.stderr
    assert "recorded the content of 2 code file(s)" in trusted.stdout, trusted.stdout
    w.marker.unlink(missing_ok=True)
    return w


def written(path: Path, version: str) -> bool:
    return path.exists() and path.read_text() == version


def call_probe(client: Client, target: str = "") -> str:
    result = client.call("probe", target=target)
    assert not result.is_error, result.text
    return result.text


def held(daemon: Daemon, env: Env) -> list[dict[str, Any]]:
    with daemon.client() as client:
        return list(client.request("atomic/list", {}).get("held", []))


def never_unconfined(world: World, client: Client, window: float = 2.0) -> list[str]:
    """Call the probe for ``window`` seconds after a change arrived; what each call said."""
    seen = []
    deadline = time.monotonic() + window
    while time.monotonic() < deadline:
        try:
            seen.append(call_probe(client, str(world.outside)))
        except RPCError as exc:
            seen.append(f"error: {exc.message}")
        assert not written(world.outside, "v2"), f"new content wrote outside the project with the user's rights: {seen}"
        assert not written(world.marker, "v2"), f"new content ran unconfined when imported: {seen}"
        time.sleep(0.05)
    return seen


@needs_sandbox
def test_a_pull_runs_confined_until_reviewed(world: World, make_daemon, record) -> None:  # type: ignore[no-untyped-def]
    env = world.env
    daemon: Daemon = make_daemon()
    with daemon.client() as client:
        assert call_probe(client, str(world.outside)) == "v1: wrote", "fully trusted: it writes where it likes"
        world.outside.unlink()
        world.push_from_other("v2")
        git(env, env.project, "pull", "-q", "--ff-only")
        seen = never_unconfined(world, client)
        assert seen[-1] == "v2: refused PermissionError", seen  # the new code runs, confined
        entries = held(daemon, env)
    assert [(Path(e["file"]).name, e["confined"], e["why"]) for e in entries] == [("probe.py", True, "git")], entries
    review = f"{command_name()} trust --review {env.project.resolve()}"
    assert entries[0]["command"] == review
    shown = cli(env, "list")
    assert "held: 1 tool module(s)" in shown.stdout and "probe.py: runs confined until you review it" in shown.stdout
    assert f"review with: {review}" in shown.stdout and "local (confined, held)" in shown.stdout, shown.stdout

    refused = cli(env, "trust", "--review")  # no terminal, no --yes: shows, approves nothing
    assert refused.returncode == 1 and "not approved: no terminal" in refused.stderr, refused
    assert "-VERSION = 'v1'" in refused.stdout and "+VERSION = 'v2'" in refused.stdout, refused.stdout
    assert len(held(daemon, env)) == 1

    approved = cli(env, "trust", "--review", "--yes")
    assert approved.returncode == 0, approved.stderr
    assert "approved 1 file(s)" in approved.stdout
    with daemon.client() as client:
        wait_for(lambda: call_probe(client, str(world.outside)) == "v2: wrote", message="the approved module to run with full rights")
    assert held(daemon, env) == []
    assert world.marker.read_text() == "v2", "approved, it was imported with full rights"
    record(f"a pull of a changed module: {len(seen)} calls in {2.0:g} s after it, none unconfined; approved, it runs")


def test_where_nothing_can_confine_it_a_pulled_module_does_not_run(world: World, make_daemon) -> None:  # type: ignore[no-untyped-def]
    env = world.env
    daemon: Daemon = make_daemon(lowered_abi(env))
    with daemon.client() as client:
        assert call_probe(client) == "v1"
        world.push_from_other("v2")
        git(env, env.project, "pull", "-q", "--ff-only")
        seen = never_unconfined(world, client)
        assert seen[-1].startswith("error: Tool 'probe' is held until the user reviews its module"), seen
        assert "its content arrived through git and was not reviewed, and this machine cannot confine it" in seen[-1]
        assert seen[-1].endswith(f"ask the user to run: {command_name()} trust --review {env.project.resolve()}")
    assert not written(world.marker, "v2"), "the held module was never imported"
    shown = cli(env, "list").stdout
    assert "probe.py: does not run (this machine cannot confine it) until you review it" in shown, shown
    with daemon.client() as client:
        status = {Path(m["path"]).name: m for m in client.status()["modules"] if m["scope"] == "local"}
    assert status["probe.py"]["state"] == "held" and status["probe.py"]["worker"] is None
    assert status["probe.py"]["held"]["command"] == f"{command_name()} trust --review {env.project.resolve()}"
    checks = doctor_checks(env)
    assert not checks["content"]["ok"] and checks["content"]["fix"].endswith(f"trust --review {env.project.resolve()}")
    assert "1 file(s)" in checks["content"]["detail"] and "arrived through git" in checks["content"]["detail"]

    assert cli(env, "trust", "--review", "--yes").returncode == 0
    with daemon.client() as client:
        wait_for(lambda: "probe" in {t["name"] for t in client.list_tools()}, message="the approved module")
        assert call_probe(client, str(world.outside)) == "v2: wrote"
    assert doctor_checks(env)["content"]["ok"]


def doctor_checks(env: Env) -> dict[str, dict[str, Any]]:
    """``doctor``'s checks of a Codex entry for the project (doctor only looks: it records nothing)."""
    env.vars["PATH"] = f"{Path(SHIM).parent}{os.pathsep}{env.vars.get('PATH', '')}"  # atomictoolsd installed
    if not (env.home / ".codex" / "config.toml").exists():
        assert cli(env, "connect", "codex", "--user").returncode == 0
    done = cli(env, "doctor", "codex", "--json")
    return {c["name"]: c for c in json.loads(done.stdout)["agents"][0]["checks"]}


def test_your_own_edit_reloads_at_once_and_stays_trusted_once_committed(world: World, make_daemon) -> None:  # type: ignore[no-untyped-def]
    env = world.env
    daemon: Daemon = make_daemon(lowered_abi(env))  # nowhere to confine it: an edit judged wrongly would not run
    with daemon.client() as client:
        assert call_probe(client) == "v1"
        world.write(env.project, "mine")
        wait_for(lambda: call_probe(client) == "mine", message="the user's own edit to load")
        assert call_probe(client, str(world.outside)) == "mine: wrote"
        git(env, env.project, "commit", "-qam", "my edit")
        git(env, env.project, "push", "-q")
    assert held(daemon, env) == []
    daemon.stop()
    daemon = make_daemon(lowered_abi(env))  # a new daemon judges the committed content afresh
    with daemon.client() as client:
        assert call_probe(client, str(world.outside)) == "mine: wrote"
        assert client.reload()["success"]
        assert "held" not in client.reload()
    assert held(daemon, env) == []


def test_a_branch_checked_out_is_held_and_the_one_you_trusted_is_not(world: World, make_daemon) -> None:  # type: ignore[no-untyped-def]
    env = world.env
    world.push_from_other("feature", branch="feature")
    git(env, env.project, "fetch", "-q")
    daemon: Daemon = make_daemon(lowered_abi(env))
    with daemon.client() as client:
        assert call_probe(client) == "v1"
        git(env, env.project, "checkout", "-q", "feature")
        wait_for(lambda: held(daemon, env), message="the checked-out module to be held")
        with pytest.raises(RPCError, match="held until the user reviews"):
            call_probe(client)
        git(env, env.project, "checkout", "-q", "main")  # back to content you trusted
        wait_for(lambda: not held(daemon, env), message="the trusted content to be released")
        assert call_probe(client, str(world.outside)) == "v1: wrote"
    assert not written(world.marker, "feature")


@needs_sandbox
def test_a_pulled_helper_holds_the_modules_that_import_it(world: World, make_daemon) -> None:  # type: ignore[no-untyped-def]
    """The module is what you trusted; the helper it imports came through git. A new module of your
    own that imports the held helper is held with it (its worker refuses the helper unconfined)."""
    env = world.env
    daemon: Daemon = make_daemon()
    with daemon.client() as client:
        assert call_probe(client, str(world.outside)) == "v1: wrote"
        world.outside.unlink()
        world.push_from_other(shared="+pulled")
        git(env, env.project, "pull", "-q", "--ff-only")
        wait_for(lambda: call_probe(client) == "v1+pulled", message="the module to load the pulled helper")
        assert call_probe(client, str(world.outside)) == "v1: refused PermissionError"
        (world.tools / "mine.py").write_text(
            "import pathlib\nfrom _shared import SHARED\n\n\ndef mine(target: str) -> str:\n"
            "    try:\n        pathlib.Path(target).write_text('x')\n    except OSError:\n        return 'refused'\n"
            "    return 'wrote' + SHARED\n"
        )
        wait_for(lambda: "mine" in {t["name"] for t in client.list_tools()}, message="the new module")
        assert client.call("mine", target=str(world.outside)).text == "refused", "it imports held content"
    entries = {Path(e["file"]).name: e for e in held(daemon, env)}
    assert set(entries) == {"probe.py", "mine.py"}, entries
    assert entries["mine.py"]["files"] == [str(world.tools / "_shared.py")], entries["mine.py"]
    assert "it imports" in entries["mine.py"]["message"]
    assert cli(env, "trust", "--review", "--yes").returncode == 0
    with daemon.client() as client:
        wait_for(lambda: client.call("mine", target=str(world.outside)).text == "wrote+pulled", message="approval")


def test_content_pulled_while_the_daemon_was_stopped_is_held_at_the_first_call(world: World, make_daemon) -> None:  # type: ignore[no-untyped-def]
    """After a restart the module is listed from the definition cache, with no worker: the worker
    started by the first call is judged before it starts."""
    env = world.env
    daemon: Daemon = make_daemon(lowered_abi(env))
    with daemon.client() as client:
        assert call_probe(client) == "v1"
    daemon.stop()
    world.push_from_other("v2")
    git(env, env.project, "pull", "-q", "--ff-only")
    daemon = make_daemon(lowered_abi(env))
    with daemon.client() as client:
        with pytest.raises(RPCError, match="held until the user reviews"):
            call_probe(client, str(world.outside))
    assert not written(world.marker, "v2") and not world.outside.exists()


def test_content_git_converts_on_checkout_is_still_what_git_wrote(world: World, make_daemon) -> None:  # type: ignore[no-untyped-def]
    """``ident`` rewrites ``$Id$`` as git checks the file out: the bytes on disk are not the blob's,
    but git wrote them (the index keeps their stat data), so they are held all the same."""
    env = world.env
    daemon: Daemon = make_daemon(lowered_abi(env))
    (world.other / ".gitattributes").write_text("*.py ident\n")
    probe = world.other / ".atomic" / "tools" / "probe.py"
    git(env, world.other, "add", ".gitattributes")
    world.write(world.other, "v2")
    probe.write_text("# $Id$\n" + probe.read_text())
    git(env, world.other, "commit", "-qam", "ident")
    git(env, world.other, "push", "-q")
    with daemon.client() as client:
        assert call_probe(client) == "v1"
        git(env, env.project, "pull", "-q", "--ff-only")
        assert "$Id: " in (world.tools / "probe.py").read_text(), "git rewrote it on the way out"
        never_unconfined(world, client, window=1.5)
        wait_for(lambda: held(daemon, env), message="the converted module to be held")


def test_a_trust_kept_before_content_was_followed_records_it_when_first_judged(world: World, make_daemon) -> None:  # type: ignore[no-untyped-def]
    env = world.env
    (env.state_dir / "trusted-content.json").unlink()  # as an earlier version left the state
    daemon: Daemon = make_daemon(lowered_abi(env))
    with daemon.client() as client:  # attached throughout: the pull is seen as it lands
        assert call_probe(client, str(world.outside)) == "v1: wrote"
        assert "recorded the content of" in daemon.stderr()
        recorded = json.loads((env.state_dir / "trusted-content.json").read_text())["projects"]
        assert set(recorded[str(env.project.resolve())]["seen"]) == {"probe.py", "_shared.py"}
        world.push_from_other("v2")
        git(env, env.project, "pull", "-q", "--ff-only")
        wait_for(lambda: held(daemon, env), message="a later pull to be held")


@needs_sandbox
def test_a_project_trusted_with_sandbox_holds_nothing(world: World, make_daemon) -> None:  # type: ignore[no-untyped-def]
    env = world.env
    assert cli(env, "trust", "--sandbox").returncode == 0
    daemon: Daemon = make_daemon()
    with daemon.client() as client:
        assert call_probe(client, str(world.outside)) == "v1: refused PermissionError"
        world.push_from_other("v2")
        git(env, env.project, "pull", "-q", "--ff-only")
        wait_for(lambda: call_probe(client) == "v2", message="the pulled module, confined as the project is")
    assert held(daemon, env) == []
    nothing = cli(env, "trust", "--review")
    assert nothing.returncode == 1 and "trusted with --sandbox" in nothing.stderr


def test_review_escapes_what_would_hide_code_from_the_reader(world: World, make_daemon) -> None:  # type: ignore[no-untyped-def]
    env = world.env
    tools = world.other / ".atomic" / "tools"
    (tools / "probe.py").write_text(world.probe("v2") + '\nHIDDEN = "\x1b[8m"  # \u202e evil\n')
    git(env, world.other, "commit", "-qam", "escape")
    git(env, world.other, "push", "-q")
    git(env, env.project, "pull", "-q", "--ff-only")
    shown = cli(env, "trust", "--review")
    assert shown.returncode == 1
    assert "\x1b" not in shown.stdout and "\u202e" not in shown.stdout
    assert '+HIDDEN = "\\x1b[8m"  # \\u202e evil' in shown.stdout, shown.stdout


def test_a_repository_that_hangs_its_reader_holds_the_content_not_the_daemon(world: World, make_daemon, record) -> None:  # type: ignore[no-untyped-def]
    """Without an index, HEAD says what git wrote; libgit2 reading HEAD blocks for ever on a FIFO
    that the repository's config includes, holding the interpreter's lock: it is read in a process
    of its own, given up after a few seconds. The content it cannot judge is held; the daemon
    answers meanwhile; the rest of the project runs."""
    env = world.env
    fifo = env.root / "fifo"
    os.mkfifo(fifo)
    with open(env.project / ".git" / "config", "a") as config:
        config.write(f"[include]\n\tpath = {fifo}\n")
    (env.project / ".git" / "index").unlink()
    daemon: Daemon = make_daemon(lowered_abi(env))
    with daemon.client() as client:
        assert call_probe(client) == "v1"  # content you trusted: judged without reading the repository
        (world.tools / "fresh.py").write_text("def fresh() -> str:\n    return 'mine'\n")
        slowest = 0.0
        started = time.monotonic()
        while time.monotonic() - started < 5.0:
            before = time.monotonic()
            client.request("ping")
            slowest = max(slowest, time.monotonic() - before)
            time.sleep(0.1)
        entries = wait_for(lambda: held(daemon, env), message="the content that cannot be judged to be held")
        with pytest.raises(RPCError, match="held until the user reviews"):
            client.call("fresh")
        assert call_probe(client, str(world.outside)) == "v1: wrote"
    assert slowest < 1.0, f"the daemon stopped answering for {slowest:.1f} s"
    assert [(Path(e["file"]).name, e["why"], e["confined"]) for e in entries] == [("fresh.py", "unknown", False)]
    record(f"a FIFO in the repository's config: the daemon answered within {slowest * 1000:.0f} ms throughout; "
           "the content it could not judge held, the rest ran")


def test_a_tools_dir_that_is_a_symlink_in_the_repository_is_judged_where_it_points(world: World, make_daemon) -> None:  # type: ignore[no-untyped-def]
    """A repository can keep its tools elsewhere and commit ``.atomic/tools`` as a link to them: git
    records the files at the path the link names, and that is where they are looked up."""
    env = world.env
    git(env, world.other, "mv", ".atomic/tools", "tools")
    (world.other / ".atomic" / "tools").symlink_to("../tools")
    git(env, world.other, "add", ".atomic/tools")
    git(env, world.other, "commit", "-qm", "tools moved")
    git(env, world.other, "push", "-q")
    git(env, env.project, "pull", "-q", "--ff-only")
    assert (env.project / ".atomic" / "tools").is_symlink()
    daemon: Daemon = make_daemon(lowered_abi(env))
    with daemon.client() as client:
        assert call_probe(client) == "v1", "the same content you trusted, behind a link"
        (world.other / "tools" / "probe.py").write_text(world.probe("v2"))
        git(env, world.other, "commit", "-qam", "v2 behind the link")
        git(env, world.other, "push", "-q")
        git(env, env.project, "pull", "-q", "--ff-only")
        never_unconfined(world, client, window=1.5)
        wait_for(lambda: held(daemon, env), message="the module behind the link to be held")


def test_a_declarative_file_that_arrives_through_git_is_held_too(world: World, make_daemon) -> None:  # type: ignore[no-untyped-def]
    """A ``.json`` tool file runs shell commands: it is code, judged like a Python module."""
    env = world.env
    marker = env.root / "shell-ran"
    daemon: Daemon = make_daemon(lowered_abi(env))
    with daemon.client() as client:
        assert call_probe(client) == "v1"
        (world.other / ".atomic" / "tools" / "deploy.json").write_text(json.dumps({"tools": [{
            "name": "deploy", "description": "d", "handler": {"type": "shell", "command": f"touch {marker}"},
        }]}))
        git(env, world.other, "add", "-A")
        git(env, world.other, "commit", "-qm", "a shell tool")
        git(env, world.other, "push", "-q")
        git(env, env.project, "pull", "-q", "--ff-only")
        wait_for(lambda: held(daemon, env), message="the pulled declarative file to be held")
        with pytest.raises(RPCError, match="held until the user reviews its module"):
            client.call("deploy")
        assert call_probe(client) == "v1", "the rest of the project runs"
    assert not marker.exists()
    assert cli(env, "trust", "--review", "--yes").returncode == 0
    with daemon.client() as client:
        wait_for(lambda: "deploy" in {t["name"] for t in client.list_tools()}, message="the approved file")
        assert not client.call("deploy").is_error
    assert marker.exists()


DYNAMIC_TS = '''import { tool } from "@atomic/plugin"

export default tool({
  description: "Import a helper of the tools dir when called",
  args: {},
  async execute() {
    try {
      const helper = await import("./helper.ts")
      return "helper " + helper.VALUE
    } catch (error) {
      return "refused: " + String(error?.message ?? error)
    }
  },
})
'''


@pytest.mark.parametrize("runtime", ["bun", "node"])
def test_a_typescript_tool_loads_no_helper_that_arrived_through_git(env: Env, make_daemon, runtime: str) -> None:  # type: ignore[no-untyped-def]
    """A JavaScript worker of a followed project gets what it may load, as a Python one does, and its
    load hooks refuse other bytes: a helper pulled since, imported at call time, does not run."""
    from javascript_helpers import js_settings

    settings = js_settings(runtime)
    env.set_trust_all(False)
    env.write_tool(env.local_tools, "dyn.ts", DYNAMIC_TS)
    origin, other = env.root / "origin.git", env.root / "other"
    run(env, "git", "init", "-q", "--bare", "-b", "main", str(origin), cwd=env.root)
    git(env, env.project, "init", "-q", "-b", "main")
    git(env, env.project, "add", "-A")
    git(env, env.project, "commit", "-qm", "a tool")
    git(env, env.project, "remote", "add", "origin", str(origin))
    git(env, env.project, "push", "-q", "-u", "origin", "main")
    git(env, env.root, "clone", "-q", str(origin), str(other))
    assert cli(env, "trust").returncode == 0
    daemon: Daemon = make_daemon({**settings, **lowered_abi(env)})  # nothing confines held content: it must not run
    with daemon.client() as client:
        assert client.call("dyn").text.startswith("refused: ")  # no helper yet
        (other / ".atomic" / "tools" / "helper.ts").write_text('export const VALUE = "from a teammate"\n')
        git(env, other, "add", "-A")
        git(env, other, "commit", "-qm", "a helper")
        git(env, other, "push", "-q", "origin", "main")
        git(env, env.project, "pull", "-q", "origin", "main")
        wait_for(lambda: any(h["file"].endswith("helper.ts") for h in held(daemon, env)), message="the helper to be held")
        answer = client.call("dyn").text
    assert "helper.ts: its content is not what you trusted" in answer, answer
