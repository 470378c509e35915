"""A session driven in process through an output of the test's own, as any transport drives one:
decoded messages in (``handle_message``, ``handle_request``), what it says out (``Output``). No
daemon, no socket: the registry and the pool are real, and so are the workers of the tests that
call a tool. The socket's own side (framing, batches) runs in process too, on a socket pair.
"""

from __future__ import annotations

import asyncio
import json
import socket
import tracemalloc
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import pytest

from atomictoolsd.config.settings import Config
from atomictoolsd.pool.pool import PoolSettings, WorkerPool
from atomictoolsd.registry.projects import Registry
from atomictoolsd.sessions.connection import Connection
from atomictoolsd.sessions.messages import CallParams, decode_message
from atomictoolsd.sessions.output import Output
from atomictoolsd.sessions.revisions import META_CAPABILITIES, META_VERSION, STATELESS
from atomictoolsd.sessions.session import Handler, Session

TOOLS = '''
import time
from atomictools import Context, tool

@tool(name="echo")
def echo(text: str) -> str:
    """Say it back."""
    return text

@tool(name="counted")
def counted(steps: int, ctx: Context) -> str:
    """Report progress, then answer."""
    for step in range(steps):
        ctx.progress(step + 1, steps, f"step {step + 1}")
    return f"{steps} steps"

@tool(name="nap")
def nap(seconds: float) -> str:
    """Sleep."""
    time.sleep(seconds)
    return "rested"

@tool(name="hold")
def hold(text: str, seconds: float) -> int:
    """Sleep, then say how long the text was."""
    time.sleep(seconds)
    return len(text)

@tool(name="confirm")
def confirm(ctx: Context) -> str:
    """Ask the user."""
    return ctx.elicit("Proceed?").action
'''

STATELESS_META = {META_VERSION: STATELESS[-1], META_CAPABILITIES: {}}


class Recorder:
    """The test's output: everything the session writes, decoded, in order, with the request it
    said each belongs to."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.ended_ids: list[Any] = []  # the requests it was told are no longer in flight
        self.closed = False
        self.session: Session | None = None
        self.arrived = asyncio.Event()

    def _add(self, message: dict[str, Any], about: bytes | None = None) -> None:
        if about is not None:
            message["about"] = json.loads(about)
        self.messages.append(message)
        self.arrived.set()

    def result(self, id_json: bytes, result: bytes) -> None:
        self._add({"id": json.loads(id_json), "result": json.loads(result)})

    def error(self, id_json: bytes, error: bytes) -> None:
        self._add({"id": json.loads(id_json), "error": json.loads(error)})

    def request(self, id_json: bytes, method: str, params: bytes, about: bytes | None) -> bool:
        self._add({"id": json.loads(id_json), "method": method, "params": json.loads(params)}, about)
        return True

    def notification(self, method: str, message: bytes, about: bytes | None) -> None:
        decoded = json.loads(message)
        assert decoded["method"] == method
        self._add(decoded, about)

    def backlog(self) -> int:
        return 0

    def request_id(self, id_json: bytes) -> Any:
        return json.loads(id_json)

    def ended(self, id_json: bytes) -> None:
        self.ended_ids.append(json.loads(id_json))

    def close(self) -> None:
        self.closed = True
        if self.session is not None:
            self.session.close()

    async def answer(self, request_id: Any, timeout: float = 20.0) -> dict[str, Any]:
        """The answer to request ``request_id``, once it comes."""
        async with asyncio.timeout(timeout):
            while True:
                for message in self.messages:
                    if message.get("id") == request_id and ("result" in message or "error" in message):
                        return message
                self.arrived.clear()
                await self.arrived.wait()

    async def first(self, predicate: Callable[[dict[str, Any]], bool], timeout: float = 20.0) -> dict[str, Any]:
        async with asyncio.timeout(timeout):
            while True:
                for message in self.messages:
                    if predicate(message):
                        return message
                self.arrived.clear()
                await self.arrived.wait()


class Host:
    """What a session uses of the daemon, as ``server.lifecycle.Server`` gives it."""

    def __init__(self, registry: Registry, pool: WorkerPool) -> None:
        self.config = Config()
        self.methods: dict[str, Handler] = {}
        self.registry = registry
        self.pool = pool
        self.sessions: set[Session] = set()
        self.stopping = ""

    def accept(self, session: Session, transport: Any) -> bool:
        self.sessions.add(session)
        return True

    def forget(self, session: Session) -> None:
        self.sessions.discard(session)

    def status(self) -> dict[str, Any]:
        return {"sessions": len(self.sessions)}

    def request_stop(self, reason: str) -> None:
        self.stopping = reason


Scenario = Callable[[Host], Awaitable[Any]]


def run(env: Any, scenario: Scenario, tools: str | None = None) -> Any:
    """Run ``scenario`` with a host whose registry has ``tools`` (one module) in the global dir."""

    async def main() -> Any:
        if tools is not None:
            env.write_tool(env.global_tools, "kit.py", tools)
        pool = WorkerPool(PoolSettings.from_config(spill_dir=str(env.root / "spill")))
        registry = Registry(pool, env.home)
        host = Host(registry, pool)
        for tools_dir in registry.global_dirs:
            registry.ensure_scanned(tools_dir)
        try:
            return await scenario(host)
        finally:
            for session in list(host.sessions):
                session.close()
            registry.close()
            await pool.close()

    return asyncio.run(main())


def open_session(host: Host) -> tuple[Session, Recorder]:
    """A session whose output is a ``Recorder``: a transport of the test's own."""
    output = Recorder()
    output.session = session = Session(host, output)
    assert host.accept(session, None)
    return session, output


