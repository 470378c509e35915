"""Project trust commands: trust [--sandbox [--allow-…]] [--python VENV], untrust, trust --list.

They write the trust store themselves (no daemon needed), then ask a running daemon to re-read it,
so the change takes effect at once; they never start a daemon.

``trust`` lets a repository's code run, so it is the user's decision: it refuses to run without a
terminal on stdin (an agent's shell tool has none) unless told ``--yes``, which a person writes
into a script of their own. ``untrust`` and ``trust --list`` only narrow or read: they run anywhere.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from atomictoolsd.cli._common import safe
from atomictoolsd.config.command import command_name

__all__ = ["register"]


def _store_and_root(args: argparse.Namespace, gone_ok: bool = False) -> tuple[object, Path | None]:
    """The trust store, and the project root of ``args.directory``.

    With ``gone_ok`` (untrust), a path where no directory is any more is taken as the root itself:
    a trusted project whose directory was deleted must still be untrusted by its path.
    """
    from atomictoolsd.config.discovery import project_root  # lazy: only this command pays for it (start-up cost)
    from atomictoolsd.config.paths import Paths  # lazy: only this command pays for it (start-up cost)
    from atomictoolsd.registry.trust import TrustStore  # lazy: only this command pays for it (start-up cost)

    paths = Paths.from_env()
    store = TrustStore(paths.state_dir)
    directory = getattr(args, "directory", None)
    if directory is None:
        return store, None
    path = Path(directory).expanduser()
    if not path.is_dir():
        if gone_ok and not path.exists():
            return store, Path(os.path.realpath(path))  # the symlinks of the parents that are left still resolve
        print(f"atomictoolsd: {safe(directory)} is not a directory", file=sys.stderr)
        raise SystemExit(2)
    return store, project_root(path.resolve(), paths.home)


def _tell_daemon(root: Path, trusted: bool) -> str:
    """Ask a running daemon to re-read the store; say, in words, what it did about ``root``.

    A bare request, without attaching: attaching from here would open the project itself, and the
    answer could no longer tell whether the daemon had it open before.
    """
    from atomictoolsd.cli._common import raw_request  # lazy: only this command pays for it (start-up cost)

    reply = raw_request("atomic/trust/refresh")
    if not isinstance(reply, dict):
        return "the daemon is not running; it will read this when it starts"
    for entry in reply.get("changed", []):
        if entry.get("root") == str(root):
            if entry.get("trusted"):
                return "the running daemon loaded the project's tools; attached agents were told"
            return "the running daemon withdrew the project's tools (calls in flight finish); attached agents were told"
    if trusted:
        return ("the running daemon has not opened this project yet: its tools load when an agent "
                f"or `{command_name()} list` first uses it")
    return "the running daemon had not loaded this project's tools: nothing it serves changed"


def cmd_trust(args: argparse.Namespace) -> int:
    """Trust a project (default: the one of the current directory) so its own tools load."""
    from atomictoolsd.config.discovery import (  # lazy: only this command pays for it (start-up cost)
        list_module_files,
        local_tools_dir,
    )
    from atomictoolsd.registry.trust import (  # lazy: only this command pays for it (start-up cost)
        TrustError,
        trust_command,
    )

    if args.list:
        return _list(args)
    widening = bool(args.allow_net or args.allow_read or args.allow_write)
    if widening and not args.sandbox:
        print("atomictoolsd: --allow-net, --allow-read and --allow-write widen a sandbox: add --sandbox", file=sys.stderr)
        return 2
    allow: dict[str, object] = {}
    if args.allow_net:
        allow["net"] = True
    for key in ("read", "write"):
        dirs = getattr(args, f"allow_{key}") or []
        missing = [d for d in dirs if not os.path.isdir(d)]
        if missing:
            print(f"atomictoolsd: --allow-{key} {safe(missing[0])}: not a directory", file=sys.stderr)
            return 2
        if dirs:
            allow[key] = sorted({os.path.realpath(d) for d in dirs})
    python = _chosen_environment(args.python) if args.python else None
    if python is not None and not isinstance(python, str):
        return python
    if not args.yes and not os.isatty(0):
        print(f"atomictoolsd: trust lets a project's code run, so it asks for a terminal: run it yourself in one "
              f"(an agent must ask you to, not run it), or add --yes in a script of your own: "
              f"{command_name()} trust --yes …", file=sys.stderr)
        return 2
    if args.directory is None:
        args.directory = os.getcwd()
    store, root = _store_and_root(args)
    assert root is not None
    level = "sandbox" if args.sandbox else "full"
    try:
        before = store.state(root)  # type: ignore[attr-defined]
        added = store.trust(root, level, allow, python)  # type: ignore[attr-defined]
    except TrustError as exc:
        print(f"atomictoolsd: {exc}", file=sys.stderr)
        return 1
    if before == "replaced":
        print(f"note: {safe(root)} was trusted for a directory that has since been replaced; trusting the one there now")
    modules = list_module_files(local_tools_dir(root))
    tools_dir = safe(local_tools_dir(root))
    what = f"{len(modules)} tool module(s) in {tools_dir}" if modules else f"its tools in {tools_dir}"
    how = "confined" if args.sandbox else "with all your rights"
    print(f"{'trusted' if added else 'already trusted'}: {safe(root)} ({what} will load, {how})")
    if args.sandbox:
        from atomictoolsd.workers.runtime.sandbox import support  # lazy: ctypes, only this command pays for it

        offered = support()
        if not offered["available"]:
            print(f"note: this machine cannot confine it ({offered['reason']}): its tools stay blocked until it can, "
                  f"or until you trust it fully: {trust_command(root)}")
    if python is not None:
        _say_environment(python, root)
    print(_tell_daemon(root, trusted=True))
    return 0


def _chosen_environment(given: str) -> str | int:
    """The virtual environment ``--python`` names (a directory, or an interpreter in its ``bin/``),
    as an absolute path; else the exit code of its refusal, said on stderr."""
    from atomictoolsd.environments.project import find_venv  # lazy: only this option pays for it (start-up cost)

    venv = find_venv(given)
    if venv is None:
        print(f"atomictoolsd: --python {safe(given)}: not a virtual environment (no pyvenv.cfg there, nor above "
              f"its bin/); make one (uv venv, or python -m venv .venv) and name its directory", file=sys.stderr)
        return 2
    return venv


def _say_environment(venv: str, root: Path) -> None:
    """What the project's tools run with now, or why they cannot (another Python version)."""
    from atomictoolsd.environments.project import project_env  # lazy: only this option pays for it (start-up cost)

    try:
        env = project_env(str(root), venv)
    except ValueError as exc:
        print(f"note: its tools will not load: {exc}")
        return
    code = " and ".join(safe(path) for path in env.code)
    print(f"its tools run with the environment {safe(venv)}: they import its packages and the project's own code ({code})")


