"""Trust that follows the content: which bytes of a fully trusted project's tools you trusted, and
which arrived since through git without you looking at them.

Trusting a project (``atomictoolsd trust``) records the SHA-256 of every code file of its tools dir
(``code_files``: tool modules, and the helpers and packages they import). From then on each file's
content is judged (``judge``) whenever the daemon scans the dir or starts a worker of it:

- content you trusted (recorded) is **seen**: it runs as the project's trust says;
- content not seen that came through git (``gitorigin``: a checkout, a pull, a merge wrote it) is
  **held** until you review it (``atomictoolsd trust --review``); a held file stays held when you
  edit it afterwards, until you approve it or it is back to content you trusted;
- any other content is your own edit (or a file git does not track): it is recorded as seen at once.

The record lives in ``trusted-content.json`` in the state dir, beside the trust store, bound to the
trust entry it belongs to (its ``trusted_at``): an entry trusted again, at another level or for
another directory, starts a new record. A trust entry without a record (written by an earlier
version, or a record lost) records the content there when it is first judged: what was trusted.
The last content approved for each path is kept in ``trusted-content/`` (up to ``COPY_LIMIT``
bytes a file), so ``trust --review`` can show what changed.

Standard library only: the CLI uses it, and the daemon runs ``judge`` in a thread.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shlex
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from atomictoolsd.config.statefile import StateWriteError, explain_write_error, sweep, write_atomic
from atomictoolsd.util.files import read_regular

__all__ = [
    "CONTENT_FILE",
    "COPIES_DIR",
    "ContentStore",
    "Hold",
    "Held",
    "Verdict",
    "code_files",
    "digest",
    "held_entry",
    "judge",
    "read_code",
    "review_command",
]

log = logging.getLogger("atomictoolsd.trust")

CONTENT_FILE = "trusted-content.json"
COPIES_DIR = "trusted-content"
MAX_CODE_BYTES = 8 * 1024 * 1024  # a code file larger than this cannot be judged: it is held
COPY_LIMIT = 1024 * 1024  # the largest approved file whose copy is kept for the next review's diff
MAX_FILES = 2000  # code files of one tools dir judged; past that the rest are held
SEEN_PER_PATH = 32  # contents trusted per path: switching back to a branch you had trusted holds nothing
_SKIPPED_DIRS = {"__pycache__", "node_modules"}
_EXTENSION_SUFFIXES = (".so", ".pyd")


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# What a JavaScript worker loads from its tools dir (its hooks refuse other bytes of these,
# ``worker/js/content.mjs``); a ``node_modules`` dir is packages, not the project's tools.
_JAVASCRIPT = (".ts", ".mts", ".cts", ".tsx", ".js", ".mjs", ".cjs", ".jsx")


def _is_code(rel: str) -> bool:
    """Whether a worker may load ``rel`` (a path inside a tools dir) as code: a Python or JavaScript
    source or an extension anywhere (modules, helpers, packages), a declarative ``.json`` module at
    the top."""
    name = rel.rsplit("/", 1)[-1]
    if name.startswith("."):
        return False  # editor and temporary files: no import finds them
    if rel.endswith((".py", *_JAVASCRIPT)) or rel.endswith(_EXTENSION_SUFFIXES) or ".cpython-" in name:
        return True
    return "/" not in rel and rel.endswith(".json")


def code_files(tools_dir: Path) -> dict[str, str]:
    """The code files of ``tools_dir`` (``_is_code``), by path relative to it, with their absolute
    paths; at most ``MAX_FILES``, sorted. Symlinked directories are not followed; a symlinked file
    counts as the file it names, since that is what a worker loads."""
    found: dict[str, str] = {}
    pending = [(str(tools_dir), "")]
    while pending and len(found) < MAX_FILES:
        directory, rel_dir = pending.pop()
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            rel = f"{rel_dir}{entry.name}"
            try:
                if entry.is_dir(follow_symlinks=False):
                    if entry.name not in _SKIPPED_DIRS and not entry.name.startswith("."):
                        pending.append((entry.path, rel + "/"))
                    continue
            except OSError:
                continue
            if _is_code(rel) and len(found) < MAX_FILES:
                found[rel] = entry.path
    return dict(sorted(found.items()))


def read_code(path: str) -> tuple[bytes, os.stat_result] | None:
    """The bytes of a code file and its stat, or None when it is not a regular file, larger than
    ``MAX_CODE_BYTES``, or unreadable (opened non-blocking: a FIFO never hangs the reader)."""
    try:
        return read_regular(path, MAX_CODE_BYTES)
    except OSError:
        return None


@dataclass
class Held:
    """A code file whose content nobody trusted: ``why`` is ``git`` (it came through git) or
    ``unknown`` (its origin could not be read: the repository, the file)."""

    path: str
    rel: str
    digest: str
    why: str

    def entry(self) -> dict[str, Any]:
        return {"file": self.path, "why": self.why}


@dataclass
class Verdict:
    """What ``judge`` found in one tools dir: the held files by absolute path, and the content a
    worker with the project's full rights may load (absolute path → SHA-256), everything else."""

    held: dict[str, Held] = field(default_factory=dict)
    allowed: dict[str, str] = field(default_factory=dict)
    recorded: list[str] = field(default_factory=list)  # files just recorded as your own edits
    first: bool = False  # no record was there: everything was recorded as trusted
    stuck: str | None = None  # why nothing could be judged (every module is then held)
    # With ``judge(later=True)``: the record's update, for the caller to make once it has acted on
    # the verdict (a reload need not wait for a file's rename).
    persist: Callable[[], None] | None = None


