"""``atomictoolsd new NAME [--json | --ts]``: write a commented tool file to start from.

Where it goes: a project's ``.atomic/tools/`` when the directory is in a project — an ancestor (the
home directory excepted) holds ``.atomic/``, or it is inside a git worktree — else the global
``~/.atomic/tools/``. It never overwrites a file, and needs no daemon: the daemon's file watch picks
the new file up.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from atomictoolsd.cli._common import EXIT_FAILED, EXIT_USAGE, safe

__all__ = ["json_template", "python_template", "register", "typescript_template"]


def python_template(name: str) -> str:
    """A tool module that loads as it is and shows each part of a tool, in comments that say why."""
    function = name.replace("-", "_")
    # A file name Python cannot name a function after (`my-tool`) gets its tool name from @tool.
    decorator = "@tool" if function == name else f"@tool(name={name!r})"
    return f'''"""The {name} tool, written by `atomictoolsd new`: edit it, save it, and the daemon reloads it.

The function named like this file is the tool `{name}`; more @tool functions in this file become
`{name}_<function>`. What a tool prints goes to the daemon's log (`atomictoolsd logs`), not to the
caller: return what the caller should see.
"""

from typing import Annotated

from atomictools import Context, Field, ToolError, tool


{decorator}
def {function}(
    # Each parameter becomes a field of the tool's JSON Schema; Field() describes and constrains it,
    # and a call that breaks a constraint is refused before this function runs.
    text: Annotated[str, Field("The text to repeat", min_length=1)],
    ctx: Context,  # not a parameter the caller sees: who is calling, from which project
    times: Annotated[int, Field("How many times to repeat it", ge=1, le=10)] = 1,
) -> str:
    """Repeat a text, and say which project the call came from.

    The docstring is the description the agent reads to decide when to use the tool.
    """
    if text.isspace():
        raise ToolError("text is only whitespace: give some words")  # the caller reads this message
    ctx.log("info", f"{name} called by {{ctx.agent or 'someone'}}")  # reaches the caller's MCP log
    return " ".join([text] * times) + f" (from {{ctx.directory}})"
'''


# A relative path with no ".." segment, that no "-" or "+" starts and that holds no "=", "|", "<", ">".
PROJECT_PATH_PATTERN = r"^(?!.*(^|/)\.\.(/|$))[A-Za-z0-9_.][A-Za-z0-9_./ ]*$"

def typescript_template(name: str) -> str:
    """An Atomic-style TypeScript tool (docs/javascript.md) that loads as it is, on Bun or Node."""
    return f'''// The {name} tool, written by `atomictoolsd new --ts`: edit it, save it, and the daemon reloads it.
//
// The default export is the tool `{name}` (the file's name); a named export `other` would be
// `{name}_other`. It runs on Bun, or Node 22.6+, in a worker of its own. What it prints goes to the
// daemon's log (`atomictoolsd logs`), not to the caller: return what the caller should see.
import {{ tool }} from "@atomic/plugin" // provided by atomictoolsd: nothing to install

export default tool({{
  // The description the agent reads to decide when to use the tool.
  description: "Repeat a text, and say which project the call came from",
  // Each argument is a Zod schema (tool.schema is Zod): it becomes a field of the tool's JSON
  // Schema, and a call that breaks a constraint is refused before execute runs.
  args: {{
    text: tool.schema.string().min(1).describe("The text to repeat"),
    times: tool.schema.number().int().min(1).max(10).default(1).describe("How many times to repeat it"),
  }},
  async execute(args, context) {{
    if (args.text.trim() === "") throw new Error("text is only whitespace: give some words") // the caller reads this
    // context: sessionID, messageID, agent, directory (the caller's project), worktree, and abort,
    // an AbortSignal that fires when the call is cancelled or times out.
    return Array(args.times).fill(args.text).join(" ") + ` (from ${{context.directory}})`
  }},
}})
'''


def json_template(name: str) -> str:
    """A declarative tool file (docs/declarative.md) with one shell tool that loads as it is."""
    document = {
        "name": name,
        "version": "0.1.0",
        "description": f"The {name} tools, written by `atomictoolsd new --json`; see docs/declarative.md.",
        "tools": [
            {
                "name": name,
                "description": "Count the lines, words and bytes of a file in the project.",
                "inputSchema": {
                    "type": "object",
                    "properties": {"path": {
                        "type": "string", "minLength": 1,
                        "description": "File to count, relative to the project's directory (no leading /, no ..)",
                        # The pattern keeps the path in the project, and a value that could read as
                        # an option or an assignment out of the command (docs/declarative.md).
                        "pattern": PROJECT_PATH_PATTERN,
                    }},
                    "required": ["path"],
                },
                "handler": {"type": "shell", "command": "wc -- {{path}}", "timeout": 5000},
            }
        ],
    }
    return json.dumps(document, indent=2) + "\n"


def target_dir(directory: Path, home: Path, use_global: bool) -> tuple[Path, Path | None]:
    """The tools dir to write into, and the project root (None for the global dir)."""
    from atomictoolsd.config.discovery import (
        git_worktree_root,
        global_tools_dir,
        local_tools_dir,
        project_root,
    )

    if not use_global:
        root = project_root(directory, home)
        in_project = (root / ".atomic").is_dir() and root != home.resolve() or git_worktree_root(directory.resolve())
        if in_project:
            return local_tools_dir(root), root
    return global_tools_dir(home), None


def cmd_new(args: argparse.Namespace) -> int:
    """Write the tool file; print where, and how to list and call its tool."""
    from atomictools._protocol import check_tool_name
    from atomictoolsd.config.command import command_name
    from atomictoolsd.config.paths import Paths
    from atomictoolsd.registry.trust import trust_offer

    problem = check_tool_name(args.name)
    if problem is None and not (args.json or args.ts) and not args.name.replace("-", "_").isidentifier():
        problem = f"{args.name!r} cannot name a Python function even with - as _; use letters, digits, _ and -, not starting with a digit"
    if problem:
        print(f"atomictoolsd: {problem}", file=sys.stderr)
        return EXIT_USAGE
    directory = Path(args.directory or os.getcwd())
    if not directory.is_dir():
        print(f"atomictoolsd: {safe(directory)} is not a directory", file=sys.stderr)
        return EXIT_USAGE
    home = Paths.from_env().home
    tools_dir, root = target_dir(directory, home, args.use_global)
    kind, template = (".json", json_template) if args.json else (".ts", typescript_template) if args.ts else (".py", python_template)
    path = tools_dir / (args.name + kind)
    tools_dir.mkdir(parents=True, exist_ok=True)
    try:
        with open(path, "x") as f:  # "x": a file already there is the user's work, never replaced
            f.write(template(args.name))
    except FileExistsError:
        print(f"atomictoolsd: {safe(path)} already exists; edit it, or choose another name", file=sys.stderr)
        return EXIT_FAILED
    command = command_name()
    print(f"wrote {safe(path)} ({'the project ' + safe(root) if root else 'your global tools, seen by every project'})")
    if root is not None and not _trusted(root):
        print(f"this project is not trusted yet, so its tools do not load; {trust_offer(root)['message']}")
    example = "path=README.md" if args.json else "text=hello times=2"
    where = "" if root is None or Path(os.getcwd()).resolve().is_relative_to(root) else f" -C {_quote(root)}"
    print(f"list it:  {command} list{where}")
    print(f"call it:  {command} call{where} {args.name} {example}")
    return 0


def _trusted(root: Path) -> bool:
    from atomictoolsd.config.paths import Paths
    from atomictoolsd.config.settings import (
        ConfigError,
        load_config,
    )
    from atomictoolsd.registry.trust import (
        TrustError,
        TrustStore,
    )

    paths = Paths.from_env()
    try:
        if load_config(paths.config_file).trust_all:
            return True
        return TrustStore(paths.state_dir).is_trusted(root)
    except (ConfigError, TrustError):
        return False


def _quote(path: Path) -> str:
    from atomictoolsd.config.command import shell_quote

    return shell_quote(str(path))


def register(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    new = commands.add_parser(
        "new", help="write a commented tool file to start from",
        description="Write a commented tool module NAME.py (typed parameters, a docstring, a Field "
        "constraint, a ctx use) — or, with --json, a declarative NAME.json, or with --ts, a TypeScript NAME.ts — into the project's "
        ".atomic/tools/ when the current directory is in a project (an ancestor holds .atomic/, or it "
        "is inside a git worktree), else into ~/.atomic/tools/. Never overwrites a file. A running "
        "daemon loads it at once.",
    )
    new.add_argument("name", metavar="NAME", help="the tool's name (letters, digits, _ and -, starting with a letter or _)")
    kind = new.add_mutually_exclusive_group()
    kind.add_argument("--json", action="store_true", help="a declarative JSON tool file instead of Python")
    kind.add_argument("--ts", action="store_true", help="a TypeScript tool file (Atomic's tool() helper) instead of Python")
    new.add_argument("--global", dest="use_global", action="store_true", help="into ~/.atomic/tools/ even in a project")
    new.add_argument("--directory", "-C", help="a directory of the project (default: the current one)")
    new.set_defaults(func=cmd_new)
