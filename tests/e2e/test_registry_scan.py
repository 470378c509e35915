"""The registry's scans with real workers, driven in process: what a scan decides when the files
change while it waits for its directory's lock (the watcher and a client's reload can both ask)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from atomictoolsd.pool.pool import PoolSettings, WorkerPool
from atomictoolsd.registry.projects import Registry


def test_a_scan_asks_what_to_hold_after_it_lists_the_directory(tmp_path: Path) -> None:
    """The watcher holds a missing module file back for a grace period (an editor may be about to
    put it back). A file deleted while the scan waits for its lock must be judged as the scan will
    see it — missing, so held — not as it was when the scan was asked for, which removed its tools
    at once (found as a flaky test_a_vanished_file_holds_back_only_itself on a busy machine)."""
    home = tmp_path / "home"
    tools = home / ".atomic" / "tools"
    tools.mkdir(parents=True)
    gone = tools / "gone.py"
    gone.write_text("def gone() -> str:\n    return 'gone'\n")
    (tools / "kept.py").write_text("def kept() -> str:\n    return 'kept'\n")

    async def scenario() -> tuple[list[bool], set[str]]:
        pool = WorkerPool(PoolSettings.from_config(spill_dir=str(tmp_path / "spill")))
        registry = Registry(pool, home)
        tools_dir = registry.global_dir
        try:
            await registry.scan(tools_dir)
            assert set(tools_dir.modules) == {str(gone), str(tools / "kept.py")}
            looks: list[bool] = []

            def hold() -> set[str]:
                looks.append(gone.exists())
                return set() if gone.exists() else {str(gone)}

            async with tools_dir.lock:  # a scan of this directory is under way
                scan = asyncio.ensure_future(registry.scan(tools_dir, skip=hold))
                await asyncio.sleep(0.05)
                gone.unlink()
            await scan
            return looks, set(tools_dir.modules)
        finally:
            await pool.close()

    looks, modules = asyncio.run(scenario())
    assert looks == [False], "asked once, after the deletion the scan saw"
    assert str(gone) in modules, "held: its tools stay through the grace"
