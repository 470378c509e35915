"""Cap tool output that would flood a model's context, keeping the full text in a spill file.

Output over ``max_lines`` lines or ``max_bytes`` bytes (UTF-8) keeps its head, gains a notice that
says how much was cut and where the whole is, and the whole is written to a file under the
daemon's state dir; the daemon deletes old spill files. Runs inside workers (standard library only).
"""

from __future__ import annotations

import os
import stat
import tempfile
import time

from atomictoolsd.worker.removal import DIR_FLAGS, walk_dir

__all__ = ["Truncated", "remove_old_spills", "spill", "truncate"]


class Truncated:
    """The visible text and the path of the spill file holding the full output."""

    __slots__ = ("path", "text")

    def __init__(self, text: str, path: str) -> None:
        self.text = text
        self.path = path


def truncate(text: str, max_lines: int, max_bytes: int, spill_dir: str, label: str = "tool") -> Truncated | None:
    """Return the truncated form of ``text``, or None when it is within both limits."""
    # len(text) is a lower bound of its UTF-8 size: the exact size is only needed near the limit.
    newlines = text.count("\n")
    if newlines < max_lines and len(text) <= max_bytes // 4:
        return None
    encoded = text.encode("utf-8", "surrogatepass")
    lines_total = newlines + (0 if text.endswith("\n") else 1)
    if lines_total <= max_lines and len(encoded) <= max_bytes:
        return None

    head = text
    if lines_total > max_lines:
        cut = -1
        for _ in range(max_lines):
            cut = head.find("\n", cut + 1)
        head = head[: cut + 1]
    head_bytes = head.encode("utf-8", "surrogatepass")
    if len(head_bytes) > max_bytes:
        head = head_bytes[:max_bytes].decode("utf-8", "ignore")  # drops a split character
        last_newline = head.rfind("\n")
        if last_newline > 0:
            head = head[: last_newline + 1]
    shown_lines = head.count("\n") + (0 if head.endswith("\n") or not head else 1)

    path = spill(encoded, spill_dir, label)
    notice = (
        f"\n[output truncated: showing {shown_lines:,} of {lines_total:,} lines "
        f"({len(head.encode('utf-8', 'surrogatepass')):,} of {len(encoded):,} bytes); "
        f"the full output is in {path}]"
    )
    return Truncated(head + notice, path)


def spill(data: bytes, spill_dir: str, label: str, suffix: str = ".txt") -> str:
    """Write ``data`` to a new spill file (mode 0600); return its path."""
    os.makedirs(spill_dir, mode=0o700, exist_ok=True)
    fd, path = tempfile.mkstemp(prefix=f"{label}-", suffix=suffix, dir=spill_dir)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return path


def remove_old_spills(spill_dir: str, max_age_seconds: float) -> int:
    """Delete spill files older than ``max_age_seconds``, also those in the directory of each
    confined worker (``sandbox-*``, removed once empty and old); return how many were removed.

    A confined worker's directory is its own to write, while this runs: it is walked by descriptor,
    never following a link (``removal``), and at most ``_DEPTH`` levels below it.
    """
    try:
        fd = os.open(spill_dir, DIR_FLAGS)
    except OSError:
        return 0  # gone, or not a directory of ours (a link): nothing to walk
    cutoff = time.time() - max_age_seconds
    removed = 0
    try:
        for name in os.listdir(fd):
            try:
                info = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(info.st_mode) and name.startswith("sandbox-"):
                removed += walk_dir(fd, name, info, cutoff, _DEPTH)
            elif stat.S_ISREG(info.st_mode) and info.st_mtime < cutoff:
                try:
                    os.unlink(name, dir_fd=fd)
                    removed += 1
                except OSError:
                    continue
    finally:
        os.close(fd)
    return removed


_DEPTH = 8  # levels walked below a confined worker's spill directory
