"""The file watcher: reload a tool module when its file, or a helper it imports, changes.

A daemon component. It watches, with watchfiles, every tools directory in use (the global one and
each attached project's) and, for a tools directory that does not exist yet, the nearest existing
directory on the way to it (``.atomic/``, else the project root or the home directory), so a
``.atomic/tools/`` created later is picked up. Nothing is watched recursively: a tools directory
and its subdirectories (helper packages) are listed one by one, and a project root is watched
without its subtree, so a large repository costs one watch, never thousands.

When the set of directories to watch changes (a project attached or forgotten, a directory
created or removed), a new watcher starts before the old one retires, and the old one reports what
it saw before it goes (it ends after a quiet spell with nothing left to report). So only the tools
directories with a newly watched path are rescanned — what happened there before the new watch is
in no event — and attaching one more project costs one directory, never all of them. Tools
directories come into use through the registry's dir listener, which calls us before their first
scan: a file written after ``atomic/attach`` answered is always seen. A project the registry forgets
takes its tools directory out of the watch.

A change reloads only what it touches, through ``Registry.scan(only=…, force=True)``:

- a module file written, created or renamed into place → that module (editors' atomic saves are a
  rename, so they count as a write);
- a module file gone → its tools are withdrawn, after a short grace in which an editor that moves
  the old file away before writing the new one puts it back (only that file waits: the rest of its
  directory reloads meanwhile; so does a file emptied by an editor that truncates before writing);
- any other file of the tools directory (``_shared.py``, ``_lib/x.py``) → the modules that
  imported it, and the modules that failed to load (a missing helper is a common reason);
- ``__pycache__`` and files no module imported (editor swap and backup files) → nothing.

Changes that arrive while a directory is reloading are merged and applied once that reload ends,
so a burst of saves settles to the final content. watchfiles' debounce and step come from the
``watch_debounce_ms`` and ``watch_step_ms`` settings. watchfiles reports a change once it has seen
no new one for a whole step, two steps after inotify woke it (see ``inotify``): with the default
5 ms a save reaches a client as ``list_changed`` ~17 ms later (10 ms: ~28 ms; watchfiles' own
defaults, 1600/50: ~100 ms; bench/reload.py). A burst is cut after ``watch_debounce_ms`` (50).

Never imported by the worker runtime (watchfiles stays out of workers).
"""

from __future__ import annotations

import asyncio
import logging
import os
import select
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

# Private, and pinned for it in pyproject.toml: the public watchfiles.watch() creates its RustNotify
# inside a generator on the first next(), which blocks until a change, so nothing could tell when a
# directory is watched (a tools dir must be before its first scan) or that a path is missing.
from watchfiles._rust_notify import RustNotify

from atomictoolsd.config.discovery import HELPER_SUFFIXES, MODULE_KINDS, escape_path
from atomictoolsd.registry.cache import deps_fresh
from atomictoolsd.registry.inotify import Inotify
from atomictoolsd.registry.model import ToolsDir
from atomictoolsd.util.periodic import Scheduler

if TYPE_CHECKING:
    from atomictoolsd.config.settings import Config
    from atomictoolsd.registry.projects import Registry

__all__ = ["FileWatcher", "WatcherHost", "is_module_name"]


class WatcherHost(Protocol):
    """What the watcher is started with (the server meets it; see ``server/wiring.py``)."""

    registry: Registry
    config: Config

log = logging.getLogger("atomictoolsd.watcher")

_SWEEP_INTERVAL = 0.5  # seconds between polling sweeps
_DELETED = 3  # watchfiles.Change.deleted
_MAX_SUBDIRS = 256  # per tools directory: a symlinked tree behind a tools dir must not cost thousands of watches


def is_module_name(name: str) -> bool:
    """Whether a file name in a tools directory is a tool module (``discovery.list_module_files``'s rule)."""
    return not name.startswith(("_", ".")) and os.path.splitext(name)[1] in MODULE_KINDS


