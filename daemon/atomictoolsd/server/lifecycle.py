"""The daemon's lifecycle: ``startup()`` → ``main_loop()`` → ``shutdown()``.

Startup verifies the runtime dir (owned by this user, mode 0700), takes the single-instance lock
before touching the socket (asyncio and uvloop silently delete an existing socket file when they
bind), replaces a stale socket left by a killed daemon (one that refuses connections; a socket some
other process serves is left alone), binds with mode 0600, and reports readiness. Under socket
activation it serves on the socket the service manager passed (``listen_socket``) and never unlinks
it. Every connection is checked for the peer's uid, and counted: past ``max_connections``, or when
fewer file descriptors would be left than workers need (``fd_reserve``), a new connection gets one
error line and is closed. When HTTP is on, its connections have a share of the descriptors of
their own (``http_share``), kept from the socket's; its sessions are bounded by the HTTP transport
and never counted here, so the socket's clients never wait for HTTP's. Once a second the daemon
checks that the socket file and the lock file at their paths are still its own (a cleaner or a user may delete them): it binds a fresh socket, or
takes the lock again, and when another daemon has taken over meanwhile it stops. Shutdown stops accepting, lets calls in flight
finish (bounded by ``shutdown_grace``), stops every worker, and removes the socket and lock files.

Signal handlers only record the signal; the main loop acts on it. A second SIGINT forces the exit.
SIGHUP reloads the configuration and rescans every tools dir (``reconfigure``); connections stay.

Extension points, filled by ``server/wiring.py``: ``components`` (started once the socket serves,
stopped after calls drain), ``methods`` (extra JSON-RPC methods), ``lifecycle_hooks`` (told
``ready``, ``reloading``, ``reloaded``, ``stopping``) and ``status_sections`` (extra keys of
``atomic/status``, e.g. bridges). The socket and lock files are ``socketfile``'s.
"""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import signal
import socket
import sys
import time
from collections.abc import Callable
from typing import Any, Protocol

import msgspec

from atomictools._paths import write_pointer
from atomictoolsd import __version__
from atomictoolsd.config.paths import PathError, Paths, check_private_dir, check_socket_path
from atomictoolsd.config.settings import Config
from atomictoolsd.pool.pool import WorkerPool
from atomictoolsd.registry.model import Change
from atomictoolsd.registry.projects import Registry
from atomictoolsd.server.reconfigure import reload
from atomictoolsd.server.socketfile import (
    AlreadyRunning,
    InstanceLock,
    adopt_socket,
    bind_socket,
    listener_pid,
    peer_credentials,
    wait_until_served,
)
from atomictoolsd.service.manager import ServiceContext
from atomictoolsd.sessions.connection import Connection
from atomictoolsd.sessions.session import Handler, Session
from atomictoolsd.util.periodic import Scheduler
from atomictoolsd.worker.truncate import remove_old_spills

__all__ = ["Component", "Server", "fd_reserve", "http_share"]

log = logging.getLogger("atomictoolsd")

# JSON-RPC's range for errors a server defines: this one refuses a connection past the limit.
TOO_MANY_CONNECTIONS = -32000
_GUARD_INTERVAL = 1.0  # seconds between checks that the socket and lock files are still ours


# A session holding a shim's stdin and stdout holds this many descriptors more than its socket, at
# most: the two, and for each that is a socket a copy kept to put its flags back (sessions.handoff).
STDIO_DESCRIPTORS = 4


