"""The fork server: a small process with the worker runtime already imported, forking workers.

A cold ``python -c "import msgspec"`` costs ~26 ms; forking this process costs well under 1 ms. The
daemon's first fork server is a fork of the daemon made as it starts, which calls ``main`` (so it
and its workers share the daemon's code addresses); one that replaces it, and the one for confined
workers, is started as ``python -P -m atomictoolsd.worker.forkserver FD DAEMON_PID ALIVE_FD``
(sealed: see ``spawner``). The daemon talks to each over a datagram socket pair, so each request
arrives whole with its file descriptor:

daemon → fork server: a ``ForkServerRequest`` (``protocol.py``): ``Spawn``, carrying the worker's
channel socket, and for a confined worker allowed the network a second socket, on which that worker
hands the daemon its proxy listener (``netns``); ``Ping``, answered by a ``Pong``: the daemon's health
check. Anything else it receives is dropped, with the descriptors it carried.
fork server → daemon: a ``ForkServerMessage``: ``Ready`` once; ``Spawned`` with the worker's pid, or
``SpawnFailed`` when it could not fork (the process limit, memory: that request fails, nothing else);
``Exited`` for every worker that ends, since only a parent can reap.
The fork server's stdin is a pipe from the daemon: a datagram socket reports no EOF when its peer
goes, so end-of-file on stdin is how the fork server learns that the daemon closed it or died.
``ALIVE_FD`` is the write end of a pipe it keeps open and never writes to (its workers close it):
the daemon learns of its death from the end-of-file.

No orphans: each worker leads its own session and process group and gets SIGKILL when the fork
server dies (``PR_SET_PDEATHSIG``); the fork server gets SIGTERM when the daemon dies, and then kills
every worker with what it started. Where there is no ``PR_SET_PDEATHSIG`` (macOS), the closing
channels do the same job: a worker exits when its channel to the daemon closes.

What a tool starts dies with its worker, however it was started. Before a worker is reaped, its
process group and (on Linux) every process of its session are killed (``procgroups``): that reaches a
process in a group of its own, as the declarative ``shell`` handler makes. A process that left the
session too (``start_new_session=True``, ``setsid``, a daemonizing double fork) is reached on Linux
because the fork server and every worker are child subreapers (``PR_SET_CHILD_SUBREAPER``): once its
parent is gone it is adopted by its worker, and when that worker ends, by the fork server, which
kills whatever it adopted, each time a worker or an adopted process ends, and at shutdown until
nothing is left.

Reaping never holds the daemon's requests: the control socket is read first in each turn of the
loop, at most ``REAP_BATCH`` exits are handled between two looks at it, and an adopted process's end
costs a ``waitpid`` (a worker's, a look at every process for its session). Processes that fork and
exit as fast as they can, adopted here one after the other, cost this process time, never an answer.
"""

from __future__ import annotations

import _signal
import functools
import itertools
import os
import select
import signal
import socket
import sys
import tempfile
import time
from typing import Any, NoReturn

import msgspec

from atomictoolsd.protocol import (
    DaemonMessage,
    Exited,
    ForkServerMessage,
    ForkServerRequest,
    FrameReader,
    Ping,
    Pong,
    Ready,
    Spawn,
    Spawned,
    SpawnFailed,
)
from atomictoolsd.util.procgroups import kill_worker_processes
from atomictoolsd.util.procstat import PPID, proc_stat
from atomictoolsd.worker import main as runtime  # the point of this process: pay for the import once
from atomictoolsd.worker.removal import remove_tree
from atomictoolsd.worker.sourceload import SourceOnlyLoader

__all__ = [
    "FORKSERVER_NAME", "SPAWN_TIMES_ENV", "WORKER_NAME", "main", "set_child_subreaper", "set_parent_death_signal",
    "set_process_name",
]

# bench/spawn.py only: a file to which every worker appends what its start cost (``_time_workers``).
# Read once when the fork server starts and taken out of its environment; unset (always, but in the
# bench), nothing is timed and the workers run the very same code.
SPAWN_TIMES_ENV = "ATOMICTOOLS_SPAWN_TIMES"

_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(ForkServerRequest).decode

# Exited children reaped in one turn of the loop, between two looks at the daemon's requests.
REAP_BATCH = 32


def set_parent_death_signal(sig: int) -> bool:
    """Ask Linux to send ``sig`` to this process when its parent dies. False where unsupported."""
    return _prctl(1, sig)  # 1 = PR_SET_PDEATHSIG