class _Pending:
    """Work waiting for one tools directory: paths to reload, or a full rescan, and the module files
    held back because they look half-saved (path → when first seen so)."""

    __slots__ = ("full", "held", "paths", "task", "wake")

    def __init__(self) -> None:
        self.paths: set[str] = set()
        self.full = False
        self.held: dict[str, float] = {}
        self.task: asyncio.Task[None] | None = None
        self.wake = asyncio.Event()  # set when new work arrives while the task waits out a held file


class _Watch:
    """One watchfiles watcher over a fixed set of directories, read on a thread of its own, and the
    inotify descriptor that wakes that thread (where there is one)."""

    def __init__(self, paths: frozenset[str], notify: RustNotify, inotify: Inotify | None, polling: bool) -> None:
        self.paths = paths
        self.notify = notify
        self.inotify = inotify
        self.polling = polling
        self.stopping = threading.Event()  # checked by watchfiles on every step
        self.retiring = threading.Event()  # replaced: report what is left, then end
        self.thread: threading.Thread | None = None
        self._wake_r, self._wake_w = os.pipe()
        self._lock = threading.Lock()
        self._closed = False

    def stop(self) -> None:
        """Ask the thread to end at once, dropping changes not yet reported (from any thread)."""
        with self._lock:
            self.stopping.set()
            self._wake()

    def retire(self) -> None:
        """Ask the thread to report the changes it has seen, then end (a newer watch has started)."""
        with self._lock:
            self.retiring.set()
            self._wake()

    def _wake(self) -> None:
        if not self._closed:
            os.write(self._wake_w, b"x")

    def wait_for_change(self) -> bool:
        """Sleep until a watched directory changes (True), or ``stop()`` or ``retire()`` (False)."""
        assert self.inotify is not None
        while True:
            try:
                readable, _, _ = select.select([self.inotify.fd, self._wake_r], [], [])
            except InterruptedError:
                continue
            if self.stopping.is_set() or self._wake_r in readable:
                return False
            self.inotify.drain()
            return True

    def close(self) -> None:
        with self._lock:
            self._closed = True
            os.close(self._wake_r)
            os.close(self._wake_w)
        self.notify.close()
        if self.inotify is not None:
            self.inotify.close()