def fd_reserve(soft_limit: int) -> int:
    """File descriptors kept from connections for workers' channels, the fork server and own files."""
    return max(128, soft_limit // 4)


def http_share(budget: int) -> int:
    """Of the ``budget`` of descriptors for connections, what HTTP's connections may hold when HTTP
    is on; the Unix socket's clients have the rest."""
    return budget // 4


class Component(Protocol):
    """A part of the daemon with a lifetime of its own (file watcher, bridges, service glue, …).

    Made and added by ``server/wiring.py``. Started in order once the socket serves and stopped in
    reverse order during shutdown, after calls in flight have drained. ``start`` is given the server,
    which the component sees only through a narrow protocol of its own module (``WatcherHost``, …),
    never by importing this one. A component may have a ``reconfigure(config)`` method that SIGHUP
    calls with the reloaded configuration.
    """

    async def start(self, server: Server) -> None: ...

    async def stop(self) -> None: ...


class Server:
    """The daemon: socket, sessions, registry and workers."""

    def __init__(self, paths: Paths, config: Config, pool: WorkerPool, registry: Registry, scheduler: Scheduler) -> None:
        """Built by ``server/wiring.py``, which also adds the components, methods and hooks."""
        self.paths = paths
        self.config = config
        self.pool = pool
        self.registry = registry
        self.registry.add_listener(self._on_change)
        self.sessions: set[Session] = set()  # every session: the socket's and those HTTP carries
        self._socket_sessions: set[Session] = set()  # those the connection limit counts
        self._stdio_sessions: set[Session] = set()  # of those, the ones holding a shim's stdio too
        self.started = time.time()
        self._lock = InstanceLock(paths.lock)
        self._listener: asyncio.AbstractServer | None = None
        self._socket_ino: int | None = None
        self._stop: asyncio.Event | None = None
        self._stop_reason = ""
        self._sigints = 0
        # Old spills are removed often enough that the dir never holds many more than spill_max_age allows.
        self._housekeeping = scheduler.every(
            "removing old spill files", self._housekeep, lambda: min(3600.0, max(60.0, self.config.spill_max_age / 4)),
            immediately=True, logger=log,
        )
        # A failed check is tried again next time; the daemon serves on.
        self._guard = scheduler.every("checking the socket and lock files", self._check_files, _GUARD_INTERVAL, logger=log)
        self._refused = 0  # connections refused for the limit since it was last logged
        self._refused_logged = 0.0
        self.methods: dict[str, Handler] = {}  # JSON-RPC methods added by components
        self.components: list[Component] = []
        # (event, detail) with event in ready, reloading, reloaded, stopping: service glue listens.
        self.lifecycle_hooks: list[Callable[[str, str], None]] = []
        # Extra keys of atomic/status, each computed when asked (bridges, …).
        self.status_sections: dict[str, Callable[[], Any]] = {}
        self.service = ServiceContext()  # what the service manager told us (set before serve())
        self.listen_socket: socket.socket | None = None  # passed by the service manager: adopt it
        self.socket_path = paths.socket
        self._reload_task: asyncio.Task[None] | None = None
        self._reload_again = False

    # -- lifecycle ------------------------------------------------------------------------------

    async def serve(self, ready_fd: int | None = None) -> None:
        """Run until stopped. Raises ``AlreadyRunning`` or ``PathError`` before serving."""
        try:
            await self.startup()
        except AlreadyRunning as exc:
            # Report only once the holder serves, so that a racing `start` returns to a usable socket.
            pid = wait_until_served(self.paths.socket, self._lock, 10.0) or exc.pid
            _report_ready(ready_fd, f"running {pid or 0}")
            raise AlreadyRunning(pid) from None
        _report_ready(ready_fd, f"started {os.getpid()}")
        self.lifecycle("ready")
        try:
            await self.main_loop()
        finally:
            await self.shutdown()

    async def startup(self) -> None:
        loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        check_private_dir(self.paths.runtime_dir)  # its own dirs: Paths.create_private_dirs, before the log opens
        if self.listen_socket is None:
            check_socket_path(self.paths.socket)
        self._lock.acquire()
        try:
            sock = self._bind() if self.listen_socket is None else self._adopt(self.listen_socket)
            self._listener = await loop.create_unix_server(lambda: Connection(self), sock=sock, backlog=512)
        except BaseException:
            self._lock.release()
            raise
        for sig, name in ((signal.SIGTERM, "SIGTERM"), (signal.SIGINT, "SIGINT"), (signal.SIGHUP, "SIGHUP")):
            loop.add_signal_handler(sig, self._on_signal, name)
        self._leave_pointer()
        for tools_dir in self.registry.global_dirs:
            self.registry.ensure_scanned(tools_dir)
        for tools_dir in self.registry.builtin_dirs:
            self.registry.ensure_scanned(tools_dir)
        self._housekeeping.start()
        if self._socket_ino is not None:  # an adopted socket is the service manager's to keep
            self._guard.start()
        for component in self.components:
            await component.start(self)
        log.info(
            "atomictoolsd %s serving on %s (pid %d)", __version__, self.socket_path, os.getpid(),
            extra={"event": "daemon.start", "data": {
                "pid": os.getpid(), "version": __version__, "socket": str(self.socket_path),
                "manager": self.service.manager, "activated": self.listen_socket is not None,
            }},
        )

    def _leave_pointer(self) -> None:
        """Say where this daemon serves in ``~/.atomic/runtime-dir``, for clients whose environment
        names no runtime dir (``atomictools._paths``)."""
        try:
            write_pointer(str(self.paths.runtime_dir))
        except OSError as exc:
            log.warning("could not leave the runtime dir's pointer in ~/.atomic (%s): a client started "
                        "without XDG_RUNTIME_DIR may not find this daemon", exc.strerror)

    def _adopt(self, sock: socket.socket) -> socket.socket:
        self.socket_path = adopt_socket(sock, self.paths.socket)
        return sock

    def _bind(self) -> socket.socket:
        sock, self._socket_ino = bind_socket(self.paths.socket, self.paths.lock)
        return sock

    async def main_loop(self) -> None:
        assert self._stop is not None
        await self._stop.wait()
        log.info(
            "stopping (%s)", self._stop_reason,
            extra={"event": "daemon.stop", "data": {"reason": self._stop_reason, "uptime": round(time.time() - self.started, 3)}},
        )

    async def shutdown(self) -> None:
        self.lifecycle("stopping", self._stop_reason)
        if self._reload_task is not None:
            self._reload_task.cancel()
        if self._listener is not None:
            self._listener.close()
        self._housekeeping.cancel()
        self._guard.cancel()
        self.registry.close()
        deadline = time.monotonic() + self.config.shutdown_grace
        while self.pool.inflight() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        if self.pool.inflight():
            log.warning("stopping with %d calls still running", self.pool.inflight())
        for session in list(self.sessions):
            session.output.close()
        for component in reversed(self.components):
            try:
                await component.stop()
            except Exception:  # one component's failure must not keep the rest from stopping
                log.exception("stopping %s failed", type(component).__name__)
        await self.pool.close()
        self._remove_socket()
        self._lock.release()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.remove_signal_handler(sig)
        log.info("stopped")

    def _remove_socket(self) -> None:
        if self._socket_ino is None:  # adopted: the service manager's file, not ours
            return
        try:
            if os.stat(self.paths.socket).st_ino == self._socket_ino:
                self.paths.socket.unlink()
        except FileNotFoundError:
            pass

    def request_stop(self, reason: str) -> None:
        self._stop_reason = reason
        if self._stop is not None:
            self._stop.set()

    def lifecycle(self, event: str, detail: str = "") -> None:
        """Tell the lifecycle hooks (service glue) that the daemon is ready, reloading, … stopping."""
        for hook in list(self.lifecycle_hooks):
            try:
                hook(event, detail)
            except Exception:  # a hook's bug must not stop the daemon's lifecycle
                log.exception("lifecycle hook failed on %s", event)

    def request_reload(self) -> None:
        """Reload the configuration and rescan every tools dir (once more if asked again meanwhile)."""
        if self._reload_task is not None and not self._reload_task.done():
            self._reload_again = True
            return
        self._reload_task = asyncio.get_running_loop().create_task(self._reload())

    async def _reload(self) -> None:
        while True:
            self._reload_again = False
            try:
                await reload(self)
            except Exception:
                log.exception("reload failed")
            if not self._reload_again:
                return

    def _on_signal(self, name: str) -> None:
        if name == "SIGHUP":
            self.request_reload()
            return
        if name == "SIGINT":
            self._sigints += 1
            if self._sigints > 1:
                self._force_exit()
        self.request_stop(name)

    def _force_exit(self) -> None:
        for spawner in self.pool.spawners():
            pid = spawner.pid
            if pid is not None:
                os.kill(pid, signal.SIGTERM)  # the fork server kills every worker group, then exits
        self._remove_socket()
        os._exit(130)

    async def _housekeep(self) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, remove_old_spills, str(self.paths.spill_dir), self.config.spill_max_age)

    async def _check_files(self) -> None:
        """Put back a deleted socket or lock file; stop when another daemon or program took the path."""
        if self._stop is not None and self._stop.is_set():
            return
        if not self._lock.held():
            try:
                self._lock.retake()
            except AlreadyRunning as exc:
                self.request_stop(f"{self.paths.lock} was deleted and another daemon (pid {exc.pid}) now holds it")
                return
            log.warning("%s was deleted; locked it again", self.paths.lock)
        path = self.paths.socket
        try:
            ino: int | None = os.lstat(path).st_ino
        except FileNotFoundError:
            ino = None
        if ino == self._socket_ino:
            return
        if ino is not None and listener_pid(path) is not False:
            self.request_stop(f"{path} was replaced by a socket another process serves")
            return
        try:
            check_private_dir(self.paths.runtime_dir)
            sock = self._bind()
            listener = await asyncio.get_running_loop().create_unix_server(lambda: Connection(self), sock=sock, backlog=512)
        except (OSError, PathError) as exc:
            self.request_stop(f"{path} was deleted and cannot be made again: {exc}")
            return
        old, self._listener = self._listener, listener
        if old is not None:
            old.close()  # its file is gone: nobody can reach it; open connections stay
        log.warning(
            "%s was deleted or replaced; listening on a new one", path,
            extra={"event": "daemon.rebind", "data": {"socket": str(path)}},
        )

    # -- sessions -------------------------------------------------------------------------------

    def connection_limit(self) -> tuple[int, int]:
        """(socket connections allowed now, the open-file soft limit): the limit is read each time,
        as ``prlimit`` may change it while the daemon runs."""
        budget, soft = self._descriptor_budget()
        return min(self.config.max_connections, budget), soft

    def _descriptor_budget(self) -> tuple[int, int]:
        """(descriptors the socket's clients may hold now, the open-file soft limit)."""
        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY:
            return sys.maxsize, soft
        budget = max(0, soft - fd_reserve(soft))
        return budget - (http_share(budget) if self.config.http else 0), soft

    def http_connection_limit(self) -> int:
        """HTTP connections allowed now (open ones, before and after their token), their own share."""
        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY:
            return self.config.max_connections
        return min(self.config.max_connections, http_share(max(0, soft - fd_reserve(soft))))

    def accept(self, session: Session, transport: asyncio.BaseTransport | None) -> bool:
        sock = transport.get_extra_info("socket") if transport is not None else None
        try:
            # None: a session another transport carries (HTTP), which checked its client itself.
            pid, uid = peer_credentials(sock) if sock is not None else (None, None)
        except OSError:
            pid, uid = None, None
        if uid is not None and uid != os.geteuid():
            log.warning("refused a connection from uid %s (pid %s): only uid %d may connect", uid, pid, os.geteuid())
            return False
        if sock is not None:
            allowed, soft = self.connection_limit()
            if len(self._socket_sessions) >= allowed or self._descriptors_held() >= self._descriptor_budget()[0]:
                self._refuse(transport, allowed, soft)
                return False
            self._socket_sessions.add(session)
        session.peer_pid = pid
        self.sessions.add(session)
        return True

    def _refuse(self, transport: asyncio.BaseTransport, allowed: int, soft: int) -> None:
        """Tell a connection past the limit why it is closed (rather than a reset it cannot explain)."""
        lent = f" and {http_share(max(0, soft - fd_reserve(soft)))} for HTTP" if self.config.http else ""
        message = (
            f"Too many connections: {len(self._socket_sessions)} are open, holding up to {self._descriptors_held()} "
            f"descriptors (a shim that handed over its stdin and stdout up to five), and the daemon takes {allowed} "
            f"(max_connections {self.config.max_connections}; open-file limit {soft}, of which "
            f"{fd_reserve(soft)} are kept for workers{lent}). Close idle clients, or raise "
            f"ATOMICTOOLS_MAX_CONNECTIONS or the open-file limit (ulimit -n) and restart the daemon"
        )
        error = {"jsonrpc": "2.0", "id": None, "error": {"code": TOO_MANY_CONNECTIONS, "message": message}}
        transport.write(msgspec.json.encode(error) + b"\n")  # type: ignore[attr-defined]
        self._refused += 1
        now = time.monotonic()
        if now - self._refused_logged >= 10.0:  # a flood is one warning every 10 s, not one per connection
            log.warning("refused %d connection(s): %s", self._refused, message)
            self._refused, self._refused_logged = 0, now

    def forget(self, session: Session) -> None:
        self.sessions.discard(session)
        self._socket_sessions.discard(session)
        self._stdio_sessions.discard(session)

    def _descriptors_held(self) -> int:
        """Descriptors the socket sessions hold, at most: one each, and for a shim's stdin and stdout
        four more (each, and for a socket a copy kept to put its flags back)."""
        return len(self._socket_sessions) + STDIO_DESCRIPTORS * len(self._stdio_sessions)

    def reserve_stdio(self, session: Session) -> str | None:
        """Count a shim's stdin and stdout for ``session`` (``STDIO_DESCRIPTORS`` more of the budget),
        or say why not: the budget has no room for them."""
        budget, soft = self._descriptor_budget()
        if session not in self._stdio_sessions and self._descriptors_held() + STDIO_DESCRIPTORS >= budget:
            # Not the last ones: a connection to come would find none left and be refused.
            return f"the daemon's clients hold nearly all the descriptors it has for them (open-file limit {soft})"
        self._stdio_sessions.add(session)
        return None

    def release_stdio(self, session: Session) -> None:
        """``session`` did not take the stdin and stdout it reserved room for."""
        self._stdio_sessions.discard(session)

    def _on_change(self, change: Change) -> None:
        """Tell every session that sees a changed dir: a new toolset, and any load errors."""
        for session in list(self.sessions):
            if not session.wants_notifications():
                continue
            if not any(session.project.sees(d) for d in change.dirs):
                continue
            for module in change.failures:
                if not session.project.sees(module.tools_dir):
                    continue
                for entry in module.error_entries():
                    where = f"{entry['file']}:{entry['line']}" if entry["line"] else entry["file"]
                    if entry.get("tool"):
                        what = f"skipped tool {entry['tool']!r} in {where}"
                    else:
                        what = f"cannot load {where}" if module.state == "failed" else where
                    session.log_message("error", {**entry, "message": f"{what}: {entry['message']}"})
            if session.toolset_changed():
                session.send_notification("notifications/tools/list_changed")

    # -- status ---------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        registry = self.registry.info()
        events = self.pool.events
        status = {
            "pid": os.getpid(),
            "version": __version__,
            "python": sys.executable,
            "started": self.started,
            "uptime": round(time.time() - self.started, 3),
            "socket": str(self.socket_path),
            "service": {**self.service.info(), "activated": self.listen_socket is not None},
            "forkserver": self.pool.spawner.info(),
            "confinedForkservers": self.pool.confined_info(),
            "workerSlots": self.pool.slots.info(),
            "sessions": [s.info() for s in self.sessions],
            "projects": registry["projects"],
            "modules": _with_rss(registry["modules"]),
            "skipped": registry["skipped"],
            "config": {item["key"]: item["value"] for item in self.config.describe()},
            "configSources": dict(self.config.sources),
            "configIgnored": dict(self.config.ignored),
            "configFile": str(self.paths.config_file),
            "log": {"file": str(events.path) if events.path else None, "level": self.config.log_level,
                    "written": events.written, "dropped": events.dropped},
            **{name: section() for name, section in self.status_sections.items()},
        }
        return status


def _with_rss(modules: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each module's worker resident memory in bytes (None without a worker)."""
    import psutil  # lazy: only when status is asked for

    for module in modules:
        rss = None
        if module.get("worker"):
            try:
                rss = psutil.Process(module["worker"]).memory_info().rss
            except (psutil.Error, OSError):
                rss = None
        module["rss"] = rss
    return modules


def _report_ready(fd: int | None, line: str) -> None:
    if fd is None:
        return
    try:
        os.write(fd, line.encode() + b"\n")
    except OSError:
        pass
    finally:
        try:
            os.close(fd)
        except OSError:
            pass
