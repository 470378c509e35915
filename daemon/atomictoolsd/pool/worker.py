"""One worker process, seen from the daemon: its channel, its calls in flight, how it ended.

A ``Worker`` is an ``asyncio.Protocol`` over the daemon's end of the worker's channel. It sends calls
and cancellations, routes results, progress and logs back to each ``Call``, writes what the worker
printed to the event log (``tool.output``), and when the channel closes it fails the calls still in
flight with a result that names how the process ended.

A worker runs a tool's code, which can write anything on the channel, so nothing it sends is passed
on as it came. Every frame is bounded (``max_message_bytes``, judged from its header) and decoded as
one of the messages a worker may send, with their types; a result, a log message or a progress
message reaches only the call it names, and only re-encoded by the daemon, so no bytes of a tool's
reach a client but as the well-formed answer or notification of its own call. A message too large
for a client, or not the JSON it should hold, fails its call with ``isError``. A frame that cannot
be read (too large, not a worker message, out of turn) means the channel can no longer be trusted:
the worker is killed, its calls answer with the reason, and the next call starts a new one.

The files a load report names (the helpers a module imported, ``deps`` and ``helpers``) are kept
only when they lie in the module's own tools dir (``files_in``): the registry reads them back to
judge a load whole, and it reads no path a worker chose anywhere else.
"""

from __future__ import annotations

import asyncio
import logging
import os
import select
import signal
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from atomictoolsd.eventlog.writer import EventLog
from atomictoolsd.pool.javascript.definitions import served_definitions
from atomictoolsd.pool.spawner import FORKSERVER_GONE, Spawner, SpawnError, describe_status
from atomictoolsd.protocol import (
    FRAME_OVERHEAD,
    MAX_LOAD_REPORT,
    TEXT_HEAD,
    TEXT_TAIL,
    Answer,
    Ask,
    CallContext,
    CallTool,
    Cancel,
    Dropped,
    Failed,
    FailureReport,
    FrameError,
    FrameReader,
    FrameTooLarge,
    Loaded,
    LoadFailure,
    Log,
    Output,
    Progress,
    Result,
    WorkerMessage,
    bounded_site,
    encode_frame,
    error_result,
    well_formed_json,
)
from atomictoolsd.worker.output import BURST_BYTES, CHUNK_BYTES, RATE_BYTES

if TYPE_CHECKING:
    from atomictoolsd.pool.backoff import CrashBackoff
    from atomictoolsd.protocol import WorkerSpec

__all__ = ["Call", "CallOwner", "Worker", "error_result"]

log = logging.getLogger("atomictoolsd.workers")


class _CallToolResult(msgspec.Struct, omit_defaults=True):
    """The shape of a result the daemon relays; what a worker sent is decoded into it and re-encoded
    (``_relayable``). Its parts stay raw: checked as JSON, never built."""

    content: list[msgspec.Raw]  # each a JSON object (a content block)
    structuredContent: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET  # noqa: N815 - MCP's name
    meta: dict[str, msgspec.Raw] | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="_meta")
    isError: bool = False  # noqa: N815 - last, as in error_result(): the pool reads an error from the end


_decode_result = msgspec.json.Decoder(_CallToolResult).decode
_decode_raw = msgspec.json.Decoder(msgspec.Raw).decode
_decode_string = msgspec.json.Decoder(str).decode
# A result relayed as it is (Worker._on_result): the JSON string between these two. Tested by
# slicing: bytes.startswith and endswith parse a tuple of arguments in CPython 3.11, at twice the cost.
_TEXT_HEAD_QUOTE = TEXT_HEAD + b'"'
_QUOTE_TEXT_TAIL = b'"' + TEXT_TAIL
_TEXT_START = len(TEXT_HEAD)
_TEXT_END = -len(TEXT_TAIL)
_HEAD_QUOTE_END = len(_TEXT_HEAD_QUOTE)
_QUOTE_TAIL_START = -len(_QUOTE_TEXT_TAIL)
_encode_json = msgspec.json.Encoder().encode


