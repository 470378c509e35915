"""The daemon's settings: defaults, then ``config.toml``, then ``ATOMICTOOLS_*`` variables.

Every setting is a field of ``Config`` with its default and a one-line description; the file key is
the field name and the variable is ``ATOMICTOOLS_`` + the name in upper case. ``Config.sources``
says where each value came from. A bad value is a ``ConfigError`` naming the key and its source.

A setting that widens what a project's code may do (``trust_all``, the sandbox's widening and its
ABI) is *file only* (``_setting(..., file_only=True)``): read from the user's ``config.toml`` and
never from the environment, which an agent's config entry, written by a repository, can fill. Its
variable, when set, is ignored and named in ``Config.ignored`` with the line to put in the file
instead; the daemon logs that and ``status`` shows it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from atomictoolsd.config.errors import SetupError
from atomictoolsd.config.levels import DAEMON_LOG_LEVELS
from atomictoolsd.config.nethosts import parse_private

__all__ = ["Config", "ConfigError", "load_config", "max_workers_default"]


class ConfigError(SetupError):
    """A configuration value is unusable; the message names the key and where it was set."""

    what = "bad configuration"
    exit_code = 2


def _setting(
    default: Any, doc: str, *, minimum: float | None = None, choices: tuple[str, ...] = (),
    check: Callable[[str], object] | None = None, file_only: bool = False,
) -> Any:
    """A setting of ``Config``. ``check`` reads a text value and raises ``ValueError`` saying what is
    wrong with it; ``file_only``: read from ``config.toml`` alone, never from its variable."""
    return field(default=default, metadata={
        "doc": doc, "minimum": minimum, "choices": choices, "check": check, "file_only": file_only,
    })


@dataclass(frozen=True)
class Config:
    call_timeout: float = _setting(60.0, "Seconds a tool call may run when the tool sets no timeout.", minimum=0.001)
    max_call_timeout: float = _setting(600.0, "The longest timeout a caller may ask for one call.", minimum=0.001)
    ask_timeout: float = _setting(
        600.0, "Seconds a tool may wait for the client to answer ctx.elicit or ctx.sample; the wait does not count against the call's timeout.",
        minimum=0.001,
    )
    cancel_grace: float = _setting(
        2.0, "Seconds a cancelled or timed-out call has to stop before its worker is killed.", minimum=0
    )
    load_timeout: float = _setting(30.0, "Seconds a tool module may take to import.", minimum=0.1)
    load_wait: float = _setting(
        2.0, "Seconds a listing waits for tool modules still importing; they are listed once loaded (list_changed).",
        minimum=0,
    )
    max_message_bytes: int = _setting(16 * 1024 * 1024, "Largest JSON-RPC message accepted on the socket, and largest tool result, log or progress message sent back.", minimum=1024)
    truncate_lines: int = _setting(2000, "Tool output longer than this many lines is truncated.", minimum=1)
    truncate_bytes: int = _setting(50 * 1024, "Tool output larger than this many bytes is truncated.", minimum=256)
    spill_max_age: float = _setting(86400.0, "Seconds the full output of a truncated result is kept.", minimum=0)
    worker_threads: int = _setting(16, "Threads per worker for sync tools (concurrent calls to one module).", minimum=1)
    memory_limit_mb: int = _setting(2048, "Memory limit per worker in MiB (0: no limit).", minimum=0)
    idle_timeout: float = _setting(600.0, "Seconds an idle worker lives, and a project no session uses is kept (0: forever).", minimum=0)
    max_idle_workers: int = _setting(
        32, "Most idle workers kept at once; past it the least recently used stop (0: no limit).", minimum=0
    )
    max_workers: int = _setting(
        0, "Most workers running at once, every project together; past it a new worker waits for one to "
        "end (an idle one stops for it), projects taking turns (0: sized to this machine, max_workers_default()).",
        minimum=0,
    )
    watch_debounce_ms: int = _setting(
        50, "Longest time the file watcher groups a burst of changes, in milliseconds.", minimum=1
    )
    watch_step_ms: int = _setting(
        5, "Quiet time after which the file watcher reports changes, in milliseconds.", minimum=1
    )
    builtins: bool = _setting(True, "Serve the built-in tools.")
    trust_all: bool = _setting(False, "Load every project's local tools without asking for trust.", file_only=True)
    sandbox_global: bool = _setting(
        False, "Confine the global tools too, as `trust --sandbox` confines a project's (they then read only their own dir).",
        file_only=True,
    )
    sandbox_allow_net: bool = _setting(
        False, "Let every confined worker reach any public host through the daemon's proxy (HTTP, HTTPS, CONNECT).",
        file_only=True,
    )
    sandbox_allow_net_private: str = _setting(
        "", "Hosts, addresses and networks of your own network (10.1.0.0/16) that confined workers with the "
        "network may reach, separated by ','; never loopback nor this machine's own addresses.",
        check=parse_private, file_only=True,
    )
    sandbox_allow_read: str = _setting(
        "", "More files and directories every confined worker may read, separated by ':'.", file_only=True
    )
    sandbox_allow_write: str = _setting(
        "", "More directories every confined worker may read and write, separated by ':'.", file_only=True
    )
    sandbox_allow_env: str = _setting(
        "", "Environment variables of the daemon every confined worker gets too, by name, separated by ':'.",
        file_only=True,
    )
    sandbox_protect: str = _setting(
        "", "More entries of a project kept read-only to its confined workers (names or relative paths, separated by ':').",
        file_only=True,
    )
    sandbox_abi: int = _setting(
        -1, "For testing: believe the kernel offers at most this Landlock ABI (0: none; -1: what it offers).",
        minimum=-1, file_only=True,
    )
    project_venv: str = _setting(
        "", "A directory name (.venv) whose virtual environment, where a trusted project has one, its tools run with.",
        file_only=True,
    )
    installer: str = _setting(
        "auto", "What installs the dependencies a tool module declares (PEP 723): uv where atomictoolsd has it, else pip.",
        choices=("auto", "uv", "pip"),
    )
    install_timeout: float = _setting(
        300.0, "Seconds the installer may take to build one environment of declared dependencies.", minimum=1
    )
    package_index: str = _setting(
        "", "The package index declared dependencies come from (a URL; empty: PyPI).", file_only=True
    )
    js_runtime: str = _setting(
        "auto", "What runs TypeScript and JavaScript tools: auto (Bun when installed, else Node 22.6+), bun, node, or the path of either.",
    )
    js_packages: str = _setting(
        "", "A directory whose node_modules holds zod, @opencode-ai/plugin and @github/copilot-sdk for tools that do not install them (empty: the daemon's own, installed on first need).",
    )
    opencode_dirs: bool = _setting(True, "Serve OpenCode's tool directories (.opencode/tool[s], ~/.config/opencode/tool[s]) too.")
    http: str = _setting(
        "", "Serve MCP's Streamable HTTP on [ADDRESS:]PORT (a bare port is loopback; 0: any free port; empty: off)."
    )
    page_size: int = _setting(500, "Tools per tools/list page.", minimum=1)
    max_connections: int = _setting(
        1000, "Most client connections at once (fewer when the open-file limit leaves less beside what workers need).", minimum=1
    )
    shutdown_grace: float = _setting(10.0, "Seconds calls in flight may finish when the daemon stops.", minimum=0)
    log_level: str = _setting("info", "Least severe level written to the log.", choices=DAEMON_LOG_LEVELS)
    log_max_bytes: int = _setting(10 * 1024 * 1024, "Size at which the log file is rotated.", minimum=4096)
    log_backups: int = _setting(3, "Rotated log files kept.", minimum=0)
    sources: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)
    # A file-only setting's variable that was set, and ignored: variable -> what to do instead.
    ignored: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def settings(cls) -> list[dataclasses.Field[Any]]:
        return [f for f in dataclasses.fields(cls) if f.name not in ("sources", "ignored")]

    def describe(self) -> list[dict[str, Any]]:
        """Each setting with its value, where the value came from, and what it means."""
        return [
            {
                "key": f.name,
                "value": getattr(self, f.name),
                "source": self.sources.get(f.name, "default"),
                "env": None if f.metadata["file_only"] else env_name(f.name),
                "doc": f.metadata["doc"],
            }
            for f in self.settings()
        ]


def max_workers_default() -> int:
    """``max_workers`` where the setting is 0: 32 workers a CPU, at most one per 64 MiB of the
    machine's memory, at least 16 (on 2 CPUs and 24 GiB: 64)."""
    by_cpu = 32 * (os.cpu_count() or 1)
    try:
        by_memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (64 << 20)
    except (AttributeError, ValueError, OSError):  # no such sysconf name here
        by_memory = by_cpu
    return max(16, min(by_cpu, by_memory))


