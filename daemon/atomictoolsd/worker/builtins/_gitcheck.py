"""What the repository reader checks before libgit2 reads a repository, and after it opened one:
that the repository leads nowhere outside itself and holds nothing that would block the read.

Runs in the repository reader's process (``_gitread``), never in a worker or the daemon. The
checks, in order:

- **Where the repository is** (``locate_repository``): a ``.git`` file, symlink or ``commondir``
  leads only where git itself put it.
- **Whose it is.** A repository another user owns is refused as git refuses it; only your own
  configuration may vouch for one (``safe.directory``), never the repository's.
- **Git's own files** (HEAD, index, config, …) and the top-level ``.gitignore`` and
  ``.gitattributes`` must be regular files, and a symlink among them must stay in the repository.
- **Its configuration's includes.** libgit2 follows ``include.path`` and ``includeIf.*.path`` as
  it loads a config file, so they are checked before, by reading the file as text. A parser that
  disagreed with libgit2's would let a repository hide an include, so this one does not try to
  understand everything: every line that holds the word ``include`` (in any case) must be a plain
  section header, and a section named ``include``/``includeIf`` may hold nothing but
  ``path = VALUE`` lines in the plainest form (no quotes inside, no backslash, no comment after).
  Anything else that mentions an include is refused. Each included file must be a regular file of
  at most ``MAX_CONFIG_BYTES`` inside the repository, and is checked the same way.
- **After libgit2 opened it** (``check_opened``): the includes libgit2 itself saw in the
  repository's configuration must be ones checked here, and the files that configuration names
  for reading (``core.excludesFile``, ``core.attributesFile``) must be regular files inside the
  repository.

A refusal is a ``Refused``: our own words, which may name a path the repository wrote but never
anything read from a file outside it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

import pygit2

from atomictoolsd.config.discovery import (
    GIT_INCLUDE_KEYS,
    GIT_PATH_KEYS,
    Repository,
    RepositoryRefused,
    git_config_path,
    locate_repository,
    regular_file,
)

__all__ = ["MAX_CONFIG_BYTES", "NotARepository", "Refused", "check_opened", "vet"]

MAX_CONFIG_BYTES = 1024 * 1024
_MAX_CONFIG_FILES = 80  # git stops includes at a depth of 10; a file may include several
_GIT_DIR_FILES = (
    "HEAD", "config", "config.worktree", "index", "packed-refs", "commondir", "gitdir", "shallow",
    "info/exclude", "info/attributes", "info/grafts", "objects/info/alternates",
)
_REPOSITORY_LEVELS = (5, 6)  # libgit2's LOCAL and WORKTREE: the repository's own configuration

_LINES = re.compile(rb"\r\n|\r|\n")
_INCLUDE_WORD = re.compile(rb"include", re.IGNORECASE)
_OPENS_SECTION = re.compile(rb"[ \t]*\[")
_HEADER = re.compile(rb"[ \t]*\[(?P<name>[^\]]*)\][ \t]*(?:[#;].*)?")
_INCLUDE_SECTION = re.compile(rb"[ \t]*include(?:if)?(?:[ \t.\"]|$)", re.IGNORECASE)
_QUIET = re.compile(rb"[ \t]*(?:[#;].*)?")
_PATH_LINE = re.compile(
    rb'[ \t]*path[ \t]*=[ \t]*(?:"(?P<quoted>[^"\\]*)"|(?P<plain>[^"\\;#\s](?:[^"\\;#]*[^"\\;#\s])?))[ \t]*',
    re.IGNORECASE,
)


class Refused(Exception):
    """The repository is not read, for the reason given (our own words)."""


class NotARepository(Refused):
    """The project is in no git repository."""


def vet(root: Path, user_files: Iterable[tuple[str, int]], home: Path) -> tuple[Repository, set[str]]:
    """The repository of the project at ``root``, checked as the module says, and the include
    values of its configuration (for ``check_opened``). ``user_files`` are your own config files
    with their libgit2 levels: the only place a ``safe.directory`` may come from."""
    try:
        repository = locate_repository(root)
        if repository is None:
            raise NotARepository(f"{root} is not inside a git repository")
        for path in (repository.worktree, repository.common_dir):
            _owned(path, repository.worktree, user_files)
        for directory in {repository.git_dir, repository.common_dir}:
            for name in _GIT_DIR_FILES:
                _own_file(directory / name, repository, "the git file")
        # The ones at the top are read by every status and diff; deeper ones are left to the deadline
        # (looking for them would mean walking the whole tree before libgit2 does).
        for directory in {repository.worktree, root.resolve()}:
            for name in (".gitignore", ".gitattributes"):
                _own_file(directory / name, repository, "the file")
        includes = _checked_includes(repository, home)
    except RepositoryRefused as exc:
        raise Refused(str(exc)) from None
    return repository, includes


def _owned(path: Path, worktree: Path, user_files: Iterable[tuple[str, int]]) -> None:
    try:
        owner = os.stat(path).st_uid
    except OSError:
        return
    if owner == os.geteuid() or _vouched(worktree, user_files):
        return
    raise Refused(
        f"Refused: {path} belongs to uid {owner}, not to you; git does not read such a repository "
        f"unless you say so in your own config: git config --global --add safe.directory {worktree}"
    )


def _vouched(worktree: Path, user_files: Iterable[tuple[str, int]]) -> bool:
    """Whether your own config lists ``worktree`` as a ``safe.directory``, as git asks it."""
    config = pygit2.Config()
    try:
        for path, level in user_files:
            if os.path.isfile(path):
                config.add_file(path, level)
        listed = list(config.get_multivar("safe.directory"))
    except (pygit2.GitError, ValueError, OSError):
        return False
    safe: set[str] = set()
    for value in listed:  # an empty value resets the list, as in git
        safe = set() if not value else safe | {value}
    return "*" in safe or str(worktree) in safe or f"{worktree}/" in safe


def _own_file(path: Path, repository: Repository, what: str) -> None:
    """A file git reads of its own: absent, or a regular file whose real place is in the repository."""
    if not os.path.lexists(path):
        return
    if os.path.islink(path) and not repository.holds(Path(os.path.realpath(path))):
        raise Refused(f"Refused: {what} {path} is a symbolic link out of the repository")
    regular_file(path, what)


def _checked_includes(repository: Repository, home: Path) -> set[str]:
    """Every include of the repository's configuration, checked; their values as written."""
    pending = [repository.common_dir / "config", repository.git_dir / "config.worktree"]
    seen: set[Path] = set()
    values: set[str] = set()
    while pending:
        config = pending.pop()
        if config in seen:
            continue
        if len(seen) >= _MAX_CONFIG_FILES:
            raise Refused("Refused: the repository's config includes too many files")
        if not os.path.lexists(config):
            continue
        _own_file(config, repository, "the repository's config")
        regular_file(config, "the repository's config", MAX_CONFIG_BYTES)
        seen.add(config)
        for value in _includes_in(_read(config), config):
            values.add(value)
            target = git_config_path(value, config.parent, home)
            if not repository.holds(target):
                raise Refused(
                    f"Refused: the repository's config ({config}) includes {target}, outside the "
                    f"repository; the built-ins read nothing outside the project"
                )
            pending.append(target)
    return values