# What decoding a worker's JSON may raise besides a DecodeError: a string that is not UTF-8, and
# msgspec's depth check (a value nested past what the decoder recurses).
_UNREADABLE = (msgspec.DecodeError, UnicodeDecodeError, RecursionError)


def _unreadable(exc: Exception) -> str:
    return "nested too deep" if isinstance(exc, RecursionError) else str(exc)


def _one_line(json: bytes) -> bytes:
    """``json`` (checked JSON: one value, its strings' escapes and characters valid) as the daemon
    relays it: UTF-8, on one line. A raw newline can only be whitespace between its tokens (one in
    a string is invalid JSON), so it becomes a space; the bytes are otherwise the worker's.

    Raises:
        UnicodeDecodeError: it is not UTF-8 (the JSON check does not read inside strings).
    """
    if not json.isascii():
        json.decode("utf-8")
    if json.find(b"\n") >= 0 or json.find(b"\r") >= 0:  # find, not ``in``: see sessions/connection.py
        json = json.replace(b"\n", b" ").replace(b"\r", b" ")
    return json


def _decoded(decode: Callable[[bytes], Any], data: bytes) -> Any:
    """``decode(data)``, or, when lone surrogate escapes are what it failed on, ``decode`` of ``data``
    with them as U+FFFD (``well_formed_json``): a JavaScript tool's text cut inside a surrogate pair
    (``"x😀".slice(0, 2)``), which ``JSON.stringify`` writes as such an escape."""
    try:
        return decode(data)
    except msgspec.DecodeError:
        repaired = well_formed_json(data)
        if repaired is None:
            raise
        return decode(repaired)


def _relay_json(data: bytes) -> bytes:
    """A worker's JSON ``data`` as the daemon relays it (``_one_line``), checked without building it:
    a value of millions of elements costs what its bytes do.

    Raises:
        msgspec.DecodeError, UnicodeDecodeError, RecursionError: it is not one JSON value in UTF-8.
    """
    return _one_line(bytes(_decoded(_decode_raw, data)))


# Per call, at most this many questions (``ctx.elicit``, ``ctx.sample``) wait for the client, and at
# most this many frames for it (its answers, its cancel) wait while the worker reads nothing: a tool
# asks and waits for each answer, so more means a worker that writes without reading. Past either,
# the call fails and the worker is recycled.
MAX_QUESTIONS = 16
# Of a call's undeclared arguments, the keys logged and the characters of each.
MAX_DROPPED_KEY = 64  # characters of an undeclared argument's name logged


def _too_large(what: str, size: int, limit: int) -> str:
    return f"{what} of {size:,} bytes, more than the {limit:,} bytes a message may carry (max_message_bytes)"


class ModuleRunner(Protocol):
    """What a worker and its calls use of the runner of their module (``pool.ModuleRunner``): a
    protocol, because the pool imports this module."""

    spec: WorkerSpec
    backoff: CrashBackoff
    pool: Any  # pool.WorkerPool: its settings (max_result_bytes), its spawner and its worker slots
    waiting_for_slot: bool  # a spawn of its waits for one of the max_workers slots
    events: EventLog  # the daemon's event log (its pool's)

    def finish(self, call: Call, result: bytes, failed: bool | None = None) -> None: ...

    def record_cancelled(self, call: Call) -> None: ...

    def stop_call(self, call: Call) -> None: ...

    def worker_ended(self, worker: Worker, was: str) -> None: ...

    def served(self) -> None: ...


class CallOwner(Protocol):
    """Who started a call and receives what it produces (a session, or a test)."""

    def call_result(self, call: Call, result: bytes) -> None:
        """The call's answer: an MCP ``CallToolResult`` as JSON."""

    def call_progress(self, call: Call, progress: float, total: float | None, message: str | None) -> None:
        """Progress reported by the tool (only for calls with a ``progress_token``)."""

    def call_log(self, call: Call, level: str, data: bytes) -> None:
        """A ``ctx.log`` message from the tool; ``data`` is JSON."""

    # An owner that can ask its client (a session) also has ``call_ask(call, ask_id, method, params,
    # wait)`` and answers with ``call.answer``; the worker answers for an owner that cannot.


