"""The repository reader: what the git built-ins learn of a repository, read with libgit2 (through
pygit2), each reading in a short-lived process of its own.

Its server runs as ``python -P -m atomictoolsd.worker.builtins._gitread --serve FD``, started by the
worker (``_gitreader``) from ``/`` in an environment that holds nothing of the daemon's (this
program's own ``PYTHONPATH`` at most). It imports pygit2 once and reads no repository itself: for
each request it forks a child, which leads a session of its own, answers and exits. On the stream
socket ``FD``, the worker sends a request (4 bytes of length, then JSON) with the write end of a
pipe attached to its first byte; the server answers the child's pid (4 bytes), in order; the child
writes its JSON answer to the pipe. The worker kills the child's process group at the call's
deadline, so a FIFO, a device or an enormous index costs that child only. End of file on ``FD``
(the worker is gone) ends the server. Without ``--serve`` it answers the one request on stdin on
stdout (a person debugging, or a test).

Why libgit2: it runs no program at all. No hooks, no fsmonitor, no filter drivers (only its
built-in end-of-line and ident filters), no external diff or textconv, no pager, no credential
helper; and it has no lazy fetch: an object a partial clone lacks is an error, never a download.
This module adds nothing that could: it never fetches, never touches a remote, never writes (no
index refresh written back, no checkout), and libgit2 learns where to look from the request only:
its configuration search path is emptied, your own config files (``config``: the ones git would
read for you, which the caller found) are added by name, and ``~`` is your home.

Request: ``{"op": "status" | "diff" | "workspace", "root": PROJECT_ROOT, "path": SUBDIRECTORY,
"staged": BOOL, "config": {"home": HOME, "xdg": XDG_GIT_DIR, "files": [[PATH, LEVEL], …]}}``.
Answer: ``{"text": …}`` (status, diff), ``{"git_root", "branch", "remote"}`` (workspace), or
``{"error": MESSAGE, "kind": "refused" | "none" | "git"}``. An error is our own words; libgit2's
message is added only as one bounded line, every absolute path outside the repository in it
replaced (``_redacted``): nothing this process read outside the repository reaches the answer.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import sys
from pathlib import Path
from typing import Any

import pygit2
from pygit2 import C, Diff, ffi
from pygit2.enums import ConfigLevel, DeltaStatus, DiffFind, DiffOption, Option, RepositoryOpenFlag
from pygit2.errors import check_error
from pygit2.utils import StrArray

from atomictoolsd.config.discovery import Repository, locate_repository, within
from atomictoolsd.worker.builtins._gitcheck import NotARepository, Refused, check_opened, vet
from atomictoolsd.worker.builtins._gitformat import StatFile, StatusEntry, porcelain, stat

__all__ = ["main"]

MAX_REQUEST = 1024 * 1024
MAX_MESSAGE = 300
# Repository format extensions libgit2 may open besides its own: a partial clone is read as it is
# (an object it lacks is an error; nothing is fetched).
EXTENSIONS = ["partialclone"]
_LEVELS = {"system": ConfigLevel.SYSTEM, "global": ConfigLevel.GLOBAL}
_SEARCHED = (ConfigLevel.PROGRAMDATA, ConfigLevel.SYSTEM, ConfigLevel.XDG, ConfigLevel.GLOBAL)
_CHANGE = {
    DeltaStatus.ADDED: "A", DeltaStatus.DELETED: "D", DeltaStatus.MODIFIED: "M", DeltaStatus.RENAMED: "R",
    DeltaStatus.COPIED: "C", DeltaStatus.TYPECHANGE: "T",
}
# (ancestor, ours, theirs) present → git's two letters for an unmerged path.
_UNMERGED = {
    (True, False, False): "DD", (False, True, False): "AU", (True, True, False): "UD", (False, False, True): "UA",
    (True, False, True): "DU", (False, True, True): "AA", (True, True, True): "UU",
}
_ABSOLUTE = re.compile(r"(?<![\w.~-])/[^\s'\"`()\[\]<>,;]*")  # a slash that starts a word
_STAGE_MASK = 0x3000  # an index entry's merge stage: only stage 0 is the work tree's
_FLAGS = DiffOption.INCLUDE_TYPECHANGE | DiffOption.IGNORE_SUBMODULES | DiffOption.DISABLE_PATHSPEC_MATCH


class _Reading:
    """One request's repository: checked, opened, and the settings git would read of it."""

    def __init__(self, request: dict[str, Any]) -> None:
        config = request["config"]
        self.root = Path(request["root"])
        self.home = Path(config["home"])
        user_files = [(path, _LEVELS[level]) for path, level in config["files"]]
        if config.get("xdg"):
            user_files.append((os.path.join(config["xdg"], "config"), ConfigLevel.XDG))
        _settle(self.home, config.get("xdg") or "")
        self.located, includes = vet(self.root, user_files, self.home)
        self.user_files = user_files
        self.repo = _open(self.located, user_files)
        entries = [(e.name, e.value, int(e.level)) for e in self.repo.config]
        check_opened(entries, self.located, includes, self.home)
        self.settings = {name.lower(): value for name, value, _ in sorted(entries, key=lambda e: e[2])}
        where = (self.root / request.get("path", ".")).resolve()
        if not within(where, self.root.resolve()):
            raise Refused(f"Refused: {request['path']!r} is outside the project root {self.root}")
        prefix = os.path.relpath(where, self.located.worktree)
        self.prefix = "" if prefix == "." else prefix
        self.listable = not self.prefix or _listable(self.located.worktree)

    def setting(self, name: str, default: str) -> str:
        value = self.settings.get(name)
        return default if value is None else value

    @property
    def quote_fully(self) -> bool:
        return self.setting("core.quotepath", "true").lower() not in ("false", "no", "off", "0")


