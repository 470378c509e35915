"""Bridge commands: ``bridge create``, ``bridge list``, ``bridge remove``.

The daemon writes and tracks the bridge scripts (``atomictoolsd.bridges.scripts``); these commands ask it
over the socket and print what an agent's config needs.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from atomictoolsd.cli._common import connect, print_json, table

__all__ = ["register"]

_CONFIG_PLACES = {
    "claude": ".mcp.json (project) or ~/.claude.json",
    "opencode": "opencode.json",
    "codex": "~/.codex/config.toml",
    "copilot": "~/.copilot/mcp-config.json",
    "cursor": ".cursor/mcp.json or ~/.cursor/mcp.json",
    "generic": "your MCP client's server list",
}


def _dispatcher(args: argparse.Namespace) -> bool:
    # As for `connect`: an agent that does not surely re-list tools gets the meta-tools by default.
    from atomictoolsd.bridges.agents import INFO

    if args.dispatcher is not None:
        return bool(args.dispatcher)
    return args.agent in INFO and INFO[args.agent].dispatcher


def cmd_create(args: argparse.Namespace) -> int:
    """Ask the daemon for a bridge script; print the config snippet on stdout, the rest on stderr."""
    from atomictools._errors import ConnectError, RPCError

    params = {
        "agent": args.agent,
        "directory": os.path.abspath(args.directory or os.getcwd()),
        "allow": args.allow,
        "deny": args.deny,
        "dispatcher": _dispatcher(args),
        "name": args.name,
    }
    if args.owner_pid is not None:
        params["ownerPid"] = args.owner_pid
    try:
        with connect(args) as client:
            bridge = client.request("atomic/bridges/create", params)
    except RPCError as exc:
        print(f"atomictoolsd: {exc.message}", file=sys.stderr)
        return 2
    except ConnectError as exc:
        print(f"atomictoolsd: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print_json(bridge)
        return 0
    owner = f" or when pid {bridge['ownerPid']} exits" if bridge.get("ownerPid") else ""
    print(f"bridge {bridge['id']}: {bridge['path']} (deleted when the daemon stops{owner})", file=sys.stderr)
    print(f"add this to {_CONFIG_PLACES[args.agent]}:", file=sys.stderr)
    print(bridge["snippet"].rstrip("\n"))
    if args.agent == "claude":
        print(f"or run: claude mcp add --transport stdio {args.name} -- {bridge['path']}", file=sys.stderr)
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from atomictools._errors import ConnectError

    try:
        with connect(args, autostart=False) as client:
            bridges = client.request("atomic/bridges/list")["bridges"]
    except ConnectError:
        bridges = []  # no daemon, no bridges: it deletes them when it stops
    if args.json:
        print_json({"bridges": bridges})
        return 0
    if not bridges:
        print("no bridges")
        return 0
    table(
        ["ID", "AGENT", "DIRECTORY", "OWNER", "CREATED", "PATH"],
        [
            [b["id"], b["agent"], b["directory"], b["ownerPid"] or "-",
             time.strftime("%H:%M:%S", time.localtime(b["created"])), b["path"]]
            for b in bridges
        ],
    )
    return 0


def cmd_remove(args: argparse.Namespace) -> int:
    from atomictools._errors import ConnectError, RPCError

    try:
        with connect(args, autostart=False) as client:
            ids = [b["id"] for b in client.request("atomic/bridges/list")["bridges"]] if args.all else args.ids
            for bridge_id in ids:
                removed = client.request("atomic/bridges/remove", {"id": bridge_id})["removed"]
                print(f"removed bridge {bridge_id} ({removed['path']})")
    except RPCError as exc:
        print(f"atomictoolsd: {exc.message}", file=sys.stderr)
        return 2
    except ConnectError:
        print("atomictoolsd is not running, so there are no bridges", file=sys.stderr)
        return 0 if args.all else 2
    return 0


def register(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from atomictoolsd.bridges.agents import BRIDGE_AGENTS

    bridge = commands.add_parser("bridge", help="bridges: generated scripts that start the shim for an agent (deleted when the daemon stops)")
    actions = bridge.add_subparsers(dest="action", metavar="ACTION", required=True)

    create = actions.add_parser("create", help="write a bridge script and print the agent's config snippet")
    create.add_argument("--agent", required=True, choices=BRIDGE_AGENTS, help="whose config shape to print")
    create.add_argument("--directory", "-C", help="project directory (default: the current one)")
    create.add_argument("--allow", action="append", default=[], metavar="GLOB", help="serve only matching tools")
    create.add_argument("--deny", action="append", default=[], metavar="GLOB", help="never serve matching tools")
    meta = create.add_mutually_exclusive_group()
    meta.add_argument("--dispatcher", dest="dispatcher", action="store_true", default=None,
                      help="add the meta-tools (default for agents that do not surely re-list tools)")
    meta.add_argument("--no-dispatcher", dest="dispatcher", action="store_false", help="no meta-tools")
    create.add_argument("--owner-pid", type=int, metavar="PID", help="delete the bridge when this process exits")
    create.add_argument("--name", default="atomic", help="the server's name in the snippet (default: atomic)")
    create.add_argument("--json", action="store_true", help="print the bridge as JSON")
    create.set_defaults(func=cmd_create)

    listing = actions.add_parser("list", help="list the bridges the daemon generated")
    listing.add_argument("--json", action="store_true", help="print JSON")
    listing.set_defaults(func=cmd_list)

    remove = actions.add_parser("remove", help="delete bridges now")
    remove.add_argument("ids", nargs="*", metavar="ID", help="bridge ids (see bridge list)")
    remove.add_argument("--all", action="store_true", help="every bridge")
    remove.set_defaults(func=cmd_remove)
