"""The registry's load outcome is one typed union (``registry/outcome.py``): a runner's load, its
failures included, comes back as a case the scan matches on, never as an exception or a tuple."""

from __future__ import annotations

import asyncio
from typing import Any

from atomictoolsd.registry.outcome import Loaded, NotLoaded, NoWorker, load_outcome
from atomictoolsd.workers.pool import LoadFailure, SpawnError


def settle(load: Any) -> Any:
    return asyncio.run(load_outcome(load))


def test_each_way_a_load_ends_is_its_own_case() -> None:
    async def loads() -> tuple[object, list[dict[str, Any]], float]:
        return "the worker", [{"name": "t"}], 1.5

    async def fails() -> Any:
        raise LoadFailure("m.py", 3, "SyntaxError")

    async def cannot_start() -> Any:
        raise SpawnError("the fork server is gone")

    loaded = settle(loads())
    assert loaded == Loaded("the worker", [{"name": "t"}], 1.5)  # type: ignore[arg-type]
    match settle(fails()):
        case NotLoaded(failure=failure):
            assert failure.info["line"] == 3 and failure.by_module
        case other:
            raise AssertionError(other)
    match settle(cannot_start()):
        case NoWorker(error=error):
            assert "fork server" in str(error)
        case other:
            raise AssertionError(other)


def test_an_unexpected_error_is_not_swallowed() -> None:
    async def breaks() -> Any:
        raise KeyError("a bug")

    try:
        settle(breaks())
    except KeyError:
        return
    raise AssertionError("a bug became an outcome")
