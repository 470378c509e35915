"""The atomictoolsd command and the tiny client, as a user runs them."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from atomictools import AsyncClient, Client, ConnectError
from helpers import Env, daemon_pid, wait_for

GREET = '''
    from typing import Annotated
    from atomictools import Field

    def greet(name: str, times: Annotated[int, Field(ge=1)] = 1, loud: bool = False) -> str:
        """Greet someone."""
        text = " ".join([f"Hello, {name}"] * times)
        return text.upper() if loud else text
'''


def run(env: Env, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "atomictoolsd", *args],
        env=env.vars, cwd=cwd or env.project, capture_output=True, text=True, timeout=60,
    )


def test_start_list_call_status_stop(detached: Env) -> None:
    env = detached
    env.write_tool(env.global_tools, "greet.py", GREET)
    env.write_tool(env.local_tools, "broken.py", "def broken(:\n")

    started = run(env, "start")
    assert started.returncode == 0 and "atomictoolsd started (pid" in started.stdout
    pid = daemon_pid(env)
    assert pid is not None and psutil.Process(pid).ppid() != os.getpid(), "the daemon is detached"
    again = run(env, "start")
    assert again.returncode == 0 and f"already running (pid {pid})" in again.stdout

    listing = run(env, "list")
    assert listing.returncode == 0
    assert "greet" in listing.stdout and "global" in listing.stdout
    assert "broken.py:1: SyntaxError" in listing.stdout
    as_json = json.loads(run(env, "list", "--json").stdout)
    assert [t["name"] for t in as_json["tools"]] == ["greet"]
    assert as_json["tools"][0]["scope"] == "global" and as_json["tools"][0]["path"].endswith("greet.py")
    assert as_json["errors"][0]["line"] == 1

    # key=value: a string where the schema wants one, JSON otherwise.
    called = run(env, "call", "greet", "name=123", "times=2", "loud=true")
    assert (called.returncode, called.stdout) == (0, "HELLO, 123 HELLO, 123\n")
    by_json = run(env, "call", "greet", "--args", '{"name": "Ada"}')
    assert by_json.stdout == "Hello, Ada\n"
    bad = run(env, "call", "greet", "name=x", "times=0")
    assert bad.returncode == 1 and "Expected `int` >= 1 - at `$.times`" in bad.stderr
    unknown = run(env, "call", "nope")
    assert unknown.returncode == 2 and "Unknown tool: 'nope'" in unknown.stderr
    # Options combine with the arguments in any order.
    mixed = run(env, "call", "greet", "--json", "name=Ada", "--timeout", "5", "times=2")
    assert mixed.returncode == 0, mixed.stderr
    assert json.loads(mixed.stdout)["content"][0]["text"] == "Hello, Ada Hello, Ada"
    stray = run(env, "call", "greet", "name=Ada", "--no-such-option")
    assert stray.returncode == 2 and "unrecognized arguments: --no-such-option" in stray.stderr

    status = run(env, "status", "--verbose")
    assert status.returncode == 0 and f"pid {pid}" in status.stdout and "greet.py" in status.stdout
    status_json = json.loads(run(env, "status", "--json").stdout)
    assert status_json["pid"] == pid

    stopped = run(env, "stop")
    assert stopped.returncode == 0 and f"stopped (pid {pid})" in stopped.stdout
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert run(env, "status").returncode == 3
    assert "not running" in run(env, "stop").stdout


def test_start_reports_why_the_daemon_could_not_start(env: Env) -> None:
    env.write_config("call_timeout = 'never'\n")
    result = run(env, "start")
    assert result.returncode == 2  # as `serve` exits on a bad configuration
    assert "bad configuration: call_timeout (from " in result.stderr and "expected a number" in result.stderr
    assert daemon_pid(env) is None


def test_a_started_daemon_leaves_the_starters_directory_and_keeps_its_stderr_file_small(detached: Env) -> None:
    env = detached
    env.write_tool(env.global_tools, "noisy.py", "def noisy() -> str:\n    print('x' * 100_000)\n    return 'ok'\n")
    env.runtime_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    stderr = env.runtime_dir / "atomictoolsd.stderr"
    stderr.write_bytes(b"an old line\n" * 200_000)  # 2.4 MB from earlier daemons
    started = run(env, "start")
    assert started.returncode == 0, started.stderr
    assert (env.runtime_dir / "atomictoolsd.stderr.1").stat().st_size == 2_400_000, "rotated when the daemon started"
    assert stderr.stat().st_size < 100_000
    pid = daemon_pid(env)
    assert pid is not None and psutil.Process(pid).cwd() == "/", "it keeps no directory of the starter's busy"
    with Client(directory=str(env.home), autostart=False) as client:
        for _ in range(20):
            assert client.call("noisy").text == "ok"
    assert stderr.stat().st_size < 100_000, "what tools print goes to the event log, not here"


def test_client_autostarts_a_daemon_that_outlives_its_process_group(detached: Env) -> None:
    env = detached
    env.write_tool(env.global_tools, "greet.py", GREET)
    script = (
        "from atomictools import Client\n"
        "with Client() as c:\n"
        "    print(c.call('greet', name='auto').text, flush=True)\n"
    )
    # Like an MCP client shutting down its server: the whole process group gets SIGKILL.
    proc = subprocess.Popen([sys.executable, "-c", script], env=env.vars, cwd=env.project, stdout=subprocess.PIPE, text=True, start_new_session=True)
    out, _ = proc.communicate(timeout=60)
    assert out == "Hello, auto\n"
    pid = wait_for(lambda: daemon_pid(env), message="the daemon's pid file")
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    with Client(directory=str(env.project), autostart=False) as client:
        assert client.status()["pid"] == pid


def test_client_without_autostart_says_how_to_start(env: Env) -> None:
    with pytest.raises(ConnectError, match="atomictoolsd start"):
        Client(str(env.socket), autostart=False).connect()


def test_list_formats_for_llm_apis(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    env.write_tool(env.global_tools, "greet.py", GREET)
    daemon = make_daemon()
    with daemon.client() as client:
        mcp = client.list_tools()
        openai = client.list_tools(format="openai")
        anthropic = client.list_tools(format="anthropic")
    schema = mcp[0]["inputSchema"]
    assert openai == [{"type": "function", "function": {"name": "greet", "description": "Greet someone.", "parameters": schema}}]
    assert anthropic == [{"name": "greet", "description": "Greet someone.", "input_schema": schema}]


def test_list_tools_for_another_directory(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    other = env.root / "other"
    env.write_tool(other / ".atomic" / "tools", "only_here.py", "def only_here() -> str:\n    return 'here'\n")
    env.write_tool(env.local_tools, "project_tool.py", "def project_tool() -> str:\n    return 'p'\n")
    daemon = make_daemon()
    with daemon.client() as client:
        assert [t["name"] for t in client.list_tools()] == ["project_tool"]
        assert [t["name"] for t in client.list_tools(directory=str(other))] == ["only_here"]
        assert client.call("only_here").text == "here"


def test_async_client_twin(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    env.write_tool(env.global_tools, "greet.py", GREET)
    daemon = make_daemon()

    async def main() -> tuple[list[str], list[str], dict]:  # type: ignore[type-arg]
        async with AsyncClient(str(env.socket), directory=str(env.project), autostart=False) as client:
            names = [t["name"] for t in await client.list_tools()]
            texts = await asyncio.gather(*(client.call("greet", name=str(i)) for i in range(20)))
            return names, [t.text for t in texts], await client.reload()

    names, texts, reload = asyncio.run(main())
    assert names == ["greet"]
    assert texts == [f"Hello, {i}" for i in range(20)]
    assert reload == {"success": True, "toolCount": 1, "errors": []}
    assert daemon.proc.poll() is None


def test_watch_yields_notifications_and_its_timeout_leaves_the_client_usable(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    daemon = make_daemon()
    with daemon.client() as client:
        assert list(client.watch(timeout=0.2)) == []  # subscribed; nothing happened meanwhile
        assert client.status()["pid"] == daemon.pid  # the timed-out wait left the connection usable
        env.write_tool(env.global_tools, "greet.py", GREET)
        notification = next(client.watch(timeout=30))
        assert notification["method"] == "notifications/tools/list_changed"
        assert [t["name"] for t in client.list_tools()] == ["greet"]


def test_the_async_client_raises_connect_error_once_the_daemon_is_gone(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    daemon = make_daemon()

    async def main() -> None:
        client = AsyncClient(str(env.socket), directory=str(env.project), autostart=False)
        await client.connect()
        watching = asyncio.ensure_future(client.watch().__anext__())
        assert (await client.status())["pid"] == daemon.pid
        await asyncio.get_running_loop().run_in_executor(None, daemon.stop)
        with pytest.raises(ConnectError):
            await asyncio.wait_for(watching, 30)  # a watch ends with the connection, never hangs
        with pytest.raises(ConnectError):
            await asyncio.wait_for(client.status(), 30)  # a request after the loss, never hangs
        with pytest.raises(ConnectError, match="atomictoolsd start"):
            await client.status()  # then it connects afresh: nobody listens
        await client.close()

    asyncio.run(main())


def test_every_set_up_error_is_one_clean_line_from_any_command(env: Env) -> None:
    from atomictoolsd.config.errors import SetupError
    from atomictoolsd.config.paths import PathError
    from atomictoolsd.config.settings import ConfigError
    from atomictoolsd.service.activation import ActivationError
    from atomictoolsd.transports.http import AddressError

    assert all(issubclass(c, SetupError) for c in (ConfigError, PathError, ActivationError, AddressError))
    os.chmod(env.runtime_base, 0o755)  # a runtime dir open to others: the daemon must not serve there
    try:
        for command in (["serve"], ["config"]):
            result = run(env, *command)
            assert result.returncode == 1, (command, result.stderr)
            assert result.stderr.startswith("atomictoolsd: ") and "chmod 700" in result.stderr, result.stderr
            assert "Traceback" not in result.stderr and result.stderr.count("\n") == 1, result.stderr
    finally:
        os.chmod(env.runtime_base, 0o700)
    for command in (["serve", "--http", "x:y"], ["start", "--http", "x:y"]):  # an address: exit 2 as a setting
        result = run(env, *command)
        assert result.returncode == 2, (command, result.stderr)
        assert result.stderr.startswith("atomictoolsd: bad configuration: --http: http address 'x:y'"), result.stderr
    env.write_config("call_timeout = 'never'\n")
    for command in (["serve"], ["config"], ["start"], ["service", "install", "--dry-run"]):
        result = run(env, *command)
        assert result.returncode == 2, (command, result.stderr)
        assert result.stderr.startswith("atomictoolsd: bad configuration: call_timeout"), (command, result.stderr)
        assert "Traceback" not in result.stderr and result.stderr.count("\n") == 1, result.stderr
    assert daemon_pid(env) is None
