"""Entry points: no process this project starts imports code from the starter's working directory,
from the project, or through a ``PYTHON*`` variable it was handed; only a trusted tool module and
its own helpers are imported from a project.

A hostile repository plants modules named like what our processes import (``uvloop``, ``msgspec``,
``psutil``, ``ssl``, ``json``, ``socket``, ``sitecustomize``, ``usercustomize``, a module that a
``PYTHONWARNINGS`` filter names, a module the probe tool asks for) in its root, which is the agent's
working directory and the project whose tools are served, and in the directories that the agent's
``PYTHONPATH`` and ``PYTHONUSERBASE`` name (with a ``.pth`` file there). Each writes a marker line
when it is imported. Every entry point is started from that directory with that environment and
serves a real tool call through its daemon, fork server and worker; no marker may appear.

The one allowance is the console script (``atomictoolsd``), a command the user, or an agent config
written by an older version, runs: the agent's ``PYTHON*`` variables reach that one process before
any of our code runs, and markers may come from it, never from what it starts (docs/trust.md,
"Entry points").
"""

from __future__ import annotations

import json
import os
import plistlib
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import anyio
import psutil
import pytest
from e2e.test_reload_and_start import detached, lock_pid  # noqa: F401 - detached is a fixture (usefixtures)
from mcp import ClientSession, StdioServerParameters, stdio_client

from atomictools import Client
from atomictools._launch import HARMLESS
from atomictoolsd.config.paths import Paths
from atomictoolsd.service import units
from helpers import Daemon, Env
from shim_helpers import SHIM

PLANTED = (
    "uvloop", "msgspec", "psutil", "ssl", "json", "socket",
    "sitecustomize", "usercustomize", "hostile_warning", "hostile_probe",
)

# A marker line: where the module was planted, its name, the importing process, whether that process
# ran with a safe path (-P), and its argv (which says whose process it was).
PLANTED_SOURCE = """\
import os as _os, sys as _sys
with open({marker!r}, "a") as _f:
    _f.write("%s %s %d %d %r\\n" % ({where!r}, {name!r}, _os.getpid(), _sys.flags.safe_path, _sys.argv))
class HostileWarning(Warning):
    pass
"""
PTH_LINE = (
    "import os, sys; open({marker!r}, 'a').write('%s %s %d %d %r\\n' % "
    "({where!r}, 'pth', os.getpid(), sys.flags.safe_path, sys.argv))\n"
)

PROBE = """\
import importlib
import os

from _probe_helper import HELPER


def probe() -> str:
    try:
        importlib.import_module("hostile_probe")
    except ImportError:
        found = "nothing"
    else:
        found = "hostile_probe"
    return f"{HELPER} imported {found} in {os.getpid()}"
"""
PROBE_ANSWER = re.compile(r"helper-ok imported nothing in (\d+)")


@dataclass
class Marker:
    where: str
    name: str
    pid: int
    safe_path: bool
    argv: str


@dataclass
class Hostile:
    """A hostile repository (the cwd and the project) and the environment an agent passes in."""

    env: Env
    cwd: Path
    vars: dict[str, str]
    marker: Path

    def markers(self) -> list[Marker]:
        try:
            lines = self.marker.read_text().splitlines()
        except FileNotFoundError:
            return []
        found = []
        for line in lines:
            where, name, pid, safe, argv = line.split(" ", 4)
            found.append(Marker(where, name, int(pid), safe == "1", argv))
        return found