def send(session: Session, **message: Any) -> None:
    """Hand ``session`` one message as a transport does: decoded (the client's JSON read once)."""
    session.handle_message(decode_message(json.dumps({"jsonrpc": "2.0", **message}).encode()))


def text_of(answer: dict[str, Any]) -> str:
    return answer["result"]["content"][0]["text"]


def test_an_output_of_its_own_is_all_a_transport_needs() -> None:
    """The session writes to nothing but its ``Output``: the test's recorder meets it, and so do
    the socket's connection and HTTP's sessions."""
    from atomictoolsd.transports.http import HttpSession  # lazy: only to compare its methods

    wanted = {name for name in vars(Output) if not name.startswith("_")}
    assert wanted == {"result", "error", "request", "notification", "backlog", "request_id", "ended", "close"}
    for kind in (Recorder, Connection, HttpSession):
        assert wanted <= set(dir(kind)), kind
    assert not hasattr(Session, "transport") and not hasattr(Session, "data_received")


def test_initialize_initialized_and_ping(env: Any) -> None:
    async def scenario(host: Host) -> None:
        session, out = open_session(host)
        send(session, id=1, method="initialize", params={"protocolVersion": "2025-06-18", "clientInfo": {"name": "probe"}})
        init = await out.answer(1)
        assert init["result"]["protocolVersion"] == "2025-06-18"
        assert init["result"]["serverInfo"]["name"] == "atomictoolsd"
        assert session.agent == "probe" and not session.initialized
        send(session, method="notifications/initialized")
        assert session.initialized and len(out.messages) == 1, "a notification is not answered"
        send(session, id="p", method="ping")
        assert (await out.answer("p"))["result"] == {}

    run(env, scenario)


def test_what_is_no_request_it_can_serve_is_answered_with_the_error_that_says_why(env: Any) -> None:
    async def scenario(host: Host) -> None:
        session, out = open_session(host)
        session.handle_message(decode_message(b'{"jsonrpc":"1.0","id":1,"method":"ping"}'))
        session.handle_message(decode_message(b'{"jsonrpc":"1.0","method":"ping"}'))
        send(session, id=2)
        send(session, id=3, method="no/such")
        send(session, id=4, method="logging/setLevel", params={"level": "loud"})
        send(session, id="nobody-asked", result={})  # a response to nothing: dropped
        codes = {m["id"]: (m["error"]["code"], m["error"]["message"]) for m in out.messages}
        assert codes == {
            1: (-32600, 'Invalid request: "jsonrpc" must be "2.0"'),
            2: (-32600, 'Invalid request: no "method"'),
            3: (-32601, "Method not found: no/such"),
            4: (-32602, codes[4][1]),
        }
        assert "level must be one of" in codes[4][1]

    run(env, scenario)


def test_a_call_is_listed_made_and_answered_through_the_output(env: Any) -> None:
    async def scenario(host: Host) -> None:
        session, out = open_session(host)
        send(session, id=1, method="tools/list")
        names = {tool["name"] for tool in (await out.answer(1))["result"]["tools"]}
        assert {"echo", "counted", "nap", "confirm"} <= names
        send(session, id=2, method="tools/call", params={"name": "echo", "arguments": {"text": "hi"}})
        assert text_of(await out.answer(2)) == "hi"
        assert not session.in_flight(b"2")
        # A transport that makes the request itself (the REST API) hands params already decoded.
        session.handle_request(b'"r1"', "tools/call", CallParams("echo", msgspec.Raw(b'{"text":"made"}')))
        assert text_of(await out.answer("r1")) == "made"
        send(session, id=3, method="tools/call", params={"name": "ecko", "arguments": {}})
        unknown = await out.answer(3)
        assert unknown["error"]["code"] == -32602 and "echo" in json.dumps(unknown["error"])

    run(env, scenario, TOOLS)


