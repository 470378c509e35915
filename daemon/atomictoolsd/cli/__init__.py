"""The ``atomictoolsd`` command.

Each command group is a module with a ``register(commands)`` function that adds its subcommands;
each subcommand is a ``cmd_<name>(args) -> exit code`` function. Heavy imports happen inside the
commands, so the ones agents spawn often stay cheap to start.

``atomictoolsd mcp`` is the one command agents spawn for every session, so ``main()`` hands it to
the stdio shim before anything else loads: argparse alone costs ~10 ms, building the parser imports
every command module, and the shim's whole budget is tens of milliseconds.

Everything else the command prints goes through ``_common.EscapingStream``: what it prints comes
from files a repository wrote, and a terminal acts on the escape sequences a name can hold.
"""

from __future__ import annotations

import sys

from atomictoolsd import __version__

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    import argparse

__all__ = ["build_parser", "main"]

# Command groups, in the order ``--help`` lists them.
COMMAND_MODULES = ("daemon", "tools", "scaffold", "javascript", "trust", "agents", "bridges", "observe", "service")


def build_parser() -> argparse.ArgumentParser:
    import argparse
    import importlib

    from atomictoolsd.cli._common import EXIT_CODES  # lazy: only when the parser is built

    class Formatter(argparse.HelpFormatter):
        """Descriptions wrapped to the terminal; the exit-code table kept as written."""

        def _fill_text(self, text: str, width: int, indent: str) -> str:
            if text is EXIT_CODES:
                return text
            return super()._fill_text(text, width, indent)

    parser = argparse.ArgumentParser(
        prog="atomictoolsd",
        description="Serve Python tool modules from .atomic/tools/ to AI coding agents.",
        epilog=EXIT_CODES,
        formatter_class=Formatter,
    )
    parser.add_argument("--version", action="version", version=f"atomictoolsd {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(f"atomictoolsd.cli.{name}").register(commands)
    _complete_help(commands, Formatter, EXIT_CODES)
    return parser


def _complete_help(commands: argparse._SubParsersAction, formatter: type, epilog: str) -> None:  # type: ignore[type-arg]
    """Every command's ``--help`` says what it does and lists the exit codes, not a usage line alone."""
    import argparse

    helps = {action.dest: action.help for action in commands._choices_actions}
    for name, sub in commands.choices.items():
        sub.formatter_class = formatter
        sub.epilog = epilog
        if not sub.description and helps.get(name):
            sub.description = helps[name][0].upper() + helps[name][1:] + "."
        for action in sub._actions:
            if isinstance(action, argparse._SubParsersAction):
                _complete_help(action, formatter, epilog)


def _parse(parser: argparse.ArgumentParser, args: list[str]) -> argparse.Namespace:
    """The command line, where a command that takes ``key=value`` operands (``call``) takes them
    before, between and after its options alike (argparse alone stops at the first option)."""
    parsed, extra = parser.parse_known_args(args)
    operands = getattr(parsed, "operands", None)
    stray = [item for item in extra if operands is None or item.startswith("-")]
    if stray:
        parser.error(f"unrecognized arguments: {' '.join(stray)}")
    if extra:
        getattr(parsed, operands).extend(extra)
    return parsed


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if args[:1] == ["mcp"]:
        from atomictoolsd.shim.relay import main as shim_main  # lazy: before argparse; the shim's start-up budget

        return shim_main(args[1:])
    if args[:1] == ["serve"]:  # the daemon: its stderr is a log, and its event log is JSON
        return _run(args)
    from atomictoolsd.cli._common import EscapingStream  # lazy: after the shim's branch (its start-up budget)

    streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = EscapingStream(sys.stdout), EscapingStream(sys.stderr)  # type: ignore[assignment]
    try:
        return _run(args)
    finally:
        sys.stdout, sys.stderr = streams


def _run(args: list[str]) -> int:
    parsed = _parse(build_parser(), args)
    from atomictools._paths import RuntimeDirError
    from atomictoolsd.config.errors import SetupError  # lazy: after the shim's branch (its start-up budget)

    try:
        return parsed.func(parsed)
    except SetupError as exc:  # a bad setting, path, address: what to fix, in one line
        print(f"atomictoolsd: {exc.report()}", file=sys.stderr)
        return exc.exit_code
    except RuntimeDirError as exc:  # the client's own check of the runtime dir (atomictools cannot know SetupError)
        print(f"atomictoolsd: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `atomictoolsd logs | head`: the reader left; say nothing more
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
