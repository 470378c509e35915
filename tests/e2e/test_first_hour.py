"""What a new user meets in the first hour: errors that say what is wrong and what to do, the CLI's
help, output and exit codes, and the tool scaffold — each through a real daemon and the real command."""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from mcp.shared.exceptions import MCPError

from atomictools import RPCError
from atomictoolsd.eventlog.reader import read_events
from helpers import Daemon, Env, run_in_terminal, serving, wait_for
from shim_helpers import mcp_session
from shim_helpers import run as run_async

GREET = '''
    def greet(name: str) -> str:
        """Greet someone."""
        return f"Hello, {name}!"
'''


def run(env: Env, *args: str, cwd: Path | None = None, extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "atomictoolsd", *args],
        env={**env.vars, **(extra or {})}, cwd=cwd or env.project, capture_output=True, text=True, timeout=60,
    )


# 1. Errors that say what is wrong


def test_a_call_of_a_tool_whose_module_failed_names_the_load_error_everywhere(env: Env, make_daemon: object) -> None:
    env.write_tool(env.global_tools, "greet.py", "\n\n\ndef greet(:\n    pass\n")
    daemon = make_daemon()  # type: ignore[operator]
    cli = run(env, "call", "greet", "name=Ada")
    assert cli.returncode == 2
    assert "greet.py:4: SyntaxError" in cli.stderr and "Unknown tool" not in cli.stderr

    with daemon.client() as client:
        with pytest.raises(RPCError) as raised:
            client.call("greet", name="Ada")
    assert raised.value.code == -32602 and "greet.py:4: SyntaxError" in raised.value.message
    assert raised.value.data["loadError"]["line"] == 4 and raised.value.data["loadError"]["file"].endswith("greet.py")

    async def over_mcp() -> None:
        async with mcp_session(env) as (session, _seen):
            with pytest.raises(MCPError) as failed:
                await session.call_tool("greet", {"name": "Ada"})
            assert "greet.py:4: SyntaxError" in failed.value.error.message

    run_async(over_mcp)


