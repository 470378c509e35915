"""Where tool modules are: project roots, tools directories, and the module files in them.

Pure filesystem logic with no daemon state, so it is cheap to test and to reuse (the CLI and the
bridges use it too).

A tools directory is written by whoever wrote the repository, so anything may be in it: names that
are not UTF-8 or hold control characters, directories and FIFOs named like modules, dangling links,
symlink loops, or no directory at all. Listing one never raises: what cannot be a module is skipped
and described (``Skipped``, its name escaped by ``escape_path``) so that it can be reported, and
no name that could not be encoded as JSON, or printed on one line, leaves this module as a module.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

__all__ = [
    "GIT_INCLUDE_KEYS",
    "GIT_PATH_KEYS",
    "HELPER_SUFFIXES",
    "KEPT_GIT_VARS",
    "MAX_MODULES",
    "MODULE_KINDS",
    "ModuleFile",
    "Repository",
    "RepositoryRefused",
    "Skipped",
    "escape_path",
    "escape_strings",
    "git_config_path",
    "git_dirs_around",
    "gitfile_target",
    "git_worktree_root",
    "global_tools_dir",
    "list_module_files",
    "local_tools_dir",
    "opencode_global_dirs",
    "opencode_tools_dirs",
    "locate_repository",
    "may_hold_modules",
    "project_root",
    "regular_file",
    "scan_tools_dir",
    "within",
]

# File suffix → module kind (the worker loader that serves it). A TypeScript or JavaScript module
# (Atomic's, OpenCode's, the Copilot SDK's tool files) runs on Bun or Node (worker/jsexec.py).
MODULE_KINDS = {
    ".py": "python", ".json": "declarative", ".ts": "javascript", ".mts": "javascript", ".js": "javascript",
    ".mjs": "javascript",
}
# Entries named like modules that one tools dir may hold: each costs the daemon a stat, a load (or
# a listing as blocked) and a line of every listing, on its event loop; past it, the rest are
# skipped, reported once.
MAX_MODULES = 1000
# What a module of each kind may import from its tools dir (``_util.py``, ``_util.ts``): a change to
# such a file retries the modules that failed to load.
HELPER_SUFFIXES = (".py", ".ts", ".mts", ".cts", ".tsx", ".js", ".mjs", ".cjs", ".jsx")

# What git reads of a config file beyond its own lines, lower-cased as ``git config --list`` prints
# them: the files it includes, and the files the built-ins' git runs (status, diff) read by name.
GIT_INCLUDE_KEYS = re.compile(r"^(include|includeif\..*)\.path$", re.DOTALL)
GIT_PATH_KEYS = ("core.excludesfile", "core.attributesfile", "diff.orderfile")
# The environment may choose your own config files; nothing else of git's.
KEPT_GIT_VARS = ("GIT_CONFIG_GLOBAL", "GIT_CONFIG_SYSTEM", "GIT_CONFIG_NOSYSTEM")


def git_config_path(value: str, base: Path, home: Path) -> Path:
    """A path as git reads it from a config file: ``~`` is your home, a relative one is relative
    to ``base``."""
    if value == "~" or value.startswith("~/"):
        return _real(home / value[2:])
    path = Path(os.path.expanduser(value))
    return _real(base / path if not path.is_absolute() else path)


def _real(path: Path) -> Path:
    """``path`` with its symlinks followed, as far as they lead: a loop of them (a repository's
    choice) is what does not exist, where ``Path.resolve`` raises ``RuntimeError``."""
    return Path(os.path.realpath(path))


def global_tools_dir(home: Path) -> Path:
    """``~/.atomic/tools``: tools every project sees."""
    return home / ".atomic" / "tools"


def local_tools_dir(root: Path) -> Path:
    """``<project root>/.atomic/tools``: tools of one project."""
    return root / ".atomic" / "tools"


def opencode_tools_dirs(root: Path) -> list[Path]:
    """``<project root>/.opencode/tool`` and ``.opencode/tools``: OpenCode's tools of one project."""
    return [root / ".opencode" / name for name in ("tool", "tools")]


