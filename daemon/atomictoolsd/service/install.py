"""``atomictoolsd service install|uninstall|status``: hand the daemon to the user's service manager.

Install writes the unit files (systemd) or the agent plist (launchd) for this installation, records
what it wrote in a manifest (``service.json`` in the state dir: each file with its checksum, and each
directory it had to create), then asks the manager to load, enable and start them. Uninstall asks
the manager to stop and forget them, then removes exactly what the manifest lists: files still as
install wrote them (an edited one is kept, and said so) and the directories install created, if
they are empty. A manager that cannot be reached (no systemd user instance, no launchctl) is a clear
message with the commands to run later, never a traceback; the files stay in place.

Every outcome is said on ``out``: what was written, what was run, what failed and what to do.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from atomictoolsd import __version__
from atomictoolsd.config.command import command_name
from atomictoolsd.config.paths import Paths, make_private_dirs
from atomictoolsd.config.statefile import write_atomic
from atomictoolsd.service.manager import LAUNCHD_LABEL
from atomictoolsd.service.units import (
    SERVICE_NAME,
    SOCKET_NAME,
    UnitFile,
    launchd_files,
    systemd_files,
)

__all__ = ["MANIFEST_NAME", "Plan", "default_manager", "install", "plan", "status", "uninstall"]

MANIFEST_NAME = "service.json"
MARKER = "Written by `atomictoolsd service install`; `atomictoolsd service uninstall` removes it."

Runner = Callable[[list[str]], "subprocess.CompletedProcess[str]"]


@dataclass
class Plan:
    """What install writes and runs, and what uninstall runs, for one service manager."""

    manager: str
    files: list[UnitFile]
    prepare: list[list[str]] = field(default_factory=list)  # before starting: the manager works, old job gone
    start: list[list[str]] = field(default_factory=list)  # enable and start
    stop: list[list[str]] = field(default_factory=list)  # uninstall: stop and disable
    after_remove: list[list[str]] = field(default_factory=list)  # uninstall: once the files are gone
    make_dirs: list[Path] = field(default_factory=list)  # directories the service needs to exist


def default_manager() -> str:
    return "launchd" if sys.platform == "darwin" else "systemd"


def plan(manager: str, paths: Paths, environ: Mapping[str, str], python: str = sys.executable) -> Plan:
    """The files and commands for ``manager`` (``systemd`` or ``launchd``) on this installation."""
    if manager == "systemd":
        units = [SOCKET_NAME, SERVICE_NAME]
        return Plan(
            manager="systemd",
            files=[_marked(f, "#") for f in systemd_files(paths, environ, python)],
            prepare=[["systemctl", "--user", "daemon-reload"]],
            start=[["systemctl", "--user", "enable", "--now", *units]],
            stop=[["systemctl", "--user", "disable", "--now", SERVICE_NAME, SOCKET_NAME]],
            after_remove=[["systemctl", "--user", "daemon-reload"]],
        )
    if manager == "launchd":
        domain = f"gui/{os.getuid()}"
        files = [_marked(f, "<!--") for f in launchd_files(paths, environ, python)]
        return Plan(
            manager="launchd",
            files=files,
            prepare=[["launchctl", "bootout", f"{domain}/{LAUNCHD_LABEL}"]],  # an older copy, if loaded
            start=[["launchctl", "bootstrap", domain, str(files[0].path)]],
            stop=[["launchctl", "bootout", f"{domain}/{LAUNCHD_LABEL}"]],
            # launchd opens the log files and binds the socket itself: their directories must exist.
            make_dirs=[paths.log_dir, paths.runtime_dir],
        )
    raise ValueError(f"unknown service manager {manager!r}: use systemd or launchd")


def _marked(unit: UnitFile, comment: str) -> UnitFile:
    if comment == "#":
        return UnitFile(unit.path, f"# {MARKER}\n{unit.text}")
    head, sep, rest = unit.text.partition("<plist")  # after the XML declaration and the doctype
    return UnitFile(unit.path, f"{head}<!-- {MARKER} -->\n{sep}{rest}")


def _digest(text: str | bytes) -> str:
    return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()


def _run(command: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def _attempt(command: list[str], runner: Runner) -> tuple[bool, str]:
    """Run a manager command; (succeeded, what it said or why it could not run)."""
    try:
        done = runner(command)
    except FileNotFoundError:
        return False, f"{command[0]} is not installed here"
    except subprocess.TimeoutExpired:
        return False, f"{command[0]} did not answer within 60 s"
    except OSError as exc:
        return False, f"cannot run {command[0]}: {exc}"
    said = (done.stderr or done.stdout or "").strip()
    return done.returncode == 0, said or f"exit code {done.returncode}"


def _manager_hint(manager: str) -> str:
    if manager == "systemd":
        return (
            "Is a systemd user instance running for you? On a server, `loginctl enable-linger $USER` starts one; "
            f"a container often has none (use `{command_name()} start` there)."
        )
    return "Is this a macOS login session (launchctl domain gui/$UID)?"


def _command_line(command: list[str]) -> str:
    return " ".join(command)


# -- install ----------------------------------------------------------------------------------------


def install(
    the_plan: Plan,
    paths: Paths,
    out: TextIO,
    *,
    dry_run: bool = False,
    start: bool = True,
    runner: Runner = _run,
    stop_running_daemon: Callable[[], str | None] | None = None,
) -> int:
    """Write the files, then load, enable and start them. Returns the exit code."""
    if dry_run:
        for unit in the_plan.files:
            print(f"# {unit.path}", file=out)
            print(unit.text.rstrip("\n"), file=out)
            print(file=out)
        steps = [*the_plan.prepare, *the_plan.start] if start else the_plan.prepare
        print("# then run:", file=out)
        for command in steps:
            print(f"#   {_command_line(command)}", file=out)
        print("# (dry run: nothing was written or run)", file=out)
        return 0

    manifest = _read_manifest(paths) or {}
    created: list[str] = list(manifest.get("dirs", []))
    files: dict[str, str] = dict(manifest.get("files", {})) if manifest.get("manager") == the_plan.manager else {}
    for directory in [*(u.path.parent for u in the_plan.files), *the_plan.make_dirs, paths.state_dir]:
        created += [str(d) for d in make_private_dirs(directory)]
    for unit in the_plan.files:
        _write(unit.path, unit.text)
        files[str(unit.path)] = _digest(unit.text)
        print(f"wrote {unit.path}", file=out)
    _write_manifest(paths, {
        "manager": the_plan.manager,
        "files": files,
        "dirs": created,
        "version": __version__,
        "python": sys.executable,
        "installed": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    })
    if not start:
        print("not started (--no-start); start it with:", file=out)
        for command in the_plan.prepare + the_plan.start:
            print(f"  {_command_line(command)}", file=out)
        return 0

    for command in the_plan.prepare:
        ok, said = _attempt(command, runner)
        if ok:
            print(f"ran {_command_line(command)}", file=out)
        elif the_plan.manager == "launchd" and "bootout" in command:
            pass  # nothing was loaded before: the usual case
        else:
            return _manager_failed(the_plan, command, said, out)
    if stop_running_daemon is not None:
        note = stop_running_daemon()
        if note:
            print(note, file=out)
    for command in the_plan.start:
        ok, said = _attempt(command, runner)
        if not ok:
            return _manager_failed(the_plan, command, said, out)
        print(f"ran {_command_line(command)}", file=out)
    if the_plan.manager == "systemd":
        print(f"atomictoolsd runs as a systemd user service; `{command_name()} status` shows it, "
              "`journalctl --user -u atomictoolsd` has its stderr", file=out)
    else:
        print(f"atomictoolsd runs as the launchd agent {LAUNCHD_LABEL}; `{command_name()} status` shows it", file=out)
    return 0


def _manager_failed(the_plan: Plan, command: list[str], said: str, out: TextIO) -> int:
    print(f"atomictoolsd: `{_command_line(command)}` failed: {said}", file=out)
    print(_manager_hint(the_plan.manager), file=out)
    print("The files are in place. Once the service manager is reachable, run:", file=out)
    for step in the_plan.prepare + the_plan.start:
        if not (the_plan.manager == "launchd" and "bootout" in step):
            print(f"  {_command_line(step)}", file=out)
    print(f"or `{command_name()} service uninstall` to remove them.", file=out)
    return 1


def _write(path: Path, text: str) -> None:
    write_atomic(path, text.encode("utf-8"), 0o644, shared_dir=True)  # never a half-written unit for the manager to read


def _manifest_path(paths: Paths) -> Path:
    return paths.state_dir / MANIFEST_NAME


def _read_manifest(paths: Paths) -> dict[str, Any] | None:
    try:
        value = json.loads(_manifest_path(paths).read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _write_manifest(paths: Paths, manifest: dict[str, Any]) -> None:
    _write(_manifest_path(paths), json.dumps(manifest, indent=2) + "\n")
    os.chmod(_manifest_path(paths), 0o600)


# -- uninstall --------------------------------------------------------------------------------------


def uninstall(
    the_plan: Plan, paths: Paths, out: TextIO, *, dry_run: bool = False, force: bool = False, runner: Runner = _run
) -> int:
    """Stop and disable the service, then remove what install wrote. Returns the exit code."""
    manifest = _read_manifest(paths)
    if manifest is not None and manifest.get("manager") != the_plan.manager:
        print(f"atomictoolsd: the service was installed for {manifest.get('manager')}; "
              f"run `atomictoolsd service uninstall --manager {manifest.get('manager')}`", file=out)
        return 1
    if manifest is not None:
        files = {Path(p): digest for p, digest in manifest.get("files", {}).items()}
        dirs = [Path(d) for d in manifest.get("dirs", [])]
    else:  # no manifest (the state dir was wiped): our files are recognised by their marker line
        files = {u.path: None for u in the_plan.files if _has_marker(u.path)}
        dirs = []
    if not files and manifest is None:
        print("atomictoolsd is not installed as a service (nothing to remove)", file=out)
        return 0
    if dry_run:
        for command in the_plan.stop:
            print(f"would run {_command_line(command)}", file=out)
        for path in files:
            print(f"would remove {path}", file=out)
        for command in the_plan.after_remove:
            print(f"would run {_command_line(command)}", file=out)
        return 0

    code = 0
    for command in the_plan.stop:
        ok, said = _attempt(command, runner)
        if ok:
            print(f"ran {_command_line(command)}", file=out)
        else:
            print(f"warning: `{_command_line(command)}` failed: {said}", file=out)
    for path, digest in files.items():
        try:
            current = path.read_bytes()
        except FileNotFoundError:
            print(f"{path} was already gone", file=out)
            continue
        if digest is not None and _digest(current) != digest and not force:
            print(f"kept {path}: it changed since install (remove it yourself, or pass --force)", file=out)
            code = 1
            continue
        path.unlink()
        print(f"removed {path}", file=out)
    for command in the_plan.after_remove:
        ok, said = _attempt(command, runner)
        if ok:
            print(f"ran {_command_line(command)}", file=out)
        else:
            print(f"warning: `{_command_line(command)}` failed: {said}", file=out)
    if code == 0:
        _manifest_path(paths).unlink(missing_ok=True)
        for directory in reversed(dirs):  # innermost first; only if install created it and it is empty
            try:
                directory.rmdir()
                print(f"removed {directory}/", file=out)
            except OSError:
                pass
    return code


def _has_marker(path: Path) -> bool:
    try:
        return MARKER in path.read_text()
    except (OSError, UnicodeDecodeError):
        return False


# -- status -----------------------------------------------------------------------------------------


def status(the_plan: Plan, paths: Paths, out: TextIO, *, runner: Runner = _run) -> int:
    """What is installed, and what the service manager says about it. 0 when installed, 3 when not."""
    manifest = _read_manifest(paths)
    recorded = dict(manifest.get("files", {})) if manifest and manifest.get("manager") == the_plan.manager else {}
    installed = False
    print(f"service manager: {the_plan.manager}", file=out)
    for unit in the_plan.files:
        try:
            current = unit.path.read_bytes()
        except FileNotFoundError:
            print(f"  {unit.path}: not installed", file=out)
            continue
        installed = True
        digest = recorded.get(str(unit.path))
        if _digest(current) == _digest(unit.text):
            state = "installed, up to date"
        elif digest is not None and _digest(current) == digest:
            state = "installed by an earlier install (run `atomictoolsd service install` to update it)"
        else:
            state = "present, changed by hand"
        print(f"  {unit.path}: {state}", file=out)
    for command in _status_commands(the_plan):
        ok, said = _attempt(command, runner)
        answer = said.splitlines()[0] if said else ""
        if ok or the_plan.manager == "systemd" and answer in ("inactive", "disabled", "failed", "activating"):
            print(f"  {_command_line(command)}: {answer}", file=out)
        else:
            print(f"  {_command_line(command)} failed: {answer}", file=out)
    return 0 if installed else 3


def _status_commands(the_plan: Plan) -> list[list[str]]:
    if the_plan.manager == "systemd":
        return [
            ["systemctl", "--user", verb, unit]
            for unit in (SOCKET_NAME, SERVICE_NAME)
            for verb in ("is-enabled", "is-active")
        ]
    return [["launchctl", "print", the_plan.stop[0][-1]]]

