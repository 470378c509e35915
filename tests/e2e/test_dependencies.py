"""Tools that need more than the standard library: a module that is not installed says where to
install it, ``reload``, an environment that changes under a running module, the packages a module
declares (PEP 723), and the project's own environment — each through a real daemon, real installs
and real virtual environments."""

from __future__ import annotations

import http.server
import os
import shlex
import signal
import subprocess
import sys
import sysconfig
import threading
from pathlib import Path

import pytest

from atomictoolsd.eventlog.reader import read_events
from atomictoolsd.worker import sandbox as sandbox_module
from atomictoolsd.worker.sandbox import REQUIRED_ABI, kernel_abi
from helpers import Daemon, Env, wait_for
from wheelhouse import Index, make_wheel


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
    assert '# /// script / # dependencies = ["pyyaml"] / # ///' in message  # or the line that declares it
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


def test_reload_in_a_project_that_is_not_trusted_says_its_modules_are_blocked_and_how_to_trust_it(
    env: Env, make_daemon: object,
) -> None:
    env.set_trust_all(False)
    module = env.write_tool(env.local_tools, "greet.py", "def greet() -> str:\n    return 'hi'\n")
    make_daemon()  # type: ignore[operator]
    for args, said in ((["greet"], "reloaded greet: 0 tool(s)"), ([], "reloaded the project's tools: 0 tool(s)")):
        done = cli(env, "reload", *args)
        assert done.returncode == 0 and done.stdout.startswith(said), done
        # Not a silent nothing: which modules do not load, and the command that lets them.
        assert f"blocked: 1 tool module(s) of {env.project}, not a trusted project:\n  {module}\n" in done.stdout, done
        assert "trust" in done.stdout.split(str(module), 1)[1], done.stdout


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


# -- declared dependencies (PEP 723) ---------------------------------------------------------------------

SIX_TOOL = '''
# /// script
# dependencies = [{requirements}]
# ///
import six

def {name}() -> str:
    return six.__version__ + " " + six.__file__
'''


def six_tool(env: Env, name: str, *requirements: str) -> Path:
    listed = ", ".join(f'"{r}"' for r in requirements)
    return env.write_tool(env.local_tools, f"{name}.py", SIX_TOOL.format(requirements=listed, name=name))


def tools_of(daemon: Daemon) -> list[str]:
    with daemon.client() as client:
        return sorted(t["name"] for t in client.list_tools())


def test_ten_modules_declaring_the_same_set_share_one_environment_built_once(env: Env, make_daemon: object) -> None:
    # Written three ways, resolving to one set: one environment, installed once, from PyPI with uv.
    names = [f"six{i}" for i in range(10)]
    for name in names[:8]:
        six_tool(env, name, "six==1.16.0")
    six_tool(env, names[8], "six>=1.16,<1.17")
    six_tool(env, names[9], "SIX==1.16.0")
    env.write_tool(env.local_tools, "plain.py", "def plain() -> str:\n    return 'plain'\n")
    daemon = make_daemon()  # type: ignore[operator]
    wait_for(lambda: len(tools_of(daemon)) == 11, timeout=60, message="every module to load")
    with daemon.client() as client:
        answers = {client.call(name).text for name in names}
        environments = client.status()["environments"]
    [answer] = answers
    version, where = answer.split(" ")
    assert version == "1.16.0" and Path(where).parent.parent == env.root / "cache" / "atomictools" / "envs"
    assert environments["built"] == 1 and environments["failed"] == 0 and environments["installing"] == []
    daemon.stop()

    # The next daemon lists from the cache and starts a worker on a call: the environment is there.
    again = make_daemon()  # type: ignore[operator]
    with again.client() as client:
        assert client.call(names[0]).text == answer
        assert client.status()["environments"]["built"] == 0


