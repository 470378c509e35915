"""Security: no way in for another user, and none for the code or the input of a project you have
not trusted.

The e2e tests of each point (tests/e2e/test_lifecycle.py, test_trust.py, test_declarative.py,
test_builtins.py) show the rule; each test here tries what an attacker would try next, and records
how many inputs it tried.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from helpers import Daemon, Env, RawConnection, as_other_user, wait_for

NOBODY = 65534


# -- another user ----------------------------------------------------------------------------------


def knock(path: Path, payload: bytes) -> Callable[[], str]:
    """What the other user tries: connect, send ``payload``, read whatever comes back."""

    def attempt() -> str:
        sock = socket.socket(socket.AF_UNIX)
        sock.settimeout(5)
        try:
            sock.connect(str(path))
        except OSError as exc:
            return f"connect failed: errno {exc.errno}"
        received = b""
        try:
            sock.sendall(payload)
            while chunk := sock.recv(65536):
                received += chunk
        except OSError as exc:
            return f"connected; {len(received)} bytes answered; then errno {exc.errno}"
        finally:
            sock.close()
        return f"connected; {len(received)} bytes answered"

    return attempt


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to another uid needs root")
def test_another_user_gets_nothing_through_any_layer(env: Env, make_daemon, record) -> None:  # type: ignore[no-untyped-def]
    marker = env.root / "ran-for-another-user"
    env.write_tool(env.global_tools, "touch.py", f"def touch() -> str:\n    open({str(marker)!r}, 'w').close()\n    return 'ran'\n")
    daemon: Daemon = make_daemon()
    requests = [
        {"method": "ping"},
        {"method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "x"}}},
        {"method": "tools/list"},
        {"method": "tools/call", "params": {"name": "touch", "arguments": {}}},
        {"method": "atomic/bridges/create", "params": {"agent": "generic", "directory": "/"}},
        {"method": "atomic/shutdown"},
    ]
    payload = b"".join(json.dumps({"jsonrpc": "2.0", "id": i, **r}).encode() + b"\n" for i, r in enumerate(requests))
    other_user = [(NOBODY, NOBODY, []), (NOBODY, 0, [0])]  # also one in root's own group
    outcomes: dict[str, str] = {}
    base_mode = stat.S_IMODE(os.stat(env.runtime_base).st_mode)
    try:
        # Layer 1, as the daemon left things: its runtime dir (0700) keeps others out.
        os.chmod(env.runtime_base, 0o755)
        for uid, gid, groups in other_user:
            outcomes[f"dir 0700, gid {gid}"] = as_other_user(uid, gid, groups, knock(env.socket, payload))
        # Layer 2: someone opened the dir; the socket itself (0600) still refuses.
        os.chmod(env.runtime_dir, 0o755)
        for uid, gid, groups in other_user:
            outcomes[f"socket 0600, gid {gid}"] = as_other_user(uid, gid, groups, knock(env.socket, payload))
        # Layer 3: the socket opened too; the daemon checks the peer's uid and answers nothing.
        os.chmod(env.socket, 0o777)
        for uid, gid, groups in other_user:
            outcomes[f"peer uid, gid {gid}"] = as_other_user(uid, gid, groups, knock(env.socket, payload))
    finally:
        os.chmod(env.socket, 0o600)
        os.chmod(env.runtime_dir, 0o700)
        os.chmod(env.runtime_base, base_mode)
    if any(outcome.startswith("crashed") for outcome in outcomes.values()):
        pytest.skip(f"cannot act as another user here: {outcomes}")
    assert [o for k, o in outcomes.items() if not k.startswith("peer")] == ["connect failed: errno 13"] * 4, outcomes
    for key in ("peer uid, gid 65534", "peer uid, gid 0"):
        # Closed at once: EOF, or a reset/broken pipe if the close came before the write.
        assert outcomes[key].startswith("connected; 0 bytes answered"), outcomes
    assert not marker.exists(), "the tool never ran"
    assert daemon.stderr().count(f"refused a connection from uid {NOBODY}") == 2
    with daemon.client() as client:
        assert client.request("atomic/bridges/list") == {"bridges": []}
        assert client.call("touch").text == "ran", "the daemon serves its own user as before"
    record(
        f"uid {NOBODY} (own group, and root's group) tried {len(requests)} pipelined requests through 3 layers "
        f"({len(outcomes)} attempts): dir 0700 and socket 0600 → EACCES; socket opened to all → connected, "
        f"0 bytes answered, the tool never ran, no bridge made, the daemon kept serving"
    )


def test_under_a_umask_of_000_nothing_the_daemon_makes_is_open_to_others(env: Env, make_daemon, record) -> None:  # type: ignore[no-untyped-def]
    """The socket is 0600 and its dir 0700 whatever the umask; so is everything else the daemon
    creates: what it writes would otherwise be another user's to read or replace (a definitions
    cache they rewrite is tool descriptions your agent reads)."""
    env.write_tool(env.global_tools, "big.py", "def big() -> str:\n    return 'line\\n' * 3000\n")
    old = os.umask(0)
    try:
        daemon: Daemon = make_daemon()
    finally:
        os.umask(old)
    with daemon.client() as client:
        assert client.call("big").meta.get("atomic/fullOutput"), "a spill file was written"
        client.request("atomic/bridges/create", {"agent": "claude"})
        status = client.status()
    assert status["log"]["file"], "the event log is open"
    made = [env.runtime_dir, env.root / "state", env.root / "cache"]  # none existed before the daemon
    paths = {top for top in made}
    for top in made:
        for where, dirs, files in os.walk(top):
            paths.update(Path(where) / name for name in [*dirs, *files])
    checked, open_to_others = len(paths), []
    for path in sorted(paths):
        mode = stat.S_IMODE(os.lstat(path).st_mode)
        if mode & 0o022 or (path.is_dir() and mode & 0o077):
            open_to_others.append(f"{oct(mode)} {path}")
    assert stat.S_IMODE(os.stat(env.socket).st_mode) == 0o600
    assert open_to_others == [], open_to_others
    record(f"umask 000: the socket 0600 and {checked} files and dirs the daemon made (runtime, bridges, state, "
           f"spill, log, cache) checked: none writable by others, no dir they can enter")


# -- an untrusted project --------------------------------------------------------------------------

# Runs the moment it is imported: a marker file per module says whether a project's code ever ran.
PROBE = '''
    import pathlib

    pathlib.Path({marker!r}).write_text("imported")

    def {name}() -> str:
        return "project code ran"
'''


def write_probe(env: Env, tools: Path, name: str) -> Path:
    """A tool module that leaves ``<root>/ran-<name>`` when imported; return that marker's path."""
    marker = env.root / f"ran-{name}"
    env.write_tool(tools, f"{name}.py", PROBE.format(marker=str(marker), name=name))
    return marker


