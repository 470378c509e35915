"""The ``file-read`` handler, and ``read_inside``, the confined file read it shares with the built-in
``file-reader`` tool.

A path is resolved with every symlink followed and must stay inside the base directory; the file is
then opened without following a symlink in its last component, and (on Linux) the opened file's real
path is checked again, so swapping a directory for a symlink between the check and the open does not
escape either. Only regular files are read (never a FIFO or a device, which could block or never
end), and only up to a size limit.

Runs inside a worker; the standard library and msgspec only.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
from typing import Annotated, Any

import msgspec

from atomictools._authoring import Context
from atomictools._errors import ToolError
from atomictoolsd.worker.declarative.handler import Handler
from atomictoolsd.worker.declarative.shell import resolve_dir
from atomictoolsd.worker.declarative.templates import PLACEHOLDER, TemplateError

__all__ = ["DEFAULT_MAX_SIZE", "FileReadHandler", "default_schema", "read_inside"]

DEFAULT_MAX_SIZE = 1024 * 1024
_BINARY_PROBE = 8192


def default_schema(where: str) -> dict[str, Any]:
    """The input schema of a file-read tool whose file gives none: ``path`` and a line range."""
    return {
        "type": "object",
        "properties": {
            "path": {"type": "string", "minLength": 1, "description": f"File to read, relative to {where}"},
            "start_line": {"type": "integer", "minimum": 1, "description": "First line to return (1-based)"},
            "end_line": {"type": "integer", "minimum": 1, "description": "Last line to return (inclusive)"},
        },
        "required": ["path"],
        "additionalProperties": False,
    }


def _inside(base: str, target: str) -> bool:
    return target == base or os.path.commonpath([base, target]) == base


def read_inside(
    base: str,
    path: str,
    max_size: int,
    start_line: int | None = None,
    end_line: int | None = None,
) -> str:
    """Read a text file that must lie inside ``base`` once every symlink is followed.

    Args:
        base: the directory the file must stay inside.
        path: the file, relative to ``base`` (an absolute path must point inside it too).
        max_size: the largest file read, in bytes; larger ones are refused with the limit named.
        start_line: the first line returned (1-based), default the first.
        end_line: the last line returned (inclusive), default the last.

    Raises:
        ToolError: the path escapes ``base``, is missing, not a regular file, too large or binary,
            or the line range is out of bounds.
    """
    if not isinstance(path, str) or not path or "\x00" in path:
        raise ToolError("Refused: the path must be a non-empty string without NUL bytes")
    base = os.path.realpath(base)
    target = os.path.realpath(os.path.join(base, path))
    if not _inside(base, target):
        raise ToolError(f"Refused: {path!r} resolves to {target}, outside {base}")
    try:
        fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ToolError(f"No such file: {path!r} (in {base})") from None
    except IsADirectoryError:
        raise ToolError(f"{path!r} is a directory, not a file") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ToolError(f"Refused: {path!r} changed into a symlink while it was being opened") from None
        raise ToolError(f"Cannot open {path!r}: {exc.strerror}") from None
    try:
        if sys.platform.startswith("linux"):
            try:
                opened = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                opened = target
            if not _inside(base, opened):
                raise ToolError(f"Refused: {path!r} resolves outside {base}")
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ToolError(f"{path!r} is not a regular file")
        if info.st_size > max_size:
            raise ToolError(f"Refused: {path!r} is {info.st_size} bytes; the limit is {max_size} bytes")
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = fh.read(max_size + 1)
    finally:
        os.close(fd)
    if len(data) > max_size:  # it grew after the check
        raise ToolError(f"Refused: {path!r} is larger than the limit of {max_size} bytes")
    if b"\x00" in data[:_BINARY_PROBE]:
        raise ToolError(f"{path!r} looks like a binary file; only text files are read")
    text = data.decode("utf-8", "replace")
    if start_line is None and end_line is None:
        return text
    lines = text.splitlines(keepends=True)
    first = 1 if start_line is None else start_line
    if first < 1 or (end_line is not None and end_line < first):
        raise ToolError(f"Invalid line range {first}-{end_line}: lines count from 1 and the end may not precede the start")
    if first > len(lines):
        raise ToolError(f"{path!r} has {len(lines)} lines; start_line {first} is past the end")
    return "".join(lines[first - 1 : end_line])


class FileReadHandler(Handler, tag="file-read"):
    """``{"type": "file-read", "basePath": "...", "maxSize": bytes}`` with arguments ``path``,
    ``start_line`` and ``end_line``."""

    base_path: Annotated[str, msgspec.Meta(description="the directory files are read from, without {{placeholders}}")]
    max_size: Annotated[int, msgspec.Meta(ge=1, description="a positive whole number of bytes")] = DEFAULT_MAX_SIZE

    def __post_init__(self) -> None:
        if not self.base_path:
            raise TemplateError("handler.basePath must be a non-empty string (the directory files are read from)")
        if PLACEHOLDER.search(self.base_path):
            raise TemplateError("handler.basePath cannot contain {{placeholders}}")
        self.params = ["path"]

    def derived_schema(self) -> dict[str, Any]:
        return default_schema(self.base_path)

    def default_annotations(self) -> dict[str, Any]:
        return {"readOnlyHint": True}

    def undeclared(self, param: str) -> str:
        return f"the handler reads argument {param} but inputSchema.properties does not declare {param!r}"

    def __call__(self, tool: str, args: dict[str, Any], ctx: Context) -> str:
        base = resolve_dir(self.base_path, ctx)
        if not os.path.isdir(base):
            raise ToolError(f"The base directory {base} does not exist")
        return read_inside(base, args.get("path", ""), self.max_size, args.get("start_line"), args.get("end_line"))