def test_a_calls_progress_goes_out_about_its_request(env: Any) -> None:
    async def scenario(host: Host) -> None:
        session, out = open_session(host)
        send(session, id=5, method="tools/call",
             params={"name": "counted", "arguments": {"steps": 2}, "_meta": {"progressToken": "tok"}})
        assert text_of(await out.answer(5)) == "2 steps"
        progress = [m for m in out.messages if m.get("method") == "notifications/progress"]
        assert [(p["params"]["progress"], p["params"]["progressToken"], p["about"]) for p in progress] == [
            (1, "tok", 5), (2, "tok", 5)]

    run(env, scenario, TOOLS)


def test_a_cancelled_call_is_never_answered_and_its_id_is_free_again(env: Any) -> None:
    async def scenario(host: Host) -> None:
        session, out = open_session(host)
        send(session, id=1, method="tools/list")
        await out.answer(1)  # the project has loaded: a call starts at once, with no task
        send(session, id=7, method="tools/call", params={"name": "nap", "arguments": {"seconds": 30}})
        assert session.in_flight(b"7") and session.calls
        send(session, id=7, method="ping")
        reused = await out.answer(7)
        assert reused["error"]["code"] == -32600 and "already used" in reused["error"]["message"]
        out.messages.clear()
        send(session, method="notifications/cancelled", params={"requestId": 7})
        assert not session.in_flight(b"7") and 7 in out.ended_ids
        send(session, id=7, method="ping")
        assert (await out.answer(7))["result"] == {}
        assert [m for m in out.messages if m.get("id") == 7] == [{"id": 7, "result": {}}], "the call is never answered"

    run(env, scenario, TOOLS)


def test_a_calls_arguments_are_not_held_once_its_worker_has_them(env: Any) -> None:
    """Arguments can be megabytes: once sent, neither a call that runs nor one whose event log line
    waits for the flush keeps them in the daemon."""

    async def scenario(host: Host) -> None:
        session, out = open_session(host)
        send(session, id=1, method="tools/list")
        await out.answer(1)
        host.pool.events.open(env.root / "log" / "atomictoolsd.log")  # every call logged: each waits for the flush
        big = "x" * 6_000_000
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            send(session, id=2, method="tools/call", params={"name": "hold", "arguments": {"text": big, "seconds": 1.5}})
            send(session, id=3, method="tools/call", params={"name": "hold", "arguments": {"text": big, "seconds": 0}})
            assert (await out.answer(3))["result"]["structuredContent"] == {"result": 6_000_000}
            held = tracemalloc.get_traced_memory()[0] - before  # call 2 runs; call 3 is answered, not yet flushed
        finally:
            tracemalloc.stop()
        assert held < 3_000_000, f"the daemon still holds {held:,} bytes of two calls' arguments"
        assert (await out.answer(2))["result"]["structuredContent"] == {"result": 6_000_000}
        host.pool.events.close()

    run(env, scenario, TOOLS)


def test_a_tools_question_goes_out_as_a_request_about_its_call_and_its_answer_comes_back(env: Any) -> None:
    async def scenario(host: Host) -> None:
        session, out = open_session(host)
        send(session, id=1, method="initialize",
             params={"protocolVersion": "2025-06-18", "capabilities": {"elicitation": {}}})
        await out.answer(1)
        send(session, id=2, method="tools/call", params={"name": "confirm", "arguments": {}})
        question = await out.first(lambda m: m.get("method") == "elicitation/create")
        assert question["about"] == 2 and question["params"]["message"] == "Proceed?"
        send(session, id=question["id"], result={"action": "decline"})
        assert text_of(await out.answer(2)) == "decline"

    run(env, scenario, TOOLS)


def test_a_locked_session_keeps_its_project(env: Any) -> None:
    async def scenario(host: Host) -> None:
        session, out = open_session(host)
        send(session, id=1, method="atomic/attach", params={"directory": str(env.project), "lock": True})
        attached = await out.answer(1)
        assert attached["result"]["directory"] == str(env.project.resolve())
        send(session, id=2, method="atomic/shutdown")
        send(session, id=3, method="atomic/attach", params={"directory": str(env.home)})
        for request_id in (2, 3):
            refused = await out.answer(request_id)
            assert refused["error"]["code"] == -32600 and "locked" in refused["error"]["message"]
        assert host.stopping == "" and session.directory == str(env.project.resolve())

    run(env, scenario)


