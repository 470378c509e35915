"""The stdio shim against a real daemon, driven by the official MCP client as agents drive it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import mcp_types as types
import psutil
import pytest
from mcp import Client as McpClient
from mcp.shared.exceptions import MCPError

from atomictools import Client
from atomictools._protocol import SUPPORTED_PROTOCOL_VERSIONS
from helpers import Daemon, Env, RawConnection, command_line, serving, wait_for
from shim_helpers import SHIM, mcp_session, run, shim_params, wait_until

KIT = '''
    import time
    from pathlib import Path

    import msgspec
    from atomictools import Context, ToolError, tool


    class Sum(msgspec.Struct):
        total: int


    @tool
    def echo(text: str) -> str:
        """Echo the text back."""
        return text


    @tool(annotations={"readOnlyHint": True})
    def add(a: int, b: int) -> Sum:
        """Add two numbers."""
        return Sum(total=a + b)


    @tool
    def refuse(reason: str) -> str:
        """Always fail."""
        raise ToolError(f"refused: {reason}")


    @tool
    def steps(n: int, ctx: Context) -> str:
        """Report progress n times."""
        for i in range(n):
            ctx.progress(i + 1, n, f"step {i + 1}")
        return "done"


    @tool
    def wait(marker: str, ctx: Context) -> str:
        """Wait until cancelled; leave marker files behind."""
        Path(marker + ".started").write_text("")
        deadline = time.monotonic() + 60
        while not ctx.cancelled and time.monotonic() < deadline:
            time.sleep(0.01)
        Path(marker + (".cancelled" if ctx.cancelled else ".timeout")).write_text("")
        return "stopped"
'''


@pytest.fixture(scope="module")
def kit_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """One daemon for the module's tests that list and call kit.py's tools (the markers a call
    leaves go to each test's own ``tmp_path``)."""
    env = Env(tmp_path_factory.mktemp("kit"))
    env.write_tool(env.global_tools, "kit.py", KIT)
    with serving(env) as daemon:
        yield daemon


@pytest.fixture
def own_kit_daemon(env: Env, make_daemon) -> Daemon:  # type: ignore[no-untyped-def]
    """A kit daemon of the test's own, for a test that adds tools or stops it."""
    env.write_tool(env.global_tools, "kit.py", KIT)
    return make_daemon()


def names(result: types.ListToolsResult) -> list[str]:
    return [t.name for t in result.tools]


# -- MCP through the shim ---------------------------------------------------------------------------


@pytest.mark.parametrize("version", SUPPORTED_PROTOCOL_VERSIONS)
def test_initialize_answers_each_supported_version(kit_daemon: Daemon, version: str) -> None:
    env = kit_daemon.env
    async def scenario() -> None:
        async with mcp_session(env, initialize=False) as (session, _):
            request = types.InitializeRequest(
                params=types.InitializeRequestParams(
                    protocol_version=version,
                    capabilities=types.ClientCapabilities(),
                    client_info=types.Implementation(name="test", version="0"),
                )
            )
            result = await session.send_request(request, types.InitializeResult)
            assert result.protocol_version == version
            assert result.server_info.name == "atomictoolsd"
            assert result.capabilities.tools is not None and result.capabilities.tools.list_changed
            assert result.capabilities.logging is not None
            session.adopt(result)
            await session.send_notification(types.InitializedNotification())
            assert "kit_echo" in names(await session.list_tools())

    run(scenario)


def test_list_call_structured_output_errors_and_unknown_tool(kit_daemon: Daemon) -> None:
    env = kit_daemon.env
    async def scenario() -> None:
        async with mcp_session(env) as (session, _):
            await session.send_ping()
            listing = await session.list_tools()
            assert names(listing) == ["kit_add", "kit_echo", "kit_refuse", "kit_steps", "kit_wait"]
            add = next(t for t in listing.tools if t.name == "kit_add")
            assert add.output_schema is not None and add.output_schema["type"] == "object"
            assert add.annotations is not None and add.annotations.read_only_hint is True

            echoed = await session.call_tool("kit_echo", {"text": "héllo"})
            assert not echoed.is_error and echoed.content[0].text == "héllo"
            # Lines and frames larger than a read asks for at first (a page): the shim, the daemon
            # and the worker take the rest in larger reads, and each size around it comes whole.
            # (A result past 50,000 bytes comes cut, its whole in a file: its start is checked.)
            for size in (4095, 4096, 4097, 40_000, 70_000, 300_000):
                text = "".join(chr(0x61 + i % 26) for i in range(size))
                echoed = await session.call_tool("kit_echo", {"text": text})
                answer = echoed.content[0].text
                assert not echoed.is_error and (answer == text if size < 50_000 else answer[:40_000] == text[:40_000]), size

            added = await session.call_tool("kit_add", {"a": 2, "b": 3})
            assert not added.is_error
            assert added.structured_content == {"total": 5}
            assert json.loads(added.content[0].text) == {"total": 5}

            refused = await session.call_tool("kit_refuse", {"reason": "no"})
            assert refused.is_error and "refused: no" in refused.content[0].text

            bad = await session.call_tool("kit_add", {"a": "two", "b": 3})
            assert bad.is_error and "$.a" in bad.content[0].text

            with pytest.raises(MCPError) as unknown:
                await session.call_tool("missing", {})
            assert unknown.value.error.code == -32602

    run(scenario)


def test_list_changed_reaches_the_agent_after_a_reload(own_kit_daemon: Daemon, env: Env) -> None:
    """The watcher and ``atomic/reload`` share the notification path; this drives it by reload."""

    async def scenario() -> None:
        async with mcp_session(env) as (session, seen):
            assert "extra" not in names(await session.list_tools())
            env.write_tool(env.global_tools, "extra.py", '''
                def extra() -> str:
                    """A tool added while the agent runs."""
                    return "new"
            ''')
            with own_kit_daemon.client() as other:  # a second connection to the same project
                other.reload()
            await wait_until(lambda: "notifications/tools/list_changed" in seen.methods())
            assert "extra" in names(await session.list_tools())
            assert (await session.call_tool("extra", {})).content[0].text == "new"

    run(scenario)


def test_list_changed_reaches_the_agent_after_a_file_write(own_kit_daemon: Daemon, env: Env) -> None:
    async def scenario() -> None:
        async with mcp_session(env) as (session, seen):
            await session.list_tools()
            # A session may initialize before the daemon's first load of kit.py ends; that load then
            # sends a list_changed of its own, before the answer to the listing above. Count from here.
            await session.send_ping()
            before = seen.methods().count("notifications/tools/list_changed")
            env.write_tool(env.global_tools, "written.py", '''
                def written() -> str:
                    """A tool saved while the agent runs."""
                    return "saved"
            ''')
            await wait_until(lambda: seen.methods().count("notifications/tools/list_changed") > before)
            assert "written" in names(await session.list_tools())
            assert (await session.call_tool("written", {})).content[0].text == "saved"

    run(scenario)


def test_cancelling_a_call_stops_the_tool(kit_daemon: Daemon, tmp_path: Path) -> None:
    env = kit_daemon.env
    marker = str(tmp_path / "wait")

    async def scenario() -> None:
        async with mcp_session(env) as (session, _):
            async with anyio.create_task_group() as group:
                group.start_soon(session.call_tool, "kit_wait", {"marker": marker})
                await wait_until(lambda: Path(marker + ".started").exists())
                group.cancel_scope.cancel()  # the client sends notifications/cancelled
            await wait_until(lambda: Path(marker + ".cancelled").exists(), message="the tool saw the cancellation")
            assert (await session.call_tool("kit_echo", {"text": "still here"})).content[0].text == "still here"

    run(scenario)
    assert not Path(marker + ".timeout").exists()


def test_progress_notifications_reach_the_caller(kit_daemon: Daemon) -> None:
    env = kit_daemon.env
    updates: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        updates.append((progress, total, message))

    async def scenario() -> None:
        async with mcp_session(env) as (session, _):
            result = await session.call_tool("kit_steps", {"n": 3}, progress_callback=on_progress)
            assert result.content[0].text == "done"

    run(scenario)
    assert updates == [(1, 3, "step 1"), (2, 3, "step 2"), (3, 3, "step 3")]


def test_allow_and_deny_hold_at_dispatch_not_only_in_the_list(kit_daemon: Daemon) -> None:
    env = kit_daemon.env
    async def scenario() -> None:
        async with mcp_session(env, "--allow", "kit_*", "--deny", "kit_refuse", "--deny", "kit_w*") as (session, _):
            assert names(await session.list_tools()) == ["kit_add", "kit_echo", "kit_steps"]
            with pytest.raises(MCPError) as denied:
                await session.call_tool("kit_refuse", {"reason": "x"})  # a client that knows the name anyway
            assert denied.value.error.code == -32602
            assert "not allowed" in denied.value.error.message
            assert (await session.call_tool("kit_echo", {"text": "ok"})).content[0].text == "ok"

    run(scenario)


def test_an_agent_cannot_widen_its_allowlist_or_stop_the_daemon(kit_daemon: Daemon) -> None:
    """The shim relays every line, atomic/* included: its session is locked to what it attached."""
    env = kit_daemon.env
    shim = spawn_shim(env, "--allow", "kit_echo")
    assert shim.stdin is not None and shim.stdout is not None
    attempts = [
        {"jsonrpc": "2.0", "id": 1, "method": "atomic/attach", "params": {"directory": str(env.project)}},
        {"jsonrpc": "2.0", "id": 2, "method": "atomic/shutdown"},
        {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "kit_refuse", "arguments": {"reason": "x"}}},
        {"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": "kit_echo", "arguments": {"text": "still here"}}},
    ]
    shim.stdin.write(b"".join(json.dumps(a).encode() + b"\n" for a in attempts))
    shim.stdin.flush()
    answers = {a["id"]: a for a in (json.loads(shim.stdout.readline()) for _ in attempts)}
    shim.stdin.close()
    shim.wait(timeout=10)
    assert answers[1]["error"]["code"] == -32600 and "locked" in answers[1]["error"]["message"]
    assert answers[2]["error"]["code"] == -32600 and "locked" in answers[2]["error"]["message"]
    assert answers[3]["error"]["code"] == -32602 and "not allowed" in answers[3]["error"]["message"]
    assert answers[4]["result"]["content"][0]["text"] == "still here"
    assert kit_daemon.proc.poll() is None