def env_name(key: str) -> str:
    return f"ATOMICTOOLS_{key.upper()}"


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _convert(f: dataclasses.Field[Any], raw: Any, source: str) -> Any:
    kind = type(f.default)
    where = f"{f.name} (from {source})"
    if kind is bool:
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, str) and raw.strip().lower() in _TRUE | _FALSE:
            return raw.strip().lower() in _TRUE
        raise ConfigError(f"{where}: expected true or false, got {raw!r}")
    if kind in (int, float):
        if isinstance(raw, bool):
            raise ConfigError(f"{where}: expected a number, got {raw!r}")
        try:
            value = kind(raw.strip()) if isinstance(raw, str) else kind(raw)
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: expected {'an integer' if kind is int else 'a number'}, got {raw!r}") from None
        if kind is int and isinstance(raw, float) and raw != int(raw):
            raise ConfigError(f"{where}: expected an integer, got {raw!r}")
        if not math.isfinite(value):
            raise ConfigError(f"{where}: must be a finite number, got {raw!r}")
        minimum = f.metadata["minimum"]
        if minimum is not None and value < minimum:
            raise ConfigError(f"{where}: must be at least {minimum:g}, got {raw!r}")
        return value
    value = str(raw).strip()
    choices = f.metadata["choices"]
    if choices and value not in choices:
        raise ConfigError(f"{where}: must be one of {', '.join(choices)}; got {raw!r}")
    check = f.metadata.get("check")
    if check is not None:
        try:
            check(value)
        except ValueError as exc:
            raise ConfigError(f"{where}: {exc}") from None
    return value


