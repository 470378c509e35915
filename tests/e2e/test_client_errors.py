"""The client's errors as the tree in atomictools/_errors.py draws it, against a real daemon: each
kind of failure raises its own class (and the old names still catch it), a failed tool result
raises on request, and a client-side timeout cancels the call in the daemon."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from atomictools import (
    AsyncClient,
    CallTimeout,
    CannotConnect,
    Client,
    ConnectError,
    ConnectionLost,
    ProtocolError,
    RPCError,
    ToolError,
    TransportError,
    UnknownTool,
)
from helpers import Daemon, Env, serving, wait_for

TOOLS = {
    "greet.py": """
from atomictools import tool

@tool
def greet(name: str) -> str:
    return f"Hello, {name}"
""",
    "refuse.py": """
from atomictools import ToolError, tool

@tool
def refuse(why: str) -> str:
    raise ToolError(why)
""",
    "patient.py": """
from pathlib import Path
from atomictools import Context, tool

@tool
def patient(marker: str, ctx: Context) -> str:
    Path(marker + ".started").write_text("")
    if ctx.cancel_event.wait(60):
        Path(marker).write_text("cancelled")
        return "cancelled"
    return "waited a minute"
""",
    "chatty.py": """
from pathlib import Path
from atomictools import Context, tool

@tool
def chatty(marker: str, ctx: Context) -> str:
    # Logs far more often than the client's timeout, until cancelled.
    while not ctx.cancel_event.wait(0.1):
        ctx.log("info", "still working")
    Path(marker).write_text("cancelled")
    return "cancelled"
""",
}


@pytest.fixture(scope="module")
def tools_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """One daemon for the module's tests that call its tools and read the answers."""
    env = Env(tmp_path_factory.mktemp("client-errors"))
    for filename, source in TOOLS.items():
        env.write_tool(env.local_tools, filename, source)
    with serving(env) as daemon:
        yield daemon


@pytest.fixture
def own_tools_daemon(env: Env, make_daemon):  # type: ignore[no-untyped-def]
    """A daemon of the test's own, for a test that counts its cancelled calls or adds a tool."""
    for filename, source in TOOLS.items():
        env.write_tool(env.local_tools, filename, source)
    return make_daemon()


def _cancelled_calls(client: Client) -> int:
    return sum(m["cancelled"] for m in client.status()["modules"] if m["path"].endswith("patient.py"))


def test_an_unknown_tool_is_its_own_protocol_error_and_the_old_name_still_catches_it(tools_daemon) -> None:  # type: ignore[no-untyped-def]
    with tools_daemon.client() as client:
        with pytest.raises(UnknownTool) as raised:
            client.call("gret", name="x")
        assert raised.value.name == "gret"
        assert raised.value.suggestions == ["greet"], raised.value
        assert raised.value.load_error is None
        assert isinstance(raised.value, ProtocolError) and isinstance(raised.value, RPCError)
        with pytest.raises(ProtocolError) as other:  # bad params of another kind: not an unknown tool
            client.request("atomic/attach", {"directory": "relative/dir"})
        assert type(other.value) is ProtocolError and other.value.code == -32602


def test_raise_for_error_raises_a_failed_tool_result_as_a_tool_error(tools_daemon) -> None:  # type: ignore[no-untyped-def]
    with tools_daemon.client() as client:
        assert client.call("greet", name="x").raise_for_error().text == "Hello, x"
        result = client.call("refuse", why="the disk is full")
        with pytest.raises(ToolError, match="the disk is full") as raised:
            result.raise_for_error()
        assert raised.value.result is result