def test_dispatcher_lists_and_calls_tools_added_after_the_listing(own_kit_daemon: Daemon, env: Env) -> None:
    updates: list[float] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        updates.append(progress)

    async def scenario() -> None:
        async with mcp_session(env, "--dispatcher", "--deny", "kit_refuse") as (session, _):
            listing = await session.list_tools()
            assert names(listing)[:2] == ["atomic_list_tools", "atomic_call_tool"]
            assert "kit_echo" in names(listing) and "kit_refuse" not in names(listing)

            env.write_tool(env.global_tools, "late.py", '''
                def late(word: str) -> str:
                    """Added after the agent listed its tools."""
                    return word.upper()
            ''')
            with own_kit_daemon.client() as other:
                other.reload()

            current = await session.call_tool("atomic_list_tools", {})
            assert not current.is_error
            listed = {t["name"]: t for t in current.structured_content["tools"]}
            assert "late" in listed and "kit_refuse" not in listed
            assert listed["late"]["inputSchema"]["properties"] == {"word": {"type": "string"}}
            assert json.loads(current.content[0].text) == current.structured_content
            only = await session.call_tool("atomic_list_tools", {"pattern": "kit_e*"})
            assert [t["name"] for t in only.structured_content["tools"]] == ["kit_echo"]

            called = await session.call_tool("atomic_call_tool", {"name": "late", "arguments": {"word": "hi"}})
            assert not called.is_error and called.content[0].text == "HI"

            invalid = await session.call_tool("atomic_call_tool", {"name": "kit_add", "arguments": {"a": "x", "b": 1}})
            assert invalid.is_error and "$.a" in invalid.content[0].text

            denied = await session.call_tool("atomic_call_tool", {"name": "kit_refuse", "arguments": {"reason": "x"}})
            assert denied.is_error and "not allowed" in denied.content[0].text

            missing = await session.call_tool("atomic_call_tool", {"name": "nope"})
            assert missing.is_error and "atomic_list_tools" in missing.content[0].text

            shapeless = await session.call_tool("atomic_call_tool", {"name": "kit_echo", "arguments": [1]})
            assert shapeless.is_error

            stepped = await session.call_tool(
                "atomic_call_tool", {"name": "kit_steps", "arguments": {"n": 2}}, progress_callback=on_progress
            )
            assert stepped.content[0].text == "done"

    run(scenario)
    assert updates == [1, 2]