def ran(env: Env) -> list[str]:
    return sorted(p.name for p in env.root.glob("ran-*"))


def cli(env: Env, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "atomictoolsd", *args], env=env.vars, cwd=cwd or env.project,
                          capture_output=True, text=True, timeout=60)


def refused(raw: RawConnection, name: str, arguments: dict[str, Any] | None = None) -> None:
    """Call ``name``; it must be refused as a tool that does not exist (a meta-tool says so in its result)."""
    reply = raw.request("tools/call", {"name": name, "arguments": arguments or {}})
    if name == "atomic_call_tool":
        result = reply["result"]
        assert result["isError"] and result["content"][0]["text"].endswith("does not exist; call atomic_list_tools to see the current tools"), reply
    else:
        assert "error" in reply and reply["error"]["code"] == -32602, reply


@pytest.fixture
def untrusted(env: Env) -> Env:
    env.set_trust_all(False)
    return env


def test_nothing_a_client_does_runs_an_untrusted_projects_code(untrusted: Env, make_daemon, record) -> None:  # type: ignore[no-untyped-def]
    env = untrusted
    write_probe(env, env.local_tools, "probe")
    env.write_tool(env.local_tools, "_helper.py", f"open({str(env.root / 'ran-helper')!r}, 'w').close()\nVALUE = 1\n")
    env.write_tool(env.local_tools, "uses.py", "from _helper import VALUE\n\ndef uses() -> int:\n    return VALUE\n")
    env.write_tool(env.local_tools, "decl.json", json.dumps({"tools": [{
        "name": "decl", "description": "d",
        "handler": {"type": "shell", "command": f"touch {env.root / 'ran-decl'}"},
    }]}))
    daemon: Daemon = make_daemon()
    attempts = 0
    link = env.root / "link-to-project"
    link.symlink_to(env.project)
    (env.project / "sub").mkdir()
    ways_in = [env.project, link, env.project / "sub" / ".." / "sub", env.local_tools]
    with daemon.raw() as raw:
        for directory in ways_in:  # however the project is named, it is the same untrusted project
            raw.request("atomic/attach", {"directory": str(directory), "dispatcher": True})
            for name in ("probe", "uses", "decl"):
                refused(raw, name)
                refused(raw, "atomic_call_tool", {"name": name, "arguments": {}})
                attempts += 2
            listed = raw.request("tools/list")["result"]["tools"]
            assert {t["name"] for t in listed} == {"atomic_list_tools", "atomic_call_tool"}, listed
        raw.request("atomic/attach", {"directory": str(env.project)})
        reloaded = raw.request("atomic/reload")["result"]
        assert reloaded["toolCount"] == 0, reloaded
        refreshed = raw.request("atomic/trust/refresh")["result"]
        assert refreshed == {"changed": []}, "asking again trusts nothing"
        os.kill(daemon.pid, signal.SIGHUP)
        wait_for(lambda: "reloaded on SIGHUP" in daemon.stderr(), message="the SIGHUP rescan")
        attempts += 3
        # Files dropped or edited while the daemon watches the project: still never imported.
        new_marker = write_probe(env, env.local_tools, "dropped")
        write_probe(env, env.local_tools, "probe")  # an edit
        wait_for(lambda: any(b["file"].endswith("dropped.py") for b in raw.request("atomic/list")["result"]["blocked"]),
                 message="the dropped file to be listed as blocked")
        refused(raw, "dropped")
        refused(raw, "probe")
        attempts += 4
        assert not new_marker.exists()
    assert ran(env) == [], f"untrusted code ran: {ran(env)}"
    record(f"{attempts} attempts to run an untrusted project's code (4 names for the project, direct and dispatcher "
           f"calls, reload, trust refresh, SIGHUP, files dropped and edited while watched): none ran")


