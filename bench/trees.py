"""tools/call's p50 per process tree, pinned: a figure that where a tree's code landed does not move.

    python bench/trees.py                                # 8 trees each: atomictoolsd, with HTTP on, the floors
    python bench/trees.py --trees 12 --rounds 3
    python bench/trees.py --install before=/path/to/venv/bin/python   # another installed tree beside this one

Where address-space randomization puts a process tree's code decides how the processes of a call,
sharing one core and its branch predictor, get in each other's way. Most trees of the same code
measure within a microsecond of each other; some measure several microseconds slower for as long
as they live (up to ~10 µs for a daemon tree here, ~6 µs for a floor tree). ``calls.py`` pools the
samples of three trees, so one slow tree moves its p50. This script starts ``--trees`` trees of
each system, measures each ``--rounds`` times in a shuffled order (2,000 sequential echo calls a
time, the raw client), and reports each tree's median p50 and the median over the trees: the
typical tree, next to the slowest. Over the socket for every system; through the shim
(``atomictoolsd mcp``, which hands its stdio to the daemon, and ``--relay``, which copies every line)
for this tree, against the four-process floor (the floor relay behind ``peers/floor_stdio_relay.py``). ``--install LABEL=PYTHON`` adds socket trees of atomictoolsd run by
another interpreter or virtual environment (an installed older version).

Saves ``bench/results/trees-*.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402
from clients import Channel, measure_latency, socket_channel, stdio_channel  # noqa: E402
from common import CONSOLE, ECHO_TOOLS, DaemonUnderTest, FloorRelay, Report, Table, affinity, run_alone  # noqa: E402

CALLS = 2000
WARMUP = 2000
FLOOR_STDIO_RELAY = Path(__file__).resolve().parent / "peers" / "floor_stdio_relay.py"
SHIM = "atomictoolsd, through the shim"
RELAY = "atomictoolsd, through the shim, --relay"
FLOOR_SHIM = "floor, stdio relay in front"


def start_daemon(stack: contextlib.ExitStack, python: str, env: dict[str, str]) -> DaemonUnderTest:
    """A daemon run by ``python`` (DaemonUnderTest starts ``sys.executable``)."""
    own = common.sys.executable
    common.sys.executable = python
    try:
        daemon = DaemonUnderTest(tools=ECHO_TOOLS, extra_env=env).start()
    finally:
        common.sys.executable = own
    stack.callback(daemon.stop)
    return daemon


def opened(stack: contextlib.ExitStack, channel: Channel) -> Channel:
    stack.callback(channel.close)
    channel.handshake()
    measure_latency(channel, 1, WARMUP)
    return channel


def trees(count: int, rounds: int, installs: dict[str, str]) -> Report:
    systems: dict[str, tuple[str, dict[str, str]] | None] = {
        "atomictoolsd": (sys.executable, {}),
        "atomictoolsd, HTTP on": (sys.executable, {"ATOMICTOOLS_HTTP": "127.0.0.1:0"}),
        **{label: (python, {}) for label, python in installs.items()},
        "floor": None,
    }
    report = Report("trees", data={"trees": count, "rounds": rounds, "calls": CALLS, "installs": installs})
    with affinity(True), contextlib.ExitStack() as stack:
        channels: list[tuple[str, Channel]] = []
        for _ in range(count):
            for name, how in systems.items():
                if how is None:
                    floor = stack.enter_context(FloorRelay())
                    channels.append((name, opened(stack, socket_channel(str(floor.socket)))))
                    command = [sys.executable, "-I", "-S", str(FLOOR_STDIO_RELAY), str(floor.socket)]
                    channels.append((FLOOR_SHIM, opened(stack, stdio_channel(command)[1])))
                    continue
                daemon = start_daemon(stack, *how)
                channels.append((name, opened(stack, socket_channel(str(daemon.socket)))))
                if name == "atomictoolsd":
                    for label, relaying in ((SHIM, []), (RELAY, ["--relay"])):
                        shim = stdio_channel([CONSOLE, "mcp", *relaying], env=daemon.env, cwd=daemon.project)[1]
                        channels.append((label, opened(stack, shim)))
        p50s: list[list[float]] = [[] for _ in channels]
        for _ in range(rounds):
            order = list(range(len(channels)))
            random.shuffle(order)
            for index in order:
                p50s[index].append(statistics.median(measure_latency(channels[index][1], CALLS, 100).samples) * 1e6)
    per_tree: dict[str, list[float]] = {}
    for (name, _channel), values in zip(channels, p50s, strict=True):
        per_tree.setdefault(name, []).append(round(statistics.median(values), 1))
    report.data["per_tree_p50_us"] = per_tree
    for title, floor_name in (("over the socket", "floor"), ("through the shim", FLOOR_SHIM)):
        floor_p50 = statistics.median(per_tree[floor_name])
        rows: list[list[Any]] = []
        for name, values in per_tree.items():
            if (name in (SHIM, RELAY, FLOOR_SHIM)) != (floor_name == FLOOR_SHIM):
                continue
            typical = round(statistics.median(values), 1)
            rows.append([name, typical, round(typical / floor_p50, 2), min(values), max(values), " ".join(f"{v:g}" for v in sorted(values))])
        report.tables.append(Table(
            f"trees-{title.split()[-1]}", f"tools/call {title}, p50 per process tree, pinned",
            ["system", "median tree µs", "× the floor's", "fastest tree", "slowest tree", "every tree's p50 µs"], rows,
            [f"{count} trees of each, {rounds} turns of {CALLS} calls to each, in a shuffled order; a tree's p50 is the median of its turns."],
        ))
    return report


def measure(quick: bool) -> Report:
    """``run.py``'s entry: eight trees of each, two turns (a quick run: four trees, one turn)."""
    return trees(4 if quick else 8, 1 if quick else 2, {})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trees", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="four trees of each, one turn (as run.py --quick)")
    parser.add_argument("--install", action="append", default=[], metavar="LABEL=PYTHON",
                        help="also trees of atomictoolsd run by this interpreter (another installed version)")
    args = parser.parse_args()
    installs = dict(item.split("=", 1) for item in args.install)
    run_alone(trees(4, 1, installs) if args.quick else trees(args.trees, args.rounds, installs))


if __name__ == "__main__":
    main()
