"""JSON-RPC batches: taken in a session of MCP 2025-03-26, the one revision that has them, on the
socket (one array line of answers) and over HTTP (one JSON array, or an SSE stream); refused in
every other session."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from e2e import test_http
from e2e.test_http import Http, _initialize, _messages, _project_path
from helpers import Daemon, Env, RawConnection, serving

served = test_http.served  # the fixture: a daemon serving HTTP, with echo, slow and touch in its project

ECHO, SLOW = test_http.ECHO, test_http.SLOW

FAILS = '''
from atomictools import ToolError

def fails() -> str:
    """Always fails."""
    raise ToolError("it went wrong")
'''


@pytest.fixture(scope="module")
def tools_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """One daemon for the module's batches over the socket: they call its tools and read the answers."""
    env = Env(tmp_path_factory.mktemp("batches"))
    env.write_tool(env.local_tools, "echo.py", ECHO)
    env.write_tool(env.local_tools, "slow.py", SLOW)
    env.write_tool(env.local_tools, "fails.py", FAILS)
    with serving(env) as daemon:
        yield daemon


def _initialized(daemon: Daemon, env: Env, version: str) -> RawConnection:
    raw = daemon.raw()
    raw.result("atomic/attach", {"directory": str(env.project)})
    answer = raw.result("initialize", {"protocolVersion": version, "capabilities": {},
                                       "clientInfo": {"name": "batcher", "version": "1"}})
    assert answer["protocolVersion"] == version
    raw.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    return raw