def cmd_untrust(args: argparse.Namespace) -> int:
    """Stop trusting a project: its own tools stop loading (running calls finish)."""
    from atomictoolsd.registry.trust import TrustError  # lazy: only this command pays for it (start-up cost)

    if args.directory is None:
        args.directory = os.getcwd()
    store, root = _store_and_root(args, gone_ok=True)
    try:
        removed = store.untrust(root)  # type: ignore[attr-defined]
    except TrustError as exc:
        print(f"atomictoolsd: {exc}", file=sys.stderr)
        return 1
    if not removed:
        print(f"not trusted: {safe(root)} (nothing to do)")
        return 0
    print(f"untrusted: {safe(root)} (its own tools no longer load)")
    print(_tell_daemon(root, trusted=False))
    return 0


def _list(args: argparse.Namespace) -> int:
    from atomictoolsd.cli._common import print_json, table  # lazy: only this command pays for it (start-up cost)
    from atomictoolsd.registry.trust import (  # lazy: only this command pays for it (start-up cost)
        TrustError,
        replaced_message,
    )

    store, _root = _store_and_root(argparse.Namespace())
    try:
        entries = store.entries()  # type: ignore[attr-defined]
    except TrustError as exc:
        print(f"atomictoolsd: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print_json([{"root": root, "state": store.state(root), "level": "full", **info} for root, info in entries.items()])  # type: ignore[attr-defined]
        return 0
    if not entries:
        from atomictoolsd.workers.runtime.sandbox import support  # lazy: ctypes, only this command pays for it

        offered = support()
        if offered["available"]:
            print(f"no trusted projects (trust one with: {command_name()} trust --sandbox [DIR])")
        else:  # trust --sandbox would leave it blocked here
            print(f"no trusted projects (trust one with: {command_name()} trust [DIR], with all your rights: this "
                  f"machine cannot confine it, {offered['reason']})")
        return 0
    notes = {"trusted": "", "missing": "  (missing)", "replaced": "  (replaced: not trusted; trust it again)"}
    states = {root: store.state(root) for root in entries}  # type: ignore[attr-defined]
    table(
        ["PROJECT", "LEVEL", "TRUSTED SINCE"],
        [[safe(root) + notes[states[root]], _level_text(info), safe(info.get("trusted_at", ""))]
         for root, info in entries.items()],
    )
    for root, state in states.items():
        if state == "replaced":
            print(f"\n{replaced_message(root)}")
    return 0


def _level_text(info: dict[str, object]) -> str:
    level = str(info.get("level", "full"))
    allow = info.get("allow")
    if level != "sandbox" or not isinstance(allow, dict):
        return level
    extra = (["net"] if allow.get("net") else []) + [f"{key} {safe(d)}" for key in ("read", "write") for d in allow.get(key, [])]
    return f"sandbox (+{', '.join(extra)})" if extra else level


def register(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    trust = commands.add_parser("trust", help="let a project's own tools (.atomic/tools/) load")
    trust.add_argument("directory", nargs="?", metavar="DIR", help="a directory of the project (default: the current one)")
    trust.add_argument("--sandbox", action="store_true",
                       help="load its tools confined: they read and write the project only, no network (Linux, Landlock)")
    trust.add_argument("--allow-net", action="store_true", help="with --sandbox: let its tools use the network")
    trust.add_argument("--allow-read", action="append", metavar="DIR", help="with --sandbox: let its tools read DIR too")
    trust.add_argument("--allow-write", action="append", metavar="DIR", help="with --sandbox: let its tools write DIR too")
    trust.add_argument("--python", metavar="VENV",
                       help="its tools run with this virtual environment (a directory, or its bin/python): they import "
                            "its packages and the project's own code (its root, its src/); for the daemon's Python version")
    trust.add_argument("--yes", action="store_true",
                       help="trust without a terminal (in a script of your own; never let an agent run it)")
    trust.add_argument("--list", action="store_true", help="list the trusted projects and the level of each")
    trust.add_argument("--json", action="store_true", help="with --list: print JSON")
    trust.set_defaults(func=cmd_trust)

    untrust = commands.add_parser("untrust", help="stop loading a project's own tools")
    untrust.add_argument("directory", nargs="?", metavar="DIR", help="a directory of the project (default: the current one)")
    untrust.set_defaults(func=cmd_untrust)
