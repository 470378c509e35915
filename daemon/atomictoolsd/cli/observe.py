"""Commands to see what the daemon does and how it is set: ``logs`` and ``config``.

Both work without a running daemon: ``logs`` reads the event log files, ``config`` reads the
configuration the way the daemon does at start.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any

from atomictoolsd.cli._common import print_json, table
from atomictoolsd.config.levels import DAEMON_LOG_LEVELS

__all__ = ["register"]


def cmd_logs(args: argparse.Namespace) -> int:
    """Print the event log (``-f``: and follow it), filtered by tool and least severe level."""
    from atomictoolsd.config.levels import LEVEL_RANK
    from atomictoolsd.config.paths import Paths
    from atomictoolsd.eventlog.reader import (
        CAUGHT_UP,
        follow_events,
        format_event,
        log_files,
        read_events,
    )

    log_dir = Paths.from_env().log_dir
    minimum = LEVEL_RANK[args.level]

    tool_modules: set[str] = set()  # the modules the tool's calls ran in, as the log shows them

    def of_tool(event: dict[str, Any]) -> bool:
        if event.get("tool") == args.tool:
            if event.get("module"):
                tool_modules.add(str(event["module"]))
            return True
        # What a tool prints is logged per module (a worker's output has no call to name): the tool's
        # module is the one its calls ran in, or the file it is named after (`noisy` in noisy.py).
        module = event.get("module")
        if event.get("event") != "tool.output" or not module:
            return False
        stem = os.path.splitext(os.path.basename(str(module)))[0]
        return module in tool_modules or args.tool == stem or args.tool.startswith(stem + "_")

    def wanted(event: dict[str, Any]) -> bool:
        if LEVEL_RANK.get(str(event.get("level")), 20) < minimum:
            return False
        if args.tool is not None and not of_tool(event):
            return False
        if args.event is not None and not str(event.get("event", "")).startswith(args.event):
            return False
        return True

    def show(items: Iterable[dict[str, Any]]) -> None:
        for event in items:
            print(json.dumps(event) if args.json else format_event(event), flush=args.follow)

    if not args.follow:
        if not log_files(log_dir):
            print(f"no log yet in {log_dir} (the daemon writes it once it runs)", file=sys.stderr)
            return 0
        matching: Iterator[dict[str, Any]] = (e for e in read_events(log_dir) if wanted(e))
        show(deque(matching, maxlen=args.lines) if args.lines is not None else matching)
        return 0
    # Follow: the rotated files, then the current one from its start, with no gap before new events.
    history: deque[dict[str, Any]] = deque(maxlen=args.lines)  # -n 0: only what comes from now on
    history.extend(e for e in read_events(log_dir, backups_only=True) if wanted(e))
    try:
        stream = follow_events(log_dir)
        for event in stream:
            if event is CAUGHT_UP:
                break
            if wanted(event):
                history.append(event)
        show(history)
        show(e for e in stream if wanted(e))
    except KeyboardInterrupt:
        return 0
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    """Print every setting's effective value and where it came from; exit 2 on a bad configuration."""
    from atomictoolsd.config.paths import Paths
    from atomictoolsd.config.settings import load_config

    config_file = Paths.from_env().config_file
    config = load_config(config_file)  # a bad one is a SetupError: cli.main prints it, exit 2
    items = config.describe()
    if args.json:
        print_json({"file": str(config_file), "exists": config_file.exists(), "settings": items,
                    "ignored": dict(config.ignored)})
        return 0
    print(f"config file: {config_file}{'' if config_file.exists() else ' (does not exist: defaults apply)'}")
    print()
    table(
        ["SETTING", "VALUE", "FROM", "MEANING"],
        [[i["key"], json.dumps(i["value"]), i["source"], i["doc"]] for i in items],
    )
    file_only = [i["key"] for i in items if i["env"] is None]
    print("\nEach setting can be set in the file, or by the variable ATOMICTOOLS_<SETTING>"
          + (f" (but {', '.join(file_only)}: the file only)" if file_only else "")
          + "; a running daemon rereads the file on SIGHUP.")
    for note in config.ignored.values():
        print(f"note: {note}")
    return 0


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def register(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    logs = commands.add_parser("logs", help="show the daemon's event log")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing new events")
    logs.add_argument("--tool", metavar="NAME", help="only events of this tool, and what its module printed")
    logs.add_argument("--event", metavar="PREFIX", help="only events whose name starts so (tool., module., worker.)")
    logs.add_argument(
        "--level", choices=DAEMON_LOG_LEVELS, default="debug",
        help="least severe level to show (default: all)",
    )
    logs.add_argument(
        "-n", "--lines", type=_count, default=None, metavar="N",
        help="only the last N matching events (with -f, -n 0 prints only new ones)",
    )
    logs.add_argument("--json", action="store_true", help="print the JSON lines as they are")
    logs.set_defaults(func=cmd_logs)

    config = commands.add_parser(
        "config", help="show the effective configuration and where each value came from",
        description="Print every setting: its value, where the value came from (default, the config "
        "file, or an ATOMICTOOLS_<SETTING> variable) and what it means, read the way the daemon reads "
        "it at start. Works without a running daemon. Exits 2 when the configuration is bad.",
    )
    config.add_argument("--json", action="store_true", help="print JSON")
    config.set_defaults(func=cmd_config)
