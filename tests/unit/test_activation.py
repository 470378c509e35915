"""What the service manager passes: variables read and scrubbed, sockets adopted (service.manager,
service.activation). The daemon under systemd-socket-activate is in tests/e2e/test_service.py."""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path

import pytest

from atomictoolsd.service.activation import (
    ActivationError,
    adopt,
    inherited_listener,
    launch_activate_socket,
    launchd_listener,
)
from atomictoolsd.service.manager import ServiceContext, capture


def test_capture_reads_and_removes_the_variables_meant_for_this_process() -> None:
    environ = {
        "NOTIFY_SOCKET": "@sd", "WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "42",
        "LISTEN_FDS": "1", "LISTEN_PID": "42", "LISTEN_FDNAMES": "atomictoolsd",
        "INVOCATION_ID": "abc", "PATH": "/bin",
    }
    context = capture(environ, pid=42)
    assert context.manager == "systemd"
    assert context.notify_socket == "@sd" and context.watchdog_usec == 2_000_000
    assert context.listen_fds == 1 and context.listen_fdnames == ("atomictoolsd",)
    assert environ == {"INVOCATION_ID": "abc", "PATH": "/bin"}, "children never see them"
    assert context.info()["watchdogSec"] == 2.0


def test_variables_meant_for_another_pid_are_ignored() -> None:
    environ = {"LISTEN_FDS": "1", "LISTEN_PID": "41", "WATCHDOG_USEC": "1000", "WATCHDOG_PID": "41"}
    context = capture(environ, pid=42)
    assert context.listen_fds == 0 and context.watchdog_usec is None
    assert context.manager == "none" and environ == {}


def test_nothing_passed_means_no_manager() -> None:
    assert capture({}, pid=1) == ServiceContext()


def listening_socket(tmp_path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(tmp_path / "s.sock"))
    sock.listen()
    return sock


def test_adopt_a_listening_unix_socket(tmp_path: Path) -> None:
    original = listening_socket(tmp_path)
    fd = os.dup(original.fileno())
    os.set_inheritable(fd, True)  # as a service manager passes it
    adopted = adopt(fd, "systemd")
    assert adopted.fileno() == fd and not os.get_inheritable(fd) and not adopted.getblocking()
    client = socket.socket(socket.AF_UNIX)
    client.connect(str(tmp_path / "s.sock"))  # the adopted socket is the same listener
    client.close()
    adopted.close()
    original.close()


@pytest.mark.parametrize("kind", ["udp", "unlistened", "closed"])
def test_adopt_refuses_what_cannot_serve(tmp_path: Path, kind: str) -> None:
    if kind == "udp":
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        fd, message = sock.fileno(), "AF_INET/SOCK_DGRAM"
    elif kind == "unlistened":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        fd, message = sock.fileno(), "not listening"
    else:
        sock = None
        fd = os.open(os.devnull, os.O_RDONLY)
        os.close(fd)
        message = "not a socket"
    with pytest.raises(ActivationError, match=message):
        adopt(fd, "systemd")
    if sock is not None:
        assert sock.fileno() == fd, "a refused descriptor is left open for its owner"
        sock.close()


def test_launchd_socket_is_adopted_when_launchd_offers_one(tmp_path: Path) -> None:
    # launchd does not run here: stand in for launch_activate_socket() with a real listening socket.
    original = listening_socket(tmp_path)
    fd = os.dup(original.fileno())
    asked: list[str] = []

    def activate(name: str) -> list[int]:
        asked.append(name)
        return [fd]

    adopted = launchd_listener(activate=activate)
    assert asked == ["Listeners"], "the name under Sockets in the plist"
    assert adopted is not None and adopted.getsockname() == str(tmp_path / "s.sock")
    adopted.close()
    original.close()


@pytest.mark.parametrize("code", [errno.ESRCH, errno.ENOENT, errno.ENOSYS])
def test_no_launchd_socket_means_binding_our_own(code: int) -> None:
    def activate(name: str) -> list[int]:
        raise OSError(code, os.strerror(code))

    assert launchd_listener(activate=activate) is None


def test_a_launchd_failure_is_a_clear_error() -> None:
    def activate(name: str) -> list[int]:
        raise OSError(errno.EPERM, os.strerror(errno.EPERM))

    with pytest.raises(ActivationError, match="launchd did not hand over socket 'Listeners'"):
        launchd_listener(activate=activate)


@pytest.mark.skipif(os.uname().sysname == "Darwin", reason="off macOS there is no launchd to ask")
def test_no_launchd_here() -> None:
    with pytest.raises(OSError) as caught:
        launch_activate_socket("Listeners")
    assert caught.value.errno == errno.ENOSYS
    assert launchd_listener() is None


def test_the_daemon_asks_launchd_only_when_launchd_started_it(tmp_path: Path) -> None:
    original = listening_socket(tmp_path)
    fd = os.dup(original.fileno())
    asked: list[str] = []

    def activate(name: str) -> list[int]:
        asked.append(name)
        return [fd]

    assert inherited_listener(ServiceContext(manager="none"), activate=activate) is None
    assert asked == []
    adopted = inherited_listener(ServiceContext(manager="launchd", unit="org.atomictools.atomictoolsd"), activate=activate)
    assert asked == ["Listeners"] and adopted is not None and adopted.fileno() == fd
    adopted.close()
    original.close()
