"""The code inside a tool worker: load one tool module, then serve calls to its tools.

A worker is a process of its own, so whatever a tool does (raise, hang, leak, crash, fork) stays
here. This module must never import the server, uvloop or watchfiles: a fork server pre-imports it,
and every import here is paid by every worker that is not forked.

Messages (``workers/protocol.py`` defines each as a tagged, array-like struct, and the framing):

daemon → worker
    ``CallTool``: ``["call", call_id, tool, arguments_json, context, progress]`` where ``context`` is a
    ``CallContext`` (``[session_id, message_id, agent, directory, worktree, tool_use_id]``) and
    ``progress`` says whether the caller asked for progress notifications.
    ``Cancel``: ``["cancel", call_id]``: cancel an async call; set ``ctx.cancel_event`` for a sync one.
    ``Answer``: ``["answer", call_id, ask_id, result_json, error]``: the client's answer to an ``ask``
    (``result_json`` None and ``error`` why, when there is none).

worker → daemon
    ``["loaded", definitions, load_ms, problems, deps, fingerprint, helpers]`` once, when the module loaded;
    ``problems`` lists the tools it skipped (``{tool, line, message}``: a declarative file's malformed
    tools), else ``[]``; ``deps`` lists ``[path, size, mtime_ns]`` of the other files of its directory
    it imported; ``fingerprint`` is ``[size, crc32]`` of the module file's bytes it loaded (None if it
    read none), ``helpers`` ``[path, size, crc32]`` of the bytes it loaded from each of those files.
    ``["failed", {file, line, message, traceback, deps, fingerprint, helpers}]`` once, instead, when it did not; then
    it exits.
    ``["result", call_id, result_json]``: the MCP ``CallToolResult`` as JSON; ``None`` for a call that
    ended by cancellation.
    ``["progress", call_id, progress, total, message]`` and ``["log", call_id, level, data]``.
    ``["dropped", call_id, keys]``: the call's undeclared arguments that were dropped (see
    ``arguments``), before its result.
    ``["ask", call_id, ask_id, method, params_json, wait]``: ``ctx.elicit``/``ctx.sample`` asks the
    client that made the call (``method`` is ``elicitation/create`` or ``sampling/createMessage``).
    ``["output", fd, data, dropped]``: what the worker wrote to its stdout (1) or stderr (2); see
    ``output``.

The daemon accepts exactly these shapes and types (``protocol.WorkerMessage``) and no message larger
than ``max_result_bytes`` (its ``max_message_bytes``); it kills a worker that sends anything else. So
a result past the limit is refused here (kept in a spill file), and a ``ctx.log`` or ``ctx.progress``
message past it is not sent: its call answers with an error naming the limit.
"""

from __future__ import annotations

import asyncio
import collections
import importlib.util
import itertools
import os
import queue
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import msgspec

from atomictools._authoring import Context
from atomictools._errors import AskError, ToolError
from atomictools._schema import SchemaError, ToolSpec, collect_tools, enc_hook
from atomictoolsd.workers.protocol import (
    Answer,
    Ask,
    CallTool,
    DaemonMessage,
    Dropped,
    Failed,
    FrameReader,
    Loaded,
    LoadFailure,
    Log,
    Progress,
    Result,
    WorkerSpec,
    encode_frame,
    error_result,
)
from atomictoolsd.workers.runtime.arguments import Undeclared, split_undeclared
from atomictoolsd.workers.runtime.blocks import content_blocks, is_content
from atomictoolsd.workers.runtime.limits import apply_memory_limit, describe_limit, memory_error_text
from atomictoolsd.workers.runtime.output import capture as capture_output
from atomictoolsd.workers.runtime.sourceload import (
    SourceOnlyLoader,
    fingerprint,
    fingerprints,
    imported_from,
    install_source_only_finder,
)
from atomictoolsd.workers.runtime.truncate import spill, truncate

__all__ = ["LOADERS", "LoadFailure", "WorkerSpec", "load_module", "main", "make_result", "prepare", "warm_up"]

_json_encode = msgspec.json.Encoder(enc_hook=enc_hook).encode


# -- loading -------------------------------------------------------------------------------------