class Call(msgspec.Struct, eq=False):
    """One ``tools/call`` in flight: answered exactly once, by a result, a timeout or a crash.

    ``ModuleRunner.finish`` answers it: the answer goes to ``owner.call_result``. A call cancelled
    by its caller is never answered (MCP: no response after ``notifications/cancelled``).
    ``request_id`` and ``progress_token`` are the owner's, kept here so that no per-call closure is
    needed.

    A Struct (``eq=False``: compared and hashed by identity) rather than a class with ``__init__``:
    one is built for every call, and msgspec fills its fields in C. ``started`` is one clock for
    both how long it ran (the pool's statistics) and ``deadline``, when the pool's ``Deadlines``
    answers it; ``ModuleRunner.call`` passes both.
    """

    runner: ModuleRunner
    module: str  # the path of its tool's module (its runner's), for its event log line
    id: int
    tool: str
    arguments: bytes  # until sent to its worker (then empty: they can be megabytes)
    context: CallContext
    timeout: float
    owner: CallOwner
    request_id: Any
    progress_token: Any
    started: float
    deadline: float
    done: bool = False
    worker: Worker | None = None
    asking: int = 0  # questions to the client waiting for an answer (ctx.elicit, ctx.sample)
    left: float = 0.0  # of the timeout, while they wait
    dropped_logged: bool = False  # its undeclared arguments were logged (once: see ``Worker._on_dropped``)
    ended: float = 0.0  # when it was answered (``ModuleRunner.finish``), for its event log line

    def hold(self, wait: float) -> None:
        """The tool waits for its client: the wait does not count against its timeout, and may last
        ``wait`` seconds (``ask_timeout``)."""
        now = time.monotonic()
        if self.asking == 0:
            self.left = self.deadline - now
        self.asking += 1
        self.deadline = max(self.deadline, now + wait)

    def release(self) -> None:
        """An answer came: the call's own time runs again from what was left of it."""
        if self.asking > 0:
            self.asking -= 1
            if self.asking == 0:
                self.deadline = time.monotonic() + max(self.left, 0.0)

    def answer(self, ask_id: int, result: bytes | None, error: str | None = None) -> None:
        """Give the tool the client's answer to what it asked (``ctx.elicit``, ``ctx.sample``)."""
        if not self.done and self.worker is not None:
            self.worker.send_answer(self, ask_id, result, error)

    def cancel(self) -> None:
        """The caller cancelled: stop the work and never answer."""
        if self.done:
            return
        self.done = True
        self.runner.record_cancelled(self)
        self.runner.stop_call(self)

    def expire(self) -> None:
        """The timeout fired: answer with an error, then stop the work."""
        if self.asking:
            self.fail(f"Tool {self.tool!r} timed out waiting for the client to answer its question (ask_timeout)")
        elif self.worker is None and self.runner.waiting_for_slot:
            self.fail(
                f"Tool {self.tool!r} timed out after {self.timeout:g} s waiting for a worker: the "
                f"{self.runner.pool.slots.limit} that may run at once (max_workers) are all busy; raise "
                "max_workers, or try again later"
            )
        else:
            self.fail(f"Tool {self.tool!r} timed out after {self.timeout:g} s")

    def fail(self, text: str) -> None:
        """Answer with an error saying ``text``, then stop the work (the worker lives on)."""
        if self.done:
            return
        self.runner.finish(self, error_result(text))
        self.runner.stop_call(self)


