"""What a tool module declares it needs: PEP 723 inline script metadata, the block ``uv run`` and
``pipx run`` read::

    # /// script
    # requires-python = ">=3.11"
    # dependencies = ["pyyaml>=6", "httpx"]
    # ///

``read_metadata`` finds the block (a line ``# /// script``, lines that are ``#`` or start with
``# ``, a line ``# ///``), reads its TOML and checks what the daemon uses of it; ``python_meets``
says whether an interpreter version meets ``requires-python``. A block that cannot be read is a
``ScriptError`` naming its line, which the module's load reports.

Reads text only: nothing here installs, runs or imports anything.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass

__all__ = ["ScriptError", "ScriptMetadata", "parse_metadata", "python_meets"]

# PEP 723's own expression (its reference implementation reads blocks with it).
_BLOCK = re.compile(r"(?m)^# /// (?P<type>[a-zA-Z0-9-]+)$\s(?P<content>(^#(| .*)$\s)+)^# ///$")
_MOST = 200  # dependencies a module may declare
# A requirement starts with a project's name, then what PEP 508 lets follow one: extras, a version,
# a marker, a direct reference (``name @ URL``). A bare URL (``https://…/x.tar.gz``), a path
# (``./pkg``, ``/abs``) or an archive's file name would have the installer fetch or build what the
# repository names (pip builds a local or URL source tree even with ``--only-binary``): refused.
_REQUIREMENT = re.compile(
    r"\s*[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?(?<!\.whl)(?<!\.zip)(?<!\.tar)(?<!\.gz)(?<!\.tgz)(?<!\.bz2)(?<!\.xz)"
    r"\s*(?:$|[\[(<>=!~;@])"
)
_OPTION = re.compile(r"\s-")  # a requirements file's per-line option (``--config-settings``, ``--hash``)
# Bytes of a block's TOML: read on the daemon's event loop (tomllib takes ~0.6 s a MiB), a module
# declares a few lines.
_MOST_BYTES = 64 * 1024


class ScriptError(ValueError):
    """The module's ``# /// script`` block cannot be used; ``line`` is where it starts."""

    def __init__(self, message: str, line: int) -> None:
        super().__init__(message)
        self.line = line


@dataclass(frozen=True)
class ScriptMetadata:
    """What a module's block declares: ``dependencies`` as written, ``requires_python`` (or None)."""

    dependencies: tuple[str, ...]
    requires_python: str | None
    line: int  # where its ``# /// script`` line is


def parse_metadata(source: str) -> ScriptMetadata | None:
    """The module's ``script`` block; None when it has none.

    Raises:
        ScriptError: two blocks, TOML that does not parse, or a value of the wrong type.
    """
    blocks = [m for m in _BLOCK.finditer(source) if m.group("type") == "script"]
    if not blocks:
        return None
    line = source.count("\n", 0, blocks[0].start()) + 1
    if len(blocks) > 1:
        raise ScriptError("two `# /// script` blocks: PEP 723 allows one", line)
    if len(blocks[0].group("content")) > _MOST_BYTES:
        raise ScriptError(f"its `# /// script` block is larger than {_MOST_BYTES // 1024} KiB: declare only what it needs", line)
    content = "".join(
        text[2:] if text.startswith("# ") else text[1:] for text in blocks[0].group("content").splitlines(keepends=True)
    )
    try:
        data = tomllib.loads(content)
    except tomllib.TOMLDecodeError as exc:
        raise ScriptError(f"its `# /// script` block is not valid TOML: {exc}", line) from None
    dependencies = data.get("dependencies", [])
    if not isinstance(dependencies, list) or not all(isinstance(d, str) for d in dependencies):
        raise ScriptError('`dependencies` must be a list of strings: dependencies = ["pyyaml>=6"]', line)
    if len(dependencies) > _MOST:
        raise ScriptError(f"{len(dependencies)} dependencies: at most {_MOST}", line)
    for dependency in dependencies:
        if not _REQUIREMENT.match(dependency) or _OPTION.search(dependency) or any(c in dependency for c in "\r\n\0"):
            raise ScriptError(
                f"{dependency!r} is not a requirement of a package index (PEP 508: a name, extras, a version, as "
                f"\"pyyaml>=6\"); a URL, a path or an installer's option is not taken", line,
            )
    requires = data.get("requires-python")
    if requires is not None and not isinstance(requires, str):
        raise ScriptError('`requires-python` must be a string: requires-python = ">=3.11"', line)
    return ScriptMetadata(tuple(d.strip() for d in dependencies), requires, line)


_CLAUSE = re.compile(r"^\s*(~=|===|==|!=|<=|>=|<|>)\s*([0-9]+(?:\.[0-9]+)*)(\.\*)?\s*$")


def python_meets(specifier: str, version: tuple[int, ...]) -> bool:
    """Whether Python ``version`` (``sys.version_info[:3]``) meets ``specifier`` (``>=3.11,<3.14``).

    The clauses of PEP 440 that a Python version needs (``==3.11.*``, ``~=3.11``, ``!=3.12.0``);
    pre-releases and local versions are not Python versions a daemon runs on.

    Raises:
        ValueError: a clause that is not one of those.
    """
    for clause in specifier.split(","):
        match = _CLAUSE.match(clause)
        if match is None:
            raise ValueError(f"cannot read {clause.strip()!r}")
        op, text, star = match.group(1), match.group(2), match.group(3)
        wanted = tuple(int(part) for part in text.split("."))
        if not _meets(op, wanted, bool(star), version):
            return False
    return True


def _meets(op: str, wanted: tuple[int, ...], star: bool, version: tuple[int, ...]) -> bool:
    if star:
        if op not in ("==", "!="):
            raise ValueError(f"`.*` goes with == or != only, not {op}")
        same = version[: len(wanted)] == wanted
        return same if op == "==" else not same
    if op == "~=":
        if len(wanted) < 2:
            raise ValueError("~= needs two parts at least (~=3.11)")
        return _key(version) >= _key(wanted) and version[: len(wanted) - 1] == wanted[:-1]
    mine, theirs = _key(version), _key(wanted)
    return {
        "==": mine == theirs, "===": mine == theirs, "!=": mine != theirs,
        "<": mine < theirs, "<=": mine <= theirs, ">": mine > theirs, ">=": mine >= theirs,
    }[op]


def _key(version: tuple[int, ...]) -> tuple[int, ...]:
    """A version padded with zeros, so that 3.11 and 3.11.0 compare equal."""
    return (*version, *(0,) * (4 - len(version)))[:4]
