"""Where a ``shell`` template's values land: refuse a template whose value a program would run.

The ``shell`` handler never runs a shell, so a value is always one argument. What that argument
becomes is up to the program that reads it, and no table of programs can say that for every
program. So the rule is positive: a free-text value may go only where the program's reading of it
is known to be data; anywhere else the value must be constrained by its schema (``Guard``, judged
by ``shell.ShellHandler.check_schema``), or the tool file must say, by a key named unsafe, that its
author takes that on. ``check`` walks a template's words the way the programs it knows read their
arguments (clustered short options, ``--``, options still read after ``-e``, ``env -S`` splitting,
wrappers in front of wrappers) and, for each placeholder:

- raises ``Unsafe`` where no value may go, whatever its schema: the program (``{{prog}} …``, also as
  the command of a wrapper), the script or module an interpreter loads, the code an interpreter or
  shell runs, a command line something hands to a shell, the argument of an interpreter's or
  wrapper's own option, inside an option word (``-{{v}}``), the name of a variable ``env`` sets,
  and the value of one that the dynamic loader, a shell or a language runtime reads as code, as
  options, or as what to load or run (``LD_PRELOAD``, ``BASH_ENV``, ``NODE_OPTIONS``, ``GIT_PAGER``:
  ``RUNS_VARIABLE``);
- lets it be (free text) where it is data by the program's own definition: an argument of a
  program in the table of programs whose arguments are data (``grep``, ``ls``, ``git log`` …, each
  read as it reads them: after ``--``, or as the argument of an option that takes data), or an
  argument of code the template gives an interpreter that hands its arguments to that code
  untouched (``python3 -c '…' {{v}}``, ``sh -c '…' sh {{v}}``, ``node -e '…' -- {{v}}``);
- records a ``Guard`` everywhere else: where a program still reads its options (a value starting
  with ``-`` would be one), and every argument of a program the table does not know, or whose
  arguments it knows to be more than data (``make`` reads ``NAME=VALUE``, ``perl -n`` opens ``x|``
  as a command, ``awk`` assigns ``v=x`` operands).

When a reading is ambiguous (an option the table does not know may or may not take the next word),
every reading is checked, and the strictest answer holds.

Must never run anything: this is read when a file loads. Standard library only.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass, field, replace

from atomictoolsd.worker.declarative.templates import PLACEHOLDER

__all__ = ["RUNS_VARIABLE", "Guard", "Reading", "Unsafe", "check", "program_name"]

# The roles a word can have. "data" takes free text, "guard" a value its schema constrains, the rest nothing.
DATA = "data"
CODE = "code"  # code the program runs
SCRIPT = "script"  # a file or module of code the program loads
PROGRAM = "program"  # the program itself
OPTION = "option"  # the program's own options, or where it still reads them
LINE = "line"  # words joined into a command line that a shell reads
VARIABLE = "variable"  # the name of an environment variable (``env NAME=VALUE``)
MAIN = "main"  # in the option table: a script or code that is the program's main program (``python -m``)
GUARD = "guard"  # data the program may read as more than data: a value there must be constrained
ASSIGN = "assign"  # in the option table: NAME=VALUE, whose VALUE is data (``awk -v``)
SETTING = "setting"  # the value of an environment variable that something runs or loads (``RUNS_VARIABLE``)

# The names of environment variables whose value the dynamic loader, a shell, a language runtime or
# a build tool (or git, a pager's user) reads as code, as its own options, as what to load or run,
# or as where its configuration is (a config may run code: git's ``core.pager``, OpenSSL's engines):
# the families, not each name (``LD_*``, ``PYTHON*``, ``*PATH``, ``*_OPTIONS``, ``*FLAGS``,
# ``*_COMMAND``, the compiler ``make`` runs (``CC``), ``HOME``, ``*CONF*`` …).
RUNS_VARIABLE = re.compile(
    r"(?:LD|DYLD|BASH_FUNC|NODE|(?i:npm_config)|JAVA|_JAVA|JDK_JAVA|GCONV|LUA|DENO|BUN|MALLOC|GLIBC|CARGO|PIP|UV)_.*"
    r"|(?:PYTHON|PERL|RUBY|RUSTC|RUSTDOC).*|GIT_(?!(?:AUTHOR|COMMITTER)_(?:NAME|EMAIL|DATE)$).*"
    r"|BASH_ENV|ENV|PS4|PROMPT_COMMAND|SHELLOPTS|BASHOPTS|IFS|SHELL|EDITOR|VISUAL|BROWSER|TERMINFO|HOSTALIASES"
    r"|LESSOPEN|LESSCLOSE|LESS|MORE|.*PAGER|.*PATH|.*LIB|.*OPTS?|.*OPTIONS|.*FLAGS|.*_COMMAND|.*_CMD|.*ASKPASS"
    r"|.*_EDITOR|.*_SSH|.*_PROGRAM|.*_HOOKS?|.*_SHELL|.*_WRAPPER|.*_LAUNCHER|.*_RUNNER"
    r"|CC|CXX|CPP|FC|F77|AR|AS|LD|NM|RANLIB|STRIP|OBJCOPY|OBJDUMP|MAKE|AWK|M4|YACC|LEX"  # what make and configure run
    r"|ZDOTDIR|XDG_.*|BUNDLE_.*|.*HOME|.*CONF.*|.*RC|.*_DIRS?"  # where configs are found
)


class Unsafe(Exception):
    """A placeholder lands where a program would run it; ``str()`` says where and what to do."""

    def __init__(self, word: str, role: str, program: str, via: str | None) -> None:
        self.word, self.role, self.program, self.via = word, role, program, via
        match = PLACEHOLDER.search(word)
        self.param = match.group(1) if match else "?"
        super().__init__(self._message())

    def _message(self) -> str:
        p, prog, word = f"{{{{{self.param}}}}}", self.program, self.word
        run_by = f" (run by {self.via})" if self.via else ""
        if self.role == PROGRAM:
            if not prog:
                return "handler.command must start with a fixed program name; a parameter cannot choose the program"
            return (f"handler.command lets {p} choose the program that {prog} runs ({word!r}): a value there "
                    f"would run any program. Name the program in the template and pass the value as its argument")
        if self.role == CODE:
            if prog in SHELL_NAMES:
                fix = f"as an argument after the code, e.g. {prog} -c '... \"$1\" ...' {prog} {p}"
            elif prog in ("perl", "ruby", "awk"):  # they may read an argument as more than data
                fix = f"as the value of a variable the code reads, e.g. env P={p} {prog} ... (perl: $ENV{{P}})"
            else:
                fix = (f"as an argument after the code, where the code reads it (sys.argv, process.argv, ARGV), "
                       f"e.g. python3 -c 'import sys; print(sys.argv[1])' {p}")
            return (f"handler.command puts {p} inside the code that {prog}{run_by} runs ({word!r}): a value there "
                    f"would run as code. Pass it {fix} instead")
        if self.role == SCRIPT:
            return (f"handler.command lets {p} choose the script or module that {prog}{run_by} runs ({word!r}): "
                    f"a value there picks the code. Name the script in the template and pass the value after it "
                    f"(e.g. {prog} tool-script {p})")
        if self.role == SETTING:
            name = word.partition("=")[0]
            return (f"handler.command puts {p} in {name}, a variable whose value is run or loaded (as code, options, "
                    f"or a program or library to run) ({word!r}): a value there would run. Pass it in a variable of "
                    f"a name of your own, e.g. env P={p} …")
        if self.role == VARIABLE:
            return (f"handler.command lets {p} name an environment variable that {prog} sets ({word!r}): a "
                    f"variable such as PERL5OPT or LD_PRELOAD runs code. Write the name in the template: NAME={p}")
        if self.role == OPTION:
            return (f"handler.command puts {p} where {prog}{run_by} reads its own options ({word!r}): a value there "
                    f"could be an option that runs code (such as -e or -c), or choose what is loaded. Put it after "
                    f"the script or code, behind -- (e.g. {prog} … -- {p})")
        return (f"handler.command puts {p} in a command line that {prog}{run_by} hands to a shell ({word!r}): a "
                f"value there would run as a command. Run the program directly instead, with the value as an "
                f"argument of its own")


@dataclass(frozen=True)
class Guard:
    """A placeholder whose value must be constrained by its schema: ``where`` is ``option`` (the
    program still reads its options there), ``guard`` (the program may read it as more than data)
    or ``unknown`` (the table does not know how the program reads its arguments)."""

    param: str
    word: str
    index: int  # the word's place in the template (0: the program), -1 for a word ``env -S`` made
    program: str
    where: str
    via: str | None

    def message(self) -> str:
        p, prog = f"{{{{{self.param}}}}}", self.program
        run_by = f" (run by {self.via})" if self.via else ""
        at = f"{self.word!r}, word {self.index + 1} of the command" if self.index >= 0 else repr(self.word)
        if self.where == OPTION:
            what = (f"where {prog}{run_by} still reads its own options ({at}): a value starting "
                    f"with - would be one (such as -e, which runs code)")
        elif self.where == "unknown":
            what = (f"in an argument of {prog}{run_by} ({at}), a program whose reading of its arguments "
                    f"is not known here (see the programs whose arguments are data in docs/declarative.md): "
                    f"a value there could be an option, an assignment (NAME=VALUE) or a command to open (x|)")
        else:
            what = (f"in an argument of {prog}{run_by} ({at}) that {prog} may read as more than data: "
                    f"an option, an assignment (NAME=VALUE) or a command to open (x|)")
        return (f"handler.command puts {p}, whose schema lets it be any text, {what}. Constrain "
                f"{self.param!r} in inputSchema instead: an enum, or a string whose pattern, anchored ^...$, admits "
                f"no - or + first and no =, |, < or > (e.g. \"^[A-Za-z0-9_./][A-Za-z0-9_./-]*$\"), or an integer "
                f"with a minimum of 0; or, to pass any text there at your own risk, name it in the handler: "
                f"\"unsafeFreeText\": [\"{self.param}\"]")


@dataclass
class Reading:
    """What ``check`` found: the words where a list value must stay one value (``single``), and the
    placeholders whose value must be constrained (``guards``)."""

    single: set[int] = field(default_factory=set)
    guards: list[Guard] = field(default_factory=list)

    def guard(self, word: str, program: str, where: str, via: str | None) -> None:
        for match in PLACEHOLDER.finditer(word):
            self.guards.append(Guard(match.group(1), word, getattr(word, "at", -1), program, where, via))


@dataclass(frozen=True)
class Program:
    """How a program reads its arguments. ``short`` and ``long`` map an option to what it takes:
    ``flag``; ``arg:ROLE`` (the rest of the cluster or the next word); ``opt:ROLE`` (only attached,
    possibly empty: ``perl -l0``); ``mode`` (its first operand is code: ``sh -c``); ``split`` (its
    argument is split into more words: ``env -S``); ``line`` (what follows is a command line:
    ``sudo -s``); ``command`` (what follows is a command: ``gdb --args``). A role ending in ``!``
    ends the options (``python -c``). ``DATA`` is data by the program's own definition (free text
    may go there); ``GUARD`` is an argument it may read as more than data. A program in ``PLAIN``
    needs no entry: every argument is data to it, its options included."""

    runner: bool = False  # what follows the options is a command it runs (after ``lead`` operands)
    short: dict[str, str] = field(default_factory=dict)
    long: dict[str, str] = field(default_factory=dict)
    operands: tuple[str, ...] = (SCRIPT, DATA)  # roles of successive operands; the last repeats
    then: str = "command"  # runners: "command" or "line"
    lead: int = 0  # runners: data operands before the command (``timeout 5 cmd``)
    permute: bool = False  # options are read after operands too (GNU getopt: ``sed p -e …``)
    plus: bool = False  # ``+o`` is an option too (shells)
    single_dash_long: bool = False  # ``-eval``, ``-Command``
    assign: bool = False  # ``NAME=VALUE`` operands come before the command (``env``)
    subcommands: dict[str, tuple[str, ...]] = field(default_factory=dict)
    code_main: bool = True  # code given by an option is the program (not so for ``gdb -ex``)
    argv: str = DATA  # the role of the arguments of code an option gave (``python -c … ARGS``)
    unknown: str = ""  # the role of an unknown option's argument: by default data for runners, else option
    lead_as: str = DATA  # runners: the role of their ``lead`` operands (``chroot DIR``: guarded)
    subprograms: dict[str, Program] = field(default_factory=dict)  # subcommands read as programs of their own
    others: str = ""  # GUARD: every argument after a subcommand in neither table is guarded


def _opts(spec: str) -> dict[str, str]:
    """``"abc:flag e:arg:code"`` → ``{"a": "flag", "b": "flag", "c": "flag", "e": "arg:code"}``."""
    out: dict[str, str] = {}
    for part in spec.split():
        letters, _, what = part.partition(":")
        for letter in letters:
            out[letter] = what
    return out


def _longs(spec: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in spec.split():
        name, _, what = part.partition(":")
        out[name] = what or "flag"
    return out


_SH = Program(short=_opts("abefhikmnprstuvxBCEHPTlDsIX0123456789:flag oO:arg:option c:mode"), plus=True,
              long=_longs("login noprofile norc posix restricted verbose version help noediting debugger "
                          "dump-strings dump-po-strings pretty-print rcfile:arg:script init-file:arg:script"))
_CSH = Program(short=_opts("bdefimnqstvVxX:flag c:mode"), plus=True)
_FISH = Program(short=_opts("ilnpPvhN:flag dD:arg:option cC:arg:code"),
                long=_longs("command:arg:code init-command:arg:code login interactive no-execute private "
                            "version help no-config features:arg:option debug:arg:option"))
_PYTHON = Program(short=_opts("bBdEhiIOPqsSuvVxR3:flag WX:arg:option c:arg:code! m:arg:main!"),
                  long=_longs("help version help-env help-xoptions help-all check-hash-based-pycs:arg:option"))
# perl opens each argument with the two-argument open when -n, -p or <> reads them: "x|" runs x.
_PERL = Program(short=_opts("acfhnpsStTuUvwWX:flag eE:arg:code IMm:arg:script F:arg:option 0CdDilVx:opt:option"),
                operands=(SCRIPT, GUARD), argv=GUARD)
_RUBY = Program(short=_opts("acdlnpsSvwyh:flag e:arg:code rI:arg:script CEFK:arg:option 0TWx:opt:option"),
                long=_longs("version verbose help copyright yjit jit enable:arg:option disable:arg:option "
                            "encoding:arg:option external-encoding:arg:option internal-encoding:arg:option "
                            "dump:arg:option"),
                operands=(SCRIPT, GUARD), argv=GUARD)  # ruby -s reads switches from the arguments
# node reads no clusters, only its own aliases (``-pe`` is ``--print --eval``).
_NODE = Program(single_dash_long=True,
                long=_longs("e:arg:code p:arg:code pe:arg:code eval:arg:code print:arg:code r:arg:script "
                            "require:arg:script import:arg:script loader:arg:script experimental-loader:arg:script "
                            "C:arg:option input-type:arg:option conditions:arg:option c check i interactive v "
                            "version h help"))
_PHP = Program(short=_opts("aChHilmnqsvw:flag rBRE:arg:code f:arg:main Fz:arg:script dct:arg:option"))
_LUA = Program(short=_opts("iEvW:flag e:arg:code l:arg:script"))
# awk reads an operand NAME=VALUE as an assignment to the program's variables.
_AWK = Program(short=_opts("v:arg:assign F:arg:data f:arg:main e:arg:code E:arg:main! il:arg:script"),
               operands=(CODE, GUARD), argv=GUARD,
               long=_longs("file:arg:main source:arg:code exec:arg:main! include:arg:script load:arg:script "
                           "assign:arg:assign field-separator:arg:data sandbox posix traditional lint characters-as-bytes"))
_SED = Program(short=_opts("nsuzErbv:flag l:arg:data e:arg:code f:arg:main i:opt:option"), operands=(CODE, DATA),
               permute=True,
               long=_longs("expression:arg:code file:arg:main quiet silent debug posix sandbox separate "
                           "unbuffered null-data regexp-extended follow-symlinks line-length:arg:data "
                           "in-place:flag"))
_R = Program(short=_opts("e:arg:code f:arg:main"),
             long=_longs("vanilla no-save save no-restore no-environ no-site-file no-init-file quiet silent "
                         "slave no-echo verbose version help file:arg:main default-packages:arg:script"))
_JULIA = Program(short=_opts("qhvi:flag eE:arg:code L:arg:script pt:arg:option"),
                 long=_longs("eval:arg:code print:arg:code load:arg:script project:arg:option startup-file:arg:option"))
_TCL = Program(short=_opts("c:arg:code f:arg:main"))  # tclsh/wish take a script; expect -c is code
_OSASCRIPT = Program(short=_opts("e:arg:code l:arg:option s:arg:option i:flag"))
_PWSH = Program(single_dash_long=True, short=_opts("c:line e:line f:arg:main!"),
                long=_longs("command:line c:line encodedcommand:line ec:line e:line file:arg:main! f:arg:main! "
                            "noprofile nologo noninteractive nop noni executionpolicy:arg:option ep:arg:option"))
_GDB = Program(code_main=False, single_dash_long=True, operands=(SCRIPT, GUARD),
               short=_opts("nqx:flag"),
               long=_longs("ex:arg:code eval-command:arg:code x:arg:script command:arg:script iex:arg:code "
                           "ix:arg:script init-eval-command:arg:code batch nx quiet q n args:command"))
_VIM = Program(code_main=False, short=_opts("c:arg:code S:arg:script"), operands=(GUARD,))  # +CMD runs CMD
_SQLITE = Program(code_main=False, single_dash_long=True, operands=(GUARD, CODE),
                  long=_longs("cmd:arg:code init:arg:script bail batch csv json line list readonly"))
_PSQL = Program(code_main=False, short=_opts("c:arg:code f:arg:script v:arg:option"), operands=(GUARD,),
                long=_longs("command:arg:code file:arg:script set:arg:option variable:arg:option"))
_MYSQL = Program(code_main=False, short=_opts("e:arg:code"), operands=(GUARD,), long=_longs("execute:arg:code init-command:arg:code"))
_EMACS = Program(code_main=False, single_dash_long=True, operands=(GUARD,),
                 long=_longs("eval:arg:code l:arg:script load:arg:script f:arg:code funcall:arg:code "
                             "batch q Q no-init-file"))
_DENO = Program(operands=(SCRIPT, DATA), short=_opts("A:flag"),
                subcommands={"eval": (CODE, DATA), "run": (SCRIPT, DATA), "x": (SCRIPT, DATA),
                             "repl": (GUARD,), "fmt": (DATA,), "lint": (DATA,), "check": (DATA,), "test": (SCRIPT,),
                             "task": (CODE, DATA), "install": (SCRIPT, DATA), "compile": (SCRIPT, DATA)})
_BUN = Program(short=_opts("e:arg:code p:arg:code r:arg:script"), operands=(SCRIPT, DATA),
               long=_longs("eval:arg:code print:arg:code preload:arg:script"),
               subcommands={"run": (SCRIPT, DATA), "x": (SCRIPT, DATA), "exec": (CODE, DATA),
                            "test": (SCRIPT,), "install": (SCRIPT,), "add": (SCRIPT,)})

# Wrappers that run a command given as their operands (after their options and ``lead`` operands).
_ENV = Program(runner=True, assign=True, short=_opts("i0v:flag uC:arg:data P:arg:program S:split"),
               long=_longs("ignore-environment null debug list-signal-handling unset:arg:data chdir:arg:data "
                           "split-string:split block-signal:flag default-signal:flag ignore-signal:flag"))
_SUDO = Program(runner=True, short=_opts("AbEeHkKlnPSVvhBN:flag CDhpTt:arg:data gRrUu:arg:guard si:line"),
                long=_longs("login:line shell:line user:arg:guard group:arg:guard chdir:arg:data "
                            "preserve-env:flag non-interactive stdin askpass background"))
_DOAS = Program(runner=True, short=_opts("nL:flag C:arg:data u:arg:guard s:line"))
_NICE = Program(runner=True, short=_opts("0123456789:flag n:arg:data"), long=_longs("adjustment:arg:data"))
_PLAIN = Program(runner=True)  # nohup, builtin, …
_TIME = Program(runner=True, short=_opts("pvqV:flag f:arg:data o:arg:guard"),
                long=_longs("format:arg:data output:arg:guard append portability verbose quiet"))
_COMMAND = Program(runner=True, short=_opts("pvV:flag"))
_EXEC = Program(runner=True, short=_opts("cl:flag a:arg:data"))
_STDBUF = Program(runner=True, short=_opts("ioe:arg:data"), long=_longs("input:arg:data output:arg:data error:arg:data"))
_SETSID = Program(runner=True, short=_opts("cfw:flag"), long=_longs("ctty fork wait"))
_TIMEOUT = Program(runner=True, lead=1, short=_opts("v:flag sk:arg:data"),
                   long=_longs("signal:arg:data kill-after:arg:data preserve-status foreground verbose"))
_CHRT = Program(runner=True, lead=1, short=_opts("abdefiomrRv:flag TPD:arg:data"))
_IONICE = Program(runner=True, short=_opts("t:flag cnpPu:arg:data"))
_TASKSET = Program(runner=True, lead=1, short=_opts("acp:flag"))
_CHROOT = Program(runner=True, lead=1, lead_as=GUARD, long=_longs("userspec:arg:guard groups:arg:guard skip-chdir"))
_XARGS = Program(runner=True, short=_opts("0oprtx:flag dELnPs:arg:data aI:arg:guard e:opt:data il:opt:guard"),
                 long=_longs("null open-tty interactive no-run-if-empty verbose exit arg-file:arg:guard "
                             "delimiter:arg:data max-args:arg:data max-procs:arg:data max-chars:arg:data "
                             "replace:flag max-lines:flag eof:flag process-slot-var:arg:variable"))
_FLOCK = Program(runner=True, lead=1, permute=True, short=_opts("sxeunoF:flag wE:arg:data c:arg:code"),
                 long=_longs("shared exclusive unlock nonblock close no-fork verbose timeout:arg:data "
                             "wait:arg:data conflict-exit-code:arg:data command:arg:code"))
_SCRIPT = Program(runner=True, then=GUARD, short=_opts("aefqk:flag Em:arg:data IOTB:arg:guard c:arg:code"),
                  long=_longs("command:arg:code append return flush quiet log-in:arg:guard log-out:arg:guard "
                              "log-io:arg:guard log-timing:arg:guard echo:arg:data logging-format:arg:data"))
_SU = Program(runner=True, then=LINE, short=_opts("lmpfP:flag gGw:arg:guard s:arg:program c:arg:code"),
              long=_longs("login preserve-environment pty group:arg:guard supp-group:arg:guard "
                          "whitelist-environment:arg:guard shell:arg:program command:arg:code "
                          "session-command:arg:code"))
_SG = Program(runner=True, lead=1, lead_as=GUARD, then=LINE, short=_opts("c:arg:code"))
_WATCH = Program(runner=True, then=LINE, short=_opts("bcegtxpwrC:flag nq:arg:data d:opt:data"),
                 long=_longs("beep color differences:flag errexit exec interval:arg:data precise no-title "
                             "no-wrap no-rerun chgexit equexit:arg:data"))
_SSH = Program(runner=True, lead=1, then=LINE, permute=True,
               short=_opts("46AaCfGgKkMNnqsTtVvXxYy:flag BbcDeIiJLlmOpQRSWw:arg:data E:arg:guard oF:arg:code"))
_LINE = Program(runner=True, then=LINE)  # eval, parallel: the words become a command line
_NPX = Program(runner=True, short=_opts("yq:flag c:arg:code p:arg:program"),
               long=_longs("yes no quiet call:arg:code package:arg:program"))
_UVX = Program(runner=True, short=_opts("qv:flag p:arg:program"),
               long=_longs("from:arg:program with:arg:program python:arg:program quiet verbose"))
# strace, valgrind, systemd-run, …: unknown options are read every way, their arguments guarded
# (systemd-run -p ExecStartPre=… runs a command).
_GENERIC = Program(runner=True, unknown=GUARD)

# More interpreters and runners, so that their code, scripts and commands are refused whatever the
# schema says (a constrained value can still be code to a program that runs an argument).
_IPYTHON = Program(short=_opts("ihV:flag c:arg:code! m:arg:main!"),
                   long=_longs("profile:arg:option ipython-dir:arg:script config:arg:script c:arg:code m:arg:main "
                               "quick classic no-banner no-confirm-exit pylab:arg:option gui:arg:option"))
_XONSH = Program(short=_opts("ilDV:flag c:arg:code! "), long=_longs("rc:arg:script interactive login no-rc shell-type:arg:option"))
_NU = Program(short=_opts("ilnh:flag c:arg:code e:arg:code"),
              long=_longs("commands:arg:code execute:arg:code config:arg:script env-config:arg:script plugin-config:arg:script "
                          "include-path:arg:script login interactive no-config-file stdin help version"))
_DC = Program(short=_opts("hV:flag e:arg:code f:arg:main"), long=_longs("expression:arg:code file:arg:main"),
              operands=(SCRIPT,))
_BC = Program(short=_opts("hilqsvwg:flag e:arg:code f:arg:main"), operands=(SCRIPT,),
              long=_longs("expression:arg:code file:arg:main mathlib quiet standard warn"))
_JVM_SCRIPT = Program(short=_opts("e:arg:code"), long=_longs("eval:arg:code"))  # groovy, kotlin, scala, elixir, …
_PLAIN_SCRIPT = Program()  # runghc, escript: a script, then its arguments
_ERL = Program(single_dash_long=True, long=_longs("eval:arg:code s:arg:code run:arg:code noshell noinput pa:arg:script "
                                                   "pz:arg:script sname:arg:data name:arg:data"))
_GUILE = Program(short=_opts("cCeLlsx:arg:code"), long=_longs("no-auto-compile debug"))
_LISP = Program(single_dash_long=True, short=_opts("x:arg:code i:arg:script"),
                long=_longs("eval:arg:code load:arg:script script:arg:main script non-interactive"))
_JAVA = Program(single_dash_long=True, operands=(SCRIPT, DATA),
                long=_longs("jar:arg:main! cp:arg:script classpath:arg:script p:arg:script module-path:arg:script "
                            "m:arg:main! module:arg:main! javaagent:arg:script agentlib:arg:script agentpath:arg:script "
                            "version showversion"))
_MAKE = Program(permute=True, operands=(GUARD,), unknown=GUARD, code_main=False,
                short=_opts("BbeiknpqrRsStvw:flag fI:arg:script C:arg:script E:arg:code oW:arg:data jlO:opt:data"),
                long=_longs("file:arg:script makefile:arg:script directory:arg:script include-dir:arg:script "
                            "eval:arg:code old-file:arg:data assume-old:arg:data what-if:arg:data new-file:arg:data "
                            "assume-new:arg:data jobs:arg:data load-average:arg:data always-make dry-run just-print "
                            "silent quiet keep-going ignore-errors environment-overrides"))
_UV_RUN = Program(runner=True, short=_opts("qv:flag p:arg:program w:arg:program"),
                  long=_longs("with:arg:program from:arg:program python:arg:program with-requirements:arg:script "
                              "project:arg:script directory:arg:script env-file:arg:script script module quiet verbose "
                              "no-project isolated frozen locked"))
_UV = Program(subprograms={"run": _UV_RUN, "tool": Program(subprograms={"run": _UVX}, others=GUARD)},
              subcommands={"pip": (SCRIPT,), "add": (SCRIPT,), "sync": (SCRIPT,)}, others=GUARD)
_PIPX = Program(subprograms={"run": Program(runner=True, long=_longs("spec:arg:program python:arg:program"))},
                subcommands={"install": (SCRIPT,), "inject": (DATA, SCRIPT), "upgrade": (SCRIPT,)}, others=GUARD)
_NPM_EXEC = Program(runner=True, short=_opts("yq:flag c:arg:code p:arg:program"),
                    long=_longs("yes no quiet call:arg:code package:arg:program"))
_NODE_PM = Program(subprograms={"exec": _NPM_EXEC, "x": _NPM_EXEC, "dlx": _NPM_EXEC},
                   subcommands={name: (SCRIPT,) for name in ("run", "run-script", "install", "i", "add", "ci", "test",
                                                             "start", "create", "init")},
                   others=GUARD)  # npm, pnpm, yarn: run a package's scripts, install what runs code
_PRLIMIT = Program(runner=True, short=_opts("cdefilmnqrstuvxy:opt:data p:arg:data o:arg:data"),
                   long=_longs("pid:arg:data output:arg:data noheadings raw verbose"))
_SETARCH = Program(runner=True, lead=1, permute=True, short=_opts("vRFZLXBIST3:flag"), long=_longs("verbose uname-2.6 list"))

# Programs whose arguments are all data to them, their options included: none of their options
# runs, loads or writes anything (``grep -f`` reads a list of patterns, ``ls -R`` lists more).
PLAIN = frozenset({
    "echo", "printf", "true", "false", "sleep", "basename", "dirname", "realpath", "readlink", "pwd", "whoami",
    "id", "uname", "ls", "cat", "tac", "head", "tail", "wc", "nl", "rev", "cut", "paste", "join", "tr", "expand",
    "unexpand", "fold", "fmt", "seq", "od", "hexdump", "base64", "base32", "strings", "md5sum", "sha1sum",
    "sha224sum", "sha256sum", "sha384sum", "sha512sum", "b2sum", "cksum", "stat", "du", "df", "diff", "cmp", "comm",
    "grep", "egrep", "fgrep", "zgrep", "touch", "mkdir", "which",
})
# Programs whose arguments are data where they read data: after --, or as an option's data; where
# they still read options (some of which run or write something) a value must be constrained.
_RG = Program(permute=True, operands=(DATA,), unknown=GUARD,
              short=_opts("iIsSvwxFLPUzacnNlqopuh0:flag efgtTmABCjMEdr:arg:data"),
              long=_longs("regexp:arg:data file:arg:data glob:arg:data iglob:arg:data type:arg:data "
                          "type-not:arg:data max-count:arg:data after-context:arg:data before-context:arg:data "
                          "context:arg:data threads:arg:data max-columns:arg:data encoding:arg:data "
                          "max-depth:arg:data max-filesize:arg:data replace:arg:data sort:arg:data sortr:arg:data "
                          "type-add:arg:data pre:arg:program hostname-bin:arg:program pre-glob:arg:data ignore-file:arg:data "
                          "ignore-case smart-case fixed-strings word-regexp line-number hidden no-ignore "
                          "files-with-matches count json vimgrep"))
_SORT = Program(permute=True, operands=(DATA,), unknown=GUARD,
                short=_opts("bdfgiMhnRrVcCmsuz:flag ktST:arg:data o:arg:guard"),
                long=_longs("key:arg:data field-separator:arg:data buffer-size:arg:data temporary-directory:arg:data "
                            "output:arg:guard compress-program:arg:program files0-from:arg:data batch-size:arg:data "
                            "parallel:arg:data sort:arg:data random-source:arg:data"))
_UNIQ = Program(permute=True, operands=(DATA, GUARD), unknown=GUARD,  # uniq INPUT OUTPUT writes OUTPUT
                short=_opts("cdDiuz:flag fsw:arg:data"),
                long=_longs("skip-fields:arg:data skip-chars:arg:data check-chars:arg:data all-repeated:flag group:flag"))
_DATE = Program(permute=True, operands=(DATA,), unknown=GUARD,
                short=_opts("Ru:flag dfr:arg:data s:arg:guard I:opt:data"),
                long=_longs("date:arg:data file:arg:data reference:arg:data set:arg:guard utc universal rfc-email"))
_JQ = Program(permute=True, operands=(GUARD, DATA), unknown=GUARD, code_main=False,  # the filter is a program
              short=_opts("acCeMnrRsSjh:flag f:arg:script L:arg:script"),
              long=_longs("arg:arg:guard argjson:arg:guard slurpfile:arg:guard rawfile:arg:guard from-file:arg:script "
                          "indent:arg:data tab raw-output join-output compact-output slurp null-input exit-status "
                          "args jsonargs sort-keys"))
_GIT_READ = dict(permute=True, operands=(DATA,), unknown=GUARD, code_main=False)
_GIT_DIFF_OPTIONS = ("stat name-only name-status numstat shortstat patch no-patch raw cached staged no-color color "
                     "ignore-all-space ignore-space-change word-diff:flag unified:arg:data diff-filter:arg:data "
                     "output:arg:guard relative:flag src-prefix:arg:data dst-prefix:arg:data find-renames:flag "
                     "ext-diff no-ext-diff textconv no-textconv")
_GIT_LOG = Program(**_GIT_READ, short=_opts("pPsuzqrt:flag nSGLU:arg:data"),
                   long=_longs("max-count:arg:data skip:arg:data since:arg:data after:arg:data until:arg:data "
                               "before:arg:data author:arg:data committer:arg:data grep:arg:data format:arg:data "
                               "pretty:arg:data date:arg:data oneline abbrev-commit all follow reverse merges "
                               "no-merges first-parent graph decorate " + _GIT_DIFF_OPTIONS))
_GIT_DIFF = Program(**_GIT_READ, short=_opts("pPsuzqrRaw:flag SGU:arg:data O:arg:data"),
                    long=_longs(_GIT_DIFF_OPTIONS))
# git grep -O runs a pager of the value's choosing.
_GIT_GREP = Program(**_GIT_READ, short=_opts("ivwnhlLcIEFGPzqp:flag efmABC:arg:data O:opt:program"),
                    long=_longs("regexp:arg:data file:arg:data max-count:arg:data after-context:arg:data "
                                "before-context:arg:data context:arg:data open-files-in-pager:opt:program untracked "
                                "cached no-index ignore-case word-regexp line-number count files-with-matches "
                                "extended-regexp fixed-strings perl-regexp"))
_GIT_BLAME = Program(**_GIT_READ, short=_opts("bcfnpsewt:flag LCM:arg:data S:arg:data"),
                     long=_longs("porcelain line-porcelain incremental show-name show-number root since:arg:data "
                                 "contents:arg:data ignore-rev:arg:data ignore-revs-file:arg:data date:arg:data"))
_GIT_PLAIN = Program(**_GIT_READ, short=_opts("asuzqrltdv:flag"),
                     long=_longs("short long porcelain branch untracked-files:flag ignored cached modified others "
                                 "stage deleted abbrev:flag verify show-toplevel show-prefix git-dir is-inside-work-tree "
                                 "format:arg:data sort:arg:data contains:arg:data merged:arg:data no-merged:arg:data "
                                 "points-at:arg:data list tags always"))
_GIT = Program(
    short=_opts("pPv:flag c:arg:code C:arg:script"),
    long=_longs("no-pager paginate bare no-replace-objects literal-pathspecs glob-pathspecs noglob-pathspecs "
                "git-dir:arg:script work-tree:arg:script namespace:arg:data exec-path:arg:script "
                "config-env:arg:code version help"),
    subprograms={
        **dict.fromkeys(("log", "show", "whatchanged", "shortlog", "reflog", "rev-list"), _GIT_LOG),
        **dict.fromkeys(("diff", "diff-tree", "diff-index", "diff-files"), _GIT_DIFF),
        "grep": _GIT_GREP, "blame": _GIT_BLAME, "annotate": _GIT_BLAME,
        **dict.fromkeys(("status", "ls-files", "ls-tree", "rev-parse", "describe", "cat-file", "show-ref",
                         "for-each-ref", "name-rev", "merge-base", "count-objects", "branch", "tag"), _GIT_PLAIN),
    },
    others=GUARD,
)

SHELL_NAMES = frozenset({"sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "yash", "pdksh", "oksh", "loksh",
                         "rbash", "posh", "csh", "tcsh", "fish"})
PROGRAMS: dict[str, Program] = {
    **{name: _SH for name in SHELL_NAMES - {"csh", "tcsh", "fish"}},
    "csh": _CSH, "tcsh": _CSH, "fish": _FISH,
    "python": _PYTHON, "pythonw": _PYTHON, "pypy": _PYTHON, "perl": _PERL, "ruby": _RUBY, "jruby": _RUBY,
    "node": _NODE, "nodejs": _NODE, "php": _PHP, "lua": _LUA, "luajit": _LUA, "texlua": _LUA,
    "awk": _AWK, "gawk": _AWK, "mawk": _AWK, "nawk": _AWK, "sed": _SED, "gsed": _SED,
    "Rscript": _R, "R": _R, "julia": _JULIA, "tclsh": _TCL, "wish": _TCL, "expect": _TCL,
    "osascript": _OSASCRIPT, "pwsh": _PWSH, "powershell": _PWSH, "gdb": _GDB,
    "vim": _VIM, "vi": _VIM, "nvim": _VIM, "ex": _VIM, "view": _VIM, "emacs": _EMACS,
    "sqlite3": _SQLITE, "psql": _PSQL, "mysql": _MYSQL, "mariadb": _MYSQL, "deno": _DENO, "bun": _BUN,
    "env": _ENV, "sudo": _SUDO, "doas": _DOAS, "nice": _NICE, "nohup": _PLAIN, "builtin": _PLAIN,
    "time": _TIME, "command": _COMMAND, "exec": _EXEC, "stdbuf": _STDBUF, "setsid": _SETSID,
    "timeout": _TIMEOUT, "chrt": _CHRT, "ionice": _IONICE, "taskset": _TASKSET, "chroot": _CHROOT,
    "xargs": _XARGS, "flock": _FLOCK, "script": _SCRIPT, "su": _SU, "runuser": _SU, "sg": _SG,
    "watch": _WATCH, "ssh": _SSH, "eval": _LINE, "parallel": _LINE, "npx": _NPX, "pnpx": _NPX, "bunx": _NPX,
    "uvx": _UVX, "busybox": _PLAIN, "toybox": _PLAIN, "strace": _GENERIC, "ltrace": _GENERIC,
    "valgrind": _GENERIC, "unshare": _GENERIC, "nsenter": _GENERIC, "setpriv": _GENERIC, "fakeroot": _GENERIC,
    "firejail": _GENERIC, "systemd-run": _GENERIC, "xvfb-run": _GENERIC, "dbus-run-session": _GENERIC,
    "unbuffer": _GENERIC, "rlwrap": _GENERIC, "torsocks": _GENERIC, "proxychains": _GENERIC,
    "proxychains4": _GENERIC, "catchsegv": _GENERIC, "caffeinate": _GENERIC,
    "ipython": _IPYTHON, "xonsh": _XONSH, "nu": _NU, "dc": _DC, "bc": _BC, "groovy": _JVM_SCRIPT, "kotlin": _JVM_SCRIPT,
    "kotlinc": _JVM_SCRIPT, "scala": _JVM_SCRIPT, "elixir": _JVM_SCRIPT, "iex": _JVM_SCRIPT, "racket": _JVM_SCRIPT,
    "ghc": _JVM_SCRIPT, "runghc": _PLAIN_SCRIPT, "runhaskell": _PLAIN_SCRIPT, "swift": _JVM_SCRIPT,
    "erl": _ERL, "escript": _PLAIN_SCRIPT, "guile": _GUILE, "sbcl": _LISP, "clisp": _LISP, "java": _JAVA,
    "make": _MAKE, "gmake": _MAKE, "uv": _UV, "pipx": _PIPX, "npm": _NODE_PM, "pnpm": _NODE_PM, "yarn": _NODE_PM,
    "prlimit": _PRLIMIT, "setarch": _SETARCH, "linux32": _PLAIN, "linux64": _PLAIN, "chpst": _GENERIC,
    "rg": _RG, "sort": _SORT, "uniq": _UNIQ, "date": _DATE, "jq": _JQ, "git": _GIT,
}
_EXEC_ACTIONS = frozenset({"-exec", "-execdir", "-ok", "-okdir"})
_VERSIONED = re.compile(r"([A-Za-z][A-Za-z_-]*?)[-_.]?\d+(?:\.\d+)*[a-z]?")
_BUILDS = ("-dbg", "-debug", "d")  # python3-dbg, python3.12d: a debug build of the same program


def program_name(word: str) -> str:
    """The program a word names, as the table knows it: ``/usr/bin/python3.11`` → ``python``,
    ``perl5.36`` → ``perl``, ``python3-dbg`` → ``python``.

    Only the interpreters and wrappers of ``PROGRAMS`` come in versions and builds; a plain program
    is its exact name: ``diff3`` is not ``diff`` (it runs ``--diff-program``), nor ``lsd`` ``ls``."""
    base = os.path.basename(word)
    if base in PLAIN:
        return base
    for name in (base, *(base[: -len(b)] for b in _BUILDS if base.endswith(b) and len(base) > len(b))):
        if name in PROGRAMS:
            return name
        versioned = _VERSIONED.fullmatch(name)
        if versioned is not None and versioned.group(1) in PROGRAMS:
            return versioned.group(1)
    return base


def check(words: list[str]) -> Reading:
    """Raise ``Unsafe`` when a placeholder in ``words`` (a split template) lands where a program runs it.

    Returns the ``Reading``: the placeholders whose value must be constrained (``guards``), and the
    indexes of the words that are a placeholder a program reads as one argument among its own
    (``timeout -- {{t}} cmd``, ``nice -n {{n}} cmd``, ``find {{dir}} -name x``): a list value there
    would become several words and could add an option or a command, so it must be one value.
    """
    reading = Reading()
    _command([_Word(word, i) for i, word in enumerate(words)], None, reading)
    return reading


class _Word(str):
    """A word of the template, knowing its index (``env -S`` adds words that have none)."""

    at: int

    def __new__(cls, text: str, at: int) -> _Word:
        word = super().__new__(cls, text)
        word.at = at
        return word


def _one_value(word: str, single: set[int]) -> None:
    if isinstance(word, _Word) and PLACEHOLDER.fullmatch(word):
        single.add(word.at)


def _holds(word: str) -> bool:
    return PLACEHOLDER.search(word) is not None


def _put(word: str, role: str, program: str, via: str | None, reading: Reading) -> None:
    if role == DATA or not _holds(word):
        return
    if role == GUARD:
        reading.guard(word, program, GUARD, via)
        return
    raise Unsafe(word, role, program, via)


def _command(words: list[str], via: str | None, reading: Reading) -> None:
    """``words[0]`` is a program the template runs (``via`` the wrapper that runs it, if any)."""
    if not words:
        return
    _put(words[0], PROGRAM, via or "", None, reading)
    name = program_name(words[0])
    if name == "find":
        _find(words, via, reading)
        return
    if name in PLAIN:
        return  # every argument is data to it
    spec = PROGRAMS.get(name)
    if spec is None:
        for word in words[1:]:
            reading.guard(word, name, "unknown", via)
        return
    _Walk(words, name, spec, via, reading).run(1, _State(operands=spec.operands))


# find's tests and actions whose one argument is data (a name, a pattern, a time, a format).
_FIND_DATA = frozenset({
    "-name", "-iname", "-path", "-ipath", "-wholename", "-iwholename", "-regex", "-iregex", "-lname", "-ilname",
    "-newer", "-anewer", "-cnewer", "-samefile", "-user", "-group", "-uid", "-gid", "-type", "-xtype", "-size",
    "-perm", "-mtime", "-mmin", "-atime", "-amin", "-ctime", "-cmin", "-used", "-links", "-inum", "-fstype",
    "-maxdepth", "-mindepth", "-printf", "-regextype", "-context",
})


def _find(words: list[str], via: str | None, reading: Reading) -> None:
    """find's starting points (a value there could be an expression: ``-delete``), then its
    expression: the argument of a test that takes data is data, a command after ``-exec`` is walked,
    anything else a value could make an action of its choosing."""
    i = 1
    while i < len(words) and (words[i] in ("-H", "-L", "-P") or words[i].startswith("-O")):
        i += 1
    while i < len(words) and not words[i].startswith(("-", "(", "!", ",")):
        reading.guard(words[i], "find", OPTION, via)  # a starting point
        _one_value(words[i], reading.single)
        i += 1
    while i < len(words):
        word = words[i]
        if word in _EXEC_ACTIONS:
            end = i + 1
            while end < len(words) and words[end] not in (";", "+"):
                end += 1
            _command(words[i + 1:end], f"find {word}", reading)
            i = end + 1
            continue
        if word in _FIND_DATA and i + 1 < len(words):
            _one_value(words[i + 1], reading.single)  # a list could add ``-exec sh -c …``
            i += 2
            continue
        reading.guard(word, "find", GUARD, via)
        _one_value(word, reading.single)
        i += 1


@dataclass(frozen=True)
class _State:
    in_options: bool = True
    operands: tuple[str, ...] = (SCRIPT, DATA)  # roles of the operands still to come; the last repeats
    coded: bool = False  # an option gave the code: operands are data
    mode: bool = False  # ``sh -c``: the first operand is code
    lead: int = 0  # runners: data operands already read
    then: str | None = None  # runners: set by an option (``sudo -s``)
    subcommand: bool = False  # a subcommand was read


class _Walk:
    """One program's arguments, read as the program reads them; ambiguous readings are all tried."""

    def __init__(self, words: list[str], name: str, spec: Program, via: str | None, reading: Reading) -> None:
        self.words, self.name, self.spec, self.via, self.reading = words, name, spec, via, reading
        self.single = reading.single
        self.seen: set[tuple[int, int, _State]] = set()

    def put(self, word: str, role: str) -> None:
        _put(word, role, self.name, self.via, self.reading)
        if role in (DATA, GUARD):
            _one_value(word, self.single)

    def run(self, i: int, st: _State) -> None:
        words, spec = self.words, self.spec
        while i < len(words):
            if (i, 0, st) in self.seen:
                return
            self.seen.add((i, 0, st))
            word = words[i]
            if st.then == LINE and not spec.runner:  # ``pwsh -Command``: every word after it is code
                for rest in words[i:]:
                    self.put(rest, LINE)
                return
            if st.in_options and word == "--":
                st = replace(st, in_options=False)
                i += 1
                continue
            if st.in_options and self._is_option(word):
                self._option(i, st)
                return  # _option continues the walk for every reading
            if spec.runner:
                self._runner_operand(i, st)
                return
            if self._subcommand_first(st):
                if self._subprogram(i, st):
                    return
                sub = spec.subcommands.get(word)
                if sub is not None:
                    st = replace(st, subcommand=True, operands=sub)
                    i += 1
                    continue
                st = replace(st, subcommand=True)
            role = spec.argv if st.coded else CODE if st.mode else st.operands[0]
            self._not_an_option(word, st)
            _put(word, role, self.name, self.via, self.reading)
            st = replace(st, operands=st.operands[1:] or st.operands, mode=False,
                         in_options=spec.permute and st.in_options, coded=st.coded or role == CODE)
            if st.in_options or not (st.coded or set(st.operands) <= {DATA, GUARD}):
                _one_value(word, self.single)  # more words here would shift what comes next
            i += 1

    def _subcommand_first(self, st: _State) -> bool:
        spec = self.spec
        return bool(spec.subcommands or spec.subprograms or spec.others) and not (st.subcommand or st.coded or st.mode)

    def _subprogram(self, i: int, st: _State) -> bool:
        """A subcommand read as a program of its own (``git log``), or one the table does not know,
        after which every argument is guarded; False for the others."""
        word, spec = self.words[i], self.spec
        sub = spec.subprograms.get(word)
        if sub is not None:
            _Walk(self.words[i:], f"{self.name} {word}", sub, self.via, self.reading).run(1, _State(operands=sub.operands))
            return True
        if not spec.others or word in spec.subcommands:
            return False
        _put(word, SCRIPT, self.name, self.via, self.reading)  # the value would choose what runs
        for rest in self.words[i + 1:]:
            self.reading.guard(rest, f"{self.name} {word}", "unknown", self.via)
        return True

    def _not_an_option(self, word: str, st: _State) -> None:
        """Where the program still reads options, a word that a value starts could be one."""
        if st.in_options and PLACEHOLDER.match(word):
            self.reading.guard(word, self.name, OPTION, self.via)

    def _runner_operand(self, i: int, st: _State) -> None:
        words, spec = self.words, self.spec
        while i < len(words):
            word = words[i]
            if spec.assign and "=" in word[1:]:
                name, _, value = word.partition("=")
                if _holds(name):
                    raise Unsafe(word, VARIABLE, self.name, self.via)
                if _holds(value) and RUNS_VARIABLE.fullmatch(name):
                    raise Unsafe(word, SETTING, self.name, self.via)
                i += 1  # env NAME=VALUE: the value is data to env, and to what it runs
                continue
            if st.lead < spec.lead:
                self._not_an_option(word, st)
                self.put(word, spec.lead_as)
                _one_value(word, self.single)
                st = replace(st, lead=st.lead + 1, in_options=spec.permute and st.in_options)
                i += 1
                if st.in_options:
                    self.run(i, st)
                    return
                continue
            then = st.then or spec.then
            if then in (LINE, GUARD):
                for rest in words[i:]:
                    self.put(rest, then)
            elif then == "command":
                _command(words[i:], self.name, self.reading)
            return

    def _is_option(self, word: str) -> bool:
        return len(word) > 1 and (word[0] == "-" or (self.spec.plus and word[0] == "+"))

    def _unknown(self) -> str:
        return "arg:" + (self.spec.unknown or (DATA if self.spec.runner else OPTION))

    def _option(self, i: int, st: _State) -> None:
        word, spec = self.words[i], self.spec
        name, eq, value = word.lstrip("-+").partition("=")
        if word.startswith("--") or (spec.single_dash_long and name.lower() in spec.long):
            if _holds(name):
                raise Unsafe(word, OPTION, self.name, self.via)
            what = spec.long.get(name, spec.long.get(name.lower()))
            if what is None:  # unknown: it may take the next word or not; read it both ways
                if eq:
                    self._attached(word, value, self._unknown(), i, st)
                else:
                    self.run(i + 1, st)
                    self._argument(i + 1, self._unknown(), st)
            elif eq:
                self._attached(word, value, what, i, st)
            else:
                self._argument(i + 1, what, st)
            return
        self._cluster(i, 1, st)

    def _cluster(self, i: int, k: int, st: _State) -> None:
        """Read the short options of ``words[i]`` from its ``k``-th character on."""
        word, spec = self.words[i], self.spec
        while k < len(word):
            if (i, k, st) in self.seen:
                return
            self.seen.add((i, k, st))
            if PLACEHOLDER.match(word, k):
                raise Unsafe(word, OPTION, self.name, self.via)
            letter, rest = word[k], word[k + 1:]
            what = spec.short.get(letter)
            if what is None:  # unknown: a flag, or an option taking the rest or the next word
                self._taking(i, rest, self._unknown(), st)
                k += 1
                continue
            if what in ("flag", "mode", LINE):
                st = self._apply("", "", what, st)
                k += 1
                continue
            if what.startswith("opt:"):  # attached only, of any length: try every split, none first
                self._cluster(i, k + 1, st)
                for cut in range(1, len(rest) + 1):
                    self.put(rest[:cut], what[4:])
                    if k + 1 + cut < len(word):
                        self._cluster(i, k + 1 + cut, st)
                    else:
                        self.run(i + 1, st)
                return
            self._taking(i, rest, what, st)
            return
        self.run(i + 1, st)

    def _taking(self, i: int, rest: str, what: str, st: _State) -> None:
        """An option that takes an argument: ``rest`` of its cluster if any, else the next word."""
        if rest:
            self._attached(self.words[i], rest, what, i, st)
        else:
            self._argument(i + 1, what, st)

    def _attached(self, word: str, value: str, what: str, i: int, st: _State) -> None:
        st = self._apply(word, value, what, st)
        if what == "split":
            self._split(value, i + 1, st)
        elif what == "command":
            _command(self.words[i + 1:], self.name, self.reading)
        else:
            self.run(i + 1, st)

    def _argument(self, j: int, what: str, st: _State) -> None:
        """An option whose argument, if it takes one, is ``words[j]``."""
        if not what.startswith(("arg:", "split")):
            self._attached("", "", what, j - 1, st)
            return
        if j < len(self.words):
            self._attached(self.words[j], self.words[j], what, j, st)

    def _apply(self, word: str, value: str, what: str, st: _State) -> _State:
        """Check an option's argument; the state after it."""
        if what == "mode":
            return replace(st, mode=True)
        if what == LINE:
            return replace(st, then=LINE)
        if what == "split":
            self.put(word, LINE)
            return st
        if not what.startswith(("arg:", "opt:")):
            return st
        role = what[4:].rstrip("!")
        if role == ASSIGN:
            name, eq, _ = value.partition("=")
            self.put(name if eq else value, GUARD)  # the name the value gives is the program's variable
            return st
        if role == MAIN:
            self.put(word, SCRIPT)
            st = replace(st, coded=True)
        else:
            self.put(value if role in (DATA, GUARD) else word, role)
        if role == CODE:
            if self.spec.runner:
                st = replace(st, then=DATA)  # ``flock f -c CMD``: that code is the command
            elif self.spec.code_main:
                st = replace(st, coded=True)
        if what.endswith("!"):
            st = replace(st, in_options=False)
        return st

    def _split(self, text: str, j: int, st: _State) -> None:
        """``env -S 'sh -c …'``: the string becomes words, read in its place."""
        try:
            parts = shlex.split(text.replace("\\_", " "))
        except ValueError:
            for rest in self.words[j:]:
                self.put(rest, LINE)
            return
        _Walk(parts + self.words[j:], self.name, self.spec, self.via, self.reading).run(0, st)
