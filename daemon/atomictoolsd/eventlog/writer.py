"""The daemon's event log: JSON lines in the log dir, rotated by size, cheap on the call path.

The daemon has one ``EventLog``, which the worker pool builds (``WorkerPool.events``) and gives the
source of its running calls; the daemon opens it at start. From then on every tool call adds
``tool.start`` and ``tool.complete`` / ``tool.failed`` / ``tool.cancelled`` (with its duration), and Python logging records
arrive through ``EventLogHandler`` (module loads and reloads, worker spawns and deaths, reloads of the
configuration: those carry ``extra={"event": name, "data": {...}}``, so they become structured
events; other records become ``log`` events).

The call path costs one list append, when a call ends: a call that completed is kept as it is
(``call_completed``, the bound ``append`` of the waiting list: the pool's call, its fields read at
the flush), any other event as a tuple of plain values. They are turned into JSON lines in one batch
by a flush that runs every ``FLUSH_INTERVAL`` seconds while there is anything to write or a call
runs (its start schedules one; each flush schedules the next while calls run, so a call's end never
has to), so a call outlives its answer by a quarter of a second at most. A flush that found more
than ``FLUSH_AT`` events brings the next one forward in proportion, which keeps batches near that
size however many calls a second come. A call that ends before the flush is one line, its
``tool.complete``; the flush asks the pool which calls are still running (``running_calls``) and
writes a ``tool.start`` for each that began since the last flush, so a call that hangs is in the log
within ``FLUSH_INTERVAL``. So a busy daemon makes one ``write`` per batch, never one per call. The
price: events of the last interval are lost if the daemon is killed with SIGKILL (a normal stop
flushes).

The file is ``atomictoolsd.log``; when a write would take it past ``log_max_bytes`` it becomes
``atomictoolsd.log.1`` (and ``.1`` becomes ``.2`` …, keeping ``log_backups`` of them).

This module also formats stderr for the systemd journal; ``reader`` reads the log back. It must never
import server, session or worker code: the pool imports it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Protocol

import msgspec

from atomictoolsd.config.discovery import escape_strings
from atomictoolsd.config.levels import LEVEL_RANK
from atomictoolsd.config.paths import make_private_dirs

__all__ = [
    "EventLog",
    "CompletedCall",
    "EventLogHandler",
    "error_text",
    "JournalFormatter",
    "LOG_NAME",
    "RunningCall",
    "stderr_is_journal",
]

LOG_NAME = "atomictoolsd.log"
FLUSH_INTERVAL = 0.25  # seconds an event may wait in memory
FLUSH_AT = 4096  # events a flush should find: more (a busy daemon) bring the next flush forward


# Kinds of buffered entries: a logging record or ``emit``, or the end of a tool call.
_GENERIC, _TOOL_END = 0, 1
CANCELLED = b""  # the "failure" of a call nobody is left to answer: tool.cancelled


class CallerContext(Protocol):
    """Who asked for a call, as its ``tool.complete`` line names them."""

    session_id: str
    agent: str


class CompletedCall(Protocol):
    """A call that completed, as ``call_completed`` takes it: what its ``tool.complete`` line says,
    read at the flush (``started`` and ``ended`` on the ``time.monotonic()`` clock)."""

    tool: str
    module: str
    id: int
    started: float
    ended: float
    context: CallerContext


# A call still running, as the pool reports it to the flush: (started, tool, module, call id,
# session, agent), ``started`` on the ``time.monotonic()`` clock.
RunningCall = tuple[float, str, str, int, str, str]

_encode_lines = msgspec.json.Encoder().encode_lines
_decode_json = msgspec.json.decode


class EventLog:
    """A buffered, size-rotated JSON lines file. Closed (and free) until ``open()``.

    Args:
        running_calls: the calls not answered yet (the pool's), asked at each flush; None: no call
            runs where this log is kept.
    """

    def __init__(self, running_calls: Callable[[], Iterable[RunningCall]] | None = None) -> None:
        self.path: Path | None = None
        self.max_bytes = 10 * 1024 * 1024
        self.backups = 3
        self.rank = LEVEL_RANK["info"]
        # Read on the call path: plain attributes, so a disabled log costs one attribute load.
        self.calls_on = False  # tool.start / tool.complete (info)
        self.failures_on = False  # tool.failed (warning)
        self.written = 0  # events written since open (for status and tests)
        self.dropped = 0  # events lost to write errors
        self._fd = -1
        self._size = 0
        self._pending: list[Any] = []  # tuples, and the calls that completed (call_completed)
        # ``tool.complete`` of a call, on the call path: the list's own append, no Python frame
        # (event loop thread only; callers check ``calls_on``). The flush holds the call until it
        # runs (a quarter of a second at most: one is always due while calls run).
        self.call_completed: Callable[[CompletedCall], None] = self._pending.append
        self._running_calls = running_calls
        self._flushed_at = time.monotonic()  # when the last flush looked at the running calls
        self.scheduled = False  # a flush is due within FLUSH_INTERVAL (read on the call path)
        self._interval = FLUSH_INTERVAL  # until the next flush: shorter while batches run large
        self._urgent = False
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()  # appends from other threads, and the swap in flush
        self._write_lock = threading.Lock()

    # -- lifecycle ------------------------------------------------------------------------------

    def open(self, path: Path, *, level: str = "info", max_bytes: int = 10 * 1024 * 1024, backups: int = 3) -> None:
        """Start writing to ``path`` (its directory is created 0700; the file is 0600)."""
        make_private_dirs(path.parent)
        self.close()
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self._size = os.fstat(self._fd).st_size
        self.configure(level=level, max_bytes=max_bytes, backups=backups)

    def configure(self, *, level: str, max_bytes: int, backups: int) -> None:
        """Apply new settings (on open, and when the configuration is reloaded)."""
        self.rank = LEVEL_RANK[level]
        self.max_bytes = max_bytes
        self.backups = backups
        is_open = self._fd >= 0
        self.calls_on = is_open and self.rank <= LEVEL_RANK["info"]
        self.failures_on = is_open and self.rank <= LEVEL_RANK["warning"]

    def bind_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """The loop that runs flushes (events from other threads are handed to it)."""
        self._loop = loop

    def close(self) -> None:
        """Flush and close; later events are dropped until the next ``open()``."""
        if self._fd < 0:
            return
        self.calls_on = self.failures_on = False  # first: the flush keeps no other one due for calls
        self.flush()
        os.close(self._fd)
        self._fd = -1
        self._loop = None

    @property
    def is_open(self) -> bool:
        return self._fd >= 0

    # -- adding events --------------------------------------------------------------------------

    def emit(self, level: str, event: str, fields: dict[str, Any] | None = None, ts: float | None = None) -> None:
        """Add one event (not for the call path: it checks the level and may take a lock)."""
        if self._fd < 0 or LEVEL_RANK.get(level, 20) < self.rank:
            return
        entry = (_GENERIC, time.time() if ts is None else ts, level, event, fields)
        if self._loop is not None and _on_thread_of(self._loop):
            self._pending.append(entry)
            if not self.scheduled:
                self.schedule()
            return
        with self._lock:
            self._pending.append(entry)
        if self._loop is not None and not self._loop.is_closed():
            try:
                self._loop.call_soon_threadsafe(self._schedule_from_loop)
            except RuntimeError:  # the loop closed meanwhile
                self.flush()
        else:
            self.flush()

    def tool_finished(
        self, tool: str, module: str, call_id: int, session: str, agent: str, ended: float, duration: float,
        failure: bytes | None,
    ) -> None:
        """``tool.complete`` of call ``call_id`` of ``tool`` in ``module``, asked by the agent's
        ``session``, that ended at ``ended`` (``time.monotonic()``); ``tool.failed`` when ``failure``
        (the result) is given, or ``tool.cancelled`` when it is ``CANCELLED`` (its caller went away
        or cancelled it). Event loop thread only; callers check ``calls_on`` or ``failures_on``.

        A call's start needs nothing on the call path: the caller makes sure a flush is due
        (``schedule``), and the flush finds the call in ``running_calls`` if it still runs then."""
        pending = self._pending
        pending.append((_TOOL_END, ended, tool, module, call_id, session, agent, duration, failure))
        if not self.scheduled:
            self.schedule()
        elif len(pending) >= FLUSH_AT and not self._urgent and self._loop is not None:
            self._urgent = True
            self._loop.call_soon(self.flush)

    def arguments_dropped(
        self, tool: str, module: str, call_id: int, session: str, agent: str, dropped: list[str]
    ) -> None:
        """``tool.arguments_dropped``: undeclared arguments a client sent that the call ran without."""
        self.emit("info", "tool.arguments_dropped", {
            "tool": tool, "module": module, "call": call_id,
            "session": session or None, "agent": agent or None, "dropped": list(dropped),
        })

    def schedule(self) -> None:
        """Have a flush run within ``FLUSH_INTERVAL``, or sooner after a flush that found more than
        ``FLUSH_AT`` events (event loop thread)."""
        loop = self._loop
        if loop is None:
            try:
                loop = self._loop = asyncio.get_running_loop()
            except RuntimeError:
                self.flush()
                return
        self.scheduled = True
        self._timer = loop.call_later(self._interval, self.flush)

    def _schedule_from_loop(self) -> None:
        if not self.scheduled:
            self.schedule()

    # -- writing --------------------------------------------------------------------------------

    def flush(self) -> None:
        """Write every waiting event (one ``write``), rotating the file first if it would be too big."""
        self.scheduled = self._urgent = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        with self._lock:
            pending = self._pending.copy()  # emptied in place: ``call_completed`` is its append
            self._pending.clear()
        now = time.monotonic()
        since, self._flushed_at = self._flushed_at, now
        self._interval = FLUSH_INTERVAL * min(1.0, FLUSH_AT / max(len(pending), 1))
        running = list(self._running_calls()) if self._running_calls is not None and self._fd >= 0 else []
        if running and self.calls_on:
            self.schedule()  # a call that runs now ends without scheduling one: this one does
        started = [c for c in running if c[0] > since]
        if not (pending or started) or self._fd < 0:
            return
        # A call that started and ended since the last flush is one line: its tool.complete (or
        # tool.failed) says when it ended and how long it ran. Formatting is most of the log's cost
        # per call, and most calls are quick: a Struct per line, encoded in one batch, with the
        # names of tool, module, session and agent looked at once for all their calls.
        wall = time.time() - now  # a monotonic time + wall = the time of day it was
        records = self._records(pending, started, wall)
        try:
            data = _encode_lines(records)
        except UnicodeEncodeError:  # a file name that is not UTF-8 in a logging event: escape it, lose nothing
            data = _encode_lines([_escaped(r) for r in records])
        with self._write_lock:
            try:
                if self._size and self._size + len(data) > self.max_bytes:
                    self._rotate()
                os.write(self._fd, data)
                self._size += len(data)
                self.written += len(records)
            except OSError as exc:
                self.dropped += len(records)
                # Not through logging: its handler would feed this log again.
                print(f"atomictoolsd: cannot write the event log {self.path}: {exc}", file=sys.stderr)

    def _records(self, pending: list[Any], started: list[RunningCall], wall: float) -> list[Any]:
        """What to write for ``pending`` and, after them, the ``tool.start`` of the calls ``started``.

        One pass of plain steps per call: the loop below is most of what the log costs a call. A
        name that is not UTF-8 is escaped only when encoding finds one (``_escaped``), and an empty
        session or agent is left out by ``_ToolEvent``'s defaults."""
        records: list[Any] = []
        append = records.append
        last_millis = -1  # a batch holds many calls of the same millisecond: its text is made once
        ts_text = ""
        for entry in pending:
            if type(entry) is not tuple:  # a call that completed (call_completed)
                ended = entry.ended
                millis = int((ended + wall) * 1000)
                if millis != last_millis:
                    last_millis, ts_text = millis, _iso_millis(millis)
                context = entry.context
                append(_ToolEvent(
                    ts_text, "info", "tool.complete", entry.tool, entry.module, entry.id, context.session_id,
                    context.agent, int((ended - entry.started) * 1e6 + 0.5) / 1000,
                ))
                continue
            if entry[0] == _GENERIC:
                _, ts, level, event, fields = entry
                record = {"ts": _iso(ts), "level": level, "event": event}
                if fields:
                    record.update(fields)
                append(record)
                continue
            _, ended, tool, module, call_id, session, agent, duration, failure = entry
            millis = int((ended + wall) * 1000)
            if millis != last_millis:
                last_millis, ts_text = millis, _iso_millis(millis)
            ms = int(duration * 1e6 + 0.5) / 1000  # to the µs, as round(…, 3) but a third of its cost
            if failure is None:
                append(_ToolEvent(ts_text, "info", "tool.complete", tool, module, call_id, session, agent, ms))
            elif failure is CANCELLED:
                append(_ToolEvent(ts_text, "info", "tool.cancelled", tool, module, call_id, session, agent, ms))
            else:
                append(_ToolEvent(
                    ts_text, "warning", "tool.failed", tool, module, call_id, session, agent, ms, error_text(failure)
                ))
        for began, tool, module, call_id, session, agent in sorted(started):
            append(_ToolEvent(_iso(began + wall), "info", "tool.start", tool, module, call_id, session, agent))
        return records

    def _rotate(self) -> None:
        """Start a new file. The current one stays open until the new one is: a rotation that
        fails (the backup's name taken, the disk full) keeps writing where it was, and tries again
        after another ``max_bytes``."""
        assert self.path is not None
        path = str(self.path)
        try:
            if self.backups > 0:
                for index in range(self.backups - 1, 0, -1):
                    try:
                        os.replace(f"{path}.{index}", f"{path}.{index + 1}")
                    except FileNotFoundError:
                        pass
                os.replace(path, f"{path}.1")
            else:
                os.unlink(path)
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            print(f"atomictoolsd: cannot rotate the event log {path}: {exc}", file=sys.stderr)
        else:
            os.close(self._fd)
            self._fd = fd
        self._size = 0


def _on_thread_of(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


# ISO timestamps: the seconds are formatted once per second, the milliseconds come from a table.
_second_cache: list[Any] = [-1, ""]
_MILLIS = [f".{i:03d}Z" for i in range(1000)]


def _iso(ts: float) -> str:
    return _iso_millis(int(ts * 1000))


def _iso_millis(millis: int) -> str:
    """The ISO text of ``millis`` milliseconds since the epoch, UTC."""
    second, milli = divmod(millis, 1000)
    if _second_cache[0] != second:
        _second_cache[0] = second
        _second_cache[1] = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
    return _second_cache[1] + _MILLIS[milli]


def _escaped(record: Any) -> Any:
    """``record`` with every string that is not UTF-8 escaped, as every report shows such a name."""
    if isinstance(record, _ToolEvent):
        return msgspec.structs.replace(
            record, tool=escape_strings(record.tool), module=escape_strings(record.module),
            session=escape_strings(record.session), agent=escape_strings(record.agent),
        )
    return escape_strings(record)


class _ToolEvent(msgspec.Struct, omit_defaults=True):
    """A tool event as written (a Struct: cheaper to build and to encode than a dict)."""

    ts: str
    level: str
    event: str
    tool: str
    module: str
    call: int
    session: str = ""  # an empty session or agent is left out
    agent: str = ""
    ms: float | None = None
    error: str | None = None


def error_text(result: bytes) -> str:
    """The text of an ``isError`` tool result, cut to a log-sized length."""
    try:
        content = _decode_json(result).get("content") or []
        text = " ".join(block.get("text", "") for block in content if isinstance(block, dict))
    except (msgspec.DecodeError, AttributeError):
        text = result.decode(errors="replace")
    return text if len(text) <= 1000 else text[:1000] + "…"


class EventLogHandler(logging.Handler):
    """Python logging → the event log. ``extra={"event": ..., "data": {...}}`` gives structure."""

    def __init__(self, log: EventLog) -> None:
        super().__init__()
        self.log = log

    def emit(self, record: logging.LogRecord) -> None:
        try:
            level = record.levelname.lower()
            fields: dict[str, Any] = {"logger": record.name, "message": record.getMessage()}
            data = getattr(record, "data", None)
            if isinstance(data, dict):
                fields.update(data)
            if record.exc_info and record.exc_info[0] is not None:
                fields["traceback"] = "".join(traceback.format_exception(*record.exc_info)).rstrip()
            self.log.emit(level, getattr(record, "event", "log"), fields, ts=record.created)
        except Exception:
            self.handleError(record)


# -- stderr under systemd -------------------------------------------------------------------------

_SYSLOG_PRIORITY = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3, logging.CRITICAL: 2}


def stderr_is_journal(environ: dict[str, str] | None = None) -> bool:
    """Whether stderr is connected to the systemd journal (``JOURNAL_STREAM`` names its device:inode)."""
    value = (os.environ if environ is None else environ).get("JOURNAL_STREAM", "")
    device, _, inode = value.partition(":")
    if not device.isdigit() or not inode.isdigit():
        return False
    try:
        info = os.fstat(sys.stderr.fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return (info.st_dev, info.st_ino) == (int(device), int(inode))


class JournalFormatter(logging.Formatter):
    """``<priority>logger: message``: the journal reads the level from the prefix and adds the time."""

    def __init__(self) -> None:
        super().__init__("%(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        priority = _SYSLOG_PRIORITY.get(record.levelno, 6)
        # Continuation lines (tracebacks) keep the level, or the journal files them as info.
        return "\n".join(f"<{priority}>{line}" for line in super().format(record).splitlines())


# -- reading --------------------------------------------------------------------------------------
