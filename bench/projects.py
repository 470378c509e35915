"""Many projects over a daemon's life: what attaching one more costs, and what the daemon keeps.

    python bench/projects.py [--projects 400] [--idle-timeout 2]

An agent attaches the daemon to every repository it opens, so a daemon that runs for weeks sees
hundreds of directories. This attaches ``--projects`` distinct ones (each a git worktree without
tools of its own) one after another, each time ``atomic/attach`` + ``tools/list`` on a fresh
connection that then closes, and reports at checkpoints: the median time of those two requests over
the last 100 attaches, the projects the daemon holds, the directories it watches, the directories
it has rescanned in full, and its inotify watches.

Twice: with the default ``idle_timeout`` (600 s: every project is still held at the end, so the
watch set grows), and with ``--idle-timeout`` seconds (unused projects are forgotten as they go).

Prints tables and writes ``bench/results/projects-*.json``. No assertion: the figures go into
docs/performance.md.
"""

from __future__ import annotations

import argparse
import glob
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rawsocket import RawConnection  # noqa: E402

from common import DaemonUnderTest, print_table, save  # noqa: E402

CHECKPOINTS = (100, 200, 400, 800)


def inotify_watches(pid: int) -> int:
    total = 0
    for info in glob.glob(f"/proc/{pid}/fdinfo/*"):
        try:
            with open(info) as f:
                total += sum(1 for line in f if line.startswith("inotify wd:"))
        except OSError:
            pass
    return total


def run(count: int, extra_env: dict[str, str]) -> list[dict[str, Any]]:
    rows = []
    with DaemonUnderTest(extra_env=extra_env) as daemon:
        assert daemon.proc is not None
        times: list[float] = []
        for i in range(1, count + 1):
            project = daemon.root / "repos" / f"repo{i}"
            (project / ".git").mkdir(parents=True)
            with RawConnection(daemon.socket, timeout=None) as raw:
                started = time.perf_counter()
                raw.result("atomic/attach", {"directory": str(project)})
                raw.result("tools/list")
                times.append(time.perf_counter() - started)
            if i in CHECKPOINTS or i == count:
                time.sleep(1.0)  # let the watcher settle before looking
                with RawConnection(daemon.socket, timeout=None) as raw:
                    status = raw.result("atomic/status")
                rows.append({
                    "attached": i,
                    "attach_list_ms_p50_last100": round(statistics.median(times[-100:]) * 1000, 2),
                    "projects": len(status["projects"]),
                    "watched": len(status["watcher"]["watching"]),
                    "rescans": status["watcher"].get("rescans"),
                    "inotify_watches": inotify_watches(daemon.proc.pid),
                })
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--projects", type=int, default=400)
    parser.add_argument("--idle-timeout", type=float, default=2.0)
    args = parser.parse_args()
    results = {}
    for label, env in (
        ("idle_timeout 600 s (default)", {}),
        (f"idle_timeout {args.idle_timeout:g} s", {"ATOMICTOOLS_IDLE_TIMEOUT": str(args.idle_timeout)}),
    ):
        rows = run(args.projects, env)
        results[label] = rows
        print(f"\n{label}")
        print_table(
            ["attached", "attach+list p50 (last 100)", "projects held", "dirs watched", "full rescans", "inotify watches"],
            [[r["attached"], f"{r['attach_list_ms_p50_last100']} ms", r["projects"], r["watched"], r["rescans"],
              r["inotify_watches"]] for r in rows],
        )
    print(f"\nsaved {save('projects', {'projects': args.projects, 'results': results})}")


if __name__ == "__main__":
    main()
