"""The built-in tools: a package of ordinary tool modules that the daemon serves as its ``builtin``
tools dir (lowest precedence: a user tool of the same name shadows one; ``builtins = false`` in the
configuration turns them off).

They run in workers like any tool module, never in the daemon. Files starting with ``_`` are the
helpers they share, not modules.
"""

from pathlib import Path

__all__ = ["BUILTIN_DIR"]

BUILTIN_DIR = Path(__file__).resolve().parent
