"""The copy of your git configuration a confined worker gets: its harmless keys only.

A confined tool that runs git must not fail on your ``~/.gitconfig`` (the sandbox does not let it
read the file) nor read what it holds: a token in ``url.<base>.insteadOf``, an ``http.extraHeader``,
a credential helper. So the daemon reads your global configuration here and hands the worker a copy
of the keys that only shape how git shows and compares (``HARMLESS``: identity, colors, diff and
status options, ``safe.directory``), which the worker's ``GIT_CONFIG_GLOBAL`` names. An allowlist:
a key git adds later is left out until someone looks at it.

Read without running git: a small reader of git's config syntax, enough for these keys (a line it
cannot read is left out); ``include`` and ``includeIf`` are not followed. Standard library only.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path

__all__ = ["HARMLESS", "harmless_copy"]

# Whole sections, or section.key (lower case; a key in a subsection is section.subsection.key, and
# only whole sections keep those).
HARMLESS = frozenset({
    "user.name", "user.email", "init.defaultbranch", "safe.directory",
    "core.autocrlf", "core.eol", "core.safecrlf", "core.filemode", "core.ignorecase", "core.precomposeunicode",
    "core.quotepath", "core.whitespace", "core.abbrev", "core.symlinks", "core.checkstat", "core.trustctime",
    "color", "advice", "column", "i18n",
    "diff.algorithm", "diff.renames", "diff.renamelimit", "diff.context", "diff.interhunkcontext",
    "diff.mnemonicprefix", "diff.noprefix", "diff.relative", "diff.colormoved", "diff.indentheuristic",
    "diff.ignoresubmodules", "diff.statgraphwidth", "diff.dirstat", "diff.submodule",
    "status.showuntrackedfiles", "status.short", "status.branch", "status.relativepaths", "status.aheadbehind",
    "status.renames", "status.renamelimit", "status.submodulesummary", "status.showstash",
    "log.date", "log.decorate", "log.abbrevcommit", "log.follow", "log.mailmap", "log.showroot",
    "merge.conflictstyle", "pull.rebase", "pull.ff", "branch.sort", "tag.sort",
})

_SECTION = re.compile(r'\[\s*([A-Za-z0-9.-]+)\s*(?:"((?:[^"\\]|\\.)*)")?\s*\]')
_KEY = re.compile(r"([A-Za-z][A-Za-z0-9-]*)\s*(?:=(.*))?$")
_ESCAPES = {"n": "\n", "t": "\t", "b": "\b", "\\": "\\", '"': '"'}

_CACHE: dict[tuple[tuple[str, int, int, int] | None, ...], str] = {}


def harmless_copy(home: Path, environ: Mapping[str, str] | None = None) -> str:
    """The text of a git configuration holding the ``HARMLESS`` keys of your global one (the files
    git reads as global: ``GIT_CONFIG_GLOBAL``, else ``$XDG_CONFIG_HOME/git/config`` and
    ``~/.gitconfig``); read again only when one of them changed."""
    environ = os.environ if environ is None else environ
    if environ.get("GIT_CONFIG_GLOBAL"):
        files = [Path(environ["GIT_CONFIG_GLOBAL"])]
    else:
        xdg = Path(environ.get("XDG_CONFIG_HOME") or home / ".config")
        files = [xdg / "git" / "config", home / ".gitconfig"]
    key = tuple(_identity(path) for path in files)
    text = _CACHE.get(key)
    if text is None:
        _CACHE.clear()
        text = _CACHE[key] = _write(entry for path in files for entry in _entries(path))
    return text


def _identity(path: Path) -> tuple[str, int, int, int] | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return (str(path), info.st_ino, info.st_size, info.st_mtime_ns)


def _harmless(section: str, subsection: str | None, key: str) -> bool:
    if section in HARMLESS:
        return True
    return subsection is None and f"{section}.{key}" in HARMLESS


def _entries(path: Path) -> Iterator[tuple[str, str | None, str, str | None]]:
    """``(section, subsection, key, value)`` of each harmless entry of the file at ``path``
    (``value`` None: a bare key, true); nothing when it cannot be read."""
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return
    section: str | None = None
    subsection: str | None = None
    pending = ""
    for line in lines:
        if pending:
            line, pending = pending + line, ""
        stripped = line.strip()
        if stripped.endswith("\\") and not stripped.endswith("\\\\"):
            pending = stripped[:-1]  # a value continued on the next line
            continue
        if not stripped or stripped[0] in "#;":
            continue
        if stripped.startswith("["):
            match = _SECTION.match(stripped)
            section, subsection = _section(match) if match else (None, None)
            continue
        match = _KEY.match(stripped)
        if match is None or section is None or not _harmless(section, subsection, match.group(1).lower()):
            continue
        value = _value(match.group(2)) if match.group(2) is not None else None
        if match.group(2) is None or value is not None:
            yield section, subsection, match.group(1).lower(), value


def _section(match: re.Match[str]) -> tuple[str | None, str | None]:
    name, quoted = match.group(1), match.group(2)
    if quoted is not None:
        return name.lower(), re.sub(r"\\(.)", r"\1", quoted)
    head, dot, rest = name.partition(".")  # the old [section.subsection] spelling
    return head.lower(), (rest.lower() if dot else None)


def _value(raw: str) -> str | None:
    """A value as git reads it: quotes joined, escapes resolved, a comment and the whitespace around
    it cut (but inside quotes); None when malformed."""
    out: list[str] = []
    keep = 0  # what is kept: up to the last character that is not whitespace outside quotes
    quoted = False
    chars = iter(raw.strip())
    for char in chars:
        if char == '"':
            quoted = not quoted
            keep = len(out)
        elif char == "\\":
            escaped = _ESCAPES.get(next(chars, ""))
            if escaped is None:
                return None
            out.append(escaped)
            keep = len(out)
        elif char in "#;" and not quoted:
            break
        else:
            out.append(char)
            if quoted or not char.isspace():
                keep = len(out)
    return None if quoted else "".join(out[:keep])


def _write(entries: Iterator[tuple[str, str | None, str, str | None]]) -> str:
    lines: list[str] = []
    current: tuple[str, str | None] | None = None
    for section, subsection, key, value in entries:
        if (section, subsection) != current:
            current = (section, subsection)
            lines.append(f"[{section}]" if subsection is None else f'[{section} "{_quote(subsection)}"]')
        lines.append(f"\t{key}" if value is None else f'\t{key} = "{_quote(value)}"')
    return "".join(f"{line}\n" for line in lines)


def _quote(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
