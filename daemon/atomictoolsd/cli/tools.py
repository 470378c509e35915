"""Tool commands: list and call."""

from __future__ import annotations

import argparse
import errno
import json
import os
import stat
import sys
from typing import Any

from atomictoolsd.cli._common import EXIT_FAILED, EXIT_USAGE, connect, print_json, safe, table, where

__all__ = ["parse_call_arguments", "register"]


def cmd_list(args: argparse.Namespace) -> int:
    """List the tools visible from a directory, with their scope; errors of modules that failed."""
    from atomictools._errors import ConnectError

    try:
        with connect(args) as client:
            listing = client.request("atomic/list", {"all": args.all})
    except ConnectError as exc:
        print(f"atomictoolsd: {exc}", file=sys.stderr)
        return 1
    if args.json:
        out = {
            "root": listing.get("root"), "trust": listing.get("trust"), "network": listing.get("network"),
            "tools": listing["tools"], "errors": listing["errors"], "counts": listing["counts"],
            "blocked": listing.get("blocked", []), "held": listing.get("held", []),
            "loading": listing.get("loading", []),
        }
        if listing.get("environment"):
            out["environment"] = listing["environment"]
        if args.all:
            out["shadowed"] = listing["shadowed"]
        print_json(out)
        return 0
    rows = [[safe(t["name"]), _scope(t), _first_line(t.get("description") or _UNDESCRIBED)] for t in listing["tools"]]
    if args.all:
        rows += [
            [safe(t["name"]), f"{t['scope']} (shadowed by {t['shadowedBy']['scope']})",
             _first_line(t.get("description", ""))]
            for t in listing["shadowed"]
        ]
    if rows:
        table(["NAME", "SCOPE", "DESCRIPTION"], rows)
    else:
        print(f"no tools (write one in {safe(os.path.join(listing['root'] or '~', '.atomic', 'tools'))}/)")
    counts = ", ".join(f"{n} {scope}" for scope, n in sorted(listing["counts"].items()))
    if counts:
        print(f"\n{len(listing['tools'])} tools: {counts}")
    if listing["errors"]:
        print(f"\n{len(listing['errors'])} problem(s) loading tools:")
        for error in listing["errors"]:
            tool = f" tool {error['tool']!r}:" if error.get("tool") else ""
            print(f"  {where(error)}:{tool} {error['message']}")
    loading = listing.get("loading") or []
    if loading:
        print(f"\n{len(loading)} module(s) still loading (listed once loaded):")
        for entry in loading:
            installing = entry.get("installing")
            if installing:
                step = f": {installing['progress']}" if installing.get("progress") else ""
                print(f"  {safe(entry['file'])}: installing its dependencies ({', '.join(installing['requirements'])}){step}")
            else:
                print(f"  {safe(entry['file'])}")
    _print_environment(listing.get("environment"))
    if listing.get("trust") in ("full", "sandbox"):
        how = "confined (trust --sandbox)" if listing["trust"] == "sandbox" else "with all your rights (trust)"
        print(f"\nproject {safe(listing['root'])}: trusted, its own tools run {how}")
        if listing.get("network"):
            print(f"network of its confined tools: {safe(listing['network'])}")
    _print_held(listing.get("held", []))
    _print_blocked(listing.get("blocked", []))
    return 0


def _print_blocked(blocked: list[dict[str, Any]]) -> None:
    """The modules that do not load because their project is not trusted (or not enough), and the
    command that changes that."""
    if blocked:
        reason = blocked[0].get("reason")
        if reason:
            print(f"\nblocked: {len(blocked)} tool module(s) of {safe(blocked[0]['root'])}: {reason}")
        else:
            print(f"\nblocked: {len(blocked)} tool module(s) of {safe(blocked[0]['root'])}, not a trusted project:")
        for entry in blocked:
            print(f"  {safe(entry['file'])}")
        if reason and blocked[0].get("command"):
            print(f"to run them with all your rights instead, run: {blocked[0]['command']}")
        elif not reason:
            # The daemon's own offer (0.2); an older daemon sent only the command.
            print(blocked[0].get("message") or f"to trust the project, run: {blocked[0]['command']}")
            _why_untrusted(blocked[0]["root"])


_UNDESCRIBED = "(no description: agents pick tools by it; write a docstring)"


def _print_held(held: list[dict[str, Any]]) -> None:
    """The modules whose content arrived through git and was not reviewed: how each runs meanwhile."""
    if not held:
        return
    print(f"\nheld: {len(held)} tool module(s) of {safe(held[0]['root'])} arrived through git and were never reviewed:")
    for entry in held:
        how = "runs confined" if entry.get("confined") else "does not run (this machine cannot confine it)"
        through = [safe(f) for f in entry.get("files", []) if f != entry["file"]]
        via = f" (it imports {', '.join(through)})" if through else ""
        print(f"  {safe(entry['file'])}{via}: {how} until you review it")
    print(f"review with: {held[0]['command']}")

