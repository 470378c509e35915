"""The ``shell`` handler: run a command from a template, never through a shell.

The template is split into words once, when the file loads (``shlex`` rules, so quotes in the
template group words as a reader expects). At call time each ``{{param}}`` is replaced inside its
own word: a value can never become two words, a flag the template did not write, or a command of its
own, because no shell ever reads the result. The program (the first word) is fixed by the template.

A value still lands where the template put it, and what the program makes of it there is the
program's. So a template is checked when the file loads (``commands.check``): a placeholder where a
shell, an interpreter or a wrapper runs it (``sh -c '… {{v}}'``, ``env -S``, ``ssh host …``) is
refused whatever its schema; free text may go only where the program reads data by its own
definition (``grep -rn -- {{pattern}} .``, ``sh -c 'grep -- "$1" f' sh {{pattern}}``); anywhere else
(where options are still read, any argument of a program the checker does not know, ``make``'s or
``perl -n``'s arguments) its parameter must be constrained by the schema (``check_schema``,
``constraints.constrained``), or named in the handler's ``unsafeFreeText``.

Runs inside a worker; the standard library and msgspec only.
"""

from __future__ import annotations

import functools
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Mapping
from typing import Annotated, Any

import msgspec

from atomictools._authoring import Context
from atomictools._errors import ToolError
from atomictoolsd.worker.declarative.commands import PLAIN, Unsafe, check
from atomictoolsd.worker.declarative.constraints import constrained
from atomictoolsd.worker.declarative.exitcodes import OkExitCodes
from atomictoolsd.worker.declarative.handler import Handler, TimeoutMs
from atomictoolsd.worker.declarative.templates import (
    PLACEHOLDER,
    SHELL_METACHARACTERS,
    TemplateError,
    ValueRejected,
    log,
    placeholders,
    value_text,
)

__all__ = ["DEFAULT_TIMEOUT_MS", "ShellHandler", "resolve_dir"]

DEFAULT_TIMEOUT_MS = 30_000
_POLL = 0.1  # seconds between checks for cancellation while the command runs

# Programs that run nothing the directory they run in names: they read their arguments, and the
# files those name, as data. Any other program may read the directory's own configuration and run
# what it says: git its .git/config (core.fsmonitor, hooks, filters), make its Makefile, npm its
# package.json, python the modules beside it. The options after a name run a program of their own.
_INERT: dict[str, frozenset[str]] = {
    **{name: frozenset() for name in PLAIN},
    "rg": frozenset({"--pre", "--hostname-bin"}), "find": frozenset({"-exec", "-execdir", "-ok", "-okdir"}),
    "sort": frozenset({"--compress-program"}), "jq": frozenset(), "tree": frozenset(), "uniq": frozenset(),
}

def resolve_dir(path: str | None, ctx: Context | None) -> str:
    """A directory named in a tool file: ``~`` expanded, relative to the caller's directory.

    The caller's directory is the one its session attached to; without one, the worker's own (the
    project root for a project's tools, the home directory for global ones).
    """
    base = (ctx.directory if ctx is not None else "") or os.getcwd()
    if not path:
        return base
    return os.path.normpath(os.path.join(base, os.path.expanduser(path)))