def test_trust_covers_exactly_the_trusted_root(untrusted: Env, make_daemon, record) -> None:  # type: ignore[no-untyped-def]
    env = untrusted
    write_probe(env, env.local_tools, "parent")
    nested = env.project / "vendor" / "dependency"  # a project inside the trusted one, with tools of its own
    write_probe(env, nested / ".atomic" / "tools", "nested")
    sibling = env.root / "project-evil"  # a name that starts like the trusted one
    write_probe(env, sibling / ".atomic" / "tools", "sibling")
    assert cli(env, "trust", "--yes", str(env.project)).returncode == 0
    daemon: Daemon = make_daemon()
    with daemon.client() as client:
        assert client.call("parent").text == "project code ran", "the trusted project's own tools load"
    with daemon.raw() as raw:
        for directory, name in ((nested, "nested"), (nested / "src", "nested"), (sibling, "sibling")):
            (directory).mkdir(parents=True, exist_ok=True)
            raw.request("atomic/attach", {"directory": str(directory)})
            refused(raw, name)
            refused(raw, "parent")  # and the parent's tools are not the nested project's
    assert ran(env) == ["ran-parent"]

    # Untrusting is remembered: after a restart, with the definitions cached from when the project
    # was trusted, its tools are blocked and an edit made meanwhile is never imported.
    assert cli(env, "untrust", str(env.project)).returncode == 0
    daemon.stop()
    (env.root / "ran-parent").unlink()
    write_probe(env, env.local_tools, "parent")
    daemon = make_daemon()
    with daemon.raw() as raw:
        raw.request("atomic/attach", {"directory": str(env.project)})
        assert raw.request("tools/list")["result"]["tools"] == []
        refused(raw, "parent")
    assert ran(env) == []
    record("6 attempts across trust boundaries (a project nested in a trusted one, a sibling named like it, the "
           "trusted project after untrust and a restart with its definitions cached): no untrusted code ran")


