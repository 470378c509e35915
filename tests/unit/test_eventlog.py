"""The event log: buffered JSON lines, size rotation, levels, and reading it back (eventlog)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import pytest

from atomictoolsd.config.discovery import escape_path
from atomictoolsd.eventlog.reader import format_event, log_files, read_events
from atomictoolsd.eventlog.writer import (
    CANCELLED,
    FLUSH_AT,
    FLUSH_INTERVAL,
    LOG_NAME,
    EventLog,
    EventLogHandler,
    JournalFormatter,
    stderr_is_journal,
)


def fake_call(tool: str = "greet", call_id: int = 1) -> tuple[str, str, int, str, str]:
    """What the pool tells the log of a call: tool, module, call id, session, agent (a real call needs a worker)."""
    return (tool, "/t/greet.py", call_id, "s1", "agent")


@dataclass
class CompletedCall:
    """A call as the pool hands a completed one to ``call_completed`` (a real call needs a worker)."""

    id: int
    started: float
    ended: float
    tool: str = "greet"
    module: str = "/t/greet.py"
    context: SimpleNamespace = field(default_factory=lambda: SimpleNamespace(session_id="s1", agent="agent"))


def lines(path: Path) -> list[dict]:  # type: ignore[type-arg]
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_tool_events_are_buffered_and_written_in_one_batch(tmp_path: Path) -> None:
    log = EventLog()
    log.open(tmp_path / LOG_NAME)
    path = tmp_path / LOG_NAME

    async def calls() -> tuple[int, int]:
        log.schedule()  # as the pool does when a call starts: a call's end schedules nothing
        for i in range(1000):
            now = time.monotonic()
            log.call_completed(CompletedCall(i, now - 0.000123, now))
        size_right_after = path.stat().st_size
        await asyncio.sleep(FLUSH_INTERVAL * 4)
        return size_right_after, path.stat().st_size

    before, after = asyncio.run(calls())
    assert before == 0, "nothing is written on the call path"
    assert after > 0
    written = lines(path)
    # Each call started and ended within one batch: one line, which carries its duration.
    assert len(written) == 1000 and log.written == 1000
    assert written[0] == {
        "ts": written[0]["ts"], "level": "info", "event": "tool.complete", "tool": "greet", "module": "/t/greet.py",
        "call": 0, "session": "s1", "agent": "agent", "ms": 0.123,
    }
    assert written[0]["ts"].endswith("Z") and "T" in written[0]["ts"]
    log.close()


def test_a_call_still_running_at_a_flush_gets_its_start_line_once(tmp_path: Path) -> None:
    running: dict[int, tuple[float, str, str, int, str, str]] = {}
    log = EventLog(lambda: list(running.values()))  # what the pool reports
    log.open(tmp_path / LOG_NAME)

    async def slow_call() -> None:
        call = fake_call(call_id=7)
        started = time.monotonic()
        running[7] = (started, *call)
        log.tool_finished(*fake_call(call_id=6), time.monotonic(), 0.001, None)  # a quick one meanwhile
        log.schedule()  # as the pool does when a call starts
        await asyncio.sleep(FLUSH_INTERVAL * 3)  # a flush happens while it runs
        log.flush()  # and another: it began before the last one, so it is not written again
        del running[7]
        log.tool_finished(*call, time.monotonic(), FLUSH_INTERVAL * 3, None)
        await asyncio.sleep(FLUSH_INTERVAL * 3)

    before = time.time()
    asyncio.run(slow_call())
    written = lines(tmp_path / LOG_NAME)
    assert [(e["event"], e["call"]) for e in written] == [("tool.complete", 6), ("tool.start", 7), ("tool.complete", 7)]
    start = datetime.strptime(written[1]["ts"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()
    assert abs(start - before) < 0.1, "tool.start says when it started, not when it was written"
    assert written[1] == {"ts": written[1]["ts"], "level": "info", "event": "tool.start", "tool": "greet",
                          "module": "/t/greet.py", "call": 7, "session": "s1", "agent": "agent"}
    log.close()


def test_a_call_that_ends_after_a_flush_is_written_by_the_flush_its_run_kept_due(tmp_path: Path) -> None:
    # A call's end schedules no flush (the call path appends only): a flush that finds calls still
    # running schedules the next one, so the end of a call that outlived a flush is written in time.
    running: dict[int, tuple[float, str, str, int, str, str]] = {}
    log = EventLog(lambda: list(running.values()))
    path = tmp_path / LOG_NAME
    log.open(path)

    async def long_call() -> list[str]:
        started = time.monotonic()
        running[3] = (started, *fake_call(call_id=3))
        log.schedule()  # its start, as the pool does
        await asyncio.sleep(FLUSH_INTERVAL * 2)  # the first flush runs while it does
        del running[3]
        log.call_completed(CompletedCall(3, started, time.monotonic()))
        await asyncio.sleep(FLUSH_INTERVAL * 2)
        return [e["event"] for e in lines(path)]

    assert asyncio.run(long_call()) == ["tool.start", "tool.complete"]
    assert not log.scheduled, "no call runs and nothing waits: no flush is kept due"
    log.close()


def test_a_flush_that_found_a_large_batch_brings_the_next_one_forward(tmp_path: Path) -> None:
    running = [(0.0, *fake_call(call_id=1))]  # a call that keeps running (from before: no tool.start)
    log = EventLog(lambda: running)
    path = tmp_path / LOG_NAME
    log.open(path)

    async def busy() -> tuple[int, float]:
        log.schedule()
        now = time.monotonic()
        for i in range(FLUSH_AT * 4):  # four times the batch a flush should find
            log.call_completed(CompletedCall(i, now, now))
        log.flush()  # a batch of 4 × FLUSH_AT
        flushed = time.monotonic()
        for i in range(10):
            log.call_completed(CompletedCall(FLUSH_AT * 4 + i, now, now))
        deadline = flushed + FLUSH_INTERVAL * 4
        while log.written < FLUSH_AT * 4 + 10 and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        return log.written, time.monotonic() - flushed

    written, waited = asyncio.run(busy())
    assert written == FLUSH_AT * 4 + 10
    assert waited < FLUSH_INTERVAL / 2, f"the next flush came after {waited:.3f} s, not a quarter of the interval"
    log.close()


def test_names_that_are_not_utf8_or_need_escaping_are_written_as_json(tmp_path: Path) -> None:
    log = EventLog()
    log.open(tmp_path / LOG_NAME)
    module = "/t/caf\udce9 \"q\"\n.py"  # a file name that is not UTF-8, with a quote and a newline
    log.tool_finished("greet", module, 1, "", "", time.monotonic(), 0.002, None)
    log.tool_finished("greet", module, 2, "s\u00e9", "agent", time.monotonic(), 0.002, CANCELLED)
    log.close()
    written = lines(tmp_path / LOG_NAME)
    assert [e["event"] for e in written] == ["tool.complete", "tool.cancelled"]
    assert "session" not in written[0] and "agent" not in written[0]  # empty: left out
    assert written[1]["session"] == "s\u00e9"
    assert written[0]["module"] == escape_path(module)  # as every report shows such a name


def test_failures_carry_the_error_text_and_levels_filter(tmp_path: Path) -> None:
    log = EventLog()
    log.open(tmp_path / LOG_NAME, level="warning")
    assert not log.calls_on and log.failures_on
    result = b'{"content":[{"type":"text","text":"Tool \'greet\' raised ValueError: no"}],"isError":true}'
    log.tool_finished(*fake_call(), time.monotonic(), 0.5, result)
    log.emit("info", "module.load", {"path": "x"})  # below the level: dropped
    log.emit("error", "config.error", {"error": "bad"})
    log.close()
    written = lines(tmp_path / LOG_NAME)
    assert [e["event"] for e in written] == ["tool.failed", "config.error"]
    assert written[0]["level"] == "warning" and written[0]["ms"] == 500.0
    assert written[0]["error"] == "Tool 'greet' raised ValueError: no"


def test_rotation_by_size_keeps_the_configured_backups(tmp_path: Path) -> None:
    log = EventLog()
    log.open(tmp_path / LOG_NAME, max_bytes=4096, backups=2)
    for i in range(400):
        log.emit("info", "n", {"i": i, "pad": "x" * 40})
        log.flush()
    log.close()
    files = log_files(tmp_path)
    assert [f.name for f in files] == [f"{LOG_NAME}.2", f"{LOG_NAME}.1", LOG_NAME]
    assert not (tmp_path / f"{LOG_NAME}.3").exists()
    assert all(f.stat().st_size <= 4096 for f in files)
    numbers = [e["i"] for e in read_events(tmp_path)]
    assert numbers == list(range(numbers[0], 400)), "oldest first, nothing missing between the kept files"
    assert oct((tmp_path / LOG_NAME).stat().st_mode & 0o777) == "0o600"


def test_a_rotation_that_fails_keeps_writing_to_the_current_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / f"{LOG_NAME}.1").mkdir()  # the backup's name is taken by a directory: renaming fails
    (tmp_path / f"{LOG_NAME}.1" / "keep").write_text("x")
    log = EventLog()
    log.open(tmp_path / LOG_NAME, max_bytes=4096, backups=1)
    for i in range(200):
        log.emit("info", "n", {"i": i, "pad": "x" * 40})
        log.flush()
    log.close()
    assert [e["i"] for e in lines(tmp_path / LOG_NAME)] == list(range(200)), "no event lost"
    assert log.dropped == 0
    assert "cannot rotate the event log" in capsys.readouterr().err


def test_no_backups_means_the_log_starts_over(tmp_path: Path) -> None:
    log = EventLog()
    log.open(tmp_path / LOG_NAME, max_bytes=4096, backups=0)
    for i in range(200):
        log.emit("info", "n", {"i": i, "pad": "x" * 40})
        log.flush()
    log.close()
    assert [f.name for f in log_files(tmp_path)] == [LOG_NAME]
    assert (tmp_path / LOG_NAME).stat().st_size <= 4096


def test_logging_records_become_structured_events(tmp_path: Path) -> None:
    log = EventLog()
    log.open(tmp_path / LOG_NAME)
    logger = logging.getLogger("test.eventlog")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    handler = EventLogHandler(log)
    logger.addHandler(handler)
    try:
        logger.info("loaded %s", "x.py", extra={"event": "module.load", "data": {"path": "x.py", "ms": 1.5}})
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            logger.exception("plain")
    finally:
        logger.removeHandler(handler)
    log.close()
    first, second = lines(tmp_path / LOG_NAME)
    assert first["event"] == "module.load" and first["path"] == "x.py" and first["ms"] == 1.5
    assert first["message"] == "loaded x.py" and first["logger"] == "test.eventlog"
    assert second["event"] == "log" and second["level"] == "error" and "RuntimeError: boom" in second["traceback"]


def test_a_closed_log_costs_nothing_and_writes_nothing(tmp_path: Path) -> None:
    log = EventLog()
    assert not log.calls_on and not log.failures_on
    log.emit("error", "x")
    assert log.written == 0 and list(tmp_path.iterdir()) == []


def test_human_format() -> None:
    line = format_event({
        "ts": "2025-01-02T03:04:05.678Z", "level": "warning", "event": "tool.failed", "tool": "greet",
        "ms": 1.5, "error": "bad thing",
    })
    assert line.startswith("2025-01-02 03:04:05.678  WARNING  tool.failed")
    assert 'tool=greet' in line and "ms=1.5" in line and 'error="bad thing"' in line


def test_journal_prefix_and_detection(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    record = logging.LogRecord("atomictoolsd", logging.WARNING, __file__, 1, "one\ntwo", None, None)
    assert JournalFormatter().format(record) == "<4>atomictoolsd: one\n<4>two"
    info = os.fstat(sys.stderr.fileno())
    assert stderr_is_journal({"JOURNAL_STREAM": f"{info.st_dev}:{info.st_ino}"})
    assert not stderr_is_journal({"JOURNAL_STREAM": f"{info.st_dev}:{info.st_ino + 1}"})
    assert not stderr_is_journal({})


def test_a_multi_line_error_reads_as_a_line_and_its_traceback() -> None:
    text = format_event({
        "ts": "2025-01-02T03:04:05.678Z", "level": "warning", "event": "tool.failed", "tool": "g",
        "error": "Tool 'g' raised ValueError: no\n\nTraceback (most recent call last):\nValueError: no",
    })
    assert text.splitlines() == [
        "2025-01-02 03:04:05.678  WARNING  tool.failed  tool=g  error=\"Tool 'g' raised ValueError: no\"",
        "    Traceback (most recent call last):",
        "    ValueError: no",
    ]


def test_a_file_name_that_is_not_utf8_loses_no_event_of_its_batch(tmp_path: Path) -> None:
    log = EventLog()
    log.open(tmp_path / LOG_NAME)
    log.emit("info", "first", {"path": "/t/ok.py"})
    log.emit("warning", "module.skipped", {"path": os.fsdecode(b"/t/bad\xff.py")})
    log.emit("info", "last")
    log.close()
    events = lines(tmp_path / LOG_NAME)
    assert [e["event"] for e in events] == ["first", "module.skipped", "last"]
    assert events[1]["path"] == "/t/bad\\xff.py"
