"""Project trust commands: trust [--sandbox [--allow-…] [--protect …]] [--python VENV], untrust, trust --list,
trust --review.

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
from typing import Any

from atomictoolsd.cli._common import safe
from atomictoolsd.config.command import command_name

__all__ = ["register"]


def _store_and_root(args: argparse.Namespace, gone_ok: bool = False) -> tuple[object, Path | None]:
    """The trust store, and the project root of ``args.directory``.

    With ``gone_ok`` (untrust), a path where no directory is any more is taken as the root itself:
    a trusted project whose directory was deleted must still be untrusted by its path.
    """
    from atomictoolsd.config.discovery import project_root
    from atomictoolsd.config.paths import Paths
    from atomictoolsd.registry.trust import TrustStore

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
    from atomictoolsd.cli._common import raw_request

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
    from atomictoolsd.config.discovery import (
        list_module_files,
        local_tools_dir,
    )
    from atomictoolsd.registry.trust import (
        TrustError,
        trust_command,
    )

    if args.list:
        return _list(args)
    if args.review:
        return _review(args)
    allow = _sandbox_options(args)
    if allow is None:
        return 2
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
    confined = _confinement_kept(store, root, args, python)
    if confined is not None:
        level, allow = "sandbox", confined
        args.sandbox = True
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
    if level == "full":
        _record_content(store, root, fresh=added)
    if args.sandbox:
        offered = _support()
        if not offered["available"]:
            print(f"note: this machine cannot confine it ({offered['reason']}): its tools stay blocked until it can, "
                  f"or until you trust it fully: {trust_command(root)}")
        elif args.allow_net:
            _note_network(allow["net"])
    if python is not None:
        _say_environment(python, root)
    print(_tell_daemon(root, trusted=True))
    return 0


def _allowed_hosts(args: argparse.Namespace) -> object:
    """What ``--allow-net`` allows: True (any public host) or the hosts it names (``HOST,…``).

    ``--allow-net DIR`` with no other DIR means the network, for the project at
    DIR (a host list is never a directory here); ``--allow-net=HOST`` is always hosts.
    """
    from atomictoolsd.config.nethosts import parse_hosts

    value = args.allow_net
    if value is True:
        return True
    if args.directory is None and os.path.isdir(value):
        args.directory = value
        return True
    return parse_hosts(value)


def _note_network(hosts: object) -> None:
    """Say how its tools reach the network, or why they cannot on this machine."""
    from atomictoolsd.worker.netns import support

    offered = support()
    if not offered["available"]:
        print(f"note: its tools get no network on this machine: a confined tool reaches the network only from a "
              f"namespace of its own, and {offered['reason']}")
    else:
        reach = ", ".join(hosts) if isinstance(hosts, list) else "any public host"
        print(f"network: through the daemon's proxy (HTTP_PROXY, HTTPS_PROXY): {reach}")


def _sandbox_options(args: argparse.Namespace) -> dict[str, object] | None:
    """What ``--allow-*`` and ``--protect`` add to the sandbox (the trust entry's ``allow``); None,
    with the reason printed, when one of them cannot be."""
    from atomictoolsd.registry.confinement import (
        env_name_problem,
        protect_path_problem,
    )

    if (args.allow_net or args.allow_read or args.allow_write or args.allow_env or args.protect) and not args.sandbox:
        print("atomictoolsd: --allow-net, --allow-read, --allow-write, --allow-env and --protect shape a sandbox: "
              "add --sandbox", file=sys.stderr)
        return None
    allow: dict[str, object] = {}
    if args.allow_net:
        try:
            allow["net"] = _allowed_hosts(args)
        except ValueError as exc:
            print(f"atomictoolsd: --allow-net: {exc}", file=sys.stderr)
            return None
    checks = {"read": (os.path.exists, "no such file or directory"), "write": (os.path.isdir, "not a directory")}
    for key, (exists, problem) in checks.items():
        paths = getattr(args, f"allow_{key}") or []
        missing = [p for p in paths if not exists(p)]
        if missing:
            print(f"atomictoolsd: --allow-{key} {safe(missing[0])}: {problem}", file=sys.stderr)
            return None
        if paths:
            allow[key] = sorted({os.path.realpath(p) for p in paths})
    for option, key, problem_of in (("--allow-env", "env", env_name_problem), ("--protect", "protect", protect_path_problem)):
        values = getattr(args, option[2:].replace("-", "_")) or []
        for value in values:
            problem = problem_of(value)
            if problem is not None:
                print(f"atomictoolsd: {option} {safe(value)}: {problem}", file=sys.stderr)
                return None
        if values:
            allow[key] = sorted({value.strip().strip("/") if key == "protect" else value for value in values})
    return allow


def _support() -> dict[str, object]:
    """What this machine can confine, as the daemon sees it (the configuration's ``sandbox_abi`` too)."""
    from atomictoolsd.config.paths import Paths
    from atomictoolsd.config.settings import ConfigError, load_config
    from atomictoolsd.registry.confinement import configure_sandbox
    from atomictoolsd.worker.sandbox import support  # lazy: ctypes

    try:
        configure_sandbox(load_config(Paths.from_env().config_file))
    except ConfigError:
        pass  # the daemon says what is wrong with it; the kernel is what it is
    return support()

def _confinement_kept(store: Any, root: Path, args: argparse.Namespace, python: str | None) -> dict[str, object] | None:
    """The allowance of a project trusted confined, when ``trust --python`` names only its environment
    (no ``--sandbox``, no ``--allow-*``): choosing an environment never widens a sandbox to all your
    rights (the command ``list``, ``doctor`` and a missing module offer is that one). None otherwise."""
    if python is None or args.sandbox:
        return None
    from atomictoolsd.registry.trust import trust_command  # lazy: as cmd_trust imports it

    entry = store.entry(root)
    if entry is None or entry.get("level") != "sandbox":
        return None
    print(f"note: it stays confined, as it was trusted (--sandbox); to run its tools with all your rights instead: "
          f"{trust_command(root)}, then trust --python again")
    return dict(entry.get("allow") or {})


def _chosen_environment(given: str) -> str | int:
    """The virtual environment ``--python`` names (a directory, or an interpreter in its ``bin/``),
    as an absolute path; else the exit code of its refusal, said on stderr."""
    from atomictoolsd.environments.project import find_venv

    venv = find_venv(given)
    if venv is None:
        print(f"atomictoolsd: --python {safe(given)}: not a virtual environment (no pyvenv.cfg there, nor above "
              f"its bin/); make one (uv venv, or python -m venv .venv) and name its directory", file=sys.stderr)
        return 2
    return venv


def _say_environment(venv: str, root: Path) -> None:
    """What the project's tools run with now, or why they cannot (another Python version)."""
    from atomictoolsd.environments.project import project_env

    try:
        env = project_env(str(root), venv)
    except ValueError as exc:
        print(f"note: its tools will not load: {exc}")
        return
    code = " and ".join(safe(path) for path in env.code)
    print(f"its tools run with the environment {safe(venv)}: they import its packages and the project's own code ({code})")


def cmd_untrust(args: argparse.Namespace) -> int:
    """Stop trusting a project: its own tools stop loading (running calls finish)."""
    from atomictoolsd.registry.trust import TrustError

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
    _forget_content(root)
    print(_tell_daemon(root, trusted=False))
    return 0


def _record_content(store: object, root: Path, fresh: bool) -> None:
    """Record the content of a project just trusted fully: what arrives later through git is held
    until reviewed. Trusted already, the record stays; what awaits review is named."""
    from atomictoolsd.cli.review import held_files
    from atomictoolsd.config.discovery import local_tools_dir
    from atomictoolsd.config.paths import Paths
    from atomictoolsd.registry.content import (
        ContentStore,
        code_files,
        read_code,
        review_command,
    )

    state_dir = Paths.from_env().state_dir
    if not fresh:
        verdict, _trusted_at, _problem = held_files(root, state_dir)
        if verdict is not None and verdict.held:
            print(f"note: {len(verdict.held)} file(s) of its tools arrived through git and await your review; "
                  f"until then their modules run confined, or not at all: {review_command(root)}")
        return
    entry = store.entry(root)  # type: ignore[attr-defined]
    files = {rel: read_code(path) for rel, path in code_files(local_tools_dir(root)).items()}
    seen = {rel: got[0] for rel, got in files.items() if got is not None}
    try:
        ContentStore(state_dir).update(root, str(entry.get("trusted_at", "")), seen=seen, fresh=True)
    except OSError as exc:
        print(f"note: {exc}; the daemon records the content when it next loads these tools", file=sys.stderr)
        return
    if seen:
        print(f"recorded the content of {len(seen)} code file(s): a change that arrives through git "
              f"(a pull, a checkout) is held until you review it ({command_name()} trust --review)")


def _forget_content(root: Path) -> None:
    from atomictoolsd.config.paths import Paths
    from atomictoolsd.registry.content import ContentStore

    try:
        ContentStore(Paths.from_env().state_dir).forget(root)
    except OSError as exc:  # a record nobody reads: a later trust starts a new one
        print(f"note: {exc}", file=sys.stderr)


def _review(args: argparse.Namespace) -> int:
    from atomictoolsd.cli.review import cmd_review, review_target

    args.review_target = [args.directory] if args.directory else []
    directory, only = review_target(args.directory)
    args.directory = directory or os.getcwd()
    _store, root = _store_and_root(args)
    assert root is not None
    return cmd_review(args, root, only)


def _list(args: argparse.Namespace) -> int:
    from atomictoolsd.cli._common import print_json, table
    from atomictoolsd.registry.trust import (
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
        offered = _support()
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
    net = allow.get("net")
    extra = ([f"net {safe(', '.join(net))}" if isinstance(net, list) else "net"] if net else []) + [
        f"{key} {safe(value)}" for key in ("read", "write", "env", "protect") for value in allow.get(key, [])
    ]
    return f"sandbox (+{', '.join(extra)})" if extra else level


def register(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    trust = commands.add_parser("trust", help="let a project's own tools (.atomic/tools/) load")
    trust.add_argument("directory", nargs="?", metavar="DIR", help="a directory of the project (default: the current one)")
    trust.add_argument("--sandbox", action="store_true",
                       help="load its tools confined: they read and write the project only, no network (Linux, Landlock)")
    trust.add_argument("--allow-net", nargs="?", const=True, default=False, metavar="HOST,…",
                       help="with --sandbox: let its tools reach the network through the daemon's proxy: any public "
                            "host, or only these hosts (example.com, *.example.com, addresses)")
    trust.add_argument("--allow-read", action="append", metavar="PATH",
                       help="with --sandbox: let its tools read PATH too (a file or a directory)")
    trust.add_argument("--allow-write", action="append", metavar="DIR", help="with --sandbox: let its tools write DIR too")
    trust.add_argument("--allow-env", action="append", metavar="NAME",
                       help="with --sandbox: give its tools the daemon's variable NAME too (none but the basics by default)")
    trust.add_argument("--protect", action="append", metavar="PATH",
                       help="with --sandbox: keep PATH (relative to the project's root) read-only too, as .git is")
    trust.add_argument("--python", metavar="VENV",
                       help="its tools run with this virtual environment (a directory, or its bin/python): they import "
                            "its packages and the project's own code (its root, its src/); for the daemon's Python version")
    trust.add_argument("--yes", action="store_true",
                       help="trust without a terminal, or with --review approve what it shows without asking (in a "
                            "script of your own; never let an agent run it)")
    trust.add_argument("--list", action="store_true", help="list the trusted projects and the level of each")
    trust.add_argument("--review", action="store_true",
                       help="show what arrived through git in a trusted project's tools since you trusted it, and "
                            "approve it (DIR may also be one file)")
    trust.add_argument("--json", action="store_true", help="with --list: print JSON")
    trust.set_defaults(func=cmd_trust)

    untrust = commands.add_parser("untrust", help="stop loading a project's own tools")
    untrust.add_argument("directory", nargs="?", metavar="DIR", help="a directory of the project (default: the current one)")
    untrust.set_defaults(func=cmd_untrust)