def test_the_builtins_run_nothing_of_an_untrusted_repository(untrusted: Env, make_daemon, record) -> None:  # type: ignore[no-untyped-def]
    """A cloned repository's own git config names programs: hooks, filter drivers, and the same in
    its submodules. The built-in git tools look at any project, trusted or not, so none may run."""
    env = untrusted
    del env.vars["ATOMICTOOLS_BUILTINS"]
    repo = env.project

    def git(*args: str, cwd: Path = repo) -> None:
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "protocol.file.allow=always",
                        *args], cwd=cwd, check=True, capture_output=True, env={**env.vars, "GIT_CONFIG_NOSYSTEM": "1"})

    def trap(name: str) -> str:
        return f"sh -c 'touch {env.root}/ran-{name}; cat'"

    sub = env.root / "submodule-origin"
    sub.mkdir()
    git("init", "-q", cwd=sub)
    (sub / "data.txt").write_text("one\n")
    git("add", "-A", cwd=sub)
    git("commit", "-qm", "sub", cwd=sub)
    git("init", "-q")
    (repo / "tracked.txt").write_text("one\n")
    (repo / "staged.txt").write_text("one\n")
    (repo / ".gitattributes").write_text("* filter=evil\n*.txt filter=odd=name\n")
    git("add", "-A")
    git("submodule", "add", "-q", str(sub), "sub")
    git("commit", "-qm", "first")
    # Changes git has to look at, made before the traps are set: content edits, staged edits, files
    # whose stat changed but not their size, a dirty submodule.
    (repo / "tracked.txt").write_text("one\ntwo\n")
    (repo / "staged.txt").write_text("two\n")
    git("add", "staged.txt")
    os.utime(repo / "sub" / "data.txt", (1, 1))
    os.utime(repo / "staged.txt", (2, 2))
    for key, value in (
        ("filter.evil.clean", trap("clean")), ("filter.evil.smudge", trap("smudge")),
        ("filter.evil.process", trap("process")), ("filter.evil.required", "true"),
        ("filter.odd=name.clean", trap("odd-name")), ("core.fsmonitor", f"{env.root}/fsmonitor-hook"),
        ("diff.external", trap("external-diff")),
    ):
        git("config", key, value)
    hooks = repo / ".git" / "hooks"
    for hook in ("post-index-change", "pre-commit", "post-checkout", "reference-transaction", "fsmonitor-watchman"):
        (hooks / hook).write_text(f"#!/bin/sh\ntouch {env.root}/ran-hook-{hook}\n")
        (hooks / hook).chmod(0o755)
    (env.root / "fsmonitor-hook").write_text(f"#!/bin/sh\ntouch {env.root}/ran-fsmonitor\n")
    (env.root / "fsmonitor-hook").chmod(0o755)
    (repo / ".git" / "modules" / "sub" / "info").mkdir(parents=True, exist_ok=True)
    (repo / ".git" / "modules" / "sub" / "info" / "attributes").write_text("* filter=subevil\n")
    git("config", "filter.subevil.clean", trap("submodule-clean"), cwd=repo / "sub")
    assert ran(env) == [], "setting the trap ran nothing"

    daemon: Daemon = make_daemon()
    calls = [("git-status", {}), ("git-status", {"subdirectory": "sub"}), ("git-diff-summary", {}),
             ("git-diff-summary", {"staged": True}), ("workspace-info", {}), ("file-reader", {"path": "tracked.txt"})]
    with daemon.client() as client:
        answers = {f"{name} {args}": client.call_tool(name, args) for name, args in calls}
    assert ran(env) == [], f"the repository's own programs ran: {ran(env)}"
    status = answers["git-status {}"]
    assert not status.is_error and " M tracked.txt" in status.text and "M  staged.txt" in status.text, status.text
    diff = answers["git-diff-summary {}"]
    assert not diff.is_error and "tracked.txt" in diff.text, diff.text
    assert answers["file-reader {'path': 'tracked.txt'}"].text == "one\ntwo\n"
    record(f"{len(calls)} built-in calls on an untrusted repository with 9 traps set (clean, smudge and process "
           f"filters, a filter named with '=', a submodule's filter, fsmonitor, external diff, 5 hooks): none ran, "
           f"the answers were right")