def _print_environment(environment: dict[str, Any] | None) -> None:
    """The project's environment its tools run with, or the one it has that they could."""
    if not environment:
        return
    version = f", Python {environment['version']}" if environment.get("version") else ""
    if environment.get("path"):
        source = "trust --python" if environment.get("from") == "trust" else "project_venv in your config file"
        print(f"\nproject environment: {safe(environment['path'])}{version} (from {source})")
        if environment.get("problem"):
            print(f"  its tools do not load: {environment['problem']}")
    elif environment.get("command"):
        print(f"\nthis project has a virtual environment ({safe(environment['offer'])}{version}); for its tools to import "
              f"its packages and the project's own code, run: {environment['command']}")
    elif environment.get("problem"):
        print(f"\nthis project has a virtual environment ({safe(environment['offer'])}) its tools cannot use: "
              f"{environment['problem']}")


def _why_untrusted(root: str) -> None:
    """Say so when the project was trusted, but for a directory that has been replaced since."""
    from atomictoolsd.config.paths import Paths
    from atomictoolsd.registry.trust import (
        TrustStore,
        replaced_message,
    )

    if TrustStore(Paths.from_env().state_dir).state(root) == "replaced":
        print(f"({replaced_message(root)})")


def _scope(tool: dict[str, Any]) -> str:
    marks = (["json"] if tool.get("kind") == "declarative" else []) + ([tool["runtime"]] if tool.get("runtime") else [])
    marks += ["confined"] if tool.get("confined") else []
    marks += ["held"] if tool.get("held") else []
    scope = tool["scope"]
    return f"{scope} ({', '.join(marks)})" if marks else scope


