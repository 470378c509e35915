"""The daemon's workers: one ``ModuleRunner`` per tool module, all started by one ``Spawner``.

A runner owns the worker generation that serves its module. ``load()`` starts a new generation and
returns it unused; the registry ``install()``s it in the same step that swaps the module's tools, so
no call ever reaches a half-loaded module. The previous generation retires: it takes no new calls
and stops once the calls it is running have answered.

A call that times out or is cancelled is asked to stop; if it has not stopped after the grace period,
its worker is retired (other calls on it finish first) and killed with its whole process group.

A module whose workers keep crashing backs off (``backoff``); an idle worker is retired by the
daemon's monitor (``reap_idle``) and the next call starts a new one, as after a restart of the daemon.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec

from atomictoolsd.config.settings import Config, max_workers_default
from atomictoolsd.eventlog.writer import CANCELLED, EventLog, RunningCall, error_text
from atomictoolsd.pool.backoff import CrashBackoff
from atomictoolsd.pool.javascript import JavaScript
from atomictoolsd.pool.netproxy import NetProxy
from atomictoolsd.pool.slots import WorkerSlots
from atomictoolsd.pool.spawner import FORKSERVER_GONE, EarlyForkServer, Spawner, SpawnError, confined_environ
from atomictoolsd.pool.worker import Call, CallOwner, Worker, error_result
from atomictoolsd.protocol import (
    ERROR_END,
    CallContext,
    EnvSpec,
    LoadFailure,
    SiteDir,
    Trusted,
    WorkerSpec,
    encode_frame,
)
from atomictoolsd.util.periodic import Scheduler

__all__ = [
    "Call", "CallOwner", "LoadFailure", "ModuleRunner", "PoolSettings", "RunnerHost", "SpawnError", "Unhosted", "WorkerPool",
]

log = logging.getLogger("atomictoolsd.workers")


@dataclass(frozen=True)
class PoolSettings:
    """The worker limits the pool applies. Built only by ``from_config``: every default is a
    ``Config`` field's (config/settings.py), and the worker limits are written into a ``WorkerSpec``
    here, once, not copied field by field."""

    cancel_grace: float
    load_timeout: float
    max_workers: int  # workers running at once (``WorkerSlots``); the setting's 0 sized to the machine
    worker: WorkerSpec  # what every new worker is told; path, kind and cwd are each module's

    @classmethod
    def from_config(cls, config: Config | None = None, spill_dir: str = "") -> PoolSettings:
        """The limits ``config`` sets (at start, and on SIGHUP); without one, the defaults."""
        config = Config() if config is None else config
        return cls(
            cancel_grace=config.cancel_grace,
            load_timeout=config.load_timeout,
            max_workers=config.max_workers or max_workers_default(),
            worker=WorkerSpec(
                path="",
                threads=config.worker_threads,
                memory_limit=config.memory_limit_mb * 1024 * 1024,
                truncate_lines=config.truncate_lines,
                truncate_bytes=config.truncate_bytes,
                spill_dir=spill_dir,
                max_result_bytes=config.max_message_bytes,
            ),
        )

    @property
    def spill_dir(self) -> str:
        return self.worker.spill_dir

    @property
    def max_result_bytes(self) -> int:
        return self.worker.max_result_bytes

    def worker_spec(self, path: str, kind: str, cwd: str) -> WorkerSpec:
        """What a new worker of the module at ``path`` is told."""
        return msgspec.structs.replace(self.worker, path=path, kind=kind, cwd=cwd)


def passed_env(spec: WorkerSpec) -> dict[str, str] | None:
    """The variables of the daemon's environment a confined worker is given by name (its policy's
    ``pass_env``: the user allowed them), read now; None for a worker that is given none."""
    names = (spec.sandbox or {}).get("pass_env")
    if not names:
        return None
    return {name: os.environ[name] for name in names if name in os.environ}


class RunnerHost(Protocol):
    """What a runner asks of whoever lists its module (the registry), given at construction.

    Each method gets the runner that asks: one host serves many runners.
    """

    async def admit(self, runner: ModuleRunner) -> str | None:
        """Asked before a worker starts for a call: why none may start now (its project is no longer
        trusted), or None. It may wait (a confined built-in's worker waits for its project's
        judgement) and set the runner up anew (``ModuleRunner.set_up``)."""
        ...

    def stale(self, runner: ModuleRunner) -> bool:
        """Whether the current worker must be replaced before it takes a call (a confined built-in's
        rules no longer match your git configuration). On the call path: keep it cheap."""
        ...

    async def verify(self, runner: ModuleRunner, worker: Worker) -> bool:
        """Whether what a worker started for a call loaded is what is on disk (not a half-written file)."""
        ...

    def load_failed(self, runner: ModuleRunner, failure: LoadFailure) -> None:
        """A worker started for a call could not load the module."""
        ...

    def loaded(self, runner: ModuleRunner, worker: Worker, definitions: list[dict[str, Any]]) -> None:
        """A worker started for a call loaded the module (definitions to compare with what is listed)."""
        ...

    def health_changed(self, runner: ModuleRunner) -> None:
        """The module's crash streak began, grew past failing, or ended (``runner.backoff``)."""
        ...


