"""The ``http`` handler: one HTTP request from a URL template; the status and body are the result.

Only ``http`` and ``https`` URLs are requested, checked after the parameters are filled in, and
redirects are not followed (a redirect is answered as it is, with its status), so a call can never
reach a ``file:``, ``ftp:`` or other URL. A placeholder at the very start of the URL takes a base URL
as it is (``{{url}}/health``); every other placeholder is percent-encoded, so a value can never add
a path segment, a query parameter or a fragment the template did not write, nor change the scheme,
host or port. A value that would make a path segment ``.`` or ``..`` (in any spelling a server may
decode: ``%2e``, a backslash, a ``%2F`` inside it) is refused, since a server that resolves dot
segments would drop a segment of the path the template wrote.

Arguments that no placeholder uses become the JSON body of a POST or PUT, or query parameters of a
GET. The timeout bounds the whole exchange, however the server paces it: the request runs in a
thread of its own and the call answers at the deadline (name resolution, connecting, TLS, a server
dripping its headers or body byte by byte), shutting the connection down behind it; the worker is
never held past it.

Runs inside a worker; the standard library and msgspec only.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Mapping
from typing import Annotated, Any

import msgspec

from atomictools._authoring import Context
from atomictools._errors import ToolError
from atomictoolsd import __version__
from atomictoolsd.worker.declarative.handler import Handler, TimeoutMs
from atomictoolsd.worker.declarative.templates import (
    PLACEHOLDER,
    TemplateError,
    ValueRejected,
    placeholders,
    value_text,
)

__all__ = ["HttpHandler"]

DEFAULT_TIMEOUT_MS = 30_000
_POLL = 0.1  # seconds between checks for cancellation while the request runs
MAX_BODY_BYTES = 16 * 1024 * 1024
METHODS = ("GET", "POST", "PUT")
SCHEMES = ("http", "https")


class HttpHandler(Handler, tag="http"):
    """``{"type": "http", "url": "...", "method": "GET", "headers": {...}, "timeout": ms}``."""

    url: Annotated[str, msgspec.Meta(description="an http or https URL, or one that starts with {{placeholder}}")]
    method: Annotated[str, msgspec.Meta(description=f"one of {', '.join(METHODS)}")] = "GET"
    headers: Annotated[dict[str, str], msgspec.Meta(description="an object of strings")] = {}
    timeout: TimeoutMs = DEFAULT_TIMEOUT_MS

    def __post_init__(self) -> None:
        self.url = self.url.strip()
        if not self.url:
            raise TemplateError("handler.url must be a non-empty string")
        self.base_param: str | None = None
        first = PLACEHOLDER.match(self.url)
        if first is not None:
            self.base_param = first.group(1)  # checked at call time, once it is a real URL
        else:
            scheme = urllib.parse.urlsplit(self.url).scheme.lower()
            if scheme not in SCHEMES:
                raise TemplateError(f"handler.url must be an http or https URL, not {scheme or 'a relative URL'!r}")
        if self.method.upper() not in METHODS:
            raise TemplateError(f"handler.method must be one of {', '.join(METHODS)}")
        self.method = self.method.upper()
        for key in self.headers:
            if PLACEHOLDER.search(key) or not key or any(c in key for c in " :\r\n\t"):
                raise TemplateError(f"handler.headers: {key!r} is not a valid header name")
        self.seconds = int(self.timeout) / 1000
        self.params = placeholders(self.url + "".join(self.headers.values()))

    def default_annotations(self) -> dict[str, Any]:
        return {"openWorldHint": True, **({"readOnlyHint": True} if self.method == "GET" else {})}

    def build_url(self, args: Mapping[str, Any]) -> str:
        """The URL for one call. Raises ``ToolError`` when it is not an http(s) URL or a value is refused."""

        path_end = _path_end(self.url)
        filled: list[tuple[str, int, int]] = []  # (name, start, end) of each value in the path
        pieces: list[str] = []
        at = 0
        length = 0
        try:
            for match in PLACEHOLDER.finditer(self.url):
                literal = self.url[at:match.start()]
                pieces.append(literal)
                length += len(literal)
                name = match.group(1)
                if args.get(name) is None:
                    raise ToolError(f"Missing a value for {{{{{name}}}}} in the URL")
                text = value_text(name, args[name])
                if match.start() != 0:  # not the base URL, which is checked whole below
                    text = urllib.parse.quote(text, safe="")
                    if match.start() < path_end:
                        filled.append((name, length, length + len(text)))
                pieces.append(text)
                length += len(text)
                at = match.end()
        except ValueRejected as exc:
            raise ToolError(f"Refused: {exc}") from None
        pieces.append(self.url[at:])
        url = "".join(pieces)
        _check_dot_segments(url, filled)
        if any(ord(c) < 0x21 or c == "\x7f" for c in url):
            raise ToolError("Refused: the URL contains whitespace or control characters")
        parts = urllib.parse.urlsplit(url)
        if parts.scheme.lower() not in SCHEMES:
            raise ToolError(
                f"Refused: only http and https URLs may be requested, not {parts.scheme or 'a relative URL'!r}"
            )
        if not parts.hostname:
            raise ToolError(f"Refused: {url!r} names no host")
        if parts.username is not None or parts.password is not None:
            raise ToolError("Refused: credentials in the URL are not supported; send them in a header")
        return url

    def __call__(self, tool: str, args: dict[str, Any], ctx: Context) -> str:
        url = self.build_url(args)
        headers = {"User-Agent": f"atomictoolsd/{__version__}", "Accept": "*/*"}
        try:
            for key, template in self.headers.items():
                value = PLACEHOLDER.sub(lambda m: value_text(m.group(1), args.get(m.group(1))), template)
                if any(c in value for c in "\r\n"):
                    raise ToolError(f"Refused: header {key!r} would contain a line break")
                headers[key] = value
        except ValueRejected as exc:
            raise ToolError(f"Refused: {exc}") from None
        rest = {k: v for k, v in args.items() if k not in self.params}
        body = None
        if self.method in ("POST", "PUT"):
            body = json.dumps(rest, ensure_ascii=False).encode()
            headers.setdefault("Content-Type", "application/json")
        elif rest:
            query = urllib.parse.urlencode(
                {k: v if isinstance(v, (str, int, float)) else json.dumps(v) for k, v in rest.items()}
            )
            url += ("&" if urllib.parse.urlsplit(url).query else "?") + query
        status, reason, data = self._request(url, body, headers, ctx)
        text = f"HTTP {status} {reason}\n\n{data.decode('utf-8', 'replace')}".rstrip()
        if not 200 <= status < 300:
            raise ToolError(text)
        return text

    def _request(self, url: str, body: bytes | None, headers: dict[str, str], ctx: Context) -> tuple[int, str, bytes]:
        """The exchange, in a thread of its own so that the deadline holds whatever the server does."""
        host = urllib.parse.urlsplit(url).hostname
        assert self.seconds is not None
        deadline = time.monotonic() + self.seconds
        outcome: list[Any] = []
        conns: list[http.client.HTTPConnection] = []
        done = threading.Event()

        def exchange() -> None:
            try:
                outcome.append(self._exchange(url, body, headers, deadline, conns))
            except BaseException as exc:  # handed to the caller's thread
                outcome.append(exc)
            finally:
                done.set()

        threading.Thread(target=exchange, name="http-request", daemon=True).start()
        while not done.wait(min(max(deadline - time.monotonic(), 0), _POLL)):
            if ctx.cancelled or time.monotonic() >= deadline:
                for conn in conns:
                    _abort(conn)
                if ctx.cancelled:
                    raise ToolError(f"HTTP request to {host} cancelled")
                raise ToolError(f"HTTP request to {host} timed out after {self.seconds:g} s")
        result = outcome[0]
        if isinstance(result, BaseException):
            raise result
        return result  # type: ignore[no-any-return]

    def _exchange(
        self, url: str, body: bytes | None, headers: dict[str, str], deadline: float,
        conns: list[http.client.HTTPConnection],
    ) -> tuple[int, str, bytes]:
        parts = urllib.parse.urlsplit(url)
        target = parts.path or "/"
        if parts.query:
            target += "?" + parts.query
        conn: http.client.HTTPConnection
        if parts.scheme.lower() == "https":
            conn = http.client.HTTPSConnection(
                parts.hostname, parts.port, timeout=self.seconds, context=ssl.create_default_context()
            )
        else:
            conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=self.seconds)
        conns.append(conn)
        try:
            conn.request(self.method, target, body=body, headers=headers)
            _limit(conn, deadline)
            response = conn.getresponse()
            chunks: list[bytes] = []
            size = 0
            while True:
                _limit(conn, deadline)
                chunk = response.read1(65536) if hasattr(response, "read1") else response.read(65536)
                if not chunk:
                    break
                size += len(chunk)
                if size > MAX_BODY_BYTES:
                    raise ToolError(f"The response body is larger than {MAX_BODY_BYTES} bytes; not read")
                chunks.append(chunk)
            return response.status, response.reason, b"".join(chunks)
        except TimeoutError:
            raise ToolError(f"HTTP request to {parts.hostname} timed out after {self.seconds:g} s") from None
        except (OSError, http.client.HTTPException, ValueError) as exc:
            raise ToolError(f"HTTP request to {parts.hostname} failed: {type(exc).__name__}: {exc}") from None
        finally:
            conn.close()


def _limit(conn: http.client.HTTPConnection, deadline: float) -> None:
    """Let the next socket operation wait only until the request's deadline."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise TimeoutError
    if conn.sock is not None:
        conn.sock.settimeout(remaining)