def test_a_declaration_that_cannot_be_met_is_the_modules_load_error(env: Env, daemon: Daemon) -> None:
    six_tool(env, "nothing", "atomictools-test-no-such-package-zq")
    env.write_tool(env.local_tools, "future.py", '''
        # /// script
        # requires-python = ">=3.99"
        # ///
        def future() -> str:
            return "never"
    ''')
    env.write_tool(env.local_tools, "bare.py", '''
        # /// script
        # requires-python = "3.11"
        # ///
        def bare() -> str:
            return "never"
    ''')
    env.write_tool(env.local_tools, "plain.py", "def plain() -> str:\n    return 'plain'\n")
    errors = {Path(e["file"]).name: e for e in wait_for(lambda: len(_errors(daemon)) == 3 and _errors(daemon), timeout=60)}
    nothing = errors["nothing.py"]
    assert nothing["line"] == 2 and nothing["message"].startswith(
        'cannot install the dependencies it declares (atomictools-test-no-such-package-zq): ')
    # The resolver's own words, naming the package.
    assert "atomictools-test-no-such-package-zq was not found in the package registry" in nothing["message"], nothing
    future = errors["future.py"]
    version = ".".join(map(str, sys.version_info[:3]))
    assert future["line"] == 2 and future["message"] == (
        f"the module requires Python >=3.99 (requires-python), and atomictoolsd runs on Python {version} "
        f"({sys.executable}): run atomictoolsd on a Python that meets it, or change requires-python")
    # One it cannot read says how to write it.
    assert errors["bare.py"]["message"] == (
        "requires-python = '3.11': cannot read '3.11'; write it as version clauses, as uv and pip read it: "
        'requires-python = ">=3.11" (or ">=3.10,<3.14", "==3.12.*")')
    with daemon.client() as client:
        assert client.call("plain").text == "plain"
        assert client.status()["environments"]["failed"] == 1
    # The declaration's fault, so not tried again until it changes; once it does, the module loads.
    six_tool(env, "nothing", "six==1.16.0")
    wait_for(lambda: "nothing" in tools_of(daemon), timeout=60, message="the mended declaration to install")


def test_pip_builds_the_environment_where_uv_is_not_the_installer(env: Env, make_daemon: object) -> None:
    env.write_config('installer = "pip"\n')
    six_tool(env, "six_pip", "six==1.16.0")
    daemon = make_daemon()  # type: ignore[operator]
    wait_for(lambda: tools_of(daemon) == ["six_pip"], timeout=90, message="pip to install six")
    with daemon.client() as client:
        assert client.call("six_pip").text.startswith("1.16.0 ")
    assert '"installer": "pip"' in next((env.root / "cache" / "atomictools" / "envs").glob("*/.atomic-env.json")).read_text()


def test_a_module_is_listed_as_installing_while_others_serve(env: Env, make_daemon: object) -> None:
    make_wheel(env.root, "slowpkg", "1.0", "VALUE = 'from the wheel'\n")
    index = Index(env.root)
    try:
        env.write_config(f'package_index = "{index.url}"\n')
        env.write_tool(env.local_tools, "slow.py", '''
            # /// script
            # dependencies = ["slowpkg"]
            # ///
            import slowpkg

            def slow() -> str:
                return slowpkg.VALUE
        ''')
        env.write_tool(env.local_tools, "plain.py", "def plain() -> str:\n    return 'plain'\n")
        index.hold()
        daemon = make_daemon()  # type: ignore[operator]
        with daemon.client() as client:  # attached: the project's modules load
            assert index.asked.wait(30), "the installer never asked the index"
            [module] = [m for m in client.status()["modules"] if m["path"].endswith("slow.py")]
            assert module["state"] == "installing" and module["installing"]["requirements"] == ["slowpkg"]
            assert module["installing"]["step"] in ("resolving", "installing"), module  # uv reads the wheel to resolve
            [loading] = client.request("atomic/list")["loading"]
            assert loading["file"].endswith("slow.py") and loading["installing"]["requirements"] == ["slowpkg"]
            assert client.call("plain").text == "plain"  # the daemon serves on
            listed = cli(env, "list")
            assert "slow.py: installing its dependencies (slowpkg)" in listed.stdout, listed.stdout
            index.release()
            wait_for(lambda: "slow" in tools_of(daemon), timeout=30, message="the install to finish")
            assert client.call("slow").text == "from the wheel"
        # The log says when it started, with which installer, and when it was ready, after how long.
        events = wait_for(lambda: (found := {e["event"]: e for e in read_events(env.state_dir / "log")
                                             if e["event"].startswith("env.")}).get("env.ready") and found,
                          timeout=10, message="the log's env.ready")  # the log is written in batches
        started, ready = events["env.install"], events["env.ready"]
        assert started["requirements"] == ["slowpkg"] and started["installer"] == "uv", events
        assert ready["packages"] == ["slowpkg==1.0"] and ready["s"] > 0, ready
    finally:
        index.close()


