"""``atomictoolsd service install|uninstall|status``, the unit files and the plist (service.units,
service.install, cli.service).

There is no systemd user instance and no launchd here. What runs for real: the files written into a
temporary XDG_CONFIG_HOME/HOME, ``systemd-analyze --user verify`` on them, the dry run, uninstall's
exactness, and the real ``systemctl --user`` failing to reach a manager. Where a test needs the
manager to succeed, a recording stand-in for ``systemctl``/``launchctl`` on PATH says which commands
install and uninstall run, in which order.
"""

from __future__ import annotations

import io
import os
import plistlib
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from atomictoolsd.config.paths import Paths
from atomictoolsd.service.install import install, plan
from atomictoolsd.service.searchpath import service_path
from helpers import Env

PYTHON = os.path.abspath(sys.executable)


def run(env: Env, *args: str, extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "atomictoolsd", *args],
        env={**env.vars, **(extra or {})}, cwd=env.root, capture_output=True, text=True, timeout=60,
    )


def unit_dir(env: Env) -> Path:
    return env.root / "config" / "systemd" / "user"


def snapshot(*roots: Path) -> dict[str, tuple[str, bytes]]:
    """Every file and directory under ``roots``, with file contents."""
    found: dict[str, tuple[str, bytes]] = {}
    for root in roots:
        if not root.exists():
            continue
        for path in [root, *root.rglob("*")]:
            found[str(path)] = ("dir", b"") if path.is_dir() else ("file", path.read_bytes())
    return found


def stand_in(env: Env, name: str, exit_code: int = 0) -> Path:
    """An executable ``name`` on PATH that records its arguments (the real manager does not run here)."""
    bin_dir = env.root / "bin"
    bin_dir.mkdir(exist_ok=True)
    record = env.root / f"{name}.calls"
    script = bin_dir / name
    script.write_text(f'#!/bin/sh\necho "$@" >> {record}\nexit {exit_code}\n')
    script.chmod(0o755)
    return record


def with_path(env: Env) -> dict[str, str]:
    return {"PATH": f"{env.root / 'bin'}:{env.vars.get('PATH', os.defpath)}"}


requires_systemd_analyze = pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")


def verify(env: Env, *files: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["systemd-analyze", "--user", "verify", *map(str, files)],
        env=env.vars, capture_output=True, text=True, timeout=60,
    )


@requires_systemd_analyze
def test_installed_units_pass_systemd_analyze_verify(env: Env) -> None:
    installed = run(env, "service", "install")
    # No user manager here: the files are written, the manager's failure is a message, not a traceback.
    assert installed.returncode == 1, installed.stdout + installed.stderr
    assert "Traceback" not in installed.stdout + installed.stderr
    assert "`systemctl --user daemon-reload` failed: Failed to connect to bus" in installed.stdout
    assert "loginctl enable-linger" in installed.stdout
    service, socket_unit = unit_dir(env) / "atomictoolsd.service", unit_dir(env) / "atomictoolsd.socket"
    assert f"wrote {service}" in installed.stdout and f"wrote {socket_unit}" in installed.stdout
    checked = verify(env, service, socket_unit)
    assert checked.returncode == 0 and checked.stdout + checked.stderr == "", checked.stdout + checked.stderr

    text = service.read_text()
    assert f"ExecStart={PYTHON} -E -P -m atomictoolsd serve" in text
    for line in ("Type=notify", "Restart=on-failure", "KillMode=mixed", "RestartPreventExitStatus=2",
                 "ExecReload=kill -HUP $MAINPID", "WatchdogSec=30", "NoNewPrivileges=yes", "StandardError=journal"):
        assert f"\n{line}\n" in text, line
    assert f'Environment="XDG_STATE_HOME={env.vars["XDG_STATE_HOME"]}"' in text
    sock_text = socket_unit.read_text()
    assert "ListenStream=%t/atomictools/atomictoolsd.sock" in sock_text
    assert "SocketMode=0600" in sock_text and "DirectoryMode=0700" in sock_text
    assert not re.search(r"@[A-Z_]+@", text + sock_text), "every placeholder is filled in"


