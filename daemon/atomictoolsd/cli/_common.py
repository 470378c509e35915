"""Helpers shared by the command modules: output formatting and the client connection."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

__all__ = ["connect", "not_running", "print_json", "table", "where"]


def print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, default=str))


def connect(args: argparse.Namespace, autostart: bool = True) -> Any:
    """A connected ``Client`` for the command's ``--directory`` (or the current directory)."""
    from atomictools import Client

    return Client(directory=getattr(args, "directory", None), autostart=autostart, agent="cli").connect()


def not_running() -> int:
    print("atomictoolsd is not running", file=sys.stderr)
    return 3


def where(error: dict[str, Any]) -> str:
    """``file:line`` of a load error (``file`` alone when the line is unknown)."""
    return f"{error['file']}:{error['line']}" if error.get("line") else error["file"]


def table(headers: list[str], rows: list[list[Any]]) -> None:
    """Print left-aligned columns."""
    cells = [headers, *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    for row in cells:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