def opencode_global_dirs(home: Path, environ: Mapping[str, str] | None = None) -> list[Path]:
    """``~/.config/opencode/tool`` and ``tools`` (``$XDG_CONFIG_HOME`` when set): OpenCode's own
    global tools, which every project sees."""
    environ = os.environ if environ is None else environ
    config = environ.get("XDG_CONFIG_HOME", "")
    base = Path(config) if os.path.isabs(config) else home / ".config"
    return [base / "opencode" / name for name in ("tool", "tools")]


def git_worktree_root(directory: Path) -> Path | None:
    """The nearest ancestor (or ``directory`` itself) holding ``.git`` (a directory, or a file in a
    linked worktree or submodule), without running git."""
    for candidate in (directory, *directory.parents):
        try:
            os.stat(candidate / ".git")
        except OSError:  # missing, or a loop or a directory we may not search: not a marker
            continue
        return candidate
    return None


def git_dirs_around(directory: Path) -> Iterator[Path]:
    """Every git dir whose config git may read when run in ``directory`` (a resolved path), found
    the way git finds its repository, and never more leniently, nearest first: from ``directory``
    up, a ``.git`` directory (git stops at the first it can use, ``_usable_git_dir``, and passes by
    one it cannot), a ``.git`` file (git goes where its ``gitdir:`` says, and stops), the directory
    itself when its ``.git`` is none git can use and it looks like a bare repository (git takes it
    for one, unless ``safe.bareRepository`` says not: counted either way). With each, the common
    dir its ``commondir`` names (a linked worktree's repository). Never raises: what cannot be read
    counts as a git dir of its own. Lazy: a caller that has seen enough stops the walk."""
    for candidate in (directory, *directory.parents):
        dot_git = candidate / ".git"
        try:
            info = os.lstat(dot_git)
            if stat.S_ISLNK(info.st_mode):
                info = os.stat(dot_git)
        except (OSError, ValueError):
            info = None
        if info is not None and stat.S_ISREG(info.st_mode):
            yield from _named_git_dirs(candidate, dot_git)
            return
        if info is not None:
            # The walked directories are resolved: only a symlinked .git leads elsewhere.
            git_dir = _real(dot_git) if stat.S_ISLNK(os.lstat(dot_git).st_mode) else dot_git
            yield from dict.fromkeys((git_dir, _common_dir(git_dir)))
            if stat.S_ISDIR(info.st_mode) and _usable_git_dir(git_dir):
                return
        if _usable_git_dir(candidate):
            yield candidate


def _usable_git_dir(path: Path) -> bool:
    """Whether git would take ``path`` for a git dir: ``objects/`` and ``refs/`` in it, and a ``HEAD``
    naming a ref under ``refs/`` or an object. Stricter than git where they differ, never looser: a
    directory git passes by must not be one this stops at."""
    try:
        if not (path / "objects").is_dir() or not (path / "refs").is_dir():
            return False
        head = path / "HEAD"
        if head.is_symlink():
            return os.readlink(head).startswith("refs/")
        text = _read_small(head, "HEAD", 256).strip()
    except (OSError, RepositoryRefused):
        return False
    return text.startswith("ref: refs/") or (len(text) in (40, 64) and all(c in "0123456789abcdef" for c in text))


def _named_git_dirs(top: Path, dot_git: Path) -> list[Path]:
    """The git dir a ``.git`` file names and its common dir; the file itself when it names none."""
    try:
        named = gitfile_target(_read_small(dot_git, "the .git file"))
        if named is None:
            return [dot_git]
        git_dir = _real(top / named)
    except (OSError, ValueError, RepositoryRefused):  # ValueError: a NUL in the path
        return [dot_git]
    return list(dict.fromkeys((git_dir, _common_dir(git_dir))))


