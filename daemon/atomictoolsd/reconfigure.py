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
from typing import TYPE_CHECKING, Any

import msgspec

from atomictoolsd.config import Config, ConfigError, load_config
from atomictoolsd.eventlog import events

if TYPE_CHECKING:
    from atomictoolsd.server import Server

__all__ = ["RESTART_SETTINGS", "WORKER_SETTINGS", "apply_config", "reload"]

log = logging.getLogger("atomictoolsd")

# Settings baked into a worker when it starts.
WORKER_SETTINGS = frozenset({"worker_threads", "memory_limit_mb", "truncate_lines", "truncate_bytes", "max_message_bytes"})

# Settings read once, when the daemon starts: a SIGHUP cannot apply them. The value in force stays
# in ``server.config`` (so status tells the truth) and the new one waits, shown in status as such.
RESTART_SETTINGS = frozenset({"builtins"})


async def reload(server: Server) -> dict[str, Any]:
    """Reload the configuration and rescan every tools dir; return what happened."""
    started = time.perf_counter()
    server.lifecycle("reloading")
    note = error = ""
    changed: list[str] = []
    config: Config | None = None
    try:
        config = load_config(server.paths.config_file)
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
    await registry.refresh_trust()  # trust_all may have changed
    for tools_dir in list(registry.dirs.values()):
        registry.ensure_scanned(tools_dir)
        await registry.scan(tools_dir, retry_failed=True)
    modules = [m for d in registry.dirs.values() for m in d.modules.values()]
    result = {
        "ms": round((time.perf_counter() - started) * 1000, 3),
        "changed": changed,
        "modules": len(modules),
        "tools": sum(len(m.tools) for m in modules),
        "errors": sum(1 for m in modules if m.error is not None),
        "config_error": error or None,
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


def _report_in_status(server: Server, error: str, loaded: Config | None) -> None:
    """The last reload, in ``atomic/status``: when, a configuration that failed, settings waiting."""
    previous = server.status_sections.get("reload")
    waiting = previous().get("waiting", {}) if previous is not None and loaded is None else {}
    if loaded is not None:
        waiting = {
            key: getattr(loaded, key) for key in sorted(RESTART_SETTINGS)
            if getattr(loaded, key) != getattr(server.config, key)
        }
    section = {"at": time.time(), "config_error": error or None, "waiting": waiting}
    server.status_sections["reload"] = lambda: section


def apply_config(server: Server, config: Config) -> list[str]:
    """Make ``config`` the daemon's configuration; return the names of the settings that changed."""
    old = server.config
    # What cannot change without a restart stays as it is (``_report_in_status`` says it waits).
    config = dataclasses.replace(config, **{key: getattr(old, key) for key in RESTART_SETTINGS})
    changed = [f.name for f in Config.settings() if getattr(old, f.name) != getattr(config, f.name)]
    server.config = config
    settings = server.pool.settings
    settings.threads = config.worker_threads
    settings.memory_limit = config.memory_limit_mb * 1024 * 1024
    settings.truncate_lines = config.truncate_lines
    settings.truncate_bytes = config.truncate_bytes
    settings.cancel_grace = config.cancel_grace
    settings.load_timeout = config.load_timeout
    server.registry.load_wait = config.load_wait
    settings.max_result_bytes = config.max_message_bytes
    if WORKER_SETTINGS.intersection(changed):
        for runner in server.pool.runners.values():
            runner.spec = msgspec.structs.replace(
                runner.spec,
                threads=settings.threads,
                memory_limit=settings.memory_limit,
                truncate_lines=settings.truncate_lines,
                truncate_bytes=settings.truncate_bytes,
                max_result_bytes=settings.max_result_bytes,
            )
            runner.retire()  # calls in flight finish; the next call starts a worker with the new limits
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
