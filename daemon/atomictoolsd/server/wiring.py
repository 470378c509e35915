"""The one place the daemon is assembled: every component built, and wired to the others, here.

``build_pool`` makes the worker pool (and with it the event log, which the entry point opens before
anything else runs); ``build_server`` the trust store and the registry, the ``Server`` that serves
them, and the components that live beside it (file watcher, worker monitor, project reaper,
bridges, the service manager's notifications), registers the ``atomic/*`` methods components
answer and the sections they add to ``atomic/status``. Components never import the server: each
gets what it needs from here (a narrow protocol its own module defines, which ``Server`` meets).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import msgspec

from atomictoolsd.bridges.scripts import Bridges
from atomictoolsd.config.paths import Paths
from atomictoolsd.config.settings import Config
from atomictoolsd.environments import Environments
from atomictoolsd.pool.javascript import JavaScript
from atomictoolsd.pool.monitor import WorkerMonitor
from atomictoolsd.pool.pool import PoolSettings, WorkerPool
from atomictoolsd.pool.spawner import EarlyForkServer
from atomictoolsd.registry.cache import DefinitionCache
from atomictoolsd.registry.confinement import configure_sandbox, held_policy, judge
from atomictoolsd.registry.content import ContentStore
from atomictoolsd.registry.holding import ContentJudge
from atomictoolsd.registry.idle import ProjectReaper
from atomictoolsd.registry.model import ToolsDir
from atomictoolsd.registry.projects import Registry
from atomictoolsd.registry.sitewatch import SiteWatcher
from atomictoolsd.registry.trust import TrustError, TrustStore
from atomictoolsd.registry.watcher import FileWatcher
from atomictoolsd.server.lifecycle import Server
from atomictoolsd.service.manager import ServiceContext
from atomictoolsd.service.notify import Notifier, ServiceNotify
from atomictoolsd.sessions.trust_refresh import trust_refresh_method
from atomictoolsd.util.periodic import Scheduler
from atomictoolsd.worker.builtins import BUILTIN_DIR

__all__ = ["build_pool", "build_server"]


def build_pool(paths: Paths, config: Config, first_forkserver: EarlyForkServer | None = None) -> WorkerPool:
    """The worker pool, and with it the daemon's event log (``pool.events``: not open yet) and its
    one loop for periodic work (``pool.scheduler``): ``first_forkserver`` is the fork server
    ``serve`` forked at start."""
    return WorkerPool(
        PoolSettings.from_config(config, str(paths.spill_dir)), first_forkserver, (str(BUILTIN_DIR),), Scheduler(),
    )


def build_server(
    paths: Paths,
    config: Config,
    pool: WorkerPool,
    *,
    service: ServiceContext | None = None,
    listen_socket: socket.socket | None = None,
    notifier: Notifier | None = None,
) -> Server:
    """The daemon, ready to ``serve()``, around ``pool`` (``build_pool``): ``service`` is what the
    service manager told this process, ``listen_socket`` the socket it passed (adopted instead of
    binding one), ``notifier`` its ``NOTIFY_SOCKET`` (when set)."""
    configure_sandbox(config)
    trust = TrustStore(paths.state_dir)
    server: Server | None = None

    def current_config() -> Config:
        # SIGHUP replaces server.config (trust_all and the sandbox settings included); the registry
        # asks before the server exists too.
        return config if server is None else server.config

    def trusted(root: Path) -> bool:
        return current_config().trust_all or trust.is_trusted(root)

    def project_setting(root: str) -> tuple[str, str] | None:
        # The user's choice only: the project's trust entry, else their config file's project_venv.
        entry = trust.entry(Path(root))
        if entry is not None and isinstance(entry.get("python"), str):
            return entry["python"], "trust"
        name = current_config().project_venv
        if name and (Path(root) / name / "pyvenv.cfg").is_file():
            return str(Path(root) / name), "config"
        return None

    environments = Environments(paths.cache_dir / "envs", paths.home, config, project_setting)
    pool.environment = environments.for_runner

    registry = Registry(
        pool,
        paths.home,
        # The shared built-ins serve what has no confined dir of its own (no project, a path that is
        # not UTF-8): they work on the directory each call names, never on their cwd. Not the
        # home: a session at the home has its own, confined to it (``Lifetimes._builtins``).
        builtin_dirs=[ToolsDir(BUILTIN_DIR, "builtin", Path("/"))] if config.builtins else [],
        trusted=trusted,
        trust_level=lambda root: "full" if current_config().trust_all else trust.level(root),
        judge=lambda tools_dir: judge(tools_dir, current_config(), trust, paths.home),
        cache=DefinitionCache(paths.cache_dir / "definitions"),
        load_wait=config.load_wait,
        content=ContentJudge(
            trust, ContentStore(paths.state_dir), lambda: current_config().trust_all,
            lambda root: held_policy(root, current_config(), paths.home),
        ),
        environments=environments,
        opencode_dirs=config.opencode_dirs,
    )
    scheduler = pool.scheduler  # every component's periodic work runs from it
    server = Server(paths, config, pool, registry, scheduler)
    if service is not None:
        server.service = service
    server.listen_socket = listen_socket
    server.methods["atomic/trust/refresh"] = trust_refresh_method(registry.refresh_trust)
    server.methods["atomic/javascript/retry"] = _javascript_retry

    watcher = FileWatcher(scheduler)
    monitor = WorkerMonitor(scheduler)
    javascript = pool.javascript = JavaScript(paths.cache_dir, paths.home, config)
    # Started in this order once the socket serves, stopped in reverse order.
    server.components += [
        environments, watcher, monitor, ProjectReaper(scheduler), Bridges(), SiteWatcher(scheduler), javascript,
    ]
    if notifier is not None:
        server.components.append(ServiceNotify(notifier, server.service.watchdog_usec))
    if config.http:
        from atomictoolsd.transports.http import HttpTransport  # lazy: start-up and memory with HTTP off

        http = HttpTransport(config.http, scheduler)
        server.components.append(http)
        server.status_sections["http"] = http.info
    server.status_sections["watcher"] = watcher.info
    server.status_sections["sandbox"] = _sandbox_support
    _probe_network_early(config, trust)
    server.status_sections["netProxy"] = pool.net_proxy.info
    server.status_sections["monitor"] = monitor.info
    server.status_sections["environments"] = environments.info
    server.status_sections["javascript"] = javascript.info
    if registry.cache is not None:
        server.status_sections["cache"] = registry.cache.info
    return server


def _probe_network_early(config: Config, trust: TrustStore) -> None:
    """Where a confined tool is allowed the network, find out now, in a thread, whether this machine
    can give it a namespace of its own (``netns.support`` runs a small program, once): the first
    judgement of such a project then finds the answer instead of waiting for it on the event loop."""
    try:
        allowed = config.sandbox_allow_net or any((e.get("allow") or {}).get("net") for e in trust.entries().values())
    except TrustError:
        return
    if allowed:
        from atomictoolsd.worker import netns  # lazy: ctypes, only where a tool may have the network

        threading.Thread(target=netns.support, name="atomictoolsd-netns-probe", daemon=True).start()

def _javascript_retry(session: Any, id_json: bytes, raw: Any) -> Awaitable[None]:
    """``atomic/javascript/retry`` (``atomictoolsd js install`` once it installed): load again the
    TypeScript and JavaScript modules that failed; answers with the component's status."""
    javascript = session.server.pool.javascript

    async def retry() -> None:
        await javascript.retry_failed()
        session.send_result(id_json, msgspec.json.encode(javascript.info()))

    return retry()


def _sandbox_support() -> dict[str, Any]:
    from atomictoolsd.worker.netns import support as network  # lazy: ctypes, only when status is asked
    from atomictoolsd.worker.sandbox import support  # lazy: ctypes, only when status is asked

    offered = support()
    return {**offered, "network": network()} if offered["available"] else offered


