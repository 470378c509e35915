"""A worker's memory limit, applied inside the worker, and the words that explain hitting it.

Two guards enforce ``memory_limit_mb``. Inside the worker, an rlimit makes an allocation past the
limit fail, so the tool gets a ``MemoryError`` and its caller a result that names the limit; the
worker lives on. In the daemon, an RSS watch (``monitor``) kills a worker whose resident memory
passes the limit by ways an rlimit does not count (shared mappings, for one).

On Linux the rlimit is ``RLIMIT_DATA``: it counts the heap and private writable mappings, but not
address space that is only reserved (``RLIMIT_AS`` counts the 64 MiB arena glibc reserves for each
thread, so 16 threads would exhaust a modest limit without allocating anything). Elsewhere it is
``RLIMIT_AS``, which macOS does not enforce; there the RSS watch is the guard.

Runs inside workers: standard library only.
"""

from __future__ import annotations

import sys

try:  # imported with the runtime in the fork server, not after each fork
    import resource
except ImportError:  # not a Unix
    resource = None  # type: ignore[assignment]

__all__ = ["apply_memory_limit", "describe_limit", "memory_error_text"]

_MIB = 1024 * 1024


def describe_limit(limit: int) -> str:
    """``"the worker memory limit of 512 MiB (memory_limit_mb)"``: what a user can look up and change."""
    return f"the worker memory limit of {limit / _MIB:g} MiB (memory_limit_mb)"


def apply_memory_limit(limit: int) -> bool:
    """Cap this process's memory at ``limit`` bytes (soft and hard: a tool cannot raise it). False
    when the platform refuses."""
    if limit <= 0 or resource is None:
        return False
    which = resource.RLIMIT_DATA if sys.platform.startswith("linux") else resource.RLIMIT_AS
    try:
        _soft, hard = resource.getrlimit(which)
        if hard != resource.RLIM_INFINITY and hard < limit:
            limit = hard
        resource.setrlimit(which, (limit, limit))
    except (OSError, ValueError):
        return False
    return True


def memory_error_text(tool: str, limit: int) -> str:
    """The result text for a tool that raised ``MemoryError``."""
    if limit > 0:
        return f"Tool {tool!r} ran out of memory: it tried to allocate past {describe_limit(limit)}"
    return f"Tool {tool!r} ran out of memory (MemoryError)"
