"""Tools that need more than the standard library: a module that is not installed says where to
install it, ``reload``, an environment that changes under a running module, the packages a module
declares (PEP 723), and the project's own environment — each through a real daemon, real installs
and real virtual environments."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from helpers import Daemon, Env


def _errors(daemon: Daemon, directory: Path | None = None) -> list[dict]:
    with daemon.client(directory) as client:
        return client.request("atomic/list")["errors"]


# -- a module that is not installed ----------------------------------------------------------------


def test_a_missing_package_names_the_package_the_environment_and_the_command(env: Env, daemon: Daemon) -> None:
    env.write_tool(env.local_tools, "parse.py", '''
        import yaml

        def parse(text: str) -> str:
            return str(yaml.safe_load(text))
    ''')
    env.write_tool(env.local_tools, "late.py", '''
        def late() -> str:
            import yaml
            return "never"
    ''')
    [error] = _errors(daemon)
    message = error["message"]
    assert error["file"].endswith("parse.py") and error["line"] == 2
    assert message.startswith("ModuleNotFoundError: No module named 'yaml': ")
    # The package (not the import name), where the worker ran, and the command that installs it there.
    assert "no package provides `yaml`" in message and f"atomictoolsd's own: {sys.prefix}" in message
    assert f"{shlex.quote(sys.executable)} -m pip install pyyaml" in message
    with daemon.client() as client:
        result = client.call_tool("late", {})
    assert result.is_error and f"{shlex.quote(sys.executable)} -m pip install pyyaml" in result.text


def test_a_missing_submodule_of_an_installed_package_or_a_helper_gets_no_install_advice(env: Env, daemon: Daemon) -> None:
    env.write_tool(env.local_tools, "sub.py", "import msgspec.nothing_here\n\ndef sub() -> str:\n    return ''\n")
    env.write_tool(env.local_tools, "helper.py", "import _absent_helper\n\ndef helper() -> str:\n    return ''\n")
    messages = sorted(e["message"] for e in _errors(daemon))
    assert messages == [
        "ModuleNotFoundError: No module named '_absent_helper'",
        "ModuleNotFoundError: No module named 'msgspec.nothing_here'",
    ]