def test_the_default_mcp_client_connects_without_waiting_for_discover(kit_daemon: Daemon) -> None:
    """mcp.Client probes server/discover first and waits 10 s for an answer that never comes."""
    env = kit_daemon.env

    async def scenario() -> float:
        started = time.monotonic()
        async with McpClient(shim_params(env)) as client:
            connected = time.monotonic() - started
            assert "kit_echo" in names(await client.list_tools())
            assert (await client.call_tool("kit_echo", {"text": "auto"})).content[0].text == "auto"
        return connected

    assert run(scenario) < 8.0  # far below the 10 s a silent server would cost


@pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning")  # logging, from 2026-07-28
def test_logging_level_and_messages_from_tools(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    env.write_tool(env.global_tools, "chatty.py", '''
        from atomictools import Context

        def chatty(ctx: Context) -> str:
            """Log at two levels."""
            ctx.log("debug", "fine detail")
            ctx.log("warning", {"disk": "low"})
            return "ok"
    ''')
    make_daemon()

    async def scenario() -> list[types.LoggingMessageNotificationParams]:
        async with mcp_session(env) as (session, seen):
            await session.set_logging_level("warning")
            await session.call_tool("chatty", {})
            await wait_until(lambda: any(getattr(n, "method", "") == "notifications/message" for n in seen.notifications))
            return [n.params for n in seen.notifications if getattr(n, "method", "") == "notifications/message"]

    messages = run(scenario)
    assert [(m.level, m.data) for m in messages] == [("warning", {"disk": "low"})]


# -- the shim as a process --------------------------------------------------------------------------

INITIALIZE = {
    "jsonrpc": "2.0", "id": 1, "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}},
}


def _hangup_ends_it() -> None:
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def spawn_shim(env: Env, *args: str, **kwargs) -> subprocess.Popen[bytes]:  # type: ignore[no-untyped-def]
    return subprocess.Popen(
        [SHIM, "mcp", *args], env=env.vars, cwd=env.project, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, **kwargs,
    )


def test_the_shim_exits_when_stdin_closes_and_writes_only_mcp(kit_daemon: Daemon) -> None:
    env = kit_daemon.env
    shim = spawn_shim(env)
    assert shim.stdin is not None and shim.stdout is not None
    shim.stdin.write(json.dumps(INITIALIZE).encode() + b"\n")
    shim.stdin.flush()
    answer = json.loads(shim.stdout.readline())
    assert answer["id"] == 1 and answer["result"]["serverInfo"]["name"] == "atomictoolsd"
    shim.stdin.write(b'{"jsonrpc":"2.0","id":2,"method":"ping"}\n')
    shim.stdin.close()
    assert shim.wait(timeout=10) == 0
    rest = shim.stdout.read().splitlines()
    assert all(json.loads(line)["jsonrpc"] == "2.0" for line in rest)  # never the attach answer, never a log
    assert not any(b"atomictoolsd-shim-attach" in line for line in rest)


def test_the_shim_exits_when_its_parent_dies(kit_daemon: Daemon, tmp_path: Path) -> None:
    env = kit_daemon.env
    read_end, write_end = os.pipe()
    # A parent that starts the shim on our pipe and then just waits: killing it leaves the shim's
    # stdin open (we hold the write end), so only the parent's death can end the shim.
    parent = subprocess.Popen(
        [sys.executable, "-c",
         "import subprocess, sys, time; p = subprocess.Popen(sys.argv[1:], stdin=0, stdout=subprocess.DEVNULL);"
         " print(p.pid, flush=True); time.sleep(120)", SHIM, "mcp"],
        env=env.vars, cwd=env.project, stdin=read_end, stdout=subprocess.PIPE,
    )
    os.close(read_end)
    try:
        assert parent.stdout is not None
        shim = psutil.Process(int(parent.stdout.readline()))
        with kit_daemon.raw() as raw:  # attached: it has read its parent's pid long before
            wait_for(lambda: shim.pid in {s["pid"] for s in raw.request("atomic/status")["result"]["sessions"]},
                     message="the shim to attach")
        # A call in flight when the agent dies: it is cancelled then, not run to its end.
        marker = tmp_path / "orphaned"
        call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                "params": {"name": "kit_wait", "arguments": {"marker": str(marker)}}}
        os.write(write_end, (json.dumps(INITIALIZE) + "\n" + json.dumps(call) + "\n").encode())
        wait_for(lambda: Path(str(marker) + ".started").exists(), message="the call to start")
        parent.kill()
        parent.wait()
        shim.wait(timeout=10)  # raises TimeoutExpired when the shim outlives its parent
        wait_for(lambda: Path(str(marker) + ".cancelled").exists(), timeout=5, message="the call to be cancelled")
    finally:
        os.close(write_end)
        if parent.poll() is None:
            parent.kill()
            parent.wait()


