"""``atomictoolsd doctor``: check an agent's entries the way that agent uses them.

Every entry of ours in each agent's config files is found whatever its name (one that runs this
installation's shim, or whose URL is this daemon's HTTP endpoint; and any entry named ``atomic``),
and reported under its name. A command entry: it is well formed, it runs this installation's shim,
the shim starts with that agent's environment (Codex and Claude Desktop scrub it), answers
``initialize`` and lists this directory's tools from the daemon the user's CLI talks to. A URL
entry (``connect --http``): the agent reads it as Streamable HTTP, its token reference names a
variable that holds the daemon's token, and the endpoint answers at that URL (``doctor_http``). For
both: the project folder is trusted where the agent asks for it, Claude Code has approved a
project's server (what ``claude mcp list`` shows), and the agent re-lists tools or has the
dispatcher. Every problem comes with the command that fixes it, non-interactive where the agent
allows it; a fix that rewrites an entry keeps its name and options, and none is offered for a
working entry.

A config file, a project's above all, is a repository's to write: doctor runs only this
installation's own shim (``_own_shim``: the sealed interpreter ``connect`` writes, the
``atomictoolsd`` script installed beside it, or a bridge script in the runtime dir), with the entry's
arguments checked by the shim's own parser and of the entry's environment only the variables that
say which daemon it reaches. An entry that runs anything else is reported, never run.

Reads config files and starts shims (with ``--no-autostart``: a doctor never starts a second
daemon); must never change a config file, trust a folder or stop anything it did not start.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from atomictoolsd.bridges import agent_trust, agents
from atomictoolsd.cli import doctor_http
from atomictoolsd.cli._common import raw_request, safe, shown_command
from atomictoolsd.config.command import installed_command, shell_quote
from atomictoolsd.shim.relay import UsageError, parse_args
from atomictoolsd.util.processes import stop_process

__all__ = ["Check", "Report", "diagnose", "minimal_environment", "render"]

# What an agent that scrubs its servers' environment keeps: the MCP SDKs' default set (Codex keeps
# a few more, none of them ours).
MINIMAL_KEYS = ("HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER")
SHIM_TIMEOUT = 20.0
# What of an entry's environment doctor starts the shim with: which daemon it reaches (``connect``
# writes ATOMICTOOLS_RUNTIME_DIR into user entries). The rest is reported, not applied.
SOCKET_VARIABLES = ("ATOMICTOOLS_SOCKET", "ATOMICTOOLS_RUNTIME_DIR", "XDG_RUNTIME_DIR")


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str | None = None


@dataclass
class Report:
    agent: str
    title: str
    file: str
    scope: str
    server: str | None = None  # the entry's name in the file
    transport: str | None = None  # "stdio" (a command) or "http" (a URL)
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def add(self, name: str, ok: bool, detail: str, fix: str | None = None) -> bool:
        self.checks.append(Check(name, ok, detail, None if ok else fix))
        return ok


@dataclass(frozen=True)
class _Where:
    """What every check of one doctor run reads: the directory, the homes, the daemon's HTTP."""

    directory: Path
    root: Path
    home: Path
    environ: Mapping[str, str]
    http: Mapping[str, Any] | None  # the daemon's status["http"] ({} without HTTP; None: no daemon)


def minimal_environment(environ: Mapping[str, str]) -> dict[str, str]:
    return {k: environ[k] for k in MINIMAL_KEYS if k in environ}


def diagnose(agent: str | None, directory: Path, *, home: Path, root: Path,
             environ: Mapping[str, str] | None = None) -> list[Report]:
    """A report per entry of ours in each agent's config files (all of ``agent``'s when it is named)."""
    env = os.environ if environ is None else environ
    status = raw_request("atomic/status", timeout=10.0)
    where = _Where(directory, root, home, env, (status.get("http") or {}) if isinstance(status, dict) else None)
    reports = []
    for name in [agent] if agent else list(agents.AGENTS):
        found = [report for scope in agents.INFO[name].scopes for report in _reports_of_file(name, scope, where)]
        if agent and not found:
            info = agents.INFO[name]
            target = agents.config_file(name, info.scopes[0], home=home, root=root, environ=env)
            report = Report(name, info.title, str(target.path), target.scope)
            report.add("entry", False, f"no atomictoolsd entry in {info.title}'s config files",
                       f"atomictoolsd connect {name}")
            found.append(report)
        reports += found
    return reports