class ContentStore:
    """``<state dir>/trusted-content.json``: per trusted project root, the content trusted for each
    code file of its tools dir, and the files held; the last approved copies beside it."""

    def __init__(self, state_dir: Path) -> None:
        self.path = Path(state_dir) / CONTENT_FILE
        self.copies = Path(state_dir) / COPIES_DIR
        self._key: tuple[int, int, int] | None = None
        self._data: dict[str, dict[str, Any]] = {}
        sweep(self.path)

    def _read(self) -> dict[str, dict[str, Any]]:
        try:
            info = os.stat(self.path)
        except FileNotFoundError:
            self._key, self._data = None, {}
            return self._data
        key = (info.st_ino, info.st_size, info.st_mtime_ns)
        if key == self._key:
            return self._data
        data: dict[str, dict[str, Any]] = {}
        if info.st_uid == os.geteuid() and not info.st_mode & 0o022:  # else ignored: it can only hold more
            try:
                loaded = json.loads(self.path.read_text(encoding="utf-8"))
                projects = loaded["projects"]
                if isinstance(projects, dict):
                    data = {root: entry for root, entry in projects.items() if _valid(entry)}
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.warning("ignoring %s (%s): trusted projects record their content again", self.path, exc)
        self._key, self._data = key, data
        return data

    def record(self, root: Path | str, trusted_at: str) -> dict[str, Any] | None:
        """The record of the project at ``root`` for its trust entry of ``trusted_at`` (None: none)."""
        entry = self._read().get(str(root))
        if entry is None or entry.get("trusted_at") != trusted_at:
            return None
        return entry

    def copy(self, sha: str) -> bytes | None:
        """The approved content of digest ``sha``, when a copy was kept."""
        try:
            return (self.copies / sha).read_bytes()
        except OSError:
            return None

    def update(
        self, root: Path | str, trusted_at: str, *, seen: dict[str, bytes] | None = None,
        held: dict[str, str] | None = None, unheld: Iterable[str] = (), fresh: bool = False,
        sync: bool = True,
    ) -> None:
        """Record for ``root``: the contents in ``seen`` (relative path → bytes) as trusted, the
        files in ``held`` (relative path → digest) as held, the ones in ``unheld`` as no longer
        held. ``fresh`` starts a new record (a new trust entry).

        Raises:
            StateWriteError: the record cannot be written (nothing was changed).
        """
        seen = seen or {}

        def change(projects: dict[str, dict[str, Any]]) -> None:
            entry = projects.get(str(root))
            if fresh or entry is None or entry.get("trusted_at") != trusted_at:
                entry = {"trusted_at": trusted_at, "seen": {}, "held": {}}
            for rel, data in seen.items():
                sha = digest(data)
                history = [d for d in entry["seen"].get(rel, []) if d != sha]
                entry["seen"][rel] = [*history, sha][-SEEN_PER_PATH:]
                entry["held"].pop(rel, None)
            entry["held"].update(held or {})
            for rel in unheld:
                entry["held"].pop(rel, None)
            entry["recorded_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
            projects[str(root)] = entry

        self._write(change, sync)
        self._keep_copies(seen)

    def forget(self, root: Path | str) -> None:
        """Drop the record of ``root`` (it is no longer trusted)."""
        if str(root) in self._read():
            self._write(lambda projects: projects.pop(str(root), None), sync=True)

    def _write(self, change: Callable[[dict[str, dict[str, Any]]], Any], sync: bool) -> None:
        from atomictoolsd.config.paths import make_private_dirs  # lazy: platformdirs (start-up cost)

        try:
            make_private_dirs(self.path.parent)
            lock = os.open(self.path.with_name(CONTENT_FILE + ".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise StateWriteError(exc.errno, explain_write_error(self.path, exc)) from None
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)  # the daemon and a CLI at once lose nothing of each other's
            self._key = None
            projects = {root: json.loads(json.dumps(entry)) for root, entry in self._read().items()}
            change(projects)
            data = json.dumps({"version": 1, "projects": dict(sorted(projects.items()))}, indent=1) + "\n"
            write_atomic(self.path, data.encode("utf-8"), 0o600, fsync=sync)
            self._key = None
            self._prune(projects)
        finally:
            os.close(lock)

    def _keep_copies(self, seen: dict[str, bytes]) -> None:
        for data in seen.values():
            if len(data) > COPY_LIMIT:
                continue
            target = self.copies / digest(data)
            if target.exists():
                continue
            try:
                self.copies.mkdir(mode=0o700, exist_ok=True)
                write_atomic(target, data, 0o600, fsync=False)
            except OSError as exc:  # a diff the next review cannot show; nothing else depends on it
                log.warning("cannot keep a copy of approved tool content: %s", exc)

    def _prune(self, projects: dict[str, dict[str, Any]]) -> None:
        """Remove copies no record names as the last approved content of a path."""
        latest = {history[-1] for entry in projects.values() for history in entry["seen"].values() if history}
        try:
            names = os.listdir(self.copies)
        except OSError:
            return
        for name in names:
            if len(name) == 64 and name not in latest:
                try:
                    os.unlink(self.copies / name)
                except OSError:
                    pass


def review_command(root: Path | str) -> str:
    """The command that shows what arrived through git in the project at ``root`` and approves it."""
    from atomictoolsd.config.command import command_name  # lazy: for a message only (start-up cost)

    return f"{command_name()} trust --review {shlex.quote(str(root))}"


class Hold:
    """Why a module is held: the held files it loads (itself, or helpers it imported)."""

    __slots__ = ("files", "why")

    def __init__(self, files: list[str], why: str) -> None:
        self.files = files
        self.why = why

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Hold) and (self.files, self.why) == (other.files, other.why)

    def __hash__(self) -> int:
        return hash((tuple(self.files), self.why))


def held_entry(path: str, hold: Hold, root: Path, confined: bool, reason: str | None) -> dict[str, Any]:
    """What ``atomic/list`` (``held``), ``list``, an agent's error and ``status`` say of a held module."""
    came = ("its content arrived through git (a pull, a checkout, a merge) and you have not reviewed it"
            if hold.why == "git" else "where its content came from cannot be told (its repository cannot be read)")
    if path not in hold.files:
        came = f"it imports {', '.join(hold.files)}: " + came.replace("its content", "their content")
    command = review_command(root)
    if confined:
        message = f"{came}; it runs confined until you review it: {command}"
    else:
        message = f"{came}; this machine cannot confine it ({reason}), so it does not run until you review it: {command}"
    return {"file": path, "root": str(root), "confined": confined, "files": hold.files, "why": hold.why,
            "command": command, "message": message}


def _valid(entry: Any) -> bool:
    return (
        isinstance(entry, dict) and isinstance(entry.get("trusted_at"), str)
        and isinstance(entry.get("seen"), dict) and isinstance(entry.get("held"), dict)
        and all(isinstance(v, list) for v in entry["seen"].values())
    )


Origins = Callable[[dict[str, tuple[bytes, os.stat_result]]], dict[str, str]]


def judge(
    root: Path, tools_dir: Path, store: ContentStore, trusted_at: str, origins: Origins, sync: bool = True,
    write: bool = True, later: bool = False,
) -> Verdict:
    """Judge the content of every code file of ``tools_dir`` (of the project at ``root``, fully
    trusted since ``trusted_at``) against ``store``, recording your own edits as trusted and new
    holds as held (unless ``write`` is False: ``doctor`` only looks; ``later``: in ``Verdict.persist``). ``origins`` says where unseen
    content came from (``gitorigin.Repo.origins``).

    Blocking (reads files, the repository; writes the record): run it in a thread.
    """
    files = code_files(tools_dir)
    contents = {rel: read_code(path) for rel, path in files.items()}
    record = store.record(root, trusted_at)
    verdict = Verdict()

    def update(**changes: Any) -> None:
        if write:
            verdict.persist = partial(store.update, root, trusted_at, sync=sync, **changes)
            if not later:
                verdict.persist()
                verdict.persist = None

    if record is None:
        # Trusted before content was followed (or the record is lost): what is there is what was trusted.
        readable = {rel: got[0] for rel, got in contents.items() if got is not None}
        update(seen=readable, fresh=True)
        verdict.first = True
        verdict.allowed = {files[rel]: digest(data) for rel, data in readable.items()}
        return verdict
    unseen: dict[str, tuple[bytes, os.stat_result]] = {}
    unheld = [rel for rel in record["held"] if rel not in files]
    for rel, path in files.items():
        got = contents[rel]
        if got is None:
            verdict.held[path] = Held(path, rel, "", "unknown")
            continue
        sha = digest(got[0])
        if sha in record["seen"].get(rel, ()):
            verdict.allowed[path] = sha
            if rel in record["held"]:
                unheld.append(rel)  # back to content you trusted
        elif rel in record["held"]:
            verdict.held[path] = Held(path, rel, sha, "git")
        else:
            unseen[path] = got
    own: dict[str, bytes] = {}
    holds: dict[str, str] = {}
    for path, origin in (origins(unseen) if unseen else {}).items():
        rel = os.path.relpath(path, tools_dir).replace(os.sep, "/")
        data = unseen[path][0]
        if origin == "own":
            own[rel] = data
            verdict.allowed[path] = digest(data)
            continue
        verdict.held[path] = Held(path, rel, digest(data), origin)
        if origin == "git":  # held until reviewed, edited or not; an unreadable repository is asked again
            holds[rel] = digest(data)
    verdict.recorded = sorted(own)
    if own or holds or unheld:
        update(seen=own, held=holds, unheld=unheld)
    return verdict
