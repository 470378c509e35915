"""The daemon's lifecycle: ``startup()`` → ``main_loop()`` → ``shutdown()``.

Startup verifies the runtime dir (owned by this user, mode 0700), takes the single-instance lock
before touching the socket (asyncio and uvloop silently delete an existing socket file when they
bind), replaces a stale socket left by a killed daemon (one that refuses connections; a socket some
other process serves is left alone), binds with mode 0600, and reports readiness. Under socket
activation it serves on the socket the service manager passed (``listen_socket``) and never unlinks
it. Every connection is checked for the peer's uid, and counted: past ``max_connections``, or when
fewer file descriptors would be left than workers need (``fd_reserve``), a new connection gets one
error line and is closed. Once a second the daemon checks that the socket file and the lock file at
their paths are still its own (a cleaner or a user may delete them): it binds a fresh socket, or
takes the lock again, and when another daemon has taken over meanwhile it stops. Shutdown stops accepting, lets calls in flight
finish (bounded by ``shutdown_grace``), stops every worker, and removes the socket and lock files.

Signal handlers only record the signal; the main loop acts on it. A second SIGINT forces the exit.
SIGHUP reloads the configuration and rescans every tools dir (``reconfigure``); connections stay.

Extension points: ``components`` (started once the socket serves, stopped after calls drain),
``methods`` (extra JSON-RPC methods), ``lifecycle_hooks`` (told ``ready``, ``reloading``,
``reloaded``, ``stopping``) and ``status_sections`` (extra keys of ``atomic/status``, e.g. bridges).
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import logging
import os
import resource
import signal
import socket
import stat
import struct
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from atomictoolsd import __version__
from atomictoolsd.builtins import BUILTIN_DIR
from atomictoolsd.config import Config
from atomictoolsd.confinement import judge
from atomictoolsd.defcache import DefinitionCache
from atomictoolsd.eventlog import events
from atomictoolsd.idle_projects import ProjectReaper
from atomictoolsd.paths import PathError, Paths, check_private_dir, check_socket_path
from atomictoolsd.registry import Change, Registry, ToolsDir
from atomictoolsd.service.manager import ServiceContext
from atomictoolsd.session import Session
from atomictoolsd.trust import TrustService, TrustStore
from atomictoolsd.watcher import FileWatcher
from atomictoolsd.workers.monitor import WorkerMonitor
from atomictoolsd.workers.pool import PoolSettings, WorkerPool
from atomictoolsd.workers.truncate import remove_old_spills

if TYPE_CHECKING:
    from atomictoolsd.session import Handler

__all__ = ["AlreadyRunning", "Component", "Server", "fd_reserve", "peer_credentials"]

log = logging.getLogger("atomictoolsd")

# JSON-RPC's range for errors a server defines: this one refuses a connection past the limit.
TOO_MANY_CONNECTIONS = -32000
_GUARD_INTERVAL = 1.0  # seconds between checks that the socket and lock files are still ours


def fd_reserve(soft_limit: int) -> int:
    """File descriptors kept from connections for workers' channels, the fork server and own files."""
    return max(128, soft_limit // 4)


class AlreadyRunning(Exception):
    """Another daemon holds the instance lock."""

    def __init__(self, pid: int | None) -> None:
        super().__init__(f"atomictoolsd is already running (pid {pid})" if pid else "atomictoolsd is already running")
        self.pid = pid


def peer_credentials(sock: Any) -> tuple[int | None, int | None]:
    """The (pid, uid) of the process at the other end of a Unix socket, where the OS tells."""
    if hasattr(socket, "SO_PEERCRED"):
        pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
        return pid, uid
    if sys.platform == "darwin":
        # LOCAL_PEERCRED (1) at SOL_LOCAL (0) gives a struct xucred: version, uid, ngroups, groups.
        data = sock.getsockopt(0, 0x001, struct.calcsize("IIh16I"))
        _version, uid = struct.unpack_from("II", data)
        pid_data = sock.getsockopt(0, 0x002, 4)  # LOCAL_PEERPID
        return struct.unpack("i", pid_data)[0], uid
    return None, None


class InstanceLock:
    """``flock`` on a pid file in the runtime dir, held for the daemon's life."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or raise ``AlreadyRunning`` with the holder's pid."""
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                os.close(fd)
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise AlreadyRunning(self.read_pid()) from None
                raise
            # The previous holder may have unlinked the file between our open and our lock.
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self.fd = fd

    def read_pid(self) -> int | None:
        try:
            text = self.path.read_text().strip()
        except OSError:
            return None
        return int(text) if text.isdigit() else None

    def held(self) -> bool:
        """Whether the file at the lock's path is still the one this daemon locked (not deleted)."""
        if self.fd is None:
            return False
        try:
            return os.fstat(self.fd).st_ino == os.stat(self.path).st_ino
        except OSError:
            return False

    def retake(self) -> None:
        """Lock a new file at the path after ours was deleted; ``AlreadyRunning`` if another took it."""
        old = self.fd
        self.fd = None
        try:
            self.acquire()
        except BaseException:
            self.fd = old
            raise
        if old is not None:
            os.close(old)

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            self.path.unlink()  # while still locked: a newcomer then locks a fresh file
        except FileNotFoundError:
            pass
        os.close(self.fd)
        self.fd = None


class Component(Protocol):
    """A part of the daemon with a lifetime of its own (file watcher, bridges, service glue, …).

    Started in order once the socket serves and stopped in reverse order during shutdown, after
    calls in flight have drained. A component may add JSON-RPC methods to ``server.methods``, a
    section to ``server.status_sections``, and a ``reconfigure(config)`` method that SIGHUP calls
    with the reloaded configuration.
    """

    async def start(self, server: Server) -> None: ...

    async def stop(self) -> None: ...


class Server:
    """The daemon: socket, sessions, registry and workers."""

    def __init__(self, paths: Paths, config: Config) -> None:
        self.paths = paths
        self.config = config
        self.pool = WorkerPool(
            PoolSettings(
                threads=config.worker_threads,
                memory_limit=config.memory_limit_mb * 1024 * 1024,
                truncate_lines=config.truncate_lines,
                truncate_bytes=config.truncate_bytes,
                spill_dir=str(paths.spill_dir),
                cancel_grace=config.cancel_grace,
                load_timeout=config.load_timeout,
                max_result_bytes=config.max_message_bytes,
            )
        )
        self.trust = TrustStore(paths.state_dir)
        self.registry = Registry(
            self.pool,
            paths.home,
            builtin_dirs=[ToolsDir(BUILTIN_DIR, "builtin", _worker_cwd(paths.home))] if config.builtins else [],
            # self.config, not config: SIGHUP may replace it, trust_all included.
            trusted=lambda root: self.config.trust_all or self.trust.is_trusted(root),
            judge=lambda tools_dir: judge(tools_dir, self.config, self.trust, paths.home),
            cache=DefinitionCache(paths.cache_dir / "definitions"),
            load_wait=config.load_wait,
        )
        self.registry.add_listener(self._on_change)
        self.sessions: set[Session] = set()
        self.started = time.time()
        self._lock = InstanceLock(paths.lock)
        self._listener: asyncio.AbstractServer | None = None
        self._socket_ino: int | None = None
        self._stop: asyncio.Event | None = None
        self._stop_reason = ""
        self._sigints = 0
        self._housekeeping: asyncio.Task[None] | None = None
        self._guard: asyncio.Task[None] | None = None
        self._refused = 0  # connections refused for the limit since it was last logged
        self._refused_logged = 0.0
        self.methods: dict[str, Handler] = {}  # JSON-RPC methods added by components
        self.components: list[Component] = [TrustService()]
        # (event, detail) with event in ready, reloading, reloaded, stopping: service glue listens.
        self.lifecycle_hooks: list[Callable[[str, str], None]] = []
        # Extra keys of atomic/status, each computed when asked (bridges, …).
        self.status_sections: dict[str, Callable[[], Any]] = {}
        self.service = ServiceContext()  # what the service manager told us (set before serve())
        self.listen_socket: socket.socket | None = None  # passed by the service manager: adopt it
        self.socket_path = paths.socket
        self._reload_task: asyncio.Task[None] | None = None
        self._reload_again = False
        self.watcher = FileWatcher()
        self.monitor = WorkerMonitor()
        self.components += [self.watcher, self.monitor, ProjectReaper()]
        self.status_sections["watcher"] = self.watcher.info
        self.status_sections["sandbox"] = _sandbox_support
        self.status_sections["monitor"] = self.monitor.info
        if self.registry.cache is not None:
            self.status_sections["cache"] = self.registry.cache.info

    # -- lifecycle ------------------------------------------------------------------------------

    async def serve(self, ready_fd: int | None = None) -> None:
        """Run until stopped. Raises ``AlreadyRunning`` or ``PathError`` before serving."""
        try:
            await self.startup()
        except AlreadyRunning as exc:
            # Report only once the holder serves, so that a racing `start` returns to a usable socket.
            pid = _wait_until_served(self.paths.socket, self._lock, 10.0) or exc.pid
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
            self._listener = await loop.create_unix_server(lambda: Session(self), sock=sock, backlog=512)
        except BaseException:
            self._lock.release()
            raise
        for sig, name in ((signal.SIGTERM, "SIGTERM"), (signal.SIGINT, "SIGINT"), (signal.SIGHUP, "SIGHUP")):
            loop.add_signal_handler(sig, self._on_signal, name)
        self.registry.ensure_scanned(self.registry.global_dir)
        for tools_dir in self.registry.builtin_dirs:
            self.registry.ensure_scanned(tools_dir)
        self._housekeeping = loop.create_task(self._housekeep())
        if self._socket_ino is not None:  # an adopted socket is the service manager's to keep
            self._guard = loop.create_task(self._guard_files())
        for component in self.components:
            await component.start(self)
        log.info(
            "atomictoolsd %s serving on %s (pid %d)", __version__, self.socket_path, os.getpid(),
            extra={"event": "daemon.start", "data": {
                "pid": os.getpid(), "version": __version__, "socket": str(self.socket_path),
                "manager": self.service.manager, "activated": self.listen_socket is not None,
            }},
        )

    def _adopt(self, sock: socket.socket) -> socket.socket:
        """Serve on the service manager's socket; it owns the file, so it is never unlinked here."""
        name = sock.getsockname()
        if isinstance(name, str) and name:
            self.socket_path = Path(name)
            if self.socket_path != self.paths.socket:
                log.warning(
                    "the service manager's socket is %s, but clients look for %s: set ATOMICTOOLS_SOCKET",
                    name, self.paths.socket,
                )
        return sock

    def _bind(self) -> socket.socket:
        path = self.paths.socket
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            pass
        else:
            if not stat.S_ISSOCK(info.st_mode):
                raise PathError(f"{path} exists and is not a socket; remove it")
            holder = _listener_pid(path)
            if holder is not False:
                # Someone serves it without holding our lock: not a daemon of ours (a service
                # manager's socket, another program). Never take it over.
                who = f" (pid {holder})" if holder else ""
                raise PathError(
                    f"{path} is served by another process{who} that does not hold {self.paths.lock}; "
                    f"stop it (if it is a systemd socket unit: systemctl --user stop atomictoolsd.socket) "
                    f"or set ATOMICTOOLS_SOCKET to another path"
                )
            path.unlink()  # we hold the lock and nothing answers: a killed daemon's socket
            log.info("removed the stale socket of a previous daemon")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)  # created 0600: never a moment when others could connect
        try:
            sock.bind(str(path))
        finally:
            os.umask(old_umask)
        self._socket_ino = os.stat(path).st_ino
        sock.setblocking(False)
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
        if self._housekeeping is not None:
            self._housekeeping.cancel()
        if self._guard is not None:
            self._guard.cancel()
        deadline = time.monotonic() + self.config.shutdown_grace
        while self.pool.inflight() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        if self.pool.inflight():
            log.warning("stopping with %d calls still running", self.pool.inflight())
        for session in list(self.sessions):
            if session.transport is not None:
                session.transport.close()
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
        from atomictoolsd.reconfigure import reload

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
        pid = self.pool.spawner.pid
        if pid is not None:
            os.kill(pid, signal.SIGTERM)  # the fork server kills every worker group, then exits
        self._remove_socket()
        os._exit(130)

    async def _housekeep(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await loop.run_in_executor(None, remove_old_spills, str(self.paths.spill_dir), self.config.spill_max_age)
            await asyncio.sleep(min(3600.0, max(60.0, self.config.spill_max_age / 4)))

    async def _guard_files(self) -> None:
        while True:
            await asyncio.sleep(_GUARD_INTERVAL)
            try:
                await self._check_files()
            except Exception:  # a failed check is tried again next time; the daemon serves on
                log.exception("checking the socket and lock files failed")

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
        if ino is not None and _listener_pid(path) is not False:
            self.request_stop(f"{path} was replaced by a socket another process serves")
            return
        try:
            check_private_dir(self.paths.runtime_dir)
            sock = self._bind()
            listener = await asyncio.get_running_loop().create_unix_server(lambda: Session(self), sock=sock, backlog=512)
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
        """(connections allowed now, the open-file soft limit): the limit is read each time, as
        ``prlimit`` may change it while the daemon runs."""
        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY:
            return self.config.max_connections, soft
        return min(self.config.max_connections, max(0, soft - fd_reserve(soft))), soft

    def accept(self, session: Session, transport: asyncio.BaseTransport) -> bool:
        sock = transport.get_extra_info("socket")
        try:
            pid, uid = peer_credentials(sock)
        except OSError:
            pid, uid = None, None
        if uid is not None and uid != os.geteuid():
            log.warning("refused a connection from uid %s (pid %s): only uid %d may connect", uid, pid, os.geteuid())
            return False
        allowed, soft = self.connection_limit()
        if len(self.sessions) >= allowed:
            self._refuse(transport, allowed, soft)
            return False
        session.peer_pid = pid
        self.sessions.add(session)
        return True

    def _refuse(self, transport: asyncio.BaseTransport, allowed: int, soft: int) -> None:
        """Tell a connection past the limit why it is closed (rather than a reset it cannot explain)."""
        message = (
            f"Too many connections: {len(self.sessions)} are open and the daemon takes {allowed} "
            f"(max_connections {self.config.max_connections}; open-file limit {soft}, of which "
            f"{fd_reserve(soft)} are kept for workers). Close idle clients, or raise "
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
        return {
            "pid": os.getpid(),
            "version": __version__,
            "python": sys.executable,
            "started": self.started,
            "uptime": round(time.time() - self.started, 3),
            "socket": str(self.socket_path),
            "service": {**self.service.info(), "activated": self.listen_socket is not None},
            "forkserver": self.pool.spawner.info(),
            "sessions": [s.info() for s in self.sessions],
            "projects": registry["projects"],
            "modules": _with_rss(registry["modules"]),
            "skipped": registry["skipped"],
            "config": {item["key"]: item["value"] for item in self.config.describe()},
            "config_sources": dict(self.config.sources),
            "config_file": str(self.paths.config_file),
            "log": {"file": str(events.path) if events.path else None, "level": self.config.log_level,
                    "written": events.written, "dropped": events.dropped},
            **{name: section() for name, section in self.status_sections.items()},
        }


def _sandbox_support() -> dict[str, Any]:
    from atomictoolsd.workers.sandbox import support  # ctypes: only when someone asks

    return support()


def _worker_cwd(home: Path) -> Path:
    """Where the built-ins' workers run: the home directory, unless its path is not UTF-8 and so could
    not reach the fork server (the built-ins work on the directory each call names, never on their cwd)."""
    try:
        str(home).encode()
    except UnicodeEncodeError:
        return Path("/")
    return home


def _with_rss(modules: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each module's worker resident memory in bytes (None without a worker)."""
    import psutil  # only when status is asked for

    for module in modules:
        rss = None
        if module.get("worker"):
            try:
                rss = psutil.Process(module["worker"]).memory_info().rss
            except (psutil.Error, OSError):
                rss = None
        module["rss"] = rss
    return modules


def _wait_until_served(path: Path, lock: InstanceLock, timeout: float) -> int | None:
    """Wait (blocking: nothing else runs yet) until the lock holder serves; return its pid."""
    deadline = time.monotonic() + timeout
    while _listener_pid(path) is False and time.monotonic() < deadline:
        time.sleep(0.01)
    return lock.read_pid()


def _listener_pid(path: Path) -> int | None | bool:
    """False when nothing accepts connections on ``path``; else the listener's pid (None if unknown)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        return False
    except OSError:
        return None  # a full backlog or a timeout: alive but busy
    try:
        return peer_credentials(probe)[0]
    except OSError:
        return None
    finally:
        probe.close()


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
