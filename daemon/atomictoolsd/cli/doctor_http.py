"""``doctor``'s checks of an entry that connects by URL (``connect --http``), made as the agent will
use it: the entry's shape is the one the agent reads, the token reference names a variable the agent
expands and that holds the daemon's token, and the endpoint answers ``initialize`` and ``tools/list``
at the entry's own URL (its query's project included) with the daemon's token.

Sends MCP to the URL only when it is this daemon's endpoint (the host and port ``status`` shows),
and never sends the token anywhere else; changes nothing.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from atomictoolsd.bridges import agents
from atomictoolsd.cli._common import safe

__all__ = ["EntryUrl", "check_http", "is_our_url", "token_of"]

TIMEOUT = 20.0
_LOOPBACK = {"127.0.0.1", "localhost", "::1"}


class EntryUrl:
    """An entry's URL, split into what doctor checks."""

    def __init__(self, url: str) -> None:
        self.url = url
        parts = urlsplit(url)
        self.scheme, self.host, self.path = parts.scheme, parts.hostname or "", parts.path
        try:
            self.port = parts.port
        except ValueError:
            self.port = None
        query = parse_qs(parts.query)
        self.directory = (query.get("directory") or [None])[-1]
        self.allow = [g for value in query.get("allow", []) for g in value.split(",") if g]
        self.deny = [g for value in query.get("deny", []) for g in value.split(",") if g]
        self.dispatcher = (query.get("dispatcher") or ["0"])[-1] in ("1", "true", "yes")

    def same_endpoint(self, other: str | None) -> bool:
        """Whether ``other`` (the daemon's URL) is this URL's host, port and path."""
        if not other:
            return False
        theirs = EntryUrl(other)
        return (self.scheme, self.port, self.path) == (theirs.scheme, theirs.port, theirs.path) and (
            self.host == theirs.host or {self.host, theirs.host} <= _LOOPBACK)


def is_our_url(agent: str, entry: dict[str, Any], daemon_url: str | None) -> bool:
    """Whether a URL entry is ours: it names this daemon's endpoint, or (when the daemon does not
    say where it serves) a loopback ``/mcp`` whose token comes from ``ATOMICTOOLS_TOKEN``."""
    url = EntryUrl(agents.entry_url(entry) or "")
    if url.scheme != "http" or url.path != "/mcp":
        return False
    if url.same_endpoint(daemon_url):
        return True
    return url.host in _LOOPBACK and agents.token_source(agent, entry).variable == agents.TOKEN_VARIABLE


def token_of(http: Mapping[str, Any] | None) -> str | None:
    """The daemon's token, from the file its status names."""
    from atomictoolsd.transports.http import read_token  # lazy: only doctor's HTTP checks pay for it

    path = (http or {}).get("tokenFile")
    return read_token(Path(path)) if path else None


def check_http(report: Any, entry: dict[str, Any], http: Mapping[str, Any] | None, environ: Mapping[str, str],
               reconnect: str) -> bool:
    """The checks of a URL entry, added to ``report``; whether the entry is one the agent can use at
    all (the checks of the project and of re-listing follow then)."""
    agent = report.agent
    url = EntryUrl(agents.entry_url(entry) or "")
    problem = _shape_problem(agent, entry)
    if problem:
        report.add("entry", False, f"server {report.server!r} is malformed: {problem}", reconnect)
        return False
    report.add("entry", True, f"server {report.server!r}: {safe(url.url)}")
    token = token_of(http)
    _check_token(report, agents.token_source(agent, entry), token, environ, reconnect)
    _check_endpoint(report, url, http, token, reconnect)
    return True


def _shape_problem(agent: str, entry: dict[str, Any]) -> str | None:
    """Why ``agent`` would not use ``entry`` as a Streamable HTTP server, or None."""
    try:
        expected = agents.http_entry(agent, "")
    except agents.AgentConfigError as exc:
        return str(exc)
    key = "httpUrl" if "httpUrl" in expected else "url"
    if not isinstance(entry.get(key), str):
        other = "url" if key == "httpUrl" else "httpUrl"
        return (f'{agents.INFO[agent].title} reads "{other}" as another transport (SSE); the daemon serves '
                f'Streamable HTTP: "{key}"') if other in entry else f'"{key}" must be the URL'
    if "type" in expected and entry.get("type") != expected["type"]:
        return f'"type" is {entry.get("type")!r}, not {expected["type"]!r} (Streamable HTTP)'
    if agent == "copilot" and not entry.get("tools"):
        return 'Copilot CLI needs "tools" (["*"]) to offer any tool'
    return None