def _read(path: Path) -> bytes:
    """A config file's bytes (a file swapped for a larger one since it was checked is refused)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        data = b""
        while len(data) <= MAX_CONFIG_BYTES and (chunk := os.read(fd, MAX_CONFIG_BYTES + 1 - len(data))):
            data += chunk
    finally:
        os.close(fd)
    if len(data) > MAX_CONFIG_BYTES:
        raise Refused(f"Refused: the repository's config {path} is larger than the {MAX_CONFIG_BYTES} bytes the built-ins read")
    return data


def _includes_in(data: bytes, config: Path) -> list[str]:
    """The include paths of one config file, read as the module says (refused when unsure)."""
    unsure = f"Refused: the repository's config ({config}) mentions an include in a form the built-ins do not check"
    if b"\0" in data:
        raise Refused(f"Refused: the repository's config ({config}) holds a NUL byte")
    found = []
    including = False
    for line in _LINES.split(data):
        if _OPENS_SECTION.match(line):
            header = _HEADER.fullmatch(line)
            if header is None:
                if _INCLUDE_WORD.search(line):
                    raise Refused(unsure)
                including = False
            else:
                including = bool(_INCLUDE_SECTION.match(header["name"]))
            continue
        if _INCLUDE_WORD.search(line):
            raise Refused(unsure)
        if not including or _QUIET.fullmatch(line):
            continue
        path = _PATH_LINE.fullmatch(line)
        if path is None:
            raise Refused(unsure)
        found.append(os.fsdecode(path["quoted"] if path["quoted"] is not None else path["plain"]))
    return found


def check_opened(entries: Iterable[tuple[str, str | None, int]], repository: Repository, includes: set[str], home: Path) -> None:
    """Check the repository's configuration as libgit2 read it: ``(name, value, level)`` of each
    entry. Its includes must be the ones ``vet`` checked; the files it names must be inside."""
    for name, value, level in entries:
        if level not in _REPOSITORY_LEVELS or not value:
            continue
        key = name.lower()
        if GIT_INCLUDE_KEYS.match(key) and value not in includes:
            raise Refused(f"Refused: the repository's config includes {value}, in a form the built-ins did not check")
        if key in GIT_PATH_KEYS:
            target = git_config_path(value, repository.worktree, home)
            if not repository.holds(target):
                raise Refused(f"Refused: the repository's config sets {name} to {target}, outside the repository")
            try:
                regular_file(target, name, MAX_CONFIG_BYTES)
            except RepositoryRefused as exc:
                raise Refused(str(exc)) from None
