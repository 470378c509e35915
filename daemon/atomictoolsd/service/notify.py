"""systemd's readiness protocol, spoken directly: datagrams of ``KEY=value`` lines on ``NOTIFY_SOCKET``.

No libsystemd: the protocol is one ``sendto`` on a Unix datagram socket whose address is a path, or
an abstract name when it starts with ``@``. ``ServiceNotify`` is the daemon component that sends,
through the daemon's life:

- ``READY=1`` once the socket serves (``Type=notify`` units count as started only then);
- ``STATUS=…`` lines saying how many tools, modules, workers and sessions there are, when that changes;
- ``WATCHDOG=1`` every half ``WATCHDOG_USEC`` while the event loop runs (a stuck loop stops the
  pings, and systemd restarts the daemon);
- ``RELOADING=1`` (with ``MONOTONIC_USEC``) when SIGHUP starts a reload, and ``READY=1`` after it;
- ``STOPPING=1`` as soon as a shutdown starts.

A notification that cannot be delivered is dropped: the daemon serves the same without a manager.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from atomictoolsd.pool.pool import WorkerPool
    from atomictoolsd.registry.model import Change
    from atomictoolsd.registry.projects import Registry

__all__ = ["Notifier", "NotifyHost", "ServiceNotify", "status_line"]

log = logging.getLogger("atomictoolsd.service")

STATUS_INTERVAL = 5.0  # seconds between checks whether the status line changed


class Notifier:
    """A sender of sd_notify datagrams to one ``NOTIFY_SOCKET`` address."""

    def __init__(self, address: str) -> None:
        if address.startswith("@"):
            self.address = "\0" + address[1:]  # the abstract namespace (Linux)
        elif address.startswith("/"):
            self.address = address
        else:
            raise ValueError(f"NOTIFY_SOCKET={address!r} is neither a path nor an abstract '@' name")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.set_inheritable(False)
        self.sock.setblocking(False)
        self.sent: list[str] = []  # the last few messages, for status and debugging
        self.failures = 0

    def notify(self, *assignments: str) -> bool:
        """Send ``KEY=value`` assignments in one datagram; False when it could not be delivered."""
        message = "\n".join(assignments)
        try:
            self.sock.sendto(message.encode(), self.address)
        except OSError as exc:
            self.failures += 1
            log.debug("could not notify the service manager (%s): %s", message, exc)
            return False
        self.sent = [*self.sent[-9:], message]
        return True

    def close(self) -> None:
        self.sock.close()


class NotifyHost(Protocol):
    """What ``ServiceNotify`` is started with (the server meets it; see ``server/wiring.py``)."""

    registry: Registry
    pool: WorkerPool
    sessions: Collection[object]
    lifecycle_hooks: list[Callable[[str, str], None]]


def status_line(server: NotifyHost) -> str:
    """One line for ``systemctl status``: what the daemon serves right now."""
    modules = [m for d in server.registry.dirs.values() for m in d.modules.values()]
    tools = sum(len(m.tools) for m in modules)
    failed = sum(1 for m in modules if m.state == "failed")
    workers = sum(spawner.info()["workers"] for spawner in server.pool.spawners())
    text = (
        f"serving {tools} tool{'s' * (tools != 1)} from {len(modules)} module{'s' * (len(modules) != 1)}; "
        f"{workers} worker{'s' * (workers != 1)}; {len(server.sessions)} session{'s' * (len(server.sessions) != 1)}"
    )
    if failed:
        text += f"; {failed} module{'s' * (failed != 1)} failed to load"
    return text


class ServiceNotify:
    """The component that keeps systemd informed (added when ``NOTIFY_SOCKET`` is set)."""

    def __init__(self, notifier: Notifier, watchdog_usec: int | None = None) -> None:
        self.notifier = notifier
        self.watchdog_interval = watchdog_usec / 2e6 if watchdog_usec else None
        self.server: NotifyHost | None = None
        self._last_status = ""
        self._changed = asyncio.Event()  # the tools changed: a new status line is due soon
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False

    async def start(self, server: NotifyHost) -> None:
        self.server = server
        server.lifecycle_hooks.append(self.on_lifecycle)
        server.registry.add_listener(self._on_change)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        if self.server is not None:
            try:
                self.server.registry.remove_listener(self._on_change)
            except ValueError:
                pass
        self.notifier.close()

    def on_lifecycle(self, event: str, detail: str) -> None:
        if event == "ready":
            self.notifier.notify("READY=1")
            self.send_status()
            loop = asyncio.get_running_loop()
            if self.watchdog_interval:  # pings start once the service counts as started
                self._tasks.append(loop.create_task(self._watchdog(self.watchdog_interval)))
            self._tasks.append(loop.create_task(self._status_updates()))
        elif event == "reloading":
            monotonic_usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
            self.notifier.notify("RELOADING=1", f"MONOTONIC_USEC={monotonic_usec}", "STATUS=reloading")
        elif event == "reloaded":
            self.notifier.notify("READY=1")
            self.send_status(detail)
        elif event == "stopping":
            self._stopping = True
            self.notifier.notify("STOPPING=1", f"STATUS=stopping{': ' + detail if detail else ''}")

    def send_status(self, note: str = "") -> None:
        if self.server is None or self._stopping:
            return
        text = status_line(self.server) + (f" ({note})" if note else "")
        if text != self._last_status:
            self._last_status = text
            self.notifier.notify(f"STATUS={text}")

    def _on_change(self, change: Change) -> None:
        self._changed.set()

    async def _watchdog(self, interval: float) -> None:
        # Sent from the event loop itself: if the loop stops turning, the pings stop.
        while True:
            self.notifier.notify("WATCHDOG=1")
            await asyncio.sleep(interval)

    async def _status_updates(self) -> None:
        # A change of the tools is told within a moment (a burst of them in one line); workers and
        # sessions, which change all the time, at the next look, every few seconds.
        while True:
            try:
                await asyncio.wait_for(self._changed.wait(), STATUS_INTERVAL)
                await asyncio.sleep(0.2)
            except TimeoutError:
                pass
            self._changed.clear()
            self.send_status()