def _reports_of_file(agent: str, scope: agents.Scope, where: _Where) -> list[Report]:
    info = agents.INFO[agent]
    target = agents.config_file(agent, scope, home=where.home, root=where.root, environ=where.environ)
    try:
        servers = agents.read_servers(target)
    except agents.AgentConfigError as exc:
        report = Report(agent, info.title, str(target.path), scope)
        report.add("entry", False, str(exc), f"fix the file by hand, or move it aside and run: "
                                              f"atomictoolsd connect {agent} --{scope}")
        return [report]
    daemon_url = (where.http or {}).get("url")
    return [_check_entry(agent, target, server, entry, where) for server, entry in servers.items()
            if server == agents.SERVER_NAME or _looks_ours(agent, entry, daemon_url)]


def _looks_ours(agent: str, entry: Any, daemon_url: str | None) -> bool:
    """Whether an entry is one of ours by what it runs or reaches, whatever its name: our shim's
    shape (checked further by ``_own_shim``), a bridge script, or this daemon's HTTP endpoint."""
    if not isinstance(entry, dict):
        return False
    if agents.entry_url(entry) is not None:
        return doctor_http.is_our_url(agent, entry, daemon_url)
    parsed = _command_of(agent, entry)
    return not isinstance(parsed, str) and _shim_args(parsed[0]) is not None


def _shim_args(command: list[str]) -> list[str] | None:
    """The shim's arguments of a command shaped as ours (the sealed interpreter's ``-E -P -m
    atomictoolsd mcp``, ``atomictoolsd mcp``, a bridge script: none), else None. The shape only:
    ``_own_shim`` says whether it is this installation's."""
    program, args = command[0], command[1:]
    sealed = agents.shim_command()
    if args[: len(sealed) - 1] == sealed[1:]:
        return args[len(sealed) - 1 :]
    if os.path.basename(program) == agents.PROJECT_PROGRAM and args[:1] == ["mcp"]:
        return args[1:]
    return [] if _own_bridge(program) else None


def _options_of(shim_args: list[str]) -> dict[str, Any]:
    """The ``connect`` options an entry's shim arguments stand for (none that the parser refuses)."""
    try:
        parsed = parse_args(shim_args)
    except UsageError:
        return {}
    return {"allow": parsed.allow, "deny": parsed.deny, "dispatcher": parsed.dispatcher}


def _command_of(agent: str, entry: dict[str, Any]) -> tuple[list[str], dict[str, str]] | str:
    """The entry's command and env, or why it is malformed."""
    if agent == "opencode":
        command, env = entry.get("command"), entry.get("environment") or {}
        if not isinstance(command, list) or not command or not all(isinstance(a, str) for a in command):
            return '"command" must be a non-empty array of strings'
    else:
        program, args, env = entry.get("command"), entry.get("args", []), entry.get("env") or {}
        if not isinstance(program, str) or not program:
            return '"command" must be a non-empty string'
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            return '"args" must be an array of strings'
        command = [program, *args]
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        return "its environment must map names to strings"
    if agent == "copilot" and not entry.get("tools"):
        return 'Copilot CLI needs "tools" (["*"]) to offer any tool'
    if agent == "vscode" and entry.get("type") not in (None, "stdio"):
        return f'"type" is {entry.get("type")!r}, not "stdio"'
    return command, dict(env)


def reconnect(agent: str, scope: str, server: str | None, *, http: bool = False, allow: list[str] | None = None,
              deny: list[str] | None = None, dispatcher: bool | None = None, directory: str | None = None) -> str:
    """The ``connect`` command that writes this entry again, with its name and options."""
    argv = ["atomictoolsd", "connect", agent, f"--{scope}"]
    if server not in (None, agents.SERVER_NAME):
        argv += ["--name", str(server)]
    if http:
        argv.append("--http")
    if directory is not None:
        argv += ["-C", directory]
    for option, globs in (("--allow", allow or []), ("--deny", deny or [])):
        for glob in globs:
            argv += [option, glob]
    if dispatcher is not None and dispatcher != agents.INFO[agent].dispatcher:
        argv.append("--dispatcher" if dispatcher else "--no-dispatcher")
    return shown_command(argv)


