"""Helpers shared by the command modules: output formatting and the client connection."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from atomictoolsd.workers.processes import pid_alive, wait_gone

__all__ = [
    "EXIT_CODES", "EXIT_FAILED", "EXIT_NOT_RUNNING", "EXIT_USAGE",
    "connect", "not_running", "pid_alive", "print_json", "raw_request", "table", "wait_gone", "where",
]

# One meaning per code across every command, so a script can tell them apart (docs/cli.md).
EXIT_FAILED = 1  # what was asked failed: a tool's error result, a daemon that could not start
EXIT_USAGE = 2  # what was asked is wrong: bad arguments, an unknown tool, a bad configuration
EXIT_NOT_RUNNING = 3  # the daemon is not running, and this command does not start it

EXIT_CODES = """\
exit codes:
  0    done
  1    what was asked failed (a tool's error result, a daemon that could not start)
  2    what was asked is wrong (bad arguments, an unknown tool, a bad configuration)
  3    the daemon is not running (commands that do not start it: status)
  130  interrupted (Ctrl-C)
  141  the output pipe closed (`atomictoolsd logs | head`)"""


def print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, default=str))


def connect(args: argparse.Namespace, autostart: bool = True) -> Any:
    """A connected ``Client`` for the command's ``--directory`` (or the current directory)."""
    from atomictools import Client

    return Client(directory=getattr(args, "directory", None), autostart=autostart, agent="cli").connect()


def raw_request(method: str, timeout: float = 30.0) -> Any:
    """One request on the daemon's socket without attaching to a project; None if nothing answers."""
    import socket

    from atomictools._paths import socket_path

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(socket_path())
        sock.sendall(json.dumps({"jsonrpc": "2.0", "id": 1, "method": method}).encode() + b"\n")
        return json.loads(sock.makefile("rb").readline())["result"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    finally:
        sock.close()


def not_running() -> int:
    print("atomictoolsd is not running", file=sys.stderr)
    return EXIT_NOT_RUNNING


def where(error: dict[str, Any]) -> str:
    """``file:line`` of a load error (``file`` alone when the line is unknown)."""
    return f"{error['file']}:{error['line']}" if error.get("line") else error["file"]


def table(headers: list[str], rows: list[list[Any]]) -> None:
    """Print left-aligned columns."""
    cells = [headers, *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    for row in cells:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
