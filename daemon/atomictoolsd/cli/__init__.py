"""The ``atomictoolsd`` command.

Each command group is a module with a ``register(commands)`` function that adds its subcommands;
each subcommand is a ``cmd_<name>(args) -> exit code`` function. Heavy imports happen inside the
commands, so the ones agents spawn often stay cheap to start.
"""

from __future__ import annotations

import argparse
import importlib

from atomictoolsd import __version__

__all__ = ["build_parser", "main"]

# Command groups, in the order ``--help`` lists them.
COMMAND_MODULES = ("daemon", "tools")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="atomictoolsd",
        description="Serve Python tool modules from .atomic/tools/ to AI coding agents.",
    )
    parser.add_argument("--version", action="version", version=f"atomictoolsd {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(f"atomictoolsd.cli.{name}").register(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return 130
