"""The stateless revision (2026-07-28) over the daemon's HTTP endpoint, spoken byte by byte: the
routing headers each request must carry, the result fields and the stable order, a listening
request that gets list changes while one that does not listen gets none, and two clients of the
same URL (one session on the daemon's side) that never see each other's capabilities or schema forms.

The SDK client's view of the same (``mcp.Client`` in modern mode) is in test_stateless.py."""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import pytest

from e2e.test_revisions import SCHEMA as WHERE  # a declarative tool "where" whose schema uses $defs
from helpers import Env, serving

pytestmark = pytest.mark.slow

VERSION = "2026-07-28"
META = {"io.modelcontextprotocol/protocolVersion": VERSION, "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"}}
ASKS = {**META, "io.modelcontextprotocol/clientCapabilities": {"elicitation": {}}}

TOUCH = '''
from pathlib import Path

def touch(name: str) -> str:
    """Write a marker file in the project, so a test can tell whether this ran."""
    Path(__file__).resolve().parents[2].joinpath(name).write_text("ran")
    return "touched " + name
'''

LATE_ASK = '''
import time

from atomictools import AskError, Context

def late_ask(delay: float, ctx: Context) -> str:
    """Wait, then ask the user."""
    time.sleep(delay)
    try:
        return ctx.elicit("Go on?").action
    except AskError as exc:
        return f"not asked: {exc}"
'''

SAMPLE = '''
from atomictools import Context

async def sample(prompt: str, ctx: Context) -> str:
    """Ask the client's model, from an async tool."""
    return "model says: " + (await ctx.asample(prompt, max_tokens=20)).text
'''


WHO = '''
from atomictools import Context

def who(ctx: Context) -> str:
    """The agent the call's session is attached as."""
    return ctx.agent
'''

class Endpoint:
    """The daemon's endpoint for one project, without a session id: every POST is stateless."""

    def __init__(self, url: str, token: str, project: Path) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "", parts.port or 80
        self.path = f"{parts.path}?directory={quote(str(project), safe='/')}"
        self.token = token
        self.project = project

    def open(self, body: dict[str, Any], headers: dict[str, str] | None = None) -> http.client.HTTPResponse:
        connection = http.client.HTTPConnection(self.host, self.port, timeout=30)
        sent = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
                "Authorization": f"Bearer {self.token}"}
        sent.update(routing_headers(body) if headers is None else headers)
        connection.request("POST", self.path, body=json.dumps(body).encode(), headers=sent)
        return connection.getresponse()

    def post(self, body: dict[str, Any], headers: dict[str, str] | None = None) -> tuple[int, list[dict[str, Any]]]:
        """The status and every JSON-RPC message of the answer (one for JSON, each event for SSE)."""
        response = self.open(body, headers)
        payload = response.read()
        if response.getheader("content-type", "").startswith("text/event-stream"):
            return response.status, [json.loads(line[6:]) for line in payload.decode().splitlines() if line.startswith("data: ")]
        return response.status, [json.loads(payload)] if payload else []


def routing_headers(body: dict[str, Any]) -> dict[str, str]:
    """What a 2026-07-28 client puts in the HTTP headers: the revision, the method, the tool's name."""
    headers = {"MCP-Protocol-Version": VERSION, "Mcp-Method": body["method"]}
    name = (body.get("params") or {}).get("name")
    if body["method"] == "tools/call" and isinstance(name, str):
        headers["Mcp-Name"] = name
    return headers


def request(id_: Any, method: str, params: dict[str, Any] | None = None, meta: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id_, "method": method, "params": {**(params or {}), "_meta": meta or META}}


def _write_tools(env: Env) -> None:
    env.write_tool(env.local_tools, "touch.py", TOUCH)
    env.write_tool(env.local_tools, "late_ask.py", LATE_ASK)
    env.write_tool(env.local_tools, "sample.py", SAMPLE)
    env.write_tool(env.local_tools, "schemas.json", json.dumps(WHERE))
    env.write_tool(env.local_tools, "who.py", WHO)
    for name in ("zeta", "alpha", "mid"):
        env.write_tool(env.local_tools, f"{name}.py", f'def {name}() -> str:\n    """{name}."""\n    return "{name}"\n')