def _request(request_id: Any, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params is not None:
        message["params"] = params
    return message


def _send_batch(raw: RawConnection, messages: list[Any]) -> None:
    raw.send_bytes(json.dumps(messages).encode() + b"\n")


def _next_answer(raw: RawConnection) -> Any:
    """The next array or response line (a notification of a tool's progress may come first)."""
    while True:
        line = raw.recv()
        if isinstance(line, list) or "method" not in line:
            return line


def _by_id(answers: list[dict[str, Any]]) -> dict[Any, dict[str, Any]]:
    found = {answer["id"]: answer for answer in answers}
    assert len(found) == len(answers), answers
    return found


def test_a_batch_in_a_2025_03_26_session_is_answered_as_one_array(tools_daemon: Daemon) -> None:
    env = tools_daemon.env
    with _initialized(tools_daemon, env, "2025-03-26") as raw:
        _send_batch(raw, [
            _request(1, "tools/list"),
            _request("two", "tools/call", {"name": "echo", "arguments": {"text": "hi"}}),
            {"jsonrpc": "2.0", "method": "notifications/message-of-no-kind"},
            _request(3, "tools/call", {"name": "fails", "arguments": {}}),
            _request(4, "ping"),
        ])
        answers = _next_answer(raw)
        assert isinstance(answers, list), answers
        found = _by_id(answers)
        assert set(found) == {1, "two", 3, 4}  # one answer per request, none for the notification
        assert sorted(t["name"] for t in found[1]["result"]["tools"]) == ["echo", "fails", "slow"]
        assert found["two"]["result"]["content"] == [{"type": "text", "text": "hi"}]
        assert found[3]["result"]["isError"] and "it went wrong" in found[3]["result"]["content"][0]["text"]
        assert found[4] == {"jsonrpc": "2.0", "id": 4, "result": {}}
        # The connection goes on serving single messages.
        assert raw.request("ping")["result"] == {}


def test_each_bad_message_of_a_batch_is_answered_inside_the_array(tools_daemon: Daemon) -> None:
    env = tools_daemon.env
    with _initialized(tools_daemon, env, "2025-03-26") as raw:
        _send_batch(raw, [
            _request(1, "tools/call", {"name": "echo", "arguments": {"text": "ok"}}),
            1,
            {"jsonrpc": "2.0", "id": 2},
            _request(3, "no/such/method"),
            _request(4, "tools/call", {"name": "ecko", "arguments": {}}),
            {"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {"name": "echo", "arguments": {"text": "a"}}},
            _request(5, "ping"),  # the id of a request of the same batch still in flight
            _request(None, "ping"),
            _request(6, "initialize", {"protocolVersion": "2025-03-26"}),
            [_request(7, "ping")],
        ])
        answers = _next_answer(raw)
        assert isinstance(answers, list), answers
        grouped: dict[Any, list[dict[str, Any]]] = {}
        for answer in answers:
            grouped.setdefault(answer["id"], []).append(answer)
        assert set(grouped) == {1, 2, 3, 4, 5, 6, None}
        assert grouped[1][0]["result"]["content"][0]["text"] == "ok"
        assert grouped[2][0]["error"]["code"] == -32600
        assert grouped[3][0]["error"]["code"] == -32601
        assert grouped[4][0]["error"]["code"] == -32602 and "echo" in grouped[4][0]["error"]["message"]
        # The first request with id 5 stands; the second, sent while it runs, is refused.
        results = [a for a in grouped[5] if "result" in a]
        refused = [a for a in grouped[5] if "error" in a]
        assert len(results) == len(refused) == 1
        assert results[0]["result"]["content"][0]["text"] == "a" and "already used" in refused[0]["error"]["message"]
        assert grouped[6][0]["error"]["code"] == -32600 and "initialize" in grouped[6][0]["error"]["message"]
        # 1, the null id and the nested batch: each an Invalid Request without an id.
        assert len(grouped[None]) == 3 and all(a["error"]["code"] == -32600 for a in grouped[None])
        assert raw.request("ping")["result"] == {}


def test_an_empty_batch_is_an_invalid_request_and_a_batch_of_notifications_gets_no_line(
    tools_daemon: Daemon
) -> None:
    env = tools_daemon.env
    with _initialized(tools_daemon, env, "2025-03-26") as raw:
        raw.send_bytes(b"[]\n")
        reply = raw.recv()
        assert reply["id"] is None and reply["error"]["code"] == -32600 and "empty batch" in reply["error"]["message"]
        _send_batch(raw, [{"jsonrpc": "2.0", "method": "notifications/initialized"},
                          {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 99}}])
        ping = raw.send_request("ping")
        assert raw.recv() == {"jsonrpc": "2.0", "id": ping, "result": {}}  # nothing came before it
        raw.send_bytes(b'[{"jsonrpc":"2.0","id":1,"method":"ping"}\n')  # not JSON: one Parse error
        reply = raw.recv()
        assert reply["id"] is None and reply["error"]["code"] == -32700


def test_a_batch_is_refused_in_every_other_session(tools_daemon: Daemon) -> None:
    env = tools_daemon.env
    batch = [_request(10, "ping"), _request(11, "tools/list")]
    for version in ("2024-11-05", "2025-06-18", "2025-11-25", None):
        raw = _initialized(tools_daemon, env, version) if version else tools_daemon.raw()
        with raw:
            _send_batch(raw, batch)
            reply = raw.recv()
            assert isinstance(reply, dict) and reply["id"] is None, (version, reply)
            assert reply["error"]["code"] == -32600
            assert "Batches are not supported" in reply["error"]["message"]
            assert "2025-03-26" in reply["error"]["message"]
            assert raw.request("ping")["result"] == {}


def test_a_batch_is_bounded_and_a_cancelled_request_leaves_it(tools_daemon: Daemon) -> None:
    env = tools_daemon.env
    with _initialized(tools_daemon, env, "2025-03-26") as raw:
        _send_batch(raw, [_request(i, "ping") for i in range(1001)])
        reply = raw.recv()
        assert reply["id"] is None and "at most 1000" in reply["error"]["message"]
        _send_batch(raw, [_request(i, "ping") for i in range(1000)])
        assert sorted(a["id"] for a in _next_answer(raw)) == list(range(1000))
        # A slow call of a batch cancelled on its own line: the batch answers without it, at once.
        _send_batch(raw, [
            _request("slow", "tools/call", {"name": "slow", "arguments": {"seconds": 30, "marker": "m1"}}),
            _request("quick", "tools/call", {"name": "echo", "arguments": {"text": "q"}}),
        ])
        time.sleep(0.5)
        started = time.monotonic()
        raw.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "slow"}})
        answers = _next_answer(raw)
        assert time.monotonic() - started < 5
        assert [a["id"] for a in answers] == ["quick"], answers
        assert not (env.project / "m1").exists()


# -- over HTTP: the body of a POST in a 2025-03-26 session -------------------------------------------


def _http_session(endpoint: Http, path: str, version: str) -> str:
    status, headers, _ = endpoint.request("POST", _initialize(version), path=path)
    assert status == 200, status
    session = headers["mcp-session-id"]
    endpoint.request("POST", {"jsonrpc": "2.0", "method": "notifications/initialized"}, path=path,
                     headers={"Mcp-Session-Id": session})
    return session


