"""The daemon's start and memory with HTTP off, on, and before HTTP existed.

    python bench/daemonstart.py                 # 20 starts of each, pinned and unpinned
    python bench/daemonstart.py --quick
    python bench/daemonstart.py --before REV    # the tree before HTTP (default: b8a6c63)

Serving Streamable HTTP must cost nothing while it is off: httptools and the transport's modules are
imported only when the ``http`` setting is on (tests/e2e/test_http_security.py checks that by ``-X importtime``).
This measures what that promise is about, side by side in one run, the three taken in turns: the
daemon of this tree with HTTP off, the same with HTTP on, and the daemon of the tree before HTTP
was added (``git archive`` of ``--before`` into a temporary dir, run with its ``client/`` and
``daemon/`` first on the path). For each: spawn → ready (the daemon says its socket serves), and
its memory once a client has listed the tools (RSS, and USS: the pages only it holds).
"""

from __future__ import annotations

import argparse
import io
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import MODES, ROOT, DaemonUnderTest, Report, Stats, Table, affinity, run_alone  # noqa: E402

BEFORE = "b8a6c63"  # the merge d4808b7 (Streamable HTTP) was made on
OFF, ON = "this tree, HTTP off", "this tree, HTTP on"


def export(rev: str, into: Path) -> Path:
    """The ``client/`` and ``daemon/`` of ``rev``, written under ``into`` (no worktree, no checkout)."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "client", "daemon"], capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


def one_start(source: Path | None, http: bool) -> tuple[float, float, float]:
    """Spawn → ready in seconds, then RSS and USS in MB after a ``tools/list``."""
    daemon = DaemonUnderTest(extra_env={"ATOMICTOOLS_HTTP": "127.0.0.1:0"} if http else None, source=source)
    try:
        daemon.start()
        daemon.request("tools/list")
        info = psutil.Process(daemon.pid).memory_full_info()
        assert daemon.ready_s is not None
        return daemon.ready_s, info.rss / 2**20, info.uss / 2**20
    finally:
        daemon.stop()


def measure(quick: bool = False, before: str = BEFORE) -> Report:
    runs = 5 if quick else 20
    before_name = f"before HTTP ({before})"
    report = Report("daemonstart", data={"runs": runs, "before": before})
    rows: list[list[Any]] = []
    with tempfile.TemporaryDirectory(prefix="atb-before-") as tmp:
        tree = export(before, Path(tmp))
        systems = ((before_name, tree, False), (OFF, None, False), (ON, None, True))
        for mode, pinned in MODES:
            ready: dict[str, Stats] = {name: Stats() for name, _, _ in systems}
            rss: dict[str, list[float]] = {name: [] for name, _, _ in systems}
            uss: dict[str, list[float]] = {name: [] for name, _, _ in systems}
            with affinity(pinned):
                for _, source, http in systems:  # one warm-up each: the page cache, .pyc files
                    one_start(source, http)
                for _ in range(runs):
                    for name, source, http in systems:
                        took, resident, own = one_start(source, http)
                        ready[name].samples.append(took)
                        rss[name].append(resident)
                        uss[name].append(own)
            base = ready[before_name].ms()["p50_ms"]
            report.data[mode] = {}
            for name, _, _ in systems:
                r = ready[name].ms()
                memory = round(statistics.median(rss[name]), 1), round(statistics.median(uss[name]), 1)
                report.data[mode][name] = {**r, "rss_mb": memory[0], "uss_mb": memory[1]}
                rows.append([name, mode, r["n"], r["p50_ms"], r["p99_ms"], round(r["p50_ms"] / base, 2), *memory])
    report.tables.append(Table(
        "daemon-http", "daemon start and memory: HTTP off, HTTP on, and before HTTP existed",
        ["daemon", "mode", "n", "spawn → ready p50 ms", "p99 ms", "p50 × before", "RSS MB", "USS MB"],
        rows,
        [f"{runs} starts of each, taken in turns, one global tool module; memory (median) after one tools/list. "
         f"'before HTTP' is the tree at {before}, run from a git archive."],
    ))
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    parser.add_argument("--before", default=BEFORE, help=f"the revision before HTTP (default {BEFORE})")
    args = parser.parse_args()
    if shutil.which("git") is None:
        parser.error("git is needed to export the tree before HTTP")
    run_alone(measure(args.quick, args.before))


if __name__ == "__main__":
    main()