# -- a file-read tool and its base path ------------------------------------------------------------

SECRET = "TOP SECRET, outside every base"


def escape_attempts(root: Path) -> list[str]:
    """Paths that try to leave a base directory (``docs/`` of a project in ``root``)."""
    secret = root / "secret.txt"
    return [
        # traversal, spelled every way
        "../secret.txt", "../../secret.txt", "guide/../../secret.txt", "./../secret.txt", "guide/./../../secret.txt",
        "guide//..//..//secret.txt", "guide/intro.md/../../../secret.txt", "..", "../", "../..", "../" * 300 + "etc/passwd",
        " ../secret.txt", "..\\secret.txt", "%2e%2e/secret.txt", "..%2fsecret.txt", "\uff0e\uff0e/secret.txt",
        "..\u2215secret.txt", "\u2025/secret.txt", "guide/intro.md\n../../secret.txt",
        # absolute paths, and the kernel's ways round a path check
        str(secret), "/etc/passwd", "//etc/passwd", "/etc/shadow", "/proc/self/root/etc/passwd", "/proc/self/cwd/secret.txt",
        "/proc/self/environ", "/proc/self/fd/0", "/proc/self/fd/3", "/proc/self/mem", "/dev/stdin", "/dev/zero", "/dev/urandom",
        f"/proc/{os.getpid()}/root{secret}", "~/secret.txt", "~root/.bashrc", "$HOME/secret.txt",
        # symlinks planted in the base
        "escape", "escape-absolute", "chain", "outside-dir/secret.txt", "loop", "proc/environ", "proc/root/etc/passwd",
        "parent/secret-in-project.txt", "dangling",
        # sizes and bytes
        "a" * 5000, "guide/" + "x/" * 3000, "guide\x00/../../secret.txt",
    ]


@pytest.fixture
def read_env(env: Env) -> Env:
    """A project with ``docs/`` (the base) full of planted symlinks, and secrets outside it."""
    del env.vars["ATOMICTOOLS_BUILTINS"]
    docs = env.project / "docs"
    (docs / "guide").mkdir(parents=True)
    (docs / "guide" / "intro.md").write_text("the guide\n")
    (env.root / "secret.txt").write_text(SECRET + "\n")
    (env.project / "secret-in-project.txt").write_text("outside docs/, inside the project\n")
    (env.root / "outside").mkdir()
    (env.root / "outside" / "page.txt").write_text(SECRET + " (swapped in)\n")
    (docs / "inside").mkdir()
    (docs / "inside" / "page.txt").write_text("harmless\n")
    (docs / "escape").symlink_to("../../secret.txt")
    (docs / "escape-absolute").symlink_to(env.root / "secret.txt")
    (docs / "chain").symlink_to("chain-2")
    (docs / "chain-2").symlink_to("guide/../chain-3")
    (docs / "chain-3").symlink_to("../../secret.txt")
    (docs / "outside-dir").symlink_to(env.root)
    (docs / "loop").symlink_to("loop")
    (docs / "proc").symlink_to("/proc/self")
    (docs / "parent").symlink_to("..")
    (docs / "dangling").symlink_to(env.root / "not-yet")
    (docs / "flip").symlink_to("inside")
    env.write_tool(env.local_tools, "files.json", json.dumps({"tools": [
        {"name": "doc", "description": "Read a doc", "handler": {"type": "file-read", "basePath": "docs"}},
    ]}))
    return env


# Swaps a symlink between two targets, atomically (by rename), as fast as it can until stdin closes.
FLIPPER = """
import os, sys, threading
link, targets = sys.argv[1], sys.argv[2:]
spare, swaps, done = link + ".next", 0, threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
print("flipping", flush=True)
while not done.is_set():
    os.symlink(targets[swaps % 2], spare)
    os.replace(spare, link)
    swaps += 1
print(swaps)
"""


