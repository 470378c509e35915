"""The tools REST API (aynd's routes), on the daemon's HTTP endpoint, for scripts and services that
are not MCP clients:

- ``GET /api/tools``: every tool with its source (``builtin``, ``global``, ``project``), its file
  and kind, and ``counts`` by source;
- ``GET /api/tools/{name}``: one tool, or 404;
- ``POST /api/tools/reload``: rescan the project's tools dirs, answering ``{success, toolCount, errors}``;
- ``POST /api/tools/{name}/call``: call a tool with the JSON body as its arguments, answering the
  MCP ``CallToolResult`` (a tool's error too: ``isError``); a call refused a 4xx.

The query names the project and the lists as the MCP endpoint's does (``?directory=/abs/path``,
``allow``, ``deny``). Each request is handed, as a JSON-RPC request with its params made here
(``atomic/list``, ``atomic/reload``, ``tools/call``), to a session kept per query string for this
API, made as the MCP endpoint makes its stateless sessions; the session's answer comes to a
``_RestExchange``, which reshapes it into the REST answer. The session speaks no MCP revision, so a tool is asked nothing (it gets the refusal
every client that cannot be asked gets) and its progress goes nowhere.

The endpoint (``transports/http.py``) routes ``/api/tools…`` here once a request has passed its
checks (the token, ``Host``, ``Origin``), which are the MCP endpoint's. This module never imports
it: it is handed the two things it needs (making a session, running a task).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import unquote_to_bytes

import msgspec
from msgspec import UNSET, UnsetType

from atomictools._protocol import INTERNAL_ERROR, INVALID_PARAMS, INVALID_REQUEST, METHOD_NOT_FOUND, PARSE_ERROR
from atomictoolsd.config.suggest import unknown_tool
from atomictoolsd.protocol import INVALID_ARGUMENTS, well_formed_json
from atomictoolsd.sessions.messages import CallParams, clip

if TYPE_CHECKING:
    from atomictoolsd.sessions.session import Session
    from atomictoolsd.transports.http1 import Refusal, Request, Response

__all__ = ["PREFIX", "RestApi", "RestSession"]

PREFIX = b"/api/tools"
SOURCES = {"builtin": "builtin", "global": "global", "local": "project"}  # the registry's scope → source
_JSON_HEAD = b"content-type: application/json\r\n"
_JSON = b"application/json"
_RELOAD = "reload"

_encode = msgspec.json.encode
_ids = itertools.count(1)

# (what the route does, the tool it names): "list", "tool" (or reload, on a POST), "call".
Route = tuple[str, str]


class RestSession(Protocol):
    """What the API uses of a session over HTTP (``transports.http.HttpSession``)."""

    open: bool
    exchanges: dict[bytes, Any]
    used: float
    core: Session

    def end(self) -> None: ...


class _RpcError(msgspec.Struct):
    code: int = INTERNAL_ERROR
    message: str = ""
    data: Any = None


class _Answer(msgspec.Struct):
    result: msgspec.Raw | UnsetType = UNSET
    error: _RpcError | UnsetType = UNSET


class _Text(msgspec.Struct):
    text: str = ""


class _ErrorResult(msgspec.Struct):
    content: list[_Text] = []
    isError: bool = False  # noqa: N815 - the wire name


class RestApi:
    """The routes under ``/api/tools`` and the sessions they use, one per query string."""

    def __init__(self, new_session: Callable[[bytes, bool], Coroutine[Any, Any, Any]],
                 spawn: Callable[[Coroutine[Any, Any, None]], None]) -> None:
        self._new_session = new_session  # (query string, stateful) → a session, or why there is none
        self._spawn = spawn
        self.sessions: dict[bytes, RestSession] = {}  # by query string

    @staticmethod
    def serves(path: bytes) -> bool:
        """Whether ``path`` is one of this API's routes (any other path is the endpoint's 404)."""
        return _route(path) is not None

    def head(self, request: Request, max_body: int) -> Refusal | None:
        """A request refused on its method, media type or length (after the endpoint's checks)."""
        what, name = _route(request.path) or ("list", "")
        allowed = (b"GET", b"POST") if what == "tool" and name == _RELOAD else _ALLOWED[what]
        method = request.method
        if method not in allowed:
            listed = b", ".join(allowed)
            return _refusal(405, INVALID_REQUEST, f"Method {method.decode('latin-1')} not allowed here: use {listed.decode()}",
                            b"allow: " + listed + b"\r\n")
        if method != b"POST":
            return None
        headers = request.headers
        content_type = headers.get(b"content-type")
        length = headers.get(b"content-length")
        has_body = (length is not None and length.strip() not in (b"", b"0")) or b"transfer-encoding" in headers
        if (content_type is not None or has_body) and (content_type or b"").split(b";")[0].strip().lower() != _JSON:
            return _refusal(415, INVALID_REQUEST, "Unsupported media type: send the arguments as Content-Type: application/json")
        if length is not None and length.isdigit() and int(length) > max_body:
            return _refusal(413, INVALID_REQUEST, f"Message too large: the limit is {max_body} bytes (ATOMICTOOLS_MAX_MESSAGE_BYTES)")
        return None

    def handle(self, request: Request, response: Response) -> None:
        route = _route(request.path)
        assert route is not None  # head() let only this API's routes through
        what, name = route
        if what == "tool" and request.method == b"POST":
            what = _RELOAD
        if what == "call":
            body, problem = _arguments(request.body.strip() or b"{}")
            if problem:
                response.send(*problem)
                return
            method, params = "tools/call", CallParams(name, msgspec.Raw(body))
        else:
            method, params = ("atomic/reload" if what == _RELOAD else "atomic/list"), UNSET
        exchange = _RestExchange(what, name, method, params, response)
        session = self.sessions.get(request.query)
        if session is not None and session.open:
            exchange.send(session)
        else:
            self._spawn(self._open(request.query, exchange))

    async def _open(self, query: bytes, exchange: _RestExchange) -> None:
        made = await self._new_session(query, False)
        if isinstance(made, str):
            exchange.response.send(*_refusal(400, INVALID_REQUEST, made))
            return
        existing = self.sessions.get(query)
        if existing is not None and existing.open:
            made.end()  # another request for this query made one meanwhile
            made = existing
        else:
            self.sessions[query] = made
        exchange.send(made)

    def end(self) -> None:
        for session in self.sessions.values():
            session.end()
        self.sessions.clear()


_ALLOWED = {"list": (b"GET",), "tool": (b"GET",), "call": (b"POST",)}


def _route(path: bytes) -> Route | None:
    """What ``path`` asks for, or None when it is no route of this API."""
    if b"%" in path:
        path = unquote_to_bytes(path)
    if len(path) > len(PREFIX) and path.endswith(b"/"):
        path = path[:-1]
    if path == PREFIX:
        return ("list", "")
    if not path.startswith(PREFIX + b"/"):
        return None
    parts = path[len(PREFIX) + 1 :].split(b"/")
    name = parts[0].decode("utf-8", "replace")
    if not name or len(parts) > 2 or (len(parts) == 2 and parts[1] != b"call"):
        return None
    return ("call" if len(parts) == 2 else "tool", name)


def _arguments(body: bytes) -> tuple[bytes, Refusal | None]:
    """The body of a call as the tool's arguments, and a 400 when it is not a JSON object. Checked
    without building it: the worker reads the arguments, against the tool's schema. A lone surrogate
    escape (half a character, as JavaScript writes one) becomes U+FFFD."""
    try:
        arguments = _decode_raw(body)
    except msgspec.DecodeError as exc:
        repaired = well_formed_json(body)
        if repaired is None:
            return body, _refusal(400, PARSE_ERROR, f"Parse error: the body is not JSON: {exc}")
        return _arguments(repaired)
    except (UnicodeDecodeError, RecursionError) as exc:
        return body, _refusal(400, PARSE_ERROR, f"Parse error: the body is not JSON: {exc}")
    if memoryview(arguments)[:1] != b"{":
        return body, _refusal(400, INVALID_PARAMS, "Invalid arguments: the body must be a JSON object of the tool's arguments")
    return body, None


_decode_raw = msgspec.json.Decoder(msgspec.Raw).decode


class _RestExchange:
    """One REST request waiting for its session's answer, which it reshapes into the REST answer.

    It stands in the session's exchanges as the MCP endpoint's exchanges do; it takes no stream
    (``streams``): a tool's progress and logs have nowhere to go, and its questions are refused."""

    __slots__ = ("client_id", "internal", "method", "name", "params", "response", "session", "what")
    streams = False

    def __init__(self, what: str, name: str, method: str, params: CallParams | UnsetType, response: Response) -> None:
        self.what = what
        self.name = name
        self.method = method
        self.params = params
        self.response = response
        self.session: RestSession | None = None
        self.internal = self.client_id = b"null"

    def send(self, session: RestSession) -> None:
        """Hand the request to ``session``."""
        if self.response.done:
            return  # the client went away while its session was being made
        self.session = session
        session.used = time.monotonic()
        internal = self.internal = self.client_id = _internal_id(session.exchanges)
        session.exchanges[internal] = self
        self.response.on_gone = self.gone
        session.core.handle_request(internal, self.method, self.params)

    def push(self, message: bytes, final: bool = False) -> None:
        if not final:
            return  # a notification of the call's: a REST client has no stream to take it
        self._leave()
        try:
            answer = msgspec.json.decode(message, type=_Answer)
        except msgspec.MsgspecError:
            answer = _Answer(error=_RpcError(message="the daemon's answer could not be read"))
        if answer.error is not UNSET:
            error = answer.error
            self.response.send(_status(error), _JSON_HEAD, _error_body(error.code, error.message, error.data))
        else:
            self.response.send(*self._shape(bytes(answer.result)))

    def gone(self) -> None:
        """The client went away before the answer: its call stops, as an MCP client's does."""
        session = self.session
        if session is not None and session.exchanges.pop(self.internal, None) is not None:
            session.used = time.monotonic()
            session.core.cancel(self.internal)

    def drop(self) -> None:
        """No answer will come: the session ended (the daemon stops)."""
        self._leave()
        self.response.send(*_refusal(503, INTERNAL_ERROR, "The daemon is stopping: try again once it runs"))

    def _leave(self) -> None:
        session = self.session
        if session is not None:
            session.exchanges.pop(self.internal, None)
            session.used = time.monotonic()

    def _shape(self, result: bytes) -> tuple[int, bytes, bytes]:
        if self.what == "call":
            invalid = _invalid_arguments(result)
            if invalid:
                return 400, _JSON_HEAD, _error_body(INVALID_PARAMS, invalid, {"name": self.name})
            return 200, _JSON_HEAD, result  # the CallToolResult as MCP gives it
        if self.what == _RELOAD:
            return 200, _JSON_HEAD, result  # {success, toolCount, errors, …}
        listing = msgspec.json.decode(result)
        tools = [_tool(entry) for entry in listing.get("tools", [])]
        if self.what == "list":
            return 200, _JSON_HEAD, _encode({"tools": tools, "counts": _counts(tools), "errors": listing.get("errors", []),
                                             "blocked": listing.get("blocked", [])})
        found = next((tool for tool in tools if tool["name"] == self.name), None)
        if found is not None:
            return 200, _JSON_HEAD, _encode(found)
        message, data = unknown_tool(self.name, [t["name"] for t in tools], listing.get("errors", []),
                                     listing.get("blocked", []))
        return 404, _JSON_HEAD, _error_body(INVALID_PARAMS, message, data)


def _tool(entry: dict[str, Any]) -> dict[str, Any]:
    """A tool of ``atomic/list`` as the REST API lists it: its MCP definition, ``source``, ``file``, ``kind``."""
    tool = {k: v for k, v in entry.items() if k not in ("scope", "source", "path", "kind", "confined")}
    tool["source"] = SOURCES.get(entry.get("scope", ""), entry.get("scope", ""))
    tool["file"] = entry.get("path")
    tool["kind"] = entry.get("kind")
    return tool


def _counts(tools: list[dict[str, Any]]) -> dict[str, int]:
    """How many tools, in all and by source; ``declarative``: those of declarative (JSON) files."""
    counts = {"total": len(tools), "builtin": 0, "global": 0, "project": 0, "declarative": 0}
    for tool in tools:
        counts[tool["source"]] = counts.get(tool["source"], 0) + 1
        if tool["kind"] == "declarative":
            counts["declarative"] += 1
    return counts


def _invalid_arguments(result: bytes) -> str:
    """The message of a result that refused the call's arguments (they do not fit the tool's schema), else ""."""
    if result.find(b'"isError":true') < 0:  # find, not ``in``: see sessions/connection.py
        return ""
    try:
        content = msgspec.json.decode(result, type=_ErrorResult).content
    except msgspec.MsgspecError:
        return ""
    text = content[0].text if content else ""
    return text if text.startswith(INVALID_ARGUMENTS + " ") else ""


def _status(error: _RpcError) -> int:
    """The HTTP status of a JSON-RPC error: an unknown tool 404, one the URL's lists hide 403, bad
    params or a bad request 400, an unknown method 404, a fault of the daemon's 500."""
    data = error.data
    if error.code == INVALID_PARAMS:
        if isinstance(data, dict) and ("suggestions" in data or "loadError" in data):
            return 404
        return 403 if isinstance(data, dict) and set(data) == {"name"} else 400
    if error.code in (INVALID_REQUEST, PARSE_ERROR):
        return 400
    if error.code == METHOD_NOT_FOUND:
        return 404
    return 500 if error.code == INTERNAL_ERROR else 503


def _error_body(code: int, message: str, data: Any = None) -> bytes:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return _encode({"error": error})


def _refusal(status: int, code: int, message: str, headers: bytes = b"") -> Refusal:
    return status, _JSON_HEAD + headers, _error_body(code, clip(message, 2000))


def _internal_id(exchanges: dict[bytes, Any]) -> bytes:
    """An id for a REST request in its session, never one a request in flight there has."""
    while True:
        internal = b'"r%d"' % next(_ids)
        if internal not in exchanges:
            return internal