class FileWatcher:
    """Component: keeps the registry in step with the tools files while the daemon runs.

    Args:
        debounce_ms: longest time watchfiles groups changes (default: the ``watch_debounce_ms`` setting).
        step_ms: quiet time after which watchfiles reports them (default: ``watch_step_ms``).
    """

    def __init__(self, scheduler: Scheduler, debounce_ms: int | None = None, step_ms: int | None = None) -> None:
        self.debounce_ms = debounce_ms
        self.step_ms = step_ms
        self.registry: Registry | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._watch: _Watch | None = None
        self._retiring: list[_Watch] = []  # replaced watches still reporting what they saw
        self._dir_paths: dict[ToolsDir, tuple[str, ...]] = {}  # what each tools dir needs watched
        self._stale: set[ToolsDir] = set()  # dirs whose paths to watch must be looked up again
        self._all_stale = False
        self._pending: dict[ToolsDir, _Pending] = {}
        self._rewatch_scheduled = False
        self._stopped = False
        self._force_polling = bool(os.environ.get("WATCHFILES_FORCE_POLLING"))
        self.restarts = 0
        self.reloads = 0
        self.rescans = 0  # full rescans of one tools directory
        self._sweeper = scheduler.every("the polling sweep", self._sweep, _SWEEP_INTERVAL, logger=log)

    # -- component --------------------------------------------------------------------------------

    async def start(self, server: WatcherHost) -> None:
        self.registry = server.registry
        if self.debounce_ms is None:
            self.debounce_ms = server.config.watch_debounce_ms
        if self.step_ms is None:
            self.step_ms = server.config.watch_step_ms
        self._loop = asyncio.get_running_loop()
        self.registry.add_dir_listener(self._dir_in_use)
        self._rewatch()

    async def stop(self) -> None:
        self._stopped = True
        await self._sweeper.stop()
        if self.registry is not None:
            self.registry.remove_dir_listener(self._dir_in_use)
        for pending in self._pending.values():
            if pending.task is not None:
                pending.task.cancel()
        watches, self._retiring = [*self._retiring, self._watch], []
        self._watch = None
        for watch in watches:
            if watch is not None:
                watch.stop()
                if watch.thread is not None:
                    await asyncio.get_running_loop().run_in_executor(None, watch.thread.join, 5.0)

    def reconfigure(self, config: Any) -> None:
        """SIGHUP: new debounce and step apply from the next batch of changes."""
        self.debounce_ms = config.watch_debounce_ms
        self.step_ms = config.watch_step_ms

    def info(self) -> dict[str, Any]:
        return {
            "watching": sorted(self._watch.paths) if self._watch is not None else [],
            "polling": self._force_polling,
            "inotify": self._watch is not None and self._watch.inotify is not None,
            "debounceMs": self.debounce_ms,
            "stepMs": self.step_ms,
            "restarts": self.restarts,
            "reloads": self.reloads,
            "rescans": self.rescans,
        }

    # -- what to watch ------------------------------------------------------------------------------

    def _dirs(self) -> list[ToolsDir]:
        """Tools directories in use (their first scan started), built-ins excepted: they never change."""
        assert self.registry is not None
        return [d for d in self.registry.dirs.values() if d.scope != "builtin" and d.scanned is not None]

    def _watch_set(self) -> dict[str, list[ToolsDir]]:
        """The directories to watch, each with the tools directories it is watched for.

        A tools dir's own paths are looked up again only when it is new or marked stale (an event
        showed a directory of it appear or go): with many projects in use, one more costs one.
        """
        dirs = self._dirs()
        in_use = set(dirs)
        for tools_dir in [d for d in self._dir_paths if d not in in_use]:
            del self._dir_paths[tools_dir]
        for tools_dir in dirs:
            # One with nothing to watch (its whole project root is gone) sends no events: look again.
            if self._all_stale or tools_dir in self._stale or not self._dir_paths.get(tools_dir):
                self._dir_paths[tools_dir] = _paths_to_watch(tools_dir)
        self._all_stale = False
        self._stale.clear()
        paths: dict[str, list[ToolsDir]] = {}
        for tools_dir, own in self._dir_paths.items():
            for path in own:
                paths.setdefault(path, []).append(tools_dir)
        return paths

    def _dir_in_use(self, tools_dir: ToolsDir, in_use: bool) -> None:
        # Coming into use, this runs inside ensure_scanned, before the first scan's task takes its
        # first step: the callback below is queued ahead of it, so the watch exists before the
        # directory is read. Going out of use (its project forgotten), its pending work goes too.
        if not in_use:
            pending = self._pending.pop(tools_dir, None)
            if pending is not None and pending.task is not None:
                pending.task.cancel()
        self._schedule_rewatch()

    def _schedule_rewatch(self) -> None:
        if self._rewatch_scheduled or self._stopped or self._loop is None:
            return
        self._rewatch_scheduled = True
        self._loop.call_soon(self._rewatch)

    def _rewatch(self) -> None:
        """Watch the current set of directories; when it changed, rescan the tools directories that
        have a newly watched path."""
        self._rewatch_scheduled = False
        if self._stopped:
            return
        for _attempt in range(5):
            owners = self._watch_set()
            paths = frozenset(owners)
            if self._watch is not None and self._watch.paths == paths and self._watch.thread is not None \
                    and self._watch.thread.is_alive():
                return
            try:
                notify = RustNotify(sorted(paths), False, self._force_polling, 300, False, True)
            except FileNotFoundError:
                self._all_stale = True
                continue  # a directory went away between listing and watching: list again
            except Exception as exc:  # inotify limits and the like: polling still works
                if self._force_polling:
                    log.error("cannot watch the tools directories: %s", exc)
                    return
                log.warning("cannot watch the tools directories with OS events (%s); polling instead", exc)
                self._force_polling = True
                continue
            try:
                inotify = None if self._force_polling else Inotify.create(paths)
            except FileNotFoundError:
                notify.close()
                self._all_stale = True
                continue
            except OSError as exc:  # watchfiles still works, just with its step loop always running
                log.warning("no inotify for the watcher (%s); watching with a %d ms step", exc, self.step_ms)
                inotify = None
            break
        else:
            log.error("cannot watch the tools directories: they keep changing")
            return
        old, self._watch = self._watch, _Watch(paths, notify, inotify, self._force_polling)
        self._watch.thread = threading.Thread(
            target=self._run, args=(self._watch,), name="atomictoolsd-watcher", daemon=True
        )
        self._watch.thread.start()
        if old is not None:
            # After the new one started: no moment without a watch. The old one reports what it
            # saw before it goes, so the directories both watch need no rescan. A poller cannot
            # tell when it has seen everything; the polling sweep rescans in its place.
            if old.polling:
                old.stop()
            else:
                old.retire()
                self._retiring = [w for w in self._retiring if w.thread is not None and w.thread.is_alive()]
                self._retiring.append(old)
        self.restarts += 1
        log.debug("watching %d directories", len(paths))
        if self._force_polling:
            self._sweeper.start()
        # What changed in a newly watched path before the new watch started is in no event: rescan
        # the tools dirs it is watched for, or, for a new subdirectory (a helper package written
        # before we watched it), reload the modules that use its files and those that failed (the
        # failure may be its absence).
        added = paths if old is None else paths - old.paths
        for path in added:
            for tools_dir in owners[path]:
                pending = self._pending_for(tools_dir)
                if not path.startswith(str(tools_dir.path) + os.sep):
                    pending.full = True
                else:
                    inside = path + os.sep
                    for module in tools_dir.modules.values():
                        if module.state == "failed" or any(dep[0].startswith(inside) for dep in module.deps):
                            pending.paths.add(module.path)
                self._kick(tools_dir)

    def _sweep(self) -> None:
        """Polling only: rescan every tools dir twice a second. watchfiles' poller compares mtimes
        in whole seconds, so a second save within the same second would go unseen; a rescan
        compares size and mtime in nanoseconds (and costs a directory listing when nothing changed)."""
        for tools_dir in self._dirs():
            if not _settled(tools_dir.path):
                continue  # being written: the next sweep reads it whole
            pending = self._pending_for(tools_dir)
            pending.full = True
            for module in tools_dir.modules.values():
                if not deps_fresh(module.deps):
                    pending.paths.add(module.path)  # a helper it imported changed
            self._kick(tools_dir)

    # -- events -----------------------------------------------------------------------------------

    def _run(self, watch: _Watch) -> None:
        """The watch thread: wait for changes and hand each batch to the event loop."""
        assert self.debounce_ms is not None and self.step_ms is not None
        # With inotify, watchfiles runs only from the first change until it reports (its timeout
        # covers a ring for changes it already reported); without one, it runs all the time, coming
        # back after each timeout to see whether it was retired.
        timeout_ms = max(100, 10 * self.step_ms)
        # Retired: a spell this long with no change shows that nothing it saw is left to report
        # (inotify hands an event to watchfiles' thread within microseconds). What it saw before
        # the new watch began is in its next batch; one more catches stragglers. Anything later the
        # new watch reports too, so a busy directory does not keep the old one going.
        quiet_ms = max(50, 4 * self.step_ms)
        final_batches = 2
        try:
            while not watch.stopping.is_set():
                retiring = watch.retiring.is_set()
                if not retiring and watch.inotify is not None and not watch.wait_for_change():
                    continue  # stopped or retired: the loop decides which
                changes = watch.notify.watch(
                    self.debounce_ms, self.step_ms, quiet_ms if retiring else timeout_ms, watch.stopping
                )
                if isinstance(changes, set) and changes and not watch.stopping.is_set():
                    if not self._deliver(self._on_changes, changes):
                        return
                elif retiring:
                    return
                if retiring:
                    final_batches -= 1
                    if not final_batches:
                        return
        except Exception as exc:  # the OS watcher failed: start over (polling, if events keep failing)
            if not watch.stopping.is_set():
                log.warning("the file watcher failed (%s); restarting it", exc)
                self._deliver(self._watch_failed, watch)
        finally:
            watch.close()

    def _deliver(self, callback: Any, argument: Any) -> bool:
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(callback, argument)
        except RuntimeError:
            return False  # the loop has closed: the daemon is stopping
        return True

    def _watch_failed(self, watch: _Watch) -> None:
        if self._watch is watch:
            self._watch = None
            self._all_stale = True
            self._schedule_rewatch()

    def _on_changes(self, changes: set[tuple[int, str]]) -> None:
        rewatch = False
        touched: set[ToolsDir] = set()
        dirs = self._dirs()
        for change, path in changes:
            for tools_dir in dirs:
                outcome = self._classify(tools_dir, change, path)
                if outcome == "rewatch":
                    rewatch = True
                    self._stale.add(tools_dir)
                elif outcome:
                    touched.add(tools_dir)
        for tools_dir in touched:
            self._kick(tools_dir)
        if rewatch:
            self._schedule_rewatch()

    def _classify(self, tools_dir: ToolsDir, change: int, path: str) -> str:
        """Record what ``path`` changing means for ``tools_dir``: ``"reload"``, ``"rewatch"`` or ``""``."""
        root = str(tools_dir.path)
        if path == root or root.startswith(path + os.sep):
            # The tools dir itself, or a directory on the way to it, appeared or went away.
            self._pending_for(tools_dir).full = True
            self._kick(tools_dir)
            return "rewatch"
        if not path.startswith(root + os.sep):
            return ""
        relative = path[len(root) + 1 :].split(os.sep)
        if "__pycache__" in relative:
            return ""
        pending = self._pending_for(tools_dir)
        if len(relative) == 1 and is_module_name(relative[0]):
            pending.paths.add(path)
            return "reload"
        outcome = ""
        if os.path.isdir(path) or (change == _DELETED and self._watch is not None and path in self._watch.paths):
            outcome = "rewatch"  # a helper package appeared or went away
        helper = path.endswith(HELPER_SUFFIXES)
        for module in tools_dir.modules.values():
            if module.depends_on(path) or (helper and module.state == "failed"):
                pending.paths.add(module.path)
                outcome = outcome or "reload"
        return outcome

    def _pending_for(self, tools_dir: ToolsDir) -> _Pending:
        pending = self._pending.get(tools_dir)
        if pending is None:
            pending = self._pending[tools_dir] = _Pending()
        return pending

    def _kick(self, tools_dir: ToolsDir) -> None:
        pending = self._pending_for(tools_dir)
        if pending.task is not None:
            pending.wake.set()  # it may be waiting out a half-saved file: this work need not wait
        elif not self._stopped and (pending.full or pending.paths):
            assert self._loop is not None
            pending.task = self._loop.create_task(self._drain(tools_dir, pending))

    async def _drain(self, tools_dir: ToolsDir, pending: _Pending) -> None:
        """Apply the pending work of one tools directory until none is left.

        A module file that looks half-saved is held back, alone, for up to ten looks (a second with
        the default debounce); the rest of the directory's work goes ahead meanwhile.
        """
        assert self.registry is not None and self.debounce_ms is not None
        try:
            if tools_dir.scanned is not None:
                await asyncio.shield(tools_dir.scanned)  # its first scan reads everything anyway
            while pending.full or pending.paths or pending.held:
                look = max(0.1, 2 * self.debounce_ms / 1000)
                full, paths = pending.full, pending.paths | set(pending.held)
                pending.full, pending.paths = False, set()
                held: set[str] = set()

                def hold(held: set[str] = held, full: bool = full, paths: set[str] = paths, look: float = look) -> set[str]:
                    # Asked by the scan once it has listed the directory: a file deleted while the
                    # scan waited for its lock is judged as missing, and held, not removed at once.
                    held.clear()
                    held.update(_hold_half_saved(tools_dir, pending, paths, full, grace=10 * look))
                    return held

                if full:
                    self.rescans += 1
                    await self.registry.scan(tools_dir, skip=hold)
                if paths - held:
                    await self.registry.scan(tools_dir, only=paths, force=True, skip=hold)
                    if paths - held:
                        self.reloads += 1
                if held and not (pending.full or pending.paths):
                    pending.wake.clear()
                    try:
                        await asyncio.wait_for(pending.wake.wait(), look)
                    except TimeoutError:
                        pass
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("reloading %s failed", tools_dir.path)
        finally:
            pending.task = None
        if pending.full or pending.paths:
            self._kick(tools_dir)