def _module_name(stem: str) -> str:
    # A tool file may be named like a stdlib module (json.py): never shadow the real one.
    if stem in sys.modules or stem in sys.stdlib_module_names:
        return f"_atomic_tool_{stem}"
    return stem


def _error_line(exc: BaseException, path: str) -> int | None:
    if isinstance(exc, SyntaxError) and exc.filename == path:
        return exc.lineno
    line = None
    for frame, lineno in traceback.walk_tb(exc.__traceback__):
        if frame.f_code.co_filename == path:
            line = lineno
    return line


def _load_python(path: str) -> list[ToolSpec]:
    directory, filename = os.path.split(path)
    stem = filename.rsplit(".", 1)[0]
    # Appended, not prepended: helpers (_util.py) import by name, but never shadow the stdlib. This
    # is the one directory of a project on sys.path: the fork server is started sealed (no cwd, no
    # PYTHONPATH), and the worker's move into the project root (spec.cwd) adds nothing to it.
    if directory not in sys.path:
        sys.path.append(directory)
    install_source_only_finder(directory)
    name = _module_name(stem)
    _declared.clear()
    spec = importlib.util.spec_from_file_location(name, path, loader=SourceOnlyLoader(name, path))
    if spec is None or spec.loader is None:
        raise LoadFailure(path, None, "not a loadable Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:  # noqa: BLE001 - a tool module may raise anything, SystemExit included
        message = (
            f"SyntaxError: {exc.msg}" if isinstance(exc, SyntaxError) else f"{type(exc).__name__}: {exc}"
        )
        raise LoadFailure(path, _error_line(exc, path), message, traceback.format_exc()) from None
    if hasattr(module, "__atomic_sandbox__"):
        _declared["sandbox"] = module.__atomic_sandbox__
    try:
        return collect_tools(vars(module), name, stem)
    except SchemaError as exc:
        raise LoadFailure(path, None, str(exc)) from None


_declared: dict[str, Any] = {}  # what the module just loaded declared of itself (__atomic_sandbox__)


def _load_declarative(path: str) -> tuple[list[ToolSpec], list[dict[str, Any]]]:
    from atomictoolsd.declarative import load_file  # usually imported already: see prepare()

    return load_file(path)


# Loaders by module kind. A loader returns the module's tools, or (tools, problems) when it can
# skip a malformed tool and serve the rest.
LoaderResult = list[ToolSpec] | tuple[list[ToolSpec], list[dict[str, Any]]]
LOADERS: dict[str, Callable[[str], LoaderResult]] = {"python": _load_python, "declarative": _load_declarative}

# Modules a loader needs beyond this one, by module kind. The fork server imports them just before it
# forks the first worker of that kind, so every later worker of the kind starts warm, and a daemon
# that serves no module of the kind never pays for them.
LOADER_IMPORTS: dict[str, tuple[str, ...]] = {"declarative": ("atomictoolsd.declarative",)}


def prepare(kind: str) -> None:
    """Import what the loader of ``kind`` needs (in the fork server, before forking a worker)."""
    for name in LOADER_IMPORTS.get(kind, ()):
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - the worker imports it again and reports the failure as a load error
            pass


def load_module(spec: WorkerSpec) -> tuple[list[ToolSpec], list[dict[str, Any]]]:
    """Load the module a worker serves: its tools, and the problems of tools it skipped.

    Raises:
        LoadFailure: the module cannot be served at all.
    """
    loader = LOADERS.get(spec.kind)
    if loader is None:
        raise LoadFailure(spec.path, None, f"unknown module kind {spec.kind!r}")
    loaded = loader(spec.path)
    return loaded if isinstance(loaded, tuple) else (loaded, [])


_WARM_UP = '''
from typing import Annotated, Literal

import msgspec
from atomictools import Context, Field, tool


class Point(msgspec.Struct):
    x: int
    y: float = 0.0


@tool
def warm(
    name: Annotated[str, Field("A name", max_length=8, pattern="^[a-z]+$")],
    ctx: Context,
    count: Annotated[int, Field(ge=0)] = 1,
    mode: Literal["a", "b"] = "a",
    points: list[Point] | None = None,
) -> dict[str, int]:
    """Warm the caches."""
    return {}
'''


def warm_up() -> None:
    """Build one tool in the fork server, so that every worker it forks starts with the compiler's,
    the regex module's and msgspec's caches warm (a small module then loads in ~1.7 ms, not ~4.3)."""
    namespace: dict[str, Any] = {"__name__": "_atomic_warm_up"}
    try:
        exec(compile(_WARM_UP, "<atomictoolsd warm-up>", "exec"), namespace)
        for spec in collect_tools(namespace, "_atomic_warm_up", "warm"):
            spec.definition()
            spec.parse_arguments(b'{"name":"abc","points":[{"x":1}]}')
    except Exception:  # noqa: BLE001 - only an optimisation: workers load as well without it
        pass


# -- results -------------------------------------------------------------------------------------


def _exception_text(tool: str, exc: BaseException, memory_limit: int = 0) -> str:
    if isinstance(exc, ToolError):
        return str(exc) or type(exc).__name__
    if isinstance(exc, MemoryError):
        return memory_error_text(tool, memory_limit)
    # Drop the runtime's own frame: the model and the author need the tool's frames only.
    tb = exc.__traceback__
    if tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    trace = "".join(traceback.format_exception(type(exc), exc, tb))
    return f"Tool {tool!r} raised {type(exc).__name__}: {exc}\n\n{trace}".rstrip()


def make_result(spec: ToolSpec, value: Any, worker: WorkerSpec) -> bytes:
    """Turn what a tool returned into an MCP ``CallToolResult`` (JSON bytes)."""
    if (
        type(value) is str
        and spec.output_schema is None
        and len(value) <= worker.truncate_bytes // 4  # 4 bytes a character at most in UTF-8
        and value.count("\n") < worker.truncate_lines
    ):
        # The common case, well inside every limit: one text block, built directly.
        return b'{"content":[{"type":"text","text":' + _json_encode(value) + b"}]}"
    if spec.output_schema is None and is_content(value):  # with a schema, the value must match it
        return _content_result(spec, value, worker)
    structured = None
    if spec.output_schema is not None:
        try:
            if not (isinstance(spec.output_type, type) and type(value) is spec.output_type):
                value = msgspec.convert(value, spec.output_type, from_attributes=True)
        except (msgspec.ValidationError, TypeError) as exc:
            return error_result(
                f"Tool {spec.name!r} returned a value that does not match its return annotation: {exc}"
            )
        structured = {"result": value} if spec.wrap_output else value
        text = _json_encode(structured).decode()
    elif isinstance(value, str):
        text = value
    elif value is None:
        text = None
    elif isinstance(value, (bytes, bytearray)):
        text = bytes(value).decode("utf-8", "replace")
    else:
        text = _json_encode(value).decode()

    meta = None
    if text is not None:
        cut = truncate(text, worker.truncate_lines, worker.truncate_bytes, worker.spill_dir, spec.name)
        if cut is not None:
            text = cut.text
            meta = {"atomic/fullOutput": cut.path}
    result: dict[str, Any] = {"content": [] if text is None else [{"type": "text", "text": text}]}
    if structured is not None:
        result["structuredContent"] = structured
    if meta is not None:
        result["_meta"] = meta
    return _checked_size(spec, _json_encode(result), worker)


def _content_result(spec: ToolSpec, value: Any, worker: WorkerSpec) -> bytes:
    """An image, audio, a resource or a link, or a list mixing them with text: their blocks."""
    try:
        blocks, spilled = content_blocks(
            value, spec.name, worker.truncate_lines, worker.truncate_bytes, worker.spill_dir, _json_encode
        )
    except (OSError, ValueError, TypeError) as exc:
        return error_result(f"Tool {spec.name!r} returned content that cannot be sent: {exc}")
    result: dict[str, Any] = {"content": blocks}
    if spilled:
        result["_meta"] = {"atomic/fullOutput": spilled[0], "atomic/spilled": spilled}
    return _checked_size(spec, _json_encode(result), worker)


def _checked_size(spec: ToolSpec, encoded: bytes, worker: WorkerSpec) -> bytes:
    if len(encoded) > worker.max_result_bytes:
        # Structured content is never cut (it would no longer match its schema), and a result this
        # large would cost the daemon several times its size in memory on its way to a client that
        # refuses messages past the same limit: refuse it, keeping the whole in a spill file.
        path = spill(encoded, worker.spill_dir, spec.name, ".json")
        return error_result(
            f"Tool {spec.name!r} returned a result of {len(encoded):,} bytes, more than the {worker.max_result_bytes:,} "
            f"bytes a message may carry (max_message_bytes); the whole result is in {path}"
        )
    return encoded


# -- serving -------------------------------------------------------------------------------------


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
    looked slow (the machine was busy) sends the next few calls to the pool, as before.

    At most ``threads`` sync calls run at once; more wait in a backlog. Async tools run on an event
    loop in a thread of its own, started with the first async call. Every send takes one lock, so
    frames never interleave.
    """

    INLINE_BUDGET = 0.01  # seconds an inline call may hold the reading role
    QUICK_CALL = 0.001  # seconds: a call this long or longer makes its tool slow
    QUICK_AGAIN = 32  # quick calls in a row after which a slow tool counts as quick again

    def __init__(
        self, sock: socket.socket, tools: dict[str, ToolSpec], worker: WorkerSpec, send_lock: threading.Lock | None = None
    ) -> None:
        self.sock = sock
        self.tools = tools
        self.worker = worker
        self.calls: dict[int, Context | None] = {}
        self._send_lock = send_lock or threading.Lock()  # shared with whatever else sends on the channel
        self._frames = FrameReader(type=DaemonMessage)
        self._inbox: collections.deque[DaemonMessage] = collections.deque()
        self._lock = threading.Lock()  # guards the counters, the backlog and the reading role
        self._reader_gen = 0  # which thread may read: the one started for this generation
        self._inline: tuple[int, float, str] | None = None  # (reader generation, start, tool) inline
        self._slow: dict[str, int] = {}  # slow tools → quick calls still to see before they are quick
        self._running = 0  # sync calls running, inline or on the pool
        self._idle = 0  # pool threads waiting for a job
        self._jobs: queue.SimpleQueue[tuple[int, ToolSpec, dict[str, Any]]] = queue.SimpleQueue()
        self._backlog: collections.deque[tuple[int, ToolSpec, dict[str, Any]]] = collections.deque()
        self._watching = threading.Event()
        self._watchdog: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: dict[int, asyncio.Task[Any]] = {}
        self._refused: dict[int, str] = {}  # calls that tried to send a message too large: why they fail
        self._asks: dict[int, tuple[int, Future[bytes]]] = {}  # ctx.elicit/sample waiting: ask id → (call, answer)
        self._ask_ids = itertools.count(1)

    def send(self, message: Any) -> None:
        frame = encode_frame(message)
        try:
            with self._send_lock:
                self.sock.sendall(frame)
        except OSError:
            _exit()  # the daemon is gone

    # reading

    def run(self, generation: int = 0) -> None:
        """Read and dispatch messages while this thread holds the reading role.

        Returns when the role has moved on; the process exits (``_exit``) when the channel closes.
        """
        while self._reader_gen == generation:
            message = self._next_message()
            if type(message) is CallTool:
                job = self.start_call(message)
                if job is None:
                    continue
                if self._inbox and job[1].name in self._slow:
                    self._dispatch(job)  # more is waiting to be read: do not sit on it
                else:
                    self._run_inline(job, generation)
            elif type(message) is Answer:
                self._answered(message)
            else:
                self.cancel_call(message.call_id)

    def _next_message(self) -> DaemonMessage:
        inbox = self._inbox
        while not inbox:
            try:
                data = self.sock.recv(65536)
            except OSError:
                data = b""
            if not data:
                _exit()
            inbox.extend(self._frames.feed(data))
        return inbox.popleft()

    def _run_inline(self, job: tuple[int, ToolSpec, dict[str, Any]], generation: int) -> None:
        self._inline = (generation, time.monotonic(), job[1].name)
        if not self._watching.is_set():
            self._start_watching()
        self._run(job)
        with self._lock:
            if self._inline is not None and self._inline[0] == generation:
                self._inline = None

    def _start_watching(self) -> None:
        if self._watchdog is None:
            self._watchdog = threading.Thread(target=self._watch, name="tool-watchdog", daemon=True)
            self._watchdog.start()
        self._watching.set()

    def _watch(self) -> None:
        """While calls run inline, hand the reading role on when one overstays its budget."""
        last_busy = time.monotonic()
        while True:
            self._watching.wait()
            time.sleep(self.INLINE_BUDGET)
            now = time.monotonic()
            with self._lock:
                inline = self._inline
                if inline is not None:
                    last_busy = now
                    if inline[0] == self._reader_gen and now - inline[1] >= self.INLINE_BUDGET:
                        self._slow[inline[2]] = self.QUICK_AGAIN  # what waits behind it goes to the pool
                        self._reader_gen += 1
                        self._inline = None
                        threading.Thread(target=self.run, args=(self._reader_gen,), name="tool-reader", daemon=True).start()
                elif now - last_busy > 1.0:
                    self._watching.clear()  # idle: park until the next inline call

    # running sync calls

    def _run(self, job: tuple[int, ToolSpec, dict[str, Any]] | None) -> None:
        """Run a sync call on this thread, then any the backlog holds."""
        while job is not None:
            call_id, spec, kwargs = job
            started = time.perf_counter()
            try:
                result = make_result(spec, spec.fn(**kwargs), self.worker)
            except BaseException as exc:  # noqa: BLE001 - SystemExit from a tool is its failure too
                result = error_result(_exception_text(spec.name, exc, self.worker.memory_limit))
            self._timed(spec.name, time.perf_counter() - started)
            self.finish_call(call_id, result)
            with self._lock:
                job = self._backlog.popleft() if self._backlog else None
                if job is None:
                    self._running -= 1

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

    def _dispatch(self, job: tuple[int, ToolSpec, dict[str, Any]]) -> None:
        with self._lock:
            grow = self._idle == 0
            if not grow:
                self._idle -= 1
        if grow:
            threading.Thread(target=self._pool_thread, args=(job,), name="tool", daemon=True).start()
        else:
            self._jobs.put(job)

    def _pool_thread(self, job: tuple[int, ToolSpec, dict[str, Any]]) -> None:
        while True:
            self._run(job)
            with self._lock:
                self._idle += 1
            job = self._jobs.get()

    # calls

    def start_call(self, call: CallTool) -> tuple[int, ToolSpec, dict[str, Any]] | None:
        """Validate a call; return the job to run, or None when it is answered, queued or async."""
        call_id = call.call_id
        name = call.tool
        spec = self.tools.get(name)
        if spec is None:
            self.send(Result(call_id, error_result(f"Unknown tool {name!r} in this module")))
            return None
        try:
            kwargs = spec.parse_arguments(call.arguments or b"{}")
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            kwargs = self._without_undeclared(call_id, spec, call.arguments, exc)
            if kwargs is None:
                return None
        ctx = None
        if spec.context_param is not None:
            context = call.context
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
        job = (call_id, spec, kwargs)
        with self._lock:
            if self._running >= self.worker.threads:
                self._backlog.append(job)  # a finishing call picks it up
                return None
            self._running += 1
        return job

    def _without_undeclared(
        self, call_id: int, spec: ToolSpec, arguments: bytes, error: Exception
    ) -> dict[str, Any] | None:
        """The call's arguments once the undeclared ones are dropped (``arguments``' rule, reported
        to the daemon as ``dropped``); None when the call is answered with the error instead."""
        declared = (spec.input_schema.get("properties") or {}).keys()
        try:
            split = split_undeclared(arguments or b"{}", declared)
            if split is None:
                raise error
            kept, dropped = split
            kwargs = spec.parse_arguments(kept)
        except (msgspec.ValidationError, msgspec.DecodeError, Undeclared) as exc:
            self.send(Result(call_id, error_result(f"Invalid arguments for tool {spec.name!r}: {exc}")))
            return None
        self.send(Dropped(call_id, dropped))
        return kwargs

    def finish_call(self, call_id: int, result: bytes | None) -> None:
        self.calls.pop(call_id, None)
        if self._asks:
            self._drop_asks(call_id, "the call has ended")
        refused = self._refused.pop(call_id, None) if self._refused else None
        if refused is not None and result is not None:
            result = error_result(refused)
        self.send(Result(call_id, result))

    def cancel_call(self, call_id: int) -> None:
        if call_id not in self.calls:
            return
        ctx = self.calls[call_id]
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
            self.send(Ask(call_id, ask_id, method, _json_encode(params), None if wait is None else float(wait)))  # type: ignore[arg-type]
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
            result = error_result(_exception_text(spec.name, exc, self.worker.memory_limit))
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
                payload = (payload[0], _json_encode(payload[1]))
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


def _exit() -> None:
    # Threads may be stuck inside a tool: leave without joining them.
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(0)


def serve(fd: int, spec: WorkerSpec) -> None:
    """Load the module and serve calls on channel ``fd`` until the daemon closes it. Never returns."""
    sock = socket.socket(fileno=fd)
    sock.setblocking(True)
    send_lock = threading.Lock()

    def send(message: Any) -> None:
        frame = encode_frame(message)
        with send_lock:
            sock.sendall(frame)

    if spec.sandbox is not None:
        # The fork server imported it before forking a confined worker.
        from atomictoolsd.workers.runtime import sandbox  # lazy: ctypes, for confined workers only

        # Before the first thread (Landlock binds the calling thread and what it starts) and
        # before the module's first line: nothing of it ever runs unconfined.
        try:
            sandbox.confine(spec.sandbox, spec.runtime_paths, spec.temp_dir, spec.spill_dir)
        except sandbox.SandboxError as exc:
            send(Failed({"file": spec.path, "line": None, "traceback": "",
                         "message": f"not loaded: its project is trusted with --sandbox, and {exc}"}))
            _exit()
    capture_output(send)  # first: what the module prints while it loads is the author's clue
    started = time.perf_counter()
    apply_memory_limit(spec.memory_limit)  # before the import: a module's own allocations count too
    directory = os.path.dirname(spec.path)
    try:
        if spec.cwd:
            os.chdir(spec.cwd)
        specs, problems = load_module(spec)
        tools = {t.name: t for t in specs}
    except LoadFailure as failure:
        info = {
            **failure.info, "deps": imported_from(directory, spec.path), "fingerprint": fingerprint(spec.path),
            "helpers": fingerprints(directory, spec.path),
        }
        if info["message"].startswith("MemoryError") and spec.memory_limit:
            info["message"] = f"MemoryError: importing the module needs more than {describe_limit(spec.memory_limit)}"
        send(Failed(info))
        _exit()
    except BaseException as exc:  # noqa: BLE001 - report anything, then go
        send(Failed({"file": spec.path, "line": None, "message": repr(exc), "traceback": ""}))
        _exit()
    if spec.sandbox is not None and "sandbox" in _declared:
        from atomictoolsd.workers.runtime import sandbox  # lazy: ctypes, for confined workers only

        try:
            sandbox.narrow(_declared["sandbox"], spec.sandbox, spec.temp_dir, spec.spill_dir)
        except sandbox.SandboxError as exc:
            send(Failed({"file": spec.path, "line": None, "traceback": "", "message": str(exc)}))
            _exit()
    load_ms = (time.perf_counter() - started) * 1000
    runtime = Runtime(sock, tools, spec, send_lock)
    deps = imported_from(directory, spec.path)
    runtime.send(Loaded(
        [t.definition() for t in tools.values()], load_ms, problems, deps, fingerprint(spec.path),
        fingerprints(directory, spec.path),
    ))
    runtime.run()
    # The reading role moved to another thread (a call here ran long); the process ends when
    # the channel closes, from whichever thread reads the end of it.
    threading.Event().wait()


def main(argv: list[str] | None = None) -> None:
    """Cold start, without the fork server: ``python -m atomictoolsd.workers.runtime.main FD SPEC_JSON``."""
    args = sys.argv[1:] if argv is None else argv
    spec = msgspec.json.decode(args[1], type=WorkerSpec)
    if spec.sandbox is not None and not spec.runtime_paths:
        from atomictoolsd.workers.runtime import sandbox  # lazy: ctypes, for confined workers only

        spec.runtime_paths = sandbox.runtime_read_paths()
    serve(int(args[0]), spec)


if __name__ == "__main__":
    main()
