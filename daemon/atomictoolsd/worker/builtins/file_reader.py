"""Built-in tool ``file-reader``: read a text file of the caller's project, never outside it."""

from __future__ import annotations

from typing import Annotated

from atomictools import Context, Field, tool
from atomictoolsd.worker.builtins._common import MAX_READ_BYTES, project_of
from atomictoolsd.worker.declarative.file_read import read_inside

__all__ = ["file_reader"]


@tool(name="file-reader", annotations={"readOnlyHint": True})
def file_reader(
    path: Annotated[str, Field("File to read, relative to the project root", min_length=1, max_length=4096)],
    ctx: Context,
    start_line: Annotated[int, Field("First line to return (1-based)", ge=1)] | None = None,
    end_line: Annotated[int, Field("Last line to return (inclusive)", ge=1)] | None = None,
) -> str:
    """Read a text file of the project (up to 1 MiB), whole or a range of lines. Paths that lead
    outside the project root, symlinks included, are refused."""
    return read_inside(str(project_of(ctx)), path, MAX_READ_BYTES, start_line, end_line)