def _hold_half_saved(tools_dir: ToolsDir, pending: _Pending, paths: set[str], full: bool, grace: float) -> set[str]:
    """The module files to leave alone for now because they look half-saved: some editors move the
    old file away before writing the new one, others truncate it first, and reading one now would
    withdraw its tools. Each is held for ``grace`` seconds at most; then the file is what it is."""
    now = time.monotonic()
    held: set[str] = set()
    for path in paths | (set(tools_dir.modules) if full else set()):
        try:
            size = os.stat(path).st_size
        except OSError:
            # Missing: perhaps it is being replaced. A full rescan (a directory of it appeared or
            # the watch was renewed) can find it gone before the watcher reports the deletion.
            half_saved = path in paths or full
        else:
            module = tools_dir.modules.get(path)
            half_saved = size == 0 and module is not None and module.file.size > 0
        if half_saved and now - pending.held.setdefault(path, now) < grace:
            held.add(path)
        else:
            pending.held.pop(path, None)
    return held


def _settled(tools_dir: Path, quiet: float = 0.2) -> bool:
    """Whether no module file of ``tools_dir`` was written in the last ``quiet`` seconds."""
    recent = time.time() - quiet
    try:
        with os.scandir(tools_dir) as entries:
            return all(e.stat().st_mtime < recent for e in entries if is_module_name(e.name))
    except OSError:
        return True


