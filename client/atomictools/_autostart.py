"""Start the daemon in the background and wait until it serves.

Used by ``atomictoolsd start``, by ``Client`` when no daemon answers, and by the stdio shim. Standard
library only (the shim imports this).

The daemon is started in a new session (``setsid``): MCP clients kill their server's whole process
group on shutdown, and that must not take a shared daemon down with one agent. It then forks once
more so it is nobody's child, and reports on a pipe when its socket is listening; that readiness pipe
replaces polling, and an EOF without a report means it failed to start (its stderr says why).

Its stderr is ``atomictoolsd.stderr`` in the runtime dir: what the daemon says before its event log
opens, its warnings, a crash's traceback. What tools print goes to the event log instead. The file
is rotated to ``atomictoolsd.stderr.1`` when a daemon starts and it is past ``STDERR_MAX_BYTES``, so
it never grows across many daemons' lives (the runtime dir is often in memory).

The daemon is started sealed (``_launch``): ``-P``, from ``/``, without the starter's ``PYTHON*``
variables. The starter is often an agent sitting in a repository nobody has vetted, and the daemon is
shared by every project: nothing of that repository may be imported into it.
"""

from __future__ import annotations

import os
import select
import subprocess
import time

from atomictools._errors import ConnectError
from atomictools._launch import SEALED_CWD, python_command, sealed_environ
from atomictools._paths import RuntimeDirError, check_locations, project_free_path, runtime_dir

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = ["STDERR_MAX_BYTES", "STDERR_NAME", "start_daemon"]

STDERR_NAME = "atomictoolsd.stderr"
STDERR_MAX_BYTES = 1 << 20


def _private_dir(path: str) -> None:
    os.makedirs(path, mode=0o700, exist_ok=True)


def start_daemon(timeout: float = 15.0, extra_args: tuple[str, ...] = (),
                 anchors: Iterable[str] | None = None) -> tuple[str, int]:
    """Start a detached daemon and wait for it to listen.

    The daemon runs from ``/`` with this process's environment, so the variables that place its
    files are checked here first (``_paths.check_locations``), against the projects of ``anchors``
    (default: the working directory): where the starter is, not where the daemon runs. Its ``PATH``
    leaves out the directories inside those projects (``_paths.project_free_path``), and its stderr
    says which.

    Returns:
        ``("started", pid)`` when this call started it, ``("running", pid)`` when another daemon
        already held the instance lock.

    Raises:
        ConnectError: the daemon exited or did not report within ``timeout``; the message carries
            the end of its stderr. Or a variable that places its files was refused: then none started.
    """
    anchors = None if anchors is None else list(anchors)
    try:
        check_locations(anchors=anchors)
        rundir = runtime_dir(anchors)
    except RuntimeDirError as exc:
        raise ConnectError(f"the daemon was not started: {exc}") from None
    _private_dir(rundir)
    stderr_path = os.path.join(rundir, STDERR_NAME)
    _rotate_if_large(stderr_path)
    environ = sealed_environ()
    _leave_project_path_out(environ, anchors, stderr_path)
    try:
        written_before = os.stat(stderr_path).st_size  # what earlier daemons said is not this one's cause
    except OSError:
        written_before = 0
    read_fd, write_fd = os.pipe()
    try:
        with open(os.open(stderr_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab") as stderr:
            proc = subprocess.Popen(
                python_command("atomictoolsd", "serve", "--detach", "--ready-fd", str(write_fd), *extra_args),
                cwd=SEALED_CWD,
                env=environ,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                pass_fds=(write_fd,),
                start_new_session=True,
                close_fds=True,
            )
        os.close(write_fd)
        write_fd = -1
        line = _read_line(read_fd, timeout)
        proc.wait(timeout=5)  # the first process exits at once after forking the daemon
    finally:
        os.close(read_fd)
        if write_fd >= 0:
            os.close(write_fd)
    words = line.split()
    if len(words) == 2 and words[0] in ("started", "running") and words[1].isdigit():
        return words[0], int(words[1])
    raise ConnectError(f"the daemon did not start: {_cause(stderr_path, written_before, line)} (its stderr: {stderr_path})")


def _leave_project_path_out(environ: dict[str, str], anchors: list[str] | None, stderr_path: str) -> None:
    """Take the entries inside the starter's projects out of ``environ``'s ``PATH``, and say which
    in the daemon's stderr (before this start's own words, which a failure is read from)."""
    if "PATH" not in environ:
        return
    environ["PATH"], left_out = project_free_path(environ["PATH"], anchors)
    if left_out:
        with open(os.open(stderr_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "a", errors="replace") as stderr:
            stderr.write(f"PATH entries inside the project are left out of the daemon's PATH (a repository may fill "
                         f"them): {ascii(os.pathsep.join(left_out))[1:-1]}\n")


def _rotate_if_large(path: str) -> None:
    try:
        if os.stat(path).st_size > STDERR_MAX_BYTES:
            os.replace(path, path + ".1")
    except OSError:
        pass  # none yet, or another starter rotated it first


def _read_line(fd: int, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    data = b""
    while b"\n" not in data:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        ready, _, _ = select.select([fd], [], [], remaining)
        if not ready:
            break
        chunk = os.read(fd, 256)
        if not chunk:
            break
        data += chunk
    return data.decode(errors="replace").strip()


def _cause(path: str, offset: int, report: str) -> str:
    """One line that says why this start failed: the daemon's own ``atomictoolsd: …`` message, else
    the last line it wrote (a traceback's exception), else what its readiness pipe said."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            lines = [ln.strip() for ln in f.read(1 << 16).decode(errors="replace").splitlines() if ln.strip()]
    except OSError:
        lines = []
    said = [ln for ln in lines if ln.startswith("atomictoolsd: ")]
    if said:
        return said[-1].removeprefix("atomictoolsd: ")
    if lines:
        return lines[-1]
    return f"it reported {report!r}" if report else "it exited without a word"