def _listable(directory: Path) -> bool:
    try:
        with os.scandir(directory):
            return True
    except PermissionError:
        return False


def _settle(home: Path, xdg: str) -> None:
    """libgit2's process-wide settings: it finds no configuration by itself (the XDG directory,
    for its default ignore, attributes and config files, aside), ``~`` is your home, partial
    clones open, and ownership is ours to check (``vet``, which knows your ``safe.directory``)."""
    for level in _SEARCHED:
        pygit2.settings.search_path[level] = xdg if level == ConfigLevel.XDG else ""
    pygit2.option(Option.SET_HOMEDIR, str(home))
    pygit2.option(Option.SET_EXTENSIONS, EXTENSIONS, len(EXTENSIONS))
    pygit2.option(Option.SET_OWNER_VALIDATION, 0)


def _open(located: Repository, user_files: list[tuple[str, ConfigLevel]], workdir: Path | None = None) -> pygit2.Repository:
    """The repository at its checked git dir, its work tree pinned to the checked one (its
    ``core.worktree`` and ``core.bare`` have no say), your own config files added."""
    repo = pygit2.Repository(str(located.git_dir), RepositoryOpenFlag.NO_SEARCH | RepositoryOpenFlag.BARE)
    repo.workdir = str(workdir or located.worktree)
    config = repo.config
    for path, level in user_files:
        if level != ConfigLevel.XDG and os.path.isfile(path):  # the XDG one comes through the search path
            check_error(C.git_config_add_file_ondisk(config._c_config, os.fsencode(path), level, repo._repo, 0))
    os.chdir(located.worktree)  # a relative core.excludesFile is relative to the work tree, as in git
    return repo


def _diff(repo: pygit2.Repository, index: pygit2.Index, prefix: str, *, staged: bool, untracked: bool = False,
          recurse: bool = False) -> Diff:
    """HEAD against the index (``staged``) or the index against the work tree, under ``prefix``."""
    options = ffi.new("git_diff_options *")
    check_error(C.git_diff_options_init(options, 1))
    flags = _FLAGS
    if untracked:
        flags |= DiffOption.INCLUDE_UNTRACKED
    if recurse:
        flags |= DiffOption.RECURSE_UNTRACKED_DIRS
    options.flags = int(flags)
    options.ignore_submodules = C.GIT_SUBMODULE_IGNORE_ALL
    out = ffi.new("git_diff **")
    with StrArray([prefix] if prefix else []) as pathspec:
        pathspec.assign_to(options.pathspec)
        if staged:
            head = None if repo.head_is_unborn else repo.head.peel(pygit2.Tree)  # alive until the diff is made
            tree = ffi.NULL
            if head is not None:
                pointer = ffi.new("git_tree **")
                ffi.buffer(pointer)[:] = head._pointer[:]
                tree = pointer[0]
            check_error(C.git_diff_tree_to_index(out, repo._repo, tree, index._index, options))
        else:
            check_error(C.git_diff_index_to_workdir(out, repo._repo, index._index, options))
    diff = Diff.from_c(bytes(ffi.buffer(out)[:]), repo)
    if staged:
        diff.find_similar(DiffFind.FIND_RENAMES)
    return diff


def _staged(reading: _Reading) -> Diff:
    return _diff(reading.repo, reading.repo.index, reading.prefix, staged=True)


