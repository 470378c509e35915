"""Agent commands: ``mcp`` (the stdio shim), ``connect`` and ``disconnect``.

``atomictoolsd mcp`` never reaches this module when run from the command line: ``cli.main()`` hands
it to the shim before argparse loads. It is registered here so that ``--help`` lists it.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from atomictoolsd.cli._common import safe, shown_command

__all__ = ["register"]

def cmd_mcp(args: argparse.Namespace) -> int:
    from atomictoolsd.shim.relay import main as shim_main

    return shim_main(args.shim_args)


def _target(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from atomictoolsd.bridges import agents

    scope = args.scope or agents.DEFAULT_SCOPE[args.agent]
    return agents.config_file(args.agent, scope, home=_home(), root=_project_root(args))


def _backup_dir() -> Path:
    from atomictoolsd.config.paths import Paths

    return Paths.from_env().state_dir / "backups"


def entry_environment(agent: str, scope: str) -> dict[str, str]:
    """What the entry carries besides the command: a user entry's runtime pin (a project file holds
    no path of this machine)."""
    from atomictoolsd.bridges import agents

    return {} if scope == "project" else agents.runtime_pin()


def cmd_connect(args: argparse.Namespace) -> int:
    """Write the agent's MCP config so that it launches the shim."""
    from atomictools._protocol import check_tool_name
    from atomictoolsd.bridges import agents

    problem = check_tool_name(args.name)
    if problem:
        print(f"atomictoolsd: --name: {problem}", file=sys.stderr)
        return 2
    try:
        target = _target(args)
    except agents.AgentConfigError as exc:
        print(f"atomictoolsd: {exc}", file=sys.stderr)
        return 2
    if args.approve or args.trust_folder:
        return _consent(args, target)
    command = agents.entry_command(args.agent, target.scope, dispatcher=args.dispatcher, allow=args.allow,
                                   deny=args.deny)
    env = entry_environment(args.agent, target.scope)
    if args.http:
        try:
            if args.agent not in agents.HTTP_AGENTS:
                agents.http_entry(args.agent, "")  # says why this agent cannot, before asking the daemon
            url = _http_url(args, target)
            entry = agents.http_entry(args.agent, url)
        except agents.AgentConfigError as exc:
            print(f"atomictoolsd: {exc}", file=sys.stderr)
            return 2
        command = [url]
    else:
        entry = agents.server_entry(args.agent, command, env)
    text = agents.snippet(args.agent, command, args.name, env, entry=entry)
    if args.dry_run:
        print(f"# {safe(target.path)}", file=sys.stderr)
        print(text)
        return 0
    try:
        outcome = agents.add_server(target, entry, name=args.name, backup_dir=_backup_dir())
    except (agents.AgentConfigError, OSError) as exc:
        print(f"atomictoolsd: {exc}", file=sys.stderr)
        print(f"the entry to add by hand:\n{text}", file=sys.stderr)
        return 1
    info = agents.INFO[args.agent]
    approved = _approve_written(args, target)
    if outcome.action == "unchanged":
        print(f"{info.title} is already connected: server {args.name!r} in {safe(outcome.path)}")
    else:
        print(f"{info.title}: {outcome.action} server {args.name!r} in {safe(outcome.path)}")
        print(f"  {_serves(args, target)}")
        print(f"  {'url' if args.http else 'runs'}: {safe(command[0]) if args.http else shown_command(command)}")
        if args.http:
            print(f"  the token is read from ${agents.TOKEN_VARIABLE} where the agent runs: "
                  f"export {agents.TOKEN_VARIABLE}=$(atomictoolsd http token --show)")
        if outcome.backup is not None:
            print(f"  previous file saved as {safe(outcome.backup)}")
    if approved is not None:
        print(f"  {approved}")
    for note in connect_notes(args, target):
        print(f"  note: {note}")
    if outcome.action != "unchanged":
        print(f"Restart {info.title} (or reload its MCP servers) to use the tools; "
              f"`atomictoolsd doctor {args.agent}` checks the entry.")
    return 0