def test_a_batch_posted_in_a_2025_03_26_session_is_answered_as_one_json_array(
    served: tuple[Any, Http]
) -> None:
    daemon, endpoint = served
    env = daemon.env
    path = _project_path(env)
    session = _http_session(endpoint, path, "2025-03-26")
    status, headers, body = endpoint.request("POST", [
        _request(1, "tools/list"),
        _request(2, "tools/call", {"name": "echo", "arguments": {"text": "hi"}}),
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        _request(3, "tools/call", {"name": "ecko", "arguments": {}}),
        "not a message",
        _request(4, "initialize", {"protocolVersion": "2025-03-26"}),
    ], path=path, headers={"Mcp-Session-Id": session})
    assert status == 200 and headers["content-type"] == "application/json", (status, headers, body)
    answers = json.loads(body)
    found = {a["id"]: a for a in answers}
    assert len(answers) == 5 and set(found) == {1, 2, 3, 4, None}
    assert sorted(t["name"] for t in found[1]["result"]["tools"]) == ["echo", "slow", "touch"]
    assert found[2]["result"]["content"] == [{"type": "text", "text": "hi"}]
    assert found[3]["error"]["code"] == -32602 and "echo" in found[3]["error"]["message"]
    assert found[4]["error"]["code"] == -32600 and found[None]["error"]["code"] == -32600
    # Notifications alone: 202, no body.
    status, _, body = endpoint.request("POST", [{"jsonrpc": "2.0", "method": "notifications/initialized"}],
                                       path=path, headers={"Mcp-Session-Id": session})
    assert (status, body) == (202, b"")
    status, _, body = endpoint.request("POST", [], path=path, headers={"Mcp-Session-Id": session})
    assert status == 400 and "empty batch" in json.loads(body)["error"]["message"]


def test_a_batch_whose_tool_reports_progress_is_answered_as_an_sse_stream(served: tuple[Any, Http]) -> None:
    daemon, endpoint = served
    env = daemon.env
    path = _project_path(env)
    session = _http_session(endpoint, path, "2025-03-26")
    status, headers, body = endpoint.request("POST", [
        _request(1, "tools/call", {"name": "echo", "arguments": {"text": "first"}}),
        _request(2, "tools/call", {"name": "slow", "arguments": {"seconds": 0.3, "marker": "m1"},
                                   "_meta": {"progressToken": "p"}}),
    ], path=path, headers={"Mcp-Session-Id": session})
    assert status == 200 and headers["content-type"].startswith("text/event-stream"), (status, headers)
    events = _messages(headers, body)
    progress = [e for e in events if e.get("method") == "notifications/progress"]
    assert [p["params"]["progressToken"] for p in progress] == ["p"]
    answers = {e["id"]: e for e in events if "id" in e}
    assert answers[1]["result"]["content"][0]["text"] == "first"
    assert answers[2]["result"]["content"][0]["text"] == "slept"
    assert events.index(answers[2]) == len(events) - 1  # the stream ends with the last answer
    # A client that takes only JSON gets the array; the progress has nowhere to go.
    status, headers, body = endpoint.request("POST", [
        _request(3, "tools/call", {"name": "slow", "arguments": {"seconds": 0.1, "marker": "m2"},
                                   "_meta": {"progressToken": "q"}}),
    ], path=path, headers={"Mcp-Session-Id": session, "Accept": "application/json"})
    assert status == 200 and headers["content-type"] == "application/json"
    assert [a["result"]["content"][0]["text"] for a in json.loads(body)] == ["slept"]


def test_a_batch_is_refused_over_http_outside_a_2025_03_26_session(served: tuple[Any, Http]) -> None:
    daemon, endpoint = served
    env = daemon.env
    path = _project_path(env)
    batch = [_request(1, "ping"), _request(2, "tools/list")]
    newer = _http_session(endpoint, path, "2025-11-25")
    for headers in ({"Mcp-Session-Id": newer}, {}):  # a 2025-11-25 session; a stateless request
        status, _, body = endpoint.request("POST", batch, path=path, headers=headers)
        assert status == 400, (headers, status, body)
        error = json.loads(body)["error"]
        assert error["code"] == -32600 and "Batches are not supported" in error["message"]
    status, _, _ = endpoint.request("POST", batch, path=path, headers={"Mcp-Session-Id": "no-such-session"})
    assert status == 404