@pytest.mark.parametrize("installer", ["uv", "pip"])
def test_nothing_of_a_repository_or_an_agents_environment_steers_the_installer(
    env: Env, make_daemon: object, installer: str,
) -> None:
    make_wheel(env.root, "steady", "1.0", "WHERE = 'from the index you chose'\n")
    index = Index(env.root)
    try:
        dead = "http://127.0.0.1:9/simple"  # nothing listens there: an installer that reads it fails
        env.write_config(f'package_index = "{index.url}"\ninstaller = "{installer}"\n')
        # The project's files, your own installer configs, and variables an agent's entry can set.
        (env.project / "pyproject.toml").write_text(f'[project]\nname = "app"\n\n[tool.uv]\nindex-url = "{dead}"\n')
        (env.project / "uv.toml").write_text(f'index-url = "{dead}"\n')
        (env.project / "pip.conf").write_text(f"[global]\nindex-url = {dead}\n")
        impossible = env.root / "constraints.txt"  # a version that does not exist: read, it fails the install
        impossible.write_text("steady==99\n")
        (env.home / ".config" / "uv").mkdir(parents=True)
        (env.home / ".config" / "uv" / "uv.toml").write_text('no-index = true\nconstraint-dependencies = ["steady==99"]\n')
        (env.home / ".config" / "pip").mkdir(parents=True)
        (env.home / ".config" / "pip" / "pip.conf").write_text(f"[global]\nno-index = true\nconstraint = {impossible}\n")
        steering = {"UV_INDEX_URL": dead, "UV_DEFAULT_INDEX": dead, "UV_NO_INDEX": "1", "UV_CONSTRAINT": str(impossible),
                    "PIP_INDEX_URL": dead, "PIP_NO_INDEX": "1", "PIP_CONSTRAINT": str(impossible),
                    "PIP_CONFIG_FILE": str(env.project / "pip.conf"),
                    "ATOMICTOOLS_PACKAGE_INDEX": dead}  # the setting is the config file's alone
        env.write_tool(env.local_tools, "steady_tool.py", '''
            # /// script
            # dependencies = ["steady"]
            # ///
            import steady

            def steady_tool() -> str:
                return steady.WHERE
        ''')
        daemon = make_daemon(steering)  # type: ignore[operator]
        wait_for(lambda: tools_of(daemon) == ["steady_tool"] or _errors(daemon), timeout=60, message="the install")
        assert not _errors(daemon), _errors(daemon)
        with daemon.client() as client:
            assert client.call("steady_tool").text == "from the index you chose"
    finally:
        index.close()


def test_an_install_that_outlives_its_timeout_fails_the_module_and_one_under_way_ends_with_the_daemon(
    env: Env, make_daemon: object,
) -> None:
    make_wheel(env.root, "slowpkg", "1.0", "VALUE = 1\n")
    index = Index(env.root)
    try:
        env.write_config(f'package_index = "{index.url}"\ninstall_timeout = 1\n')
        six_tool(env, "slow", "slowpkg")
        index.hold()
        daemon = make_daemon()  # type: ignore[operator]
        [error] = wait_for(lambda: _errors(daemon), timeout=30, message="the timeout")
        assert error["message"].endswith("did not finish within 1 s (install_timeout)"), error
        # Not the module's doing: the next scan tries again (SIGHUP rescans, with no timeout now).
        env.write_config(f'package_index = "{index.url}"\n')
        daemon.proc.send_signal(signal.SIGHUP)  # type: ignore[union-attr]
        installer = wait_for(lambda: [p for p in daemon.descendants() if p.name() == "uv"], timeout=30,
                             message="the installer to run again")
        daemon.stop()  # while it installs: the installer ends with the daemon
        assert not [p for p in installer if p.is_running() and p.status() != "zombie"]
    finally:
        index.close()


# -- the sandbox holds ------------------------------------------------------------------------------------


