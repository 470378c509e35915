"""The ``okExitCodes`` key of a ``shell`` handler: which exit codes of its command are not failures.

``grep`` exits 1 when it finds nothing, ``diff`` when files differ: for a tool, that is an answer,
not an error. Standard library only (runs inside a worker, and at load in the daemon's checks).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from atomictoolsd.declarative.templates import TemplateError

__all__ = ["ok_exit_codes"]


def ok_exit_codes(handler: Mapping[str, Any]) -> frozenset[int]:
    """The handler's ``okExitCodes`` (default ``[0]``). Raises ``TemplateError`` when unusable."""
    codes = handler.get("okExitCodes", [0])
    if (
        not isinstance(codes, list) or not codes
        or any(isinstance(c, bool) or not isinstance(c, int) or not 0 <= c <= 255 for c in codes)
    ):
        raise TemplateError(
            f"handler.okExitCodes must be a non-empty list of exit codes from 0 to 255, e.g. [0, 1]; got {codes!r}"
        )
    return frozenset(codes)