@pytest.fixture(scope="module")
def greet_and_builtins(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """One daemon with greet and the built-in tools, for the near-name tests (they only call)."""
    env = Env(tmp_path_factory.mktemp("near-names"))
    env.write_tool(env.global_tools, "greet.py", GREET)
    with serving(env, {"ATOMICTOOLS_BUILTINS": "1"}) as daemon:
        yield daemon


@pytest.mark.parametrize(("typed", "meant"), [("gret", "greet"), ("Greet", "greet"), ("git_status", "git-status")])
def test_an_unknown_tool_suggests_the_near_names(greet_and_builtins: Daemon, typed: str, meant: str) -> None:
    daemon, env = greet_and_builtins, greet_and_builtins.env
    cli = run(env, "call", typed)
    assert cli.returncode == 2 and f"did you mean {meant!r}?" in cli.stderr, cli.stderr
    with daemon.client() as client:
        with pytest.raises(RPCError) as raised:
            client.call(typed)
    assert meant in raised.value.data["suggestions"]
    assert f"did you mean {meant!r}?" in str(raised.value)


def test_a_misspelled_setting_is_answered_with_the_right_one(env: Env) -> None:
    env.write_config("call_timout = 5\n")
    result = run(env, "config")
    assert result.returncode == 2
    assert "unknown setting 'call_timout'; did you mean 'call_timeout'?" in result.stderr
    assert "max_idle_workers" not in result.stderr  # not the whole list of settings


def test_a_file_with_no_tool_is_told_what_it_defines_and_what_to_do(env: Env, make_daemon: object) -> None:
    env.write_tool(env.global_tools, "my-tool.py", "def run() -> str:\n    return 'x'\n")
    env.write_tool(env.global_tools, "mismatch.py", "def hello() -> str:\n    return 'x'\n\ndef _private():\n    pass\n")
    make_daemon()  # type: ignore[operator]
    listing = json.loads(run(env, "list", "--json").stdout)
    errors = {Path(e["file"]).name: e["message"] for e in listing["errors"]}
    assert "'my-tool' cannot be a Python function name" in errors["my-tool.py"]
    assert "@tool(name='my-tool')" in errors["my-tool.py"] and "'my_tool'.py" in errors["my-tool.py"]
    assert "defines 'hello' but no function named 'mismatch'" in errors["mismatch.py"]
    assert "_private" not in errors["mismatch.py"]


def test_an_automatic_start_that_fails_leads_with_the_cause_in_one_line(env: Env) -> None:
    env.write_config("call_timeout = 'never'\n")
    env.runtime_dir.mkdir(mode=0o700, parents=True)
    (env.runtime_dir / "atomictoolsd.stderr").write_text("atomictoolsd: a complaint of an earlier daemon\n")
    called = run(env, "call", "greet")
    assert called.returncode == 1
    first, *rest = called.stderr.splitlines()
    assert first.startswith("atomictoolsd: the daemon did not start: bad configuration: call_timeout (from "), first
    assert "expected a number" in first and not rest
    assert "earlier daemon" not in called.stderr

    probe = "from atomictools import Client, ConnectError\ntry:\n    Client().connect()\nexcept ConnectError as e:\n    print(e)\n"
    said = subprocess.run([sys.executable, "-c", probe], env=env.vars, capture_output=True, text=True, timeout=60)
    assert said.stdout.startswith("the daemon did not start: bad configuration: call_timeout"), said.stdout
    assert len(said.stdout.splitlines()) == 1


def test_status_tells_settings_in_force_from_those_waiting_and_a_config_that_failed(env: Env, make_daemon: object) -> None:
    env.vars.pop("ATOMICTOOLS_BUILTINS")
    config = env.write_config("builtins = true\n")
    daemon = make_daemon()  # type: ignore[operator]
    config.write_text("builtins = false\ncall_timeout = 7\n")
    daemon.proc.send_signal(signal.SIGHUP)
    status = _status_once(env, "reloaded at", "--verbose")  # a reload that went well is a detail
    assert "builtins = false waits for a restart (in force: true" in status
    with daemon.client() as client:
        assert "git-status" in [t["name"] for t in client.list_tools()]  # what status says is in force
        assert client.status()["config"]["call_timeout"] == 7  # the rest applied at once

    config.write_text("builtins = [\n")
    daemon.proc.send_signal(signal.SIGHUP)
    status = _status_once(env, "NOT reloaded")
    assert "is not valid TOML" in status and "the previous configuration stays in force" in status
    assert "builtins = false waits for a restart" in status  # still waiting: the bad file changed nothing


def _status_once(env: Env, says: str, *flags: str) -> str:
    def status() -> str | None:
        out = run(env, "status", *flags).stdout
        return out if says in out else None

    return wait_for(status, timeout=20, message=f"status to say {says!r}")


# 3. The CLI


@pytest.mark.parametrize("command", ["serve", "start", "stop", "restart", "config", "connect", "call", "status", "new"])
def test_every_command_help_says_what_it_does_and_the_exit_codes(env: Env, command: str) -> None:
    shown = run(env, command, "--help")
    assert shown.returncode == 0
    usage, _, rest = shown.stdout.partition("\n\n")
    assert usage.startswith(f"usage: atomictoolsd {command}")
    assert len(rest.split("\n\n")[0]) > 40, "a description, not a usage line alone"
    assert "exit codes:\n  0    done\n  1    " in shown.stdout and "\n  3    the daemon is not running" in shown.stdout


def test_connect_help_says_the_globs_repeat_and_mcp_help_looks_like_the_rest(env: Env) -> None:
    connect = " ".join(run(env, "connect", "--help").stdout.split())
    assert connect.count("(repeat it for more globs)") == 2
    assert "--no-dispatcher no meta-tools" in connect
    mcp = run(env, "mcp", "--help")
    assert mcp.returncode == 0 and mcp.stdout.startswith("usage: atomictoolsd mcp [-h]")
    assert "options:\n  -h, --help           show this help message and exit" in mcp.stdout
    assert "(repeat it for more globs)" in mcp.stdout and "exit codes:" in mcp.stdout


SCALARS = '''
    from atomictools import ToolError, tool

    @tool
    def calc(n: int) -> int:
        """Double n."""
        if n < 0:
            raise ToolError("n must not be negative")
        return n * 2

    @tool
    def words(n: int) -> list[str]:
        """n words."""
        return ["w"] * n
'''


def test_call_prints_a_scalar_bare_and_every_error_on_stderr(env: Env, make_daemon: object) -> None:
    env.write_tool(env.global_tools, "calc.py", SCALARS)
    make_daemon()  # type: ignore[operator]
    done = run(env, "call", "calc", "n=2")
    assert (done.returncode, done.stdout, done.stderr) == (0, "4\n", "")
    raw = run(env, "call", "calc", "n=2", "--json")
    assert json.loads(raw.stdout)["structuredContent"] == {"result": 4} and raw.returncode == 0
    assert run(env, "call", "calc_words", "--args", '{"n": 2}').stdout == '["w", "w"]\n'
    assert run(env, "call", "calc_words", '{"n": 1}').stdout == '["w"]\n'

    failed = run(env, "call", "calc", "n=-1")  # the tool's own error: exit 1, stderr
    assert (failed.returncode, failed.stdout) == (1, "") and "n must not be negative" in failed.stderr
    invalid = run(env, "call", "calc", "n=x")  # bad argument values: the tool's validation, exit 1
    assert (invalid.returncode, invalid.stdout) == (1, "") and "Expected `int`" in invalid.stderr
    unknown = run(env, "call", "clac")  # refused: exit 2, stderr
    assert (unknown.returncode, unknown.stdout) == (2, "") and "did you mean 'calc'" in unknown.stderr
    malformed = run(env, "call", "calc", "n")
    assert (malformed.returncode, malformed.stdout) == (2, "") and "expected key=value" in malformed.stderr
    raw_failed = run(env, "call", "calc", "n=-1", "--json")
    assert raw_failed.returncode == 1 and json.loads(raw_failed.stdout)["isError"] is True


def test_logs_follow_with_no_history_prints_only_new_events(env: Env, make_daemon: object) -> None:
    env.write_tool(env.global_tools, "greet.py", GREET)
    daemon = make_daemon()  # type: ignore[operator]
    with daemon.client() as client:
        client.call("greet", name="old")
    # The event log writes in batches (a quarter of a second at most): wait until the old call is in it.
    old = wait_for(
        lambda: [json.loads(line) for line in run(env, "logs", "--json", "--event", "tool.").stdout.splitlines()],
        timeout=10, message="the old call is in the log",
    )
    follower = subprocess.Popen(
        [sys.executable, "-m", "atomictoolsd", "logs", "-f", "-n", "0", "--json", "--event", "tool."],
        env=env.vars, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    try:
        time.sleep(1)  # let it reach the end of the log; an old event would be printed by now
        with daemon.client() as client:
            client.call("greet", name="new")
        assert follower.stdout is not None
        first = json.loads(follower.stdout.readline())
    finally:
        follower.kill()
        follower.wait(10)
    assert first["call"] not in {e.get("call") for e in old}, first
    assert run(env, "logs", "-n", "0").stdout == ""


def test_status_renders_its_sections_as_tables(env: Env, daemon: Daemon) -> None:
    shown = run(env, "status", "--verbose").stdout
    assert "{" not in shown, shown  # no raw JSON
    lines = shown.splitlines()
    for section, row in (("watcher", "debounce ms"), ("monitor", "killed for memory"), ("cache", "hits")):
        assert section in lines
        assert any(line.startswith(f"  {row} ") for line in lines), (row, shown)


def test_trust_and_untrust_say_what_the_running_daemon_did(env: Env, make_daemon: object) -> None:
    env.set_trust_all(False)
    env.write_tool(env.local_tools, "probe.py", "def probe() -> str:\n    return 'ran'\n")
    daemon = make_daemon()  # type: ignore[operator]
    first = run(env, "trust", "--yes", cwd=env.root)  # a directory of no project the daemon has open
    assert "has not opened this project yet" in first.stdout
    run(env, "untrust", str(env.root))
    with daemon.client() as client:
        assert client.list_tools() == []
    trusted = run(env, "trust", "--yes")
    assert "the running daemon loaded the project's tools" in trusted.stdout, trusted.stdout
    untrusted = run(env, "untrust")
    assert "the running daemon withdrew the project's tools" in untrusted.stdout, untrusted.stdout
    assert "already agreed" not in trusted.stdout + untrusted.stdout


# 4. A place to start


def _printed(output: str, label: str) -> list[str]:
    line = next(line for line in output.splitlines() if line.startswith(label))
    return shlex.split(line.removeprefix(label))


def test_new_writes_a_tool_that_loads_and_runs_as_its_printed_commands_say(env: Env, make_daemon: object) -> None:
    made = run(env, "new", "hello-world")  # in a project (it has .atomic/): the project's tools dir
    assert made.returncode == 0, made.stderr
    path = env.local_tools / "hello-world.py"
    assert made.stdout.startswith(f"wrote {path} (the project {env.project.resolve()})")
    source = path.read_text()
    assert "Field(" in source and "ctx: Context" in source and '"""Repeat a text' in source
    made_json = run(env, "new", "count", "--json", cwd=env.root)  # no project here: the global dir
    assert made_json.returncode == 0 and (env.global_tools / "count.json").exists()
    (env.project / "words.txt").write_text("one two\n")
    (env.root / "secret.txt").write_text("outside the project\n")

    daemon = make_daemon()  # type: ignore[operator]
    listed = subprocess.run(_printed(made.stdout, "list it:"), env=env.vars, cwd=env.project, capture_output=True, text=True, timeout=60)
    assert "hello-world" in listed.stdout and "count" in listed.stdout and "problem" not in listed.stdout, listed.stdout
    called = subprocess.run(_printed(made.stdout, "call it:"), env=env.vars, cwd=env.project, capture_output=True, text=True, timeout=60)
    assert called.stdout == f"hello hello (from {env.project.resolve()})\n", called.stderr
    with daemon.client() as client:
        refused = client.call("hello-world", text="hi", times=11)
        assert refused.is_error and "<= 10" in refused.text
        assert "words.txt" in client.call("count", path="words.txt").text
        for outside in (str(env.root / "secret.txt"), "../secret.txt", "sub/../../secret.txt", "-n"):
            refused = client.call("count", path=outside)  # the starter says "a file in the project"
            assert refused.is_error and "path" in refused.text, (outside, refused.text)

    again = run(env, "new", "hello-world")
    assert again.returncode == 1 and "already exists" in again.stderr
    assert path.read_text() == source
    assert run(env, "new", "9lives").returncode == 2


def test_new_outside_a_project_writes_a_global_tool_and_names_an_untrusted_project(env: Env) -> None:
    env.set_trust_all(False)
    made = run(env, "new", "greet")
    confined = "not trusted yet, so its tools do not load; to load them confined (no network, nothing outside the project), run: "
    assert confined in made.stdout
    offered = made.stdout.split(confined, 1)[1].split("; or, with all your rights: ")[0]
    trust = shlex.split(offered)
    assert trust[1:3] == ["trust", "--sandbox"], trust
    assert run_in_terminal(trust, env=env.vars).returncode == 0  # as printed, typed in a terminal
    home_made = run(env, "new", "mine", cwd=env.home)
    assert (env.global_tools / "mine.py").exists() and "your global tools" in home_made.stdout


# 2. The README's own examples


def test_tools_find_the_programs_installed_next_to_the_daemon(env: Env, make_daemon: object) -> None:
    env.write_tool(env.global_tools, "where.py", "import shutil\n\ndef where() -> str:\n    return str(shutil.which('atomictoolsd'))\n")
    daemon = make_daemon({"PATH": "/usr/bin:/bin"})  # the venv is not on the PATH the daemon was given
    with daemon.client() as client:
        assert client.call("where").text == str(Path(sys.executable).parent / "atomictoolsd")


def test_a_shell_tool_declares_the_exit_codes_that_are_not_failures(env: Env, make_daemon: object) -> None:
    (env.global_tools).mkdir(parents=True)
    (env.global_tools / "find.json").write_text(json.dumps({"name": "find", "tools": [
        {"name": "todos", "description": "Find TODOs.",
         "inputSchema": {"type": "object", "properties": {"dir": {"type": "string", "default": "."}}},
         "handler": {"type": "shell", "command": "grep -rn TODO -- {{dir}}", "okExitCodes": [0, 1]}},
        {"name": "strict", "description": "grep, every non-zero exit a failure.",
         "inputSchema": {"type": "object", "properties": {"dir": {"type": "string"}}},
         "handler": {"type": "shell", "command": "grep -rn TODO -- {{dir}}"}},
        {"name": "bad", "description": "A bad list.", "handler": {"type": "shell", "command": "true", "okExitCodes": "1"}},
    ]}))
    (env.project / "clean").mkdir()
    (env.project / "clean" / "a.txt").write_text("nothing to do\n")
    daemon = make_daemon()  # type: ignore[operator]
    with daemon.client() as client:
        none = client.call("todos", dir="clean")  # grep exits 1: found nothing, an answer
        assert not none.is_error and none.text == ""
        assert client.call("strict", dir="clean").is_error
        missing = client.call("todos", dir="no-such-dir")  # grep exits 2: still a failure
        assert missing.is_error and "exited with code 2" in missing.text
        problems = client.request("atomic/list", {})["errors"]
    assert any(p.get("tool") == "bad" and "(okExitCodes: a non-empty list of exit codes" in p["message"] for p in problems), problems


def test_suggested_commands_run_as_printed_when_atomictoolsd_is_not_on_path(env: Env, make_daemon: object) -> None:
    env.set_trust_all(False)
    env.vars["PATH"] = "/usr/bin:/bin"
    env.write_tool(env.local_tools, "probe.py", "def probe() -> str:\n    return 'ran'\n")
    make_daemon()  # type: ignore[operator]
    listing = run(env, "list")
    command = listing.stdout.split("to load them confined (no network, nothing outside the project), run: ", 1)[1].split(";")[0]
    assert command.startswith(str(Path(sys.executable).parent / "atomictoolsd") + " trust --sandbox "), command
    trusted = run_in_terminal(shlex.split(command), env=env.vars)  # as printed, typed in a terminal
    assert trusted.returncode == 0, trusted.stderr
    assert "probe" in run(env, "list").stdout


def test_connect_says_where_it_wrote_and_which_project_it_is_for(env: Env) -> None:
    (env.project / "sub").mkdir()
    connected = run(env, "connect", "claude", cwd=env.project / "sub")
    assert connected.returncode == 0, connected.stderr
    assert f"in {env.project.resolve() / '.mcp.json'}" in connected.stdout
    assert f"for the project {env.project.resolve()}: its tools in {env.project.resolve() / '.atomic' / 'tools'}/" in connected.stdout
    codex = run(env, "connect", "codex")
    assert "for every project" in codex.stdout


def test_logs_of_a_tool_show_what_it_printed(env: Env, make_daemon: object) -> None:
    env.write_tool(env.global_tools, "noisy.py", "def noisy() -> str:\n    print('shouting here')\n    return 'ok'\n")
    env.write_tool(env.global_tools, "quiet.py", "def quiet() -> str:\n    print('not this one')\n    return 'ok'\n")
    daemon = make_daemon()  # type: ignore[operator]
    with daemon.client() as client:
        assert client.call("noisy").text == "ok" and client.call("quiet").text == "ok"

    def printed() -> str | None:
        out = run(env, "logs", "--tool", "noisy").stdout
        return out if "shouting here" in out else None

    shown = wait_for(printed, message="noisy's output in its logs")
    assert "not this one" not in shown and "tool.complete" in shown


def _process_state(pid: int) -> str:
    """What /proc says of a process that does not end: its state, signal masks and where it waits."""
    try:
        status = [line for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                  if line.startswith(("State", "SigBlk", "SigIgn", "SigCgt", "Threads"))]
        wchan = Path(f"/proc/{pid}/wchan").read_text()
    except OSError as exc:
        return f"unreadable: {exc}"
    return f"{'; '.join(status)}; wchan {wchan!r}"


def test_a_call_stopped_with_ctrl_c_is_logged_and_counted_as_cancelled(env: Env, make_daemon: object) -> None:
    env.write_tool(env.global_tools, "nap.py", "import time\n\ndef nap() -> str:\n    time.sleep(30)\n    return 'woke'\n")
    daemon = make_daemon()  # type: ignore[operator]
    # Started as a shell starts a command in the foreground: with SIGINT at its default. A test run
    # started in the background (`pytest ... &`) ignores SIGINT, and a child inherits that.
    ignored = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        caller = subprocess.Popen(
            [sys.executable, "-m", "atomictoolsd", "call", "nap"],
            env=env.vars, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
    finally:
        signal.signal(signal.SIGINT, ignored)
    try:
        wait_for(lambda: "tool.start" in run(env, "logs", "--event", "tool.").stdout, timeout=20, message="the call started")
        caller.send_signal(signal.SIGINT)  # what Ctrl-C sends
        try:
            caller.wait(10)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the call did not end within 10 s of SIGINT: {_process_state(caller.pid)}") from None
    finally:
        if caller.poll() is None:
            caller.kill()
            caller.wait(10)
    ends = wait_for(
        lambda: [e for e in map(json.loads, run(env, "logs", "--json", "--event", "tool.").stdout.splitlines())
                 if e["event"] != "tool.start"],
        timeout=10, message="the call's end is in the log",
    )
    assert [e["event"] for e in ends] == ["tool.cancelled"], ends
    with daemon.client() as client:
        nap = next(m for m in client.status()["modules"] if m["path"].endswith("nap.py"))
    assert (nap["calls"], nap["failedCalls"], nap["cancelled"]) == (0, 0, 1), nap
    assert "CANCELLED" in run(env, "status", "--verbose").stdout


def test_a_started_daemons_stderr_file_keeps_warnings_not_every_event(env: Env) -> None:
    """The event log has every event; ``atomictoolsd.stderr`` of a daemon started in the
    background keeps what explains a failure, not a second copy of each info line."""
    env.write_tool(env.local_tools, "greet.py", GREET)
    env.write_tool(env.local_tools, "broken.py", "def broken(:\n")
    try:
        called = run(env, "call", "greet", "name=Ada")  # starts the daemon, as an agent's first call does
        assert called.returncode == 0, called.stderr
        wait_for(lambda: [e for e in read_events(env.state_dir / "log") if e.get("level") == "info"],
                 message="info events in the event log")
        stderr = (env.runtime_dir / "atomictoolsd.stderr").read_text()
        assert " INFO " not in stderr, stderr
    finally:
        run(env, "stop")


def test_call_full_prints_the_whole_of_a_truncated_result(env: Env, make_daemon: object) -> None:
    env.write_tool(env.local_tools, "many.py", '''
        def many(n: int) -> str:
            """Print n numbered lines."""
            return "".join(f"line {i}\\n" for i in range(n))
    ''')
    make_daemon()  # type: ignore[operator]
    cut = run(env, "call", "many", "n=2500")
    assert cut.returncode == 0 and "[output truncated: showing 2,000 of 2,500 lines" in cut.stdout
    whole = run(env, "call", "many", "n=2500", "--full")
    assert whole.returncode == 0, whole.stderr
    assert whole.stdout == "".join(f"line {i}\n" for i in range(2500))
    short = run(env, "call", "many", "n=3", "--full")  # nothing was cut: the result as it is
    assert short.stdout == "line 0\nline 1\nline 2\n\n"