class Unhosted:
    """The host of a runner nobody lists (benchmarks, tests): every worker may start and is whole."""

    async def admit(self, runner: ModuleRunner) -> str | None:
        return None

    def stale(self, runner: ModuleRunner) -> bool:
        return False

    async def verify(self, runner: ModuleRunner, worker: Worker) -> bool:
        return True

    def load_failed(self, runner: ModuleRunner, failure: LoadFailure) -> None:
        pass

    def loaded(self, runner: ModuleRunner, worker: Worker, definitions: list[dict[str, Any]]) -> None:
        pass

    def health_changed(self, runner: ModuleRunner) -> None:
        pass


class ModuleRunner:
    """Runs one tool module: its current worker, the ones retiring, and its call statistics."""

    def __init__(self, pool: WorkerPool, path: str, kind: str, cwd: str, host: RunnerHost) -> None:
        self.pool = pool
        self.spec = pool.settings.worker_spec(path, kind, cwd)  # frozen: a change is a new spec
        self.events = pool.events
        self.current: Worker | None = None
        self.retiring: set[Worker] = set()
        # Generations a scan loaded and has not yet installed or dropped: they serve no one meanwhile,
        # so a spawn waiting for a slot may stop one (``WorkerPool._stop_an_idle_worker``).
        self.unclaimed: set[Worker] = set()
        self.waiting_for_slot = False  # a spawn of its waits for one of the max_workers slots
        self.loading = 0  # generations being started (spawned, not yet loaded)
        self._starting: asyncio.Task[Worker] | None = None
        self._queued: list[Call] = []
        self.calls = 0
        self.errors = 0
        self.cancelled = 0  # calls whose caller cancelled them or went away; neither calls nor errors
        self.durations: deque[float] = deque(maxlen=1024)
        self.last_error: str | None = None
        self.spawns = 0
        # The site-packages dirs its last loaded (or failed) worker imported from (``protocol.SiteDir``):
        # a package installed or upgraded there reloads it (``registry/sitewatch.py``).
        self.site: list[SiteDir] = []
        # The build of its environment under way, as ``environments`` shows it (status, list); None
        # when no worker of it waits for one.
        self.installing: dict[str, Any] | None = None
        self.backoff = CrashBackoff()
        self._epoch = 0  # bumped by install() and retire(): a lazy start begun before is stale
        self.host = host
        # For a module of a fully trusted project whose content is followed: the SHA-256 of what its
        # workers may load from the tools dir, by path (None: no such check). Set with ``set_up``.
        self.trusted_content: dict[str, str] | None = None

    def set_up(self, sandbox: dict[str, Any] | None, trusted_content: dict[str, str] | None) -> None:
        """How its next worker runs: confined by ``sandbox`` (None: with the user's full rights), and
        loading from its tools dir only ``trusted_content`` (None: no such check)."""
        if self.spec.sandbox is not sandbox:
            self.spec = msgspec.structs.replace(self.spec, sandbox=sandbox)
        self.trusted_content = trusted_content

    # -- generations ----------------------------------------------------------------------------

    async def load(self) -> tuple[Worker, list[dict[str, Any]], float]:
        """Start a new worker generation and wait for its module to load; does not install it.

        Raises:
            LoadFailure: the module failed to import or to build its tools, or the worker died.
            SpawnError: no worker could be started (not the module's doing).
        """
        self.loading += 1
        try:
            loaded = await self._load()
        finally:
            self.loading -= 1
        self.unclaimed.add(loaded[0])
        return loaded

    async def _load(self) -> tuple[Worker, list[dict[str, Any]], float]:
        loop = asyncio.get_running_loop()
        if self.pool.environment is not None:
            # Its environment, built first when it is not there (LoadFailure when it cannot be).
            self.spec = msgspec.structs.replace(self.spec, env=await self.pool.environment(self))
        started = time.perf_counter()
        trusted = self.trusted_content
        spec = self.spec if self.spec.follow_content == (trusted is not None) else msgspec.structs.replace(
            self.spec, follow_content=trusted is not None)
        if spec.kind == "javascript" and self.pool.javascript is not None:
            spec = self.pool.javascript.worker_spec(spec)  # with the runtime it starts on
        spawner = self.pool.spawner_for(spec)
        # What the worker reads on its channel before its module, in this order: the variables it
        # is given by name (a confined worker's), then the content it may load (a followed project's).
        env = passed_env(spec)
        first = (b"" if env is None else encode_frame(env)) + (b"" if trusted is None else encode_frame(Trusted(trusted)))
        pid, sock = await self._spawn(spawner, spec, first)
        self.spawns += 1
        spawn_ms = (time.perf_counter() - started) * 1000
        log.info(
            "worker %d started for %s in %.2f ms", pid, self.spec.path, spawn_ms,
            extra={"event": "worker.spawn", "data": {"pid": pid, "module": self.spec.path, "ms": round(spawn_ms, 3)}},
        )
        worker = Worker(self, pid, spawner)
        try:
            await loop.connect_accepted_socket(lambda: worker, sock=sock)
        except OSError as exc:  # never connected, so never ended through its channel: end it here
            worker.kill()
            self.pool.slots.give_back()
            raise SpawnError(f"cannot read the worker's channel: {exc}") from exc
        try:
            definitions, load_ms = await self._loaded(worker)
        except TimeoutError:
            worker.cause = f"did not finish importing the module within {self.pool.settings.load_timeout:g} s"
            worker.kill()
            # The module's doing: remembered (and cached) like an import error, so that no later
            # scan, nor the next daemon, waits for it again until its files change.
            raise LoadFailure(
                self.spec.path, None,
                f"importing the module took longer than {self.pool.settings.load_timeout:g} s"
                " (load_timeout); it is tried again when its files change or on a reload",
            ) from None
        except (LoadFailure, SpawnError, asyncio.CancelledError):
            self.drop(worker)  # a cancelled load too: nobody will install or drop this generation
            raise
        return worker, definitions, load_ms

    async def _spawn(self, spawner: Spawner, spec: WorkerSpec, first: bytes) -> tuple[int, Any]:
        """Spawn a worker once a slot is free (``max_workers``); the worker gives it back when it
        has ended (``Worker._ended``), a spawn that fails at once."""
        slots = self.pool.slots
        self.waiting_for_slot = True
        try:
            await slots.take(spec.cwd)
        finally:
            self.waiting_for_slot = False
        try:
            return await spawner.spawn(spec, first)
        except BaseException:
            slots.give_back()
            raise

    async def _loaded(self, worker: Worker) -> tuple[list[dict[str, Any]], float]:
        """Wait for ``worker``'s load report, for ``load_timeout`` seconds.

        A report already waiting on the channel when the time is up wins (for up to ``Deadlines.LATE``
        more): a daemon that was itself frozen judges its timers before it reads its sockets.
        """
        try:
            return await asyncio.wait_for(asyncio.shield(worker.loaded), self.pool.settings.load_timeout)
        except TimeoutError:
            # Read meanwhile (the timeout and the report fell in the same turn of the loop), or waiting.
            if not (worker.loaded.done() or worker.unread()):
                raise
        return await asyncio.wait_for(asyncio.shield(worker.loaded), Deadlines.LATE)

    def install(self, worker: Worker) -> None:
        """Make ``worker`` (a new generation of the module) serve new calls; the previous one retires.
        One stopped before it was installed (for a spawn waiting for a slot) serves nothing: the
        previous one retires all the same, and the next call starts a worker."""
        self._epoch += 1
        self.backoff.reset()  # new code: its crash streak starts afresh
        self.unclaimed.discard(worker)
        if worker.state != "ready":
            self.retire()
            return
        self._swap_in(worker)

    def _swap_in(self, worker: Worker) -> None:
        old, self.current = self.current, worker
        if old is not None and old is not worker:
            self.retiring.add(old)
            old.retire()
        queued, self._queued = self._queued, []
        for call in queued:
            if not call.done:
                worker.send_call(call)

    def drop(self, worker: Worker) -> None:
        """Stop a generation that will never serve (it failed, or what it loaded is already stale).

        It counts among the retiring until it has exited, so status and shutdown see it; one whose
        end was handled already (it died while loading) is not waited for.
        """
        self.unclaimed.discard(worker)
        if worker.ended:
            return
        self.retiring.add(worker)
        worker.retire()

    def retire(self, why: str | None = None) -> None:
        """Stop serving from the current worker: it finishes its calls in flight, then exits.

        Args:
            why: the module itself is gone (removed, failed to reload, blocked): calls waiting for a
                worker are answered with this reason. None (idle, new worker limits): they get a
                new worker.
        """
        self._epoch += 1
        if self.current is not None:
            self.retiring.add(self.current)
            self.current.retire()
            self.current = None
        if why is not None:
            self._fail_queued(why)
        else:
            self._restart_if_waiting()

    def _fail_queued(self, why: str) -> None:
        queued, self._queued = self._queued, []
        for call in queued:
            self.finish(call, error_result(f"Tool {call.tool!r} is unavailable: {why}"))

    def idle_since(self) -> float | None:
        """When the current worker was last used, if it is idle now (ready, no call); else None."""
        worker = self.current
        if worker is None or worker.state != "ready" or worker.pending or self._queued:
            return None
        return worker.last_used

    def reap_idle(self, idle_for: float, now: float) -> bool:
        """Retire the current worker if no call has used it for ``idle_for`` seconds."""
        since = self.idle_since()
        if since is None or now - since < idle_for:
            return False
        self.retire()  # it exits on end-of-file: a routine end (the monitor logs why)
        return True

    def worker_ended(self, worker: Worker, was: str) -> None:
        # A retired worker that exits cleanly is routine; any other end is worth a warning.
        routine = was == "retiring" and worker.cause == "exited with code 0"
        log.log(
            logging.INFO if routine else logging.WARNING,
            "worker %d for %s %s", worker.pid, self.spec.path, worker.cause,
            extra={"event": "worker.exit", "data": {
                "pid": worker.pid, "module": self.spec.path, "cause": worker.cause, "state": was,
            }},
        )
        self.retiring.discard(worker)
        if not self.retiring and self.current is None:
            self.pool.discarded.discard(self)
        if self.current is worker:
            self.current = None
            self.last_error = f"worker {worker.pid} {worker.cause}"
            if was == "ready" and worker.status != FORKSERVER_GONE:  # it died on its own (or for its memory): a crash
                self.backoff.crashed(self.last_error)
                if self.backoff.failing:
                    self.host.health_changed(self)
        if self._queued and self._starting is None:
            self._start()

    def served(self) -> None:
        """A worker answered a call: the module works, whatever crashed before."""
        if self.backoff.reset():
            self.host.health_changed(self)

    # -- calls ----------------------------------------------------------------------------------

    def call(
        self,
        tool: str,
        arguments: bytes,
        context: CallContext,
        timeout: float,
        owner: CallOwner,
        request_id: Any = None,
        progress_token: Any = None,
    ) -> Call:
        """Start a call; ``owner.call_result`` gets its answer. Starts a worker first if none runs.

        Args:
            context: who asked (``CallContext``): what the tool's ``ctx`` says.
            progress_token: the caller's ``_meta.progressToken``; progress is forwarded only with one.
        """
        pool = self.pool
        started = time.monotonic()
        call = Call(
            self, self.spec.path, next(pool.call_ids), tool, arguments, context, timeout, owner, request_id, progress_token,
            started, started + timeout,
        )
        events = self.events
        if events.calls_on and not events.scheduled:
            events.schedule()  # its flush writes the call's tool.start if it still runs then
        if not pool.deadlines.ticking:
            pool.deadlines.start()
        worker = self.current
        if worker is not None and self.host.stale(self):
            self.retire()  # it finishes what it runs; this call waits for a worker made for things as they are
            worker = None
        if worker is not None and worker.state == "ready":
            worker.send_call(call)
        else:
            self._queued.append(call)
            if self._starting is None:
                self._start()
        return call

    def _start(self) -> None:
        # In a task: the caller has not yet recorded the call, and admission may wait.
        self._starting = asyncio.get_running_loop().create_task(self._start_worker())

    async def _admitted(self) -> bool:
        """Whether a worker may start now; if not, the queued calls are answered why."""
        epoch = self._epoch
        try:
            refused = await self.host.admit(self)
        except Exception as exc:  # the registry's bug: the calls hear of it rather than wait for ever
            log.exception("admitting a worker for %s failed", self.spec.path)
            refused = f"no worker could be started ({exc})"
        except BaseException:
            self._starting = None
            raise
        if epoch != self._epoch:  # retired or reloaded while it was asked: that decided for the calls
            self._starting = None
            self._restart_if_waiting()
            return False
        if refused is None:
            wait = self.backoff.remaining()
            if wait > 0:
                refused = f"{self.backoff.describe()}; the next try is in {wait:.1f} s"
        if refused is not None:
            self._starting = None
            self._fail_queued(refused)
            return False
        return True

    async def _load_matching_disk(self) -> tuple[Worker, list[dict[str, Any]], float]:
        """``load()``, again while what the worker read is not what is on disk (a file half-written);
        after four tries the last one serves: the file keeps changing, and the watcher reloads it."""
        for _attempt in range(3):
            worker, definitions, load_ms = await self.load()
            self.unclaimed.discard(worker)  # it serves the calls that wait for it: not to be stopped
            try:
                matches_disk = await self.host.verify(self, worker)
            except BaseException:
                self.drop(worker)
                raise
            if matches_disk:
                return worker, definitions, load_ms
            self.drop(worker)
        worker, definitions, load_ms = await self.load()
        self.unclaimed.discard(worker)
        return worker, definitions, load_ms

    async def _start_worker(self) -> Worker | None:
        if not await self._admitted():
            return None
        epoch = self._epoch
        try:
            worker, definitions, _ms = await self._load_matching_disk()
        except LoadFailure as failure:
            self._starting = None
            if epoch != self._epoch:
                self._restart_if_waiting()  # reloaded or retired meanwhile: that decided the module's fate
                return None
            self.last_error = failure.info.get("message")
            self._fail_queued(self.last_error or "its module failed to load")
            self.host.load_failed(self, failure)
            return None
        except SpawnError as exc:
            # Not the module's doing: the calls that needed a worker fail; the module stays as listed.
            self._starting = None
            if epoch != self._epoch:
                self._restart_if_waiting()
                return None
            self.last_error = f"no worker could be started: {exc}"
            log.warning(
                "no worker could be started for %s: %s", self.spec.path, exc,
                extra={"event": "worker.spawn_failed", "data": {"module": self.spec.path, "error": str(exc)}},
            )
            self._fail_queued(f"no worker could be started ({exc})")
            return None
        except BaseException:
            self._starting = None
            raise
        self._starting = None
        if epoch != self._epoch:
            self.drop(worker)  # a newer generation was installed (it took the queued calls), or retired
            self._restart_if_waiting()
            return None
        self._swap_in(worker)
        self.host.loaded(self, worker, definitions)
        return worker

    def _restart_if_waiting(self) -> None:
        if self._queued and self.current is None and self._starting is None:
            self._start()

    def stop_call(self, call: Call) -> None:
        """Ask the worker to stop a call; retire the worker if the call ignores that for too long."""
        if call in self._queued:
            self._queued.remove(call)
            return
        worker = call.worker
        if worker is None or worker.state == "dead":
            return
        worker.send_cancel(call)

        def give_up() -> None:
            if call.id in worker.pending:
                worker.cause = f"was stopped because tool {call.tool!r} did not stop when cancelled"
                if worker is self.current:
                    self.current = None
                    self.retiring.add(worker)
                worker.retire()  # also when it was retiring already: this call no longer keeps it

        asyncio.get_running_loop().call_later(self.pool.settings.cancel_grace, give_up)

    def finish(self, call: Call, result: bytes, failed: bool | None = None) -> None:
        """Answer ``call`` with ``result``, once (later answers are dropped): count it in the
        statistics and the event log, then hand it to its owner. ``failed``: whether ``result`` is
        an error (``isError``), when the caller knows; None: read from it."""
        if call.done:
            return
        call.done = True
        self.calls += 1
        now = time.monotonic()
        self.durations.append(now - call.started)
        events = self.events
        if failed is None:
            failed = result[-len(ERROR_END):] == ERROR_END  # slicing: see pool/worker.py
        if failed:
            self.errors += 1
            self.last_error = f"{call.tool}: {error_text(result)}"
            if events.failures_on:
                context = call.context
                events.tool_finished(
                    call.tool, self.spec.path, call.id, context.session_id, context.agent, now, now - call.started, result,
                )
        elif events.calls_on:
            call.ended = now
            events.call_completed(call)
        if call.worker is not None:
            call.worker.last_used = now  # it is idle from here, if this was its last call
        call.owner.call_result(call, result)

    def record_cancelled(self, call: Call) -> None:
        self.cancelled += 1
        events = self.events
        if events.calls_on:
            now = time.monotonic()
            events.tool_finished(
                call.tool, self.spec.path, call.id, call.context.session_id, call.context.agent, now, now - call.started, CANCELLED,
            )

    # -- status and shutdown --------------------------------------------------------------------

    def inflight(self) -> int:
        workers = [self.current, *self.retiring] if self.current else list(self.retiring)
        return len(self._queued) + sum(w.live_calls() for w in workers if w is not None)

    def unanswered(self) -> Iterator[Call]:
        """Its calls waiting for a worker, and those its workers run (some may have answered)."""
        yield from self._queued
        if self.current is not None:
            yield from self.current.pending.values()
        for worker in self.retiring:
            yield from worker.pending.values()

    def info(self) -> dict[str, Any]:
        durations = sorted(self.durations)

        def pct(p: float) -> float | None:
            if not durations:
                return None
            return round(durations[min(len(durations) - 1, int(p * len(durations)))] * 1000, 3)

        return {
            "worker": self.current.pid if self.current is not None else None,
            "workerState": self.current.state if self.current is not None else None,
            "retiring": sorted(w.pid for w in self.retiring),
            "starting": self.loading,  # new generations' workers being started (beside "retiring")
            "calls": self.calls,
            "failedCalls": self.errors,
            "cancelled": self.cancelled,
            "inflight": self.inflight(),
            "p50Ms": pct(0.5),
            "p99Ms": pct(0.99),
            "spawns": self.spawns,
            "lastError": self.last_error,
            "crashes": self.backoff.crashes,
            "retryIn": round(self.backoff.remaining(), 3) if self.backoff.failing else None,
        }

    async def close(self) -> None:
        """Retire every worker and wait until they are gone."""
        self.retire("the daemon is stopping")
        for worker in list(self.retiring):
            worker.close()
        while self.retiring:
            await asyncio.sleep(0.01)


