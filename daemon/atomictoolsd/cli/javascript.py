"""``atomictoolsd js install``: install the packages TypeScript and JavaScript tools may import from
the daemon (zod, @opencode-ai/plugin, @github/copilot-sdk) now, in the foreground, from the lockfile
the daemon ships; then have a running daemon load again the modules that failed for want of them.

The daemon installs them by itself the first time a module needs them; this is the command to run
when that could not happen (offline then, no npm), or to see it happen.
"""

from __future__ import annotations

import argparse
import sys

from atomictoolsd.cli._common import EXIT_FAILED, EXIT_USAGE

__all__ = ["register"]


def cmd_js_install(args: argparse.Namespace) -> int:
    from atomictoolsd.cli._common import raw_request
    from atomictoolsd.config.paths import Paths
    from atomictoolsd.config.settings import load_config
    from atomictoolsd.pool.javascript.packages import (
        Packages,
        PackagesInstallError,
    )
    from atomictoolsd.pool.javascript.runtimes import (
        find_runtime,
    )

    paths = Paths.from_env()
    config = load_config(paths.config_file)
    packages = Packages(paths.cache_dir, config.js_packages)
    if not packages.own:
        print(f"atomictoolsd: js_packages is set ({packages.directory}): the daemon does not install there; "
              f"run `npm install zod @opencode-ai/plugin @github/copilot-sdk` in it, or unset js_packages", file=sys.stderr)
        return EXIT_USAGE
    if packages.installed() and not args.force:
        print(f"installed already: {packages.directory}")
    else:
        runtime = find_runtime(config.js_runtime, paths.home)
        print(f"installing zod, @opencode-ai/plugin and @github/copilot-sdk into {packages.directory}")
        try:
            packages.install(None if runtime.problem else runtime, line=lambda text: print(f"  {text}", flush=True))
        except PackagesInstallError as exc:
            print(f"atomictoolsd: {exc}", file=sys.stderr)
            return EXIT_FAILED
        print("installed")
    reply = raw_request("atomic/javascript/retry")
    if isinstance(reply, dict):
        print("the running daemon loads again the TypeScript and JavaScript modules that failed")
    return 0


def register(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    group = commands.add_parser(
        "js", help="TypeScript and JavaScript tools: the packages they may import",
        description="TypeScript and JavaScript tool modules run on Bun or Node (docs/javascript.md).",
    )
    sub = group.add_subparsers(dest="js_command", metavar="COMMAND", required=True)
    install = sub.add_parser(
        "install", help="install zod, @opencode-ai/plugin and @github/copilot-sdk for tools that do not",
        description="Install the packages the daemon provides to TypeScript and JavaScript tools whose own "
        "directory does not have them, from the lockfile it ships (lifecycle scripts off), into its cache "
        "dir; then a running daemon loads again the modules that failed for want of them.",
    )
    install.add_argument("--force", action="store_true", help="install again even when they are there")
    install.set_defaults(func=cmd_js_install)
