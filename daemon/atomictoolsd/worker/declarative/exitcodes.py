"""The ``okExitCodes`` key of a ``shell`` handler: which exit codes of its command are not failures.

``grep`` exits 1 when it finds nothing, ``diff`` when files differ: for a tool, that is an answer,
not an error. Runs inside a worker; msgspec checks the key as the file is decoded.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

__all__ = ["OkExitCodes"]

ExitCode = Annotated[int, msgspec.Meta(ge=0, le=255)]
OkExitCodes = Annotated[
    list[ExitCode],
    msgspec.Meta(min_length=1, description="a non-empty list of exit codes from 0 to 255, e.g. [0, 1]"),
]
