"""The stateless revision, 2026-07-28, with the Python SDK 2.x's ``mcp.Client``: in its modern mode
(no handshake, ``_meta`` on every request, ``subscriptions/listen``) and its auto mode (which probes
``server/discover``) through the shim and over HTTP, and in legacy mode as before; and the wire
rules a client of another SDK relies on, byte by byte."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from helpers import Daemon, Env, serving
from shim_helpers import shim_params

pytestmark = pytest.mark.slow

TOOL = 'def add(a: int, b: int) -> int:\n    """Add two numbers."""\n    return a + b\n'
LATER = 'def later() -> str:\n    """A tool written while the client listens."""\n    return "later"\n'
META = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"}}


async def _exercise(client: Client, env: Env) -> None:
    listed = await client.list_tools()
    assert [t.name for t in listed.tools] == ["add"]
    result = await client.call_tool("add", {"a": 2, "b": 3})
    assert not result.is_error and result.structured_content == {"result": 5}
    async with client.listen(tools_list_changed=True) as subscription:
        assert subscription.honored.tools_list_changed
        env.write_tool(env.local_tools, "later.py", LATER)
        with anyio.fail_after(15):
            async for _event in subscription:
                break
    names = sorted(t.name for t in (await client.list_tools()).tools)
    assert names == ["add", "later"]


@pytest.mark.parametrize("mode", ["2026-07-28", "auto"])
def test_the_sdk_client_in_modern_mode_through_the_shim(env: Env, daemon: Daemon, mode: str) -> None:
    env.write_tool(env.local_tools, "add.py", TOOL)

    async def main() -> None:
        async with Client(shim_params(env), mode=mode) as client:  # type: ignore[arg-type]
            assert client.protocol_version == "2026-07-28"
            await _exercise(client, env)

    asyncio.run(main())


def test_the_sdk_client_in_legacy_mode_still_works(env: Env, daemon: Daemon) -> None:
    env.write_tool(env.local_tools, "add.py", TOOL)

    async def main() -> None:
        async with Client(shim_params(env), mode="legacy") as client:  # type: ignore[arg-type]
            assert client.protocol_version == "2025-11-25"
            assert (await client.call_tool("add", {"a": 1, "b": 1})).structured_content == {"result": 2}

    asyncio.run(main())


@asynccontextmanager
async def _transport(env: Env, daemon: Daemon, via: str) -> AsyncIterator[Any]:
    """What ``mcp.Client`` connects through: the shim's launch parameters, or the daemon's HTTP
    endpoint with its token (the daemon started with ``ATOMICTOOLS_HTTP``)."""
    if via == "shim":
        yield shim_params(env)
        return
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    with daemon.raw() as raw:
        info = raw.request("atomic/status")["result"]["http"]
    token = Path(info["tokenFile"]).read_text().strip()
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=30) as http:
        yield streamable_http_client(f"{info['url']}?directory={env.project}", http_client=http)


@pytest.mark.parametrize("mode", ["2026-07-28", "auto"])
def test_the_sdk_client_in_modern_mode_over_http(env: Env, make_daemon: Any, mode: str) -> None:
    env.write_tool(env.local_tools, "add.py", TOOL)
    daemon = make_daemon({"ATOMICTOOLS_HTTP": "127.0.0.1:0"})

    async def main() -> None:
        async with _transport(env, daemon, "http") as transport:
            async with Client(transport, mode=mode) as client:  # type: ignore[arg-type]
                assert client.protocol_version == "2026-07-28"
                await _exercise(client, env)

    asyncio.run(main())


@pytest.fixture(scope="module")
def adder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """One daemon with the add tool for the module's tests that only send stateless requests."""
    env = Env(tmp_path_factory.mktemp("adder"))
    env.write_tool(env.global_tools, "add.py", TOOL)
    with serving(env) as daemon:
        yield daemon