class _OutputBudget:
    """The runtime's rate limit on what a worker prints (``worker/output``), held again on the
    daemon's side: a tool can write output frames on its channel itself, past the runtime's. Twice
    the runtime's burst, as frames the runtime sent in time may arrive together."""

    __slots__ = ("at", "dropped", "tokens")

    def __init__(self) -> None:
        self.tokens = float(2 * BURST_BYTES)
        self.at = time.monotonic()
        self.dropped = 0  # bytes left out since the last message logged

    def admit(self, size: int) -> bool:
        """Whether a message of ``size`` bytes is within the rate; one that is not is counted."""
        now = time.monotonic()
        self.tokens = min(2.0 * BURST_BYTES, self.tokens + (now - self.at) * RATE_BYTES)
        self.at = now
        if size > self.tokens:
            self.dropped += size
            return False
        self.tokens -= size
        return True

    def take_dropped(self) -> int:
        dropped, self.dropped = self.dropped, 0
        return dropped


def files_in(directory: str, entries: list[tuple[str, int, int]]) -> list[list[Any]]:
    """The ``[path, int, int]`` entries of a load report whose path is a file below ``directory``,
    written as the runtime writes it (absolute, normalized): every other entry is dropped."""
    prefix = directory.rstrip(os.sep) + os.sep
    return [
        list(entry) for entry in entries
        if entry[0].startswith(prefix) and "\0" not in entry[0] and os.path.normpath(entry[0]) == entry[0]
    ]


