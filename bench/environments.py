"""Declared dependencies (PEP 723): a worker's spawn with an environment, an environment's build,
and ten modules sharing one.

    python bench/environments.py [--quick]

- **spawn**: workers of a one-line tool module, forked by the fork server, each timing itself from
  its return from ``fork()`` to its ``loaded`` message, its module's import excluded (as
  ``bench/spawn.py`` times the spawn target): without an environment, and with the environment of
  declared dependencies put on its ``sys.path`` (``worker/environment.py``, ``.pth`` files
  read), in alternating rounds; and that step alone (``activate()``) in fresh forks of a process
  holding the worker runtime, the figure a busy machine's noise does not drown. The daemon's side of it, ``Environments.for_runner`` for a module whose environment exists
  (the block read from a cached stat, one dict lookup, one ``isdir``) and for one without a block,
  is timed in process.
- **build**: ``Environments.declared`` for a set never built, with uv and with pip, from the index
  (their caches empty: a new home) and again from their warm caches (the environment removed, the
  cache kept): resolve + install + rename, as the daemon does it. The CPU time the event loop's
  thread spends on it says what serving loses meanwhile (the installer runs in a subprocess).
- **shared**: ten modules asking at once for the same set (three spellings of it): how many
  environments are built, and how long until all ten have theirs.

Needs the network (PyPI) for the builds. Pinned to one core, and unpinned, for the spawn; the
builds are timed unpinned (a subprocess on the other core is what a user's machine does).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent))

from spawn import MODULE, after_fork  # noqa: E402

from atomictoolsd.config.settings import Config  # noqa: E402
from atomictoolsd.environments import Environments  # noqa: E402
from atomictoolsd.environments.script import ScriptMetadata  # noqa: E402
from atomictoolsd.pool.pool import PoolSettings  # noqa: E402
from common import MODES, Report, Stats, Table, affinity, quick_main  # noqa: E402

ROUNDS = 5
SET = ("pyyaml",)  # the issue's own example: one package, a binary wheel
SMALL = ("six",)
BLOCK = '# /// script\n# dependencies = ["six"]\n# ///\n'


def _home(root: Path) -> dict[str, str]:
    """Point HOME and the cache at ``root`` (the installers' caches then start empty)."""
    saved = {key: os.environ.get(key) for key in ("HOME", "XDG_CACHE_HOME")}
    os.environ["HOME"] = str(root)
    os.environ["XDG_CACHE_HOME"] = str(root / ".cache")
    return {k: v for k, v in saved.items() if v is not None}


def _restore(saved: dict[str, str]) -> None:
    for key in ("HOME", "XDG_CACHE_HOME"):
        os.environ.pop(key, None)
    os.environ.update(saved)


async def _build(store: Environments, requirements: tuple[str, ...], path: str = "bench.py") -> tuple[float, float]:
    """Seconds ``declared`` took, and the CPU seconds the event loop's thread spent in it meanwhile
    (the rest of the time it is free to serve: the installer runs in a subprocess)."""
    started, cpu = time.perf_counter(), time.thread_time()
    await store.declared(path, ScriptMetadata(requirements, None, 1))
    return time.perf_counter() - started, time.thread_time() - cpu


def builds(root: Path, installer: str, requirements: tuple[str, ...]) -> dict[str, float]:
    """A first build from the index (empty caches), then one from the warm cache."""
    import uvloop

    home = root / f"home-{installer}"
    home.mkdir()
    saved = _home(home)
    try:
        config = Config(installer=installer)
        cold_store = Environments(root / f"envs-{installer}", home, config)
        cold, cold_cpu = uvloop.run(_build(cold_store, requirements))
        shutil.rmtree(root / f"envs-{installer}")  # the environment goes, the installer's cache stays
        warm_store = Environments(root / f"envs-{installer}", home, config)
        warm, warm_cpu = uvloop.run(_build(warm_store, requirements))
    finally:
        _restore(saved)
    return {"cold_s": cold, "cold_loop_cpu_ms": cold_cpu * 1000, "warm_s": warm, "warm_loop_cpu_ms": warm_cpu * 1000}


def shared(root: Path) -> dict[str, Any]:
    """Ten modules asking at once: seven for six, two for six<2, one for SIX (warm uv cache)."""
    import uvloop

    home = root / "home-uv"  # the uv cache of ``builds``
    saved = _home(home)
    try:
        store = Environments(root / "envs-shared", home, Config())
        spellings = [("six",)] * 7 + [("six<2",)] * 2 + [("SIX",)]

        async def ask() -> list[Any]:
            return await asyncio.gather(*(
                store.declared(f"m{i}.py", ScriptMetadata(spelling, None, 1)) for i, spelling in enumerate(spellings)
            ))

        started = time.perf_counter()
        envs = uvloop.run(ask())
        took = time.perf_counter() - started
    finally:
        _restore(saved)
    return {"modules": len(spellings), "declarations": len(set(spellings)), "environments": len({e.name for e in envs}),
            "installs": store.built, "s": took}


def for_runner_cost(root: Path, env_store: Environments, count: int) -> tuple[float, float]:
    """The daemon's side of a spawn: ``for_runner`` for a module whose environment exists, and for one
    without a block (µs per call)."""
    with_block = root / "with_block.py"
    with_block.write_text(BLOCK + MODULE)
    plain = root / "plain.py"
    plain.write_text(MODULE)
    settings = PoolSettings.from_config()

    def runner(path: Path) -> Any:
        return types.SimpleNamespace(spec=settings.worker_spec(str(path), "python", str(root)), installing=None)

    async def time_it(path: Path) -> float:
        r = runner(path)
        await env_store.for_runner(r)  # the first: reads the block, finds the record
        started = time.perf_counter()
        for _ in range(count):
            await env_store.for_runner(r)
        return (time.perf_counter() - started) / count

    return asyncio.run(time_it(with_block)), asyncio.run(time_it(plain))


def activation_after_fork(spec: Any, count: int) -> list[float]:
    """The worker's own cost of an environment: ``environment.activate`` timed in children forked
    from this process (the worker runtime imported, as in the fork server), each a fresh copy."""
    from atomictoolsd.worker import environment, main  # noqa: F401 - what a fork server holds

    samples = []
    for _ in range(count):
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:
            started = time.perf_counter()
            environment.activate(spec)
            os.write(write_fd, repr(time.perf_counter() - started).encode())
            os._exit(0)
        os.close(write_fd)
        os.waitpid(pid, 0)
        with os.fdopen(read_fd, "rb") as result:
            samples.append(float(result.read()))
    return samples


def measure(quick: bool = False) -> Report:
    forks = 30 if quick else 200
    report = Report("environments", data={"forks": forks})
    with tempfile.TemporaryDirectory(prefix="atb-envs-") as tmp:
        root = Path(tmp)
        build_rows = []
        for installer in ("uv", "pip"):
            for requirements in (SET, SMALL):
                where = root / f"{installer}-{'-'.join(requirements)}"
                where.mkdir()
                figures = builds(where, installer, requirements)
                report.data[f"build {installer} {' '.join(requirements)}"] = figures
                build_rows.append([installer, ", ".join(requirements), round(figures["cold_s"], 3),
                                   round(figures["warm_s"], 3), round(figures["warm_loop_cpu_ms"], 2)])
        sharing = shared(root / "uv-six")
        report.data["shared"] = sharing

        saved = _home(root / "uv-six" / "home-uv")
        try:
            store = Environments(root / "envs-spawn", root, Config())
            env = asyncio.run(store.declared("bench.py", ScriptMetadata(SMALL, None, 1)))
        finally:
            _restore(saved)
        with_block_s, plain_s = for_runner_cost(root, store, 2000)
        report.data["for_runner_us"] = {"environment exists": with_block_s * 1e6, "no block": plain_s * 1e6}

        spawn_rows = []
        module = root / "tiny.py"
        module.write_text(MODULE)
        spec = PoolSettings.from_config(spill_dir=str(root / "spill")).worker_spec(str(module), "python", str(root))
        with_env = msgspec.structs.replace(spec, env=env)
        for mode, pinned in MODES:
            plain_times: list[float] = []
            env_times: list[float] = []
            with affinity(pinned):
                for _round in range(ROUNDS):  # alternated: a busy machine's drift falls on both alike
                    plain_times += after_fork(spec, forks // ROUNDS, str(root / "times"))["start"]
                    env_times += after_fork(with_env, forks // ROUNDS, str(root / "times"))["start"]
                activation = Stats(activation_after_fork(with_env, forks)).ms()
            plain_ms, env_ms = Stats(plain_times).ms(), Stats(env_times).ms()
            report.data[mode] = {"without": plain_ms, "with": env_ms, "activate": activation}
            spawn_rows.append([mode, len(plain_times), plain_ms["p50_ms"], env_ms["p50_ms"],
                               round(env_ms["p50_ms"] - plain_ms["p50_ms"], 3), activation["p50_ms"], activation["p99_ms"]])
    report.tables.append(Table(
        "environments-spawn", "worker spawn, fork → loaded, import excluded: a module with an environment of declared dependencies (ms)",
        ["mode", "n", "without p50", "with environment p50", "difference", "activate() p50", "activate() p99"], spawn_rows,
        notes=[f"daemon side, Environments.for_runner: {report.data['for_runner_us']['environment exists']:.1f} µs for a "
               f"module whose environment exists, {report.data['for_runner_us']['no block']:.1f} µs for one without a block"],
    ))
    report.tables.append(Table(
        "environments-build", "building the environment of a declaration never built (s): resolve + install, as the daemon does it",
        ["installer", "declares", "from the index (caches empty)", "from the warm cache", "event loop's CPU ms (warm)"],
        build_rows, notes=["event loop's CPU: what its thread spent on the build (spawning, reading the installer's "
                           "output, writing the records); the rest of the time it serves"],
    ))
    report.tables.append(Table(
        "environments-shared", "ten modules asking at once for one set, in three spellings (uv, warm cache)",
        ["modules", "declarations", "environments", "installs", "s until all ten have theirs"],
        [[sharing["modules"], sharing["declarations"], sharing["environments"], sharing["installs"], round(sharing["s"], 3)]],
    ))
    return report


def main() -> None:
    quick_main(measure, __doc__)


if __name__ == "__main__":
    main()