def _endpoint(daemon: Any) -> Endpoint:
    with daemon.raw() as raw:
        info = raw.request("atomic/status")["result"]["http"]
    return Endpoint(info["url"], Path(info["tokenFile"]).read_text().strip(), daemon.env.project)


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Endpoint]:
    """One daemon for the module's tests that call and list (each marker a name of its own)."""
    env = Env(tmp_path_factory.mktemp("stateless"))
    _write_tools(env)
    with serving(env, {"ATOMICTOOLS_HTTP": "127.0.0.1:0"}) as daemon:
        yield _endpoint(daemon)


@pytest.fixture
def own_endpoint(env: Env, make_daemon: Any) -> Endpoint:
    """A daemon of the test's own, for a test that adds a tool."""
    _write_tools(env)
    return _endpoint(make_daemon({"ATOMICTOOLS_HTTP": "127.0.0.1:0"}))


def touch_after(endpoint: Endpoint, name: str) -> None:
    """Call touch after a refused call of it: once this one is done, the refused one would have run too."""
    call = request(2, "tools/call", {"name": "touch", "arguments": {"name": name}})
    status, [reply] = endpoint.post(call)
    assert status == 200 and reply["result"]["content"][0]["text"] == f"touched {name}", reply


@pytest.mark.parametrize("missing", ["Mcp-Method", "Mcp-Name", "MCP-Protocol-Version"])
def test_a_stateless_request_without_its_routing_headers_is_refused_and_runs_nothing(endpoint: Endpoint, missing: str) -> None:
    call = request(1, "tools/call", {"name": "touch", "arguments": {"name": f"without-{missing}"}})
    headers = {k: v for k, v in routing_headers(call).items() if k != missing}
    status, [reply] = endpoint.post(call, headers)
    assert status == 400, reply
    assert reply["error"]["code"] == -32020 and missing in reply["error"]["message"], reply
    touch_after(endpoint, f"after-{missing}")
    assert not (endpoint.project / f"without-{missing}").exists()
    # The same request with every header runs.
    status, [reply] = endpoint.post(call)
    assert status == 200 and reply["result"]["content"][0]["text"] == f"touched without-{missing}"


def test_a_revision_header_that_disagrees_with_the_meta_is_refused(endpoint: Endpoint) -> None:
    call = request(1, "tools/call", {"name": "touch", "arguments": {"name": "disagreed"}})
    status, [reply] = endpoint.post(call, {**routing_headers(call), "MCP-Protocol-Version": "2025-11-25"})
    assert status == 400 and reply["error"]["code"] == -32020 and "MCP-Protocol-Version" in reply["error"]["message"]
    touch_after(endpoint, "after-disagreed")
    assert not (endpoint.project / "disagreed").exists()


def test_results_carry_result_type_and_lists_cache_hints_in_a_stable_order(endpoint: Endpoint) -> None:
    status, [discover] = endpoint.post(request(1, "server/discover"))
    assert status == 200
    assert discover["result"]["resultType"] == "complete" and VERSION in discover["result"]["supportedVersions"]
    assert discover["result"]["ttlMs"] == 0 and discover["result"]["cacheScope"] == "private"
    listings = []
    for id_ in (2, 3):
        status, [listed] = endpoint.post(request(id_, "tools/list"))
        assert status == 200 and listed["id"] == id_
        result = listed["result"]
        assert result["resultType"] == "complete" and result["ttlMs"] == 0 and result["cacheScope"] == "private"
        listings.append([t["name"] for t in result["tools"]])
    assert listings[0] == listings[1] == sorted(listings[0]) and {"alpha", "mid", "zeta"} <= set(listings[0])
    status, [called] = endpoint.post(request(4, "tools/call", {"name": "alpha", "arguments": {}}))
    assert called["result"]["resultType"] == "complete" and called["result"]["content"][0]["text"] == "alpha"