def _http_url(args: argparse.Namespace, target) -> str:  # type: ignore[no-untyped-def]
    """The daemon's HTTP endpoint with this entry's project and lists in the query (docs/http.md)."""
    from urllib.parse import urlencode

    from atomictoolsd.bridges import agents
    from atomictoolsd.cli._common import raw_request

    http = (raw_request("atomic/status") or {}).get("http") or {}
    if not http.get("url"):
        raise agents.AgentConfigError(
            "the daemon does not serve HTTP: start it with `atomictoolsd start --http PORT` (or set http in "
            "config.toml), then connect again"
        )
    query: list[tuple[str, str]] = []
    root = _http_project(args)
    if root is not None:  # a URL names its project: the daemon cannot follow the agent's directory
        query.append(("directory", str(root)))
    query += [("allow", glob) for glob in args.allow] + [("deny", glob) for glob in args.deny]
    if agents.INFO[args.agent].dispatcher if args.dispatcher is None else args.dispatcher:
        query.append(("dispatcher", "1"))
    return http["url"] + ("?" + urlencode(query, safe="/") if query else "")


def connect_notes(args: argparse.Namespace, target) -> list[str]:  # type: ignore[no-untyped-def]
    """What the user still has to do for the entry to work (``doctor`` checks the same)."""
    import shutil

    from atomictoolsd.bridges import agent_trust, agents

    notes = []
    if target.scope != "project":
        return notes
    if shutil.which(agents.PROJECT_PROGRAM) is None:
        notes.append(
            f"{agents.PROJECT_PROGRAM!r} is not on your PATH, and this project entry runs it from there (so "
            f"that it works on a teammate's machine too): install it with `pipx install atomictoolsd` or "
            f"`uv tool install atomictoolsd`, or connect with --user"
        )
    agent, root, home = args.agent, _project_root(args), _home()
    if agent == "claude":
        approval = agent_trust.claude_approval(root, args.name, home)
        if approval.needs_trust:
            notes.append(f"Claude Code shows it as Pending approval until you trust the folder ({approval.detail}): "
                         f"run `atomictoolsd connect claude --trust-folder`, or `claude` in {safe(root)} and accept "
                         f"its prompts")
        elif approval.state != "approved":
            notes.append(f"Claude Code does not start it: {approval.detail}")
    elif agent in agent_trust.TRUSTING_AGENTS and not agent_trust.folder_trusted(agent, root, home):
        title = agents.INFO[agent].title
        notes.append(f"{title} reads a project's MCP servers only in folders you trust, and {safe(root)} is not one: "
                     f"run `atomictoolsd connect {agent} --trust-folder` (as its trust prompt does), or `{agent}` "
                     f"there and trust the folder")
    return notes


def _home() -> Path:
    return Path(os.environ.get("HOME") or Path.home())


def _project_root(args: argparse.Namespace) -> Path:
    """The project ``connect`` works for: the one of ``--directory``, or of the current directory."""
    from atomictoolsd.config.discovery import project_root

    return project_root(Path(args.directory or os.getcwd()).resolve(), _home())


def _approve_written(args: argparse.Namespace, target) -> str | None:  # type: ignore[no-untyped-def]
    """Approve the project server ``connect claude`` wrote, as Claude Code's prompt does: the user
    asked for it by connecting. What was done, in words (None: nothing to approve)."""
    from atomictoolsd.bridges import agent_trust, agents

    if args.agent != "claude" or target.scope != "project":
        return None
    try:
        outcome = agent_trust.approve_claude_server(_project_root(args), args.name, backup_dir=_backup_dir())
    except (agents.AgentConfigError, OSError) as exc:
        return f"not approved: {exc}"
    done = "approved in" if outcome.changed else "approved already in"
    return f"{done} {safe(outcome.path)} (enabledMcpjsonServers), as Claude Code's prompt does"