def _check_entry(agent: str, target: agents.ConfigFile, server: str, entry: Any, where: _Where) -> Report:
    info = agents.INFO[agent]
    report = Report(agent, info.title, str(target.path), target.scope, server)
    if not isinstance(entry, dict):
        report.add("entry", False, f"server {server!r} is malformed: not an object",
                   reconnect(agent, target.scope, server))
        return report
    url = agents.entry_url(entry)
    if url is not None:
        report.transport = "http"
        parts = doctor_http.EntryUrl(url)
        options: dict[str, Any] = {"http": True, "allow": parts.allow, "deny": parts.deny,
                                   "dispatcher": parts.dispatcher}
        if parts.directory is not None and Path(parts.directory) != where.root and os.path.isdir(parts.directory):
            options["directory"] = parts.directory  # the project the URL names, not doctor's
        if not doctor_http.check_http(report, entry, where.http, where.environ,
                                      reconnect(agent, target.scope, server, **options)):
            return report
    else:
        report.transport = "stdio"
        shim_options = _check_stdio(report, entry, target, where)
        if shim_options is None:
            return report
        options = shim_options
    _check_project(report, target, where)
    _check_held(report, where.root)
    dispatcher = bool(options.get("dispatcher"))
    if info.refreshes == "yes":
        report.add("refresh", True, f"{info.title} re-lists tools when they change")
    else:
        fix = reconnect(agent, target.scope, server, **{**options, "dispatcher": None}) + " --dispatcher"
        report.add("refresh", dispatcher,
                   f"{info.title} {info.refresh_note}; " + ("the dispatcher meta-tools see every change" if dispatcher
                                                              else "without the dispatcher, new tools stay unseen"),
                   fix)
    return report


def _check_stdio(report: Report, entry: dict[str, Any], target: agents.ConfigFile,
                 where: _Where) -> dict[str, Any] | None:
    """The checks of an entry that starts a command; the shim options it has (for a fix that writes
    it again), or None when it is not one doctor can start."""
    agent, server, info = report.agent, report.server, agents.INFO[report.agent]
    plain = reconnect(agent, target.scope, server)
    parsed = _command_of(agent, entry)
    if isinstance(parsed, str):
        report.add("entry", False, f"server {server!r} is malformed: {parsed}", plain)
        return None
    command, entry_env = parsed
    # What the agent searches PATH with (its own, or the entry's), and what doctor starts the shim with.
    base = dict(where.environ) if info.environment == "full" else minimal_environment(where.environ)
    search_path = {**base, **entry_env}.get("PATH")
    run_env = {**base, **{k: v for k, v in entry_env.items() if k in SOCKET_VARIABLES}}
    own = _own_shim(command, search_path)
    if isinstance(own, str):
        place = " (a project's file: a repository can write it)" if target.scope == "project" else ""
        report.add("entry", False, f"server {server!r} runs {shown_command(command)}: {own}, not "
                                   f"atomictoolsd's shim; doctor does not run it{place}", plain)
        return None
    if own is None:
        program = command[0]
        report.add("entry", True, f"server {server!r}: {shown_command(command)}")
        fix = ("pipx install atomictoolsd  (or: uv tool install atomictoolsd), or connect with --user"
               if not os.path.isabs(program) else reconnect(agent, target.scope, server,
                                                            **_options_of(_shim_args(command) or [])))
        report.add("command", False, f"{safe(program)} is not found (PATH of {info.title}'s servers)", fix)
        return None
    shim, shim_args = own
    shim_args = [a.replace("${workspaceFolder}", str(where.directory)) for a in shim_args]
    try:
        parse_args(shim_args)
    except UsageError as exc:
        report.add("entry", False, f"server {server!r} is malformed: {exc}", plain)
        return None
    options = _options_of(shim_args)
    again = reconnect(agent, target.scope, server, **options)
    report.add("entry", True, f"server {server!r}: {shown_command(command)}")
    report.add("command", True, f"found: {safe(shim[0])}")
    foreign = sorted(set(entry_env) - set(SOCKET_VARIABLES))
    if foreign:
        report.add("env", False, f"the entry sets {', '.join(map(safe, foreign))} for the shim: {info.title} starts it "
                                 f"with them, doctor did not (only {', '.join(SOCKET_VARIABLES)} are the shim's)",
                   f"remove them from the entry, or run: {again}")
    pin = reconnect(agent, "user", server, **options) if "user" in info.scopes else again
    _check_shim(report, [*shim, *shim_args, "--no-autostart"], run_env, where.directory, again, pin)
    return options


