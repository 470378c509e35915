"""Daemon lifecycle commands: serve, start, stop, restart, status.

A daemon is found by its socket and, when the socket does not answer (its file deleted, say), by its
instance lock: the lock file is held for the daemon's whole life and holds its pid.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from typing import TYPE_CHECKING, Any

from atomictoolsd.cli import status as status_view
from atomictoolsd.cli._common import (
    connect,
    not_running,
    pid_alive,
    print_json,
    raw_request,
    wait_gone,
)
from atomictoolsd.config.command import add_own_bin_to_path, command_name
from atomictoolsd.config.searchpaths import absolute_search_paths

if TYPE_CHECKING:
    from atomictoolsd.eventlog.writer import EventLog

__all__ = ["register"]

_RESEALED = "ATOMICTOOLS_RESEALED"  # set by serve for the copy of itself it re-executes, and removed by it


def cmd_serve(args: argparse.Namespace) -> int:
    """Run the daemon in the foreground (``--detach``: in the background, as ``start`` does)."""
    from atomictools._launch import is_sealed, python_command, sealed_environ

    resealed = os.environ.pop(_RESEALED, None) is not None
    if not is_sealed() and sys.argv[1:2] == ["serve"] and not resealed:
        # Started by a command line this installation did not write (a unit from an older version,
        # `python -m atomictoolsd serve` typed in a repository, the console script under an agent's
        # PYTHONPATH): start over sealed, same pid and descriptors, before the event loop, msgspec
        # or any tool code is imported. What the interpreter ran before this line is beyond reach.
        # Once only: an interpreter that still does not look sealed must not loop on exec.
        os.execve(sys.executable, python_command("atomictoolsd", *sys.argv[1:]), {**sealed_environ(), _RESEALED: "1"})
    sealed = sealed_environ()
    for key in [k for k in os.environ if k.startswith("PYTHON") and os.environ[k] != sealed.get(k)]:
        del os.environ[key]  # ignored here (-E), but a tool's own `python` would inherit them
    absolute_search_paths(os.environ)  # a command run in a project loads no library of the project's
    if args.detach:
        if os.fork() > 0:
            os._exit(0)  # the daemon continues in the child, which no shell or agent waits for
        os.chdir("/")  # and keeps no directory of the starter's busy (an unmount, a removed worktree)

    from atomictoolsd.pool.spawner import fork_early
    from atomictoolsd.service.manager import capture

    # Tools run programs by name; those installed next to the daemon (its venv) are among them.
    add_own_bin_to_path()
    # Before the settings are read and before any thread or event loop: a copy of this process as it
    # is now becomes the first fork server (workers then share the daemon's code addresses). It
    # drops the service manager's variables itself, before anything else, and never holds them.
    first_forkserver = fork_early(child_setup=capture)
    # These variables are for this process only, never for the fork server or workers.
    service = capture()

    import asyncio

    import uvloop

    from atomictoolsd.config.errors import SetupError
    from atomictoolsd.config.paths import Paths
    from atomictoolsd.config.settings import load_config
    from atomictoolsd.eventlog.writer import LOG_NAME
    from atomictoolsd.server.socketfile import AlreadyRunning
    from atomictoolsd.server.wiring import build_pool, build_server
    from atomictoolsd.service.activation import (
        inherited_listener,
    )
    from atomictoolsd.service.notify import Notifier

    notifier = None
    if service.notify_socket:
        try:
            notifier = Notifier(service.notify_socket)
        except (ValueError, OSError) as exc:
            print(f"atomictoolsd: not notifying the service manager: {exc}", file=sys.stderr)

    def fail(message: str, code: int) -> int:
        print(f"atomictoolsd: {message}", file=sys.stderr)
        if notifier is not None:  # `systemctl status` shows the last STATUS= line
            notifier.notify(f"STATUS={message}")
        return code

    try:
        paths = Paths.from_env()
        paths.create_private_dirs()
        config = load_config(paths.config_file)
        if args.http is not None:
            config = _with_http(config, args.http)
    except SetupError as exc:
        return fail(exc.report(), exc.exit_code)
    pool = build_pool(paths, config, first_forkserver)
    events = pool.events
    _setup_logging(config.log_level, args.detach, events)
    _warn_ignored(config)
    try:
        events.open(paths.log_dir / LOG_NAME, level=config.log_level, max_bytes=config.log_max_bytes, backups=config.log_backups)
    except OSError as exc:
        print(f"atomictoolsd: no event log ({exc}); set ATOMICTOOLS_LOG_DIR to a writable directory", file=sys.stderr)
    try:
        listener = inherited_listener(service)
    except SetupError as exc:
        return fail(exc.report(), exc.exit_code)

    server = build_server(paths, config, pool, service=service, listen_socket=listener, notifier=notifier)

    async def run() -> None:
        events.bind_loop(asyncio.get_running_loop())
        await server.serve(ready_fd=args.ready_fd)

    try:
        uvloop.run(run())
    except AlreadyRunning as exc:
        if listener is not None:  # the service manager expects this process to serve: it cannot
            return fail(f"{exc}, started outside the service manager; stop it with `{command_name()} stop`", 1)
        print(f"atomictoolsd: {exc}", file=sys.stderr)
        return 0
    except SetupError as exc:  # the runtime dir or the socket file, found unusable at start-up
        return fail(exc.report(), exc.exit_code)
    finally:
        events.close()
    return 0


def _setup_logging(level: str, detached: bool, events: EventLog) -> None:
    """The event log, and stderr: every event (the journal's own format under systemd), or only
    warnings and errors for a daemon started in the background."""
    import logging

    from atomictoolsd.eventlog.writer import (
        EventLogHandler,
        JournalFormatter,
        stderr_is_journal,
    )

    stderr = logging.StreamHandler(sys.stderr)
    if stderr_is_journal():
        stderr.setFormatter(JournalFormatter())
    else:
        stderr.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        if detached:
            # Its stderr is atomictoolsd.stderr: the event log has every event, this file keeps
            # what someone looking for why a daemon failed needs.
            stderr.setLevel(logging.WARNING)
    root = logging.getLogger()
    root.setLevel(level.upper())
    root.addHandler(stderr)
    root.addHandler(EventLogHandler(events))


def _warn_ignored(config: Any) -> None:
    """Say, in the log and on stderr, which variables of file-only settings were set and ignored."""
    import logging

    for variable, note in config.ignored.items():
        logging.getLogger("atomictoolsd").warning(note, extra={"event": "config.ignored", "data": {"variable": variable}})


def _with_http(config: Any, address: str) -> Any:
    """``config`` with ``http`` from the command line (``--http``), checked as the setting is."""
    import dataclasses

    from atomictoolsd.config.settings import ConfigError
    from atomictoolsd.transports.http import AddressError, parse_address

    try:
        parse_address(address)
    except AddressError as exc:
        raise ConfigError(f"--http: {exc}") from None
    return dataclasses.replace(config, http=address, sources={**config.sources, "http": "--http"})


def cmd_start(args: argparse.Namespace) -> int:
    """Start the daemon in the background; return once its socket serves."""
    from atomictools._autostart import start_daemon
    from atomictools._errors import ConnectError
    from atomictools._paths import socket_path
    from atomictoolsd.config.paths import Paths
    from atomictoolsd.config.settings import load_config

    # The same checks the daemon makes, said here (by cli.main, as a SetupError) rather than from a log's tail.
    config = load_config(Paths.from_env().config_file)
    http = args.http
    if http is not None:
        config = _with_http(config, http)
    running = _running_pid(args)  # a daemon may serve already (or a service manager's socket start it)
    if running is not None:
        print(f"atomictoolsd is already running (pid {running}) on {socket_path()}")
        if http is not None:
            print("(--http takes effect when it starts: `atomictoolsd stop` first)", file=sys.stderr)
        if http is not None:
            return 1
        return _print_http() if config.http else 0
    try:
        state, pid = start_daemon(extra_args=("--http", http) if http is not None else ())
    except ConnectError as exc:
        print(f"atomictoolsd: {exc}", file=sys.stderr)
        return 1
    if state == "running":
        print(f"atomictoolsd is already running (pid {pid}) on {socket_path()}")
    else:
        print(f"atomictoolsd started (pid {pid}) on {socket_path()}")
    return _print_http() if config.http else 0


def _print_http() -> int:
    """Say where HTTP is served (or why it is not); 1 when it was asked for and is not served."""
    http = (raw_request("atomic/status", timeout=5.0) or {}).get("http")
    if not http:
        return 0
    if http.get("error"):
        print(f"atomictoolsd: HTTP not served: {http['error']}", file=sys.stderr)
        return 1
    print(f"MCP over HTTP at {http['url']} (token in {http['tokenFile']})")
    return 0


def cmd_http_token(args: argparse.Namespace) -> int:
    """Print where the HTTP token is (``--show``: the token; ``--rotate``: make a new one)."""
    from pathlib import Path

    from atomictools._paths import runtime_dir
    from atomictoolsd.transports.http import TOKEN_NAME, new_token, read_token

    path = Path(runtime_dir()) / TOKEN_NAME
    if args.rotate:
        reply = raw_request("atomic/http/rotate")
        if not (isinstance(reply, dict) and reply.get("tokenFile") is not None):
            new_token(path)  # no daemon serving HTTP: the next one to start reads this one
        print(f"a new token is in {path}; clients using the old one get 401 until they read it")
    token = read_token(path)
    if token is None:
        print(f"no token yet at {path}: start the daemon with --http (or the http setting) to make one", file=sys.stderr)
        return 1
    print(token if args.show else str(path))
    return 0


def _running_pid(args: argparse.Namespace) -> int | None:
    """The pid of the daemon answering on the socket, or None (a bare request: no attach, no scan)."""
    status = raw_request("atomic/status")
    return int(status["pid"]) if isinstance(status, dict) and "pid" in status else None


def lock_holder() -> int | None:
    """The pid of the live daemon holding the instance lock, or None."""
    from atomictoolsd.config.paths import Paths
    from atomictoolsd.server.socketfile import InstanceLock

    pid = InstanceLock(Paths.from_env().lock).holder()
    return pid if pid is not None and pid_alive(pid) else None


def _wait_for_socket(timeout: float = 3.0) -> Any:
    """``atomic/status`` once the socket answers again (a daemon makes a deleted one anew within a second)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(0.1)
        status = raw_request("atomic/status", timeout=2.0)
        if status is not None:
            return status
    return None


def cmd_stop(args: argparse.Namespace) -> int:
    """Stop the daemon: calls in flight finish first (within the configured grace)."""
    # Status only says which service manager to mention: a daemon that cannot answer it is stopped all the same.
    status = raw_request("atomic/status") or {}
    reply = raw_request("atomic/shutdown")
    if reply is None:
        pid = lock_holder()
        if pid is None:
            print("atomictoolsd is not running")
            return 0
        # It holds the lock but its socket does not answer (deleted, or the daemon is stuck):
        # SIGTERM is the same graceful stop atomic/shutdown asks for.
        status = {}
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            print("atomictoolsd is not running")
            return 0
        reply = {"pid": pid}
    pid = reply["pid"]
    if not wait_gone(pid, 60):
        print(f"atomictoolsd (pid {pid}) is still stopping", file=sys.stderr)
        return 1
    print(f"atomictoolsd stopped (pid {pid})")
    manager = (status.get("service") or {}).get("manager")
    if manager == "systemd":
        print("(its socket unit starts it again on the next connection; "
              "`systemctl --user stop atomictoolsd.socket atomictoolsd.service` keeps it stopped)")
    elif manager == "launchd":
        print("(launchd starts it again on the next connection; "
              f"`launchctl bootout gui/{os.getuid()}/{status['service'].get('unit')}` keeps it stopped)")
    return 0


def cmd_restart(args: argparse.Namespace) -> int:
    """Stop, then start with the same options as ``start``; without ``--http``, a daemon that was
    started with HTTP (``--http``, or ``ATOMICTOOLS_HTTP`` this shell no longer sets) comes back
    with it, at the address it had (its port too)."""
    if args.http is None:
        args.http = _http_to_keep()
    code = cmd_stop(args)
    return code or cmd_start(args)


def _http_to_keep() -> str | None:
    """The address the running daemon serves HTTP on, when what set it goes with that daemon: its
    command line (``--http``), or ``ATOMICTOOLS_HTTP`` in its environment (``ATOMICTOOLS_HTTP=8765
    atomictoolsd start``) that this one does not set (when it does, the new daemon reads it)."""
    from urllib.parse import urlsplit

    status = raw_request("atomic/status")
    if not isinstance(status, dict):
        return None
    source = (status.get("configSources") or {}).get("http")
    if source != "--http" and (source != "ATOMICTOOLS_HTTP" or os.environ.get("ATOMICTOOLS_HTTP")):
        return None
    url = (status.get("http") or {}).get("url")
    if not url:
        return (status.get("config") or {}).get("http") or None
    parts = urlsplit(url)
    host = f"[{parts.hostname}]" if parts.hostname and ":" in parts.hostname else parts.hostname
    return f"{host}:{parts.port}"


def cmd_status(args: argparse.Namespace) -> int:
    """Show the daemon's state: process, service manager, projects, modules and their workers, config."""
    from atomictools._errors import ConnectError, RPCError

    try:
        with connect(args, autostart=False) as client:
            status = client.status()
    except ConnectError:
        pid = lock_holder()
        if pid is None:
            for line in status_view.render_others(other_daemons(None), status_view.output_width(sys.stderr)):
                print(line, file=sys.stderr)
            return not_running()
        status = _wait_for_socket()
        if status is None:
            from atomictools._paths import socket_path

            print(
                f"atomictoolsd (pid {pid}) holds its lock but does not answer on {socket_path()}; "
                f"stop it with `atomictoolsd stop`",
                file=sys.stderr,
            )
            return 1
    except RPCError as exc:
        # This directory's project could not be attached: the daemon's own state still shows why.
        status = raw_request("atomic/status")
        if status is None:
            print(f"atomictoolsd: the daemon answered: {exc}", file=sys.stderr)
            return 1
        print(f"atomictoolsd: this directory's project: {exc}", file=sys.stderr)
    others = other_daemons(status.get("pid"))
    if args.json:
        print_json({**status, "otherDaemons": others})
        return 0
    for line in status_view.render(status, verbose=args.verbose, width=status_view.output_width(sys.stdout), others=others):
        print(line)
    return 0


def other_daemons(pid: int | None) -> list[dict[str, Any]]:
    """The daemons of this user and home other than ``pid``, each with the socket it serves: one
    started with another runtime dir (another ``XDG_RUNTIME_DIR``, an entry's
    ``ATOMICTOOLS_RUNTIME_DIR``) is otherwise invisible to the CLI, which asks only the socket its own
    environment names. A daemon with another ``HOME`` serves another set of tools and trust: not
    yours here (the test suite's daemons, each in its own home)."""
    import psutil

    home = os.environ.get("HOME")
    found: dict[str, dict[str, Any]] = {}
    for process in psutil.process_iter(["pid", "uids", "cmdline"]):
        info = process.info
        cmdline = info.get("cmdline") or []
        if info["pid"] == pid or not info.get("uids") or info["uids"].real != os.getuid():
            continue
        if "atomictoolsd" not in " ".join(cmdline) or "serve" not in cmdline:
            continue
        try:
            if process.environ().get("HOME") != home:
                continue
            listening = [c.laddr for c in process.net_connections(kind="unix") if c.status == psutil.CONN_NONE]
        except (psutil.Error, OSError):
            continue
        for path in listening:
            if isinstance(path, str) and path.endswith("/atomictoolsd.sock"):
                found.setdefault(path, {"pid": info["pid"], "socket": path})
    return sorted(found.values(), key=lambda d: d["pid"])


def register(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    serve = commands.add_parser(
        "serve", help="run the daemon in the foreground",
        description="Run the daemon in the foreground until SIGINT or SIGTERM (what a service manager "
        "runs). It logs to the event log (`atomictoolsd logs`) and to stderr; SIGHUP rereads the "
        "configuration and rescans the tools dirs. Exits 2 on a bad configuration; 0 when another "
        "daemon already serves.",
    )
    serve.add_argument("--http", metavar="[ADDRESS:]PORT", default=None,
                       help="also serve MCP's Streamable HTTP there (the http setting; a bare port is loopback)")
    serve.add_argument("--detach", action="store_true", help=argparse.SUPPRESS)
    serve.add_argument("--ready-fd", type=int, default=None, help=argparse.SUPPRESS)
    serve.set_defaults(func=cmd_serve)

    start = commands.add_parser(
        "start", help="start the daemon in the background",
        description="Start the daemon in the background, detached from this terminal, and return once "
        "its socket serves. Does nothing when a daemon already runs. Exits 2 on a bad configuration, "
        "1 when the daemon could not start, or HTTP was asked for and is not served (the cause is printed first).",
    )
    start.add_argument("--http", metavar="[ADDRESS:]PORT", default=None,
                       help="also serve MCP's Streamable HTTP there, e.g. 8765 (loopback) or 127.0.0.1:8765; see docs/http.md")
    start.set_defaults(func=cmd_start)
    http = commands.add_parser("http", help="the Streamable HTTP endpoint's token")
    http_actions = http.add_subparsers(dest="action", metavar="ACTION", required=True)
    token = http_actions.add_parser(
        "token", help="print the token file's path (--show: the token; --rotate: a new token)",
        description="Print where the bearer token HTTP clients send is kept (a 0600 file in the runtime dir). "
        "--show prints the token itself; --rotate makes a new one at once (the running daemon takes it; "
        "clients with the old one get 401).",
    )
    token.add_argument("--show", action="store_true", help="print the token, not its path")
    token.add_argument("--rotate", action="store_true", help="make a new token now")
    token.set_defaults(func=cmd_http_token)
    commands.add_parser(
        "stop", help="stop the daemon",
        description="Stop the daemon: calls in flight finish first (within shutdown_grace seconds), then "
        "its workers and bridge scripts go. Exits 0 when no daemon runs, 1 when it is still stopping "
        "after 60 s.",
    ).set_defaults(func=cmd_stop)
    restart = commands.add_parser(
        "restart", help="stop, then start the daemon",
        description="Stop the daemon (as `stop`), then start it (as `start`, with the same options): for "
        "settings that `atomictoolsd status` lists as waiting for a restart. A daemon started with --http "
        "(or ATOMICTOOLS_HTTP this shell does not set) keeps it, at the same address, unless --http says otherwise.",
    )
    restart.add_argument("--http", metavar="[ADDRESS:]PORT", default=None,
                         help="serve Streamable HTTP on this address (default: as the running daemon does)")
    restart.set_defaults(func=cmd_restart)

    status = commands.add_parser(
        "status", help="show the daemon's state",
        description="Show the daemon's process, service manager, projects, modules (worker, memory, "
        "calls, errors, latency) and the settings in force. Exits 3 when the daemon is not running.",
    )
    status.add_argument("--verbose", "-v", action="store_true",
                        help="also every module (worker, memory, calls, latency) and each part of the daemon")
    status.add_argument("--json", action="store_true", help="print JSON (every key once, by its current name)")
    status.set_defaults(func=cmd_status)
