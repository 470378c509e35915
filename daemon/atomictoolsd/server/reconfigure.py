"""SIGHUP: read the configuration again, apply it, and rescan every tools dir — connections stay open.

A configuration that does not load (bad TOML, an unknown key, a bad value) is reported (log, status
line) and the daemon keeps the one it has. One that loads replaces ``server.config``; what is read at
use time (timeouts, message size, page size, grace periods) applies at once. Settings that shape a
worker (threads, memory limit, truncation) apply to workers started from now on, and the running
workers retire (their calls in flight finish) so the next call gets a worker with the new limits.
Components with a ``reconfigure(config)`` method are given the new configuration.

Then every tools dir is rescanned: new, changed and deleted modules are loaded or dropped, and
sessions whose tools changed get ``notifications/tools/list_changed`` as on any reload.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from atomictoolsd.config.settings import Config, ConfigError, load_config
from atomictoolsd.pool.pool import PoolSettings
from atomictoolsd.registry.confinement import configure_sandbox

if TYPE_CHECKING:
    from atomictoolsd.config.paths import Paths
    from atomictoolsd.pool.pool import WorkerPool
    from atomictoolsd.registry.projects import Registry

__all__ = ["RESTART_SETTINGS", "Reconfigurable", "apply_config", "reload"]

log = logging.getLogger("atomictoolsd")

# Settings read once, when the daemon starts: a SIGHUP cannot apply them. The value in force stays
# in ``server.config`` (so status tells the truth) and the new one waits, shown in status as such.
RESTART_SETTINGS = frozenset({"builtins", "http", "opencode_dirs"})


class Reconfigurable(Protocol):
    """What a reload reads and changes of the daemon (``lifecycle.Server``, which imports this module)."""

    paths: Paths
    config: Config
    registry: Registry
    pool: WorkerPool
    components: list[Any]
    status_sections: dict[str, Callable[[], Any]]

    def lifecycle(self, event: str, detail: str = "") -> None: ...


async def reload(server: Reconfigurable) -> dict[str, Any]:
    """Reload the configuration and rescan every tools dir; return what happened."""
    started = time.perf_counter()
    server.lifecycle("reloading")
    note = error = ""
    changed: list[str] = []
    config: Config | None = None
    try:
        config = _with_command_line(load_config(server.paths.config_file), server.config)
    except ConfigError as exc:
        error = str(exc)
        note = f"configuration not reloaded: {error}"
        log.error(
            "configuration not reloaded, keeping the current one: %s", exc,
            extra={"event": "config.error", "data": {"error": str(exc)}},
        )
    else:
        changed = apply_config(server, config)
    registry = server.registry
    await registry.rescan(registry.dirs.values())  # trust asked again: trust_all may have changed
    modules = [m for d in registry.dirs.values() for m in d.modules.values()]
    result = {
        "ms": round((time.perf_counter() - started) * 1000, 3),
        "changed": changed,
        "modules": len(modules),
        "tools": sum(len(m.tools) for m in modules),
        "failed": sum(1 for m in modules if m.error is not None),  # modules; "errors" are load-error entries
        "configError": error or None,
    }
    log.info(
        "reloaded on SIGHUP in %.1f ms: %d tools in %d modules%s%s", result["ms"], result["tools"], result["modules"],
        f"; settings changed: {', '.join(changed)}" if changed else "",
        f"; {note}" if note else "",
        extra={"event": "daemon.reload", "data": result},
    )
    _report_in_status(server, error, config)
    server.lifecycle("reloaded", note)
    return result


def _with_command_line(config: Config, running: Config) -> Config:
    """``config`` with the settings the daemon's command line gave (``serve --http``) as they were:
    a reload rereads the file, it does not undo what the daemon was started with."""
    given = {key: source for key, source in running.sources.items() if source.startswith("--")}
    if not given:
        return config
    return dataclasses.replace(
        config, **{key: getattr(running, key) for key in given}, sources={**config.sources, **given}
    )


def _report_in_status(server: Reconfigurable, error: str, loaded: Config | None) -> None:
    """The last reload, in ``atomic/status``: when, a configuration that failed, settings waiting."""
    previous = server.status_sections.get("reload")
    waiting = previous().get("waiting", {}) if previous is not None and loaded is None else {}
    if loaded is not None:
        waiting = {
            key: getattr(loaded, key) for key in sorted(RESTART_SETTINGS)
            if getattr(loaded, key) != getattr(server.config, key)
        }
    section = {"at": time.time(), "configError": error or None, "waiting": waiting}
    server.status_sections["reload"] = lambda: section


def apply_config(server: Reconfigurable, config: Config) -> list[str]:
    """Make ``config`` the daemon's configuration; return the names of the settings that changed."""
    old = server.config
    # What cannot change without a restart stays as it is (``_report_in_status`` says it waits),
    # and so does where it came from: a value in force is never said to come from a file that only
    # asks for another one.
    sources = {k: v for k, v in config.sources.items() if k not in RESTART_SETTINGS}
    sources.update({k: v for k, v in old.sources.items() if k in RESTART_SETTINGS})
    config = dataclasses.replace(config, **{key: getattr(old, key) for key in RESTART_SETTINGS}, sources=sources)
    changed = [f.name for f in Config.settings() if getattr(old, f.name) != getattr(config, f.name)]
    server.config = config
    configure_sandbox(config)
    server.pool.reconfigure(PoolSettings.from_config(config, server.pool.settings.spill_dir))
    server.registry.load_wait = config.load_wait
    events = server.pool.events
    if events.is_open:
        events.configure(level=config.log_level, max_bytes=config.log_max_bytes, backups=config.log_backups)
    logging.getLogger().setLevel(config.log_level.upper())
    for component in server.components:
        reconfigure = getattr(component, "reconfigure", None)
        if reconfigure is not None:
            try:
                reconfigure(config)
            except Exception:  # one component's failure must not stop the reload
                log.exception("%s could not apply the new configuration", type(component).__name__)
    return changed