def _own_shim(command: list[str], search_path: str | None) -> tuple[list[str], list[str]] | str | None:
    """This installation's shim, for an entry that runs it: the command that starts it and the
    shim's arguments of the entry. A string when the entry runs something else (what, in words);
    None when it has the shape of ours but its program is not found.

    Ours are: this interpreter with ``-E -P -m atomictoolsd mcp`` (user entries), the ``atomictoolsd``
    script installed beside it, found on the agent's ``PATH`` (project entries), and a bridge script
    in the runtime dir's bridges dir (``bridge create``).
    """
    program, args = command[0], command[1:]
    sealed = agents.shim_command()
    shim_args = _shim_args(command)
    if shim_args is None:
        return "a command that is not this installation's"
    if args[: len(sealed) - 1] == sealed[1:]:
        if _executable(program, search_path) is None:
            return None
        if os.path.abspath(program) != sealed[0]:
            return f"the interpreter {safe(program)} is not this installation's ({safe(sealed[0])})"
        return sealed, shim_args
    if os.path.basename(program) == agents.PROJECT_PROGRAM and args[:1] == ["mcp"]:
        found = _executable(program, search_path)
        if found is None:
            return None
        script = installed_command()
        if script is None or os.path.realpath(found) != os.path.realpath(script):
            return f"{safe(found)} is not this installation's atomictoolsd ({safe(script or 'none is installed')})"
        return [script, "mcp"], shim_args
    return [program], []  # a bridge script of ours


def _executable(program: str, search_path: str | None) -> str | None:
    found = program if os.path.isabs(program) else shutil.which(program, path=search_path)
    return found if found and os.path.isfile(found) and os.access(found, os.X_OK) else None


def _own_bridge(program: str) -> bool:
    """Whether ``program`` is a bridge script the daemon wrote: in its bridges dir, yours, closed to others."""
    from atomictoolsd.config.paths import PathError, Paths  # lazy: only for an entry that may be a bridge

    try:
        bridges = os.path.realpath(Paths.from_env().bridges_dir)
        info = os.stat(program)
    except (PathError, OSError):
        return False
    return (os.path.isabs(program) and os.path.dirname(os.path.realpath(program)) == bridges
            and info.st_uid == os.geteuid() and not info.st_mode & 0o022)


def _check_shim(report: Report, argv: list[str], run_env: dict[str, str], directory: Path, again: str,
                pin: str) -> None:
    """Start the shim as the agent would; initialize, list, and find its session in the CLI's daemon."""
    from atomictools import Client
    from atomictools._errors import AtomicToolsError

    try:
        cli_client = Client(directory=str(directory), agent="doctor", autostart=False).connect()
    except AtomicToolsError as exc:
        report.add("shim", False, f"your CLI reaches no daemon: {exc}", "atomictoolsd start")
        return
    with cli_client:
        filtered = "--allow" in argv or "--deny" in argv  # the entry narrows them on purpose
        expected = set() if filtered else {t["name"] for t in cli_client.list_tools()}
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                cwd=directory, env=run_env, start_new_session=True)
        try:
            answers = _exchange(proc)
            session_agents = {s.get("pid"): s for s in cli_client.status().get("sessions", [])}
            same = proc.pid in session_agents
        finally:
            _close(proc)
        stderr = (proc.stderr.read().decode(errors="replace").strip() if proc.stderr else "")[-600:]
    if answers is None:
        hint = stderr or "no answer"
        fix = again if "runtime" in stderr or "no daemon" in stderr or "XDG_RUNTIME_DIR" in stderr else (
            f"{shown_command(argv[:-1])}   (run it by hand to see why)")
        report.add("shim", False, f"the shim started as {report.title} starts it did not answer: {hint}", fix)
        return
    init, listed = answers
    if "result" not in init or "result" not in listed:
        report.add("shim", False, f"the shim answered with an error: {init.get('error') or listed.get('error')}",
                   again)
        return
    names = {t["name"] for t in listed["result"].get("tools", [])}
    if not same:
        report.add("shim", False, "the shim reached another daemon than the one your CLI talks to",
                   f"{pin}   (a user entry pins your runtime dir)")
        return
    missing = sorted(expected - names)
    if missing:
        report.add("shim", False, f"the shim does not list {', '.join(missing[:5])}, which your CLI sees here",
                   f"{again}   (the entry may attach another directory)")
        return
    report.add("shim", True, f"started as {report.title} starts it: initialize answered, {len(names)} tools "
                             f"listed for {directory}, from your CLI's daemon")