def test_no_path_leaves_a_file_read_base(read_env: Env, make_daemon, record) -> None:  # type: ignore[no-untyped-def]
    env = read_env
    daemon: Daemon = make_daemon()
    attempts = escape_attempts(env.root)
    tried = raced = 0
    with daemon.client() as client:
        for tool, prefix in (("doc", ""), ("file-reader", "docs/")):  # the JSON handler, and the built-in on the project root
            assert client.call(tool, path=prefix + "guide/intro.md").text == "the guide\n"
            for path in attempts:
                # Relative paths are tried against both bases; the built-in's base is the project,
                # so "parent/…" leads back into it, where reading is allowed.
                for attempt in {path, prefix + path}:
                    result = client.call_tool(tool, {"path": attempt})
                    tried += 1
                    assert SECRET not in result.text and "root:" not in result.text, (tool, attempt, result.text)
                    if tool == "file-reader" and attempt == "docs/parent/secret-in-project.txt":
                        assert result.text == "outside docs/, inside the project\n"  # the built-in's base
                    else:
                        assert result.is_error, (tool, attempt, result.text)

            # Between the check and the open, swap a directory on the path for one outside.
            link = env.project / "docs" / "flip"
            flipper = subprocess.Popen([sys.executable, "-c", FLIPPER, str(link), str(env.root / "outside"), "inside"],
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            assert flipper.stdout is not None and flipper.stdout.readline() == "flipping\n"
            answers: dict[str, int] = {}
            until = time.monotonic() + 1.0
            try:
                while time.monotonic() < until:
                    result = client.call_tool(tool, {"path": prefix + "flip/page.txt"})
                    raced += 1
                    assert SECRET not in result.text, result.text
                    kind = "read" if not result.is_error else "refused after open" if " resolves outside " in result.text else "refused"
                    answers[kind] = answers.get(kind, 0) + 1
            finally:
                swaps = flipper.communicate("", timeout=30)[0].strip()
                link.unlink()
                link.symlink_to("inside")
            assert answers.get("read"), "the race is real: the inside target was read sometimes"
            record(f"{tool}: {swaps} swaps of a directory on the path during {sum(answers.values())} reads: "
                   f"{answers.get('read', 0)} read the inside target, {sum(answers.values()) - answers.get('read', 0)} refused, none outside")
    record(f"{tried} escape attempts against a file-read tool and the file-reader built-in ({len(attempts)} paths: "
           f"traversal, absolute, /proc and /dev, planted symlinks, lookalike characters), and {raced} reads while a "
           f"directory on the path was swapped for one outside: no byte from outside the base")


# -- a shell tool and a second command -------------------------------------------------------------


def injections(marker: Path) -> list[str]:
    """Values that would run ``touch <marker>`` (or write a file) if any shell read them."""
    m = str(marker)
    return [
        f"; touch {m}", f"&& touch {m}", f"|| touch {m}", f"| touch {m}", f"& touch {m} &", f"$(touch {m})", f"`touch {m}`",
        f"\ntouch {m}", f"\r\ntouch {m}", f"x\x0btouch {m}", f"x\u2028touch {m}", f"x\u0085touch {m}", f"' ; touch {m} ; '",
        f'" ; touch {m} ; "', f"\\; touch {m}", f"$(IFS=_;c=touch_{m};$c)", f"${{IFS}}touch${{IFS}}{m}", f"> {m}",
        f">> {m}", f"< /etc/passwd > {m}", f"{{touch,{m}}}", f"$((1+1)); touch {m}", f"!! ; touch {m}", f"#; touch {m}",
        f"-exec touch {m} ;", f"--output={m}", "*", "~", "$HOME", "%s%s%n", "\\n\\x41", f"\x1b]0;x\x07; touch {m}",
        f"a {{b}} c; touch {m}", f"{{{{c}}}}; touch {m}",
    ]


@pytest.fixture
def shell_env(env: Env) -> Env:
    string = {"type": "string"}
    env.write_tool(env.local_tools, "args.json", json.dumps({"tools": [{
        "name": "args", "description": "Print each argument on a line of its own.",
        "inputSchema": {"type": "object", "additionalProperties": False, "properties": {
            "a": string, "b": string, "c": string, "items": {"type": "array", "items": string},
            "obj": {"type": "object"}, "n": {"type": "number"},
        }},
        # Every place a value can go: a word of its own, after text in a word, inside a quoted word,
        # one argument per list item, an object's JSON text.
        "handler": {"type": "shell", "command": "printf '[%s]\\n' {{a}} --opt={{b}} 'pre {{c}} post' {{items}} {{obj}} {{n}}"},
    }]}))
    return env


def test_no_value_runs_a_second_command(shell_env: Env, make_daemon, record) -> None:  # type: ignore[no-untyped-def]
    env = shell_env
    marker = env.root / "injected"
    daemon: Daemon = make_daemon()
    before = sorted(os.listdir(env.project))
    tried = 0
    base = {"a": "A", "b": "B", "c": "C", "items": ["I1", "I2"], "obj": {"k": "v"}, "n": 1}

    def expected(args: dict[str, Any]) -> str:
        words = [args["a"], f"--opt={args['b']}", f"pre {args['c']} post", *args["items"],
                 json.dumps(args["obj"], separators=(",", ":"), ensure_ascii=False), json.dumps(args["n"])]
        return "".join(f"[{w}]\n" for w in words)

    with daemon.client() as client:
        for payload in injections(marker):
            for variant in ({"a": payload}, {"b": payload}, {"c": payload}, {"items": [payload, "I2"]},
                            {"items": ["I1", payload, payload]}, {"obj": {"k": payload, payload: [payload]}}):
                args = {**base, **variant}
                result = client.call_tool("args", args)
                tried += 1
                assert not result.is_error, (args, result.text)
                assert result.text == expected(args), (args, result.text)
    assert not marker.exists(), "no shell ever read a value"
    assert sorted(os.listdir(env.project)) == before, "no value wrote a file"
    record(f"{tried} calls with {len(injections(marker))} injection payloads in 6 placements (own word, after text, "
           f"inside a quoted word, list items, object keys and values): every value stayed one argument, no second command ran")


# -- tool files another user could write -----------------------------------------------------------


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another uid needs root")
def test_no_tool_file_another_user_could_write_is_loaded(env: Env, make_daemon, record) -> None:  # type: ignore[no-untyped-def]
    """A tool module is code the daemon runs as you: if someone else can write it, it is theirs."""
    attempts = {
        "open.py": (env.global_tools, 0o666, None),
        "theirs.py": (env.global_tools, 0o644, NOBODY),
        "opendecl.json": (env.global_tools, 0o666, None),
        "uses_helper.py": (env.global_tools, 0o644, None),  # imports _open_helper.py, which is 0666
        "in_open_dir.py": (env.local_tools, 0o644, None),
    }
    env.write_tool(env.global_tools, "_open_helper.py", f"open({str(env.root / 'ran-helper')!r}, 'w').close()\nX = 1\n")
    os.chmod(env.global_tools / "_open_helper.py", 0o666)
    for name, (where, mode, owner) in attempts.items():
        if name.endswith(".json"):
            path = env.write_tool(where, name, json.dumps({"tools": [{"name": "opendecl", "description": "d", "handler": {
                "type": "shell", "command": f"touch {env.root / 'ran-opendecl'}"}}]}))
        elif name == "uses_helper.py":
            path = env.write_tool(where, name, "from _open_helper import X\n\ndef uses_helper() -> int:\n    return X\n")
        else:
            path = env.write_tool(where, name, PROBE.format(marker=str(env.root / f"ran-{path_stem(name)}"), name=path_stem(name)))
        os.chmod(path, mode)
        if owner is not None:
            os.chown(path, owner, owner)
    os.chmod(env.local_tools, 0o777)
    write_probe(env, env.global_tools, "fine")  # the daemon's own user's file: loads
    daemon: Daemon = make_daemon()
    with daemon.client() as client:
        listing = client.request("atomic/list")
        assert [t["name"] for t in listing["tools"]] == ["fine"]
        errors = {Path(e["file"]).name: e["message"] for e in listing["errors"]}
        for name in attempts:
            assert name in errors and "refused to load" in errors[name], (name, errors)
        assert f"chmod o-w {env.global_tools / 'open.py'}" in errors["open.py"]
        assert "belongs to uid 65534" in errors["theirs.py"]
        assert f"chmod o-w {env.local_tools}" in errors["in_open_dir.py"]
        assert "_open_helper.py" in errors["uses_helper.py"]
    assert ran(env) == ["ran-fine"], f"code others could write ran: {ran(env)}"

    # Put right, they load: the refusal was the permissions, nothing else.
    for name, (where, _mode, _owner) in attempts.items():
        os.chmod(where / name, 0o644)
        os.chown(where / name, 0, 0)
    os.chmod(env.global_tools / "_open_helper.py", 0o644)
    os.chmod(env.local_tools, 0o755)
    with daemon.client() as client:
        reloaded = client.reload()
        assert reloaded["errors"] == [] and reloaded["toolCount"] == 6, reloaded
        assert client.call("open").text == "project code ran"
    record(f"{len(attempts) + 1} tool files another user could have written (others may write the file, its helper "
           f"or its dir; another uid owns it; Python and JSON): none loaded, each refused with the fix; all load once put right")


def path_stem(name: str) -> str:
    return name.rsplit(".", 1)[0]


def test_a_template_cannot_hand_a_value_to_a_shell_as_code(env: Env, make_daemon, record) -> None:  # type: ignore[no-untyped-def]
    """What a tool author tries when they want a pipe: wrap the command in ``sh -c``. Then the value is
    inside a script, and a payload runs. Such templates are refused when the file loads; the safe way
    (the value after the script, as ``$1``) works and stays one argument."""
    marker = env.root / "injected"
    unsafe = {
        "sh_c": "sh -c 'echo {{v}}'", "bash_lc": 'bash -lc "grep {{v}} /dev/null"', "quoted": "sh -c \"echo '{{v}}'\"",
        "env_sh": "env LC_ALL=C sh -c 'echo {{v}}'", "timeout_bash": "timeout 5 bash -c 'echo {{v}}'",
        "abs_dash": "/bin/dash -c 'echo {{v}}'", "python_c": "python3 -c 'print(\"{{v}}\")'",
        "perl_e": "perl -e 'print \"{{v}}\"'",
    }
    safe = "sh -c 'printf \"[%s]\\n\" \"$1\" | cat' sh {{v}}"
    string = {"type": "string"}
    tools = [{"name": name, "description": name, "inputSchema": {"type": "object", "properties": {"v": string}},
              "handler": {"type": "shell", "command": command}} for name, command in {**unsafe, "safe": safe}.items()]
    env.write_tool(env.local_tools, "wrapped.json", json.dumps({"tools": tools}))
    daemon: Daemon = make_daemon()
    payloads = injections(marker)
    calls = 0
    with daemon.client() as client:
        listing = client.request("atomic/list")
        listed = {t["name"] for t in listing["tools"]}
        for name in unsafe:
            if name in listed:  # were it served, this is what the attacker would send it
                for payload in payloads:
                    client.call_tool(name, {"v": payload})
                    calls += 1
        problems = {e.get("tool"): e["message"] for e in listing["errors"]}
        for payload in payloads:
            result = client.call_tool("safe", {"v": payload})
            calls += 1
            assert not result.is_error and result.text == f"[{payload}]\n", (payload, result.text)
    assert not marker.exists(), "a value ran as code"
    assert listed == {"safe"}, listed
    assert set(problems) == set(unsafe), problems
    assert all("inside the code that" in message for message in problems.values()), problems
    record(f"{len(unsafe)} templates that hand a value to a shell or interpreter as code (sh -c, bash -lc, quoted, "
           f"behind env and timeout, python -c, perl -e) refused at load; the safe form took {calls} payloads as one argument each")
