"""A tool asks the client mid-call (``ctx.elicit``, ``ctx.sample``): the official MCP client answers
through the shim, the tiny client through its callbacks, a raw connection by hand; a client that
cannot answer makes the tool fail readably, never wait."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest

from atomictools import AsyncClient, Elicitation
from helpers import Daemon, Env, serving, wait_for
from shim_helpers import mcp_session, run

KIT = '''
import json
import time
from typing import Literal

import msgspec
from atomictools import AskError, Context, tool


class Profile(msgspec.Struct):
    name: str = "John Doe"
    age: int = 30
    score: float = 95.5
    status: Literal["active", "inactive", "pending"] = "active"
    verified: bool = True


@tool(name="test_elicitation_sep1034_defaults", timeout=30)
def defaults(ctx: Context) -> str:
    """Ask for a profile whose every field has a default (SEP-1034)."""
    answer = ctx.elicit("Test client default value handling - please accept with defaults", Profile)
    if not answer.accepted:
        return f"Elicitation completed: action={answer.action}"
    return f"Elicitation completed: action=accept, content={json.dumps(msgspec.to_builtins(answer.content))}"


ENUMS = {
    "type": "object",
    "properties": {
        "untitledSingle": {"type": "string", "enum": ["option1", "option2", "option3"]},
        "titledSingle": {"type": "string", "oneOf": [
            {"const": "value1", "title": "First Option"}, {"const": "value2", "title": "Second Option"}]},
        "legacyEnum": {"type": "string", "enum": ["opt1", "opt2"], "enumNames": ["Option One", "Option Two"]},
        "untitledMulti": {"type": "array", "items": {"type": "string", "enum": ["option1", "option2"]}},
        "titledMulti": {"type": "array", "items": {"anyOf": [
            {"const": "value1", "title": "First Choice"}, {"const": "value2", "title": "Second Choice"}]}},
    },
}


@tool(name="test_elicitation_sep1330_enums", timeout=30)
async def enums(ctx: Context) -> str:
    """Ask with every enum form of SEP-1330, from an async tool."""
    answer = await ctx.aelicit("Pick", ENUMS)
    return f"Elicitation completed: action={answer.action}, content={json.dumps(answer.content)}"


@tool(name="test_elicitation", timeout=30)
def confirm(ctx: Context, message: str) -> str:
    """Ask the user; report what they did."""
    answer = ctx.elicit(message, {"type": "object", "properties": {
        "username": {"type": "string"}, "email": {"type": "string"}}, "required": ["username", "email"]})
    return f"User response: action={answer.action}, content={json.dumps(answer.content)}"


@tool(name="test_sampling", timeout=30)
def sampling(ctx: Context, prompt: str) -> str:
    """Ask the client's model."""
    reply = ctx.sample(prompt, max_tokens=100, system="Be brief.")
    return f"LLM response: {reply.text} ({reply.model})"


@tool(timeout=30)
async def asample(ctx: Context, prompt: str) -> str:
    """Ask the client's model, from an async tool."""
    return (await ctx.asample(prompt, max_tokens=50)).text


@tool(timeout=30)
def careful(ctx: Context) -> str:
    """Ask, and go on without an answer when there is none."""
    try:
        return "yes" if ctx.elicit("Proceed?").accepted else "no"
    except AskError as exc:
        return f"went on without asking: {exc}"


@tool(timeout=30)
def blunt(ctx: Context) -> str:
    """Ask, without handling a client that cannot answer."""
    return ctx.elicit("Proceed?").action


@tool(timeout=30)
def hurried(ctx: Context) -> str:
    """Ask with a short timeout."""
    try:
        return ctx.elicit("Quick?", timeout=0.5).action
    except AskError as exc:
        return f"gave up: {exc}"


@tool(timeout=1)
def slow_user(ctx: Context) -> str:
    """Ask, with a call timeout shorter than the user takes to answer."""
    return ctx.elicit("Think it over").action


@tool(timeout=30)
def patient(ctx: Context, marker: str) -> str:
    """Ask, and record how the wait ended (the call may be cancelled meanwhile)."""
    try:
        outcome = ctx.elicit("Take your time").action
    except AskError as exc:
        outcome = f"stopped: {exc}"
    with open(marker, "w") as f:
        f.write(outcome)
    return outcome
