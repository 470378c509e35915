"""The git built-ins' text, laid out as git lays it out: ``git status --porcelain`` lines and the
``git diff --stat`` summary (80 columns, as git writes it to a pipe).

Pure functions of what the repository reader found (``_gitread``), so the layout can be compared
with real git's. Every path is quoted the way git quotes it (``"\\303\\274.txt"``, ``"a\\tb"``): a
file name never puts a control character, such as a terminal escape, into the answer.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["StatFile", "StatusEntry", "porcelain", "quote", "stat"]

_ESCAPES = {0x07: "a", 0x08: "b", 0x09: "t", 0x0A: "n", 0x0B: "v", 0x0C: "f", 0x0D: "r", 0x22: '"', 0x5C: "\\"}
_WIDTH = 80  # git's --stat width when its output is not a terminal


def quote(path: bytes, *, spaces: bool = False, fully: bool = True) -> str:
    """``path`` as git prints it: as it is, or in double quotes with C escapes when it holds a
    control character, a quote or a backslash, a byte past ASCII (unless ``fully`` is off: git's
    ``core.quotePath``) or, with ``spaces``, a space (git status does that)."""
    def special(byte: int) -> bool:
        return byte < 0x20 or byte in (0x22, 0x5C, 0x7F) or (fully and byte >= 0x80) or (spaces and byte == 0x20)

    if not any(special(byte) for byte in path):
        return path.decode("utf-8", "replace")
    out = []
    plain = bytearray()
    for byte in path:
        if not special(byte):
            plain.append(byte)
            continue
        out.append(plain.decode("utf-8", "replace"))
        plain.clear()
        out.append(f"\\{_ESCAPES[byte]}" if byte in _ESCAPES else f"\\{byte:03o}" if byte != 0x20 else " ")
    out.append(plain.decode("utf-8", "replace"))
    return '"' + "".join(out) + '"'


class StatusEntry(NamedTuple):
    """One line of ``git status --porcelain``: the index state (X), the work tree's (Y), the path
    and, for a rename, the path it had."""

    x: str
    y: str
    path: bytes
    origin: bytes | None = None


def porcelain(changes: list[StatusEntry], untracked: list[bytes], *, fully: bool = True) -> str:
    """The porcelain text: changes sorted by path, then untracked paths (``??``), sorted."""
    lines = []
    for entry in sorted(changes, key=lambda e: e.path):
        name = quote(entry.path, spaces=True, fully=fully)
        if entry.origin is not None:
            name = f"{quote(entry.origin, spaces=True, fully=fully)} -> {name}"
        lines.append(f"{entry.x}{entry.y} {name}")
    lines += [f"?? {quote(path, spaces=True, fully=fully)}" for path in sorted(untracked)]
    return "".join(line + "\n" for line in lines)


class StatFile(NamedTuple):
    """One file of a diff: its old and new path, lines added and deleted (bytes, for a binary
    file: its new and old size), and whether it is binary or unmerged."""

    old: bytes
    new: bytes
    added: int
    deleted: int
    binary: bool = False
    unmerged: bool = False


def _renamed(old: bytes, new: bytes, fully: bool) -> str:
    """``dir/{old => new}/rest``, the common prefix and suffix (whole directories) taken out."""
    a, b = quote(old, fully=fully), quote(new, fully=fully)
    if a.startswith('"') or b.startswith('"'):
        return f"{a} => {b}"
    prefix = 0
    for i, (ca, cb) in enumerate(zip(a, b, strict=False)):
        if ca != cb:
            break
        if ca == "/":
            prefix = i + 1
    suffix = 0
    i, j = len(a) - 1, len(b) - 1
    floor = prefix - 1 if prefix else 0  # with a prefix, its slash may also end the suffix
    while i >= floor and j >= floor and a[i] == b[j]:
        if a[i] == "/":
            suffix = len(a) - i
        i, j = i - 1, j - 1
    mid_a = a[prefix:max(prefix, len(a) - suffix)]
    mid_b = b[prefix:max(prefix, len(b) - suffix)]
    if not prefix and not suffix:
        return f"{mid_a} => {mid_b}"
    return f"{a[:prefix]}{{{mid_a} => {mid_b}}}{a[len(a) - suffix:]}"


def _scale(it: int, width: int, most: int) -> int:
    """At least one column for any change, the rest in proportion (as git scales its graph)."""
    return 0 if not it else 1 + (it * (width - 1) // most)


def stat(files: list[StatFile], *, fully: bool = True) -> str:
    """The ``git diff --stat`` text of ``files`` (in the order given), empty for none."""
    if not files:
        return ""
    names = [_renamed(f.old, f.new, fully) if f.old != f.new else quote(f.new, fully=fully) for f in files]
    longest = max(len(name) for name in names)
    most = 0
    number_width = 0
    bin_width = 0
    for f in files:
        if f.unmerged:
            bin_width = max(bin_width, 8)
        elif f.binary:
            bin_width = max(bin_width, 14 + len(str(f.added)) + len(str(f.deleted)))
            number_width = 3
        else:
            most = max(most, f.added + f.deleted)
    number_width = max(number_width, len(str(most)))
    width = max(_WIDTH, 16 + 6 + number_width)
    graph_width = most if most + 4 > bin_width else bin_width - 4
    name_width = longest
    if name_width + number_width + 6 + graph_width > width:
        if graph_width > width * 3 // 8 - number_width - 6:
            graph_width = max(6, width * 3 // 8 - number_width - 6)
        if name_width > width - number_width - 6 - graph_width:
            name_width = width - number_width - 6 - graph_width
        else:
            graph_width = width - number_width - 6 - name_width
    lines = [_stat_line(f, name, name_width, number_width, graph_width, most) for f, name in zip(files, names, strict=True)]
    counted = [f for f in files if not f.unmerged]
    added = sum(f.added for f in counted if not f.binary)
    deleted = sum(f.deleted for f in counted if not f.binary)
    return "".join(lines) + _summary(len(counted), added, deleted)


def _stat_line(f: StatFile, name: str, name_width: int, number_width: int, graph_width: int, most: int) -> str:
    prefix = ""
    room = name_width
    if name_width < len(name):
        prefix = "..."
        room = max(0, name_width - 3)
        name = name[len(name) - room:] if room else ""
        slash = name.find("/")
        if slash >= 0:
            name = name[slash:]
    label = f" {prefix}{name}{' ' * max(0, room - len(name))} | "
    if f.unmerged:
        return f"{label}{'Unmerged' + chr(10):>{number_width}}"
    if f.binary:
        head = f"{label}{'Bin':>{number_width}}"
        return f"{head}\n" if not f.added and not f.deleted else f"{head} {f.deleted} -> {f.added} bytes\n"
    add, delete = f.added, f.deleted
    if graph_width <= most:
        total = _scale(add + delete, graph_width, most)
        if total < 2 and add and delete:
            total = 2
        if add < delete:
            add = _scale(add, graph_width, most)
            delete = total - add
        else:
            delete = _scale(delete, graph_width, most)
            add = total - delete
    count = f.added + f.deleted
    return f"{label}{count:>{number_width}}{' ' if count else ''}{'+' * add}{'-' * delete}\n"


def _summary(files: int, added: int, deleted: int) -> str:
    text = f" {files} file{'s' if files != 1 else ''} changed"
    if added or not deleted:
        text += f", {added} insertion{'s' if added != 1 else ''}(+)"
    if deleted or not added:
        text += f", {deleted} deletion{'s' if deleted != 1 else ''}(-)"
    return text + "\n"