class Worker(asyncio.Protocol):
    """The daemon's end of one worker process."""

    def __init__(self, runner: ModuleRunner, pid: int, spawner: Spawner) -> None:
        self.runner = runner
        self.pid = pid
        self.spawner = spawner  # whose fork server forked it
        self.exit_status = spawner.exit_status(pid)
        self.state = "loading"  # → ready → retiring → dead
        self.loaded: asyncio.Future[tuple[list[dict[str, Any]], float]] = asyncio.get_running_loop().create_future()
        self.pending: dict[int, Call] = {}
        self.abandoned: set[int] = set()  # cancelled or timed out, still running in the worker
        self.started = time.monotonic()
        self.last_used = self.started
        self.cause: str | None = None
        self.ended = False  # its end was handled: its calls answered, its runner told (worker_ended)
        self.status: int | None = None  # its waitpid status once it ended (FORKSERVER_GONE: with the fork server)
        self.problems: list[dict[str, Any]] = []  # tools the module skipped (from its "loaded" message)
        self.deps: list[list[Any]] = []  # [path, size, mtime_ns] of the helpers its module imported
        self.fingerprint: list[int] | None = None  # [size, crc32] of the module file's bytes it loaded
        self.helpers: list[list[Any]] = []  # [path, size, crc32] of the bytes it loaded from each helper
        self.max_message = runner.pool.settings.max_result_bytes
        # Until its load report came, a worker's frames are bounded by what a load report may take.
        self._reader = FrameReader(min(self.max_message + FRAME_OVERHEAD, MAX_LOAD_REPORT), WorkerMessage)
        self._trusted = True  # until it sends what no worker runtime sends
        self.results_for_unknown_calls = 0
        self._output: _OutputBudget | None = None  # made with its first output
        self._transport: asyncio.Transport | None = None
        # Backpressure: while the channel holds more than the worker has read (``pause_writing``),
        # new calls wait here, and the frames written for each call in flight are counted.
        self.paused = False
        self._held: dict[int, Call] = {}
        self._sent_context: CallContext | None = None  # the context of the last call sent (CallTool.context)
        self._unread: dict[int, int] = {}
        self._kill_timer: asyncio.TimerHandle | None = None
        self.exit_status.add_done_callback(self._on_exit_status)

    # -- asyncio.Protocol -----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        """The worker has read most of what it was sent: the calls held meanwhile go out."""
        self.paused = False
        self._unread.clear()
        held, self._held = self._held, {}
        for call in held.values():
            self.send_call(call)  # held again if the channel fills again

    def data_received(self, data: bytes) -> None:
        if not self._trusted:
            return
        try:
            message = self._reader.single_frame(data)
            if type(message) is Result:  # the call path: one result, as it came
                self._on_result(message.call_id, message.result)
                return
            try:
                messages = [message] if message is not None else self._reader.feed(data)
            except FrameError as exc:
                self._handle(exc.messages)  # what came whole before it is as good as ever
                what = self._oversize_cause(exc) if isinstance(exc, FrameTooLarge) else exc
                self._distrust(f"sent {what}")
                return
            self._handle(messages)
        except Exception as exc:  # noqa: BLE001 - whatever failed, this channel cannot be read on
            self._failed(exc)

    def _oversize_cause(self, exc: FrameTooLarge) -> str:
        if not self.loaded.done() and exc.limit < self.max_message + FRAME_OVERHEAD:
            return f"a load report of {exc.length:,} bytes, more than the {exc.limit:,} bytes one may take"
        return _too_large("a message", exc.length, self.max_message)

    def _failed(self, exc: Exception) -> None:
        """Reading the worker's channel failed on the daemon's side: the worker is killed with its
        process group (left running, it would hold what it holds with no one to end it)."""
        log.error(
            "reading the channel of worker %d of %s failed; killing it", self.pid, self.runner.spec.path, exc_info=exc,
            extra={"event": "worker.channel_error", "data": {"pid": self.pid, "module": self.runner.spec.path, "error": repr(exc)}},
        )
        self._distrust(f"was stopped: the daemon failed reading its channel ({type(exc).__name__}: {exc})")

    def _handle(self, messages: list[Any]) -> None:
        for message in messages:
            if not self._trusted:
                return
            kind = type(message)
            if kind is Result:
                self._on_result(message.call_id, message.result)
            elif kind is Progress:
                self._on_progress(message)
            elif kind is Log:
                self._on_log(message)
            elif kind is Ask:
                self._on_ask(message)
            elif kind is Dropped:
                self._on_dropped(message)
            elif kind is Output:
                self._on_output(message.fd, message.data, message.dropped)
            elif self.loaded.done():  # a load report, and the worker has made its one already
                self._distrust(f"sent a second load report ({message.__struct_config__.tag!r})")
            elif kind is Loaded:
                self.state = "ready"
                self._reader.limit = self.max_message + FRAME_OVERHEAD
                definitions, self.problems = message.definitions, message.problems
                if self.runner.spec.kind == "javascript":
                    definitions, self.problems = served_definitions(definitions, self.problems)
                directory = os.path.dirname(self.runner.spec.path)
                self.deps = files_in(directory, message.deps)
                self.fingerprint = message.fingerprint
                self.helpers = files_in(directory, message.helpers)
                self.runner.site = bounded_site(message.site)
                self.loaded.set_result((definitions, message.load_ms))
            elif kind is Failed:
                report = message.info
                self.runner.site = bounded_site(report.site)
                # "outside": not the module's doing (no runtime, a package not installed): not kept
                # as the module's failure, and tried again on the next scan.
                self.loaded.set_exception(LoadFailure.from_info(self._own_files(report), by_module=not report.outside))

    def _own_files(self, report: FailureReport) -> dict[str, Any]:
        """A failure report as the registry keeps it (the keys the worker sent), with only the files
        of the module's tools dir (see ``files_in``) and the site dirs the daemon looks at
        (``bounded_site``): the module's failure keeps it."""
        directory = os.path.dirname(self.runner.spec.path)
        info: dict[str, Any] = msgspec.to_builtins(report)
        return {**info, "deps": files_in(directory, report.deps), "helpers": files_in(directory, report.helpers),
                "site": list(self.runner.site)}

    def _distrust(self, cause: str) -> None:
        """The worker sent what its runtime never sends: read nothing more from it, and kill it."""
        if not self._trusted:
            return
        self._trusted = False
        self.cause = cause
        self.kill()

    def unread(self) -> bool:
        """Whether bytes from the worker wait to be read (part of a frame, or on the channel)."""
        if self._reader.partial:
            return True
        sock = self._transport.get_extra_info("socket") if self._transport is not None else None
        if sock is None:
            return False
        try:
            readable, _, _ = select.select([sock.fileno()], [], [], 0)
        except (OSError, ValueError):
            return False
        return bool(readable)

    def _on_exit_status(self, status: asyncio.Future[int]) -> None:
        # Died with the fork server: the daemon learns it from the fork server's pipe, possibly
        # before the dying process has closed its channel. No new call may go to it meanwhile.
        if not status.cancelled() and status.result() == FORKSERVER_GONE and self._transport is not None:
            self._transport.abort()

    def _on_output(self, fd: int, data: bytes, dropped: int) -> None:
        """What the worker printed: a ``tool.output`` event of its module (stderr as a warning),
        within the runtime's rate (what is over it is counted, and logged with the next message)."""
        budget = self._output
        if budget is None:
            budget = self._output = _OutputBudget()
        if not budget.admit(min(len(data), CHUNK_BYTES)):
            budget.dropped += dropped + max(0, len(data) - CHUNK_BYTES)
            return
        dropped += budget.take_dropped() + max(0, len(data) - CHUNK_BYTES)
        text = bytes(data[:CHUNK_BYTES]).decode("utf-8", "replace")  # bounded here too: a tool can write anything
        fields: dict[str, Any] = {
            "module": self.runner.spec.path,
            "pid": self.pid,
            "stream": "stdout" if fd == 1 else "stderr",
            "message": text.removesuffix("\n") if text else f"({dropped} bytes of output not logged)",
        }
        if dropped:
            fields["dropped"] = dropped
        self.runner.events.emit("info" if fd == 1 else "warning", "tool.output", fields)

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        if self.state == "dead":
            return
        was = self.state
        self.state = "dead"
        asyncio.get_running_loop().create_task(self._ended(was))

    async def _exit_within(self, seconds: float) -> int | None:
        try:
            return await asyncio.wait_for(asyncio.shield(self.exit_status), seconds)
        except TimeoutError:
            return None

    async def _ended(self, was: str) -> None:
        status = await self._exit_within(2.0)
        if status is None:
            # Its channel is closed and it has not ended: nothing it does can reach anyone now, and
            # once forgotten here nothing would ever end it (not untrust, not stop).
            self._kill_group()
            status = await self._exit_within(2.0)
        if self._kill_timer is not None:
            self._kill_timer.cancel()
        # The fork server has killed what was left in the worker's process group before reaping it.
        self.spawner.forget(self.pid)
        self.status = status
        if self.cause is None:
            self.cause = describe_status(status)
        if not self.loaded.done():
            message = f"the worker {self.cause} while loading the module"
            self.loaded.set_exception(
                SpawnError(message) if status == FORKSERVER_GONE
                else LoadFailure(self.runner.spec.path, None, message, by_module=False)
            )
            self.loaded.exception()
        pending, self.pending = self.pending, {}
        for call in pending.values():
            try:
                self.runner.finish(call, error_result(f"Tool {call.tool!r} failed: its worker process {self.cause}"))
            except Exception:  # its owner's bug: the other calls are answered, and the worker's end handled
                log.exception("answering call %d of %r at its worker's end failed", call.id, call.tool)
        self.ended = True
        self.runner.pool.slots.give_back(self)  # taken for it before its spawn (ModuleRunner._spawn)
        self.runner.worker_ended(self, was)

    # -- calls ----------------------------------------------------------------------------------

    def send_call(self, call: Call) -> None:
        call.worker = self
        self.pending[call.id] = call  # busy until it answers (its finish sets last_used)
        if self.paused:
            self._held[call.id] = call  # sent once the worker has read what it was sent before
            return
        transport = self._transport
        if transport is not None:
            context = call.context
            if context is self._sent_context:
                context = None  # the worker has it from the call before
            else:
                self._sent_context = context
            transport.write(encode_frame(CallTool(call.id, call.tool, call.arguments, context, call.progress_token is not None)))
            call.arguments = b""  # sent: not held while the call runs, nor while its log line waits

    def send_cancel(self, call: Call) -> None:
        if self._held.pop(call.id, None) is not None:
            del self.pending[call.id]  # never sent: nothing to stop
            if self.state == "retiring" and self.live_calls() == 0:
                self.close()
        elif call.id in self.pending:
            self.abandoned.add(call.id)
            self._write_for(call, Cancel(call.id))

    def _on_result(self, call_id: int, result: bytes | None) -> None:
        call = self.pending.pop(call_id, None)
        if self.abandoned:
            self.abandoned.discard(call_id)
        if call is not None and result is not None and not call.done:
            # The call path: one text block as the runtime writes it (the JSON of a string, quote to
            # quote, between TEXT_HEAD and TEXT_TAIL) is relayed as it is once its string decodes: a
            # JSON string holds no raw newline, and re-encoding it would give the very same bytes.
            # The quote checks leave no room for whitespace around the string, where a newline could
            # hide. Any other result, and one too large, is checked whole (_relayable).
            relayed = False
            if (
                result[:_HEAD_QUOTE_END] == _TEXT_HEAD_QUOTE and result[_QUOTE_TAIL_START:] == _QUOTE_TEXT_TAIL
                and len(result) <= self.max_message
            ):
                try:
                    _decode_string(result[_TEXT_START:_TEXT_END])
                    relayed = True
                except (msgspec.DecodeError, UnicodeDecodeError):
                    pass  # _relayable says what is wrong with it
            if relayed:
                self.runner.finish(call, result, False)
            else:
                try:
                    answer = self._relayable(call.tool, result)
                except Exception:  # the daemon's bug: the call is answered all the same, then the channel fails
                    self.runner.finish(call, error_result(f"Tool {call.tool!r}: the daemon failed to relay its result (see its log)"))
                    raise
                self.runner.finish(call, answer)
        elif call is None:
            # The runtime answers each call it was given once: this one it was never given, or has
            # answered. A tool wrote it; it reaches no one (and the log hears of it once a worker).
            self.last_used = time.monotonic()  # busy until now (an answered call's finish sets it)
            self.results_for_unknown_calls += 1
            if self.results_for_unknown_calls == 1:
                log.warning(
                    "worker %d of %s sent a result for call %d, which it is not running; dropped",
                    self.pid, self.runner.spec.path, call_id,
                    extra={"event": "worker.stray_result", "data": {"pid": self.pid, "module": self.runner.spec.path, "call": call_id}},
                )
        elif call.done:  # timed out or cancelled meanwhile: its answer was given
            self.last_used = time.monotonic()
        else:  # result is None: the runtime cancelled it
            self.runner.finish(call, error_result(f"Tool {call.tool!r} was cancelled"))
        if self.runner.backoff.crashes:
            self.runner.served()
        if self.state == "retiring" and self.live_calls() == 0:
            self.close()

    def _relayable(self, tool: str, result: bytes) -> bytes:
        """What a client is sent for ``result``, when it is not one text block as the runtime writes
        it (``_on_result`` relays those as they are): re-encoded by the daemon (a tool can write
        anything on its channel), or an error saying why it cannot be relayed."""
        if len(result) > self.max_message:
            return error_result(f"Tool {tool!r} sent {_too_large('a result', len(result), self.max_message)}")
        try:
            shaped = _decoded(_decode_result, result)
            for index, block in enumerate(shaped.content):
                if memoryview(block)[:1] != b"{":
                    raise msgspec.DecodeError(f"Expected `object` - at `$.content[{index}]`")
            return _one_line(_encode_json(shaped))
        except _UNREADABLE as exc:
            return error_result(f"Tool {tool!r} sent a malformed result ({_unreadable(exc)}); it was not relayed")

    def _on_progress(self, message: Progress) -> None:
        call = self.pending.get(message.call_id)
        if call is None or call.done or call.progress_token is None:
            return  # answered already (MCP: nothing after the response), or not asked for
        if message.message is not None and len(message.message) > self.max_message // 4:
            size = len(message.message.encode("utf-8", "surrogatepass"))
            if size > self.max_message:
                call.fail(f"Tool {call.tool!r} sent {_too_large('a progress message', size, self.max_message)}")
                return
        call.owner.call_progress(call, message.progress, message.total, message.message)

    def _on_log(self, message: Log) -> None:
        call = self.pending.get(message.call_id)
        if call is None or call.done:
            return
        if len(message.data) > self.max_message:
            call.fail(f"Tool {call.tool!r} sent {_too_large('a log message', len(message.data), self.max_message)}")
            return
        try:
            data = _relay_json(message.data)
        except _UNREADABLE as exc:
            call.fail(f"Tool {call.tool!r} sent a malformed log message ({_unreadable(exc)}); it was not relayed")
            return
        call.owner.call_log(call, message.level, data)

    def _on_dropped(self, message: Dropped) -> None:
        """The call's undeclared arguments, logged once per call and bounded: the runtime sends one
        such report, before its result; more are a tool writing its channel itself (it rotated the
        log away)."""
        call = self.pending.get(message.call_id)
        if call is None or call.done or call.dropped_logged:
            return
        call.dropped_logged = True
        keys = [key[:MAX_DROPPED_KEY] for key in message.keys]  # at most MAX_DROPPED_KEYS: its type says
        self.runner.events.arguments_dropped(
            call.tool, self.runner.spec.path, call.id, call.context.session_id, call.context.agent, keys,
        )

    def _on_ask(self, message: Ask) -> None:
        call = self.pending.get(message.call_id)
        if call is None or call.done:
            return  # the call has ended: the tool's wait ends with it
        if call.asking >= MAX_QUESTIONS:
            self._distrust(f"asked more than {MAX_QUESTIONS} questions at once in one call")
            return
        ask = getattr(call.owner, "call_ask", None)
        if ask is None:
            self._write_for(call, Answer(call.id, message.ask_id, None, "this caller cannot be asked anything"))
            return
        # Re-encoded, as results are: the params go into a line to the client, and a tool can write
        # anything to its channel.
        try:
            params = _relay_json(message.params)
        except _UNREADABLE:
            params = b""
        if params[:1] != b"{":
            call.fail(f"Tool {call.tool!r} sent a malformed {message.method} request; it was not relayed")
            return
        ask(call, message.ask_id, message.method, params, message.wait)

    def send_answer(self, call: Call, ask_id: int, result: bytes | None, error: str | None) -> None:
        if call.id in self.pending:
            self._write_for(call, Answer(call.id, ask_id, result, error))

    def live_calls(self) -> int:
        """Calls whose caller still waits for this worker's answer."""
        return len(self.pending) - len(self.abandoned)

    def _write_for(self, call: Call, message: Cancel | Answer) -> None:
        """Write a frame for ``call`` in flight. While the worker reads nothing, at most
        ``MAX_QUESTIONS`` of them wait per call: one that asks without reading its answers (a
        stopped worker, a child writing on its channel) is recycled, and its calls fail."""
        if self.paused:
            unread = self._unread[call.id] = self._unread.get(call.id, 0) + 1
            if unread > MAX_QUESTIONS:
                self._distrust(f"did not read its channel: more than {MAX_QUESTIONS} answers for one call waited unread")
                return
        if self._transport is not None:
            self._transport.write(encode_frame(message))

    # -- ending ---------------------------------------------------------------------------------

    def retire(self) -> None:
        """Take no new calls; stop once the calls in flight have answered.

        Called again on a retiring worker (a call on it was given up), it looks again: the calls
        left may all be abandoned ones, which no answer will ever end.
        """
        if self.state == "dead":
            return
        self.state = "retiring"
        if self.live_calls() == 0:
            self.close()

    def close(self, grace: float = 2.0) -> None:
        """Close the channel (the worker exits on EOF); kill it if it has not gone after ``grace``."""
        if self._transport is not None:
            self._transport.close()
        if self._kill_timer is None and not self.exit_status.done():
            self._kill_timer = asyncio.get_running_loop().call_later(grace, self.kill)

    def kill(self) -> None:
        """SIGKILL the worker and everything in its process group."""
        if self.cause is None:
            self.cause = "was stopped by the daemon"
        self._kill_group()
        if self._transport is not None:
            self._transport.abort()

    def _kill_group(self) -> None:
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