def test_a_client_timeout_cancels_the_call_in_the_daemon(env: Env, own_tools_daemon, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    marker = tmp_path / "sync"
    with own_tools_daemon.client(timeout=1.0) as client:
        with pytest.raises(CallTimeout) as raised:
            client.call("patient", marker=str(marker))
        assert isinstance(raised.value, TimeoutError) and isinstance(raised.value, ConnectError)
        assert Path(str(marker) + ".started").exists(), "the call reached the tool"
        # The tool saw the cancellation at once (it would otherwise wait 60 s), and the worker
        # counted the call as cancelled; the connection serves on.
        assert wait_for(lambda: marker.exists(), timeout=10, message="the tool to see ctx.cancelled")
        assert wait_for(lambda: _cancelled_calls(client) == 1, timeout=10, message="the call counted cancelled")
        assert client.call("greet", name="again").text == "Hello, again"


def test_an_async_client_timeout_cancels_the_call_in_the_daemon(tools_daemon, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    env = tools_daemon.env
    marker = tmp_path / "async"

    async def main() -> None:
        async with AsyncClient(str(env.socket), directory=str(env.project), autostart=False, timeout=1.0) as client:
            with pytest.raises(CallTimeout):
                await client.call("patient", marker=str(marker))
            await asyncio.get_running_loop().run_in_executor(
                None, lambda: wait_for(lambda: marker.exists(), timeout=10, message="the tool to see ctx.cancelled")
            )
            assert (await client.call("greet", name="again")).text == "Hello, again"

    asyncio.run(main())


def test_transport_errors_say_which_failure_it_was(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(CannotConnect, match="atomictoolsd start"):
        Client(str(env.socket), autostart=False).connect()
    daemon = make_daemon()
    client = daemon.client()
    daemon.stop()
    with pytest.raises(ConnectionLost) as lost:
        client.status()
    assert isinstance(lost.value, TransportError) and isinstance(lost.value, ConnectError)
    with pytest.raises(CannotConnect):
        client.status()  # the next request connects again: nobody listens


def test_a_client_timeout_is_one_deadline_for_the_request_however_often_the_tool_logs(tools_daemon, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    env = tools_daemon.env
    # Each ctx.log reaches the client as a notification: the wait for the answer must not start
    # again with each, or a chatty tool never times out.
    marker = tmp_path / "chatty-sync"
    with tools_daemon.client(timeout=1.0) as client:
        with pytest.raises(CallTimeout):
            client.call("chatty", marker=str(marker))
        assert wait_for(lambda: marker.exists(), timeout=10, message="the tool to see ctx.cancelled")
        assert client.call("greet", name="again").text == "Hello, again"

    marker = tmp_path / "chatty-async"

    async def main() -> None:
        async with AsyncClient(str(env.socket), directory=str(env.project), autostart=False, timeout=1.0) as client:
            with pytest.raises(CallTimeout):
                await client.call("chatty", marker=str(marker))
            assert (await client.call("greet", name="again")).text == "Hello, again"

    asyncio.run(main())
    assert wait_for(lambda: marker.exists(), timeout=10, message="the tool to see ctx.cancelled")


def test_a_request_the_daemon_does_not_read_in_time_loses_the_connection_not_a_bare_timeout(tools_daemon) -> None:  # type: ignore[no-untyped-def]
    client = tools_daemon.client(timeout=1.0)
    os.kill(tools_daemon.pid, signal.SIGSTOP)  # reads nothing: the socket's buffers fill
    try:
        with pytest.raises(ConnectionLost, match="did not take the request within 1 s"):
            client.call("greet", name="x" * (16 * 1024 * 1024))
    finally:
        os.kill(tools_daemon.pid, signal.SIGCONT)
    # The half-sent line went with the closed connection: the next request connects again.
    assert client.call("greet", name="again").text == "Hello, again"
    client.close()


def test_watch_without_a_timeout_outlasts_the_clients_timeout(env: Env, own_tools_daemon) -> None:  # type: ignore[no-untyped-def]
    with own_tools_daemon.client(timeout=0.5) as client:
        notes = client.watch()
        later = threading.Timer(1.5, env.write_tool, (env.local_tools, "added.py", TOOLS["greet.py"].replace("greet", "added")))
        later.start()
        try:
            assert next(notes)["method"] == "notifications/tools/list_changed"
        finally:
            later.join()
        assert client.status()["pid"] == own_tools_daemon.pid
