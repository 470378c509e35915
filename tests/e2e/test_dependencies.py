"""Tools that need more than the standard library: a module that is not installed says where to
install it, ``reload``, an environment that changes under a running module, the packages a module
declares (PEP 723), and the project's own environment — each through a real daemon, real installs
and real virtual environments."""

from __future__ import annotations

import shlex
import subprocess
import sys
import sysconfig
from pathlib import Path

from helpers import Daemon, Env, wait_for


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


# -- reload ------------------------------------------------------------------------------------------


def cli(env: Env, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "atomictoolsd", *args], env=env.vars, cwd=cwd or env.project,
        capture_output=True, text=True, timeout=60,
    )


GREETING = '''
    from pathlib import Path

    WORD = (Path(__file__).parent.parent / "greeting.txt").read_text().strip()

    def greet() -> str:
        return WORD
'''


def test_reload_loads_a_module_again_by_its_name_path_or_tool_and_the_whole_project(env: Env, daemon: Daemon) -> None:
    # What the module reads at import (a file outside its tools dir) changes where no watcher looks.
    (env.project / ".atomic" / "greeting.txt").write_text("hello")
    module = env.write_tool(env.local_tools, "greet.py", GREETING)
    env.write_tool(env.local_tools, "other.py", "def other() -> str:\n    return 'other'\n")
    with daemon.client() as client:
        assert client.call("greet").text == "hello"
        (env.project / ".atomic" / "greeting.txt").write_text("bonjour")
        assert client.call("greet").text == "hello"  # nothing told the daemon
        for which, word in (("greet", "bonjour"), (str(module), "hallo"), ("greet.py", "ciao")):
            (env.project / ".atomic" / "greeting.txt").write_text(word)
            done = cli(env, "reload", which)
            assert done.returncode == 0 and done.stdout.startswith(f"reloaded {which}: 1 tool(s)"), done
            assert client.call("greet").text == word
        (env.project / ".atomic" / "greeting.txt").write_text("hej")
        elsewhere = env.root / "elsewhere"
        elsewhere.mkdir()
        done = cli(env, "reload", "--project", str(env.project), cwd=elsewhere)
        assert done.returncode == 0 and "reloaded the project's tools: 2 tool(s)" in done.stdout, done
        assert client.call("greet").text == "hej"

    unknown = cli(env, "reload", "nothing")
    assert unknown.returncode == 2
    assert "no tool module of" in unknown.stderr and "'nothing'" in unknown.stderr and "greet.py, other.py" in unknown.stderr

    module.write_text("def greet(:\n")
    broken = cli(env, "reload", "greet.py")
    assert broken.returncode == 1 and "greet.py:1: SyntaxError" in broken.stdout, broken


# -- an environment that changes under its modules ----------------------------------------------------


def uv(*args: str, env: Env) -> None:
    """Run the real uv (the test dependency) with the test's own home: its cache is the test's."""
    from uv import find_uv_bin

    subprocess.run([find_uv_bin(), *args], env=env.vars, check=True, capture_output=True, timeout=120)


def daemon_venv(env: Env) -> Path:
    """A virtual environment of the daemon's own (the one a user installs packages into): a venv of
    its own whose site-packages also reads the test environment's (where atomictoolsd is)."""
    venv = env.root / "daemon-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    site = next((venv / "lib").glob("python3*/site-packages"))
    parent = sysconfig.get_paths()["purelib"]
    (site / "_test_parent.pth").write_text(f"import site; site.addsitedir({parent!r})\n")
    return venv


def test_a_package_installed_then_upgraded_in_the_daemons_environment_reloads_its_modules(
    env: Env, make_daemon: object,
) -> None:
    venv = daemon_venv(env)
    python = str(venv / "bin" / "python")
    env.write_tool(env.local_tools, "version.py", '''
        import six

        def version() -> str:
            return six.__version__
    ''')
    env.write_tool(env.local_tools, "plain.py", "def plain() -> str:\n    return 'plain'\n")
    daemon = make_daemon(python=python)  # type: ignore[operator]
    [error] = _errors(daemon)
    # Its own interpreter's pip (through the test environment's site-packages), which installs there.
    assert f"install it there: {python} -m pip install six" in error["message"], error
    with daemon.client() as client:
        client.call("plain")
        plain_worker = [m for m in client.status()["modules"] if m["path"].endswith("plain.py")][0]["worker"]
        uv("pip", "install", "--python", python, "six==1.16.0", env=env)
        wait_for(lambda: not _errors(daemon), timeout=15, message="the module to load once six is installed")
        assert client.call("version").text == "1.16.0"
        uv("pip", "install", "--python", python, "six==1.17.0", env=env)
        wait_for(lambda: client.call("version").text == "1.17.0", timeout=15, message="the upgrade to serve")
        # A module that imports nothing from there kept its worker.
        assert [m for m in client.status()["modules"] if m["path"].endswith("plain.py")][0]["worker"] == plain_worker