@pytest.mark.skipif(kernel_abi() < REQUIRED_ABI, reason=f"confining workers needs Landlock ABI {REQUIRED_ABI}")
def test_a_confined_module_reads_its_declared_environment_and_cannot_write_it(env: Env, make_daemon: object) -> None:
    env.set_trust_all(False)
    env.write_tool(env.local_tools, "confined.py", '''
        # /// script
        # dependencies = ["six==1.16.0"]
        # ///
        import os
        import six

        def confined() -> str:
            planted = os.path.join(os.path.dirname(six.__file__), "planted.py")
            try:
                with open(planted, "w") as f:
                    f.write("x = 1\\n")
            except OSError as exc:
                return f"{six.__version__} refused errno {exc.errno}"
            return "written"
    ''')
    assert cli(env, "trust", "--yes", "--sandbox").returncode == 0
    daemon = make_daemon()  # type: ignore[operator]
    wait_for(lambda: tools_of(daemon) == ["confined"], timeout=60, message="the confined module to load")
    with daemon.client() as client:
        assert client.call("confined").text == "1.16.0 refused errno 13"
        [module] = [m for m in client.status()["modules"] if m["path"].endswith("confined.py")]
        assert module["confined"] is True


def test_a_url_or_a_path_declared_as_a_dependency_is_never_fetched_nor_built(env: Env, make_daemon: object) -> None:
    """pip builds a URL's or a path's source tree even with --only-binary (its build backend is the
    repository's code, run by the daemon's installer), and uv fetches a URL for a project whose tools
    have no network: a dependency that is not a package of the index is the module's load error."""
    asked: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            asked.append(self.path)
            self.send_error(404)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/evil-1.0.tar.gz"
        (env.project / "evil").mkdir()
        (env.project / "evil" / "pyproject.toml").write_text('[build-system]\nrequires = []\nbuild-backend = "x"\n')
        for name, dependency in (("fetched", url), ("built", "./evil")):
            env.write_tool(env.local_tools, f"{name}.py", f"""
                # /// script
                # dependencies = ["{dependency}"]
                # ///
                def {name}() -> str:
                    return "never"
            """)
        env.set_trust_all(False)
        assert cli(env, "trust", "--yes", "--sandbox").returncode == 0
        daemon = make_daemon()  # type: ignore[operator]
        errors = {Path(e["file"]).name: e for e in wait_for(lambda: len(_errors(daemon)) == 2 and _errors(daemon), timeout=60)}
        for name, dependency in (("fetched", url), ("built", "./evil")):
            assert errors[f"{name}.py"]["message"].startswith(f"{dependency!r} is not a requirement of a package index"), errors
    finally:
        server.shutdown()
        server.server_close()
    assert asked == [], asked


# -- the project's own environment ----------------------------------------------------------------------

PROJECT_TOOL = '''
import six
from src.math_utils import add
from mylib import greet
from linked_mod import WORD

def project(a: int, b: int) -> str:
    return f"{six.__version__} {add(a, b)} {greet('Ada')} {WORD}"
'''


def project_with_code(env: Env) -> Path:
    """A src/ layout project with a module at its root's ``src/`` too, and a venv made by ``python -m
    venv`` with a package in it (installed for real)."""
    (env.project / "src" / "mylib").mkdir(parents=True)
    (env.project / "src" / "mylib" / "__init__.py").write_text("def greet(name):\n    return f'hello {name}'\n")
    (env.project / "src" / "math_utils.py").write_text("def add(a, b):\n    return a + b\n")
    venv = env.project / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    uv("pip", "install", "--python", str(venv / "bin" / "python"), "six==1.16.0", env=env)
    # A .pth file of its site-packages names another directory of the project, as an editable install's does.
    (env.project / "linked").mkdir()
    (env.project / "linked" / "linked_mod.py").write_text("WORD = 'linked'\n")
    (next(venv.glob("lib/python*/site-packages")) / "_linked.pth").write_text(f"{env.project / 'linked'}\n")
    env.write_tool(env.local_tools, "project.py", PROJECT_TOOL)
    return venv