def test_the_stateless_wire(adder: Daemon) -> None:
    with adder.raw() as raw:
        discover = raw.request("server/discover", {"_meta": META})["result"]
        assert "2026-07-28" in discover["supportedVersions"] and "2024-11-05" in discover["supportedVersions"]
        assert discover["resultType"] == "complete" and discover["capabilities"]["tools"]["listChanged"] is True
        listed = raw.request("tools/list", {"_meta": META})["result"]
        assert listed["resultType"] == "complete" and listed["ttlMs"] == 0 and listed["cacheScope"] == "private"
        called = raw.request("tools/call", {"name": "add", "arguments": {"a": 1, "b": 2}, "_meta": META})
        assert "result" in called, called
        called = called["result"]
        assert called["resultType"] == "complete" and called["structuredContent"] == {"result": 3}
        # A revision not spoken: -32022 naming the ones that are, so a client can fall back.
        refused = raw.request("tools/list", {"_meta": {**META, "io.modelcontextprotocol/protocolVersion": "2031-01-01"}})
        assert refused["error"]["code"] == -32022
        assert "2026-07-28" in refused["error"]["data"]["supported"] and refused["error"]["data"]["requested"] == "2031-01-01"


def test_a_listening_session_is_acknowledged_and_told_of_changes(env: Env, make_daemon: Any) -> None:
    env.write_tool(env.global_tools, "add.py", TOOL)
    daemon = make_daemon()
    with daemon.raw() as quiet, daemon.raw() as listener:
        quiet.request("tools/list", {"_meta": META})
        listener.send({"jsonrpc": "2.0", "id": "l1", "method": "subscriptions/listen",
                       "params": {"notifications": {"toolsListChanged": True, "promptsListChanged": True}, "_meta": META}})
        ack = listener.recv()
        assert ack["method"] == "notifications/subscriptions/acknowledged"
        assert ack["params"]["notifications"] == {"toolsListChanged": True}  # no prompts here: not honored
        assert ack["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"] == "l1"
        env.write_tool(env.global_tools, "later.py", LATER)
        change = listener.recv()
        assert change["method"] == "notifications/tools/list_changed"
        assert change["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"] == "l1"
        # That a session that did not listen, or cancelled its listen, is sent nothing is read line by
        # line in tests/e2e/test_listen.py (request() here skips notifications, so it could not tell).


ASK = (
    "from atomictools import AskError, Context\n\n"
    "def ask(ctx: Context) -> str:\n"
    '    """Ask the user twice."""\n'
    "    try:\n"
    '        first = ctx.elicit("Proceed?")\n'
    "    except AskError as exc:\n"
    '        return f"went on: {exc}"\n'
    '    second = ctx.elicit("Really?")\n'
    '    return f"{first.action}/{second.action}"\n'
)


def test_a_tool_asks_a_stateless_client_through_input_required_and_the_retry_resumes_it(env: Env, make_daemon: Any) -> None:
    env.write_tool(env.global_tools, "ask.py", ASK)
    daemon = make_daemon()
    meta = {**META, "io.modelcontextprotocol/clientCapabilities": {"elicitation": {}}}
    with daemon.raw() as raw:
        first = raw.request("tools/call", {"name": "ask", "arguments": {}, "_meta": meta})["result"]
        assert first["resultType"] == "input_required"
        [(key, question)] = first["inputRequests"].items()
        assert question["method"] == "elicitation/create" and question["params"]["message"] == "Proceed?"
        # The retry, a new request with the state and the answer, resumes the same waiting call.
        second = raw.request("tools/call", {"name": "ask", "arguments": {}, "_meta": meta, "requestState": first["requestState"],
                                            "inputResponses": {key: {"action": "accept", "content": {}}}})["result"]
        assert second["resultType"] == "input_required" and second["requestState"] != first["requestState"]
        assert next(iter(second["inputRequests"].values()))["params"]["message"] == "Really?"
        done = raw.request("tools/call", {"name": "ask", "arguments": {}, "_meta": meta, "requestState": second["requestState"],
                                          "inputResponses": {key: {"action": "decline"}}})["result"]
        assert done["resultType"] == "complete" and done["content"][0]["text"] == "accept/decline"
        # A state used up (or never issued) is refused, saying what to do.
        stale = raw.request("tools/call", {"name": "ask", "arguments": {}, "_meta": meta, "requestState": first["requestState"],
                                           "inputResponses": {key: {"action": "accept"}}})["error"]
        assert stale["code"] == -32602 and "without requestState" in stale["message"]
        # A client that did not declare elicitation is not asked: the tool is told why at once.
        refused = raw.request("tools/call", {"name": "ask", "arguments": {}, "_meta": META})["result"]
        assert refused["resultType"] == "complete" and "'elicitation' capability" in refused["content"][0]["text"]


