"""bench/scale.py: measuring the workers' memory survives a worker that exits meanwhile (the idle
reaper, a retired generation), instead of ending the benchmark run with psutil.NoSuchProcess."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import psutil

BENCH = Path(__file__).resolve().parents[2] / "bench"


def load_scale() -> ModuleType:
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location("bench_scale", BENCH / "scale.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_worker_gone_while_measured_is_left_out() -> None:
    scale = load_scale()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        processes = [psutil.Process(live.pid), psutil.Process(gone.pid)]
        gone.wait(10)  # reaped: its pid no longer names a process
        out = scale.memory_of(psutil.Process(), processes)
    finally:
        live.kill()
        live.wait(10)
    assert out["workers"] == 1
    assert out["workers_rss_mb_each"] > 0 and out["workers_uss_mb_total"] > 0