def test_a_project_environment_chosen_by_trust_brings_its_packages_and_its_own_code(env: Env, daemon: Daemon) -> None:
    venv = project_with_code(env)
    env.write_tool(env.local_tools, "own.py", "from src.math_utils import add\n\ndef own() -> int:\n    return add(1, 1)\n")
    errors = {Path(e["file"]).name: e["message"] for e in _errors(daemon)}
    # A package its environment has, and its own code, are named as such, with the one command that
    # turns its environment on.
    command = f"atomictoolsd trust --python {venv} {env.project}"
    site = next(venv.glob("lib/python*/site-packages"))
    assert f"`six` is installed in the project's environment ({site}), which its tools do not use; turn it on: {command}" \
        in errors["project.py"], errors
    assert f"`src` is the project's own code ({env.project / 'src'})" in errors["own.py"] and command in errors["own.py"]
    listed = cli(env, "list")
    assert "this project has a virtual environment" in listed.stdout and f"trust --python {venv} {env.project}" in listed.stdout
    doctor = cli(env, "doctor")
    assert f"note  project environment: it has {venv}" in doctor.stdout and command in doctor.stdout, doctor.stdout

    done = cli(env, "trust", "--yes", "--python", ".venv")  # from the project's directory
    assert done.returncode == 0 and f"its tools run with the environment {venv}" in done.stdout, done
    assert "the running daemon loaded the project's tools" in done.stdout, done.stdout  # again, with it
    with daemon.client() as client:
        wait_for(lambda: not _errors(daemon), timeout=15, message="the project's tools to load with their environment")
        assert client.call("project", a=2, b=3).text == "1.16.0 5 hello Ada linked"
        assert client.call("own").structured == {"result": 2}
        listing = client.request("atomic/list")
        assert listing["environment"] == {"path": str(venv), "from": "trust", "version": ".".join(map(str, sys.version_info[:3]))}
        # A package upgraded in it under the running module: the module serves the new one.
        uv("pip", "install", "--python", str(venv / "bin" / "python"), "six==1.17.0", env=env)
        wait_for(lambda: client.call("project", a=1, b=1).text == "1.17.0 2 hello Ada linked", timeout=15,
                 message="the upgrade in the project's environment to serve")
    assert f"project environment: {venv}" in cli(env, "list").stdout
    assert f"ok    project environment: {venv}" in cli(env, "doctor").stdout


def test_a_project_venv_named_venv_is_the_one_its_missing_modules_name(env: Env, daemon: Daemon) -> None:
    # `list` offers a project's `venv/` as it does a `.venv/`: a module that needs it says the same command.
    venv = env.project / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    uv("pip", "install", "--python", str(venv / "bin" / "python"), "six==1.16.0", env=env)
    (env.project / "src").mkdir()
    (env.project / "src" / "math_utils.py").write_text("def add(a, b):\n    return a + b\n")
    env.write_tool(env.local_tools, "needs_six.py", "import six\n\ndef needs_six() -> str:\n    return six.__version__\n")
    env.write_tool(env.local_tools, "own.py", "from src.math_utils import add\n\ndef own() -> int:\n    return add(1, 2)\n")
    errors = {Path(e["file"]).name: e["message"] for e in _errors(daemon)}
    command = f"atomictoolsd trust --python {venv} {env.project}"
    assert f"`six` is installed in the project's environment ({next(venv.glob('lib/python*/site-packages'))}), " \
        f"which its tools do not use; turn it on: {command}" in errors["needs_six.py"], errors
    assert errors["own.py"].endswith(f"turn it on: {command}"), errors
    assert f"trust --python {venv} {env.project}" in cli(env, "list").stdout
    assert cli(env, "trust", "--yes", "--python", str(venv)).returncode == 0
    wait_for(lambda: not _errors(daemon), timeout=15, message="the tools to load with the project's venv")
    with daemon.client() as client:
        assert client.call("needs_six").text == "1.16.0" and client.call("own").structured == {"result": 3}


