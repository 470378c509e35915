"""bench/spawn.py's figure for the spawn target: each worker times its own start after the fork, its
module's import apart, only in a fork server started with ``SPAWN_TIMES_ENV`` (which the tool never
sees); a fork server started without it times nothing."""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import uvloop

from atomictoolsd.pool.pool import PoolSettings
from atomictoolsd.worker.forkserver import SPAWN_TIMES_ENV

BENCH = Path(__file__).resolve().parents[2] / "bench"

# Takes a clear ~20 ms to import, and notes whether the timing variable reached the tool.
MODULE = """import os, time
time.sleep(0.02)
open({seen!r}, "w").write(str({name!r} in os.environ))

def tiny() -> str:
    return "tiny"
"""


def test_each_worker_times_its_start_after_the_fork_without_its_import(tmp_path: Path) -> None:
    sys.path.insert(0, str(BENCH))  # bench/ is not a package: its modules import each other by name
    bench = importlib.import_module("spawn")
    seen = tmp_path / "seen"
    module = tmp_path / "tiny.py"
    module.write_text(MODULE.format(seen=str(seen), name=SPAWN_TIMES_ENV))
    spec = PoolSettings.from_config(spill_dir=str(tmp_path / "spill")).worker_spec(str(module), "python", str(tmp_path))
    records = tmp_path / "records"

    timed = bench.after_fork(spec, 3, str(records))
    assert len(timed["start"]) == 3, timed
    assert all(0.02 <= i < 1 for i in timed["import"]), timed["import"]  # the module's sleep is the import's
    assert all(0 < s < 1 for s in timed["start"]), timed["start"]
    assert all(f > 0 for f in timed["faults"]) and all(f > 0 for f in timed["first_faults"]), timed
    assert seen.read_text() == "False", "the tool saw the bench's variable"
    assert SPAWN_TIMES_ENV not in os.environ

    uvloop.run(bench.fork_server(spec, 2))  # a fork server started without it
    assert not records.exists(), "a worker timed its start in a fork server that was not asked to"