def _unstaged(reading: _Reading, *, untracked: bool = False, recurse: bool = False) -> tuple[Diff, bytes]:
    """The index against the work tree under the project, and what to put before its paths.

    libgit2 lists every directory from the work tree's top down to the project; git does not, and
    the built-ins confined to a project inside a larger repository may not. There the work tree
    side is read on a view of the project alone (``_view``), its paths then put back in place, its
    untracked ones judged by the whole repository's ignore rules."""
    if reading.listable:
        return _diff(reading.repo, reading.repo.index, reading.prefix, staged=False, untracked=untracked,
                     recurse=recurse), b""
    view, index, kept = _view(reading)
    diff = _diff(view, index, "", staged=False, untracked=untracked, recurse=recurse)
    del kept  # the copied entries' paths: libgit2 copied them into the index
    return diff, os.fsencode(reading.prefix) + b"/"


def _view(reading: _Reading) -> tuple[pygit2.Repository, pygit2.Index, list[Any]]:
    """The repository with its work tree at the project's directory, and an index of the entries
    under it (their stat data kept, their paths made relative to it)."""
    view = _open(reading.located, reading.user_files, workdir=reading.located.worktree / reading.prefix)
    index = pygit2.Index()
    strip = os.fsencode(reading.prefix) + b"/"
    kept = []
    real = reading.repo.index._index
    for i in range(C.git_index_entrycount(real)):
        entry = C.git_index_get_byindex(real, i)
        path = ffi.string(entry.path)
        if not path.startswith(strip) or entry.flags & _STAGE_MASK:
            continue
        copy = ffi.new("git_index_entry *", entry[0])
        name = ffi.new("char[]", path[len(strip):])
        kept += [copy, name]
        copy.path = name
        check_error(C.git_index_add(index._index, copy))
    return view, index, kept


def _under(reading: _Reading, path: bytes) -> bool:
    prefix = os.fsencode(reading.prefix)
    return not prefix or path == prefix or path.startswith(prefix + b"/")


def status(reading: _Reading) -> str:
    """``git status --porcelain`` of the project (``reading.prefix``)."""
    unmerged = _unmerged(reading)
    changes: dict[bytes, StatusEntry] = {}
    for delta in _staged(reading).deltas:
        path = delta.new_file.raw_path
        if path not in unmerged and delta.status in _CHANGE:
            origin = delta.old_file.raw_path if delta.status == DeltaStatus.RENAMED else None
            changes[path] = StatusEntry(_CHANGE[delta.status], " ", path, origin)
    mode = reading.setting("status.showuntrackedfiles", "normal").lower()
    show_untracked = mode not in ("no", "false", "off", "0")
    untracked = []
    diff, before = _unstaged(reading, untracked=show_untracked, recurse=mode == "all")
    for delta in diff.deltas:
        path = before + delta.new_file.raw_path
        if delta.status == DeltaStatus.UNTRACKED:
            if not before or not reading.repo.path_is_ignored(os.fsdecode(path)):
                untracked.append(path)
        elif path not in unmerged and delta.status in _CHANGE:
            changes[path] = changes.get(path, StatusEntry(" ", " ", path))._replace(y=_CHANGE[delta.status])
    if show_untracked and not untracked and not changes and reading.prefix and _wholly_untracked(reading):
        untracked = [os.fsencode(reading.prefix) + b"/"]  # as git: the project's own dir, untracked
    return porcelain([*changes.values(), *unmerged.values()], untracked, fully=reading.quote_fully)


def _unmerged(reading: _Reading) -> dict[bytes, StatusEntry]:
    conflicts = reading.repo.index.conflicts
    found = {}
    for sides in conflicts or ():
        path = os.fsencode(next(side for side in sides if side is not None).path)
        if _under(reading, path):
            xy = _UNMERGED[tuple(side is not None for side in sides)]
            found[path] = StatusEntry(xy[0], xy[1], path)
    return found


def _wholly_untracked(reading: _Reading) -> bool:
    """Whether the project lies in an untracked directory that holds a file not ignored (git then
    names the project's directory; libgit2 stops at the untracked directory above it)."""
    prefix = os.fsencode(reading.prefix) + b"/"
    if any(os.fsencode(entry.path).startswith(prefix) for entry in reading.repo.index):
        return False
    diff, before = _unstaged(reading, untracked=True, recurse=True)
    return any(
        delta.status == DeltaStatus.UNTRACKED
        and not (before and reading.repo.path_is_ignored(os.fsdecode(before + delta.new_file.raw_path)))
        for delta in diff.deltas
    )


def diff_stat(reading: _Reading, staged: bool) -> str:
    """``git diff --stat`` of the project: the index against the work tree, or HEAD against the index."""
    diff, before = (_staged(reading), b"") if staged else _unstaged(reading)
    files = []
    for patch in diff:
        delta = patch.delta
        old, new = before + delta.old_file.raw_path, before + delta.new_file.raw_path
        if delta.status == DeltaStatus.CONFLICTED:
            files.append(StatFile(old, new, 0, 0, unmerged=True))
        elif delta.is_binary:
            files.append(StatFile(old, new, delta.new_file.size, delta.old_file.size, binary=True))
        else:
            _, added, deleted = patch.line_stats
            files.append(StatFile(old, new, added, deleted))
    files.sort(key=lambda f: f.old)
    return stat(files, fully=reading.quote_fully)