class Deadlines:
    """Answers calls that outlive their timeout, with one sweep per ``TICK`` while calls run.

    A timer handle per call (``call_later`` and its cancel) cost ~2 µs of every call; timeouts are
    seconds long, so looking every 50 ms is precise enough. The sweep finds the calls where they
    wait (``unanswered``: the pool's runners' queues and their workers' calls in flight), so a call
    adds nothing to the call path but a look at ``ticking``.

    A result that arrived in time wins: a call past its deadline whose worker has bytes waiting to
    be read is looked at again on the next sweep, after the loop has read them (for up to ``LATE``
    seconds after a sweep first found it overdue). Without this, a daemon that was itself frozen (SIGSTOP, a stalled machine) would on
    waking judge its timers before its sockets (uvloop runs timers first) and answer "timed out" to
    calls whose results were already waiting.
    """

    TICK = 0.05
    LATE = 1.0

    def __init__(self, scheduler: Scheduler, unanswered: Callable[[], Iterable[Call]]) -> None:
        self._unanswered = unanswered
        self.ticking = False  # a sweep is due; ModuleRunner.call calls start() when not
        self._calls_left = False  # the last sweep left calls unanswered
        self._sweeps = scheduler.every(
            "the sweep of calls past their deadline", self._sweep, self.TICK, while_=self._still_ticking, logger=log,
        )
        self._overdue: dict[Call, float] = {}  # calls whose expiry waits for bytes to be read: since when

    def calls(self) -> list[Call]:
        """The calls not answered yet."""
        return [call for call in self._unanswered() if not call.done]

    def start(self) -> None:
        """Sweep every ``TICK`` until no call is left (a call was started)."""
        self.ticking = True
        self._calls_left = True
        self._sweeps.start()

    def _still_ticking(self) -> bool:
        self.ticking = self._calls_left
        return self.ticking

    def _sweep(self) -> None:
        now = time.monotonic()
        calls = self.calls()
        overdue, self._overdue = self._overdue, {}
        for call in calls:
            if now < call.deadline:
                continue
            since = overdue.get(call, now)
            worker = call.worker
            if worker is not None and now - since < self.LATE and worker.unread():
                self._overdue[call] = since  # its answer may be among those bytes: read them first
                continue
            try:
                call.expire()
            except Exception:  # the answer's bug: the other calls still time out, and the sweep goes on
                log.exception("answering call %d of %r at its timeout failed", call.id, call.tool)
        self._calls_left = any(not call.done for call in calls)

    def close(self) -> None:
        self._overdue.clear()
        self.ticking = False
        self._sweeps.cancel()