'''


@pytest.fixture(scope="module")
def kit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """One daemon for the module's tests that call the asking tools and answer them."""
    env = Env(tmp_path_factory.mktemp("ask"))
    env.write_tool(env.global_tools, "ask.py", KIT)
    with serving(env) as daemon:
        yield daemon


def test_elicitation_reaches_the_official_client_and_its_answer_the_tool(kit: Daemon) -> None:
    env = kit.env
    asked: list[types.ElicitRequestParams] = []
    answers = iter([
        types.ElicitResult(action="accept", content={"name": "Jane Smith", "age": 25, "score": 88, "status": "inactive", "verified": False}),
        types.ElicitResult(action="decline"),
        types.ElicitResult(action="accept", content={"untitledSingle": "option1", "titledMulti": ["value1", "value2"]}),
        types.ElicitResult(action="cancel"),
    ])

    async def elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params)
        return next(answers)

    async def scenario() -> None:
        async with mcp_session(env, elicitation_callback=elicit) as (session, _):
            accepted = await session.call_tool("test_elicitation_sep1034_defaults", {})
            assert not accepted.is_error, accepted.content
            text = accepted.content[0].text
            assert text.startswith("Elicitation completed: action=accept, content=")
            assert json.loads(text.split("content=", 1)[1]) == {
                "name": "Jane Smith", "age": 25, "score": 88.0, "status": "inactive", "verified": False,
            }
            schema = asked[0].requested_schema["properties"]
            assert schema["name"] == {"type": "string", "default": "John Doe"}
            assert schema["age"] == {"type": "integer", "default": 30}
            assert schema["score"] == {"type": "number", "default": 95.5}
            assert schema["status"] == {"type": "string", "enum": ["active", "inactive", "pending"], "default": "active"}
            assert schema["verified"] == {"type": "boolean", "default": True}

            declined = await session.call_tool("test_elicitation_sep1034_defaults", {})
            assert declined.content[0].text == "Elicitation completed: action=decline"

            enums = await session.call_tool("test_elicitation_sep1330_enums", {})
            assert json.loads(enums.content[0].text.split("content=", 1)[1])["titledMulti"] == ["value1", "value2"]
            sent = asked[2].requested_schema["properties"]
            assert sent["titledSingle"]["oneOf"][0] == {"const": "value1", "title": "First Option"}
            assert sent["legacyEnum"]["enumNames"] == ["Option One", "Option Two"]
            assert sent["titledMulti"]["items"]["anyOf"][1] == {"const": "value2", "title": "Second Choice"}

            cancelled = await session.call_tool("test_elicitation", {"message": "Who are you?"})
            assert cancelled.content[0].text == "User response: action=cancel, content=null"
            assert asked[3].message == "Who are you?"

    run(scenario)


def test_sampling_reaches_the_official_client_from_sync_and_async_tools(kit: Daemon) -> None:
    env = kit.env
    asked: list[types.CreateMessageRequestParams] = []

    async def sample(context: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        asked.append(params)
        return types.CreateMessageResult(
            role="assistant", content=types.TextContent(type="text", text="This is a test response"),
            model="test-model", stop_reason="endTurn",
        )

    async def scenario() -> None:
        async with mcp_session(env, sampling_callback=sample) as (session, _):
            result = await session.call_tool("test_sampling", {"prompt": "Test prompt for sampling"})
            assert result.content[0].text == "LLM response: This is a test response (test-model)"
            assert asked[0].max_tokens == 100 and asked[0].system_prompt == "Be brief."
            assert asked[0].messages[0].role == "user" and asked[0].messages[0].content.text == "Test prompt for sampling"

            result = await session.call_tool("ask_asample", {"prompt": "again"})
            assert result.content[0].text == "This is a test response" and asked[1].max_tokens == 50

    run(scenario)


def test_a_client_without_the_capability_fails_the_ask_at_once_and_readably(kit: Daemon) -> None:
    env = kit.env
    async def scenario() -> None:
        async with mcp_session(env) as (session, _):  # no callbacks: no elicitation, no sampling declared
            with anyio.fail_after(20):  # well inside the tools' 30 s timeout: nothing waited for an answer
                careful = await session.call_tool("ask_careful", {})
                assert not careful.is_error
                assert "went on without asking" in careful.content[0].text
                assert "did not declare the 'elicitation' capability" in careful.content[0].text

                blunt = await session.call_tool("ask_blunt", {})
                assert blunt.is_error
                assert blunt.content[0].text.startswith("the client (")  # an AskError reads as its message alone
                assert "Traceback" not in blunt.content[0].text

                sampled = await session.call_tool("test_sampling", {"prompt": "x"})
                assert sampled.is_error and "'sampling' capability" in sampled.content[0].text

    run(scenario)


def test_a_timeout_and_a_cancelled_call_stop_the_wait(kit: Daemon, tmp_path: Path) -> None:
    with kit.raw() as raw:
        raw.request("initialize", {"protocolVersion": "2025-11-25", "capabilities": {"elicitation": {}}, "clientInfo": {"name": "raw"}})
        raw.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

        # Never answered: the tool's own timeout ends its wait.
        raw.send({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "ask_hurried", "arguments": {}}})
        request = raw.recv()
        assert request["method"] == "elicitation/create" and request["params"]["message"] == "Quick?"
        ended = raw.recv()  # the call has ended: the client is told its question is moot, then answered
        assert ended == {"jsonrpc": "2.0", "method": "notifications/cancelled",
                         "params": {"requestId": request["id"], "reason": "the tool call that asked has ended"}}
        reply = raw.recv()
        assert reply["id"] == 1 and "gave up: the client did not answer within 0.5 s" in reply["result"]["content"][0]["text"]

        # The caller cancels the call while the tool waits: the tool stops waiting at once.
        marker = tmp_path / "outcome"
        raw.send({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "ask_patient", "arguments": {"marker": str(marker)}}})
        request = raw.recv()
        assert request["method"] == "elicitation/create"
        raw.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 2}})
        assert raw.recv() == {"jsonrpc": "2.0", "method": "notifications/cancelled",
                              "params": {"requestId": request["id"], "reason": "the tool call that asked has ended"}}
        wait_for(marker.exists, timeout=20, message="the cancelled tool to stop waiting")
        assert marker.read_text().startswith("stopped: the call was cancelled")

        # An answer to a request the daemon no longer waits for is ignored; the session serves on.
        raw.send({"jsonrpc": "2.0", "id": request["id"], "result": {"action": "accept", "content": {}}})
        assert raw.request("ping")["result"] == {}


def test_the_tiny_clients_answer_through_callbacks_and_the_dispatcher_passes_questions_on(kit: Daemon) -> None:
    env = kit.env
    seen: list[tuple[str, dict[str, Any]]] = []

    def on_elicit(message: str, schema: dict[str, Any]) -> dict[str, Any]:
        seen.append((message, schema))
        return {"username": "ada", "email": "ada@example.com"}

    with kit.client(on_elicit=on_elicit, on_sample=lambda params: "forty-two") as client:
        result = client.call("test_elicitation", message="Who?")
        assert json.loads(result.text.split("content=", 1)[1]) == {"username": "ada", "email": "ada@example.com"}
        assert seen[0][0] == "Who?" and seen[0][1]["required"] == ["username", "email"]
        assert client.call("test_sampling", prompt="?").text == "LLM response: forty-two (callback)"
        assert client.call("ask_careful").text == "yes"

    with kit.client(on_elicit=lambda message, schema: None) as client:
        assert client.call("ask_careful").text == "no"  # None declines

    async def asynchronous() -> None:
        async def on_elicit(message: str, schema: dict[str, Any]) -> Elicitation:
            await asyncio.sleep(0)
            return Elicitation("cancel")

        async with AsyncClient(str(env.socket), directory=str(env.project), autostart=False, on_elicit=on_elicit) as client:
            assert (await client.call("ask_blunt")).text == "cancel"

    asyncio.run(asynchronous())

    with kit.raw() as raw:
        raw.request("atomic/attach", {"directory": str(env.project), "dispatcher": True})
        raw.request("initialize", {"protocolVersion": "2025-06-18", "capabilities": {"elicitation": {}}, "clientInfo": {"name": "raw"}})
        raw.send({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                  "params": {"name": "atomic_call_tool", "arguments": {"name": "ask_careful", "arguments": {}}}})
        request = raw.recv()
        assert request["method"] == "elicitation/create" and request["params"]["message"] == "Proceed?"
        raw.send({"jsonrpc": "2.0", "id": request["id"], "result": {"action": "accept", "content": {}}})
        assert raw.recv()["result"]["content"][0]["text"] == "yes"


def test_waiting_for_the_user_does_not_count_against_the_call_timeout_but_is_bounded(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    env.write_tool(env.global_tools, "ask.py", KIT)
    for limit, answers in (("600", True), ("0.5", False)):
        daemon = make_daemon({"ATOMICTOOLS_ASK_TIMEOUT": limit})
        with daemon.raw() as raw:
            raw.request("initialize", {"protocolVersion": "2025-11-25", "capabilities": {"elicitation": {}}, "clientInfo": {"name": "raw"}})
            raw.send({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "ask_slow_user", "arguments": {}}})
            request = raw.recv()
            assert request["method"] == "elicitation/create"
            if answers:
                time.sleep(2)  # twice the tool's 1 s timeout
                raw.send({"jsonrpc": "2.0", "id": request["id"], "result": {"action": "decline"}})
                reply = raw.recv()
                assert reply["result"] == {"content": [{"type": "text", "text": "decline"}]}
            else:
                messages = [raw.recv(), raw.recv()]
                reply = next(m for m in messages if m.get("id") == 1)
                assert reply["result"]["isError"]
                assert "timed out waiting for the client to answer its question (ask_timeout)" in reply["result"]["content"][0]["text"]
        daemon.stop()