def workspace(reading: _Reading) -> dict[str, Any]:
    """The work tree's root, the branch (or the commit HEAD is detached at), the remote's URL."""
    repo = reading.repo
    branch = None
    head = repo.lookup_reference("HEAD")
    if head.type == pygit2.enums.ReferenceType.SYMBOLIC:
        target = str(head.target)
        branch = target.removeprefix("refs/heads/") if target.startswith("refs/heads/") else target.removeprefix("refs/")
    elif not repo.head_is_unborn:
        branch = f"(detached at {repo[repo.head.target].short_id})"
    names = list(repo.remotes.names())
    remote = None
    if names:
        remote = repo.remotes["origin" if "origin" in names else names[0]].url
    return {"git_root": str(reading.located.worktree), "branch": branch, "remote": remote}


def answer(request: dict[str, Any]) -> dict[str, Any]:
    reading = _Reading(request)
    if request["op"] == "status":
        return {"text": status(reading)}
    if request["op"] == "diff":
        return {"text": diff_stat(reading, bool(request.get("staged")))}
    if request["op"] == "workspace":
        return workspace(reading)
    raise Refused(f"unknown request {request['op']!r}")


def _redacted(message: str, areas: list[Path]) -> str:
    """One line of at most ``MAX_MESSAGE`` characters, each absolute path outside ``areas`` (the
    repository, the project) replaced, control characters escaped."""
    def keep(match: re.Match[str]) -> str:
        path = Path(os.path.normpath(match.group(0).rstrip(".:")))
        return match.group(0) if any(within(path, area) for area in areas) else "<a path outside the repository>"

    line = _ABSOLUTE.sub(keep, " ".join(message.split()))
    line = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in line)
    return line if len(line) <= MAX_MESSAGE else line[: MAX_MESSAGE - 1] + "…"


def _failure(exc: BaseException, request: dict[str, Any]) -> dict[str, Any]:
    if isinstance(exc, NotARepository):
        return {"error": str(exc), "kind": "none"}
    if isinstance(exc, Refused):
        return {"error": str(exc), "kind": "refused"}
    areas = [Path(str(request.get("root", "/nonexistent")))]
    try:
        located = locate_repository(areas[0])
        if located is not None:
            areas += [located.worktree, located.git_dir, located.common_dir]
    except Exception:  # noqa: BLE001 - the message is redacted against what can be known
        pass
    said = _redacted(str(exc), areas) if isinstance(exc, (pygit2.GitError, KeyError, ValueError, OSError)) else ""
    missing = "object not found" in said
    hint = (
        "; the repository lacks an object it needs (a partial clone?): the built-ins never fetch, "
        "so run git yourself to see it" if missing else ""
    )
    detail = f": {said}" if said else f" ({type(exc).__name__})"
    return {"error": f"libgit2 could not read the repository{detail}{hint}", "kind": "git"}


def _reply(request: bytes) -> bytes:
    parsed: dict[str, Any] = {}
    try:
        parsed = json.loads(request)
        reply = answer(parsed)
    except Exception as exc:  # noqa: BLE001 - every failure is an answer, in our words
        reply = _failure(exc, parsed)
    return json.dumps(reply).encode()


def _child(request: bytes, out: int) -> None:
    """In a forked child: a session of its own (the deadline kills its group), the answer, exit."""
    try:
        os.setsid()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        reply = memoryview(_reply(request))
        while reply:
            reply = reply[os.write(out, reply):]
    finally:
        os._exit(0)


def serve(control: socket.socket) -> None:
    """Fork a child for each request on ``control`` until it closes (see the module)."""
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the children reap themselves
    pending = b""
    outs: list[int] = []
    while True:
        data, fds, _, _ = socket.recv_fds(control, 1 << 16, 8)
        if not data:
            return
        pending += data
        outs += fds
        while len(pending) >= 4 and len(pending) >= 4 + (size := int.from_bytes(pending[:4], "big")):
            request, pending = pending[4:4 + size], pending[4 + size:]
            out = outs.pop(0)
            pid = os.fork()
            if pid == 0:
                control.close()
                _child(request, out)
            os.close(out)
            control.sendall(pid.to_bytes(4, "big"))


def main() -> None:
    if sys.argv[1:2] == ["--serve"]:
        serve(socket.socket(fileno=int(sys.argv[2])))
        return
    sys.stdout.buffer.write(_reply(sys.stdin.buffer.read(MAX_REQUEST)))
    sys.stdout.buffer.flush()


if __name__ == "__main__":
    main()
