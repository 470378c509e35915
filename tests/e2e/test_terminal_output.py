"""What the CLI prints reaches a terminal, and a repository chooses the names in it: a project whose
path holds escape sequences is shown escaped by list, status, doctor and trust, and the command they
suggest still trusts that very directory when pasted into a shell."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from helpers import Env, run_in_terminal

# Clears the screen, sets the window title, rings the bell, and hides text (U+202E reverses it).
NAME = "app\x1b[2J\x1b]0;owned\x07\u202eevil"
RAW = ("\x1b", "\x07", "\u202e")


def cli(env: Env, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "atomictoolsd", *args], env=env.vars, cwd=cwd or env.root,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)


def shown(done: subprocess.CompletedProcess[str]) -> str:
    out = done.stdout + done.stderr
    assert not [c for c in RAW if c in out], f"printed raw: {out!r}"
    return out


def test_a_project_path_with_escape_sequences_is_printed_escaped_and_its_command_still_runs(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    env.set_trust_all(False)
    project = env.root / NAME
    env.write_tool(project / ".atomic" / "tools", "probe.py", "def probe() -> str:\n    return 'ran'\n")
    escaped = "app\\x1b[2J\\x1b]0;owned\\x07\\u202eevil"
    make_daemon()

    listing = shown(cli(env, "list", "-C", str(project)))
    assert f"blocked: 1 tool module(s) of {env.root}/{escaped}, not a trusted project" in listing, listing
    command = listing.split("or, with all your rights: ", 1)[1].splitlines()[0]
    assert command.endswith(f"trust $'{env.root}/{escaped}'"), command
    status = shown(cli(env, "status", cwd=project))
    assert escaped in status, status
    assert shown(cli(env, "connect", "claude", "-C", str(project))).count(escaped) >= 2
    assert escaped in shown(cli(env, "doctor", "claude", "-C", str(project)))
    refused = cli(env, "trust", str(project))  # no terminal: refused, and the path is still escaped
    assert refused.returncode == 2 and "--yes" in shown(refused)

    trusted = run_in_terminal(["bash", "-c", command], env=env.vars)  # the suggested command, pasted
    assert trusted.returncode == 0, trusted.stderr
    assert trusted.stdout.startswith(f"trusted: {env.root}/{escaped} ("), shown(trusted)
    assert json.loads(cli(env, "trust", "--list", "--json").stdout)[0]["root"] == str(project), "that very directory"
    assert escaped in shown(cli(env, "trust", "--list"))
    assert "probe" in shown(cli(env, "list", "-C", str(project)))
    assert shown(cli(env, "untrust", str(project))).startswith(f"untrusted: {env.root}/{escaped} (")