def gitfile_target(text: str) -> str | None:
    """The path a ``.git`` file names, read as git reads it: after ``gitdir: `` (one space), up to
    the trailing line ends only (a space either side is part of the path); None when the file is not
    one git reads."""
    if not text.startswith("gitdir: "):
        return None
    return text[len("gitdir: "):].rstrip("\r\n") or None


def _common_dir(git_dir: Path) -> Path:
    try:
        if regular_file(git_dir / "commondir", "the commondir file"):
            named = _read_small(git_dir / "commondir", "the commondir file").rstrip("\r\n")
            return _real(git_dir / named) if named else git_dir
    except (OSError, ValueError, RepositoryRefused):
        return git_dir / "commondir"  # what cannot be read is a git dir of its own: never a trusted one
    return git_dir


def project_root(directory: Path, home: Path) -> Path:
    """The project a directory belongs to.

    The nearest ancestor with an ``.atomic/`` directory of this user's (the home directory does not
    count: its ``.atomic/`` holds the global tools), else the git worktree root, else the directory
    itself. An ``.atomic/`` owned by someone else (anyone can create ``/tmp/.atomic``) is ignored.
    """
    directory = directory.resolve()
    home = home.resolve()
    uid = os.geteuid()
    for candidate in (directory, *directory.parents):
        if candidate != home and _own_dir(candidate / ".atomic", uid):
            return candidate
    return git_worktree_root(directory) or directory


def _own_dir(path: Path, uid: int) -> bool:
    try:
        info = path.stat()
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == uid


class ModuleFile:
    """A tool module on disk, and the stat values that tell whether it changed."""

    __slots__ = ("kind", "mtime_ns", "path", "size")

    def __init__(self, path: str, kind: str, size: int, mtime_ns: int) -> None:
        self.path = path
        self.kind = kind
        self.size = size
        self.mtime_ns = mtime_ns

    @property
    def key(self) -> tuple[int, int]:
        return (self.size, self.mtime_ns)

    def __repr__(self) -> str:
        return f"ModuleFile({self.path!r}, {self.kind!r})"


_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\\": "\\\\"}


def escape_path(path: str | bytes) -> str:
    """``path`` as valid UTF-8 on one line, for JSON, logs and terminals.

    Bytes that are not UTF-8 (the surrogate escapes of ``os.fsdecode``) read ``\\xff``; newlines,
    control characters and the invisible ones that reorder or hide text read as Python writes them
    (``\\n``, ``\\x1b``, ``\\u202e``). In such a path a backslash is doubled, so an escape is never
    mistaken for a name that holds ``\\x``.
    """
    text = path if isinstance(path, str) else os.fsdecode(path)
    if text.isprintable() and "\\" not in text:
        return text
    out = []
    for char in text:
        code = ord(char)
        if 0xDC80 <= code <= 0xDCFF:  # a byte os.fsdecode could not decode
            out.append(f"\\x{code - 0xDC00:02x}")
        elif char in _ESCAPES:
            out.append(_ESCAPES[char])
        elif char.isprintable():
            out.append(char)
        elif code < 0x100:
            out.append(f"\\x{code:02x}")
        elif code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    return "".join(out)