def _exchange(proc: subprocess.Popen[bytes]) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """initialize, initialized, tools/list; the two answers, or None when the shim gave none."""
    assert proc.stdin is not None and proc.stdout is not None
    lines = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "doctor", "version": "1"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
    ]
    try:
        proc.stdin.write(b"".join(json.dumps(m).encode() + b"\n" for m in lines))
        proc.stdin.flush()
    except BrokenPipeError:
        return None
    answers: dict[int, dict[str, Any]] = {}
    buffer = b""
    deadline = time.monotonic() + SHIM_TIMEOUT
    fd = proc.stdout.fileno()
    while len(answers) < 2 and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if isinstance(message, dict) and message.get("id") in (1, 2):
                answers[message["id"]] = message
    return (answers[1], answers[2]) if len(answers) == 2 else None


def _close(proc: subprocess.Popen[bytes]) -> None:
    if proc.stdin is not None:
        try:
            proc.stdin.close()  # how MCP clients stop a server
        except OSError:
            pass
    stop_process(proc, 10, sig=None)


def _check_project(report: Report, target: agents.ConfigFile, where: _Where) -> None:
    """What the agent asks before it uses a project's entry: the folder trusted (Gemini CLI, Qwen
    Code, Codex), the server approved (Claude Code: what ``claude mcp list`` shows)."""
    if target.scope != "project":
        return
    agent, root = report.agent, where.root
    if agent == "claude":
        _check_approval(report, root, where.home)
    elif agent in agent_trust.TRUSTING_AGENTS:
        trusted = agent_trust.folder_trusted(agent, root, where.home, dict(where.environ))
        store = {"codex": "~/.codex/config.toml"}.get(agent, f"~/.{agent}/trustedFolders.json")
        report.add("trust", trusted, f"{report.title} trusts {root}" if trusted
                   else f"{report.title} ignores {target.path.name} in {root}: the folder is not trusted in {store}",
                   f"atomictoolsd connect {agent} --trust-folder   (as its trust prompt does; or run `{agent}` in "
                   f"{shell_quote(str(root))} and trust the folder)")


def _check_approval(report: Report, root: Path, home: Path) -> None:
    """Claude Code's approval of a project's ``.mcp.json`` server, as ``claude mcp list`` shows it."""
    server = report.server or agents.SERVER_NAME
    approval = agent_trust.claude_approval(root, server, home)
    named = ["--name", server] if server != agents.SERVER_NAME else []
    if approval.state == "approved":
        report.add("approval", True, f"Claude Code connects to {server!r} without asking: {approval.detail}")
        return
    if approval.state == "pending":
        shown = f"`claude mcp list` shows {server!r} as ⏸ Pending approval"
    else:
        shown = f"`claude mcp list` leaves {server!r} out (`claude mcp get {server}`: ✘ Rejected)"
    detail = f"{shown}, and Claude Code does not start it: {approval.detail}"
    approve = ["atomictoolsd", "connect", "claude", "--approve", *named]
    if approval.rejected_by is not None and approval.rejected_by != root / ".claude" / "settings.local.json":
        fix = f"remove {server!r} from disabledMcpjsonServers in {approval.rejected_by} (connect writes only settings.local.json)"
    elif approval.needs_trust:
        fix = (f"{shown_command([*approve, '--trust-folder'])}   (trusting the folder lets Claude Code apply the "
               f"project's .claude/ settings, as its trust prompt does)")
    else:
        fix = shown_command(approve)
    report.add("approval", False, detail, fix)


