"""Which service manager started this daemon, read (and scrubbed) from the environment once, at start.

systemd tells a service about itself in variables: ``NOTIFY_SOCKET`` (where to send readiness),
``WATCHDOG_USEC``/``WATCHDOG_PID``, ``LISTEN_FDS``/``LISTEN_PID``/``LISTEN_FDNAMES`` (sockets it
passes), ``INVOCATION_ID``. They are meant for this process alone: a child that inherited them could
send notifications in our name or take the passed descriptors for its own. ``capture()`` reads them
and removes them from ``os.environ`` before the fork server or any worker starts.

launchd runs an agent with ``XPC_SERVICE_NAME`` set to the job's label.

Standard library only; nothing here acts on what it finds (``activation`` and ``notify`` do).
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["LAUNCHD_LABEL", "SYSTEMD_UNIT", "ServiceContext", "capture"]

LAUNCHD_LABEL = "org.atomictools.atomictoolsd"
SYSTEMD_UNIT = "atomictoolsd.service"

# Variables that belong to this process only (systemd's sd_notify / sd_listen_fds "unset_environment").
_PRIVATE = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES")

Manager = Literal["systemd", "launchd", "none"]


@dataclass(frozen=True)
class ServiceContext:
    """What the service manager told this process."""

    manager: Manager = "none"
    unit: str | None = None  # the systemd unit or the launchd label, when known
    notify_socket: str | None = None
    watchdog_usec: int | None = None  # only when the watchdog is meant for this pid
    listen_fds: int = 0  # sockets passed from fd 3 on, when meant for this pid
    listen_fdnames: tuple[str, ...] = field(default_factory=tuple)

    def info(self) -> dict[str, Any]:
        """For ``atomic/status``."""
        return {
            "manager": self.manager,
            "unit": self.unit,
            "notify": self.notify_socket is not None,
            "watchdogSec": self.watchdog_usec / 1e6 if self.watchdog_usec else None,
        }


def capture(environ: MutableMapping[str, str] | None = None, pid: int | None = None) -> ServiceContext:
    """Read what the service manager passed, and remove the variables meant for this process only."""
    environ = os.environ if environ is None else environ
    pid = os.getpid() if pid is None else pid
    values = {key: environ.pop(key) for key in _PRIVATE if key in environ}

    listen_fds = 0
    names: tuple[str, ...] = ()
    if _int(values.get("LISTEN_PID")) == pid:
        listen_fds = max(0, _int(values.get("LISTEN_FDS")) or 0)
        if values.get("LISTEN_FDNAMES"):
            names = tuple(values["LISTEN_FDNAMES"].split(":"))
    watchdog = _int(values.get("WATCHDOG_USEC"))
    watchdog_pid = _int(values.get("WATCHDOG_PID"))
    if watchdog is not None and (watchdog <= 0 or (watchdog_pid is not None and watchdog_pid != pid)):
        watchdog = None
    notify = values.get("NOTIFY_SOCKET") or None

    manager: Manager = "none"
    unit = None
    if environ.get("INVOCATION_ID") or notify or listen_fds:
        manager = "systemd"
        unit = _systemd_unit()
    elif sys.platform == "darwin" and environ.get("XPC_SERVICE_NAME") == LAUNCHD_LABEL:
        manager = "launchd"
        unit = LAUNCHD_LABEL
    return ServiceContext(
        manager=manager,
        unit=unit,
        notify_socket=notify,
        watchdog_usec=watchdog,
        listen_fds=listen_fds,
        listen_fdnames=names,
    )


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _systemd_unit() -> str | None:
    """The unit this process runs in, from its cgroup path (``…/atomictoolsd.service``)."""
    try:
        with open("/proc/self/cgroup") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    for line in lines:
        for part in reversed(line.rpartition(":")[2].split("/")):
            if part.endswith((".service", ".scope")):
                return part
    return None
