"""How a person runs this installation's ``atomictoolsd``, for the commands messages suggest.

A message that suggests ``atomictoolsd trust …`` must run as printed: after the README's install the
command is in the venv's ``bin``, which is often not on ``PATH``. Standard library only, and no
daemon state: the CLI, the registry and the trust store all ask it.
"""

from __future__ import annotations

import os
import shutil
import sys

__all__ = ["command_name", "installed_command"]


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
    found = shutil.which("atomictoolsd")
    if script is None:
        return "atomictoolsd" if found else f"{sys.executable} -m atomictoolsd"
    if found and os.path.realpath(found) == os.path.realpath(script):
        return "atomictoolsd"
    return script