def test_only_the_listening_request_is_sent_list_changes(env: Env, own_endpoint: Endpoint) -> None:
    endpoint = own_endpoint
    listen = endpoint.open(request("listen-1", "subscriptions/listen", {"notifications": {"toolsListChanged": True}}))
    assert listen.status == 200 and listen.getheader("content-type", "").startswith("text/event-stream")

    def next_event() -> dict[str, Any]:
        while True:
            line = listen.readline()
            assert line, "the listen stream ended"
            if line.startswith(b"data: "):
                return json.loads(line[6:])

    ack = next_event()
    assert ack["method"] == "notifications/subscriptions/acknowledged"
    assert ack["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"] == "listen-1"
    # Another request of the same URL, in flight while the tools change: it is answered, never told.
    outcome: dict[str, Any] = {}
    busy = threading.Thread(target=lambda: outcome.update(
        answer=endpoint.post(request(9, "tools/call", {"name": "late_ask", "arguments": {"delay": 1.5}}))))
    busy.start()
    time.sleep(0.3)
    env.write_tool(env.local_tools, "later.py", 'def later() -> str:\n    """New."""\n    return "later"\n')
    change = next_event()
    assert change["method"] == "notifications/tools/list_changed"
    assert change["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"] == "listen-1"
    busy.join(30)
    status, messages = outcome["answer"]
    assert status == 200 and [m.get("id") for m in messages] == [9], messages  # its answer, nothing else
    listen.close()


def test_two_clients_of_one_url_keep_their_own_capabilities(endpoint: Endpoint) -> None:
    # Both are served by the one session the daemon keeps for the URL; what one declares in its
    # _meta must not become the other's: a client that can be asked is asked, even while a client
    # that cannot sends its own requests.
    outcome: dict[str, Any] = {}
    asking = threading.Thread(target=lambda: outcome.update(answer=endpoint.post(
        request(1, "tools/call", {"name": "late_ask", "arguments": {"delay": 1.0}}, ASKS))))
    asking.start()
    time.sleep(0.3)
    status, [listed] = endpoint.post(request(2, "tools/list"))  # META: no elicitation declared
    assert status == 200 and "result" in listed
    asking.join(30)
    status, [answer] = outcome["answer"]
    assert status == 200 and "result" in answer and answer["result"]["resultType"] == "input_required", answer
    [(key, question)] = answer["result"]["inputRequests"].items()
    assert question["method"] == "elicitation/create" and question["params"]["message"] == "Go on?"
    status, [done] = endpoint.post(request(3, "tools/call", {
        "name": "late_ask", "arguments": {"delay": 1.0}, "requestState": answer["result"]["requestState"],
        "inputResponses": {key: {"action": "decline"}}}, ASKS))
    assert done["result"]["content"][0]["text"] == "decline"
    # And the other way round: a client that declared nothing is not asked because another one did.
    outcome.clear()
    plain = threading.Thread(target=lambda: outcome.update(answer=endpoint.post(
        request(4, "tools/call", {"name": "late_ask", "arguments": {"delay": 1.0}}))))
    plain.start()
    time.sleep(0.3)
    endpoint.post(request(5, "tools/list", meta=ASKS))
    plain.join(30)
    status, [answer] = outcome["answer"]
    assert answer["result"]["resultType"] == "complete"
    assert "'elicitation' capability" in answer["result"]["content"][0]["text"], answer