def _consent(args: argparse.Namespace, target) -> int:  # type: ignore[no-untyped-def]
    """``--approve`` and ``--trust-folder``: the agent's approval of the project's server and its
    trust of the project folder, written where its own prompts write them; the entry is left as it is."""
    from atomictoolsd.bridges import agent_trust, agents

    if args.http or args.allow or args.deny or args.dispatcher is not None or args.dry_run:
        print("atomictoolsd: --approve and --trust-folder change only the agent's approval and trust, not the "
              "entry: run connect without them to write the entry", file=sys.stderr)
        return 2
    info = agents.INFO[args.agent]
    root = _project_root(args)
    try:
        if args.approve:
            if args.agent != "claude" or target.scope != "project":
                raise agents.AgentConfigError("--approve is for Claude Code's project servers (.mcp.json): the other "
                                              "agents, and user entries, need no approval")
            if agents.read_server(target, args.name) is None:
                print(f"atomictoolsd: no server {args.name!r} in {safe(target.path)}: run `atomictoolsd connect "
                      f"claude` (it approves what it writes)", file=sys.stderr)
                return 1
            outcome = agent_trust.approve_claude_server(root, args.name, backup_dir=_backup_dir())
            print(f"{info.title}: server {args.name!r} {'approved' if outcome.changed else 'was approved already'} in "
                  f"{safe(outcome.path)}")
        if args.trust_folder:
            if args.agent not in agent_trust.TRUSTING_AGENTS:
                raise agents.AgentConfigError(f"{info.title} has no folder trust of its own: nothing to trust")
            outcome = agent_trust.trust_folder(args.agent, root, _home(), backup_dir=_backup_dir())
            print(f"{info.title}: {'now trusts' if outcome.changed else 'trusted already'} {safe(root)} "
                  f"({safe(outcome.path)}), as when you accept its trust prompt: it applies that folder's own "
                  f"settings and servers")
    except (agents.AgentConfigError, OSError) as exc:
        print(f"atomictoolsd: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, agents.AgentConfigError) else 1
    if args.agent == "claude" and target.scope == "project":
        approval = agent_trust.claude_approval(root, args.name, _home())
        print(f"  `claude mcp list`: {'connects to' if approval.state == 'approved' else 'does not start'} "
              f"{args.name!r} ({approval.detail})")
        if args.trust_folder:
            print("  note: Claude Code rewrites ~/.claude.json while it runs: if it was running, quit it and run "
                  "this again")
    return 0


def _http_project(args: argparse.Namespace) -> Path | None:
    """The project an HTTP entry serves: the one ``connect`` runs in (or ``-C``), whatever the
    entry's scope; None from the home directory or a directory in no project (no ``.git``,
    ``.atomic`` or agent config around it)."""
    from atomictools._paths import project_area
    from atomictoolsd.config.discovery import project_root

    home = Path(os.environ.get("HOME") or Path.home()).resolve()
    root = project_root(Path(args.directory or os.getcwd()).resolve(), home)
    return None if root == home or project_area(str(root)) is None else root


def _serves(args: argparse.Namespace, target) -> str:  # type: ignore[no-untyped-def]
    """Which project the entry is for, said outright: run from the wrong directory, a project entry
    lands in some other repository (this checkout, say), and only the path would hint at it."""
    from atomictoolsd.config.discovery import (
        local_tools_dir,
        project_root,
    )

    home = Path(os.environ.get("HOME") or Path.home())
    if args.http:
        root = _http_project(args)
        if root is None:
            return "for no project: your global tools only (run connect in a project, or -C DIR, for its tools)"
        scope = " in every session of the agent, wherever it runs" if target.scope != "project" else ""
        return (f"for the project {root}{scope}: its tools in {local_tools_dir(root)}/ and your global tools "
                f"(a URL names one project; connect without --http for an entry that follows the agent's directory)")
    if target.scope != "project":
        return ("for every project: the agent's sessions get the tools of the project they run in "
                "(its .atomic/tools/) and your global tools")
    root = project_root(Path(args.directory or os.getcwd()).resolve(), home)
    return f"for the project {safe(root)}: its tools in {safe(local_tools_dir(root))}/ and your global tools (-C DIR for another)"


def cmd_disconnect(args: argparse.Namespace) -> int:
    """Remove exactly the entry ``connect`` wrote."""
    from atomictoolsd.bridges import agents

    try:
        target = _target(args)
        outcome = agents.remove_server(target, name=args.name, backup_dir=_backup_dir())
    except (agents.AgentConfigError, OSError) as exc:
        print(f"atomictoolsd: {exc}", file=sys.stderr)
        return 1
    name = agents.INFO[args.agent].title
    if outcome.action == "absent":
        print(f"{name} was not connected: no server {args.name!r} in {safe(outcome.path)}")
        return 0
    print(f"{name}: removed server {args.name!r} from {safe(outcome.path)}")
    if outcome.backup is not None:
        print(f"  previous file saved as {safe(outcome.backup)}")
    if args.agent == "claude" and target.scope == "project":
        from atomictoolsd.bridges import agent_trust

        try:
            withdrawn = agent_trust.withdraw_claude_approval(_project_root(args), args.name, backup_dir=_backup_dir())
        except (agents.AgentConfigError, OSError) as exc:
            print(f"  its approval stays: {exc}")
        else:
            if withdrawn.changed:
                print(f"  and its approval from {safe(withdrawn.path)}")
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    """Check each connected agent's entry the way that agent starts it; exit 1 on any problem."""
    from atomictoolsd.cli import doctor
    from atomictoolsd.config.discovery import project_root

    home = Path(os.environ.get("HOME") or Path.home())
    directory = Path(args.directory or os.getcwd()).resolve()
    root = project_root(directory, home)
    reports = doctor.diagnose(args.agent, directory, home=home, root=root)
    print(doctor.render(reports, args.json))
    if not args.json:
        environment = doctor.render_environment(doctor.project_environment(root, home))
        if environment:
            print(environment)
    return 0 if reports and all(r.ok for r in reports) else 1


def _agent_options(parser: argparse.ArgumentParser) -> None:
    from atomictoolsd.bridges.agents import AGENTS

    parser.add_argument("agent", choices=AGENTS, help="the agent whose MCP config to change")
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument("--project", dest="scope", action="store_const", const="project",
                       help="the project's config file (the default where the agent has one)")
    scope.add_argument("--user", dest="scope", action="store_const", const="user",
                       help="your user-wide config file (default for codex, copilot, claude-desktop)")
    parser.add_argument("--directory", "-C", help="a directory of the project (default: the current one)")
    parser.add_argument("--name", default="atomic", help="the server's name in the config (default: atomic)")


def register(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    mcp = commands.add_parser(
        "mcp", help="run the stdio MCP server agents launch (see: atomictoolsd mcp --help)", add_help=False
    )
    mcp.add_argument("shim_args", nargs=argparse.REMAINDER)
    mcp.set_defaults(func=cmd_mcp)

    connect = commands.add_parser(
        "connect", help="add atomictoolsd to an agent's MCP config",
        description="Add an `atomic` server to the agent's MCP config file, keeping everything else in "
        "it (the previous file is backed up). The project is the one of --directory (default: the "
        "current directory); the command says which file it wrote.",
    )
    _agent_options(connect)
    connect.add_argument("--allow", action="append", default=[], metavar="GLOB", help="serve only tools whose name matches GLOB (repeat it for more globs)")
    connect.add_argument("--deny", action="append", default=[], metavar="GLOB",
                         help="never serve tools whose name matches GLOB (repeat it for more globs)")
    dispatcher = connect.add_mutually_exclusive_group()
    dispatcher.add_argument("--dispatcher", dest="dispatcher", action="store_true", default=None,
                            help="add the meta-tools for agents that do not surely re-list tools "
                            "(default for claude, codex, gemini, qwen, claude-desktop)")
    dispatcher.add_argument("--no-dispatcher", dest="dispatcher", action="store_false",
                            help="no meta-tools, even for an agent that gets them by default")
    connect.add_argument("--http", action="store_true",
                         help="connect by URL to the daemon's Streamable HTTP endpoint (it must serve HTTP: "
                         "`start --http PORT`), the token read from $ATOMICTOOLS_TOKEN; see docs/http.md")
    connect.add_argument("--dry-run", action="store_true", help="print the entry instead of writing it")
    connect.add_argument("--approve", action="store_true",
                         help="Claude Code: only approve the project's existing .mcp.json server (--name) in "
                         ".claude/settings.local.json, as its prompt does (connect approves what it writes)")
    connect.add_argument("--trust-folder", action="store_true",
                         help="only mark the project folder trusted in the agent's own store (claude, gemini, qwen, "
                         "codex), as its trust prompt does: it then applies that folder's settings and servers")
    connect.set_defaults(func=cmd_connect)

    disconnect = commands.add_parser("disconnect", help="remove atomictoolsd from an agent's MCP config")
    _agent_options(disconnect)
    disconnect.set_defaults(func=cmd_disconnect)

    from atomictoolsd.bridges.agents import AGENTS

    doctor = commands.add_parser(
        "doctor", help="check agents' entries the way each agent starts the shim",
        description="For each agent whose config holds an atomictoolsd entry (or AGENT): the entry is well "
        "formed, its command exists, the shim starts with that agent's environment, answers initialize and "
        "lists this directory's tools from your CLI's daemon; the folder is trusted where the agent asks; "
        "the agent re-lists tools or has the dispatcher. Exit status 0 when all is fine, 1 otherwise.",
    )
    doctor.add_argument("agent", nargs="?", choices=AGENTS, help="only this agent")
    doctor.add_argument("--directory", "-C", help="the project directory (default: the current one)")
    doctor.add_argument("--json", action="store_true", help="print the checks as JSON")
    doctor.set_defaults(func=cmd_doctor)