class ShellHandler(Handler, tag="shell"):
    """``{"type": "shell", "command": "...", "timeout": ms, "cwd": "...", "okExitCodes": [0, 1],
    "unsafeFreeText": ["param"]}``."""

    command: Annotated[str, msgspec.Meta(description="the command, split into words as a shell would")]
    timeout: TimeoutMs = DEFAULT_TIMEOUT_MS
    cwd: Annotated[str | None, msgspec.Meta(description="a path without {{placeholders}}")] = None
    ok_exit_codes: OkExitCodes = msgspec.field(default_factory=lambda: [0])
    unsafe_free_text: Annotated[list[str], msgspec.Meta(description='a list of parameter names, e.g. ["target"]')] = []

    def __post_init__(self) -> None:
        if not self.command.strip():
            raise TemplateError("handler.command must be a non-empty string")
        try:
            self.words = shlex.split(self.command)
        except ValueError as exc:
            raise TemplateError(f"handler.command cannot be split into words: {exc}") from None
        try:
            reading = check(self.words)
        except Unsafe as exc:
            raise TemplateError(str(exc)) from None
        self.single = reading.single  # words where a list value must not become several words
        self.guards = reading.guards  # placeholders whose schema must constrain them
        if self.cwd is not None and PLACEHOLDER.search(self.cwd):
            raise TemplateError("handler.cwd must be a path without {{placeholders}}")
        self.seconds = int(self.timeout) / 1000
        self.ok_codes = frozenset(self.ok_exit_codes)
        self.params = placeholders(self.command)
        self.unsafe = _unsafe_names(self.unsafe_free_text, self.params)
        here = self.cwd is None or not os.path.isabs(os.path.expanduser(self.cwd))
        if here and not _inert(self.words, self.unsafe):
            self.needs_trusted_directory = os.path.normpath(self.cwd or ".")

    def check_schema(self, schema: Mapping[str, Any]) -> None:
        """Refuse a placeholder the checker guards whose parameter ``schema`` (``$ref``s inlined)
        leaves free, unless the file names it in ``unsafeFreeText``.

        Raises:
            TemplateError: naming the parameter, where it lands, and the two ways to fix it.
        """
        properties = schema.get("properties")
        properties = properties if isinstance(properties, Mapping) else {}
        for guard in self.guards:
            if guard.param not in self.unsafe and not constrained(properties.get(guard.param)):
                raise TemplateError(guard.message())

    def argv(self, tool: str, args: Mapping[str, Any]) -> list[str]:
        """The argument list for one call.

        A word that is one placeholder becomes one argument (one per item when the value is a list)
        and disappears when the argument is absent or null; a word mixing text and placeholders
        disappears when any of them is absent.

        Raises:
            ValueRejected: a value holds a NUL byte or is too long.
        """
        out: list[str] = []
        suspicious: list[str] = []

        def text(name: str, value: Any) -> str:
            rendered = value_text(name, value)
            if not SHELL_METACHARACTERS.isdisjoint(rendered):
                suspicious.append(name)
            return rendered

        for index, word in enumerate(self.words):
            names = PLACEHOLDER.findall(word)
            if not names:
                out.append(word)
                continue
            placeholder_only = PLACEHOLDER.fullmatch(word)
            if placeholder_only is not None:
                name = placeholder_only.group(1)
                value = args.get(name)
                if value is None:
                    continue
                if isinstance(value, list) and index in self.single:
                    raise ValueRejected(
                        f"parameter {name!r} is a list, but the command takes exactly one argument there "
                        "(an option's value or an operand a program reads before others); several words could "
                        "add an option or a command. Send one value"
                    )
                if isinstance(value, list):
                    out.extend(text(name, item) for item in value)
                else:
                    out.append(text(name, value))
                continue
            if any(args.get(n) is None for n in names):
                continue
            out.append(PLACEHOLDER.sub(lambda m: text(m.group(1), args[m.group(1)]), word))
        if suspicious:
            log(
                "warning",
                f"tool {tool!r}: shell metacharacters in parameter(s) {', '.join(sorted(set(suspicious)))}; "
                "passed literally as arguments (no shell runs)",
            )
        return out

    def __call__(self, tool: str, args: dict[str, Any], ctx: Context) -> str:
        try:
            argv = self.argv(tool, args)
        except ValueRejected as exc:
            raise ToolError(f"Refused: {exc}") from None
        cwd = resolve_dir(self.cwd, ctx)
        if not os.path.isdir(cwd):
            raise ToolError(f"The working directory {cwd} does not exist")
        try:
            proc = subprocess.Popen(
                argv,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                # A process group of its own, so a timeout kills its children too; but the worker's
                # session, so it dies with the worker (the fork server ends the session: kill -9 of
                # the daemon, a worker killed for memory or for a call that would not stop).
                process_group=0,
                env=_git_environment(),
            )
        except FileNotFoundError:
            raise ToolError(f"Cannot run {argv[0]!r}: no such program on PATH") from None
        except PermissionError:
            raise ToolError(f"Cannot run {argv[0]!r}: permission denied") from None
        stdout, stderr = self._wait(proc, ctx)
        out = stdout.decode("utf-8", "replace")
        if proc.returncode in self.ok_codes:
            return out
        err = stderr.decode("utf-8", "replace")
        if proc.returncode < 0:
            try:
                how = f"was killed by {signal.Signals(-proc.returncode).name}"
            except ValueError:
                how = f"was killed by signal {-proc.returncode}"
        else:
            how = f"exited with code {proc.returncode}"
        parts = [f"Command {shlex.join(argv[:1])} {how}"]
        if err.strip():
            parts.append(f"stderr:\n{err.rstrip()}")
        if out.strip():
            parts.append(f"stdout:\n{out.rstrip()}")
        raise ToolError("\n\n".join(parts))

    def _wait(self, proc: subprocess.Popen[bytes], ctx: Context) -> tuple[bytes, bytes]:
        assert self.seconds is not None
        deadline = time.monotonic() + self.seconds
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                _kill(proc)
                raise ToolError(f"Command timed out after {self.seconds:g} s and was stopped")
            if ctx.cancelled:
                _kill(proc)
                raise ToolError("Command cancelled")
            try:
                return proc.communicate(timeout=min(remaining, _POLL))
            except subprocess.TimeoutExpired:
                continue