def test_the_shim_exits_with_a_message_when_the_daemon_stops(own_kit_daemon: Daemon, env: Env) -> None:
    shim = spawn_shim(env)
    assert shim.stdin is not None and shim.stdout is not None and shim.stderr is not None
    shim.stdin.write(json.dumps(INITIALIZE).encode() + b"\n")
    shim.stdin.flush()
    assert json.loads(shim.stdout.readline())["id"] == 1
    own_kit_daemon.stop()
    assert shim.wait(timeout=20) == 1
    assert b"the daemon closed the connection" in shim.stderr.read()
    shim.stdin.close()


def test_the_shim_path_loads_only_the_standard_library(kit_daemon: Daemon, tmp_path: Path) -> None:
    """Through ``cli.main`` (what the console script runs), a whole session loads no argparse, json,
    typing, socket, subprocess, threading, msgspec or daemon module."""
    env = kit_daemon.env
    dump = tmp_path / "modules.json"
    code = (
        "import sys\n"
        "from atomictoolsd.cli import main\n"
        "code = main(['mcp', '--no-autostart'])\n"
        "loaded = sorted(sys.modules)\n"
        "import json\n"
        f"open({str(dump)!r}, 'w').write(json.dumps(loaded))\n"
        "sys.exit(code)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=env.vars, cwd=env.project, capture_output=True, timeout=30,
        input=json.dumps(INITIALIZE).encode() + b"\n",
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[0])["id"] == 1
    loaded = set(json.loads(dump.read_text()))
    ours = {m for m in loaded if m.split(".")[0] in ("atomictoolsd", "atomictools")}
    assert ours == {"atomictoolsd", "atomictoolsd.cli", "atomictoolsd.shim", "atomictoolsd.shim.relay", "atomictools", "atomictools._paths"}
    heavy = {"argparse", "json", "typing", "socket", "subprocess", "threading", "enum", "asyncio", "msgspec", "re"}
    # The interpreter's site machinery may import some of these on its own: only the shim's are checked.
    baseline = set(json.loads(subprocess.run(
        [sys.executable, "-c", "import sys; loaded = sorted(sys.modules); import json; print(json.dumps(loaded))"],
        capture_output=True, text=True, env=env.vars, check=True,
    ).stdout))
    assert not (loaded - baseline) & heavy, sorted((loaded - baseline) & heavy)
    third_party = {m.split(".")[0] for m in loaded - baseline} - set(sys.stdlib_module_names) - {"atomictoolsd", "atomictools"}
    assert not third_party, third_party


