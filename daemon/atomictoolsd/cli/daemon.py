"""Daemon lifecycle commands: serve, start, stop, restart, status."""

from __future__ import annotations

import argparse
import os
import sys
import time

from atomictoolsd.cli._common import connect, not_running, print_json, table, where

__all__ = ["register"]


def cmd_serve(args: argparse.Namespace) -> int:
    """Run the daemon in the foreground (``--detach``: in the background, as ``start`` does)."""
    if args.detach and os.fork() > 0:
        os._exit(0)  # the daemon continues in the child, which no shell or agent waits for

    import logging

    import uvloop

    from atomictoolsd.bridges import Bridges
    from atomictoolsd.config import ConfigError, load_config
    from atomictoolsd.paths import PathError, Paths
    from atomictoolsd.server import AlreadyRunning, Server

    paths = Paths.from_env()
    try:
        config = load_config(paths.config_file)
    except ConfigError as exc:
        print(f"atomictoolsd: bad configuration: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=config.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        server = Server(paths, config)
        server.components.append(Bridges())
        uvloop.run(server.serve(ready_fd=args.ready_fd))
    except AlreadyRunning as exc:
        print(f"atomictoolsd: {exc}", file=sys.stderr)
        return 0
    except PathError as exc:
        print(f"atomictoolsd: {exc}", file=sys.stderr)
        return 1
    return 0


def cmd_start(args: argparse.Namespace) -> int:
    """Start the daemon in the background; return once its socket serves."""
    from atomictools._autostart import start_daemon
    from atomictools._errors import ConnectError
    from atomictools._paths import socket_path

    try:
        state, pid = start_daemon()
    except ConnectError as exc:
        print(f"atomictoolsd: {exc}", file=sys.stderr)
        return 1
    if state == "running":
        print(f"atomictoolsd is already running (pid {pid}) on {socket_path()}")
    else:
        print(f"atomictoolsd started (pid {pid}) on {socket_path()}")
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    """Stop the daemon: calls in flight finish first (within the configured grace)."""
    from atomictools._errors import ConnectError

    try:
        with connect(args, autostart=False) as client:
            pid = client.request("atomic/shutdown")["pid"]
    except ConnectError:
        print("atomictoolsd is not running")
        return 0
    deadline = time.monotonic() + 60
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    if _alive(pid):
        print(f"atomictoolsd (pid {pid}) is still stopping", file=sys.stderr)
        return 1
    print(f"atomictoolsd stopped (pid {pid})")
    return 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is gone for our purposes (its parent has not reaped it yet)
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().split(b") ", 1)[1][:1] != b"Z"
    except (OSError, IndexError):
        return True


def cmd_restart(args: argparse.Namespace) -> int:
    code = cmd_stop(args)
    return code or cmd_start(args)


def cmd_status(args: argparse.Namespace) -> int:
    """Show the daemon's state: process, sessions, modules and their workers."""
    from atomictools._errors import ConnectError

    try:
        with connect(args, autostart=False) as client:
            status = client.status()
    except ConnectError:
        return not_running()
    if args.json:
        print_json(status)
        return 0
    print(f"atomictoolsd {status['version']}  pid {status['pid']}  up {_duration(status['uptime'])}")
    print(f"socket   {status['socket']}")
    print(f"sessions {len(status['sessions'])}  fork server pid {status['forkserver']['pid']}")
    modules = status["modules"]
    if modules:
        print()
        table(
            ["MODULE", "SCOPE", "STATE", "TOOLS", "WORKER", "CALLS", "ERRORS", "P50 MS"],
            [
                [
                    m["path"], m["scope"], m["state"], len(m["tools"]), m["worker"] or "-",
                    m["calls"], m["errors"], "-" if m["p50_ms"] is None else m["p50_ms"],
                ]
                for m in modules
            ],
        )
        for m in modules:
            if m["error"]:
                print(f"\n{where(m['error'])}: {m['error']['message']}")
            for problem in m.get("problems", []):  # tools a module skipped (a malformed JSON tool)
                tool = f" tool {problem['tool']!r}:" if problem.get("tool") else ""
                print(f"\n{where(problem)}:{tool} {problem['message']}")
    return 0


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def register(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    serve = commands.add_parser("serve", help="run the daemon in the foreground")
    serve.add_argument("--detach", action="store_true", help=argparse.SUPPRESS)
    serve.add_argument("--ready-fd", type=int, default=None, help=argparse.SUPPRESS)
    serve.set_defaults(func=cmd_serve)

    commands.add_parser("start", help="start the daemon in the background").set_defaults(func=cmd_start)
    commands.add_parser("stop", help="stop the daemon").set_defaults(func=cmd_stop)
    commands.add_parser("restart", help="stop, then start the daemon").set_defaults(func=cmd_restart)

    status = commands.add_parser("status", help="show the daemon's state")
    status.add_argument("--json", action="store_true", help="print JSON")
    status.set_defaults(func=cmd_status)