def _check_held(report: Report, root: Path) -> None:
    """Say so when tool code of a fully trusted project arrived through git and awaits review
    (docs/trust.md): until then it runs confined, or not at all. Only looks: records nothing."""
    from atomictoolsd.cli.review import held_files  # lazy: reads the repository (pygit2)
    from atomictoolsd.config.paths import Paths
    from atomictoolsd.registry.content import review_command

    verdict, _trusted_at, _problem = held_files(root, Paths.from_env().state_dir, write=False)
    if verdict is None:
        return  # not fully trusted: nothing is held (the trust check above says why it does not load)
    if verdict.held:
        report.add("content", False, f"{len(verdict.held)} file(s) of {root}'s tools arrived through git and "
                   "await your review: until then their modules run confined, or not at all",
                   review_command(root))
    else:
        report.add("content", True, f"{root}'s tools are the content you trusted, or your own edits")


def project_environment(root: Path, home: Path) -> dict[str, Any] | None:
    """The project's environment as ``list`` shows it (``environments.project.describe``): the one its
    tools run with (your trust entry's ``--python``, else your config's ``project_venv``), or the
    ``.venv`` it has that they could, with the command that turns it on; None for no project."""
    from atomictoolsd.config.paths import Paths
    from atomictoolsd.config.settings import ConfigError, load_config
    from atomictoolsd.environments.project import describe
    from atomictoolsd.registry.trust import TrustStore

    if root == home:
        return None
    paths = Paths.from_env()
    entry = TrustStore(paths.state_dir).entry(root)
    chosen = None
    if entry is not None and isinstance(entry.get("python"), str):
        chosen = (entry["python"], "trust")
    else:
        try:
            name = load_config(paths.config_file).project_venv
        except ConfigError:
            name = ""
        if name and (root / name / "pyvenv.cfg").is_file():
            chosen = (str(root / name), "config")
    return describe(str(root), chosen)


def render_environment(environment: dict[str, Any] | None) -> str | None:
    """``project_environment`` as a check's lines."""
    if not environment:
        return None
    if environment.get("path"):
        if environment.get("problem"):
            return f"FAIL  project environment: {safe(environment['path'])}: {safe(environment['problem'])}"
        return f"ok    project environment: {safe(environment['path'])} (Python {environment.get('version')})"
    if environment.get("command"):
        return (f"note  project environment: it has {safe(environment['offer'])} (Python {environment['version']}), which "
                f"its tools do not use\n        to have them import its packages and its own code: {environment['command']}")
    return f"note  project environment: {safe(environment['offer'])}: {safe(environment['problem'])}"


def render(reports: list[Report], as_json: bool) -> str:
    if as_json:
        return json.dumps({"ok": bool(reports) and all(r.ok for r in reports),
                           "agents": [{**asdict(r), "ok": r.ok} for r in reports]}, indent=2)
    if not reports:
        return ("No agent's config here has an atomictoolsd entry.\n"
                "  fix: atomictoolsd connect AGENT   (claude, codex, gemini, … : atomictoolsd connect --help)")
    out = []
    for report in reports:  # each line escaped: a config file's path and an entry's command are anyone's
        server = f", server '{safe(report.server)}'" if report.server else ""
        by = " by URL" if report.transport == "http" else ""
        out.append(f"{report.title}{server}{by} ({report.scope}: {safe(report.file)})")
        for check in report.checks:
            out.append(f"  {'ok  ' if check.ok else 'FAIL'}  {check.name}: {safe(check.detail)}")
            if check.fix:
                out.append(f"        fix: {safe(check.fix)}")
    bad = sum(not r.ok for r in reports)
    out.append("Everything is fine." if not bad else f"{bad} of {len(reports)} entries have problems.")
    return "\n".join(out)
