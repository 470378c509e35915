"""Helpers shared by the command modules: output formatting and the client connection.

What the CLI prints comes from files a repository wrote (a project's path, a tool's name, a load
error, a tool's output) and goes to a terminal, which acts on escape sequences: a path can clear the
screen or forge a line. ``safe`` escapes one value (a newline too) where it is printed;
``shown_command`` quotes a command so that it still runs when pasted; and ``main`` prints through
``EscapingStream``, which escapes every control character but newlines and tabs in whatever is left.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from atomictoolsd.config.command import shell_quote
from atomictoolsd.config.discovery import escape_path
from atomictoolsd.util.processes import pid_alive, wait_gone

__all__ = [
    "EXIT_CODES", "EXIT_FAILED", "EXIT_NOT_RUNNING", "EXIT_USAGE", "EscapingStream",
    "connect", "not_running", "pid_alive", "print_json", "raw_request", "safe", "shown_command", "table", "wait_gone",
    "where",
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


# Every control character (C0 but tab and newline, DEL, C1), the invisible ones that reorder or hide
# text, and the surrogates that stand for bytes that are not UTF-8.
_CONTROLS = "\\x00-\\x08\\x0b-\\x1f\\x7f-\\x9f\\u061c\\u200b-\\u200f\\u202a-\\u202e\\u2060-\\u2069\\ufeff\\ud800-\\udfff"
_IN_TEXT = re.compile(f"[{_CONTROLS}]")
_IN_A_VALUE = re.compile(f"[\\t\\n{_CONTROLS}]")


def _escaped(match: re.Match[str]) -> str:
    return escape_path(match.group())  # as Python writes it: \\x1b, \\n, \\u202e, \\xff for a byte


def safe(value: object) -> str:
    """``value`` as one line fit for a terminal: control and invisible characters, tabs and newlines
    among them, escaped as Python writes them (``\\x1b``, ``\\n``, ``\\u202e``). Backslashes are left
    as they are, so that escaping twice changes nothing and a quoted command still runs."""
    return _IN_A_VALUE.sub(_escaped, str(value))


def shown_command(argv: Sequence[str]) -> str:
    """A command line to print: each argument quoted so that the line runs as printed when pasted into
    a shell (``config.command.shell_quote``), and none of it acted on by the terminal."""
    return " ".join(shell_quote(arg) for arg in argv)


class EscapingStream:
    """A text stream that writes through to ``stream`` with every control character but newlines and
    tabs escaped: the last guard of all the CLI prints (``cli.main`` wraps stdout and stderr), for
    the text no ``safe`` met (a tool's output, a load error's message)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        self.stream.write(_IN_TEXT.sub(_escaped, text))
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


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
    """``file:line`` of a load error (``file`` alone when the line is unknown), escaped."""
    return f"{safe(error['file'])}:{error['line']}" if error.get("line") else safe(error["file"])


def table(headers: list[str], rows: list[list[Any]]) -> None:
    """Print left-aligned columns."""
    cells = [headers, *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    for row in cells:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