def plant(directory: Path, where: str, marker: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name in PLANTED:
        (directory / f"{name}.py").write_text(PLANTED_SOURCE.format(marker=str(marker), where=where, name=name))
    (directory / "hostile.pth").write_text(PTH_LINE.format(marker=str(marker), where=where))


@pytest.fixture
def hostile(env: Env) -> Hostile:
    marker = env.root / "markers"
    plant(env.project, "cwd", marker)
    plant(env.root / "pythonpath", "PYTHONPATH", marker)
    userbase = env.root / "userbase"
    plant(userbase / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages", "PYTHONUSERBASE", marker)
    env.write_tool(env.local_tools, "probe.py", PROBE)
    env.write_tool(env.local_tools, "_probe_helper.py", 'HELPER = "helper-ok"\n')
    variables = {
        **env.vars,
        "PYTHONPATH": os.pathsep.join([str(env.root / "pythonpath"), "."]),
        "PYTHONUSERBASE": str(userbase),
        "PYTHONWARNINGS": "ignore::hostile_warning.HostileWarning",
    }
    return Hostile(env, env.project, variables, marker)


def planted_count(hostile: Hostile) -> int:
    return 3 * (len(PLANTED) + 1)  # in the cwd, on PYTHONPATH, in the PYTHONUSERBASE site dir


def check_probe(text: str) -> int:
    """The probe's answer: its helper loaded, nothing planted did; returns the worker's pid."""
    match = PROBE_ANSWER.fullmatch(text)
    assert match, text
    return int(match.group(1))


async def probe_over_stdio(command: str, args: list[str], hostile: Hostile) -> str:
    """Start ``command`` from the hostile repository as an agent would, and call the probe tool."""
    params = StdioServerParameters(command=command, args=args, env=hostile.vars, cwd=str(hostile.cwd))
    with open(hostile.env.root / "shim.stderr", "a") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                names = [t.name for t in (await session.list_tools()).tools]
                [name] = [n for n in names if n.endswith("probe")]
                result = await session.call_tool(name, {})
                assert not result.is_error, result
                return result.content[0].text


def no_marker_but_from(hostile: Hostile, allowed: Callable[[Marker], bool] = lambda m: False) -> None:
    left = [m for m in hostile.markers() if not allowed(m)]
    assert not left, f"planted code ran: {left}"


# -- what agents run ------------------------------------------------------------------------------


@pytest.mark.usefixtures("detached")
def test_the_command_connect_writes_imports_nothing_planted(hostile: Hostile, record) -> None:  # type: ignore[no-untyped-def]
    done = subprocess.run(
        # The user-wide entry: this machine's interpreter, sealed. A project entry runs the console script
        # from PATH (portable to a teammate's machine), which the next test holds to its documented limit.
        [SHIM, "connect", "claude", "--user", "--dry-run", "--no-dispatcher"],
        env=hostile.env.vars, cwd=hostile.cwd, capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    entry = json.loads(done.stdout)["mcpServers"]["atomic"]
    # The shim starts the daemon (none runs yet), which starts the fork server and the worker.
    text = anyio.run(probe_over_stdio, entry["command"], entry["args"], hostile)
    worker = check_probe(text)
    assert psutil.Process(worker).parent().parent().pid == lock_pid(hostile.env)
    no_marker_but_from(hostile)
    record(f"{planted_count(hostile)} planted modules and .pth files, shim + autostarted daemon + fork server + worker: none imported")


@pytest.mark.usefixtures("detached")
def test_the_console_script_keeps_the_agents_variables_to_itself(hostile: Hostile, record) -> None:  # type: ignore[no-untyped-def]
    text = anyio.run(probe_over_stdio, SHIM, ["mcp"], hostile)
    check_probe(text)
    # The console script's own interpreter honours the agent's PYTHONPATH before our code runs (a
    # documented limit); the cwd never reaches it, and nothing reaches what it starts.
    no_marker_but_from(hostile, lambda m: m.where == "PYTHONPATH" and "'mcp'" in m.argv and not m.safe_path)
    record(f"{planted_count(hostile)} planted modules: none imported by the daemon, fork server or worker")


def test_a_bridge_script_imports_nothing_planted(hostile: Hostile, make_daemon, record) -> None:  # type: ignore[no-untyped-def]
    env = hostile.env
    daemon: Daemon = make_daemon()
    done = subprocess.run([SHIM, "bridge", "create", "--agent", "generic", "--json", "--directory", str(env.project)],
                          env=env.vars, cwd=env.root, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    path = json.loads(done.stdout)["path"]
    worker = check_probe(anyio.run(probe_over_stdio, path, [], hostile))
    assert psutil.Process(worker).parent().parent().pid == daemon.pid
    no_marker_but_from(hostile)
    record(f"{planted_count(hostile)} planted modules: none imported by a bridge script")


# -- what starts a daemon -------------------------------------------------------------------------


@pytest.mark.usefixtures("detached")
def test_atomictoolsd_start_from_a_hostile_repository(hostile: Hostile, record) -> None:  # type: ignore[no-untyped-def]
    # Without the PYTHONPATH: the planted socket.py there would break the console script itself
    # before our first line, which nothing can prevent (the Client's autostart, the same code as
    # start's, is tried with it below).
    variables = {k: v for k, v in hostile.vars.items() if k != "PYTHONPATH"}
    done = subprocess.run([SHIM, "start"], env=variables, cwd=hostile.cwd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    with Client(str(hostile.env.socket), directory=str(hostile.cwd), autostart=False) as client:
        worker = check_probe(client.call("probe").text)
    assert psutil.Process(worker).parent().parent().pid == lock_pid(hostile.env)
    no_marker_but_from(hostile)
    record(f"{planted_count(hostile)} planted modules: none imported by the daemon `start` started")


@pytest.mark.usefixtures("detached")
def test_the_clients_autostart_from_a_hostile_repository(
    hostile: Hostile, monkeypatch: pytest.MonkeyPatch, record  # type: ignore[no-untyped-def]
) -> None:
    monkeypatch.chdir(hostile.cwd)
    for key, value in hostile.vars.items():
        if key.startswith(("PYTHON", "ATOMICTOOLS_")):
            monkeypatch.setenv(key, value)
    with Client(str(hostile.env.socket), directory=str(hostile.cwd)) as client:
        worker = check_probe(client.call("probe").text)
    assert psutil.Process(worker).parent().parent().pid == lock_pid(hostile.env)
    no_marker_but_from(hostile)
    record(f"{planted_count(hostile)} planted modules: none imported by the daemon a Client started")


def service_command(manager: str, env: Env) -> tuple[list[str], dict[str, str]]:
    """The daemon's command line and environment, as ``service install`` renders them."""
    paths = Paths.from_env()
    if manager == "systemd":
        service = units.systemd_files(paths, env.vars)[0].text
        [line] = [line for line in service.splitlines() if line.startswith("ExecStart=")]
        variables = dict(
            shlex.split(line.split("=", 1)[1])[0].split("=", 1)
            for line in service.splitlines() if line.startswith("Environment=")
        )
        return shlex.split(line.split("=", 1)[1]), variables
    plist = plistlib.loads(units.launchd_files(paths, env.vars)[0].text.encode())
    return plist["ProgramArguments"], plist["EnvironmentVariables"]


@pytest.mark.parametrize("manager", ["systemd", "launchd"])
def test_the_service_units_command_from_a_hostile_directory(hostile: Hostile, make_daemon, manager: str, record) -> None:  # type: ignore[no-untyped-def]
    argv, variables = service_command(manager, hostile.env)
    # The worst case: started from the hostile directory, with the agent's variables set around it.
    daemon: Daemon = make_daemon({**hostile.vars, **variables}, command=argv, cwd=hostile.cwd)
    with daemon.client(hostile.cwd) as client:
        worker = check_probe(client.call("probe").text)
    assert psutil.Process(worker).parent().parent().pid == daemon.pid
    daemon.stop()
    no_marker_but_from(hostile)
    record(f"{planted_count(hostile)} planted modules: none imported by the {manager} unit's daemon")


def test_a_daemon_started_without_the_flags_seals_itself_before_it_loads_anything(hostile: Hostile, make_daemon, record) -> None:  # type: ignore[no-untyped-def]
    """A unit written by an older version, or ``python -m atomictoolsd serve`` typed from a repository."""
    daemon: Daemon = make_daemon(hostile.vars, command=[sys.executable, "-m", "atomictoolsd", "serve"], cwd=hostile.cwd)
    with daemon.client(hostile.cwd) as client:
        check_probe(client.call("probe").text)
    process = psutil.Process(daemon.pid)
    assert not [k for k in process.environ() if k.startswith("PYTHON") and k not in HARMLESS]
    assert "-P" in process.cmdline()
    daemon.stop()
    # What the interpreter imported before our first line is beyond reach; the daemon proper (sealed,
    # after it re-executed itself) and what it starts import nothing planted, its event loop included.
    no_marker_but_from(hostile, lambda m: not m.safe_path and m.name not in ("uvloop", "msgspec", "ssl"))
    record("a daemon started the old way re-executed itself sealed: no planted uvloop, msgspec or ssl")


def test_code_found_through_pythonpath_is_the_one_thing_of_it_that_is_kept(hostile: Hostile, make_daemon, tmp_path: Path, record) -> None:  # type: ignore[no-untyped-def]
    """A source checkout on PYTHONPATH (the benchmarks compare two so): the fork server and workers
    run the daemon's own code from there, and nothing else the variable names."""
    from unit.test_defcache_runtime import copy_sources

    client_root, daemon_root = copy_sources(tmp_path / "checkout")
    hostile.env.write_tool(hostile.env.local_tools, "origin.py", (
        "import atomictoolsd\n\n\ndef origin() -> str:\n    return atomictoolsd.__file__\n"
    ))
    hostile.env.write_tool(hostile.env.local_tools, "pythonpath.py", (
        "import os\n\n\ndef pythonpath() -> str:\n    return os.environ['PYTHONPATH']\n"
    ))
    ours = os.pathsep.join([str(client_root), str(daemon_root)])
    variables = {**hostile.vars, "PYTHONPATH": os.pathsep.join([ours, hostile.vars["PYTHONPATH"]])}
    daemon: Daemon = make_daemon(variables, command=[sys.executable, "-m", "atomictoolsd", "serve"], cwd=hostile.cwd)
    with daemon.client(hostile.cwd) as client:
        check_probe(client.call("probe").text)
        assert client.call("origin").text == str(daemon_root / "atomictoolsd" / "__init__.py")
        assert client.call("pythonpath").text == ours, "what a tool's own `python` would inherit"
    for process in [psutil.Process(daemon.pid), *daemon.descendants()]:
        environ = process.environ()  # empty for the fork server forked from the daemon, and its workers: wiped
        assert environ == {} or environ["PYTHONPATH"] == ours, process
    daemon.stop()
    no_marker_but_from(hostile, lambda m: not m.safe_path and m.name not in ("uvloop", "msgspec", "ssl"))
    record("a daemon run from a checkout on PYTHONPATH: its workers run that checkout, nothing planted")
