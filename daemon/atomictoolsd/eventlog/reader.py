"""Reading the event log back, for ``atomictoolsd logs``: the files oldest first, every event in them,
following the current file across rotations, and one line per event for a terminal.

Never imported by the running daemon (only the ``logs`` command reads the log).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

from atomictoolsd.eventlog.writer import LOG_NAME

__all__ = ["CAUGHT_UP", "follow_events", "format_event", "log_files", "read_events"]

_decode_json = msgspec.json.decode


def log_files(log_dir: Path) -> list[Path]:
    """The log and its rotated backups that exist, oldest first."""
    current = log_dir / LOG_NAME
    backups = []
    for candidate in log_dir.glob(f"{LOG_NAME}.*"):
        suffix = candidate.name[len(LOG_NAME) + 1 :]
        if suffix.isdigit():
            backups.append((int(suffix), candidate))
    files = [path for _, path in sorted(backups, reverse=True)]
    if current.exists():
        files.append(current)
    return files


def _parse(line: bytes) -> dict[str, Any] | None:
    line = line.strip()
    if not line:
        return None
    try:
        value = _decode_json(line)
    except msgspec.DecodeError:
        return {"ts": "", "level": "error", "event": "unreadable", "line": line.decode(errors="replace")}
    return value if isinstance(value, dict) else None


def read_events(log_dir: Path, backups_only: bool = False) -> Iterator[dict[str, Any]]:
    """Every event in the log and its backups, oldest first (``backups_only``: not the current file)."""
    files = log_files(log_dir)
    if backups_only:
        files = [f for f in files if f.name != LOG_NAME]
    for path in files:
        try:
            with open(path, "rb") as fh:
                for line in fh:
                    event = _parse(line)
                    if event is not None:
                        yield event
        except FileNotFoundError:  # rotated away while we read
            continue


CAUGHT_UP: dict[str, Any] = {}  # yielded once by follow_events when it has read what was written


def follow_events(log_dir: Path, interval: float = 0.2) -> Iterator[dict[str, Any]]:
    """The current log file's events from its start, then ``CAUGHT_UP`` once, then every event
    written from then on, across rotations (the rest of a rotated file is read before moving to the
    new one). Never ends."""
    path = log_dir / LOG_NAME
    fh = None
    inode = None
    partial = b""
    caught_up = False
    while True:
        if fh is None:
            try:
                fh = open(path, "rb")
            except FileNotFoundError:
                if not caught_up:
                    caught_up = True
                    yield CAUGHT_UP
                time.sleep(interval)
                continue
            inode = os.fstat(fh.fileno()).st_ino
        chunk = fh.read()
        if chunk:
            partial += chunk
            *lines, partial = partial.split(b"\n")
            for line in lines:
                event = _parse(line)
                if event is not None:
                    yield event
            continue
        if not caught_up:
            caught_up = True
            yield CAUGHT_UP
        try:
            rotated = os.stat(path).st_ino != inode
        except FileNotFoundError:
            rotated = True
        if rotated:  # the rest of the old file has been read: move to the new one
            fh.close()
            fh = None
            partial = b""
            continue
        time.sleep(interval)


_KNOWN = ("ts", "level", "event", "message", "logger")


def format_event(event: dict[str, Any]) -> str:
    """One human line: time, level, event, message, then the other fields as key=value; the rest of a
    multi-line field (an error's traceback) follows on indented lines."""
    ts = str(event.get("ts", ""))
    parts = [ts.replace("T", " ").rstrip("Z"), f"{str(event.get('level', '')).upper():7}", str(event.get("event", ""))]
    message = event.get("message")
    if message and event.get("event") == "log":
        parts.append(f"{event.get('logger', '')}: {message}")
    elif message:
        parts.append(str(message))
    tails = []
    for key, value in event.items():
        if key in _KNOWN or value is None or key == "traceback":
            continue
        if isinstance(value, str):
            first, _, rest = value.partition("\n")
            if rest.strip():
                tails.append(rest.strip("\n"))
            text = msgspec.json.encode(first).decode() if (" " in first or not first or rest) else first
        else:
            text = msgspec.json.encode(value).decode()
        parts.append(f"{key}={text}")
    if event.get("traceback"):
        tails.append(str(event["traceback"]))
    line = "  ".join(p for p in parts if p)
    for tail in tails:
        line += "\n" + "\n".join("    " + t for t in tail.splitlines())
    return line