def _check_token(report: Any, source: agents.TokenSource, token: str | None, environ: Mapping[str, str],
                 reconnect: str) -> None:
    title = report.title
    if source.problem:
        report.add("token", False, source.problem, reconnect)
        return
    if source.literal is not None:
        same = token is not None and source.literal == token
        report.add("token", same, "the entry holds the daemon's token itself (keep the file out of a shared "
                   "repository)" if same else "the entry holds a token that is not the daemon's (rotated?)", reconnect)
        return
    variable = source.variable or agents.TOKEN_VARIABLE
    export = f"export {variable}=$(atomictoolsd http token --show)   (where {title} starts: its shell or profile)"
    value = environ.get(variable)
    where = f"{title} reads ${variable} from ITS environment, not doctor's: set it where {title} starts"
    if value is None:
        report.add("token", False, f"${variable} is not set here, so it is surely not set for {title} started from "
                                   f"here ({where})", export)
    elif token is not None and value.strip() != token:
        report.add("token", False, f"${variable} is set here but is not the daemon's token (rotated since?); {where}",
                   export)
    else:
        report.add("token", True, f"${variable} holds the daemon's token here; {where}")


def _check_endpoint(report: Any, url: EntryUrl, http: Mapping[str, Any] | None, token: str | None,
                    reconnect: str) -> None:
    """initialize and tools/list at the entry's URL, with the daemon's token."""
    if http is None:
        report.add("endpoint", False, "your CLI reaches no daemon", "atomictoolsd start --http "
                   f"{url.port}" if url.port else "atomictoolsd start")
        return
    served = http.get("url")
    if not served:
        restart = f"atomictoolsd restart --http {url.port}" if url.port else reconnect
        report.add("endpoint", False, "the daemon does not serve HTTP" + (f": {http['error']}" if http.get("error")
                   else ""), f"{restart}   (or the http setting in config.toml)")
        return
    if not url.same_endpoint(served):
        report.add("endpoint", False, f"the daemon serves HTTP at {safe(served)}, not at {safe(url.url)}", reconnect)
        return
    if url.directory is not None and not os.path.isdir(url.directory):
        report.add("endpoint", False, f"the URL's project {safe(url.directory)} is not a directory (the daemon "
                   "answers 400)", f"{reconnect}   (run it in the project, or add -C PROJECT)")
        return
    if token is None:
        report.add("endpoint", False, f"no readable token in {safe(http.get('tokenFile'))}",
                   "atomictoolsd http token --rotate")
        return
    answer = exchange(url.url, token)
    if isinstance(answer, str):
        report.add("endpoint", False, f"{safe(url.url)}: {answer}", reconnect)
        return
    names = [t.get("name") for t in answer.get("tools", []) if isinstance(t, dict)]
    project = f"for {url.directory}" if url.directory else "for no project (global tools)"
    report.add("endpoint", True, f"initialize answered and {len(names)} tools listed {project}, by your CLI's daemon")


def exchange(url: str, token: str) -> dict[str, Any] | str:
    """``initialize``, ``notifications/initialized`` and ``tools/list`` over Streamable HTTP, as an
    agent sends them; the list's result, or what went wrong in words. The session is ended after."""
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json",
               "Accept": "application/json, text/event-stream"}
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "doctor", "version": "1"}}}
    answer = _post(url, headers, initialize)
    if isinstance(answer, str):
        return answer
    message, session = answer
    if "result" not in message:
        return f"initialize was refused: {message.get('error')}"
    headers.update({"Mcp-Session-Id": session or "", "MCP-Protocol-Version": message["result"].get("protocolVersion",
                                                                                                  "2025-06-18")})
    try:
        _post(url, headers, {"jsonrpc": "2.0", "method": "notifications/initialized"})
        listed = _post(url, headers, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
    finally:
        _request(url, headers, None, "DELETE")
    if isinstance(listed, str):
        return listed
    if "result" not in listed[0]:
        return f"tools/list was refused: {listed[0].get('error')}"
    return dict(listed[0]["result"])


def _post(url: str, headers: dict[str, str], message: dict[str, Any]) -> tuple[dict[str, Any], str | None] | str:
    """One POST; the JSON-RPC answer (JSON or the SSE stream's) and the session id, or why none came."""
    reply = _request(url, headers, json.dumps(message).encode(), "POST")
    if isinstance(reply, str):
        return reply
    status, reply_headers, body = reply
    if "id" not in message:
        return {}, None
    if reply_headers.get("content-type", "").startswith("text/event-stream"):
        lines = [line[5:].strip() for line in body.decode(errors="replace").splitlines() if line.startswith("data:")]
        answers = [m for m in (_json(line) for line in lines) if isinstance(m, dict) and m.get("id") == message["id"]]
        decoded: Any = answers[-1] if answers else None
    else:
        decoded = _json(body.decode(errors="replace"))
    if not isinstance(decoded, dict):
        return f"HTTP {status} with no JSON-RPC answer"
    return decoded, reply_headers.get("mcp-session-id")


def _request(url: str, headers: dict[str, str], body: bytes | None, method: str) -> tuple[int, dict[str, str], bytes] | str:
    request = urllib.request.Request(url, data=body, headers=headers, method=method)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never through a proxy
    try:
        with opener.open(request, timeout=TIMEOUT) as response:
            return response.status, {k.lower(): v for k, v in response.headers.items()}, response.read()
    except urllib.error.HTTPError as exc:
        detail = _json(exc.read().decode(errors="replace"))
        message = (detail.get("error") or {}).get("message") if isinstance(detail, dict) else None
        return f"HTTP {exc.code}" + (f": {message}" if message else f" {exc.reason}")
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return f"no answer ({reason})"


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None