def test_the_stateless_revision_is_named_by_every_request(env: Any) -> None:
    async def scenario(host: Host) -> None:
        session, out = open_session(host)
        send(session, id=1, method="server/discover", params={"_meta": STATELESS_META})
        discovered = (await out.answer(1))["result"]
        assert discovered["resultType"] == "complete" and STATELESS[-1] in discovered["supportedVersions"]
        assert session.stateless
        send(session, id=2, method="tools/list")
        missing = await out.answer(2)
        assert missing["error"]["code"] == -32602 and META_VERSION in missing["error"]["message"]
        send(session, id=3, method="tools/list", params={"_meta": {META_VERSION: "1999-01-01", META_CAPABILITIES: {}}})
        assert (await out.answer(3))["error"]["code"] == -32022
        send(session, id=4, method="ping", params={"_meta": STATELESS_META})
        assert (await out.answer(4))["error"]["code"] == -32601, "a method the revision removed"
        # List changes go only to its listens, each about its own request.
        send(session, id="l", method="subscriptions/listen",
             params={"_meta": STATELESS_META, "notifications": {"toolsListChanged": True}})
        acknowledged = await out.first(lambda m: m.get("method") == "notifications/subscriptions/acknowledged")
        assert acknowledged["about"] == "l"
        session.send_notification("notifications/tools/list_changed")
        changed = await out.first(lambda m: m.get("method") == "notifications/tools/list_changed")
        assert changed["about"] == "l" and changed["params"]["_meta"]
        assert not any("result" in m for m in out.messages if m.get("id") == "l"), "a listen stays open"

    run(env, scenario)


def test_a_list_change_belongs_to_no_request_in_a_session_with_state(env: Any) -> None:
    async def scenario(host: Host) -> None:
        session, out = open_session(host)
        send(session, id=1, method="initialize", params={"protocolVersion": "2025-06-18"})
        await out.answer(1)
        session.send_notification("notifications/tools/list_changed")
        assert out.messages[-1] == {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}

    run(env, scenario)


# -- the socket's side, in process: a Connection on one end of a socket pair ---------------------


async def _lines(reader: socket.socket, count: int) -> list[Any]:
    loop = asyncio.get_running_loop()
    data = b""
    async with asyncio.timeout(20):
        while data.count(b"\n") < count:
            data += await loop.sock_recv(reader, 65536)
    return [json.loads(line) for line in data.splitlines()]


def test_the_socket_connection_takes_batches_only_in_a_session_whose_revision_has_them(env: Any) -> None:
    async def scenario(host: Host) -> None:
        loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair()
        theirs.setblocking(False)
        transport, connection = await loop.connect_accepted_socket(lambda: Connection(host), ours)
        try:
            batch = b'[{"jsonrpc":"2.0","id":1,"method":"ping"},"x",{"jsonrpc":"2.0","method":"notifications/initialized"}]\n'
            await loop.sock_sendall(theirs, batch)
            [refused] = await _lines(theirs, 1)
            assert refused["error"]["code"] == -32600 and "Batches are not supported" in refused["error"]["message"]
            await loop.sock_sendall(theirs, b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-03-26"}}\n')
            [init] = await _lines(theirs, 1)
            assert init["result"]["protocolVersion"] == "2025-03-26" and connection.session.batching
            await loop.sock_sendall(theirs, batch)
            [answers] = await _lines(theirs, 1)
            assert sorted((a["id"] is None, a.get("result"), a.get("error", {}).get("code")) for a in answers) == [
                (False, {}, None), (True, None, -32600)]
            assert connection.session.initialized
        finally:
            transport.close()
            theirs.close()
        await asyncio.sleep(0)
        assert connection.session not in host.sessions, "the session closed with its connection"

    run(env, scenario)


@pytest.mark.parametrize("line", [b"{not json\n", b'{"jsonrpc":"2.0","id":4,"method":5}\n'])
def test_the_socket_connection_answers_a_line_that_is_no_message(env: Any, line: bytes) -> None:
    async def scenario(host: Host) -> None:
        loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair()
        theirs.setblocking(False)
        transport, _ = await loop.connect_accepted_socket(lambda: Connection(host), ours)
        try:
            await loop.sock_sendall(theirs, line + b'{"jsonrpc":"2.0","id":9,"method":"ping"}\n')
            refused, ping = await _lines(theirs, 2)
            expected = (None, -32700) if line.startswith(b"{not") else (4, -32600)
            assert (refused["id"], refused["error"]["code"]) == expected
            assert ping == {"jsonrpc": "2.0", "id": 9, "result": {}}, "the next line is read as usual"
        finally:
            transport.close()
            theirs.close()

    run(env, scenario)