@requires_systemd_analyze
def test_the_templates_need_the_install_step(env: Env) -> None:
    repo = Path(__file__).resolve().parents[2]
    target = unit_dir(env)
    target.mkdir(parents=True)
    for name in ("atomictoolsd.service", "atomictoolsd.socket"):
        shutil.copy(repo / "systemd" / name, target / name)
    checked = verify(env, target / "atomictoolsd.service")
    assert checked.returncode != 0 and "PYTHON@" in checked.stderr


@requires_systemd_analyze
def test_odd_interpreter_and_socket_paths_are_escaped(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    odd = env.root / "my venv %h" / "bin"
    odd.mkdir(parents=True)
    (odd / "python").symlink_to(PYTHON)
    sock = env.runtime_base / "odd %i dir" / "d.sock"
    monkeypatch.setenv("ATOMICTOOLS_SOCKET", str(sock))
    paths = Paths.from_env()
    the_plan = plan("systemd", paths, os.environ, python=str(odd / "python"))
    assert install(the_plan, paths, io.StringIO(), start=False) == 0
    service = unit_dir(env) / "atomictoolsd.service"
    assert f'ExecStart="{env.root}/my venv %%h/bin/python" -E -P -m atomictoolsd serve' in service.read_text()
    socket_unit = (unit_dir(env) / "atomictoolsd.socket").read_text()
    assert f"ListenStream={env.runtime_base}/odd %%i dir/d.sock" in socket_unit
    assert f'Environment="ATOMICTOOLS_SOCKET={env.runtime_base}/odd %%i dir/d.sock"' in service.read_text()
    checked = verify(env, service, unit_dir(env) / "atomictoolsd.socket")
    assert checked.returncode == 0 and checked.stderr == "", checked.stderr


def test_dry_run_prints_the_files_and_commands_and_writes_nothing(env: Env) -> None:
    before = snapshot(env.root / "config", env.root / "state", env.home)
    result = run(env, "service", "install", "--dry-run")
    assert result.returncode == 0, result.stderr
    assert f"# {unit_dir(env) / 'atomictoolsd.service'}" in result.stdout
    assert f"ExecStart={PYTHON} -E -P -m atomictoolsd serve" in result.stdout
    assert "ListenStream=%t/atomictools/atomictoolsd.sock" in result.stdout
    assert "#   systemctl --user enable --now atomictoolsd.socket atomictoolsd.service" in result.stdout
    assert snapshot(env.root / "config", env.root / "state", env.home) == before


def test_the_plist_parses_and_has_what_launchd_needs(env: Env) -> None:
    result = run(env, "service", "install", "--manager", "launchd", "--dry-run")
    assert result.returncode == 0, result.stderr
    header = f"# {env.home / 'Library' / 'LaunchAgents' / 'org.atomictools.atomictoolsd.plist'}\n"
    assert result.stdout.startswith(header)
    text = result.stdout[len(header):].split("\n# then run:")[0]
    plist = plistlib.loads(text.encode())
    assert plist["Label"] == "org.atomictools.atomictoolsd"
    assert plist["ProgramArguments"] == [PYTHON, "-E", "-P", "-m", "atomictoolsd", "serve"]
    assert os.path.isabs(plist["ProgramArguments"][0])
    assert plist["RunAtLoad"] is True
    assert plist["KeepAlive"] == {"SuccessfulExit": False}, "restart after a failed exit only"
    assert isinstance(plist["ThrottleInterval"], int) and plist["ThrottleInterval"] >= 1
    assert plist["ProcessType"] in ("Standard", "Interactive", "Adaptive", "Background")
    log_dir = env.root / "state" / "atomictools" / "log"
    assert plist["StandardOutPath"] == f"{log_dir}/launchd.stdout.log"
    assert plist["StandardErrorPath"] == f"{log_dir}/launchd.stderr.log"
    listeners = plist["Sockets"]["Listeners"]
    assert listeners["SockPathName"] == str(env.socket) and listeners["SockPathMode"] == 0o600
    assert plist["EnvironmentVariables"]["PATH"] == service_path(env.vars["PATH"])
    assert "launchctl bootstrap gui/" in result.stdout

    repo = Path(__file__).resolve().parents[2]
    template = plistlib.loads((repo / "launchd" / "org.atomictools.atomictoolsd.plist").read_bytes())
    assert set(template) <= set(plist), "the template parses too, and every key survives rendering"


def test_uninstall_removes_exactly_what_install_wrote(env: Env) -> None:
    # Things of the user's own next to ours, which must survive.
    (env.root / "config" / "systemd" / "user").mkdir(parents=True)
    (env.root / "config" / "systemd" / "user" / "mine.service").write_text("[Service]\nExecStart=/bin/true\n")
    (env.root / "config" / "other.toml").write_text("x = 1\n")
    before = snapshot(env.root / "config", env.root / "state", env.home)

    installed = run(env, "service", "install")
    assert installed.returncode == 1  # no user manager here
    assert (unit_dir(env) / "atomictoolsd.service").exists() and (unit_dir(env) / "atomictoolsd.socket").exists()
    assert (env.state_dir / "service.json").exists()
    status = run(env, "service", "status")
    assert status.returncode == 0 and "atomictoolsd.service: installed, up to date" in status.stdout
    assert "daemon: not running" in status.stdout

    dry = run(env, "service", "uninstall", "--dry-run")
    assert f"would remove {unit_dir(env) / 'atomictoolsd.service'}" in dry.stdout
    removed = run(env, "service", "uninstall")
    assert removed.returncode == 0, removed.stdout + removed.stderr
    assert "warning: `systemctl --user disable --now atomictoolsd.service atomictoolsd.socket` failed" in removed.stdout
    assert snapshot(env.root / "config", env.root / "state", env.home) == before
    assert run(env, "service", "status").returncode == 3  # nothing installed, nothing running
    started = run(env, "start")
    try:
        assert started.returncode == 0, started.stderr
        running = run(env, "service", "status")  # a daemon running without the service is running
        assert running.returncode == 0 and "daemon: running" in running.stdout, running.stdout
        assert "atomictoolsd.service: not installed" in running.stdout
    finally:
        run(env, "stop")
    again = run(env, "service", "uninstall")
    assert again.returncode == 0 and "nothing to remove" in again.stdout


def test_uninstall_also_removes_the_directories_install_created(env: Env) -> None:
    before = snapshot(env.root / "config", env.root / "state", env.home)
    assert run(env, "service", "install", "--no-start").returncode == 0
    assert unit_dir(env).is_dir()
    assert run(env, "service", "uninstall").returncode == 0
    assert snapshot(env.root / "config", env.root / "state", env.home) == before


def test_a_unit_edited_after_install_is_kept_unless_forced(env: Env) -> None:
    assert run(env, "service", "install", "--no-start").returncode == 0
    service = unit_dir(env) / "atomictoolsd.service"
    service.write_text(service.read_text() + "# my change\n")
    kept = run(env, "service", "uninstall")
    assert kept.returncode == 1 and f"kept {service}: it changed since install" in kept.stdout
    assert service.exists() and not (unit_dir(env) / "atomictoolsd.socket").exists()
    forced = run(env, "service", "uninstall", "--force")
    assert forced.returncode == 0 and not service.exists()


def test_without_a_manifest_only_files_carrying_our_marker_are_removed(env: Env) -> None:
    assert run(env, "service", "install", "--no-start").returncode == 0
    (env.state_dir / "service.json").unlink()
    socket_unit = unit_dir(env) / "atomictoolsd.socket"
    socket_unit.write_text("[Socket]\nListenStream=/tmp/someone-elses.sock\n")  # not ours any more
    result = run(env, "service", "uninstall")
    assert result.returncode == 0
    assert not (unit_dir(env) / "atomictoolsd.service").exists()
    assert socket_unit.exists()


def test_install_enables_and_starts_then_uninstall_stops_and_disables(env: Env) -> None:
    calls = stand_in(env, "systemctl")
    installed = run(env, "service", "install", extra=with_path(env))
    assert installed.returncode == 0, installed.stdout + installed.stderr
    assert calls.read_text().splitlines() == [
        "--user daemon-reload",
        "--user enable --now atomictoolsd.socket atomictoolsd.service",
    ]
    assert "ran systemctl --user enable --now atomictoolsd.socket atomictoolsd.service" in installed.stdout
    calls.unlink()
    removed = run(env, "service", "uninstall", extra=with_path(env))
    assert removed.returncode == 0
    assert calls.read_text().splitlines() == [
        "--user disable --now atomictoolsd.service atomictoolsd.socket",
        "--user daemon-reload",
    ]


def test_launchd_install_bootstraps_the_agent_in_the_gui_domain(env: Env) -> None:
    calls = stand_in(env, "launchctl")
    plist = env.home / "Library" / "LaunchAgents" / "org.atomictools.atomictoolsd.plist"
    installed = run(env, "service", "install", "--manager", "launchd", extra=with_path(env))
    assert installed.returncode == 0, installed.stdout
    uid = os.getuid()
    assert calls.read_text().splitlines() == [
        f"bootout gui/{uid}/org.atomictools.atomictoolsd",
        f"bootstrap gui/{uid} {plist}",
    ]
    assert plistlib.loads(plist.read_bytes())["ProgramArguments"][0] == PYTHON
    log_dir = env.root / "state" / "atomictools" / "log"
    assert log_dir.is_dir() and env.runtime_dir.is_dir(), "launchd needs them before it starts the job"
    assert stat.S_IMODE(env.runtime_dir.stat().st_mode) == 0o700
    calls.unlink()
    removed = run(env, "service", "uninstall", "--manager", "launchd", extra=with_path(env))
    assert removed.returncode == 0 and not plist.exists()
    assert calls.read_text().splitlines() == [f"bootout gui/{uid}/org.atomictools.atomictoolsd"]


def test_a_missing_manager_command_is_a_message(env: Env) -> None:
    result = run(env, "service", "install", "--manager", "launchd", extra={"PATH": "/nonexistent"})
    assert result.returncode == 1
    assert "`launchctl bootstrap" in result.stdout and "launchctl is not installed here" in result.stdout
    assert "Traceback" not in result.stdout + result.stderr


def test_install_refuses_a_bad_configuration_and_writes_nothing(env: Env) -> None:
    config = env.write_config("memory_limit_mb = -1\n")
    before = snapshot(env.root / "config", env.root / "state", env.home)
    result = run(env, "service", "install")
    assert result.returncode == 2
    assert f"bad configuration: memory_limit_mb (from {config}): must be at least 0" in result.stderr
    assert snapshot(env.root / "config", env.root / "state", env.home) == before


def test_the_installed_path_has_each_directory_once_and_no_version_manager_shims(env: Env) -> None:
    real = os.path.dirname(sys.executable)
    dirty = f"{real}:{env.home}/.pyenv/shims:/usr/bin::{real}/:{env.home}/.asdf/shims:/bin:/usr/bin"
    result = run(env, "service", "install", "--dry-run", extra={"PATH": dirty})
    assert result.returncode == 0, result.stderr
    assert f'Environment="PATH={real}:/usr/bin:/bin"' in result.stdout or f"Environment=PATH={real}:/usr/bin:/bin" in result.stdout, result.stdout
