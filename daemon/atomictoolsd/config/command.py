"""How a person runs this installation's ``atomictoolsd``, for the commands messages suggest.

A message that suggests ``atomictoolsd trust …`` must run as printed: after the README's install the
command is in the venv's ``bin``, which is often not on ``PATH``. Standard library only, and no
daemon state: the CLI, the registry and the trust store all ask it.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys

__all__ = ["add_own_bin_to_path", "command_name", "installed_command", "shell_quote", "with_own_bin"]

# The PATH this process was given, before ``add_own_bin_to_path``: what the user's shell finds.
_given_path: str | None = None


def installed_command() -> str | None:
    """The ``atomictoolsd`` script next to this interpreter (the venv's ``bin``), if there is one."""
    # sys.executable unresolved: a venv's python is a symlink to the base interpreter, whose bin
    # holds no atomictoolsd.
    script = os.path.join(os.path.dirname(sys.executable), "atomictoolsd")
    return script if os.access(script, os.X_OK) else None


def command_name() -> str:
    """``atomictoolsd`` when ``PATH`` finds this installation's script, else its full path (or
    ``python -m atomictoolsd`` when no script was installed)."""
    script = installed_command()
    found = shutil.which("atomictoolsd", path=_given_path)
    if script is None:
        return "atomictoolsd" if found else f"{sys.executable} -m atomictoolsd"
    if found and os.path.realpath(found) == os.path.realpath(script):
        return "atomictoolsd"
    return script


# In $'…' quoting (bash, zsh, ksh; POSIX.1-2024): what stands for itself needs no escape but these.
_ANSI_C = {"\\": "\\\\", "'": "\\'", "\n": "\\n", "\t": "\\t", "\r": "\\r"}


def shell_quote(arg: str) -> str:
    """``arg`` quoted for a shell, fit to be printed: ``shlex.quote`` when every character of it is
    printable; else ``$'…'`` with the others escaped (``\\x1b``, ``\\n``, ``\\u202e``; a byte that is
    not UTF-8 as ``\\xff``), so that the command pasted into bash or zsh names the same path and the
    terminal it is printed on acts on none of it.
    """
    if arg.isprintable():
        return shlex.quote(arg)
    out = []
    for char in arg:
        code = ord(char)
        if char in _ANSI_C:
            out.append(_ANSI_C[char])
        elif 0xDC80 <= code <= 0xDCFF:  # a byte os.fsdecode could not decode
            out.append(f"\\x{code - 0xDC00:02x}")
        elif char.isprintable():
            out.append(char)
        elif code < 0x80:
            out.append(f"\\x{code:02x}")
        elif code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    return "$'" + "".join(out) + "'"


def with_own_bin(path: str) -> str:
    """``path`` without its entries that are not absolute, and with this interpreter's bin directory
    (the venv's) appended when it is missing.

    The daemon's workers run programs by name (``ruff``, ``pytest``); installed into the daemon's venv
    they are found even when the venv is not activated, and the user's own ``PATH`` still comes first.
    An empty or relative entry (``.``, ``bin``) names a directory of wherever a program is started:
    a command a tool runs in a project would find the project's own ``grep`` there.
    """
    own = os.path.dirname(sys.executable)
    entries = [e for e in path.split(os.pathsep) if os.path.isabs(e)]
    if not any(os.path.normpath(e) == os.path.normpath(own) for e in entries):
        entries.append(own)
    return os.pathsep.join(entries)


def add_own_bin_to_path() -> None:
    """``with_own_bin`` on this process's ``PATH`` (its workers inherit it); ``command_name`` still
    judges by the ``PATH`` the process was given, the one the user's commands run with."""
    global _given_path
    if _given_path is None:
        _given_path = os.environ.get("PATH", os.defpath)
    os.environ["PATH"] = with_own_bin(_given_path)
