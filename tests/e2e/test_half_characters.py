"""Half a character: a string holding one half of a UTF-16 surrogate pair, alone.

JavaScript writes one whenever a string is cut inside a pair (``"x😀".slice(0, 2)``): agents
(Node programs) send ``\\ud83d`` escapes in a call's arguments, and a TypeScript tool's result holds
them. A Python tool meets the same in a file name that is not UTF-8 (``os.fsdecode`` keeps each such
byte as a lone surrogate). UTF-8 cannot carry them; each becomes U+FFFD, the rest of the message is
kept, and the request keeps its id. A pair, and an escaped backslash before ``ud83d``, stay as sent.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from e2e.test_http import Http
from helpers import Daemon, Env, serving
from javascript_helpers import js_settings

ECHO = '''
def echo(text: str) -> str:
    """Say it back."""
    return text
'''

ODD_NAMES = '''
import os
from atomictools import tool

NAME = os.fsdecode(b"report-\\xff.txt")  # as os.listdir gives a name that is not UTF-8

@tool
def name() -> str:
    return "found " + NAME

@tool
def names() -> list[str]:
    return [NAME, "\\ud83d\\ude00 plain"]

@tool
def table() -> dict[str, int]:
    return {NAME: 1}
'''

REPLACEMENT = "\ufffd"
# The arguments of a call, as JavaScript's JSON.stringify writes them: half an emoji at the end,
# a whole one, and a backslash followed by the text "ud83d".
ARGUMENTS = rb'{"text":"cut \ud83d|whole \ud83d\ude00|text \\ud83d"}'
EXPECTED = f"cut {REPLACEMENT}|whole \U0001f600|text \\ud83d"


def _call_line(request_id: int) -> bytes:
    return b'{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"echo","arguments":%s}}' % (request_id, ARGUMENTS)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Env, Daemon, Http]]:
    env = Env(tmp_path_factory.mktemp("half"))
    env.write_tool(env.local_tools, "echo.py", ECHO)
    env.write_tool(env.local_tools, "odd.py", ODD_NAMES)
    with serving(env, {"ATOMICTOOLS_HTTP": "127.0.0.1:0"}) as daemon:
        with daemon.raw() as raw:
            info = raw.request("atomic/status")["result"]["http"]
        yield env, daemon, Http(info["url"], Path(info["tokenFile"]).read_text().strip())


def _text(answer: dict[str, Any]) -> str:
    assert "result" in answer, answer
    return "".join(block["text"] for block in answer["result"]["content"])


def test_a_lone_surrogate_in_a_socket_call_is_answered_with_u_fffd(served: tuple[Env, Daemon, Http]) -> None:
    env, daemon, _ = served
    with daemon.raw() as raw:
        raw.result("atomic/attach", {"directory": str(env.project)})
        raw.send_bytes(_call_line(41) + b"\n")
        answer = raw.recv()
        assert answer["id"] == 41, answer  # the request keeps its id: the agent is answered
        assert _text(answer) == EXPECTED
        # Half a character in a method's own params, not only in a tool's arguments.
        raw.send_bytes(b'{"jsonrpc":"2.0","id":42,"method":"ping","params":{"_meta":{"note":"\\udc00"}}}\n')
        assert raw.recv() == {"jsonrpc": "2.0", "id": 42, "result": {}}
        # JSON that is wrong otherwise is still a parse error, whatever escapes it holds.
        raw.send_bytes(b'{"jsonrpc":"2.0","id":43,"method":"ping","params":{"x":"\\ud83d"}\n')
        assert raw.recv()["error"]["code"] == -32700


def test_a_lone_surrogate_in_a_batch_is_answered_inside_the_array(served: tuple[Env, Daemon, Http]) -> None:
    env, daemon, _ = served
    with daemon.raw() as raw:
        raw.result("atomic/attach", {"directory": str(env.project)})
        raw.result("initialize", {"protocolVersion": "2025-03-26", "capabilities": {}, "clientInfo": {"name": "b", "version": "1"}})
        raw.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        raw.send_bytes(b"[" + _call_line(51) + b',{"jsonrpc":"2.0","id":52,"method":"ping"}]\n')
        answers = {answer["id"]: answer for answer in raw.recv()}
        assert _text(answers[51]) == EXPECTED
        assert answers[52]["result"] == {}


def test_a_lone_surrogate_over_http_and_the_rest_api_is_answered_with_u_fffd(served: tuple[Env, Daemon, Http]) -> None:
    env, _, endpoint = served
    path = "/mcp?directory=" + quote(str(env.project), safe="/")
    session = endpoint.initialize(path)
    status, headers, body = endpoint.request("POST", raw=_call_line(61), headers={"Mcp-Session-Id": session}, path=path)
    assert status == 200, body
    messages = [json.loads(line[6:]) for line in body.decode().splitlines() if line.startswith("data: ")] \
        if headers.get("content-type", "").startswith("text/event-stream") else [json.loads(body)]
    assert messages[-1]["id"] == 61 and _text(messages[-1]) == EXPECTED
    # A batch, in a session of the one revision that has them.
    status, headers, _ = endpoint.request("POST", {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-03-26", "capabilities": {}, "clientInfo": {"name": "b", "version": "1"}}}, path=path)
    batch_session = headers["mcp-session-id"]
    endpoint.request("POST", {"jsonrpc": "2.0", "method": "notifications/initialized"}, headers={"Mcp-Session-Id": batch_session}, path=path)
    status, headers, body = endpoint.request("POST", raw=b"[" + _call_line(62) + b"]", headers={"Mcp-Session-Id": batch_session}, path=path)
    assert status == 200, body
    answers = [json.loads(line[6:]) for line in body.decode().splitlines() if line.startswith("data: ")][-1] \
        if headers.get("content-type", "").startswith("text/event-stream") else json.loads(body)
    assert answers[0]["id"] == 62 and _text(answers[0]) == EXPECTED, answers
    status, _, body = endpoint.request(
        "POST", raw=ARGUMENTS, path="/api/tools/echo/call?directory=" + quote(str(env.project), safe="/")
    )
    assert status == 200, body
    assert "".join(block["text"] for block in json.loads(body)["content"]) == EXPECTED


def test_a_python_tool_returning_a_name_that_is_not_utf8_is_answered_with_u_fffd(served: tuple[Env, Daemon, Http]) -> None:
    env, daemon, _ = served
    with daemon.raw() as raw:
        raw.result("atomic/attach", {"directory": str(env.project)})
        assert _text(raw.request("tools/call", {"name": "odd_name"})) == f"found report-{REPLACEMENT}.txt"
        answer = raw.request("tools/call", {"name": "odd_names"})
        assert answer["result"]["structuredContent"] == {"result": [f"report-{REPLACEMENT}.txt", "\U0001f600 plain"]}
        assert not answer["result"].get("isError"), answer
        answer = raw.request("tools/call", {"name": "odd_table"})
        assert answer["result"]["structuredContent"] == {f"report-{REPLACEMENT}.txt": 1}, answer


HALF_EMOJI_TS = '''
export default {
  description: "Cut a string inside a surrogate pair, as JavaScript's slice does.",
  args: {},
  async execute() {
    return "cut " + "\\u{1F600}".slice(0, 1) + "|whole \\u{1F600}";
  },
};
'''


@pytest.mark.parametrize("runtime", ["bun", "node"])
def test_a_typescript_tool_returning_half_an_emoji_is_answered_with_u_fffd(env: Env, make_daemon: Any, runtime: str) -> None:
    env.write_tool(env.global_tools, "half.ts", HALF_EMOJI_TS)
    daemon: Daemon = make_daemon(js_settings(runtime))
    with daemon.raw() as raw:
        answer = raw.request("tools/call", {"name": "half"})
        assert not answer["result"].get("isError"), answer
        assert _text(answer) == f"cut {REPLACEMENT}|whole \U0001f600"