# What git is told for every command, above any config but the command line's: not to run itself in
# submodules unasked. The daemon judges the submodules a repository's index lists; a diff of history
# can reach a repository cloned where a submodule once was, which no index lists.
_GIT_OVERRIDES = {"diff.submodule": "short", "submodule.recurse": "false", "status.submoduleSummary": "false",
                  "fetch.recurseSubmodules": "false"}


@functools.cache
def _git_environment() -> dict[str, str]:
    """The worker's environment plus ``_GIT_OVERRIDES`` as ``GIT_CONFIG_KEY_n``/``VALUE_n`` after any
    the environment already has."""
    environ = dict(os.environ)
    count = environ.get("GIT_CONFIG_COUNT", "0")
    first = int(count) if count.isascii() and count.isdigit() else 0  # int() refuses some isdigit() ones
    for offset, (key, value) in enumerate(_GIT_OVERRIDES.items()):
        environ[f"GIT_CONFIG_KEY_{first + offset}"] = key
        environ[f"GIT_CONFIG_VALUE_{first + offset}"] = value
    environ["GIT_CONFIG_COUNT"] = str(first + len(_GIT_OVERRIDES))
    return environ


def _inert(words: list[str], unsafe: frozenset[str]) -> bool:
    """Whether the command runs nothing the directory it runs in names: its program is one of
    ``_INERT``, found on ``PATH`` (a path such as ``./build.sh`` or ``bin/grep`` names a file of the
    directory), with none of the options that run a program, and no parameter left free to add one."""
    program = words[0]
    running = _INERT.get(program)  # its exact name: no version or build of another program
    if unsafe or running is None:
        return False
    return not any(_runs(word.split("=", 1)[0], running) for word in words[1:])


def _runs(option: str, running: frozenset[str]) -> bool:
    """Whether ``option`` is one of ``running``, or a long option's prefix (GNU programs take
    ``--compress`` for ``--compress-program``)."""
    return option in running or (
        option.startswith("--") and len(option) > 2 and any(o.startswith(option) for o in running))


def _unsafe_names(names: list[str], params: list[str]) -> frozenset[str]:
    """The parameters the file lets take free text wherever the command puts them (``unsafeFreeText``)."""
    unused = [n for n in names if n not in params]
    if unused:
        raise TemplateError(f"handler.unsafeFreeText names {', '.join(map(repr, unused))}, which handler.command does not use")
    return frozenset(names)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.communicate(timeout=2)
    except subprocess.TimeoutExpired:
        # A descendant that left the group still holds the pipes: stop reading them, reap the command.
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
        proc.wait()
