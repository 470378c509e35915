"""What ``atomictoolsd call`` shows and asks on the terminal while a tool runs: its progress, and
the questions it asks (``ctx.elicit``), on stderr and stdin, so stdout keeps only the result.

Without a terminal nothing is shown, and a question fails at once with a message saying why: a
script piping ``call`` must never hang on a prompt nobody sees.
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

from atomictools import Elicitation

__all__ = ["Progress", "ask_on_terminal", "NoTerminal"]


class NoTerminal(Exception):
    """A tool asked a question, and there is no terminal to ask it on."""


def _terminal() -> TextIO:
    """stderr itself, under the CLI's escaping wrapper (``cli._common.EscapingStream``): the line
    control written here is this module's own, and every text of a tool's in it is escaped first."""
    return getattr(sys.stderr, "stream", sys.stderr)


class Progress:
    """Each progress report of the call as one line on the terminal, rewritten in place."""

    def __init__(self, out: TextIO | None = None) -> None:
        self.out = out or _terminal()
        self.shown = False

    def __call__(self, progress: float, total: float | None, message: str | None) -> None:
        done = f"{progress:g}/{total:g}" if total else f"{progress:g}"
        line = f"[{done}] {message}" if message else f"[{done}]"
        self.out.write("\r\x1b[2K" + _printable(line)[:200])
        self.out.flush()
        self.shown = True

    def clear(self) -> None:
        """Remove the progress line before the result is printed."""
        if self.shown:
            self.out.write("\r\x1b[2K")
            self.out.flush()
            self.shown = False


def ask_on_terminal(message: str, schema: dict[str, Any]) -> Elicitation | dict[str, Any]:
    """Ask the user what a tool's ``ctx.elicit`` wants, one field at a time (stderr, stdin).

    Returns the answer, or a decline when the user ends the input (Ctrl-D).

    Raises:
        NoTerminal: stdin or stderr is not a terminal; the tool gets this as its question's error.
    """
    if not (sys.stdin.isatty() and sys.stderr.isatty()):
        print(f"atomictoolsd: the tool asks: {_printable(message)!r}, but there is no terminal to answer on; "
              f"the question was refused", file=sys.stderr)
        raise NoTerminal("no terminal to ask the user on (atomictoolsd call runs without one)")
    _terminal().write(f"\r\x1b[2K{_printable(message)}\n")
    required = set(schema.get("required") or [])
    answers: dict[str, Any] = {}
    for name, field in (schema.get("properties") or {}).items():
        try:
            value = _ask_field(name, field, name in required)
        except EOFError:
            print(file=sys.stderr)
            return Elicitation("decline")
        if value is not None:
            answers[name] = value
    return answers


def _ask_field(name: str, field: dict[str, Any], required: bool) -> Any:
    """One field's answer, asked until it reads as the field's type; None for an optional one left empty."""
    kind = field.get("type", "string")
    choices = field.get("enum")
    label = _printable(str(field.get("title") or name))
    hints = [f"one of {', '.join(map(str, choices))}"] if choices else []
    if kind == "boolean":
        hints.append("y/n")
    if "default" in field:
        hints.append(f"default {field['default']}")
    prompt = f"  {label}{' (' + '; '.join(hints) + ')' if hints else ''}{'' if required else ' [optional]'}: "
    if field.get("description"):
        print(f"  {_printable(str(field['description']))}", file=sys.stderr)
    while True:
        sys.stderr.write(prompt)
        sys.stderr.flush()
        text = sys.stdin.readline()
        if not text:
            raise EOFError
        text = text.strip()
        if not text:
            if "default" in field:
                return field["default"]
            if not required:
                return None
            print("  an answer is required", file=sys.stderr)
            continue
        try:
            return _read_as(kind, text, choices)
        except ValueError as exc:
            print(f"  {exc}", file=sys.stderr)


def _read_as(kind: str, text: str, choices: list[Any] | None) -> Any:
    if kind == "boolean":
        if text.lower() in ("y", "yes", "true", "1"):
            return True
        if text.lower() in ("n", "no", "false", "0"):
            return False
        raise ValueError("answer y or n")
    if kind == "integer":
        value: Any = int(text)
    elif kind == "number":
        value = float(text)
    else:
        value = text
    if choices and value not in choices:
        raise ValueError(f"answer one of {', '.join(map(str, choices))}")
    return value


def _printable(text: str) -> str:
    """``text`` with control characters shown as escapes: a tool's words must not drive the terminal."""
    return "".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in text)
