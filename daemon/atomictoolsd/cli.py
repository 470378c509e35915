"""The ``atomictoolsd`` command.

Each subcommand is a ``cmd_<name>`` function taking the parsed arguments and returning an exit
code. Heavy imports happen inside the commands, so ``atomictoolsd mcp`` (which agents spawn for
every session) stays cheap to start.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from atomictoolsd import __version__

__all__ = ["main"]


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=False, default=str))


def _client(args: argparse.Namespace, autostart: bool = True) -> Any:
    from atomictools import Client

    return Client(directory=getattr(args, "directory", None), autostart=autostart, agent="cli").connect()


def _not_running() -> int:
    print("atomictoolsd is not running", file=sys.stderr)
    return 3


# -- daemon lifecycle ----------------------------------------------------------------------------


def cmd_serve(args: argparse.Namespace) -> int:
    """Run the daemon in the foreground (``--detach``: in the background, as ``start`` does)."""
    if args.detach and os.fork() > 0:
        os._exit(0)  # the daemon continues in the child, which no shell or agent waits for

    import logging

    import uvloop

    from atomictoolsd.config import ConfigError, load_config
    from atomictoolsd.paths import Paths, PathError
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
        uvloop.run(Server(paths, config).serve(ready_fd=args.ready_fd))
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
        with _client(args, autostart=False) as client:
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
        with _client(args, autostart=False) as client:
            status = client.status()
    except ConnectError:
        return _not_running()
    if args.json:
        _print_json(status)
        return 0
    print(f"atomictoolsd {status['version']}  pid {status['pid']}  up {_duration(status['uptime'])}")
    print(f"socket   {status['socket']}")
    print(f"sessions {len(status['sessions'])}  fork server pid {status['forkserver']['pid']}")
    modules = status["modules"]
    if modules:
        print()
        _table(
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
                print(f"\n{_where(m['error'])}: {m['error']['message']}")
    return 0


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def _where(error: dict[str, Any]) -> str:
    return f"{error['file']}:{error['line']}" if error.get("line") else error["file"]


def _table(headers: list[str], rows: list[list[Any]]) -> None:
    cells = [headers, *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    for row in cells:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())


# -- tools -----------------------------------------------------------------------------------------


def cmd_list(args: argparse.Namespace) -> int:
    """List the tools visible from a directory, with their source; errors of modules that failed."""
    from atomictools._errors import ConnectError

    try:
        with _client(args) as client:
            listing = client.request("atomic/list", {"all": args.all})
    except ConnectError as exc:
        print(f"atomictoolsd: {exc}", file=sys.stderr)
        return 1
    if args.json:
        out = {"tools": listing["tools"], "errors": listing["errors"], "counts": listing["counts"]}
        if args.all:
            out["shadowed"] = listing["shadowed"]
        _print_json(out)
        return 0
    rows = [[t["name"], t["source"], _first_line(t.get("description", ""))] for t in listing["tools"]]
    if args.all:
        rows += [
            [t["name"], f"{t['source']} (shadowed by {t['shadowedBy']['source']})", _first_line(t.get("description", ""))]
            for t in listing["shadowed"]
        ]
    if rows:
        _table(["NAME", "SOURCE", "DESCRIPTION"], rows)
    else:
        print(f"no tools (write one in {os.path.join(listing['root'] or '~', '.atomic', 'tools')}/)")
    counts = ", ".join(f"{n} {source}" for source, n in sorted(listing["counts"].items()))
    if counts:
        print(f"\n{len(listing['tools'])} tools: {counts}")
    if listing["errors"]:
        print(f"\n{len(listing['errors'])} module(s) failed to load:")
        for error in listing["errors"]:
            print(f"  {_where(error)}: {error['message']}")
    return 0


def _first_line(text: str, width: int = 72) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= width else line[: width - 1] + "…"


def parse_call_arguments(pairs: list[str], schema: dict[str, Any]) -> dict[str, Any]:
    """``key=value`` pairs as tool arguments: strings where the schema wants a string, else JSON.

    Raises:
        ValueError: a pair has no ``=``.
    """
    properties = schema.get("properties", {})
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ValueError(f"expected key=value, got {pair!r}")
        if _wants_string(properties.get(key, {})):
            out[key] = value
            continue
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value  # let the tool's validation say what it expected
    return out


def _wants_string(prop: dict[str, Any]) -> bool:
    if prop.get("type") == "string":
        return True
    options = prop.get("anyOf", [])
    return bool(options) and all(o.get("type") in ("string", "null") for o in options) and any(
        o.get("type") == "string" for o in options
    )


def cmd_call(args: argparse.Namespace) -> int:
    """Call a tool and print its text; exit 1 when the result is an error."""
    from atomictools._errors import ConnectError, RPCError

    try:
        with _client(args) as client:
            tools = {t["name"]: t for t in client.list_tools()}
            schema = tools.get(args.name, {}).get("inputSchema", {})
            try:
                arguments = json.loads(args.json) if args.json else {}
                arguments.update(parse_call_arguments(args.arguments, schema))
            except (ValueError, AttributeError) as exc:
                print(f"atomictoolsd: bad arguments: {exc}", file=sys.stderr)
                return 2
            result = client.call_tool(args.name, arguments, timeout=args.timeout)
    except RPCError as exc:
        print(f"atomictoolsd: {exc.message}", file=sys.stderr)
        return 2
    except ConnectError as exc:
        print(f"atomictoolsd: {exc}", file=sys.stderr)
        return 1
    print(result.text)
    return 1 if result.is_error else 0


# -- parser --------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="atomictoolsd",
        description="Serve Python tool modules from .atomic/tools/ to AI coding agents.",
    )
    parser.add_argument("--version", action="version", version=f"atomictoolsd {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True

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

    listing = commands.add_parser("list", help="list the tools visible from a directory")
    listing.add_argument("--directory", "-C", help="project directory (default: the current one)")
    listing.add_argument("--all", action="store_true", help="include shadowed tools")
    listing.add_argument("--json", action="store_true", help="print JSON")
    listing.set_defaults(func=cmd_list)

    call = commands.add_parser("call", help="call a tool and print its result")
    call.add_argument("name", help="tool name")
    call.add_argument("arguments", nargs="*", metavar="key=value", help="arguments (values parsed as JSON unless the tool wants a string)")
    call.add_argument("--json", metavar="ARGS", help="arguments as one JSON object")
    call.add_argument("--directory", "-C", help="project directory (default: the current one)")
    call.add_argument("--timeout", type=float, help="seconds this call may run")
    call.set_defaults(func=cmd_call)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return 130
