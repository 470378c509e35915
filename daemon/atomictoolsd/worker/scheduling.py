"""Serving calls on a worker's channel: ``Runtime`` reads the daemon's messages, runs each call
(inline on the reading thread, on a pool thread, or on an event loop for async tools), and sends
results, progress, logs and questions back, one frame at a time.

See ``Runtime`` for how the reading role moves between threads and which calls run where.
Frames go out through ``Sender`` (``worker/sender.py``), which also has ``exit_worker``.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import queue
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import msgspec

from atomictools._authoring import Context
from atomictools._errors import AskError
from atomictoolsd.protocol import (
    INVALID_ARGUMENTS,
    MAX_DROPPED_KEYS,
    Answer,
    Ask,
    CallContext,
    CallTool,
    DaemonMessage,
    Dropped,
    FrameReader,
    Log,
    Progress,
    Result,
    WorkerSpec,
    encode_frame,
    error_result,
)
from atomictoolsd.worker.arguments import Undeclared, relax, with_choices
from atomictoolsd.worker.results import encode_json, exception_text, make_result
from atomictoolsd.worker.schema import ToolSpec
from atomictoolsd.worker.sender import Sender, exit_worker

__all__ = ["Runtime"]

_asdict = msgspec.structs.asdict
_astuple = msgspec.structs.astuple

# How much one read of the channel asks for: little while frames come whole (a call is a hundred
# bytes or so, and CPython allocates the whole size before it shrinks the bytes to what came: at
# 64 KiB that costs a read ~0.2 µs more), much while the rest of a large frame is awaited.
SMALL_READ = 4096
LARGE_READ = 1 << 16

# A sync call's arguments: by position (a ``positional`` tool's, from ``Runtime.run``) or by name.
Arguments = tuple[Any, ...] | dict[str, Any]
Job = tuple[int, ToolSpec, Arguments]


class Runtime:
    """Serves calls on the worker's channel.

    One thread at a time reads the channel (the reader). A call to a sync tool runs inline on the
    reader: no hand-off between threads sits between a request and its answer (a hand-off costs
    ~25 µs on one core here, more across cores). If an inline call runs past ``INLINE_BUDGET``, a
    watchdog gives the reading role to a new thread, so other calls and cancellations are still
    read; the old reader finishes its call and ends.

    A tool is *slow* from a call that ran ``QUICK_CALL`` or longer (or held the reading role past
    its budget) until ``QUICK_AGAIN`` of its calls in a row were quick. Calls of a slow tool that
    arrive together with others go to pool threads, so they overlap; calls of a quick tool that
    arrive together run inline one after the other, which costs each less than a hand-off would
    (sixteen calls in flight to a one-line tool: up to twice the calls/s). A quick call that only
    looked slow (the machine was busy) sends the next few calls to the pool. A slow
    tool's calls are all timed; of the quick ones, the first inline call after each of the
    watchdog's looks is (at most one every ``INLINE_BUDGET``).

    The inline path of a quick call reads no clock and, when no other sync call runs and no other
    thread sends, takes no lock (``Sender.send_inline``): pinned to one core with the daemon and its
    client, the two together measured ~1.8 µs a call (5 % of the call over the socket), many times
    their cost in a tight loop; either alone saves less than 3 % (docs/performance.md).
    The watchdog needs no start time. Each reader marks its inline call in a slot of its own
    (``_marks[generation]``: the call's id); at each look the watchdog notes the current reader's
    mark (``_sighted``), and when it finds the same call there at the next look it hands the reading
    role on (so after one to two budgets). A reader that clears its slot and then finds its call not
    the one last sighted, and the role still its own, knows that no hand-over can have happened or
    can happen for that call, and that no other thread started a call meanwhile: it lowers the count
    without the lock.

    At most ``threads`` sync calls run at once; more wait in a backlog. Async tools run on an event
    loop in a thread of its own, started with the first async call. Frames never interleave
    (``Sender``): only a reader sends without the lock, and not while a reader whose role moved on
    still runs (``Sender.pause_inline``), so no two threads ever do.
    """

    INLINE_BUDGET = 0.01  # seconds an inline call may hold the reading role
    QUICK_CALL = 0.001  # seconds: a call this long or longer makes its tool slow
    QUICK_AGAIN = 32  # quick calls in a row after which a slow tool counts as quick again
    IDLE_LOOKS = 100  # the watchdog's looks without an inline call (a second) before it parks

    def __init__(
        self, sock: socket.socket, tools: dict[str, ToolSpec], worker: WorkerSpec, sender: Sender | None = None
    ) -> None:
        self.sock = sock
        self.tools = tools
        self.worker = worker
        # The sync tools without a ctx parameter: most tools, and the ones run from ``run`` directly.
        self._plain = {name: spec for name, spec in tools.items() if not spec.is_async and spec.context_param is None}
        self.calls: dict[int, Context] = {}  # the running calls that have a ctx, until they answer
        self.context = CallContext()  # who asked for the call being read (CallTool.context)
        self._sender = sender or Sender(sock)  # shared with whatever else sends on the channel
        self._frames = FrameReader(type=DaemonMessage)
        self._inbox: collections.deque[DaemonMessage] = collections.deque()
        self._lock = threading.Lock()  # guards the counters, the backlog and the reading role
        self._reader_gen = 0  # which thread may read: the one started for this generation
        # Each reader's inline call, by reader generation: its call id (0: none).
        self._marks: dict[int, int] = {}
        self._marked_tool = ""  # the tool of the current reader's marked call
        self._sighted = 0  # the call the watchdog found marked at its last look (0: none)
        self._slow: dict[str, int] = {}  # slow tools → quick calls still to see before they are quick
        self._running = 0  # sync calls running, inline or on the pool
        self._idle = 0  # pool threads waiting for a job
        self._jobs: queue.SimpleQueue[Job] = queue.SimpleQueue()
        self._backlog: collections.deque[Job] = collections.deque()
        self._time_next = True  # the next inline call is timed (set at each of the watchdog's looks)
        self._watching = threading.Event()  # set while the watchdog looks; cleared when it parks
        self._watched = False  # the same, read by a reader on every inline call (cheaper than is_set)
        self._watchdog: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: dict[int, asyncio.Task[Any]] = {}
        self._refused: dict[int, str] = {}  # calls that tried to send a message too large: why they fail
        self._asks: dict[int, tuple[int, Future[bytes]]] = {}  # ctx.elicit/sample waiting: ask id → (call, answer)
        self._ask_ids = itertools.count(1)

    def send(self, message: Any) -> None:
        try:
            self._sender.send(encode_frame(message))
        except OSError:
            exit_worker()  # the daemon is gone

    # The call path below is written for few Python calls and no lock on either side of a call: a
    # sync tool without ctx goes run → _run_inline and back to the channel (a tool with a ctx or
    # async, or arguments that do not validate as they are, through start_call; a call on a pool
    # thread or from the backlog through _run and finish_call). Pinned to one core with the daemon
    # and its client, every step it takes costs several times what it does in a tight loop.

    # reading

    def run(self, generation: int = 0) -> None:
        """Read and dispatch messages while this thread holds the reading role.

        Returns when the role has moved on; the process exits (``_exit``) when the channel closes.
        """
        inbox = self._inbox
        recv = self.sock.recv
        single_frame = self._frames.single_frame
        feed = self._frames.feed
        plain = self._plain
        slow = self._slow
        size = SMALL_READ
        while self._reader_gen == generation:
            if inbox:
                message = inbox.popleft()
            else:
                try:
                    data = recv(size)
                except OSError:
                    data = b""
                if not data:
                    exit_worker()
                message = single_frame(data)
                if message is None:  # part of a frame, or several: the reader keeps what is not whole yet
                    inbox.extend(feed(data))
                    size = LARGE_READ if self._frames.partial else SMALL_READ  # the rest of a large one
                    continue
            try:
                if type(message) is CallTool:
                    if message.context is not None:
                        self.context = message.context  # the calls that follow, sent without one, have this one
                    spec = plain.get(message.tool)
                    if spec is not None and not (inbox and spec.name in slow):
                        # start_call's work for a sync tool without ctx, when its arguments are valid
                        try:
                            decoded = spec.decoder.decode(message.arguments or b"{}")
                        except (msgspec.ValidationError, msgspec.DecodeError, UnicodeDecodeError):
                            pass  # start_call drops what it does not declare, or answers the error
                        else:
                            arguments = _astuple(decoded) if spec.positional else _asdict(decoded)
                            self._run_inline(message.call_id, spec, arguments, generation)
                            continue
                    job = self.start_call(message)
                    if job is None:
                        continue
                    if inbox and job[1].name in slow:
                        self._dispatch(job)  # more is waiting to be read: do not sit on it
                    else:
                        self._run_inline(*job, generation)
                elif type(message) is Answer:
                    self._answered(message)
                else:
                    self.cancel_call(message.call_id)
            except BaseException as exc:  # noqa: BLE001 - whatever it is, the call's failure, not the worker's
                self._failed(message, exc)
        self._marks.pop(generation, None)  # the role moved on: this reader marks no more calls
        with self._lock:
            self._sender.resume_inline()  # after its last send: the current reader may send without the lock

    def _failed(self, message: DaemonMessage, exc: BaseException) -> None:
        """A message whose handling raised what nothing there expects (an argument type's own check,
        a dataclass's ``__post_init__``, raising): a call fails with the error; the worker, its
        other calls and this reading thread go on."""
        if type(message) is CallTool:
            self.calls.pop(message.call_id, None)
            self.send(Result(message.call_id, error_result(exception_text(message.tool, exc, self.worker.memory_limit))))

    def _run_inline(self, call_id: int, spec: ToolSpec, arguments: Arguments, generation: int) -> None:
        """Run a sync call on the reading thread, then whatever the backlog holds (``_run``)."""
        lock = self._lock
        alone = self._running == 0
        if alone:
            # No sync call runs, so no other thread changes the count now: only the reader starts
            # calls, and a finishing one lowers it (under the lock) only after it ran.
            self._running = 1
        else:
            with lock:
                if self._running >= self.worker.threads:
                    self._backlog.append((call_id, spec, arguments))  # a finishing call picks it up
                    return
                self._running += 1
        self._marks[generation] = call_id
        self._marked_tool = spec.name
        if not self._watched:  # after marking the call: see _watch, which parks likewise
            self._start_watching()
        timed = self._time_next or spec.name in self._slow
        if timed:
            self._time_next = False
            started = time.perf_counter()
        try:
            value = spec.fn(*arguments) if type(arguments) is tuple else spec.fn(**arguments)
            result = make_result(spec, value, self.worker)
        except BaseException as exc:  # noqa: BLE001 - SystemExit from a tool is its failure too
            result = error_result(exception_text(spec.name, exc, self.worker.memory_limit))
        if timed:
            self._timed(spec.name, time.perf_counter() - started)
        if spec.context_param is None:
            # finish_call's last step only: without a ctx, the call asked nothing and sent nothing.
            self._sender.send_inline(encode_frame(Result(call_id, result)))
        else:
            self.finish_call(call_id, result)
        if alone:
            self._marks[generation] = 0  # first: from here on no look can see the call
            if self._sighted != call_id and self._reader_gen == generation:
                # Not seen at the last look, and the role is still ours: no hand-over was under way
                # (it takes two looks at the call), none can start now that the call is unmarked,
                # and no other reader started a call, to the backlog or the pool, meanwhile.
                self._running = 0
                return
        with lock:
            job = self._backlog.popleft() if self._backlog else None  # type: ignore[assignment]
            if job is None:
                self._running -= 1
                if self._marks.get(generation) == call_id:
                    self._marks[generation] = 0
                return
        self._run(job, generation)  # still marked inline: the watchdog hands the reading role on if it lasts

    def _start_watching(self) -> None:
        with self._lock:
            if self._watchdog is None:
                self._watchdog = threading.Thread(target=self._watch, name="tool-watchdog", daemon=True)
                self._watchdog.start()
            self._watched = True
            self._watching.set()

    def _watch(self) -> None:
        """While calls run inline, hand the reading role on when one overstays its budget: when the
        same inline call is there at two looks in a row. Each look also has the next inline call
        timed."""
        idle = 0  # looks in a row that found no inline call
        while True:
            self._watching.wait()
            time.sleep(self.INLINE_BUDGET)
            with self._lock:
                self._time_next = True
                generation = self._reader_gen
                call_id = self._marks.get(generation)
                if not call_id:
                    idle += 1
                    if idle >= self.IDLE_LOOKS:  # idle: park until the next inline call
                        idle = 0
                        self._watched = False
                        self._watching.clear()
                        # A reader marks its call, then looks whether we watch; we stop watching,
                        # then look whether a call was marked: one of the two sees the other.
                        if self._marks.get(self._reader_gen):
                            self._watched = True
                            self._watching.set()
                    continue
                idle = 0
                if call_id != self._sighted:  # a call not seen before: noted, for the next look
                    self._sighted = call_id
                    continue
                # The same call as at the last look: it has held the role a budget or more. It stays
                # the one sighted: its reader, when it ends, takes the lock (see _run_inline).
                self._slow[self._marked_tool] = self.QUICK_AGAIN  # what waits behind it goes to the pool
                self._marks.pop(generation, None)
                self._sender.pause_inline()  # before the new reader exists: until this one ends
                self._reader_gen += 1
                threading.Thread(target=self.run, args=(self._reader_gen,), name="tool-reader", daemon=True).start()

    # running sync calls

    def _run(self, job: Job | None, inline: int | None = None) -> None:
        """Run a sync call on this thread, then any the backlog holds; the calls of reader
        ``inline`` stay marked inline (``_marks[inline]``) until the backlog is empty."""
        while job is not None:
            call_id, spec, arguments = job
            started = time.perf_counter()
            try:
                value = spec.fn(*arguments) if type(arguments) is tuple else spec.fn(**arguments)
                result = make_result(spec, value, self.worker)
            except BaseException as exc:  # noqa: BLE001 - SystemExit from a tool is its failure too
                result = error_result(exception_text(spec.name, exc, self.worker.memory_limit))
            seconds = time.perf_counter() - started
            if seconds >= self.QUICK_CALL or spec.name in self._slow:
                self._timed(spec.name, seconds)
            self.finish_call(call_id, result)
            with self._lock:
                job = self._backlog.popleft() if self._backlog else None
                if job is None:
                    self._running -= 1
                    if inline is not None:
                        self._marks[inline] = 0

    def _timed(self, tool: str, seconds: float) -> None:
        """Keep count of which tools are slow (a race between threads only blurs the count)."""
        if seconds >= self.QUICK_CALL:
            self._slow[tool] = self.QUICK_AGAIN
        elif tool in self._slow:
            left = self._slow.get(tool, 0) - 1
            if left > 0:
                self._slow[tool] = left
            else:
                self._slow.pop(tool, None)

    def _dispatch(self, job: Job) -> None:
        with self._lock:
            if self._running >= self.worker.threads:
                self._backlog.append(job)  # a finishing call picks it up
                return
            self._running += 1
            grow = self._idle == 0
            if not grow:
                self._idle -= 1
        if grow:
            threading.Thread(target=self._pool_thread, args=(job,), name="tool", daemon=True).start()
        else:
            self._jobs.put(job)

    def _pool_thread(self, job: Job) -> None:
        while True:
            self._run(job)
            with self._lock:
                self._idle += 1
            job = self._jobs.get()

    # calls

    def start_call(self, call: CallTool) -> Job | None:
        """Validate a call; return the job to run, or None when it is answered or async."""
        call_id = call.call_id
        name = call.tool
        spec = self.tools.get(name)
        if spec is None:
            self.send(Result(call_id, error_result(f"Unknown tool {name!r} in this module")))
            return None
        try:
            kwargs = spec.parse_arguments(call.arguments or b"{}")
        except (msgspec.ValidationError, msgspec.DecodeError, UnicodeDecodeError) as exc:
            kwargs = self._relaxed(call_id, spec, call.arguments, exc)
            if kwargs is None:
                return None
        if spec.context_param is not None:
            context = self.context
            ctx = kwargs[spec.context_param] = Context(
                session_id=context.session_id,
                message_id=context.message_id,
                agent=context.agent,
                directory=context.directory,
                worktree=context.worktree,
                tool_use_id=context.tool_use_id,
                emit=self._emitter(call_id, call.progress, name),
                ask=self._asker(call_id),
            )
            self.calls[call_id] = ctx
        if spec.is_async:
            self._event_loop().call_soon_threadsafe(self._start_task, call_id, spec, kwargs)
            return None
        return (call_id, spec, kwargs)  # run inline or on the pool, or kept in the backlog (at ``threads``)

    def _relaxed(self, call_id: int, spec: ToolSpec, arguments: bytes, error: Exception) -> dict[str, Any] | None:
        """The call's arguments once relaxed (``arguments.relax``: integral floats as integers, the
        undeclared ones dropped and reported to the daemon as ``dropped``); None when the call is
        answered with the error instead."""
        declared = (spec.input_schema.get("properties") or {}).keys()
        try:
            split = relax(arguments or b"{}", declared)
            if split is None:
                raise error
            kept, dropped = split
            kwargs = spec.parse_arguments(kept)
        except UnicodeDecodeError:  # msgspec's error for a string that is not UTF-8
            self.send(Result(call_id, error_result(f"{INVALID_ARGUMENTS} {spec.name!r}: a string in them is not UTF-8")))
            return None
        except (msgspec.ValidationError, msgspec.DecodeError, Undeclared) as exc:
            explained = with_choices(str(exc), spec.input_schema)
            self.send(Result(call_id, error_result(f"{INVALID_ARGUMENTS} {spec.name!r}: {explained}")))
            return None
        if dropped:
            self.send(Dropped(call_id, dropped[:MAX_DROPPED_KEYS]))
        return kwargs

    def finish_call(self, call_id: int, result: bytes | None) -> None:
        if self.calls:
            self.calls.pop(call_id, None)
        if self._asks:
            self._drop_asks(call_id, "the call has ended")
        refused = self._refused.pop(call_id, None) if self._refused else None
        if refused is not None and result is not None:
            result = error_result(refused)
        self.send(Result(call_id, result))

    def cancel_call(self, call_id: int) -> None:
        """Stop a call: set its ctx's cancel event, take it out of the backlog, cancel its task.
        A call that has answered is none of these: nothing happens."""
        ctx = self.calls.get(call_id)
        if ctx is not None:
            ctx._cancel()
        if self._asks:
            self._drop_asks(call_id, "the call was cancelled (or timed out) while it waited for the client")
        with self._lock:
            for job in self._backlog:
                if job[0] == call_id:
                    self._backlog.remove(job)
                    self.finish_call(call_id, None)
                    return
        if self._loop is not None:
            # Through the loop, behind the _start_task that start_call scheduled: looked up here,
            # the task of a call whose cancel came right behind it would not exist yet.
            self._loop.call_soon_threadsafe(self._cancel_task, call_id)

    # asking the client (ctx.elicit, ctx.sample)

    def _asker(self, call_id: int) -> Callable[[str, dict[str, Any], float | None], Future[bytes]]:
        def ask(method: str, params: dict[str, Any], wait: float | None) -> Future[bytes]:
            future: Future[bytes] = Future()
            if call_id not in self.calls:
                future.set_exception(AskError("the call has ended; nothing was asked"))
                return future
            ask_id = next(self._ask_ids)
            self._asks[ask_id] = (call_id, future)
            future.add_done_callback(lambda _: self._asks.pop(ask_id, None))  # answered, failed, or given up on
            self.send(Ask(call_id, ask_id, method, encode_json(params), None if wait is None else float(wait)))  # type: ignore[arg-type]
            return future

        return ask

    def _answered(self, message: Answer) -> None:
        entry = self._asks.pop(message.ask_id, None)
        if entry is None or entry[0] != message.call_id or entry[1].done():
            return  # the tool stopped waiting (its timeout), or the call ended
        future = entry[1]
        if message.result is not None:
            future.set_result(message.result)
        else:
            future.set_exception(AskError(message.error or "the client gave no answer"))

    def _drop_asks(self, call_id: int, why: str) -> None:
        for ask_id, (owner, future) in list(self._asks.items()):
            if owner == call_id:
                self._asks.pop(ask_id, None)
                if not future.done():
                    future.set_exception(AskError(why))

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="tool-loop", daemon=True).start()
            self._loop = loop
        return self._loop

    def _start_task(self, call_id: int, spec: ToolSpec, kwargs: dict[str, Any]) -> None:
        task = asyncio.ensure_future(_call_async(spec.fn, kwargs), loop=self._loop)
        self._tasks[call_id] = task
        task.add_done_callback(lambda t: self._task_done(call_id, spec, t))

    def _cancel_task(self, call_id: int) -> None:
        task = self._tasks.get(call_id)
        if task is not None:
            task.cancel()

    def _task_done(self, call_id: int, spec: ToolSpec, task: asyncio.Task[Any]) -> None:
        self._tasks.pop(call_id, None)
        if task.cancelled():
            self.finish_call(call_id, None)
            return
        exc = task.exception()
        if exc is not None:
            result = error_result(exception_text(spec.name, exc, self.worker.memory_limit))
        else:
            try:
                result = make_result(spec, task.result(), self.worker)
            except Exception as err:  # noqa: BLE001 - an unencodable result is the tool's error
                result = error_result(f"Tool {spec.name!r} returned a value that cannot be sent: {err}")
        self.finish_call(call_id, result)

    def _emitter(self, call_id: int, progress: bool, tool: str) -> Callable[[str, tuple[Any, ...]], None]:
        def emit(kind: str, payload: tuple[Any, ...]) -> None:
            if call_id not in self.calls or (kind == "progress" and not progress):
                return  # not asked for, or the call has answered (MCP: nothing after the response)
            if kind == "log":
                payload = (payload[0], encode_json(payload[1]))
                size = len(payload[1])
            else:
                # The types the daemon accepts (it stops a worker that sends others): a wrong one
                # is the tool's error, raised where it called ctx.progress.
                value, total, message = payload
                payload = (float(value), None if total is None else float(total), None if message is None else str(message))
                size = 0 if message is None else len(payload[2].encode("utf-8", "surrogatepass"))
            limit = self.worker.max_result_bytes
            if size > limit:
                # Not sent: no client accepts a message this large. The call answers with why.
                what = "log" if kind == "log" else "progress"
                self._refused.setdefault(call_id, (
                    f"Tool {tool!r} sent a {what} message of {size:,} bytes, more than the {limit:,} bytes "
                    "a message may carry (max_message_bytes)"
                ))
                return
            self.send(Log(call_id, *payload) if kind == "log" else Progress(call_id, *payload))

        return emit


async def _call_async(fn: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
    try:
        return await fn(**kwargs)
    except (SystemExit, KeyboardInterrupt) as exc:
        # A task re-raises these out of the event loop; report them as the tool's failure instead.
        raise RuntimeError(f"the tool raised {type(exc).__name__}({exc})") from None
