"""The stdio relay an agent launches (``atomictoolsd mcp``): ``relay`` is all of it.

Standard library only, so it starts fast and never pays for the daemon's imports. ``main`` is here
too because bridge scripts written by earlier versions import ``atomictoolsd.shim.main``.
"""

from atomictoolsd.shim.relay import main

__all__ = ["main"]
