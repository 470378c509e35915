"""The systemd units and the launchd plist, filled in for this installation.

The templates live in ``systemd/`` and ``launchd/`` at the top of the source tree (a wheel carries
them in ``atomictoolsd/service/templates/``). Rendering puts in the absolute interpreter, the socket
path, the log directory and the environment the daemon needs (``PATH``, and any path overrides set
when installing), escaped for each format. Nothing here writes files or runs commands.
"""

from __future__ import annotations

import os
import plistlib
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from atomictoolsd.config.paths import Paths
from atomictoolsd.service.manager import LAUNCHD_LABEL
from atomictoolsd.service.searchpath import service_path

__all__ = [
    "PASSED_VARIABLES",
    "UnitFile",
    "launchd_agent_dir",
    "launchd_files",
    "render_template",
    "systemd_files",
    "systemd_user_dir",
    "template_path",
]

SERVICE_NAME = "atomictoolsd.service"
SOCKET_NAME = "atomictoolsd.socket"
PLIST_NAME = f"{LAUNCHD_LABEL}.plist"

# Variables that place the daemon's files; set when installing, the service needs them too.
PASSED_VARIABLES = (
    "ATOMICTOOLS_SOCKET",
    "ATOMICTOOLS_RUNTIME_DIR",
    "ATOMICTOOLS_STATE_DIR",
    "ATOMICTOOLS_LOG_DIR",
    "ATOMICTOOLS_CONFIG_DIR",
    "ATOMICTOOLS_CACHE_DIR",
    "XDG_CONFIG_HOME",
    "XDG_STATE_HOME",
    "XDG_CACHE_HOME",
    "XDG_DATA_HOME",
)

_PLACEHOLDER = re.compile(r"@([A-Z_]+)@")


@dataclass(frozen=True)
class UnitFile:
    """A file to install: where it goes and what it holds."""

    path: Path
    text: str


def template_path(relative: str) -> Path:
    """A template by its path under the source tree (``systemd/atomictoolsd.service``)."""
    here = Path(__file__).resolve().parent
    for base in (here / "templates", here.parents[2]):
        candidate = base / relative
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"the template {relative} is missing from this installation of atomictoolsd")


def render_template(text: str, values: Mapping[str, str]) -> str:
    """Replace every ``@NAME@``; a placeholder without a value is an error, not a silent blank."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in values:
            raise KeyError(f"no value for @{name}@")
        return values[name]

    return _PLACEHOLDER.sub(value, text)


def environment(environ: Mapping[str, str]) -> dict[str, str]:
    """What the service's environment must hold: the installer's PATH (tools run the programs the
    user runs) and the variables that move the daemon's files."""
    home = environ.get("HOME", str(Path.home()))
    defaults = {
        "XDG_CONFIG_HOME": os.path.join(home, ".config"),
        "XDG_STATE_HOME": os.path.join(home, ".local", "state"),
        "XDG_CACHE_HOME": os.path.join(home, ".cache"),
        "XDG_DATA_HOME": os.path.join(home, ".local", "share"),
    }
    env = {"PATH": service_path(environ.get("PATH", os.defpath))}
    for name in PASSED_VARIABLES:
        value = environ.get(name)
        if value and value != defaults.get(name):
            env[name] = value
    return env


# -- systemd ----------------------------------------------------------------------------------------


def systemd_user_dir(environ: Mapping[str, str]) -> Path:
    """``$XDG_CONFIG_HOME/systemd/user``: where a user's own units go."""
    config_home = environ.get("XDG_CONFIG_HOME") or os.path.join(environ.get("HOME", str(Path.home())), ".config")
    return Path(config_home) / "systemd" / "user"


def _systemd_escape(value: str) -> str:
    # '%' starts a specifier everywhere; '\' and '"' matter inside quotes.
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")


def _systemd_word(value: str) -> str:
    """One word of an Exec command line ('$' would expand a variable there)."""
    escaped = _systemd_escape(value).replace("$", "$$")
    return f'"{escaped}"' if re.search(r"\s|[;'\"]", value) else escaped


def _systemd_socket_value(paths: Paths, environ: Mapping[str, str]) -> str:
    runtime = environ.get("XDG_RUNTIME_DIR", "").rstrip("/")
    default = os.path.join(runtime, "atomictools", "atomictoolsd.sock") if runtime else None
    if default is not None and str(paths.socket) == default:
        return "%t/atomictools/atomictoolsd.sock"  # the user's runtime dir, whatever its path at boot
    return str(paths.socket).replace("%", "%%")


def systemd_files(paths: Paths, environ: Mapping[str, str], python: str = sys.executable) -> list[UnitFile]:
    """``atomictoolsd.service`` and ``atomictoolsd.socket`` for this installation."""
    unit_dir = systemd_user_dir(environ)
    env_lines = "\n".join(
        f'Environment="{_systemd_escape(f"{key}={value}")}"' for key, value in environment(environ).items()
    )
    service = render_template(
        template_path(f"systemd/{SERVICE_NAME}").read_text(),
        {"PYTHON": _systemd_word(os.path.abspath(python)), "ENVIRONMENT": env_lines},
    )
    socket_unit = render_template(
        template_path(f"systemd/{SOCKET_NAME}").read_text(),
        {"SOCKET": _systemd_socket_value(paths, environ)},
    )
    return [UnitFile(unit_dir / SERVICE_NAME, service), UnitFile(unit_dir / SOCKET_NAME, socket_unit)]


# -- launchd ----------------------------------------------------------------------------------------


def launchd_agent_dir(environ: Mapping[str, str]) -> Path:
    return Path(environ.get("HOME", str(Path.home()))) / "Library" / "LaunchAgents"


def launchd_files(paths: Paths, environ: Mapping[str, str], python: str = sys.executable) -> list[UnitFile]:
    """The launchd agent's plist for this installation."""
    values = {
        "PYTHON": os.path.abspath(python),
        "HOME": environ.get("HOME", str(Path.home())),
        "LOG_DIR": str(paths.log_dir),
        "SOCKET": str(paths.socket),
    }
    with open(template_path(f"launchd/{PLIST_NAME}"), "rb") as fh:
        plist = plistlib.load(fh)

    def fill(node: object) -> object:
        if isinstance(node, str):
            return render_template(node, values)
        if isinstance(node, list):
            return [fill(item) for item in node]
        if isinstance(node, dict):
            return {key: fill(item) for key, item in node.items()}
        return node

    filled = fill(plist)
    assert isinstance(filled, dict)
    filled["EnvironmentVariables"] = environment(environ)
    text = plistlib.dumps(filled, sort_keys=False).decode()
    return [UnitFile(launchd_agent_dir(environ) / PLIST_NAME, text)]