@pytest.mark.parametrize("via", ["shim", "http"])
def test_the_sdk_client_answers_a_tools_question_in_modern_mode(env: Env, make_daemon: Any, via: str) -> None:
    import mcp.types as types

    env.write_tool(env.local_tools, "ask.py", ASK)
    daemon = make_daemon({"ATOMICTOOLS_HTTP": "127.0.0.1:0"} if via == "http" else None)
    asked: list[str] = []

    async def elicit(context: Any, params: Any) -> Any:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={}) if len(asked) == 1 else types.ElicitResult(action="decline")

    async def main() -> None:
        async with _transport(env, daemon, via) as transport:
            async with Client(transport, mode="2026-07-28", elicitation_callback=elicit) as client:  # type: ignore[arg-type]
                result = await client.call_tool("ask", {})
                assert not result.is_error and result.content[0].text == "accept/decline"  # type: ignore[union-attr]

    asyncio.run(main())
    assert asked == ["Proceed?", "Really?"]


def test_each_stateless_request_must_carry_its_meta_and_is_told_what_is_missing(adder: Daemon) -> None:
    with adder.raw() as raw:
        no_capabilities = {k: v for k, v in META.items() if k != "io.modelcontextprotocol/clientCapabilities"}
        error = raw.request("tools/list", {"_meta": no_capabilities})["error"]
        assert error["code"] == -32602 and "io.modelcontextprotocol/clientCapabilities" in error["message"]
        assert "2026-07-28" in error["message"] and "2024-11-05" in error["message"]  # what is spoken, and how
        error = raw.request("tools/list", {"_meta": {**META, "io.modelcontextprotocol/protocolVersion": 20260728}})["error"]
        assert error["code"] == -32602 and "must be a string" in error["message"]
        # Once stateless, a request without the revision is refused, not served as another revision.
        assert raw.request("tools/list", {"_meta": META})["result"]["resultType"] == "complete"
        error = raw.request("tools/call", {"name": "add", "arguments": {"a": 1, "b": 2}})["error"]
        assert error["code"] == -32602 and "io.modelcontextprotocol/protocolVersion" in error["message"]
        assert raw.request("tools/call", {"name": "add", "arguments": {"a": 1, "b": 2}, "_meta": META})["result"]["structuredContent"] == {"result": 3}


@pytest.mark.parametrize(("method", "instead"), [("initialize", "server/discover"), ("ping", "server/discover"),
                                                 ("logging/setLevel", "io.modelcontextprotocol/logLevel")])
def test_what_the_stateless_revision_removed_is_refused_naming_its_replacement(adder: Daemon, method: str, instead: str) -> None:
    with adder.raw() as raw:
        params: dict[str, Any] = {"_meta": META}
        if method == "initialize":
            params |= {"protocolVersion": "2026-07-28", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}
        if method == "logging/setLevel":
            params |= {"level": "debug"}
        error = raw.request(method, params)["error"]
        assert error["code"] == -32601 and instead in error["message"] and "2026-07-28" in error["message"]


def test_a_stateless_call_gets_log_messages_only_when_its_meta_asks_for_a_level(env: Env, make_daemon: Any) -> None:
    env.write_tool(env.global_tools, "chatty.py", (
        "from atomictools import Context\n\n"
        "def chatty(ctx: Context) -> str:\n"
        '    """Log at two levels."""\n'
        '    ctx.log("debug", "fine detail")\n'
        '    ctx.log("warning", "careful")\n'
        '    return "done"\n'
    ))
    env.write_tool(env.global_tools, "broken.py", "def broken(:\n")  # a module error: free-floating in 2025
    daemon = make_daemon()
    with daemon.raw() as raw:
        def call(meta: dict[str, Any], id_: int) -> list[dict[str, Any]]:
            raw.send({"jsonrpc": "2.0", "id": id_, "method": "tools/call", "params": {"name": "chatty", "arguments": {}, "_meta": meta}})
            seen = []
            while True:
                message = raw.recv()
                if message.get("id") == id_:
                    assert message["result"]["content"][0]["text"] == "done"
                    return seen
                seen.append(message)

        assert call(META, 1) == []  # no level asked: no log messages at all
        logs = call({**META, "io.modelcontextprotocol/logLevel": "info"}, 2)
        assert [(m["method"], m["params"]["level"], m["params"]["data"]) for m in logs] == [("notifications/message", "warning", "careful")]
        logs = call({**META, "io.modelcontextprotocol/logLevel": "debug"}, 3)
        assert [m["params"]["data"] for m in logs] == ["fine detail", "careful"]


