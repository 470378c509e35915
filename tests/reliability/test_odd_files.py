"""One odd entry in a tools directory never stops the service.

Names that are not UTF-8, that hold a newline or a control character, that are as long as the file
system allows; a directory named like a module, a dangling symlink, a symlink loop, a FIFO; a tools
directory that is a symlink loop, a file, or a link to nothing: each is put in a project's tools dir
(trusted and not) or in the global one of a real daemon. Every client must still initialize, list,
call the built-ins and the good tool beside the odd entry, and ask for status; the CLI's ``status``
prints without a traceback and ``stop`` stops the daemon; and the odd entry is reported, its name
escaped (valid UTF-8, on one line), with the reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from helpers import Env, RawConnection, wait_for

GOOD = """\
def {name}() -> str:
    return "{name} ok"
"""

# (raw name, how it is made, the escaped name the daemon reports, a word of the reason)
_ENTRIES: list[tuple[bytes, str, str, str]] = [
    (b"bad\xff.py", "file", "bad\\xff.py", "UTF-8"),
    (b"\xfe" * 252 + b".py", "file", "\\xfe" * 252 + ".py", "UTF-8"),
    (b"new\nline.py", "file", "new\\nline.py", "control character"),
    (b"esc\x1b[31m.py", "file", "esc\\x1b[31m.py", "control character"),
    ("rtl\u202eyp.py".encode(), "file", "rtl\\u202eyp.py", "control character"),
    (b"l" * 252 + b".py", "file", "l" * 252 + ".py", "function named"),  # loads: no special case
    (b"pkg.py", "dir", "pkg.py", "directory"),
    (b"gone.py", "dangling", "gone.py", "symbolic link to nothing"),
    (b"loop.py", "loop", "loop.py", "symbolic link loop"),
    (b"pipe.py", "fifo", "pipe.py", "not a regular file"),
]


def _make(directory: Path, raw: bytes, how: str) -> None:
    path = os.fsencode(directory) + b"/" + raw
    if how == "file":
        with open(path, "w") as f:
            f.write(GOOD.format(name="odd"))
    elif how == "dir":
        os.mkdir(path)
        with open(path + b"/__init__.py", "w") as f:
            f.write(GOOD.format(name="odd"))
    elif how == "dangling":
        os.symlink(b"no-such-file.py", path)
    elif how == "loop":
        os.symlink(raw, path)
    elif how == "fifo":
        os.mkfifo(path)


def _helpers(directory: Path) -> None:
    """Helper packages no module imports, as odd as the module names: never reported, never a fault."""
    base = os.fsencode(directory)
    os.symlink(b"_lib", base + b"/_lib")  # a package that is a symlink loop
    os.mkdir(base + b"/_h\xff")  # a package whose name is not UTF-8
    with open(base + b"/_h\xff/x\nq.py", "w") as f:
        f.write("X = 1\n")
    os.symlink(b"..", base + b"/_up")  # a package that leads back up


def _exercise(env: Env, daemon: Any, good: str, expect: list[tuple[str, str]]) -> int:
    """Everything a client and the CLI do, with the odd entries in place; returns the checks made.

    ``expect``: (escaped file name, a word of its reason) the daemon must report.
    """
    checks = 0
    with RawConnection(env.socket) as raw:
        init = raw.request(
            "initialize",
            {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "odd", "version": "1"}},
        )
        assert "result" in init, init
        attach = raw.request("atomic/attach", {"directory": str(env.project)})
        assert "result" in attach, attach
        listed = raw.request("tools/list")
        assert "result" in listed, listed
        names = {t["name"] for t in listed["result"]["tools"]}
        assert {"workspace-info", "file-reader"} <= names, names
        if good:
            assert good in names, names
            called = raw.request("tools/call", {"name": good, "arguments": {}})
            assert called["result"]["content"][0]["text"] == f"{good} ok", called
        builtin = raw.request("tools/call", {"name": "workspace-info", "arguments": {}})
        assert "result" in builtin and not builtin["result"].get("isError"), builtin
        status = raw.request("atomic/status")
        assert "result" in status, status
        atomic_list = raw.request("atomic/list")
        assert "result" in atomic_list, atomic_list
        checks += 7
        status_text = json.dumps(status["result"])
        for name, reason in expect:
            for reported in (attach["result"]["errors"], atomic_list["result"]["errors"]):
                hits = [e for e in reported if e["file"].endswith("/" + name)]
                assert hits, f"{name!r} not reported: {reported}"
                assert all(reason in e["message"] for e in hits), [e["message"][-300:] for e in hits]
            assert json.dumps(name)[1:-1] in status_text, f"{name!r} not in status"
            checks += 3
    cli_env = {**env.vars, **daemon.extra_env}
    shown = subprocess.run(
        [sys.executable, "-m", "atomictoolsd", "status"], env=cli_env, cwd=env.project, capture_output=True, timeout=60
    )
    out, err = shown.stdout.decode("utf-8"), shown.stderr.decode("utf-8")  # strict: never surrogates
    assert shown.returncode == 0 and "Traceback" not in err, (shown.returncode, out, err)
    assert "\x1b" not in out and "\u202e" not in out
    for name, _reason in expect:
        assert name in out, f"{name!r} not in `atomictoolsd status`:\n{out}"
    stopped = subprocess.run(
        [sys.executable, "-m", "atomictoolsd", "stop"],
        env=cli_env,
        cwd=env.project,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert stopped.returncode == 0 and "stopped" in stopped.stdout, (stopped.stdout, stopped.stderr)
    assert daemon.proc.wait(20) == 0
    checks += 3
    return checks


@pytest.fixture
def odd_env(env: Env) -> Env:
    env.vars["ATOMICTOOLS_BUILTINS"] = "1"
    return env


@pytest.mark.parametrize("where", ["local", "untrusted", "global", "local, polling"])
def test_odd_entries_in_a_tools_dir_are_skipped_and_reported(odd_env: Env, make_daemon, record, where: str) -> None:  # type: ignore[no-untyped-def]
    env = odd_env
    if where == "untrusted":
        env.set_trust_all(False)
    directory = env.global_tools if where == "global" else env.local_tools
    directory.mkdir(parents=True)
    env.write_tool(directory, "good.py", GOOD.format(name="good"))
    if where != "global":
        env.write_tool(env.global_tools, "gl.py", GOOD.format(name="gl"))
    for raw, how, _escaped, _reason in _ENTRIES:
        _make(directory, raw, how)
    _helpers(directory)
    daemon = make_daemon({"WATCHFILES_FORCE_POLLING": "1"} if "polling" in where else None)
    # One more odd file while the daemon watches: the watcher skips it as discovery does.
    with RawConnection(env.socket) as raw:
        raw.request("atomic/attach", {"directory": str(env.project)})
        with open(os.fsencode(directory) + b"/late\xfe\n.py", "w") as f:
            f.write(GOOD.format(name="late"))

        def late_reported() -> bool:
            reply = raw.request("atomic/list")
            return any(e["file"].endswith("/late\\xfe\\n.py") for e in reply["result"]["errors"])

        wait_for(late_reported, timeout=15, message="the late odd file to be reported")
    expect = [
        (escaped, reason)
        for _raw, _how, escaped, reason in _ENTRIES
        if where != "untrusted" or reason != "function named"
    ]
    good = "gl" if where == "untrusted" else "good"
    checks = _exercise(env, daemon, good, expect)
    assert "Traceback" not in daemon.stderr(), daemon.stderr()
    record(f"{len(_ENTRIES) + 1} odd entries and 3 odd helper packages in the {where} tools dir: {checks} checks held")


def _self_loop(path: Path) -> None:
    os.symlink(path.name, path)


def _home_not_utf8(env: Env) -> None:
    home = Path(os.fsdecode(os.fsencode(env.root) + b"/h\xffome"))
    env.write_tool(home / ".atomic" / "tools", "never.py", GOOD.format(name="never"))
    env.vars["HOME"] = str(home)


_DIR_CASES = {
    # name: (which dir holds the good tool, how the odd one is made, the path reported, a word of the reason)
    "local tools dir links to itself": (
        "global",
        lambda e: _self_loop(e.local_tools),
        ".atomic/tools",
        "symbolic link loop",
    ),
    ".atomic links to itself": (
        "global",
        lambda e: (os.rmdir(e.project / ".atomic"), _self_loop(e.project / ".atomic")),
        ".atomic/tools",
        "symbolic link loop",
    ),
    "~/.atomic links to itself": (
        "local",
        lambda e: _self_loop(e.home / ".atomic"),
        ".atomic/tools",
        "symbolic link loop",
    ),
    "~/.atomic/tools links to itself": (
        "local",
        lambda e: ((e.home / ".atomic").mkdir(), _self_loop(e.global_tools)),
        ".atomic/tools",
        "symbolic link loop",
    ),
    "local tools dir is a file": (
        "global",
        lambda e: e.local_tools.write_text("x"),
        ".atomic/tools",
        "not a directory",
    ),
    "global tools dir is a file": (
        "local",
        lambda e: ((e.home / ".atomic").mkdir(), e.global_tools.write_text("x")),
        ".atomic/tools",
        "not a directory",
    ),
    "local tools dir links to nothing": (
        "global",
        lambda e: os.symlink("gone", e.local_tools),
        ".atomic/tools",
        "symbolic link to nothing",
    ),
    "the home dir's name is not UTF-8": ("local", _home_not_utf8, "h\\xffome/.atomic/tools", "not valid UTF-8"),
}


@pytest.mark.parametrize("case", list(_DIR_CASES))
def test_a_tools_dir_that_cannot_be_listed_is_no_tools_and_reported(
    odd_env: Env, make_daemon, record, case: str
) -> None:  # type: ignore[no-untyped-def]
    env = odd_env
    good_in, make, reported, reason = _DIR_CASES[case]
    good_dir = env.global_tools if good_in == "global" else env.local_tools
    env.write_tool(good_dir, "good.py", GOOD.format(name="good"))
    make(env)
    daemon = make_daemon()
    checks = _exercise(env, daemon, "good", [(reported, reason)])
    assert "Traceback" not in daemon.stderr(), daemon.stderr()
    record(f"{case}: {checks} checks held")


def test_a_tools_dir_put_right_is_seen_without_a_restart(odd_env: Env, make_daemon, record) -> None:  # type: ignore[no-untyped-def]
    """The watcher watches the nearest dir it can list in place of a loop: replacing the loop with a
    directory loads its tools, and the report goes."""
    env = odd_env
    _self_loop(env.local_tools)
    make_daemon()
    with RawConnection(env.socket) as raw:
        attach = raw.request("atomic/attach", {"directory": str(env.project)})
        assert [e["file"] for e in attach["result"]["errors"]] == [str(env.local_tools)], attach
        env.local_tools.unlink()
        env.write_tool(env.local_tools, "good.py", GOOD.format(name="good"))

        def served() -> bool:
            names = {t["name"] for t in raw.request("tools/list")["result"]["tools"]}
            return "good" in names and not raw.request("atomic/list")["result"]["errors"]

        wait_for(served, timeout=15, message="the tools dir put right to be served")
        called = raw.request("tools/call", {"name": "good", "arguments": {}})
        assert called["result"]["content"][0]["text"] == "good ok", called
    record("a tools dir that was a symlink loop, put right while watched: its tool served, the report gone")