def test_a_missing_package_in_a_declared_or_a_project_environment_says_how_to_add_it_there(
    env: Env, daemon: Daemon,
) -> None:
    venv = project_with_code(env)
    env.write_tool(env.local_tools, "declares.py", '''
        # /// script
        # dependencies = ["six==1.16.0"]
        # ///
        import six
        import yaml

        def declares() -> str:
            return ""
    ''')
    errors = {Path(e["file"]).name: e for e in wait_for(lambda: len(_errors(daemon)) == 2 and _errors(daemon), timeout=60)}
    # A module that declares packages: the line to add the package to (its environment is built for exactly those).
    declared = errors["declares.py"]
    assert declared["line"] == 6 and declared["message"].startswith("ModuleNotFoundError: No module named 'yaml': ")
    assert "in the environment of the dependencies the module declares" in declared["message"]
    assert declared["message"].endswith('(`pyyaml`, usually): dependencies = ["six==1.16.0", "pyyaml"]'), declared
    # A module of a project whose environment is on: the command that installs it there (no pip in it: uv's).
    env.write_tool(env.local_tools, "project.py", "import yaml\n\ndef project() -> str:\n    return ''\n")
    assert cli(env, "trust", "--yes", "--python", ".venv").returncode == 0
    [error] = wait_for(lambda: [e for e in _errors(daemon) if e["file"].endswith("project.py")], timeout=15)
    assert error["message"] == (
        f"ModuleNotFoundError: No module named 'yaml': no package provides `yaml` in the project's environment "
        f"({venv}) nor in atomictoolsd's own; install it in the project's: uv pip install --python "
        f"{venv / 'bin' / 'python'} pyyaml")


def test_project_venv_in_the_config_file_turns_every_trusted_projects_venv_on(env: Env, make_daemon: object) -> None:
    project_with_code(env)
    env.write_config('project_venv = ".venv"\n')
    daemon = make_daemon()  # type: ignore[operator]
    with daemon.client() as client:
        assert client.call("project", a=1, b=2).text == "1.16.0 3 hello Ada linked"
        assert client.request("atomic/list")["environment"]["from"] == "config"


def test_a_project_environment_of_another_python_is_refused_with_the_reason(env: Env, daemon: Daemon) -> None:
    other = "3.12" if sys.version_info[:2] != (3, 12) else "3.11"
    # Beside this interpreter (pyenv's versions/, a prefix's bin/), or on PATH.
    found = [*Path(sys.base_prefix).parent.glob(f"{other}*/bin/python{other}"), Path(sys.base_prefix) / "bin" / f"python{other}",
             *[Path(p) / f"python{other}" for p in os.environ.get("PATH", "").split(os.pathsep) if "shims" not in p]]
    interpreter = next((p for p in found if p.is_file()), None)
    if interpreter is None:
        pytest.skip(f"no Python {other} on this machine")
    venv = env.project / ".venv"
    subprocess.run([_uv_bin(), "venv", "--python", str(interpreter), "--no-python-downloads", "--no-config", str(venv)],
                   env=env.vars, capture_output=True, check=True, timeout=60)
    env.write_tool(env.local_tools, "plain.py", "def plain() -> str:\n    return 'plain'\n")
    done = cli(env, "trust", "--yes", "--python", str(venv))
    mine = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert done.returncode == 0 and "note: its tools will not load:" in done.stdout, done
    [error] = wait_for(lambda: _errors(daemon), timeout=15, message="the refusal")
    assert f"the project's environment {venv} is Python {other}" in error["message"]
    assert f"atomictoolsd runs on Python {mine}" in error["message"] and f"uv venv --python {mine}" in error["message"]
    assert "its tools do not load:" in cli(env, "list").stdout
    # Turned off again (trusted without --python): the tools load in the daemon's environment.
    assert cli(env, "trust", "--yes").returncode == 0
    wait_for(lambda: not _errors(daemon), timeout=15, message="the tools to load without it")


@pytest.mark.skipif(kernel_abi() < REQUIRED_ABI, reason=f"confining workers needs Landlock ABI {REQUIRED_ABI}")
def test_the_environment_command_offered_to_a_confined_project_keeps_it_confined(env: Env, make_daemon: object) -> None:
    project_with_code(env)
    env.set_trust_all(False)
    assert cli(env, "trust", "--yes", "--sandbox", "--allow-net", "example.com").returncode == 0
    daemon = make_daemon()  # type: ignore[operator]
    [error] = _errors(daemon)
    offered = error["message"].split("turn it on: atomictoolsd ", 1)[1].split()
    assert offered[:2] == ["trust", "--python"], offered  # the same command list and doctor offer
    done = cli(env, offered[0], "--yes", *offered[1:])
    # Choosing its environment does not run its tools with all your rights, nor drop what its sandbox allows.
    assert done.returncode == 0 and "note: it stays confined, as it was trusted (--sandbox)" in done.stdout, done
    listed = cli(env, "list").stdout
    assert "its own tools run confined (trust --sandbox)" in listed and "example.com" in listed, listed
    with daemon.client() as client:
        wait_for(lambda: not _errors(daemon), timeout=15, message="the confined tools to load with the environment")
        assert client.call("project", a=1, b=1).text == "1.16.0 2 hello Ada linked"
        [module] = [m for m in client.status()["modules"] if m["path"].endswith("project.py")]
        assert module["confined"] is True


