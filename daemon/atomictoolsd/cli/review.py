"""``atomictoolsd trust --review [PATH]``: show what arrived through git in a fully trusted project's
tools and was never reviewed (registry/content.py), and approve it.

For each held file: the diff between the content you last trusted and the content there now, with
every control and invisible character escaped (a diff must not hide code from the reader). Then it
asks, on a terminal, or takes ``--yes``; without a terminal and without ``--yes`` it approves nothing.
Approving records exactly the content shown; a running daemon is told, and loads it as the project's
trust says. Works without a daemon.
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys
import threading
from pathlib import Path
from typing import Any

from atomictoolsd.config.command import command_name

__all__ = ["cmd_review", "held_files"]

JUDGE_TIMEOUT = 20.0  # seconds to read the repository before giving up (a hostile .git can hang a read)


def _shown(line: str) -> str:
    """``line`` with control and invisible characters (an escape sequence, a bidi override) escaped."""
    return "".join(ch if ch == "\t" or ch.isprintable() else ascii(ch)[1:-1] for ch in line)


def held_files(root: Path, state_dir: Path, write: bool = True) -> tuple[Any, str | None, str | None]:
    """Judge the content of ``root``'s tools now: ``(verdict, trusted_at, problem)``. ``problem`` says
    why there is nothing to judge (not trusted, trusted with --sandbox) or why it failed. ``write``:
    record your own edits and new holds, as the daemon does (``doctor`` only looks)."""
    from atomictoolsd.config.discovery import local_tools_dir
    from atomictoolsd.registry.content import ContentStore, judge
    from atomictoolsd.registry.gitorigin import Repo
    from atomictoolsd.registry.trust import (
        TrustError,
        TrustStore,
    )

    try:
        entry = TrustStore(state_dir).entry(root)
    except TrustError as exc:
        return None, None, str(exc)
    if entry is None:
        return None, None, f"{root} is not a trusted project: its tools do not load at all"
    if entry.get("level", "full") != "full":
        return None, None, f"{root} is trusted with --sandbox: its tools run confined whatever their content"
    trusted_at = str(entry.get("trusted_at", ""))
    outcome: list[Any] = []

    def work() -> None:
        try:
            outcome.append(judge(root, local_tools_dir(root), ContentStore(state_dir), trusted_at, Repo(root).origins,
                                 write=write))
        except OSError as exc:
            outcome.append(exc)

    # A daemon thread: a repository that blocks the read (a FIFO its config includes) must not
    # keep this command from exiting.
    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    thread.join(JUDGE_TIMEOUT)
    if not outcome:
        return None, None, f"reading the repository of {root} did not finish within {JUDGE_TIMEOUT:g} s"
    if isinstance(outcome[0], OSError):
        return None, None, str(outcome[0])
    return outcome[0], trusted_at, None


def _diff(rel: str, before: bytes | None, now: bytes, known: bool) -> list[str]:
    if b"\0" in now or (before is not None and b"\0" in before):
        return [f"  binary file: {len(now)} bytes now" + (f", {len(before)} before" if before is not None else "")]
    old = before.decode("utf-8", "replace").splitlines(keepends=True) if before is not None else []
    new = now.decode("utf-8", "replace").splitlines(keepends=True)
    head = f"{rel} (trusted)" if before is not None else f"{rel} ({'not kept' if known else 'new file'})"
    lines = list(difflib.unified_diff(old, new, fromfile=head, tofile=f"{rel} (now)"))
    return [_shown(line.rstrip("\n")) for line in lines] or ["  (no difference in its text)"]


def cmd_review(args: argparse.Namespace, root: Path, only: str | None) -> int:
    """Show the held content of the project at ``root`` (``only`` that file, if given) and approve it."""
    from atomictoolsd.config.paths import Paths
    from atomictoolsd.registry.content import ContentStore, digest, read_code

    state_dir = Paths.from_env().state_dir
    verdict, trusted_at, problem = held_files(root, state_dir)
    if problem is not None:
        print(f"atomictoolsd: {problem}", file=sys.stderr)
        return 1
    assert trusted_at is not None
    held = {path: h for path, h in verdict.held.items() if only is None or path == only}
    if not held:
        what = only or f"the tools of {root}"
        print(f"nothing to review: {_shown(what)} is content you trusted, or your own edits")
        return 0
    store = ContentStore(state_dir)
    record = store.record(root, trusted_at) or {"seen": {}}
    approved: dict[str, bytes] = {}
    for path, h in sorted(held.items()):
        got = read_code(path)
        if got is None or (h.digest and digest(got[0]) != h.digest):
            print(f"atomictoolsd: {_shown(path)} changed while it was judged; run the command again", file=sys.stderr)
            return 1
        history = record["seen"].get(h.rel, [])
        before = store.copy(history[-1]) if history else None
        why = "arrived through git" if h.why == "git" else "its origin cannot be told"
        print(f"== {_shown(path)} ({why})")
        print("\n".join(_diff(h.rel, before, got[0], bool(history))))
        print()
        approved[h.rel] = got[0]
    if not _confirmed(args, len(approved)):
        return 1
    store.update(root, trusted_at, seen=approved)
    print(f"approved {len(approved)} file(s) of {_shown(str(root))}")
    print(_tell_daemon())
    return 0


def _confirmed(args: argparse.Namespace, count: int) -> bool:
    if args.yes:
        return True
    if not sys.stdin.isatty():
        print(f"atomictoolsd: not approved: no terminal to ask on; to approve what is shown above, run: "
              f"{command_name()} trust --review --yes {' '.join(args.review_target)}".rstrip(), file=sys.stderr)
        return False
    try:
        answer = input(f"approve these {count} file(s), so that they run with all your rights? [y/N] ")
    except EOFError:
        answer = ""
    if answer.strip().lower() not in ("y", "yes"):
        print("not approved: they stay held")
        return False
    return True


def _tell_daemon() -> str:
    from atomictoolsd.cli._common import raw_request

    if not isinstance(raw_request("atomic/trust/refresh"), dict):
        return "the daemon is not running; it will read this when it starts"
    return "the running daemon loads them as the project's trust says; attached agents were told"


def review_target(path: str | None) -> tuple[str | None, str | None]:
    """The directory to find the project from, and the one file to review (None: all), for ``PATH``."""
    if path is None:
        return None, None
    if os.path.isfile(path):
        real = os.path.realpath(path)
        return os.path.dirname(real), os.path.abspath(path)
    return path, None
