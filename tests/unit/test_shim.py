"""The shim's pieces that need no daemon: arguments, the attach line, and what it imports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import atomictools
import atomictoolsd
from atomictoolsd.shim.relay import ATTACH_ID, UsageError, attach_line, parse_args


def test_arguments_in_both_spellings_and_repeated() -> None:
    options = parse_args(["-C", "/p", "--allow=a*", "--allow", "b", "--deny", "c", "--dispatcher", "--agent=codex",
                          "--no-autostart"])
    assert options.directory == "/p"
    assert options.allow == ["a*", "b"] and options.deny == ["c"]
    assert options.dispatcher and options.agent == "codex" and not options.autostart
    assert parse_args(["--help"]).help


@pytest.mark.parametrize("args", [["--bogus"], ["--allow"], ["--dispatcher=yes"], ["stray"]])
def test_bad_arguments_are_usage_errors(args: list[str]) -> None:
    with pytest.raises(UsageError):
        parse_args(args)


@given(
    directory=st.text(st.characters(exclude_categories=["Cs"])),
    globs=st.lists(st.text(st.characters(exclude_categories=["Cs"])), max_size=3),
    dispatcher=st.booleans(),
)
def test_the_attach_line_is_one_line_of_exact_json(directory: str, globs: list[str], dispatcher: bool) -> None:
    line = attach_line(directory, "agent\n\"x\"", "s1", globs, globs[::-1], dispatcher)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    message = json.loads(line)
    assert message["id"] == ATTACH_ID and message["method"] == "atomic/attach"
    params = message["params"]
    assert params["directory"] == directory and params["agent"] == "agent\n\"x\""
    assert params["allow"] == globs and params["deny"] == globs[::-1]
    assert params.get("dispatcher", False) is dispatcher
    assert params["lock"] is True


def test_the_bridge_path_imports_only_a_few_standard_modules(tmp_path: Path) -> None:
    """What a bridge script runs (``python -I -S``): the shim and the socket path, nothing else of ours."""
    paths = [str(Path(p.__file__).resolve().parent.parent) for p in (atomictoolsd, atomictools)]
    code = (
        f"import sys; sys.path += {paths!r}; before = set(sys.modules)\n"
        "import atomictoolsd.shim.relay; atomictoolsd.shim.relay._socket_path(('/',))\n"
        "print(' '.join(sorted(set(sys.modules) - before)))\n"
    )
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("XDG_", "ATOMICTOOLS_"))}
    environ["ATOMICTOOLS_SOCKET"] = str(tmp_path / "run" / "daemon.sock")  # baked into every bridge
    loaded = set(subprocess.run([sys.executable, "-IS", "-c", code], capture_output=True, text=True, env=environ,
                                check=True).stdout.split())
    ours = {m for m in loaded if m.split(".")[0] in ("atomictoolsd", "atomictools")}
    assert ours == {"atomictoolsd", "atomictoolsd.shim", "atomictoolsd.shim.relay", "atomictools", "atomictools._paths"}
    others = {m.split(".")[0] for m in loaded - ours}
    assert others <= set(sys.stdlib_module_names), others - set(sys.stdlib_module_names)
    assert not others & {"argparse", "json", "re", "typing", "socket", "subprocess", "threading", "enum"}