def _uv_bin() -> str:
    from uv import find_uv_bin

    return find_uv_bin()


PEEK = """
def peek(path: str) -> str:
    try:
        return open(path).read()
    except OSError as exc:
        return f"refused errno {exc.errno}"
"""


@pytest.mark.skipif(kernel_abi() < REQUIRED_ABI, reason=f"confining workers needs Landlock ABI {REQUIRED_ABI}")
@pytest.mark.parametrize("link", ["src", "site-packages"])
def test_a_confined_projects_links_out_of_itself_open_nothing(env: Env, make_daemon: object, link: str) -> None:
    """Its environment's directories (its src/, its .venv's site-packages) are made readable to a
    confined worker. The repository holds them: one that is a link to a directory outside the
    project (home, /) must not open that directory."""
    (env.home / "secret.txt").write_text("the user's secret")
    env.write_tool(env.local_tools, "peek.py", PEEK)
    env.set_trust_all(False)
    if link == "src":  # the user's own venv chosen with --python; the repository links its src/ out
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env.project / ".venv")], check=True, timeout=60)
        os.symlink(env.home, env.project / "src")
        assert cli(env, "trust", "--yes", "--sandbox", "--python", ".venv").returncode == 0
    else:  # the repository ships a .venv whose site-packages is a link out, and project_venv takes it
        version = ".".join(map(str, sys.version_info[:3]))
        site = env.project / ".venv" / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
        site.mkdir(parents=True)
        (env.project / ".venv" / "pyvenv.cfg").write_text(f"home = {Path(sys.executable).parent}\nversion = {version}\n")
        os.symlink(env.home, site / "site-packages")
        env.write_config('project_venv = ".venv"\n')
        assert cli(env, "trust", "--yes", "--sandbox").returncode == 0
    daemon = make_daemon()  # type: ignore[operator]
    with daemon.client() as client:
        assert client.call("peek", path=str(env.home / "secret.txt")).text == "refused errno 13"
        assert client.call("peek", path=str(env.local_tools / "peek.py")).text.lstrip().startswith("def peek")


@pytest.mark.skipif(kernel_abi() < REQUIRED_ABI, reason=f"confining workers needs Landlock ABI {REQUIRED_ABI}")
def test_a_confined_project_reads_its_environment_and_own_code(env: Env, make_daemon: object) -> None:
    venv = project_with_code(env)
    env.set_trust_all(False)
    assert cli(env, "trust", "--yes", "--sandbox", "--python", ".venv").returncode == 0
    daemon = make_daemon()  # type: ignore[operator]
    with daemon.client() as client:
        assert client.call("project", a=2, b=2).text == "1.16.0 4 hello Ada linked"
        # A package upgraded under the confined module: its worker reported what it imported, as any does.
        uv("pip", "install", "--python", str(venv / "bin" / "python"), "six==1.17.0", env=env)
        wait_for(lambda: client.call("project", a=1, b=1).text == "1.17.0 2 hello Ada linked", timeout=15,
                 message="the upgrade in the confined project's environment to serve")
    if not hasattr(sandbox_module, "PROTECTED"):
        return  # this sandbox keeps no entry of a writable tree read-only: the .venv in it is written as the tree is
    env.write_tool(env.local_tools, "plant.py", f'''
        def plant() -> str:
            try:
                open({str(next(venv.glob("lib/python*/site-packages"))) + "/planted.py"!r}, "w").close()
            except OSError as exc:
                return f"refused errno {{exc.errno}}"
            return "written"
    ''')
    with daemon.client() as client:
        wait_for(lambda: "plant" in [t["name"] for t in client.list_tools()], timeout=15)
        assert client.call("plant").text == "refused errno 13"