# -- starting the daemon ------------------------------------------------------------------------------


def _stop_daemon_by_pid(pid: int) -> None:
    process = psutil.Process(pid)
    family = process.children(recursive=True)
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=30)
    gone, alive = psutil.wait_procs(family, timeout=10)
    for leftover in alive:
        leftover.kill()
    assert not alive, f"the daemon left {alive}"


def test_the_shim_starts_a_daemon_that_survives_the_agents_shutdown(env: Env) -> None:
    env.write_tool(env.global_tools, "hello.py", '''
        def hello() -> str:
            """Say hello."""
            return "hello"
    ''')
    shim_pids: list[int] = []

    async def scenario() -> None:
        async with mcp_session(env) as (session, _):
            assert (await session.call_tool("hello", {})).content[0].text == "hello"
            shim_pids.extend(p.pid for p in psutil.Process().children() if SHIM in command_line(p))

    run(scenario)  # leaving it closes stdin, then SIGTERMs the shim's whole process group
    assert shim_pids
    pid = int((env.runtime_dir / "atomictoolsd.lock").read_text())
    try:
        daemon = psutil.Process(pid)
        assert daemon.is_running() and pid not in shim_pids
        assert os.getsid(pid) not in (os.getsid(0), *shim_pids)  # its own session: nobody's process group
        with Client(str(env.socket), directory=str(env.project), autostart=False) as client:
            assert client.call("hello").text == "hello"
    finally:
        _stop_daemon_by_pid(pid)