def set_child_subreaper() -> bool:
    """Make this process adopt its orphaned descendants, as init would (Linux). False where unsupported."""
    return _prctl(36, 1)  # 36 = PR_SET_CHILD_SUBREAPER


# What ``ps -e``, ``top`` and psutil's ``name()`` show for these processes (at most 15 bytes). The
# first fork server is forked from the daemon, so its command line (and its workers') is the daemon's.
FORKSERVER_NAME = "atomictoolsd-fs"
WORKER_NAME = "atomictoolsd-wk"


def set_process_name(name: str) -> bool:
    """Name this process (Linux: ``PR_SET_NAME``). False where unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    return _libc().prctl(15, name.encode()[:15], 0, 0, 0) == 0  # 15 = PR_SET_NAME


@functools.cache
def _libc() -> Any:
    import ctypes  # lazy: loaded once in the fork server (its main() calls _prctl): every fork inherits it

    return ctypes.CDLL(None, use_errno=True)


def _prctl(option: int, value: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    return _libc().prctl(option, value, 0, 0, 0) == 0


class _Server:
    def __init__(self, control: socket.socket, alive_fd: int = -1) -> None:
        self.control = control
        self.alive_fd = alive_fd
        self.children: set[int] = set()
        self.temp_dirs: dict[int, str] = {}  # confined workers' private TMPDIRs, removed when they end
        self.spill_dirs: dict[int, str] = {}  # confined workers' own spill dirs, removed when they end empty
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        self.stopping = False

    def send(self, message: ForkServerMessage) -> None:
        try:
            self.control.send(_encode(message))
        except OSError:
            self.stopping = True  # the daemon is gone

    def run(self) -> NoReturn:
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes select through the wakeup fd
        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the daemon, which stops us
        self.send(Ready())
        more = False  # exited children may be left to reap: look again at once
        while not self.stopping:
            try:
                readable, _, _ = select.select([self.control, self.wake_r, 0], [], [], 0 if more else None)
            except InterruptedError:
                continue
            if 0 in readable and not os.read(0, 4096):
                self.stopping = True  # EOF on stdin: the daemon is gone
            if self.control in readable:
                self.handle_request()  # first: the daemon's requests never wait for reaping
            if self.wake_r in readable:
                os.read(self.wake_r, 4096)
                more = True
            if more:
                more = self.reap()
        self.shutdown()

    def _on_term(self, *_: Any) -> None:
        self.stopping = True

    def handle_request(self) -> None:
        try:
            data, fds, _, _ = socket.recv_fds(self.control, 1 << 16, 2)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data, fds = b"", []
        if not data:
            return
        try:
            message = _decode(data)
        except msgspec.DecodeError:
            message = None
        if isinstance(message, Spawn) and fds:
            self.spawn(message.request_id, message.spec, fds[0], *fds[1:2])
            return
        for fd in fds:
            os.close(fd)
        if isinstance(message, Ping):
            self.send(Pong(message.number))


    def spawn(self, request_id: int, spec_json: bytes, channel_fd: int, net_fd: int = -1) -> None:
        spec = None
        try:
            spec = msgspec.json.decode(spec_json, type=runtime.WorkerSpec)
            runtime.prepare(spec.kind)  # once per kind: its workers then fork with the loader imported
            if spec.sandbox is not None:
                spec = _prepare_confined(spec, net_fd)
            pid = os.fork()
        except Exception as exc:  # noqa: BLE001 - one worker that cannot start must cost no other
            _forget_prepared()
            os.close(channel_fd)
            _close_handoff(net_fd)
            if spec is not None and spec.temp_dir:
                remove_tree(spec.temp_dir)
            what = "cannot fork a worker process" if isinstance(exc, OSError) else "cannot start a worker"
            self.send(SpawnFailed(request_id, f"{what}: {exc}"))
            return
        if pid == 0:
            self._become_worker(channel_fd, spec)
        _forget_prepared()
        os.close(channel_fd)
        _close_handoff(net_fd)
        self.children.add(pid)
        if spec.temp_dir:
            self.temp_dirs[pid] = spec.temp_dir
        if spec.sandbox is not None and spec.spill_dir:
            self.spill_dirs[pid] = spec.spill_dir
        self.send(Spawned(request_id, pid))

    def _become_worker(self, channel_fd: int, spec: runtime.WorkerSpec) -> NoReturn:
        try:
            os.setsid()
            set_parent_death_signal(signal.SIGKILL)
            set_child_subreaper()  # what its tools start and abandon stays its own, to die with it
            set_process_name(WORKER_NAME)
            signal.set_wakeup_fd(-1)
            for sig in _HANDLED:
                # _signal's own, on ints: signal.signal() makes enums of its arguments and result,
                # whose objects are the fork server's pages (each first touch copies one).
                _signal.signal(sig, _SIG_DFL)
            self.control.close()
            os.close(self.wake_r)
            os.close(self.wake_w)
            if self.alive_fd >= 0:
                os.close(self.alive_fd)  # the daemon must see its end-of-file when we die, not the worker
            devnull = os.open(os.devnull, os.O_RDONLY)
            os.dup2(devnull, 0)  # the daemon's liveness pipe is the fork server's business
            os.close(devnull)
            os.dup2(2, 1)  # a tool's print() goes to the daemon's log, never into a protocol
            if spec.sandbox is None and _RUNTIME_PATHS:
                from atomictoolsd.worker import sandbox  # lazy: ctypes, for confined workers only

                sandbox.drop_shared_rules()  # the confined workers' descriptors are none of its business
            runtime.serve(channel_fd, spec)
        finally:
            os._exit(70)

    def reap(self, most: int = REAP_BATCH) -> bool:
        """Reap at most ``most`` exited children, then kill what they left to us; True when more
        may have exited (the caller answers the daemon's requests, then calls again).

        A worker's end costs a look at every process (its session); an adopted process's costs a
        ``waitpid``: a tool's processes that fork and exit as fast as they can (a chain of
        ``setsid``'d forks, each adopted here in turn) keep this process no more than ``most``
        exits from its requests."""
        reaped = 0
        while reaped < most:
            try:
                pid, status = _next_exited()
            except ChildProcessError:
                break
            if pid == 0:
                break
            reaped += 1
            if pid in self.children:
                self.worker_exited(pid, status)
            else:
                _reap_adopted(pid, status)
        if reaped:
            # The processes they started outside their group are ours now (we are their subreaper).
            self.kill_adopted()
        return reaped == most

    def worker_exited(self, pid: int, status: int | None) -> None:
        """End what worker ``pid`` left running, reap it, remove its dirs, tell the daemon."""
        # What the worker's tools started lives on in its process group and session. An
        # unreaped worker still holds its pid, so neither id can belong to anyone else yet: end
        # them, then reap.
        kill_worker_processes((pid,))
        if status is None:
            _, status = os.waitpid(pid, 0)
        temp_dir = self.temp_dirs.pop(pid, None)
        if temp_dir is not None:
            remove_tree(temp_dir)  # its worker's, or what that started, may still write there
            _stock_dirs()
        spill_dir = self.spill_dirs.pop(pid, None)
        if spill_dir is not None:
            try:
                os.rmdir(spill_dir)  # a spill file in it stays for the spill housekeeping
            except OSError:
                pass
        self.children.discard(pid)
        self.send(Exited(pid, status))

    def kill_adopted(self) -> int:
        """SIGKILL every child that is not a worker (and the group each one leads); return how many."""
        adopted = _children() - self.children
        own_group = os.getpgrp()
        for pid in adopted:
            try:
                if os.getpgid(pid) == pid != own_group:
                    os.killpg(pid, signal.SIGKILL)
                else:
                    os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        return len(adopted)

    def shutdown(self) -> NoReturn:
        kill_worker_processes(self.children)
        for pid in list(self.children):
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
        self.children.clear()
        for temp_dir in (*self.temp_dirs.values(), *_TEMP_BASE):
            remove_tree(temp_dir)  # its worker's, or what that started, may still write there
        for spare in _SPARE.values():
            for path in spare:
                try:
                    os.rmdir(path)
                except OSError:
                    pass
        # Each round kills what the last one orphaned (a killed process's children are adopted in
        # turn); bounded, so that a process that forks as fast as it is killed cannot keep us here.
        for _ in range(100):
            if not self.kill_adopted():
                break
            try:
                while os.waitpid(-1, os.WNOHANG)[0]:
                    pass
            except ChildProcessError:
                pass
            time.sleep(0.01)
        os._exit(0)


# The signals the fork server handles, which its workers put back to the default.
_HANDLED = (int(signal.SIGCHLD), int(signal.SIGTERM), int(signal.SIGINT))
_SIG_DFL = int(signal.SIG_DFL)
_RUNTIME_PATHS: list[str] = []
# Where the confined workers' private temporary dirs are made: one dir of the fork server's own
# (private, made once), so that each worker's needs no random name.
_TEMP_BASE: list[str] = []
_serial = itertools.count()
# Directories made ahead for the next confined workers, by parent: a mkdir costs ~0.2 ms on an
# ext4 disk (measured here), two per worker, so they are made when a worker ends (``_stock_dirs``),
# not while the daemon waits for a spawn. Each is new and handed to one worker only.
_SPARE: dict[str, list[str]] = {}
_SPARES = 2


def _prepare_confined(spec: runtime.WorkerSpec, net_fd: int) -> runtime.WorkerSpec:
    """Make what a confined worker needs before it is forked, so that the fork server knows it (and
    removes the temporary directory with the worker) and the worker's own start stays short: its
    directories, and its Landlock ruleset but for its own /proc/PID (``sandbox.prepare``). Returns
    its spec as the worker reads it (``net_fd``: the socket its proxy listener goes back on)."""
    from atomictoolsd.worker import netns, sandbox  # lazy: with the first confined worker: every fork has them

    if not _RUNTIME_PATHS:
        _RUNTIME_PATHS.extend(sandbox.runtime_read_paths())  # before any tools dir joins sys.path
        sandbox.warm_up()
        netns.warm_up()  # for the workers allowed the network
        sandbox.drop_bounding_set()  # as root: once here, not in each worker (it runs no program)
        sandbox.open_shared_rules(_RUNTIME_PATHS)
        _TEMP_BASE.append(tempfile.mkdtemp(prefix="atomictools-sandbox-"))
    policy = spec.sandbox
    if spec.env is not None:  # what it imports from besides the runtime: read, never written
        policy = sandbox.with_environment(policy or {}, [*spec.env.site, *spec.env.code])
    temp_dir = _new_dir(_TEMP_BASE[0])
    spill_dir = spec.spill_dir
    try:
        if spill_dir:
            # Its own: a confined tool can write the spill files of its results, never read another's.
            if spill_dir not in _SPARE:
                os.makedirs(spill_dir, mode=0o700, exist_ok=True)
            spill_dir = _new_dir(spill_dir)
        sandbox.prepare(policy or {}, _RUNTIME_PATHS, temp_dir, spill_dir)
    except BaseException:
        remove_tree(temp_dir)
        raise
    return msgspec.structs.replace(
        spec, runtime_paths=_RUNTIME_PATHS, sandbox=policy, temp_dir=temp_dir, spill_dir=spill_dir, net_handoff=net_fd,
    )


def _new_dir(parent: str) -> str:
    """A directory no worker had, in ``parent``: one made ahead, else made now."""
    spare = _SPARE.setdefault(parent, [])
    while spare:
        path = spare.pop()
        try:
            # Made a while ago: young again, or the spill housekeeping, which removes empty old
            # ones, could remove it under the worker that has it now.
            os.utime(path)
        except OSError:
            continue  # removed meanwhile
        return path
    return _private_dir(parent)


def _stock_dirs() -> None:
    """Make the directories the next confined workers will need (when a worker ended: the daemon
    is not waiting for a spawn then)."""
    for parent, spare in _SPARE.items():
        while len(spare) < _SPARES:
            try:
                spare.append(_private_dir(parent))
            except OSError:
                break  # the spawn makes its own, and reports what keeps it from doing so


def _private_dir(parent: str) -> str:
    """A new directory in ``parent`` (ours, private) named by a counter: ``mkdir`` fails rather than
    reuse one that is there. ``sandbox-`` marks a spill dir of a confined worker for the spill
    housekeeping (``truncate.remove_old_spills``)."""
    prefix = "" if _TEMP_BASE and parent == _TEMP_BASE[0] else f"sandbox-{os.getpid()}-"
    while True:
        path = os.path.join(parent, f"{prefix}{next(_serial)}")
        try:
            os.mkdir(path, 0o700)
            return path
        except FileExistsError:
            continue


def _close_handoff(fd: int) -> None:
    """The fork server's copy of a worker's hand-over socket: only that worker uses it (one that is
    not confined never gets it)."""
    if fd >= 0:
        os.close(fd)


def _forget_prepared() -> None:
    if _RUNTIME_PATHS:  # the sandbox module is imported once a confined worker was asked for
        from atomictoolsd.worker import sandbox  # lazy: imported already (above)

        sandbox.forget_prepared()


def _reap_adopted(pid: int, status: int | None) -> None:
    """Reap a process adopted from a worker's tree; first end the group it leads (its pid still
    holds the group's id)."""
    try:
        if os.getpgid(pid) == pid != os.getpgrp():
            os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if status is None:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass


def _next_exited() -> tuple[int, int | None]:
    """A child that has exited: ``(pid, None)`` left unreaped where ``waitid`` can peek, else
    ``(pid, status)`` already reaped; ``(0, None)`` when none has exited."""
    if hasattr(os, "waitid"):
        info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        return (info.si_pid, None) if info is not None else (0, None)
    pid, status = os.waitpid(-1, os.WNOHANG)
    return pid, (status if pid else None)


def _children() -> set[int]:
    """The pids of this process's children (Linux; empty elsewhere, where nothing is adopted)."""
    if not sys.platform.startswith("linux"):
        return set()
    pids: set[int] = set()
    try:
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/children") as f:
                pids.update(int(pid) for pid in f.read().split())
        return pids
    except OSError:  # a kernel without CONFIG_PROC_CHILDREN: read every process's parent
        pass
    me = os.getpid()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        fields = proc_stat(name, PPID + 1)
        if fields is not None and len(fields) > PPID and int(fields[PPID]) == me:
            pids.add(int(name))
    return pids


def _time_workers(path: str) -> None:
    """Have each worker append to ``path``, once it has sent ``loaded``, one line of integers: its
    clock (``perf_counter_ns``), CPU time and minor page faults at its first line of Python after
    the fork (the CPU time and the faults count from the fork: a child starts at zero), the time and
    the faults its module's import took (``exec_module``: its code, and the helpers it imports), and
    its clock, CPU time and faults as it sent ``loaded``. For the bench: the spawn target is the
    worker's start after the fork, its module's import excluded."""
    import resource  # lazy: the bench only (the runtime has it imported already: limits)

    def faults() -> int:
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

    def cpu() -> int:
        return time.clock_gettime_ns(time.CLOCK_PROCESS_CPUTIME_ID)

    clock = time.perf_counter_ns
    record: list[int] = []
    become, exec_module, send_loaded = _Server._become_worker, SourceOnlyLoader.exec_module, runtime.send_loaded

    def timed_become(self: _Server, channel_fd: int, spec: runtime.WorkerSpec) -> NoReturn:
        record[:] = [clock(), cpu(), faults()]
        become(self, channel_fd, spec)

    def timed_exec_module(self: SourceOnlyLoader, module: Any) -> None:
        if len(record) != 3:  # a helper the module imports: inside the module's own time
            return exec_module(self, module)
        started, faulted = clock(), faults()
        try:
            return exec_module(self, module)
        finally:
            record.extend((clock() - started, faults() - faulted))

    def timed_send_loaded(sender: Any, report: bytes) -> None:
        if len(record) not in (3, 5):
            return send_loaded(sender, report)
        if len(record) == 3:
            record.extend((0, 0))  # nothing imported (a declarative module)
        record.extend((clock(), cpu(), faults()))
        send_loaded(sender, report)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, (" ".join(map(str, record)) + "\n").encode())
        finally:
            os.close(fd)

    _Server._become_worker = timed_become  # type: ignore[method-assign]
    SourceOnlyLoader.exec_module = timed_exec_module  # type: ignore[method-assign]
    runtime.send_loaded = timed_send_loaded


def main(argv: list[str] | None = None) -> NoReturn:
    args = sys.argv[1:] if argv is None else argv
    control = socket.socket(fileno=int(args[0]))
    daemon_pid = int(args[1])
    set_parent_death_signal(signal.SIGTERM)
    set_child_subreaper()
    set_process_name(FORKSERVER_NAME)
    if os.getppid() != daemon_pid:
        os._exit(0)  # the daemon died before the death signal was armed
    runtime.warm_up()
    # What every worker builds next (its channel's reader, ``Runtime``): built here once, msgspec
    # keeps the message types' decoding information, and a worker's own costs ~0.1 ms, not ~0.4
    # (measured, bench/spawn.py: half of it page copies after the fork).
    FrameReader(type=DaemonMessage)
    times = os.environ.pop(SPAWN_TIMES_ENV, None)
    if times:
        _time_workers(times)
    _Server(control, int(args[2]) if len(args) > 2 else -1).run()


if __name__ == "__main__":
    main()