class WorkerPool:
    """Every module runner of the daemon, the spawners they share, and their calls' deadlines.

    ``spawner`` starts the workers that run unconfined; its first fork server is ``first``, forked
    from the daemon at start when it could be (``spawner.fork_early``). ``confined_spawners`` start
    the confined ones, and the built-ins' (``allowlisted``) confined or not, from exec'd fork servers
    with the allowlisted environment: one per project (a worker's cwd), started when its first
    worker is needed and stopped when it has had none for a while, so that what one project's
    processes do to their fork server (keep it busy, stop it, have it replaced) reaches no other
    project's workers.
    """

    def __init__(
        self,
        settings: PoolSettings,
        first: EarlyForkServer | None = None,
        allowlisted: tuple[str, ...] = (),
        scheduler: Scheduler | None = None,
    ) -> None:
        self.settings = settings
        # The daemon's one loop for periodic work: the deadline sweep's, and every component's.
        self.scheduler = scheduler or Scheduler()
        # Modules under these dirs (the built-ins) always come from the allowlisted environment's
        # fork server, confined or not: where the kernel cannot confine them they still never see
        # a variable of the daemon's (a token, a key).
        self.allowlisted = tuple(path.rstrip("/") + "/" for path in allowlisted)
        self.spawner = Spawner(first=first)
        self.net_proxy = NetProxy()  # the one way out of confined workers allowed the network
        self.confined_spawners: dict[str, Spawner] = {}  # by project: the cwd of its workers
        self.deadlines = Deadlines(self.scheduler, self._unanswered)
        self.slots = WorkerSlots(settings.max_workers, self._stop_an_idle_worker)
        # By (path, cwd): a built-in module has a runner per project where it runs confined to it.
        self.runners: dict[tuple[str, str], ModuleRunner] = {}
        self.discarded: set[ModuleRunner] = set()  # runners of deleted modules, still draining
        self.call_ids = itertools.count(1)  # a call's id, unique among every worker's calls
        # What a module's workers import from besides the daemon's own (``environments``), asked
        # before each worker starts; None: the daemon's own environment for every module.
        self.environment: Callable[[ModuleRunner], Awaitable[EnvSpec | None]] | None = None
        # Set by the wiring: the runtime of TypeScript and JavaScript modules (``pool.javascript``).
        self.javascript: JavaScript | None = None
        # The daemon's event log, which asks the pool for the calls still running at each flush.
        self.events = EventLog(self.running_calls)

    def runner(self, path: str, kind: str, cwd: str, host: RunnerHost | None = None) -> ModuleRunner:
        """The runner of the module at ``path`` whose workers run in ``cwd`` (created on first use,
        with ``host``: who lists the module; none for a runner nobody lists)."""
        runner = self.runners.get((path, cwd))
        if runner is None:
            runner = self.runners[(path, cwd)] = ModuleRunner(self, path, kind, cwd, host or Unhosted())
        return runner

    def reconfigure(self, settings: PoolSettings) -> None:
        """Apply new limits. When what workers are told changed, every module's worker retires: calls
        in flight finish, and the next call starts a worker with the new limits."""
        self.settings = settings
        self.slots.resize(settings.max_workers)
        for runner in self.runners.values():
            old = runner.spec
            # Its environment's, not a limit: set anew before each start.
            spec = msgspec.structs.replace(settings.worker_spec(old.path, old.kind, old.cwd), env=old.env)
            if spec != old:
                runner.spec = spec
                runner.retire()

    def discard(self, path: str, cwd: str) -> None:
        """Forget the module at ``path`` run in ``cwd`` (it was deleted, or its project forgotten);
        its workers retire in the background."""
        runner = self.runners.pop((path, cwd), None)
        if runner is not None:
            runner.retire("its module was removed")
            if runner.retiring:
                self.discarded.add(runner)

    def inflight(self) -> int:
        return sum(r.inflight() for r in (*self.runners.values(), *self.discarded))

    def _stop_an_idle_worker(self) -> Worker | None:
        """For a spawn waiting for a slot: stop a generation a scan loaded and has not installed yet
        (its module's definitions are kept; its first call starts a worker), else retire the worker
        idle the longest; None when no worker serves no one."""
        for runner in (*self.runners.values(), *self.discarded):
            for worker in runner.unclaimed:
                if worker.state == "ready" and not worker.pending:
                    runner.unclaimed.discard(worker)
                    runner.retiring.add(worker)
                    worker.retire()
                    return worker
        idle = [(since, runner) for runner in self.runners.values() if (since := runner.idle_since()) is not None]
        if not idle:
            return None
        _since, runner = min(idle, key=lambda pair: pair[0])
        worker = runner.current
        runner.retire()
        return worker

    def _unanswered(self) -> Iterator[Call]:
        for runner in (*self.runners.values(), *self.discarded):
            yield from runner.unanswered()

    def running_calls(self) -> list[RunningCall]:
        """Every call not answered yet, as the event log writes its ``tool.start``."""
        return [
            (call.started, call.tool, call.runner.spec.path, call.id, call.context.session_id, call.context.agent)
            for call in self.deadlines.calls() if not call.done
        ]

    CLOSE_WAIT = 5.0  # seconds the workers have to exit at close before their fork servers end them

    async def close(self) -> None:
        """Retire every worker and wait for them to exit, at most ``CLOSE_WAIT`` seconds (a worker
        that does not exit is killed after 2 s; one whose end is never reported is not waited for),
        then stop the fork servers, which end whatever is left."""
        self.slots.close("the daemon is stopping", SpawnError)  # no worker starts from now on
        closing = asyncio.gather(*(r.close() for r in (*self.runners.values(), *self.discarded)))
        try:
            await asyncio.wait_for(closing, self.CLOSE_WAIT)
        except TimeoutError:
            log.warning("workers still running %g s after they were told to stop; their fork servers end them", self.CLOSE_WAIT)
        self.deadlines.close()
        await asyncio.gather(*(spawner.close() for spawner in self.spawners()))
        await self.net_proxy.close()

    def spawner_for(self, spec: WorkerSpec) -> Spawner:
        if spec.sandbox is None and not (self.allowlisted and spec.path.startswith(self.allowlisted)):
            return self.spawner
        return self.confined_spawner(spec.cwd)

    def confined_spawner(self, project: str) -> Spawner:
        """The spawner of the confined (and allowlisted) workers of ``project`` (their cwd)."""
        spawner = self.confined_spawners.get(project)
        if spawner is None:
            spawner = self.confined_spawners[project] = Spawner(
                environ=confined_environ, net_proxy=self.net_proxy, idle_stop=Spawner.IDLE_STOP,
            )
        return spawner

    def spawners(self) -> list[Spawner]:
        """Every spawner: the unconfined workers', then each project's confined workers'."""
        return [self.spawner, *self.confined_spawners.values()]

    def confined_info(self) -> list[dict[str, Any]]:
        """For status: each project's confined fork server (``Spawner.info``) that runs, or that was
        lost or replaced, by project."""
        return [
            {"project": project, **info} for project, spawner in sorted(self.confined_spawners.items())
            if (info := spawner.info())["pid"] is not None or info["lost"] or info["replaced"]
        ]
