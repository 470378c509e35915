"""Where a ``shell`` template's values land: refuse a template whose value a program would run.

The ``shell`` handler never runs a shell, so a value is always one argument. What that argument
becomes is up to the program that reads it, and some programs run an argument: a shell's ``-c``
script, an interpreter's ``-e`` code or script file, a command that a wrapper (``env``, ``sudo``,
``timeout``, ``xargs``, ``find -exec`` …) runs in turn, a command line that ``ssh``, ``watch``,
``su -c`` or ``env -S`` hands to a shell. ``check`` walks a template's words the way those programs
read their arguments (clustered short options, ``--``, options still read after ``-e``, ``env -S``
splitting, wrappers in front of wrappers) and raises ``Unsafe`` when a placeholder lands in:

- the program (``{{prog}} …``, also as the command of a wrapper), or the script or module an
  interpreter loads;
- the code an interpreter or shell runs, or a command line something hands to a shell;
- an interpreter's or wrapper's own options, or where it still reads options: a value starting
  with ``-`` would be one (``perl -e '…' {{v}}`` reads ``-e…`` from the value).

When a reading is ambiguous (an option this table does not know may or may not take the next word),
every reading is checked and the template is refused if any of them is unsafe. A program the table
does not know is an ordinary program: a value is data to it (``grep -- {{pattern}} .``).

Must never run anything: this is read when a file loads. Standard library only.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass, field, replace

from atomictoolsd.declarative.templates import PLACEHOLDER

__all__ = ["Unsafe", "check", "program_name"]

# The roles a word can have. Only "data" may hold a placeholder.
DATA = "data"
CODE = "code"  # code the program runs
SCRIPT = "script"  # a file or module of code the program loads
PROGRAM = "program"  # the program itself
OPTION = "option"  # the program's own options, or where it still reads them
LINE = "line"  # words joined into a command line that a shell reads
VARIABLE = "variable"  # the name of an environment variable (``env NAME=VALUE``)
MAIN = "main"  # in the option table: a script or code that is the program's main program (``python -m``)


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
                fix = f"e.g. {prog} -c '... \"$1\" ...' {prog} {p}"
            else:
                fix = (f"behind --, where the code reads it (sys.argv, @ARGV, process.argv, ARGV), "
                       f"e.g. perl -e 'print $ARGV[0]' -- {p}")
            return (f"handler.command puts {p} inside the code that {prog}{run_by} runs ({word!r}): a value there "
                    f"would run as code. Pass it as an argument after the code instead, {fix}")
        if self.role == SCRIPT:
            return (f"handler.command lets {p} choose the script or module that {prog}{run_by} runs ({word!r}): "
                    f"a value there picks the code. Name the script in the template and pass the value after it "
                    f"(e.g. {prog} tool-script {p})")
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
class Program:
    """How a program reads its arguments. ``short`` and ``long`` map an option to what it takes:
    ``flag``; ``arg:ROLE`` (the rest of the cluster or the next word); ``opt:ROLE`` (only attached,
    possibly empty: ``perl -l0``); ``mode`` (its first operand is code: ``sh -c``); ``split`` (its
    argument is split into more words: ``env -S``); ``line`` (what follows is a command line:
    ``sudo -s``); ``command`` (what follows is a command: ``gdb --args``). A role ending in ``!``
    ends the options (``python -c``)."""

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
_PERL = Program(short=_opts("acfhnpsStTuUvwWX:flag eE:arg:code IMm:arg:script F:arg:option 0CdDilVx:opt:option"))
_RUBY = Program(short=_opts("acdlnpsSvwyh:flag e:arg:code rI:arg:script CEFK:arg:option 0TWx:opt:option"),
                long=_longs("version verbose help copyright yjit jit enable:arg:option disable:arg:option "
                            "encoding:arg:option external-encoding:arg:option internal-encoding:arg:option "
                            "dump:arg:option"))
# node reads no clusters, only its own aliases (``-pe`` is ``--print --eval``).
_NODE = Program(single_dash_long=True,
                long=_longs("e:arg:code p:arg:code pe:arg:code eval:arg:code print:arg:code r:arg:script "
                            "require:arg:script import:arg:script loader:arg:script experimental-loader:arg:script "
                            "C:arg:option input-type:arg:option conditions:arg:option c check i interactive v "
                            "version h help"))
_PHP = Program(short=_opts("aChHilmnqsvw:flag rBRE:arg:code f:arg:main Fz:arg:script dct:arg:option"))
_LUA = Program(short=_opts("iEvW:flag e:arg:code l:arg:script"))
_AWK = Program(short=_opts("vF:arg:data f:arg:main e:arg:code E:arg:main! il:arg:script"), operands=(CODE, DATA),
               long=_longs("file:arg:main source:arg:code exec:arg:main! include:arg:script load:arg:script "
                           "assign:arg:data field-separator:arg:data sandbox posix traditional lint characters-as-bytes"))
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
_GDB = Program(code_main=False, single_dash_long=True, operands=(SCRIPT, DATA),
               short=_opts("nqx:flag"),
               long=_longs("ex:arg:code eval-command:arg:code x:arg:script command:arg:script iex:arg:code "
                           "ix:arg:script init-eval-command:arg:code batch nx quiet q n args:command"))
_VIM = Program(code_main=False, short=_opts("c:arg:code S:arg:script"), operands=(DATA,))
_SQLITE = Program(code_main=False, single_dash_long=True, operands=(DATA, CODE),
                  long=_longs("cmd:arg:code init:arg:script bail batch csv json line list readonly"))
_PSQL = Program(code_main=False, short=_opts("c:arg:code f:arg:script v:arg:option"), operands=(DATA,),
                long=_longs("command:arg:code file:arg:script set:arg:option variable:arg:option"))
_MYSQL = Program(code_main=False, short=_opts("e:arg:code"), operands=(DATA,), long=_longs("execute:arg:code init-command:arg:code"))
_EMACS = Program(code_main=False, single_dash_long=True, operands=(DATA,),
                 long=_longs("eval:arg:code l:arg:script load:arg:script f:arg:code funcall:arg:code "
                             "batch q Q no-init-file"))
_DENO = Program(operands=(SCRIPT, DATA), short=_opts("A:flag"),
                subcommands={"eval": (CODE, DATA), "run": (SCRIPT, DATA), "x": (SCRIPT, DATA),
                             "repl": (DATA,), "fmt": (DATA,), "lint": (DATA,), "check": (DATA,), "test": (DATA,),
                             "task": (CODE, DATA), "install": (SCRIPT, DATA), "compile": (SCRIPT, DATA)})
_BUN = Program(short=_opts("e:arg:code p:arg:code r:arg:script"), operands=(SCRIPT, DATA),
               long=_longs("eval:arg:code print:arg:code preload:arg:script"),
               subcommands={"run": (SCRIPT, DATA), "x": (SCRIPT, DATA), "exec": (CODE, DATA),
                            "test": (DATA,), "install": (DATA,), "add": (DATA,)})

# Wrappers that run a command given as their operands (after their options and ``lead`` operands).
_ENV = Program(runner=True, assign=True, short=_opts("i0v:flag uCP:arg:data S:split"),
               long=_longs("ignore-environment null debug list-signal-handling unset:arg:data chdir:arg:data "
                           "split-string:split block-signal:flag default-signal:flag ignore-signal:flag"))
_SUDO = Program(runner=True, short=_opts("AbEeHkKlnPSVvhBN:flag CDghpRrTtUu:arg:data si:line"),
                long=_longs("login:line shell:line user:arg:data group:arg:data chdir:arg:data "
                            "preserve-env:flag non-interactive stdin askpass background"))
_DOAS = Program(runner=True, short=_opts("nL:flag uC:arg:data s:line"))
_NICE = Program(runner=True, short=_opts("0123456789:flag n:arg:data"), long=_longs("adjustment:arg:data"))
_PLAIN = Program(runner=True)  # nohup, builtin, …
_TIME = Program(runner=True, short=_opts("pvqV:flag fo:arg:data"),
                long=_longs("format:arg:data output:arg:data append portability verbose quiet"))
_COMMAND = Program(runner=True, short=_opts("pvV:flag"))
_EXEC = Program(runner=True, short=_opts("cl:flag a:arg:data"))
_STDBUF = Program(runner=True, short=_opts("ioe:arg:data"), long=_longs("input:arg:data output:arg:data error:arg:data"))
_SETSID = Program(runner=True, short=_opts("cfw:flag"), long=_longs("ctty fork wait"))
_TIMEOUT = Program(runner=True, lead=1, short=_opts("v:flag sk:arg:data"),
                   long=_longs("signal:arg:data kill-after:arg:data preserve-status foreground verbose"))
_CHRT = Program(runner=True, lead=1, short=_opts("abdefiomrRv:flag TPD:arg:data"))
_IONICE = Program(runner=True, short=_opts("t:flag cnpPu:arg:data"))
_TASKSET = Program(runner=True, lead=1, short=_opts("acp:flag"))
_CHROOT = Program(runner=True, lead=1, long=_longs("userspec:arg:data groups:arg:data skip-chdir"))
_XARGS = Program(runner=True, short=_opts("0oprtx:flag adEILnPs:arg:data eil:opt:data"),
                 long=_longs("null open-tty interactive no-run-if-empty verbose exit arg-file:arg:data "
                             "delimiter:arg:data max-args:arg:data max-procs:arg:data max-chars:arg:data "
                             "replace:flag max-lines:flag eof:flag process-slot-var:arg:data"))
_FLOCK = Program(runner=True, lead=1, permute=True, short=_opts("sxeunoF:flag wE:arg:data c:arg:code"),
                 long=_longs("shared exclusive unlock nonblock close no-fork verbose timeout:arg:data "
                             "wait:arg:data conflict-exit-code:arg:data command:arg:code"))
_SCRIPT = Program(runner=True, then=DATA, short=_opts("aefqk:flag EIOTBm:arg:data c:arg:code"),
                  long=_longs("command:arg:code append return flush quiet log-in:arg:data log-out:arg:data "
                              "log-io:arg:data log-timing:arg:data echo:arg:data logging-format:arg:data"))
_SU = Program(runner=True, then=LINE, short=_opts("lmpfP:flag gGw:arg:data s:arg:program c:arg:code"),
              long=_longs("login preserve-environment pty group:arg:data supp-group:arg:data "
                          "whitelist-environment:arg:data shell:arg:program command:arg:code "
                          "session-command:arg:code"))
_SG = Program(runner=True, lead=1, then=LINE, short=_opts("c:arg:code"))
_WATCH = Program(runner=True, then=LINE, short=_opts("bcegtxpwrC:flag nq:arg:data d:opt:data"),
                 long=_longs("beep color differences:flag errexit exec interval:arg:data precise no-title "
                             "no-wrap no-rerun chgexit equexit:arg:data"))
_SSH = Program(runner=True, lead=1, then=LINE, permute=True,
               short=_opts("46AaCfGgKkMNnqsTtVvXxYy:flag BbcDEeIiJLlmOpQRSWw:arg:data oF:arg:code"))
_LINE = Program(runner=True, then=LINE)  # eval, parallel: the words become a command line
_NPX = Program(runner=True, short=_opts("yq:flag c:arg:code p:arg:program"),
               long=_longs("yes no quiet call:arg:code package:arg:program"))
_UVX = Program(runner=True, short=_opts("qv:flag p:arg:data"),
               long=_longs("from:arg:program with:arg:program python:arg:data quiet verbose"))
_GENERIC = Program(runner=True)  # strace, valgrind, …: unknown options are read every way

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
}
_EXEC_ACTIONS = frozenset({"-exec", "-execdir", "-ok", "-okdir"})
_VERSIONED = re.compile(r"([A-Za-z][A-Za-z_-]*?)[-_.]?\d+(?:\.\d+)*[a-z]?")


def program_name(word: str) -> str:
    """The program a word names, as the table knows it: ``/usr/bin/python3.11`` → ``python``,
    ``perl5.36`` → ``perl``."""
    base = os.path.basename(word)
    if base in PROGRAMS:
        return base
    versioned = _VERSIONED.fullmatch(base)
    if versioned is not None and versioned.group(1) in PROGRAMS:
        return versioned.group(1)
    return base


def check(words: list[str]) -> set[int]:
    """Raise ``Unsafe`` when a placeholder in ``words`` (a split template) lands where a program runs it.

    Returns the indexes of the words that are a placeholder a program reads as one argument among
    its own (``timeout -- {{t}} cmd``, ``nice -n {{n}} cmd``, ``find {{dir}} -name x``): a list value
    there would become several words and could add an option or a command, so it must be one value.
    """
    single: set[int] = set()
    _command([_Word(word, i) for i, word in enumerate(words)], None, single)
    return single


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


def _put(word: str, role: str, program: str, via: str | None) -> None:
    if role != DATA and _holds(word):
        raise Unsafe(word, role, program, via)


def _command(words: list[str], via: str | None, single: set[int]) -> None:
    """``words[0]`` is a program the template runs (``via`` the wrapper that runs it, if any)."""
    if not words:
        return
    _put(words[0], PROGRAM, via or "", None)
    name = program_name(words[0])
    if name == "find":
        _find(words, via, single)
        return
    spec = PROGRAMS.get(name)
    if spec is not None:
        _Walk(words, name, spec, via, single).run(1, _State(operands=spec.operands))


def _find(words: list[str], via: str | None, single: set[int]) -> None:
    i = 1
    while i < len(words):
        if words[i] in _EXEC_ACTIONS:
            end = i + 1
            while end < len(words) and words[end] not in (";", "+"):
                end += 1
            _command(words[i + 1:end], f"find {words[i]}", single)
            i = end
        else:
            _one_value(words[i], single)  # a list could add ``-exec sh -c …``
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

    def __init__(self, words: list[str], name: str, spec: Program, via: str | None, single: set[int]) -> None:
        self.words, self.name, self.spec, self.via, self.single = words, name, spec, via, single
        self.seen: set[tuple[int, int, _State]] = set()

    def put(self, word: str, role: str) -> None:
        _put(word, role, self.name, self.via)
        if role == DATA:
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
            if spec.subcommands and not st.subcommand and not st.coded and not st.mode:
                sub = spec.subcommands.get(word)
                if sub is not None:
                    st = replace(st, subcommand=True, operands=sub)
                    i += 1
                    continue
                st = replace(st, subcommand=True)
            role = DATA if st.coded else CODE if st.mode else st.operands[0]
            _put(word, role, self.name, self.via)
            self._not_an_option(word, st)
            st = replace(st, operands=st.operands[1:] or st.operands, mode=False,
                         in_options=spec.permute and st.in_options, coded=st.coded or role == CODE)
            if st.in_options or not (st.coded or set(st.operands) == {DATA}):
                _one_value(word, self.single)  # more words here would shift what comes next
            i += 1

    def _not_an_option(self, word: str, st: _State) -> None:
        """Where the program still reads options, a word that a value starts could be one."""
        if st.in_options and PLACEHOLDER.match(word):
            raise Unsafe(word, OPTION, self.name, self.via)

    def _runner_operand(self, i: int, st: _State) -> None:
        words, spec = self.words, self.spec
        while i < len(words):
            word = words[i]
            if spec.assign and "=" in word[1:]:
                if _holds(word.partition("=")[0]):
                    raise Unsafe(word, VARIABLE, self.name, self.via)
                i += 1  # env NAME=VALUE: the value is data
                continue
            if st.lead < spec.lead:
                self._not_an_option(word, st)
                _one_value(word, self.single)
                st = replace(st, lead=st.lead + 1, in_options=spec.permute and st.in_options)
                i += 1
                if st.in_options:
                    self.run(i, st)
                    return
                continue
            then = st.then or spec.then
            if then == LINE:
                for rest in words[i:]:
                    self.put(rest, LINE)
            elif then == "command":
                _command(words[i:], self.name, self.single)
            return

    def _is_option(self, word: str) -> bool:
        return len(word) > 1 and (word[0] == "-" or (self.spec.plus and word[0] == "+"))

    def _unknown(self) -> str:
        return "arg:" + (DATA if self.spec.runner else OPTION)

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
            _command(self.words[i + 1:], self.name, self.single)
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
        if role == MAIN:
            self.put(word, SCRIPT)
            st = replace(st, coded=True)
        else:
            self.put(word if role != DATA else value, role)
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
        _Walk(parts + self.words[j:], self.name, self.spec, self.via, self.single).run(0, st)