def _watchable(path: Path) -> bool:
    """A directory we can list (a symlink loop, a file or an unreadable dir is not: watching one
    fails, and would take the OS watch away from every other directory)."""
    return path.is_dir() and os.access(path, os.R_OK | os.X_OK)


def _paths_to_watch(tools_dir: ToolsDir) -> tuple[str, ...]:
    """The tools dir and its subdirectories; or, while it cannot be listed (it does not exist, or is
    a loop or a file), the nearest directory between it and its project root (or the home directory)
    that can, never above, never recursively: a tools dir put right there is seen."""
    if _watchable(tools_dir.path):
        return (str(tools_dir.path), *_subdirs(tools_dir.path))
    stop = tools_dir.cwd
    candidate = tools_dir.path.parent
    while True:
        if _watchable(candidate):
            return (str(candidate),)
        if candidate == stop or candidate.parent == candidate or stop not in candidate.parents:
            return ()
        candidate = candidate.parent


def _subdirs(tools_dir: Path) -> list[str]:
    """The directories below a tools directory (helper packages), without caches and hidden ones, and
    without those whose name no import could name (not UTF-8, a control character: see
    ``discovery``), which watchfiles could not even be given. os.walk follows no symlink."""
    found: list[str] = []
    for top, dirnames, _files in os.walk(tools_dir):
        dirnames[:] = sorted(
            d for d in dirnames if d != "__pycache__" and not d.startswith(".") and escape_path(d) == d
        )
        for name in dirnames:
            found.append(os.path.join(top, name))
            if len(found) >= _MAX_SUBDIRS:
                return found
    return found