def _first_line(text: str, width: int = 72) -> str:
    line = safe(text.strip().splitlines()[0]) if text.strip() else ""
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
    """Call a tool. Its result goes to stdout; every error goes to stderr, with a non-zero exit code."""
    from atomictools._errors import ConnectError, RPCError
    from atomictoolsd.cli.prompts import Progress, ask_on_terminal

    progress = Progress() if sys.stderr.isatty() else None
    try:
        with connect(args) as client:
            tools = {t["name"]: t for t in client.list_tools()}
            tool = tools.get(args.name, {})
            try:
                arguments = _call_arguments(args, tool.get("inputSchema", {}))
            except (ValueError, AttributeError) as exc:
                print(f"atomictoolsd: bad arguments: {exc}", file=sys.stderr)
                return EXIT_USAGE
            try:
                result = client.call_tool(args.name, arguments, timeout=args.timeout, on_progress=progress,
                                          on_elicit=ask_on_terminal)
            finally:
                if progress is not None:
                    progress.clear()
    except RPCError as exc:  # the daemon refused the call itself: an unknown tool, bad params
        print(f"atomictoolsd: {exc.message}", file=sys.stderr)
        return EXIT_USAGE
    except ConnectError as exc:
        print(f"atomictoolsd: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if args.json:
        print_json(_raw_result(result))
        return EXIT_FAILED if result.is_error else 0
    if result.is_error:
        print(result.text, file=sys.stderr)
        return EXIT_FAILED
    whole = _full_output(result) if args.full else None
    if whole is not None:
        sys.stdout.write(whole)
        return 0
    print(_plain(result, tool))
    return 0


def cmd_reload(args: argparse.Namespace) -> int:
    """Load a project's tools again now, or one module of them, changed or not."""
    from atomictools._errors import ConnectError, RPCError

    module = args.module
    if module is not None and os.path.isfile(module):
        module = os.path.realpath(module)  # as the daemon names it: the project's resolved path
    try:
        with connect(args) as client:
            result = client.reload(module, force=True)
    except RPCError as exc:  # no such module
        print(f"atomictoolsd: {exc.message}", file=sys.stderr)
        return EXIT_USAGE
    except ConnectError as exc:
        print(f"atomictoolsd: {exc}", file=sys.stderr)
        return EXIT_FAILED
    what = safe(args.module) if module is not None else "the project's tools"
    print(f"reloaded {what}: {result['toolCount']} tool(s)")
    for error in result["errors"]:
        tool = f" tool {error['tool']!r}:" if error.get("tool") else ""
        print(f"  {where(error)}:{tool} {error['message']}")
    _print_blocked(result.get("blocked", []))
    return 0 if result["success"] else EXIT_FAILED


FULL_OUTPUT_MAX = 256 * 1024 * 1024  # bytes of a spilled output ``call --full`` prints at most


def _full_output(result: Any) -> str | None:
    """The whole output of a truncated result, from the spill file the daemon's worker wrote.

    The path comes from a worker, so it is read only when it is a regular file of this user under
    the daemon's spill dir, opened without following a link: never a FIFO, a device or elsewhere.
    """
    from atomictoolsd.config.paths import Paths

    path = (result.meta or {}).get("atomic/fullOutput")
    if not isinstance(path, str):
        return None
    spill_dir = str(Paths.from_env().spill_dir)
    parts = _below(spill_dir, path) or _below(os.path.realpath(spill_dir), path)
    if parts is None:
        print(f"atomictoolsd: not reading {path!r}: not in the spill dir {spill_dir}", file=sys.stderr)
        return None
    try:
        fd = _open_below(spill_dir, parts)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            print(f"atomictoolsd: not reading {path!r}: a link or a file on its way in the spill dir", file=sys.stderr)
        else:
            print(f"atomictoolsd: the full output is gone ({exc.strerror}: {path}); it is kept for spill_max_age",
                  file=sys.stderr)
        return None
    with open(fd, "rb") as spilled:
        info = os.fstat(spilled.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
            print(f"atomictoolsd: not reading {path!r}: not a regular file of yours", file=sys.stderr)
            return None
        if info.st_size > FULL_OUTPUT_MAX:  # a worker's file, perhaps sparse: never read whole into memory
            print(f"atomictoolsd: the full output is {info.st_size:,} bytes, more than --full prints "
                  f"({FULL_OUTPUT_MAX:,}); it is kept in {path} for spill_max_age", file=sys.stderr)
            return None
        return spilled.read(FULL_OUTPUT_MAX).decode("utf-8", "replace")


def _below(directory: str, path: str) -> list[str] | None:
    """The names leading from ``directory`` to ``path`` (absolute, normalized), or None when it is not below it."""
    if not os.path.isabs(path) or os.path.normpath(path) != path or "\0" in path:
        return None
    prefix = directory.rstrip(os.sep) + os.sep
    return path[len(prefix):].split(os.sep) if path.startswith(prefix) else None


def _open_below(directory: str, parts: list[str]) -> int:
    """The file ``parts`` names below ``directory``, opened from it one name at a time by descriptors,
    following no link and without blocking (a worker may swap its dirs for links meanwhile)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts[:-1]:
            below = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = below
        return os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
    finally:
        os.close(fd)


def _call_arguments(args: argparse.Namespace, schema: dict[str, Any]) -> dict[str, Any]:
    """``--args``, then a positional JSON object, then ``key=value`` pairs, later ones winning."""
    arguments: dict[str, Any] = {}
    pairs = list(args.arguments)
    if args.args:
        arguments.update(_json_object(args.args))
    if pairs and pairs[0].lstrip().startswith("{"):
        arguments.update(_json_object(pairs.pop(0)))
    arguments.update(parse_call_arguments(pairs, schema))
    return arguments


def _json_object(text: str) -> dict[str, Any]:
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ValueError(f"expected a JSON object of arguments, got {text!r}")
    return value


def _raw_result(result: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"content": result.content, "isError": result.is_error}
    if result.structured is not None:
        out["structuredContent"] = result.structured
    if result.meta:
        out["_meta"] = result.meta
    return out


def _plain(result: Any, tool: dict[str, Any]) -> str:
    """What a person wants to read: a tool's scalar result bare (``1``, not ``{"result":1}``)."""
    schema = tool.get("outputSchema") or {}
    structured = result.structured
    if (
        isinstance(structured, dict) and list(structured) == ["result"]
        and list(schema.get("properties", {})) == ["result"] and schema.get("required") == ["result"]
    ):
        value = structured["result"]
        return value if isinstance(value, str) else json.dumps(value)
    return result.text


def register(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    listing = commands.add_parser("list", help="list the tools visible from a directory")
    listing.add_argument("--directory", "-C", help="project directory (default: the current one)")
    listing.add_argument("--all", action="store_true", help="include shadowed tools")
    listing.add_argument("--json", action="store_true", help="print JSON")
    listing.set_defaults(func=cmd_list)

    reload = commands.add_parser(
        "reload", help="load a project's tools again now, or one module of them",
        description="Load the tools of a project again now (changed or not: what they import may have "
        "changed where no watcher sees it), or only MODULE: a module's path, its file's name or stem, or "
        "a tool it defines. Prints the tools it serves and each load error; exit code 1 when one failed.",
    )
    reload.add_argument("module", nargs="?", metavar="MODULE", help="one module (default: every module of the project)")
    reload.add_argument("--project", "--directory", "-C", dest="directory", metavar="DIR",
                        help="a directory of the project (default: the current one)")
    reload.set_defaults(func=cmd_reload)

    call = commands.add_parser(
        "call", help="call a tool and print its result",
        description="Call a tool and print its result on stdout: text as it is, a single value bare "
        "(1, not {\"result\": 1}). Every error goes to stderr with a non-zero exit code: 1 when the "
        "tool failed (its error result, bad argument values, a timeout), 2 when the call was refused "
        "(an unknown tool, malformed key=value arguments). --json prints the whole result on stdout "
        "with the same exit codes.",
    )
    call.add_argument("name", help="tool name")
    call.add_argument(
        "arguments", nargs="*", metavar="key=value",
        help="arguments (values parsed as JSON unless the tool wants a string)",
    )
    call.add_argument("--args", metavar="JSON", help="arguments as one JSON object (a first argument {…} is taken so too)")
    call.add_argument("--json", action="store_true", help="print the whole MCP result as JSON (content, structuredContent, isError)")
    call.add_argument("--directory", "-C", help="project directory (default: the current one)")
    call.add_argument("--timeout", type=float, help="seconds this call may run")
    call.add_argument("--full", action="store_true",
                      help="print the whole output of a result cut at truncate_lines / truncate_bytes (not the head)")
    call.set_defaults(func=cmd_call, operands="arguments")
