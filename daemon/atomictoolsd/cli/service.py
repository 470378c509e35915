"""``atomictoolsd service install|uninstall|status``: run the daemon under systemd or launchd."""

from __future__ import annotations

import argparse
import os
import sys

from atomictoolsd.cli._common import raw_request, wait_gone

__all__ = ["register"]


def _plan(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from atomictoolsd.config.paths import Paths
    from atomictoolsd.service.install import (
        default_manager,
        plan,
    )

    paths = Paths.from_env()
    return plan(args.manager or default_manager(), paths, os.environ), paths


def cmd_install(args: argparse.Namespace) -> int:
    """Write the unit files (or plist) for this installation, then enable and start them."""
    from atomictoolsd.config.settings import (
        Config,
        env_name,
        load_config,
    )
    from atomictoolsd.service.install import install

    the_plan, paths = _plan(args)
    load_config(paths.config_file)  # a service that cannot start is worse than none: a SetupError says it now
    settings = [env_name(f.name) for f in Config.settings() if env_name(f.name) in os.environ]
    if settings and not args.dry_run:
        print(f"note: {', '.join(settings)} set in this shell will not reach the service; "
              f"put those settings in {paths.config_file}")

    def stop_running_daemon() -> str | None:
        status = raw_request("atomic/status")
        if not isinstance(status, dict) or (status.get("service") or {}).get("manager") == the_plan.manager:
            return None
        reply = raw_request("atomic/shutdown")
        if not isinstance(reply, dict):
            return None
        pid = int(reply["pid"])
        wait_gone(pid, 60)
        return f"stopped the daemon started outside the service manager (pid {pid}) so the service can take over"

    return install(
        the_plan, paths, sys.stdout, dry_run=args.dry_run, start=not args.no_start,
        stop_running_daemon=stop_running_daemon,
    )


def cmd_uninstall(args: argparse.Namespace) -> int:
    """Stop and disable the service, and remove exactly the files install wrote."""
    from atomictoolsd.service.install import uninstall

    the_plan, paths = _plan(args)
    return uninstall(the_plan, paths, sys.stdout, dry_run=args.dry_run, force=args.force)


def cmd_service_status(args: argparse.Namespace) -> int:
    """Which files are installed, what the service manager says about them, and whether a daemon
    runs. Exits 3 only when nothing is installed and no daemon runs."""
    from atomictoolsd.service.install import status

    the_plan, paths = _plan(args)
    installed = status(the_plan, paths, sys.stdout) == 0
    daemon = raw_request("atomic/status")
    if isinstance(daemon, dict):
        manager = (daemon.get("service") or {}).get("manager", "none")
        started_by = "the service manager" if manager != "none" else "`atomictoolsd start` or by hand"
        print(f"daemon: running (pid {daemon['pid']}), started by {started_by}")
        return 0
    print("daemon: not running")
    return 0 if installed else 3  # 3: nothing installed and nothing running


def register(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    service = commands.add_parser("service", help="run the daemon as a systemd or launchd service")
    actions = service.add_subparsers(dest="action", metavar="ACTION", required=True)

    def common(parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--manager", choices=["systemd", "launchd"], default=None,
            help="the service manager (default: launchd on macOS, systemd elsewhere)",
        )

    install = actions.add_parser("install", help="install, enable and start the service")
    common(install)
    install.add_argument("--dry-run", action="store_true", help="print the files and commands; change nothing")
    install.add_argument("--no-start", action="store_true", help="write the files only")
    install.set_defaults(func=cmd_install)

    uninstall = actions.add_parser("uninstall", help="stop the service and remove what install wrote")
    common(uninstall)
    uninstall.add_argument("--dry-run", action="store_true", help="say what would be removed; change nothing")
    uninstall.add_argument("--force", action="store_true", help="remove installed files even if edited since")
    uninstall.set_defaults(func=cmd_uninstall)

    status = actions.add_parser("status", help="show what is installed and what the service manager says")
    common(status)
    status.set_defaults(func=cmd_service_status)