def _setting_hint(key: str, known: Mapping[str, Any]) -> str:
    from atomictoolsd.config.suggest import did_you_mean, near_names  # lazy: only on this error path

    near = near_names(key, known)
    return did_you_mean(near) if near else f"; known settings: {', '.join(known)}"


def load_config(config_file: Path, environ: Mapping[str, str] | None = None) -> Config:
    """Read the configuration: defaults, overridden by ``config_file``, overridden by the environment
    (but for the ``file_only`` settings, which only the file sets).

    Raises:
        ConfigError: the file is not valid TOML, names an unknown key, or a value is unusable.
    """
    environ = os.environ if environ is None else environ
    fields = {f.name: f for f in Config.settings()}
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    try:
        with open(config_file, "rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        data = {}
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{config_file} is not valid TOML: {exc}") from None
    for key, raw in data.items():
        f = fields.get(key)
        if f is None:
            raise ConfigError(f"{config_file}: unknown setting {key!r}{_setting_hint(key, fields)}")
        values[key] = _convert(f, raw, str(config_file))
        sources[key] = str(config_file)
    ignored: dict[str, str] = {}
    for key, f in fields.items():
        var = env_name(key)
        if var not in environ:
            continue
        if f.metadata["file_only"]:
            ignored[var] = _ignored_note(f, environ[var], config_file)
            continue
        values[key] = _convert(f, environ[var], var)
        sources[key] = var
    return Config(**values, sources=sources, ignored=ignored)


def _ignored_note(f: dataclasses.Field[Any], raw: str, config_file: Path) -> str:
    """Why a file-only setting's variable is ignored, and the line that sets it where it counts."""
    try:
        value = _convert(f, raw, env_name(f.name))
    except ConfigError:
        value = f.default
    shown = str(value).lower() if isinstance(value, bool) else json.dumps(value) if isinstance(value, str) else value
    return (f"{env_name(f.name)} is ignored: {f.name} widens what a project's code may do, so it is read only "
            f"from your config file, never from the environment (an agent's config entry can set that); "
            f"to set it, put `{f.name} = {shown}` in {config_file}")