def escape_strings(value: Any) -> Any:
    """``value`` (JSON-like: dicts, lists, strings, …) with each string that is not valid UTF-8
    escaped by ``escape_path``: what a report holds that came from a file name, made fit for JSON."""
    if isinstance(value, str):
        try:
            value.encode()
        except UnicodeEncodeError:
            return escape_path(value)
        return value
    if isinstance(value, dict):
        return {escape_strings(k): escape_strings(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [escape_strings(v) for v in value]
    return value


_NOT_UTF8 = "its name is not valid UTF-8"


def _odd_name(name: str) -> str | None:
    """Why a module's file name cannot serve, or None: it must travel as UTF-8 JSON and print on one line."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return _NOT_UTF8
    if not name.isprintable():
        return "its name holds a control character (a newline, an escape, a hidden or reordering mark)"
    return None


class Skipped(NamedTuple):
    """An entry of a tools directory that is not listed as a module, or the directory itself when it
    cannot be listed: its ``path``, escaped (``escape_path``), and in ``message`` why and the fix."""

    path: str
    message: str

    def entry(self, scope: str) -> dict[str, Any]:
        """The form load errors take in ``list``, ``reload`` and ``status``."""
        return {"file": self.path, "line": None, "message": self.message, "scope": scope}


_RENAME = "rename or remove it"


def _dir_problem(tools_dir: Path, exc: OSError) -> Skipped | None:
    """What keeps a tools directory from being listed, as a report (None: it just does not exist)."""
    if isinstance(exc, FileNotFoundError):
        if os.path.islink(tools_dir):
            return Skipped(
                escape_path(str(tools_dir)),
                "the tools directory is a symbolic link to nothing: no tools load from it; "
                "point it at a directory or remove it",
            )
        return None  # no tools directory is the usual case, not a fault
    if exc.errno == errno.ELOOP:
        why = "is a symbolic link loop (it leads back to itself)"
    elif exc.errno == errno.ENOTDIR:
        why = "is not a directory (a file, or a file on the way to it)"
    elif exc.errno in (errno.EACCES, errno.EPERM):
        why = "cannot be read (permission denied); make it readable: chmod u+rx"
    else:
        why = f"cannot be listed ({exc.strerror or exc})"
    return Skipped(
        escape_path(str(tools_dir)), f"the tools directory {why}: no tools load from it until that is put right"
    )


def _entry_problem(entry: os.DirEntry[str]) -> tuple[str | None, os.stat_result | None]:
    """Why an entry named like a module is not one (None and its stat when it is a regular file)."""
    problem = _odd_name(entry.name)
    if problem is not None:
        return f"{problem}: not loaded; {_RENAME}", None
    try:
        st = os.stat(entry.path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return f"it is a symbolic link loop: not loaded; {_RENAME}", None
        if isinstance(exc, FileNotFoundError) and os.path.islink(entry.path):
            return f"it is a symbolic link to nothing: not loaded; {_RENAME}", None
        if isinstance(exc, FileNotFoundError):
            return None, None  # removed while we looked: the watcher sees that
        return f"it cannot be read ({exc.strerror or exc}): not loaded", None
    if stat.S_ISDIR(st.st_mode):
        return (
            f"it is a directory, not a tool module: not loaded; {_RENAME} (a helper package's name starts with _)"
        ), None
    if not stat.S_ISREG(st.st_mode):
        return f"it is not a regular file (a FIFO, socket or device): not loaded; {_RENAME}", None
    return None, st


def scan_tools_dir(tools_dir: Path) -> tuple[list[ModuleFile], list[Skipped]]:
    """The tool modules in a tools directory, sorted by file name, and what was skipped.

    Files whose suffix is in ``MODULE_KINDS`` count; names starting with ``_`` are helpers that tools
    import, and names starting with ``.`` are editor and temporary files: neither is a module, nor
    reported. An entry named like a module that cannot be one (see the module docstring), and a
    tools directory that exists but cannot be listed, are skipped and reported. Only the first
    ``MAX_MODULES`` entries named like modules (by name) are looked at; more are reported once, as
    the directory's. Never raises.
    """
    if _odd_name(str(tools_dir)) == _NOT_UTF8:  # every module path would hold it: none could reach a worker
        return [], [
            Skipped(
                escape_path(str(tools_dir)),
                "the tools directory's path is not valid UTF-8: no tools load from it; move it to a path that is",
            )
        ]
    try:
        with os.scandir(tools_dir) as iterator:
            entries = list(iterator)
    except OSError as exc:
        problem = _dir_problem(tools_dir, exc)
        return [], [] if problem is None else [problem]
    named = sorted(
        ((entry, kind) for entry in entries if (kind := _module_kind(entry.name)) is not None),
        key=lambda pair: pair[0].name,
    )
    found = []
    skipped = [] if len(named) <= MAX_MODULES else [_too_many(tools_dir, len(named))]
    for entry, kind in named[:MAX_MODULES]:
        problem, st = _entry_problem(entry)
        if problem is not None:
            skipped.append(Skipped(escape_path(entry.path), problem))
        elif st is not None:
            found.append(ModuleFile(entry.path, kind, st.st_size, st.st_mtime_ns))
    skipped.sort(key=lambda s: s.path)
    return found, skipped


def _module_kind(name: str) -> str | None:
    """The kind of module an entry of a tools directory is named as, or None (not named as one)."""
    if name.startswith(("_", ".")):
        return None
    return MODULE_KINDS.get(os.path.splitext(name)[1])


def _too_many(tools_dir: Path, count: int) -> Skipped:
    return Skipped(
        escape_path(str(tools_dir)),
        f"the tools directory holds {count} entries named like tool modules, more than the {MAX_MODULES} "
        f"one directory may hold: only the first {MAX_MODULES} by name are looked at; remove the others, "
        "or move the code they share into helpers (names starting with _)",
    )


def may_hold_modules(tools_dir: Path, look_at: int = MAX_MODULES) -> bool:
    """Whether ``tools_dir`` may hold a module, known at a bounded cost: one of the first ``look_at``
    entries it lists is named like one, or it holds more entries than that (the rest unread); False
    when it cannot be listed."""
    try:
        with os.scandir(tools_dir) as iterator:
            for seen, entry in enumerate(iterator):
                if seen == look_at or _module_kind(entry.name) is not None:
                    return True
    except OSError:
        pass
    return False


def list_module_files(tools_dir: Path) -> list[ModuleFile]:
    """The tool modules in a tools directory, sorted by file name (``scan_tools_dir`` without the
    skipped entries)."""
    return scan_tools_dir(tools_dir)[0]


# -- the repository a project is in -----------------------------------------------------------------


class RepositoryRefused(Exception):
    """A repository's ``.git`` (or a file git reads there) leads where nothing may be read."""


class Repository(NamedTuple):
    """A repository the built-ins may read: its work tree, its git dir, and its common dir (the
    main repository's git dir for a linked worktree; the git dir itself otherwise)."""

    worktree: Path
    git_dir: Path
    common_dir: Path

    def holds(self, path: Path) -> bool:
        return any(within(path, area) for area in (self.worktree, self.git_dir, self.common_dir))


def within(path: Path, area: Path) -> bool:
    return path == area or area in path.parents


def regular_file(path: Path, what: str, limit: int | None = None) -> bool:
    """Whether ``path`` is a regular file (False when absent); refused when it is anything else
    (a FIFO or a device blocks or never ends) or larger than ``limit``."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise RepositoryRefused(f"Refused: {what} {path} cannot be read ({exc.strerror})") from None
    if not stat.S_ISREG(info.st_mode):
        raise RepositoryRefused(f"Refused: {what} {path} is not a regular file (a FIFO or a device would make git hang)")
    if limit is not None and info.st_size > limit:
        raise RepositoryRefused(f"Refused: {what} {path} is {info.st_size} bytes, more than the {limit} the built-ins read")
    return True


def _read_small(path: Path, what: str, limit: int = 4096) -> str:
    regular_file(path, what, limit)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        return os.read(fd, limit).decode("utf-8", "surrogateescape")
    finally:
        os.close(fd)


def _linked_dir(top: Path, dot_git: Path) -> Path:
    """The git dir a ``.git`` file names, when it is one git made for this work tree: a linked
    worktree's (it names this ``.git`` back) or a submodule's (in an enclosing repository's
    ``.git/modules``, its ``core.worktree`` naming this work tree). Anything else is refused: a
    ``.git`` file that came with a download can point at any repository of yours."""
    named = gitfile_target(_read_small(dot_git, "the .git file"))
    if named is None:
        raise RepositoryRefused(f"Refused: {dot_git} is not a .git file git wrote (no 'gitdir: ' line)")
    target = Path(named)
    git_dir = _real(top / target) if not target.is_absolute() else _real(target)
    if within(git_dir, top):
        return git_dir
    back = git_dir / "gitdir"
    if regular_file(back, "the worktree's gitdir file") and _real(Path(_read_small(back, "the gitdir file").strip())) == _real(dot_git):
        return git_dir
    for enclosing in top.parents:
        modules = enclosing / ".git" / "modules"
        if (enclosing / ".git").is_dir() and within(git_dir, _real(modules)) and _core_worktree(git_dir) == _real(top):
            return git_dir
    raise RepositoryRefused(
        f"Refused: {dot_git} points git at {git_dir}, outside the project, and that is neither a "
        f"worktree nor a submodule of this one; the built-ins read nothing outside the project"
    )


def _core_worktree(git_dir: Path) -> Path | None:
    """The work tree a submodule's git dir names (``core.worktree``, which git writes there for
    each submodule it checks out), read without running git; None when it names none.

    Without it any git dir under an enclosing repository's ``.git/modules`` would do, another
    submodule's among them; with it, only the one made for this work tree. Only the plain form git
    writes is understood: anything else is no proof."""
    config = git_dir / "config"
    if not regular_file(config, "the submodule's config", 64 * 1024):
        return None
    section = ""
    for line in _read_small(config, "the submodule's config", 64 * 1024).splitlines():
        line = line.strip()
        if line.startswith("["):
            section = line.strip("[]").strip().lower()
        elif section == "core" and "=" in line:
            key, _, value = line.partition("=")
            if key.strip().lower() == "worktree":
                value = value.strip()
                if len(value) > 1 and value[0] == value[-1] == '"':
                    value = value[1:-1]
                return _real(git_dir / value) if value else None
    return None


def locate_repository(root: Path) -> Repository | None:
    """The repository of the project at ``root`` (None when there is none), found without running
    git: a ``.git`` symlink only within the work tree, a ``.git`` file only to a worktree or
    submodule git made for it, a ``commondir`` only to the repository this is a worktree of.

    The built-ins run git on it, and the daemon lets their confined workers read it: what a
    repository says here can lead to no other directory.
    """
    top = git_worktree_root(root)
    if top is None:
        return None
    dot_git = top / ".git"
    info = os.lstat(dot_git)
    if stat.S_ISLNK(info.st_mode):
        git_dir = _real(dot_git)
        if not within(git_dir, top):
            raise RepositoryRefused(f"Refused: {dot_git} is a symlink to {git_dir}, outside the project")
        info = os.stat(git_dir)
    else:
        git_dir = dot_git
    if stat.S_ISREG(info.st_mode):
        git_dir = _linked_dir(top, dot_git)
    elif not stat.S_ISDIR(info.st_mode):
        raise RepositoryRefused(f"Refused: {dot_git} is neither a directory nor a .git file")
    if not git_dir.is_dir():
        raise RepositoryRefused(f"{dot_git} names {git_dir}, which is not a directory: is the repository broken?")
    common_dir = git_dir
    if regular_file(git_dir / "commondir", "the commondir file"):
        named = Path(_read_small(git_dir / "commondir", "the commondir file").rstrip("\r\n"))
        common_dir = _real(git_dir / named)
        # Git's own layout (COMMON/worktrees/NAME), by the resolved path: a symlink at
        # COMMON/worktrees/NAME back to this git dir would prove nothing about COMMON.
        resolved = _real(git_dir)
        if not within(common_dir, top) and (resolved.parent.name != "worktrees" or resolved.parent.parent != common_dir):
            raise RepositoryRefused(
                f"Refused: {git_dir}/commondir points git at {common_dir}, a repository this one is not a worktree of"
            )
    return Repository(_real(top), _real(git_dir), _real(common_dir))