def _abort(conn: http.client.HTTPConnection) -> None:
    """Wake the request's thread out of a blocked read: shut the socket down (its thread closes it)."""
    sock = conn.sock
    if sock is not None:
        try:
            socket.socket.shutdown(sock, socket.SHUT_RDWR)  # the plain socket's, also under TLS
        except OSError:
            pass


def _path_end(template: str) -> int:
    """Where the path of a URL (or its template) ends: at its query or fragment. Values never hold
    ``?`` or ``#`` (they are encoded), so these are the template's."""
    ends = [i for i in (template.find("?"), template.find("#")) if i >= 0]
    return min(ends) if ends else len(template)


def _check_dot_segments(url: str, filled: list[tuple[str, int, int]]) -> None:
    """Refuse a value that makes a path segment empty, ``.`` or ``..``, as any server may read it.

    A segment is read the ways servers read one: percent-decoded (once and again, for a server that
    decodes twice), split at ``/`` and ``\\``, cut at ``;`` (path parameters) and NUL, trailing dots
    and spaces dropped (Windows). Encoding the dots would not do: ``%2E%2E`` is ``..`` to a WHATWG
    URL parser and to any server that decodes before it resolves dot segments.
    """
    start = 0
    for segment in url[:_path_end(url)].split("/"):
        end = start + len(segment)
        names = [name for name, a, b in filled if a <= end and b >= start]
        if names:
            what = "empty" if not segment else None
            text = segment
            for _ in range(3):
                for part in text.replace("\\", "/").split("/"):
                    core = part.split(";")[0].split("\x00")[0]
                    if core and not core.strip(". "):
                        what = repr(core)
                text = urllib.parse.unquote(text)
            if what is not None:
                raise ToolError(
                    f"Refused: the value of {{{{{names[0]}}}}} would make a URL path segment {what}, which a server "
                    "reads as removing or merging a segment of the path. A value in the path cannot be empty, "
                    "'.' or '..' (nor hold them between slashes or backslashes, encoded or not); send another value"
                )
        start = end + 1