def test_each_client_of_one_url_gets_the_schema_form_it_accepts(endpoint: Endpoint) -> None:
    # One session serves every client of the URL: the name one request gives in _meta decides what
    # that request is sent, and nothing another client of the URL is sent, before or after it.
    def where_schema(id_: int, client: str | None) -> dict[str, Any]:
        meta = {k: v for k, v in META.items() if k != "io.modelcontextprotocol/clientInfo"}
        if client is not None:
            meta["io.modelcontextprotocol/clientInfo"] = {"name": client, "version": "1"}
        status, [listed] = endpoint.post(request(id_, "tools/list", meta=meta))
        assert status == 200, listed
        return next(t for t in listed["result"]["tools"] if t["name"] == "where")["inputSchema"]

    written = WHERE["tools"][0]["inputSchema"]  # type: ignore[index]
    for id_, client, portable in [(1, "gemini-cli", True), (2, "claude-code", False), (3, "qwen-code", True),
                                  (4, None, False), (5, "gemini-cli-mcp-client", True), (6, "raw", False)]:
        schema = where_schema(id_, client)
        if portable:
            assert "$defs" not in json.dumps(schema) and "$ref" not in json.dumps(schema), (client, schema)
            assert schema["properties"]["place"]["properties"]["city"] == {"type": "string"}
        else:
            assert schema["$defs"] == written["$defs"] and schema["properties"]["place"] == {"$ref": "#/$defs/place"}, (client, schema)
    # Nor does the name become the session's: every client of the URL is "http" to its tools (ctx.agent).
    for id_, client in [(7, "gemini-cli"), (8, "claude-code")]:
        meta = {**META, "io.modelcontextprotocol/clientInfo": {"name": client, "version": "1"}}
        status, [called] = endpoint.post(request(id_, "tools/call", {"name": "who", "arguments": {}}, meta))
        assert called["result"]["content"][0]["text"] == "http", called


@pytest.mark.parametrize(("client", "portable"), [("gemini-cli-mcp-client", True), ("claude-code", False)])
def test_a_stateful_session_of_the_same_url_gets_its_initialize_clients_form(endpoint: Endpoint, client: str, portable: bool) -> None:
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": client, "version": "1"}}}
    response = endpoint.open(init, {})
    response.read()
    session = response.getheader("mcp-session-id")
    assert response.status == 200 and session
    headers = {"Mcp-Session-Id": session, "MCP-Protocol-Version": "2025-11-25"}
    endpoint.post({"jsonrpc": "2.0", "method": "notifications/initialized"}, headers)
    status, [listed] = endpoint.post({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, headers)
    schema = next(t for t in listed["result"]["tools"] if t["name"] == "where")["inputSchema"]
    assert ("$defs" not in json.dumps(schema)) == portable, schema


def test_ctx_sample_asks_a_stateless_client_through_input_required_and_its_retry_answers(endpoint: Endpoint) -> None:
    samples = {**META, "io.modelcontextprotocol/clientCapabilities": {"sampling": {}}}
    status, [first] = endpoint.post(request(1, "tools/call", {"name": "sample", "arguments": {"prompt": "hi"}}, samples))
    assert status == 200 and first["result"]["resultType"] == "input_required", first
    [(key, question)] = first["result"]["inputRequests"].items()
    assert question["method"] == "sampling/createMessage" and question["params"]["maxTokens"] == 20
    assert question["params"]["messages"][0]["content"] == {"type": "text", "text": "hi"}
    answer = {"role": "assistant", "content": {"type": "text", "text": "hello"}, "model": "m", "stopReason": "endTurn"}
    status, [done] = endpoint.post(request(2, "tools/call", {
        "name": "sample", "arguments": {"prompt": "hi"}, "requestState": first["result"]["requestState"],
        "inputResponses": {key: answer}}, samples))
    assert done["id"] == 2 and done["result"]["resultType"] == "complete"
    assert done["result"]["content"][0]["text"] == "model says: hello"
    # Without the capability the tool is told at once why it cannot ask.
    status, [refused] = endpoint.post(request(3, "tools/call", {"name": "sample", "arguments": {"prompt": "hi"}}))
    assert refused["result"]["isError"] and "'sampling' capability" in refused["result"]["content"][0]["text"]
