"""Project trust through a real daemon and the real CLI: an untrusted project's own tools are listed as
blocked and never run; trusting it (while the daemon runs) loads them at once; untrusting blocks them.

These tests turn off trust_all, which the test environment's config file sets for everyone else.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from atomictools import RPCError
from atomictoolsd.config.command import command_name
from helpers import Daemon, Env, run_in_terminal, wait_for

PROBE = '''
    import pathlib

    pathlib.Path({marker!r}).write_text("imported")  # runs the moment the module is imported

    def probe() -> str:
        return "project code ran"
'''
DECL = '{"tools": [{"name": "decl", "description": "d", "handler": {"type": "shell", "command": "echo decl"}}]}'


def cli(env: Env, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "atomictoolsd", *args], env=env.vars, cwd=cwd or env.project,
                          capture_output=True, text=True, timeout=60)


@pytest.fixture
def untrusted(env: Env) -> Env:
    env.set_trust_all(False)
    env.marker = env.root / "imported"  # type: ignore[attr-defined]
    env.write_tool(env.local_tools, "probe.py", PROBE.format(marker=str(env.marker)))  # type: ignore[attr-defined]
    env.write_tool(env.local_tools, "decl.json", DECL)
    env.write_tool(env.global_tools, "everywhere.py", "def everywhere() -> str:\n    return 'global'\n")
    return env


def project_modules(daemon: Daemon, env: Env) -> dict[str, tuple[str, int | None]]:
    with daemon.client() as client:
        modules = client.status()["modules"]
    return {Path(m["path"]).name: (m["state"], m["worker"]) for m in modules if m["scope"] == "local"}


def test_untrusted_tools_are_blocked_and_never_run_until_trusted(untrusted: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    env = untrusted
    root = env.project.resolve()
    command = f"{command_name()} trust --sandbox {shlex.quote(str(root))}"  # the confined trust is offered first
    full = f"{command_name()} trust {shlex.quote(str(root))}"
    offer = f"to load them confined (no network, nothing outside the project), run: {command}; or, with all your rights: {full}"
    to_agent = (f"only the user can trust a project (`trust` needs their terminal): ask the user whether to run {command} "
                f"(loads them confined: no network, nothing outside the project), or {full} (loads them with all the "
                f"user's rights)")
    daemon = make_daemon()
    with daemon.client() as client:
        listing = client.request("atomic/list")
        assert [t["name"] for t in listing["tools"]] == ["everywhere"], "the global dir is always trusted"
        assert listing["blocked"] == [
            {"file": str(env.local_tools / "decl.json"), "scope": "local", "root": str(root), "command": command,
             "fullCommand": full, "message": offer, "agentMessage": to_agent},
            {"file": str(env.local_tools / "probe.py"), "scope": "local", "root": str(root), "command": command,
             "fullCommand": full, "message": offer, "agentMessage": to_agent},
        ]
        assert listing["errors"] == []
        with pytest.raises(RPCError) as info:
            client.call("probe")
        assert info.value.code == -32602
        # Addressed to the agent, about the user: trusting is theirs to decide, and `trust` needs their terminal.
        assert info.value.message == f"Unknown tool: 'probe'; this project's own tools are blocked until the user trusts the project: {to_agent}"
    assert project_modules(daemon, env) == {"decl.json": ("blocked", None), "probe.py": ("blocked", None)}
    assert not env.marker.exists(), "the module was never imported, not even to learn its tool names"  # type: ignore[attr-defined]

    shown = cli(env, "list").stdout
    assert f"blocked: 2 tool module(s) of {root}, not a trusted project" in shown
    assert offer in shown

    with daemon.raw() as watcher:
        watcher.request("atomic/attach", {"directory": str(env.project)})
        watcher.request("atomic/subscribe")
        (env.project / "sub").mkdir()
        trusted = cli(env, "trust", "--yes", cwd=env.project / "sub")  # from a subdirectory: the project is trusted
        assert trusted.returncode == 0, trusted.stderr
        assert trusted.stdout.splitlines() == [
            f"trusted: {root} (2 tool module(s) in {root / '.atomic' / 'tools'} will load, with all your rights)",
            f"recorded the content of 2 code file(s): a change that arrives through git (a pull, a checkout) is "
            f"held until you review it ({command_name()} trust --review)",
            "the running daemon loaded the project's tools; attached agents were told",
        ]
        assert watcher.recv() == {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}, "no restart needed"

    with daemon.client() as client:
        assert [t["name"] for t in client.list_tools()] == ["decl", "everywhere", "probe"]
        assert client.call("probe").text == "project code ran"
        assert client.call("decl").text == "decl\n"
        assert "blocked" not in client.reload()
    assert env.marker.exists()  # type: ignore[attr-defined]

    store = env.state_dir / "trust.json"
    assert stat.S_IMODE(store.stat().st_mode) == 0o600
    assert list(json.loads(store.read_text())["projects"]) == [str(root)]
    listed = cli(env, "trust", "--list")
    assert str(root) in listed.stdout and listed.returncode == 0

    untrusted_now = cli(env, "untrust", str(env.project))
    assert untrusted_now.stdout.splitlines()[0] == f"untrusted: {root} (its own tools no longer load)"
    with daemon.client() as client:
        assert [t["name"] for t in client.list_tools()] == ["everywhere"]
        with pytest.raises(RPCError):
            client.call("probe")
    assert project_modules(daemon, env) == {"decl.json": ("blocked", None), "probe.py": ("blocked", None)}


def test_an_agent_is_told_how_to_trust_the_project(untrusted: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    daemon = make_daemon()
    with daemon.raw() as raw:  # what the shim does: attach, then relay the agent's initialize
        raw.request("atomic/attach", {"directory": str(untrusted.project)})
        init = raw.request("initialize", {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t"}})
    command = f"{command_name()} trust --sandbox {shlex.quote(str(untrusted.project.resolve()))}"
    assert init["result"]["instructions"].endswith(
        f"not loaded until the user trusts the project; only the user can trust a project (`trust` needs their "
        f"terminal): ask the user whether to run {command} (loads them confined: no network, nothing outside the "
        f"project), or {command.replace(' --sandbox', '')} (loads them with all the user's rights)."
    )


def test_trust_is_remembered_across_restarts_and_set_without_a_daemon(untrusted: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    done = cli(untrusted, "trust", "--yes", str(untrusted.project))
    assert done.stdout.splitlines()[-1] == "the daemon is not running; it will read this when it starts"
    daemon = make_daemon()
    with daemon.client() as client:
        assert client.call("probe").text == "project code ran"
    again = cli(untrusted, "trust", "--yes")
    assert again.stdout.startswith(f"already trusted: {untrusted.project.resolve()}")


def test_trust_all_comes_from_the_config_file_never_from_the_environment(untrusted: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    """An agent's config entry, which a repository writes, sets the environment of the shim and so of
    the daemon it starts: ATOMICTOOLS_TRUST_ALL there trusts nothing, and says where it counts."""
    daemon = make_daemon({"ATOMICTOOLS_TRUST_ALL": "1"})
    with daemon.client() as client:
        with pytest.raises(RPCError, match="blocked until the user trusts"):
            client.call("probe")
        ignored = client.status()["configIgnored"]
    assert not untrusted.marker.exists()  # type: ignore[attr-defined]
    assert list(ignored) == ["ATOMICTOOLS_TRUST_ALL"] and "trust_all = true" in ignored["ATOMICTOOLS_TRUST_ALL"]
    assert str(untrusted.config_file) in ignored["ATOMICTOOLS_TRUST_ALL"]
    assert "ATOMICTOOLS_TRUST_ALL is ignored" in daemon.stderr()
    shown = cli(untrusted, "status", cwd=untrusted.root).stdout
    assert "config    ATOMICTOOLS_TRUST_ALL is ignored" in shown, shown
    daemon.stop()
    untrusted.write_config("trust_all = true\n")
    daemon = make_daemon()
    with daemon.client() as client:
        assert client.call("decl").text == "decl\n"
    assert not (untrusted.state_dir / "trust.json").exists(), "trust_all writes nothing to the store"


def test_a_store_others_can_write_trusts_nothing(untrusted: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    untrusted.state_dir.mkdir(parents=True)
    store = untrusted.state_dir / "trust.json"
    store.write_text(json.dumps({"version": 1, "projects": {str(untrusted.project.resolve()): {}}}))
    os.chmod(store, 0o666)
    daemon = make_daemon()
    with daemon.client() as client:
        assert [t["name"] for t in client.list_tools()] == ["everywhere"]
    assert "ignoring the trust store" in daemon.stderr() and "chmod 600" in daemon.stderr()
    refused = cli(untrusted, "trust", "--yes")
    assert refused.returncode == 1 and "can be written by other users" in refused.stderr


def test_trust_all_switched_off_by_sighup_blocks_the_project_again(untrusted: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    untrusted.write_config("trust_all = true\n")
    daemon = make_daemon()
    with daemon.client() as client:
        assert client.call("probe").text == "project code ran"
        untrusted.write_config("trust_all = false\n")
        os.kill(daemon.pid, signal.SIGHUP)
        wait_for(lambda: "probe" not in {t["name"] for t in client.list_tools()}, message="the project to be blocked")
        with pytest.raises(RPCError, match="atomictoolsd trust"):
            client.call("probe")


def test_a_symlinked_home_is_still_the_global_dir_not_a_project(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    real = env.root / "real-home"
    env.home.rename(real)
    env.home.symlink_to(real)
    env.write_tool(env.global_tools, "greet.py", "def greet() -> str:\n    return 'hi'\n")
    env.set_trust_all(False)
    daemon = make_daemon()
    with daemon.client(directory=env.home) as client:
        listing = client.request("atomic/list", {"all": True})
    assert [(t["name"], t["scope"]) for t in listing["tools"]] == [("greet", "global")]
    assert not listing.get("blocked") and not listing.get("shadowed"), listing


def test_initialize_sent_with_the_attach_names_the_trust_command(untrusted: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    """A shim that has just started the daemon writes attach and initialize in one go."""
    daemon = make_daemon()
    with daemon.raw() as raw:
        raw.send_bytes(
            json.dumps({"jsonrpc": "2.0", "id": 1, "method": "atomic/attach", "params": {"directory": str(untrusted.project)}}).encode()
            + b"\n"
            + json.dumps({"jsonrpc": "2.0", "id": 2, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}).encode()
            + b"\n"
        )
        replies = {r["id"]: r for r in (raw.recv() for _ in range(2))}
    assert f"{command_name()} trust --sandbox {untrusted.project.resolve()}" in replies[2]["result"]["instructions"]


def test_untrust_says_what_happened_with_the_builtins_on(untrusted: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    """A project's own built-in dirs are judged again at every trust change and always load: the
    daemon's answer names only the project's own tools, so untrust does not read "loaded"."""
    env = untrusted
    del env.vars["ATOMICTOOLS_BUILTINS"]
    daemon = make_daemon()
    with daemon.client() as client:
        client.list_tools()
        assert cli(env, "trust", "--yes", "--sandbox").returncode == 0
        untrusted_now = cli(env, "untrust")
    assert untrusted_now.returncode == 0, untrusted_now.stderr
    assert untrusted_now.stdout.splitlines()[-1] == (
        "the running daemon withdrew the project's tools (calls in flight finish); attached agents were told"
    )
    assert project_modules(daemon, env) == {"decl.json": ("blocked", None), "probe.py": ("blocked", None)}


def test_trust_asks_for_a_terminal_unless_told_yes(untrusted: Env) -> None:
    """An agent's shell has no terminal: trust refuses there, and says what does work; untrust and
    trust --list only narrow or read, and run anywhere."""
    argv = [sys.executable, "-m", "atomictoolsd", "trust", str(untrusted.project)]
    refused = subprocess.run(argv, env=untrusted.vars, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and refused.stdout == ""
    assert "asks for a terminal" in refused.stderr and "--yes" in refused.stderr, refused.stderr
    assert not (untrusted.state_dir / "trust.json").exists(), "nothing was trusted"
    typed = run_in_terminal(argv, env=untrusted.vars)
    assert typed.returncode == 0 and typed.stdout.startswith("trusted: "), typed.stderr
    untrust = subprocess.run([*argv[:3], "untrust", str(untrusted.project)], env=untrusted.vars,
                             stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert untrust.returncode == 0 and untrust.stdout.startswith("untrusted: ")
    scripted = subprocess.run([*argv[:4], "--yes", str(untrusted.project)], env=untrusted.vars,
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert scripted.returncode == 0 and scripted.stdout.startswith("trusted: "), scripted.stderr


def test_a_global_tool_answering_for_a_blocked_project_tool_says_so(untrusted: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    """After untrust, a call meant for the project's ``greet`` reaches your global ``greet``: its
    error says which tool answered and why, rather than leaving the agent with a schema it never saw."""
    env = untrusted
    env.write_tool(env.global_tools, "greet.py", "def greet(name: str) -> str:\n    return 'global ' + name\n")
    env.write_tool(env.local_tools, "greet.py", "def greet(text: str, loud: bool = False) -> str:\n    return text\n")
    assert cli(env, "trust", "--yes").returncode == 0
    daemon: Daemon = make_daemon()
    with daemon.client() as client:
        assert client.call("greet", text="hi").text == "hi"  # the project's
        assert cli(env, "untrust").returncode == 0
        wait_for(lambda: client.call("greet", name="x").text == "global x", message="the global tool to answer")
        wrong = client.call("greet", text="hi")  # the project's arguments, to the global tool
        assert wrong.is_error
        assert f"this answer came from the global tool 'greet' ({env.global_tools / 'greet.py'})" in wrong.text, wrong.text
        assert f"not from the project's {env.local_tools / 'greet.py'}, which is blocked" in wrong.text
        assert client.call("greet", name="y").text == "global y"  # an answer that is right gets no note
