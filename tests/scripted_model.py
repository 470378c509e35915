"""A scripted stand-in for an OpenAI-compatible model: the agent CLIs under test talk to it on
127.0.0.1 as they would to a real provider, offline and without a login.

The script is a list of tool calls. Each request of the agent answers the next call — the tool
named in the request's ``tools`` whose name ends with the scripted name (agents prefix an MCP
server's tools: ``mcp__atomic__lint``, ``mcp_atomic_lint``) — and records the result of the call
before it, carried by the request's ``tool`` message. An agent that defers its MCP tools (Qwen Code:
their names in its system prompt, their schemas sent once the model asks) is first asked, through its
tool search, for every scripted tool it names. Once every call has been made, the answer is plain
text and the agent's turn ends. Requests with ``stream: true`` are answered as Server-Sent
Events, one chunk per delta, as OpenAI's API does.

Only the standard library: a ``ThreadingHTTPServer`` in a thread of the test, stopped by ``close``.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["FINAL_TEXT", "ScriptedCall", "ScriptedModel"]

FINAL_TEXT = "Done."
SEARCH_TOOLS = ("tool_search", "ToolSearch")  # Qwen Code's and Claude Code's: they defer MCP tools


@dataclass
class ScriptedCall:
    """One tool call the model makes, and what came of it."""

    tool: str
    arguments: dict[str, Any]
    name: str | None = None  # the name the agent gave the tool, once it was offered
    result: str | None = None  # the content of the agent's ``tool`` message answering the call


@dataclass
class _Transcript:
    calls: list[ScriptedCall]
    requests: list[dict[str, Any]] = field(default_factory=list)
    missing: dict[str, list[str]] = field(default_factory=dict)  # a scripted tool not offered: what was
    searched: list[str] = field(default_factory=list)  # scripted tools looked up in the agent's tool search
    lock: threading.Lock = field(default_factory=threading.Lock)


class ScriptedModel:
    """Serves ``/v1/chat/completions`` on 127.0.0.1 until ``close``.

    Args:
        calls: the tool calls to make, one per request, in order.
        model: the model's name, as the agent asks for it.
    """

    def __init__(self, calls: list[ScriptedCall], model: str = "scripted") -> None:
        self.model = model
        self.transcript = _Transcript(calls)
        handler = type("Handler", (_Handler,), {"transcript": self.transcript, "model": model})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="scripted-model", daemon=True)
        self._thread.start()

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    @property
    def calls(self) -> list[ScriptedCall]:
        return self.transcript.calls

    @property
    def requests(self) -> list[dict[str, Any]]:
        return self.transcript.requests

    @property
    def missing(self) -> dict[str, list[str]]:
        """Each scripted tool the agent did not offer, with the names of the tools it offered instead."""
        return self.transcript.missing

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> ScriptedModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Handler(BaseHTTPRequestHandler):
    transcript: _Transcript
    model: str
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass  # the transcript is what a test reads; nothing goes to the test's stderr

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        length = int(self.headers.get("Content-Length") or 0)
        request = json.loads(self.rfile.read(length) or b"{}")
        if not self.path.rstrip("/").endswith("/chat/completions"):
            self._send_json({"error": {"message": f"no such path: {self.path}"}}, status=404)
            return
        with self.transcript.lock:
            self.transcript.requests.append(request)
            message = _next_message(self.transcript, request)
        if request.get("stream"):
            self._send_stream(message)
        else:
            finish = "tool_calls" if message.get("tool_calls") else "stop"
            self._send_json(_completion(self.model, {"index": 0, "message": message, "finish_reason": finish}))

    def _send_json(self, body: dict[str, Any], status: int = 200) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _send_stream(self, message: dict[str, Any]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        for choice in _stream_choices(message):
            chunk = _completion(self.model, choice, chunk=True)
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
        self.close_connection = True


def _next_message(transcript: _Transcript, request: dict[str, Any]) -> dict[str, Any]:
    """Record the results the request carries; answer the next scripted call, or the final text."""
    made = [call for call in transcript.calls if call.name is not None]
    results = {m.get("tool_call_id"): m.get("content") for m in request.get("messages", []) if m.get("role") == "tool"}
    for index, call in enumerate(made):
        if call.result is None and f"call_{index}" in results:
            call.result = _text(results[f"call_{index}"])
    if len(made) == len(transcript.calls):
        return {"role": "assistant", "content": FINAL_TEXT}
    call = transcript.calls[len(made)]
    offered = [tool.get("function", {}).get("name", "") for tool in request.get("tools") or []]
    name = next((n for n in offered if _names(n, call.tool)), None)
    if name is not None:
        call.name = name
        return _calling(f"call_{len(made)}", name, call.arguments)
    search = _search(transcript, request, offered, call.tool)
    if search is not None:
        return search
    transcript.missing.setdefault(call.tool, offered)
    return {"role": "assistant", "content": f"No tool named {call.tool!r} was offered."}


def _names(offered: str, tool: str) -> bool:
    """Whether an agent's name for a tool is ``tool``: itself, or prefixed with its server's name."""
    return offered == tool or re.fullmatch(rf"mcp_\w*_{re.escape(tool)}", offered) is not None


def _search(transcript: _Transcript, request: dict[str, Any], offered: list[str], tool: str) -> dict[str, Any] | None:
    """A call of the agent's tool search for ``tool`` and every other scripted tool still to load, when
    the agent defers its MCP tools (names them in its system prompt and sends their schemas once the
    model asks); None when it does not."""
    searcher = next((n for n in offered if n in SEARCH_TOOLS), None)
    if searcher is None or tool in transcript.searched:
        return None
    prompt = " ".join(_text(m.get("content")) for m in request.get("messages", []) if m.get("role") == "system")
    wanted = [call.tool for call in transcript.calls if call.name is None and call.tool not in transcript.searched]
    deferred = {name: re.search(rf"\bmcp_\w*_{re.escape(name)}\b", prompt) for name in wanted}
    found = {name: match.group(0) for name, match in deferred.items() if match is not None}
    if tool not in found:
        return None
    transcript.searched.extend(found)
    query = {"query": "select:" + ",".join(found.values()), "max_results": len(found)}
    return _calling(f"search_{len(transcript.searched)}", searcher, query)


def _calling(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    tool_call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
    return {"role": "assistant", "content": None, "tool_calls": [tool_call]}


def _text(content: Any) -> str:
    """A message's content: a string, a list of text parts, or none."""
    if content is None:
        return ""
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return str(content)


def _stream_choices(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The message as stream deltas: the role, its text or each tool call, then the finish."""
    choices: list[dict[str, Any]] = [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]
    if message.get("tool_calls"):
        for index, call in enumerate(message["tool_calls"]):
            choices.append({"index": 0, "delta": {"tool_calls": [{"index": index, **call}]}, "finish_reason": None})
        choices.append({"index": 0, "delta": {}, "finish_reason": "tool_calls"})
    else:
        choices.append({"index": 0, "delta": {"content": message["content"]}, "finish_reason": None})
        choices.append({"index": 0, "delta": {}, "finish_reason": "stop"})
    return choices


def _completion(model: str, choice: dict[str, Any], chunk: bool = False) -> dict[str, Any]:
    return {
        "id": "chatcmpl-scripted", "object": "chat.completion.chunk" if chunk else "chat.completion", "created": 0,
        "model": model, "choices": [choice],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
