"""The registry's load outcome is one typed union (``registry/outcome.py``): a runner's load, its
failures included, comes back as a case the scan matches on, never as an exception or a tuple."""

from __future__ import annotations

import asyncio
from typing import Any

from atomictoolsd.pool.pool import LoadFailure, SpawnError
from atomictoolsd.registry.outcome import Loaded, NotLoaded, NoWorker, load_outcome


def settle(load: Any) -> Any:
    return asyncio.run(load_outcome("m.py", load))


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


def test_a_bug_while_loading_one_module_is_its_load_error_logged_and_tried_again(caplog: Any) -> None:
    # Not an exception out of the scan: that failed every other module's load and every attach.
    async def breaks() -> Any:
        raise TypeError("can only concatenate str (not \"NoneType\") to str")

    match settle(breaks()):
        case NotLoaded(failure=failure):
            assert failure.info["file"] == "m.py" and failure.info["line"] is None
            assert "TypeError: can only concatenate str" in failure.info["message"]
            assert "its log has the traceback" in failure.info["message"]
            assert not failure.by_module  # not cached: the next load tries again
        case other:
            raise AssertionError(other)
    [record] = [r for r in caplog.records if r.exc_info]
    assert "m.py" in record.getMessage() and record.exc_info[0] is TypeError
