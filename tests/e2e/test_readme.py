"""The README's examples, run as written against a real daemon in a temporary home.

The blocks marked ``<!-- readme-test: NAME -->`` are read from README.md itself, so an edit that
breaks an example breaks this test. Shell lines run through ``bash`` with the venv's bin on ``PATH``
(as the README's one PATH step puts it); a trailing ``# text`` is the output the README promises
(``exit N: text`` an exit code and its stderr; ``…`` ends a prefix).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import Daemon, Env

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()
BIN = str(Path(sys.executable).parent)


def block(name: str) -> str:
    found = re.search(rf"<!-- readme-test: {name} -->\n```\w+\n(.*?)```", README, re.DOTALL)
    assert found, f"README.md has no block marked readme-test: {name}"
    return found.group(1)


def shell(env: Env, line: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", line], env={**env.vars, "PATH": f"{BIN}:/usr/bin:/bin"}, cwd=cwd,
                          capture_output=True, text=True, timeout=60)


def test_the_five_minutes_run_as_written(detached: Env) -> None:
    env = detached
    lines = [line for line in block("five-minutes").splitlines() if line.strip()]
    assert lines[0].startswith("atomictoolsd new ")
    for line in lines:
        command, _, promise = line.partition("  # ")
        done = shell(env, command, cwd=env.root)
        promise = promise.strip()
        code = 0
        if promise.startswith("exit "):
            code_text, _, promise = promise.removeprefix("exit ").partition(": ")
            code = int(code_text)
        assert done.returncode == code, (line, done.stdout, done.stderr)
        if line.startswith("atomictoolsd new"):
            continue  # its promise is where it writes: checked below
        said = done.stderr if code else done.stdout
        expected = promise.split("…")[0]
        if command.split()[1] == "list":
            assert all(word in said for word in expected.split()), (line, said)
        else:
            assert said.startswith(expected) if "…" in promise else expected in said, (line, said)
    assert (env.global_tools / "greet.py").exists()

    python = re.search(r"```python\n(from atomictools import Client.*?)```", README, re.DOTALL)
    assert python
    ran = subprocess.run([sys.executable, "-c", python.group(1)], env=env.vars, cwd=env.root,
                         capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    assert '"name": "greet"' in ran.stdout or "'name': 'greet'" in ran.stdout
    assert "Hi (from " in ran.stdout
    assert shell(env, "atomictoolsd stop", cwd=env.root).returncode == 0


def test_the_lint_example_finds_ruff_in_the_daemons_venv(env: Env, make_daemon: object) -> None:
    if not Path(BIN, "ruff").exists():
        pytest.skip("ruff is not installed in this venv (it comes with the test extras)")
    env.write_tool(env.local_tools, "lint.py", block("lint"))
    (env.project / "bad.py").write_text("import os\n")
    daemon: Daemon = make_daemon({"PATH": "/usr/bin:/bin"})  # type: ignore[operator]  # a fresh machine's PATH
    with daemon.client() as client:
        report = client.call("lint", path="bad.py")
        assert not report.is_error and "F401" in report.text, report.text
        counted = client.call("lint_count", path="bad.py")
        assert not counted.is_error and counted.structured == {"path": "bad.py", "problems": 0}


def test_the_json_tools_example_answers_no_todos_without_an_error(env: Env, make_daemon: object) -> None:
    env.global_tools.mkdir(parents=True)
    (env.global_tools / "ops.json").write_text(block("json-tools"))
    (env.project / "src").mkdir()
    (env.project / "src" / "a.py").write_text("x = 1\n")
    (env.project / "docs").mkdir()
    (env.project / "docs" / "guide.md").write_text("# Guide\n")
    daemon: Daemon = make_daemon()  # type: ignore[operator]
    with daemon.client() as client:
        assert client.request("atomic/list", {})["errors"] == []
        none = client.call("todos", dir="src")
        assert not none.is_error and none.text == ""
        (env.project / "src" / "b.py").write_text("# TODO: this\n")
        assert "b.py:1:# TODO: this" in client.call("todos", dir="src").text
        assert client.call("read-doc", path="guide.md").text.startswith("# Guide")
    assert json.loads(block("json-tools"))["tools"][1]["handler"]["okExitCodes"] == [0, 1]


def test_the_media_example_shows_an_image_and_asks_before_deleting(env: Env, make_daemon: object) -> None:
    env.write_tool(env.global_tools, "plot.py", block("media"))
    png = bytes.fromhex(
        "89504e470d0a1a0a0000000d4948445200000001000000010802000000907753de0000000c4944415408d763f8cfc0"
        "000003010100c9fe92ef0000000049454e44ae426082"
    )
    (env.project / "plots").mkdir()
    (env.project / "plots" / "loss.png").write_bytes(png)
    daemon: Daemon = make_daemon()  # type: ignore[operator]
    with daemon.client(on_elicit=lambda message, schema: None) as client:  # the user declines
        kept = client.call("plot", name="loss")
        assert [b["type"] for b in kept.content] == ["text", "image"] and kept.content[1]["mimeType"] == "image/png"
        assert (env.project / "plots" / "loss.png").exists()
    with daemon.client(on_elicit=lambda message, schema: {}) as client:  # the user accepts
        assert client.call("plot", name="loss").text.endswith("(deleted)")
        assert not (env.project / "plots" / "loss.png").exists()