def test_shims_started_together_share_one_new_daemon(env: Env) -> None:
    shims = [spawn_shim(env) for _ in range(3)]
    try:
        for shim in shims:
            assert shim.stdin is not None
            shim.stdin.write(json.dumps(INITIALIZE).encode() + b"\n")
            shim.stdin.flush()
        for shim in shims:
            assert shim.stdout is not None
            assert json.loads(shim.stdout.readline())["result"]["serverInfo"]["name"] == "atomictoolsd"
        pid = int((env.runtime_dir / "atomictoolsd.lock").read_text())
        with RawConnection(env.socket) as raw:
            sessions = raw.request("atomic/status")["result"]["sessions"]
        assert {s["pid"] for s in sessions} >= {s.pid for s in shims}
    finally:
        for shim in shims:
            assert shim.stdin is not None
            shim.stdin.close()
            shim.wait(timeout=10)
    _stop_daemon_by_pid(pid)


def test_without_autostart_a_missing_daemon_is_a_clear_error(env: Env) -> None:
    done = subprocess.run([SHIM, "mcp", "--no-autostart"], env=env.vars, cwd=env.project, input=b"",
                          capture_output=True, timeout=30)
    assert done.returncode == 1 and done.stdout == b""
    assert b"atomictoolsd start" in done.stderr


def test_bad_arguments_exit_2_with_usage(env: Env) -> None:
    for args in (["--bogus"], ["--directory", str(env.root / "nowhere")], ["--allow"]):
        done = subprocess.run([SHIM, "mcp", *args], env=env.vars, cwd=env.project, input=b"",
                              capture_output=True, timeout=30)
        assert done.returncode == 2, args
        assert done.stdout == b"" and b"usage: atomictoolsd mcp" in done.stderr


def test_attach_applies_to_the_very_next_line(kit_daemon: Daemon) -> None:
    """The shim sends its attach and the agent's first requests back to back, in one write."""
    with kit_daemon.raw() as raw:
        assert len(raw.request("tools/list")["result"]["tools"]) == 5  # loaded: the next list is answered at once
        raw.send_bytes(
            b'{"jsonrpc":"2.0","id":"a","method":"atomic/attach","params":{"allow":["kit_echo"],"dispatcher":true}}\n'
            b'{"jsonrpc":"2.0","id":"l","method":"tools/list"}\n'
        )
        replies = {reply["id"]: reply for reply in (raw.recv(), raw.recv())}
    listed = [t["name"] for t in replies["l"]["result"]["tools"]]
    assert listed == ["atomic_list_tools", "atomic_call_tool", "kit_echo"]


@pytest.mark.parametrize("how", ["stdin-then-sigterm", "stdin-then-sigkill", "sigterm", "sigkill", "sigint", "stdin-then-sighup"])
def test_every_way_a_client_goes_cancels_its_call_at_once(kit_daemon: Daemon, tmp_path: Path, how: str) -> None:
    """The MCP stdio shutdown closes stdin, then sends SIGTERM (both TypeScript SDKs' close() do):
    the call in flight stops then, as with a plain SIGTERM or a kill, not at the end of its run; so it
    does on Ctrl-C in the agent's terminal (SIGINT) or when that terminal closes (SIGHUP)."""
    env = kit_daemon.env
    # As in an agent's terminal, SIGHUP ends a process by default: not so under nohup, whose ignoring
    # it every child inherits (and the shim keeps, as any program does).
    shim = spawn_shim(env, preexec_fn=_hangup_ends_it)
    assert shim.stdin is not None and shim.stdout is not None
    shim.stdin.write(json.dumps(INITIALIZE).encode() + b"\n")
    shim.stdin.flush()
    assert json.loads(shim.stdout.readline())["id"] == 1
    marker = tmp_path / "leak"
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "kit_wait", "arguments": {"marker": str(marker)}}}
    shim.stdin.write(json.dumps(call).encode() + b"\n")
    shim.stdin.flush()
    wait_for(lambda: Path(str(marker) + ".started").exists(), timeout=3, message="the call to start")
    if how.startswith("stdin"):
        shim.stdin.close()
        time.sleep(0.2)  # the half-close reaches the daemon first, as with an SDK's close()
    shim.send_signal(getattr(signal, how.rsplit("-", 1)[-1].upper()))
    shim.wait(timeout=10)
    # The tool waits up to 60 s unless cancelled: a leaked call would write .timeout only then.
    wait_for(lambda: Path(str(marker) + ".cancelled").exists(), timeout=5, message="the call to be cancelled")
