"""Worker (re)spawn, through the fork server and without it; daemon start → ready.

    python bench/spawn.py [--quick]

A worker serves one tool module. It is started when a module loads or reloads, after a crash, and
on the first call after its idle worker was reaped, so its start-up is on the path of every reload.
Measured here, with a one-line tool module (its import is a fraction of a millisecond):

- **fork server**: the daemon's ``Spawner`` asks the warm fork server for a worker; the times are
  request → pid (the fork), and request → the worker's ``loaded`` message (fork, runtime set-up, the
  module's import, its schemas), sequentially, each worker closed before the next;
- **fork → loaded, import excluded** (what the spawn target, "≤ 5 ms after the fork, module import
  excluded", judges: ``bench/run.py``): the same spawns, timed by the worker itself from its return
  from ``fork()`` to its ``loaded`` message, less its module's import (``after_fork``; the fork
  server's ``SPAWN_TIMES_ENV``, which a real daemon never sets), with its CPU time and its page
  faults over the span (table ``spawn-after-fork``): after a fork each first write to a page of the
  fork server's copies it, and that is most of a worker's start;
- **cold**: ``python -m atomictoolsd.worker.main`` started with ``subprocess`` (``sys.executable``,
  never a pyenv shim), request → ``loaded``: what every spawn would cost without the fork server;
- **confined** (``trust --sandbox``, where the kernel has Landlock ABI 6+): the same fork-server
  spawn of a worker that confines itself; and the sandbox set-up alone, in its two parts: the
  ruleset the fork server builds before the fork (``sandbox.prepare()``: the Landlock ruleset and
  every rule but the worker's own ``/proc/PID``), and ``sandbox.confine()`` timed inside the child
  forked from a process prepared as the fork server prepares itself (that last rule,
  ``restrict_self``, the seccomp filter);
- **confined, with the network** (``trust --sandbox --allow-net``, where user namespaces can be
  made): the same, for a worker that first moves into a user and network namespace of its own and
  hands its proxy listener to the daemon (``netns.isolate``); and that step alone, timed inside
  the child (``isolate()``).

Daemon start: ``atomictoolsd serve --ready-fd`` spawned → it reports that its socket serves
("ready"), then → the first ``tools/call`` answered (the first call starts the fork server and a
worker); and the ``atomictoolsd start`` command (detached start, returns once ready) until it exits.
Pinned to one core, and unpinned.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent))

from atomictoolsd.pool.netproxy import NetProxy  # noqa: E402
from atomictoolsd.pool.pool import PoolSettings  # noqa: E402
from atomictoolsd.pool.spawner import Spawner  # noqa: E402
from atomictoolsd.protocol import FrameReader, WorkerSpec  # noqa: E402
from atomictoolsd.worker.forkserver import SPAWN_TIMES_ENV  # noqa: E402
from atomictoolsd.worker.netns import proxy_environ  # noqa: E402
from atomictoolsd.worker.netns import support as netns_support  # noqa: E402
from atomictoolsd.worker.sandbox import support as sandbox_support  # noqa: E402
from clients import measure_latency, socket_channel  # noqa: E402
from common import CONSOLE, MODES, DaemonUnderTest, Report, Stats, Table, affinity, quick_main, ratio  # noqa: E402

# The spawn target's figure (bench/run.py): the worker's own start, its module's import excluded.
AFTER_FORK = "worker: fork → module loaded, import excluded (the target)"
AFTER_FORK_CONFINED = "worker, confined: fork → module loaded, import excluded (the target)"
AFTER_FORK_NET = "worker, confined with the network: fork → module loaded, import excluded"
MODULE = "def tiny() -> str:\n    return 'tiny'\n"


def read_loaded(sock: socket.socket) -> None:
    reader = FrameReader()
    while True:
        data = sock.recv(65536)
        if not data:
            raise RuntimeError("the worker closed its channel before loading")
        for message in reader.feed(data):
            if message[0] == "loaded":
                return
            if message[0] == "failed":
                raise RuntimeError(f"the module failed to load: {message[1]}")


async def fork_server(spec: WorkerSpec, count: int) -> tuple[list[float], list[float], float]:
    spawner = Spawner(net_proxy=NetProxy())  # serves the listener a worker with the network hands over
    started = time.perf_counter()
    pid, sock = await spawner.spawn(spec)  # starts the fork server: paid once per daemon
    first = time.perf_counter() - started
    sock.setblocking(True)
    read_loaded(sock)
    sock.close()
    to_pid, to_loaded = [], []
    loop = asyncio.get_running_loop()
    for _ in range(count):
        started = time.perf_counter()
        pid, sock = await spawner.spawn(spec)
        forked = time.perf_counter()
        await loop.run_in_executor(None, _blocking_loaded, sock)
        loaded = time.perf_counter()
        to_pid.append(forked - started)
        to_loaded.append(loaded - started)
        sock.close()  # the worker exits on end-of-file
        await spawner.exit_status(pid)
        spawner.forget(pid)
    await spawner.close()
    return to_pid, to_loaded, first


def after_fork(spec: WorkerSpec, count: int, records: str) -> dict[str, list[float]]:
    """What the spawn target judges: each worker's start from its return from ``fork()`` to its
    ``loaded`` message, its module's import excluded, as the worker itself timed it (a fork server
    started with ``SPAWN_TIMES_ENV``, whose workers append their times to ``records``, a file in the
    project, which a confined worker may write: made first, as a confined worker can make nothing at
    its project's root); and its CPU time and page faults over the same span.

    From the fork: the clock starts at the worker's first line of Python, and the CPU time it spent
    before it (the fork's return, CPython's after-fork handlers) is added, a new process's CPU clock
    starting at zero."""
    import uvloop

    open(records, "w").close()
    os.environ[SPAWN_TIMES_ENV] = records
    try:
        uvloop.run(fork_server(spec, count))
    finally:
        del os.environ[SPAWN_TIMES_ENV]
    with open(records) as f:
        lines = [[int(v) for v in line.split()] for line in f][1:]  # the first worker's: a fork server just started
    os.unlink(records)
    out: dict[str, list[float]] = {"start": [], "import": [], "cpu": [], "faults": [], "import_faults": [],
                                   "first_faults": []}
    for first, first_cpu, first_faults, imported, import_faults, loaded, loaded_cpu, loaded_faults in lines:
        out["start"].append((loaded - first + first_cpu - imported) / 1e9)
        out["import"].append(imported / 1e9)
        out["cpu"].append(loaded_cpu / 1e9)
        out["faults"].append(float(loaded_faults - import_faults))
        out["import_faults"].append(float(import_faults))
        out["first_faults"].append(float(first_faults))  # before its first line of Python: CPython's at-fork work
    return out


def _blocking_loaded(sock: socket.socket) -> None:
    sock.setblocking(True)
    read_loaded(sock)


def confined_policy(project: str) -> dict[str, Any]:
    """The policy the daemon makes for a project trusted with ``--sandbox`` (its root granted entry by
    entry, its protected entries left out; the copy of your git configuration)."""
    from atomictoolsd.config.settings import Config
    from atomictoolsd.registry.confinement import policy

    return policy([project], [project], {}, Config(), Path.home(), Path(project))


def confine_after_fork(count: int, project: str) -> tuple[list[float], list[float]]:
    """The sandbox set-up as the fork server and a worker share it: ``sandbox.prepare()`` (the
    ruleset, before the fork) in a warm process, and ``sandbox.confine()`` in the child it forks.
    That warm process is a child of this one, made as the fork server makes itself (as root, it
    empties its capability bounding set, which this process keeps to start daemons)."""
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(reader)
            with os.fdopen(writer, "w") as out:
                out.write(repr(_confine_after_fork(count, project)))
        finally:
            os._exit(0)
    os.close(writer)
    with os.fdopen(reader) as result:
        text = result.read()
    os.waitpid(pid, 0)
    before, after = eval(text)  # noqa: S307 - two lists of floats from our own child
    return before, after


def _confine_after_fork(count: int, project: str) -> tuple[list[float], list[float]]:
    from atomictoolsd.worker import sandbox

    runtime = sandbox.runtime_read_paths()
    sandbox.warm_up()
    sandbox.drop_bounding_set()
    sandbox.open_shared_rules(runtime)
    before, after = [], []
    for _ in range(count):
        temp_dir = tempfile.mkdtemp(prefix="atb-sandbox-")
        policy = confined_policy(project)
        read_fd, write_fd = os.pipe()
        started = time.perf_counter()
        sandbox.prepare(policy, runtime, temp_dir, temp_dir)
        before.append(time.perf_counter() - started)
        pid = os.fork()
        if pid == 0:
            started = time.perf_counter()
            sandbox.confine(policy, runtime, temp_dir, temp_dir)
            os.write(write_fd, repr(time.perf_counter() - started).encode())
            os._exit(0)
        sandbox.forget_prepared()
        os.close(write_fd)
        os.waitpid(pid, 0)
        with os.fdopen(read_fd, "rb") as result:
            after.append(float(result.read()))
        shutil.rmtree(temp_dir)  # the copy of your git configuration is written there
    sandbox.drop_shared_rules()
    return before, after


def isolate_after_fork(count: int) -> list[float]:
    """``netns.isolate()`` timed in children forked from a process that imported it (as the fork
    server has), each handing its listener over a socket pair, as a worker does."""
    from atomictoolsd.worker import netns

    netns.warm_up()
    samples = []
    for _ in range(count):
        ours, theirs = socket.socketpair()
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:
            started = time.perf_counter_ns()
            netns.isolate(theirs.detach())
            os.write(write_fd, str(time.perf_counter_ns() - started).encode())
            os._exit(0)
        theirs.close()
        os.close(write_fd)
        with os.fdopen(read_fd, "rb") as f:
            samples.append(int(f.read()) / 1e9)
        for fd in socket.recv_fds(ours, 16, 1)[1]:
            os.close(fd)  # the listener, and with it the child's namespace
        ours.close()
        os.waitpid(pid, 0)
    return samples


def cold(spec: WorkerSpec, count: int) -> list[float]:
    samples = []
    spec_json = msgspec.json.encode(spec).decode()
    for _ in range(count):
        ours, theirs = socket.socketpair()
        started = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "atomictoolsd.worker.main", str(theirs.fileno()), spec_json],
            pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
        )
        theirs.close()
        read_loaded(ours)
        samples.append(time.perf_counter() - started)
        ours.close()
        proc.wait(10)
    return samples


def daemon_start(runs: int) -> dict[str, Stats]:
    """Spawn → ready and → first call answered, in a new home (first start) and again (a restart,
    the definition cache warm); and ``atomictoolsd start`` until it returns."""
    names = ("first start: serve → ready", "first start: serve → first tools/call answered",
             "restart: serve → ready", "restart: serve → first tools/call answered",
             "atomictoolsd start (restart, until it returns)")
    samples: dict[str, Stats] = {name: Stats() for name in names}
    for _ in range(runs):
        daemon = DaemonUnderTest()
        try:
            for first in (True, False):
                started = time.perf_counter()
                daemon.start()
                assert daemon.ready_s is not None
                channel = socket_channel(str(daemon.socket))
                channel.handshake()
                measure_latency(channel, 1, 0)
                to_call = time.perf_counter() - started
                channel.close()
                daemon.stop(remove=False)
                prefix = "first start" if first else "restart"
                samples[f"{prefix}: serve → ready"].samples.append(daemon.ready_s)
                samples[f"{prefix}: serve → first tools/call answered"].samples.append(to_call)
            started = time.perf_counter()
            subprocess.run([CONSOLE, "start"], env=daemon.env, cwd=daemon.project, check=True, capture_output=True)
            samples[names[-1]].samples.append(time.perf_counter() - started)
            subprocess.run([CONSOLE, "stop"], env=daemon.env, cwd=daemon.project, check=True, capture_output=True)
        finally:
            daemon.stop()
    return samples


def measure(quick: bool = False) -> Report:
    import uvloop

    forks, colds, starts = (30, 5, 5) if quick else (200, 30, 20)
    report = Report("spawn", data={"forks": forks, "cold": colds, "daemon_starts": starts})
    worker_rows: list[list[Any]] = []
    daemon_rows: list[list[Any]] = []
    fault_rows: list[list[Any]] = []
    for mode, pinned in MODES:
        with affinity(pinned), tempfile.TemporaryDirectory(prefix="atb-spawn-") as tmp:
            module = Path(tmp) / "tiny.py"
            module.write_text(MODULE)
            spec = PoolSettings.from_config(spill_dir=os.path.join(tmp, "spill")).worker_spec(str(module), "python", tmp)
            to_pid, to_loaded, first = uvloop.run(fork_server(spec, forks))
            records = os.path.join(tmp, "spawn-times")
            timed = {"unconfined": after_fork(spec, forks, records)}
            confined_loaded: list[float] = []
            confine_samples: list[float] = []
            prepare_samples: list[float] = []
            networked_loaded: list[float] = []
            isolate_samples: list[float] = []
            if sandbox_support()["available"]:
                confined = msgspec.structs.replace(spec, sandbox=confined_policy(tmp))
                confined_loaded = uvloop.run(fork_server(confined, forks))[1]
                timed["confined"] = after_fork(confined, forks, records)
                prepare_samples, confine_samples = confine_after_fork(forks, tmp)
                if netns_support()["available"]:
                    networked = msgspec.structs.replace(spec, sandbox={
                        "read": [tmp], "write": [tmp], "net": True, "env": proxy_environ()})
                    networked_loaded = uvloop.run(fork_server(networked, forks))[1]
                    timed["confined, network"] = after_fork(networked, forks, records)
                    isolate_samples = isolate_after_fork(forks)
            cold_samples = cold(spec, colds)
            starting = daemon_start(starts)
        rows = {
            "fork server: request → pid": Stats(to_pid).ms(),
            "fork server: request → module loaded": Stats(to_loaded).ms(),
            "cold python: start → module loaded": Stats(cold_samples).ms(),
        }
        rows[AFTER_FORK] = Stats(timed["unconfined"]["start"]).ms()
        if confine_samples:
            rows["fork server, confined: request → module loaded"] = Stats(confined_loaded).ms()
            rows[AFTER_FORK_CONFINED] = Stats(timed["confined"]["start"]).ms()
            rows["sandbox set-up after the fork (confine())"] = Stats(confine_samples).ms()
            rows["sandbox set-up before the fork, in the fork server (prepare())"] = Stats(prepare_samples).ms()
        if isolate_samples:
            rows["fork server, confined with the network: request → module loaded"] = Stats(networked_loaded).ms()
            rows[AFTER_FORK_NET] = Stats(timed["confined, network"]["start"]).ms()
            rows["its own network namespace, after the fork (isolate())"] = Stats(isolate_samples).ms()
        cold_p50 = rows["cold python: start → module loaded"]["p50_ms"]
        for name, r in rows.items():
            worker_rows.append([name, mode, r["n"], r["p50_ms"], r["p99_ms"], r["min_ms"],
                                ratio(cold_p50, r["p50_ms"]) if "loaded" in name and "fork →" not in name else None])
        for kind, t in timed.items():
            fault_rows.append([kind, mode, len(t["start"]), Stats(t["start"]).ms()["p50_ms"], Stats(t["cpu"]).ms()["p50_ms"],
                               Stats(t["import"]).ms()["p50_ms"], int(statistics.median(t["faults"])),
                               int(statistics.median(t["import_faults"]))])
        worker_rows.append(["first spawn of a daemon's life (starts the fork server)", mode, 1,
                            round(first * 1000, 2), None, None, None])
        started = {name: s.ms() for name, s in starting.items()}
        for name, r in started.items():
            daemon_rows.append([name, mode, r["n"], r["p50_ms"], r["p99_ms"], r["min_ms"]])
        report.data[mode] = {"worker": rows, "after_fork": {
            kind: {**{key: Stats(t[key]).ms() for key in ("start", "cpu", "import")},
                   **{key: int(statistics.median(t[key])) for key in ("faults", "import_faults", "first_faults")}}
            for kind, t in timed.items()}, "first_spawn_ms": round(first * 1000, 2), "daemon": started}
    report.tables.append(Table(
        "spawn-worker", "worker spawn, a one-line tool module (ms)",
        ["worker spawn", "mode", "n", "p50 ms", "p99 ms", "min ms", "× vs cold (p50)"],
        worker_rows,
    ))
    report.tables.append(Table(
        "spawn-after-fork", "in the worker, from fork() to its loaded message: a one-line tool module",
        ["worker", "mode", "n", "start p50 ms (import excluded)", "CPU p50 ms (all of it)", "import p50 ms",
         "page faults p50 (import excluded)", "page faults of the import p50"],
        fault_rows,
    ))
    report.tables.append(Table(
        "spawn-daemon", "daemon start (ms), one global tool module; its first call starts the fork server and a worker",
        ["daemon start", "mode", "n", "p50 ms", "p99 ms", "min ms"],
        daemon_rows,
    ))
    return report


def main() -> None:
    quick_main(measure, __doc__)


if __name__ == "__main__":
    main()
