"""How each module of a fully trusted project may run, given where its content came from: as the
project's trust says, confined, or not at all (registry/content.py judges the content).

A module is **held** when its own file, or a file it imported when it last loaded, holds content
that came through git and was never reviewed (``content.Held``; why: ``content.Hold``). A held module runs confined where
the sandbox is available (``held_policy``: the same rules as ``trust --sandbox`` without widening,
plus your ``sandbox_allow_*`` settings), and not at all where it is not. Every other module of the
project runs with your full rights, and its workers may load from the tools dir only the content
judged trusted (``ModuleRunner.trusted_content``, checked in the worker: a module that imports a
held helper, or a file that changed after the judgement, is refused there and judged again).

Judging reads files and the repository's index (``HEAD`` in a process of its own when the index
cannot answer: ``gitorigin``), and writes the content record: it runs in daemon threads, one
judgement of a dir at a time, and a caller waits at most ``timeout`` seconds for it. A judgement
that does not end (a filesystem that hangs) holds the project's modules (``Verdict.stuck``) until
one does.

Only for a project's own tools dir trusted fully (not with ``--sandbox``: its modules run confined
whatever their content) and only when ``trust_all`` is off. Knows nothing of sockets or sessions.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from atomictoolsd.registry import content
from atomictoolsd.registry.content import Hold
from atomictoolsd.registry.gitorigin import Repo, stop_readers

if TYPE_CHECKING:
    from atomictoolsd.registry.model import ToolsDir
    from atomictoolsd.registry.trust import TrustStore

__all__ = ["ContentJudge"]

log = logging.getLogger("atomictoolsd.trust")

JUDGE_TIMEOUT = 5.0  # seconds a scan or a worker's start waits for a judgement of content


class ContentJudge:
    """Judges the content of fully trusted projects' own tools dirs, in threads, bounded in time.

    Args:
        trust: the trust store (a dir is judged while its project is trusted fully).
        store: the content record.
        trust_all: whether every project is trusted (then no content is followed).
        held_policy: the sandbox policy a held module of the project at a root runs with, or why it
            cannot run confined here (``(None, reason)``).
    """

    def __init__(
        self,
        trust: TrustStore,
        store: content.ContentStore,
        trust_all: Callable[[], bool],
        held_policy: Callable[[Path], tuple[dict[str, Any] | None, str | None]],
        timeout: float = JUDGE_TIMEOUT,
    ) -> None:
        self.trust = trust
        self.store = store
        self.trust_all = trust_all
        self.held_policy = held_policy
        self.timeout = timeout
        self._running: dict[tuple[Path, Path], asyncio.Future[content.Verdict]] = {}

    def follows(self, tools_dir: ToolsDir) -> bool:
        """Whether the content of ``tools_dir`` is followed: a project's own dir, fully trusted (not
        with ``--sandbox``), ``trust_all`` off."""
        return self._entry(tools_dir) is not None

    def _entry(self, tools_dir: ToolsDir) -> dict[str, Any] | None:
        if tools_dir.scope != "local" or not tools_dir.trusted or tools_dir.sandbox is not None or self.trust_all():
            return None
        entry = self.trust.entry(tools_dir.cwd)
        if entry is not None and entry.get("level", "full") != "full":
            return None
        return entry if entry is not None else {}

    async def judge(self, tools_dir: ToolsDir) -> content.Verdict | None:
        """Judge the content of ``tools_dir`` now (None: it is not followed). A judgement of the dir
        already under way is waited for first: it may have read the files before they changed."""
        entry = self._entry(tools_dir)
        if entry is None:
            return None
        if not entry:  # trusted when the dir was last judged, not now: nothing runs unconfined till it is again
            return content.Verdict(stuck="its project is no longer trusted")
        trusted_at = str(entry.get("trusted_at", ""))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        previous = self._running.get(tools_dir.key)
        if previous is not None and not previous.done():
            await asyncio.wait([previous], timeout=self.timeout)
            if not previous.done():
                return self._stuck(tools_dir)
        root = tools_dir.cwd
        job = in_thread(partial(
            content.judge, root, tools_dir.path, self.store, trusted_at, lambda files: Repo(root).origins(files),
            sync=False, later=True,
        ))
        self._running[tools_dir.key] = job
        job.add_done_callback(lambda f: f.cancelled() or f.exception())  # retrieved: its asker may be gone
        try:
            verdict = await asyncio.wait_for(asyncio.shield(job), max(0.0, deadline - loop.time()))
        except TimeoutError:
            return self._stuck(tools_dir)
        except Exception as exc:  # a bug, or the record cannot be written: hold, and say why
            log.warning("cannot judge the content of %s: %s; its modules are held", tools_dir.path, exc)
            return content.Verdict(stuck=f"its content could not be judged ({exc})")
        for rel in verdict.recorded:
            log.info("recorded your edit of %s/%s as trusted content", tools_dir.path, rel)
        if verdict.first:
            log.info("recorded the content of %s as trusted (no record was kept for it yet)", tools_dir.path)
        return verdict

    def _stuck(self, tools_dir: ToolsDir) -> content.Verdict:
        why = f"reading its repository did not finish within {self.timeout:g} s"
        log.warning("cannot tell where the content of %s came from: %s; its modules are held", tools_dir.path, why)
        return content.Verdict(stuck=why)

    def hold(self, verdict: content.Verdict | None, path: str, deps: list[list[Any]]) -> Hold | None:
        """Why the module at ``path`` (which imported ``deps`` when it last loaded) is held, if it is."""
        if verdict is None:
            return None
        if verdict.stuck:
            return Hold([path], "unknown")
        files = [p for p in (path, *(dep[0] for dep in deps)) if p in verdict.held]
        if not files:
            return None
        return Hold(files, "git" if any(verdict.held[p].why == "git" for p in files) else "unknown")

    def close(self) -> None:
        self._running.clear()
        stop_readers()


def in_thread(work: Callable[[], content.Verdict]) -> asyncio.Future[content.Verdict]:
    """Run ``work`` in a thread of its own, a daemon thread: one that a filesystem keeps blocked
    neither holds a pool's thread nor keeps the daemon from exiting. The verdict's record is
    written there once the verdict is handed over (``Verdict.persist``)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[content.Verdict] = loop.create_future()

    def settle(outcome: Any, failed: bool) -> None:
        if not future.done():
            future.set_exception(outcome) if failed else future.set_result(outcome)

    def run() -> None:
        try:
            outcome, failed = work(), False
        except Exception as exc:  # noqa: BLE001 - handed to the awaiting side
            outcome, failed = exc, True
        try:
            loop.call_soon_threadsafe(settle, outcome, failed)
        except RuntimeError:
            pass  # the loop is closed: nobody waits any more
        persist = None if failed else outcome.persist
        if persist is not None:  # after the verdict is acted on: a reload does not wait for the record
            try:
                persist()
            except OSError as exc:
                log.warning("cannot record the content judged: %s; it is judged again at the next scan", exc)

    threading.Thread(target=run, name="atomictoolsd-content", daemon=True).start()
    return future
