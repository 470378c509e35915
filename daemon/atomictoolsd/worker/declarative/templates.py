"""``{{param}}`` placeholders: finding them in a template, and turning argument values into text.

Every value that reaches a command line, a URL or a header passes through ``value_text``, which is
where the limits every handler shares are enforced: no NUL byte (it would end a C string early and
cannot appear in an argument), at most ``MAX_VALUE_CHARS`` characters.

Runs inside a worker; standard library only.
"""

from __future__ import annotations

import json
import re
import sys
import time
from typing import Any

__all__ = [
    "MAX_VALUE_CHARS",
    "PLACEHOLDER",
    "SHELL_METACHARACTERS",
    "TemplateError",
    "ValueRejected",
    "log",
    "placeholders",
    "value_text",
]

# A parameter name as JSON Schema properties are usually named: letters, digits, '_' and '-'.
PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_-]*)\s*\}\}")

MAX_VALUE_CHARS = 10_000

# Characters a shell would act on. No shell ever runs, so they are harmless here; a value that
# carries them is still worth a line in the log, since it may be an injection attempt.
SHELL_METACHARACTERS = frozenset(";|&$`<>()\n\r*?[]{}!#~'\"\\")


class TemplateError(Exception):
    """A template in a declarative tool file cannot be used; the message says why."""


class ValueRejected(Exception):
    """An argument value may not be substituted (NUL byte, too long); the message names the parameter."""


def placeholders(template: str) -> list[str]:
    """The parameter names a template refers to, in order of first use, each once."""
    seen: dict[str, None] = {}
    for match in PLACEHOLDER.finditer(template):
        seen.setdefault(match.group(1), None)
    return list(seen)


def value_text(name: str, value: Any) -> str:
    """The text a value stands for in a template.

    Strings as they are, ``true``/``false`` for booleans, JSON for numbers, lists and objects.

    Raises:
        ValueRejected: the text holds a NUL byte or is longer than ``MAX_VALUE_CHARS`` characters.
    """
    if isinstance(value, str):
        text = value
    elif isinstance(value, bool):
        text = "true" if value else "false"
    elif value is None:
        text = ""
    else:
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    if "\x00" in text:
        raise ValueRejected(f"parameter {name!r} contains a NUL byte, which is not allowed")
    if len(text) > MAX_VALUE_CHARS:
        raise ValueRejected(
            f"parameter {name!r} is {len(text)} characters long; the limit is {MAX_VALUE_CHARS}"
        )
    return text


def log(level: str, message: str) -> None:
    """Write a line to the worker's stderr, in the daemon's format: the daemon's event log takes it
    as a ``tool.output`` warning of the module."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    sys.stderr.write(f"{stamp} {level.upper()} atomictoolsd.declarative: {message}\n")
    sys.stderr.flush()