def test_the_tool_order_is_stable_and_by_name(env: Env, make_daemon: Any) -> None:
    for name in ("zeta", "alpha", "mid"):
        env.write_tool(env.global_tools, f"{name}.py", f'def {name}() -> str:\n    """{name}."""\n    return "{name}"\n')
    daemon = make_daemon()
    with daemon.raw() as raw:
        first = [t["name"] for t in raw.request("tools/list", {"_meta": META})["result"]["tools"]]
        again = [t["name"] for t in raw.request("tools/list", {"_meta": META})["result"]["tools"]]
        assert first == again == sorted(first) and {"alpha", "mid", "zeta"} <= set(first)


def test_a_call_whose_stateless_client_never_retries_ends_at_ask_timeout_and_sends_nothing(env: Env, make_daemon: Any) -> None:
    env.write_tool(env.global_tools, "ask.py", ASK)
    daemon = make_daemon({"ATOMICTOOLS_ASK_TIMEOUT": "0.5", "ATOMICTOOLS_CALL_TIMEOUT": "0.5"})
    meta = {**META, "io.modelcontextprotocol/clientCapabilities": {"elicitation": {}}}
    with daemon.raw() as raw:
        first = raw.request("tools/call", {"name": "ask", "arguments": {}, "_meta": meta})["result"]
        assert first["resultType"] == "input_required"
        time.sleep(1.5)  # past ask_timeout (and the call's own): the waiting call timed out, and was answered to nobody
        # The next message on the connection is this listing's answer: no late result for the first id.
        listing = raw.send_request("tools/list", {"_meta": META})
        following = raw.recv()
        assert following.get("id") == listing and following["result"]["resultType"] == "complete", following
        stale = raw.request("tools/call", {"name": "ask", "arguments": {}, "_meta": meta, "requestState": first["requestState"],
                                           "inputResponses": {"ask": {"action": "accept"}}})["error"]
        assert stale["code"] == -32602 and "has ended" in stale["message"]
        status = raw.request("atomic/status")["result"]
        assert all(m.get("inflight", 0) == 0 for m in status["sessions"]), status["sessions"]


PAIR = '''
import threading
import time
from pathlib import Path
from atomictools import AskError, Context, tool

@tool
def pair(marker: str, ctx: Context) -> str:
    threading.Thread(target=ctx.elicit, args=("First?",), daemon=True).start()  # parks the call
    deadline = time.monotonic() + 30
    while not Path(marker + ".go").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        ctx.elicit("Second?")
        Path(marker).write_text("asked")
    except AskError as exc:
        Path(marker).write_text(f"refused: {exc}")
    return "done"
'''


def test_a_second_question_while_one_is_parked_is_refused_not_asked_by_another_requests_capabilities(
    env: Env, make_daemon: Any, tmp_path: Path,
) -> None:
    # A parked call's request is answered (input_required) and its capabilities forgotten; a second
    # question it asks then must not be judged by the capabilities of the session's latest request.
    from helpers import wait_for

    env.write_tool(env.global_tools, "pair.py", PAIR)
    env.write_tool(env.global_tools, "add.py", TOOL)
    daemon = make_daemon()
    marker = tmp_path / "pair"
    meta = {**META, "io.modelcontextprotocol/clientCapabilities": {"elicitation": {}}}
    with daemon.raw() as raw:
        first = raw.send_request("tools/call", {"name": "pair", "arguments": {"marker": str(marker)}, "_meta": meta})
        assert raw.reply(first)["result"]["resultType"] == "input_required"
        # Another call on the same connection, declaring elicitation: the session's latest capabilities.
        assert raw.request("tools/call", {"name": "add", "arguments": {"a": 1, "b": 2}, "_meta": meta})["result"]
        Path(str(marker) + ".go").write_text("")
        assert wait_for(marker.exists, timeout=15, message="the tool's second question to be answered")
        said = marker.read_text()
        assert said.startswith("refused:") and "already waits for the answer to another question" in said, said
        ping = raw.send_request("ping")
        seen = []
        while (message := raw.recv()).get("id") != ping:
            seen.append(message)
        assert not [m for m in seen if m.get("id") == first], seen  # the answered request is not answered again
