"""The ``http`` handler: one HTTP request from a URL template; the status and body are the result.

Only ``http`` and ``https`` URLs are requested, checked after the parameters are filled in, and
redirects are not followed (a redirect is answered as it is, with its status), so a call can never
reach a ``file:``, ``ftp:`` or other URL. A placeholder at the very start of the URL takes a base URL
as it is (``{{url}}/health``); every other placeholder is percent-encoded, so a value can never add
a path segment, a query parameter or a fragment the template did not write.

Arguments that no placeholder uses become the JSON body of a POST or PUT, or query parameters of a
GET. The timeout bounds the whole request: connecting, sending, waiting and reading the body.

Runs inside a worker; standard library only.
"""

from __future__ import annotations

import http.client
import json
import ssl
import time
import urllib.parse
from collections.abc import Mapping
from typing import Any

from atomictools._authoring import Context
from atomictools._errors import ToolError
from atomictoolsd import __version__
from atomictoolsd.declarative.shell import timeout_ms
from atomictoolsd.declarative.templates import PLACEHOLDER, TemplateError, ValueRejected, placeholders, value_text

__all__ = ["HttpHandler"]

DEFAULT_TIMEOUT_MS = 30_000
MAX_BODY_BYTES = 16 * 1024 * 1024
METHODS = ("GET", "POST", "PUT")
SCHEMES = ("http", "https")


class HttpHandler:
    """``{"type": "http", "url": "...", "method": "GET", "headers": {...}, "timeout": ms}``."""

    KEYS = frozenset({"type", "url", "method", "headers", "timeout"})

    def __init__(self, handler: Mapping[str, Any]) -> None:
        url = handler.get("url")
        if not isinstance(url, str) or not url.strip():
            raise TemplateError("handler.url must be a non-empty string")
        self.url = url.strip()
        self.base_param: str | None = None
        first = PLACEHOLDER.match(self.url)
        if first is not None:
            self.base_param = first.group(1)  # checked at call time, once it is a real URL
        else:
            scheme = urllib.parse.urlsplit(self.url).scheme.lower()
            if scheme not in SCHEMES:
                raise TemplateError(f"handler.url must be an http or https URL, not {scheme or 'a relative URL'!r}")
        method = handler.get("method", "GET")
        if not isinstance(method, str) or method.upper() not in METHODS:
            raise TemplateError(f"handler.method must be one of {', '.join(METHODS)}")
        self.method = method.upper()
        headers = handler.get("headers", {})
        if not isinstance(headers, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
        ):
            raise TemplateError("handler.headers must be an object of strings")
        for key in headers:
            if PLACEHOLDER.search(key) or not key or any(c in key for c in " :\r\n\t"):
                raise TemplateError(f"handler.headers: {key!r} is not a valid header name")
        self.headers: dict[str, str] = headers
        self.timeout = timeout_ms(handler, DEFAULT_TIMEOUT_MS) / 1000
        self.params = placeholders(self.url + "".join(headers.values()))

    def build_url(self, args: Mapping[str, Any]) -> str:
        """The URL for one call. Raises ``ToolError`` when it is not an http(s) URL or a value is refused."""

        def fill(match: Any) -> str:
            name = match.group(1)
            if args.get(name) is None:
                raise ToolError(f"Missing a value for {{{{{name}}}}} in the URL")
            text = value_text(name, args[name])
            if match.start() == 0:
                return text  # the base URL: checked whole below
            return urllib.parse.quote(text, safe="")

        try:
            url = PLACEHOLDER.sub(fill, self.url)
        except ValueRejected as exc:
            raise ToolError(f"Refused: {exc}") from None
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
        status, reason, data = self._request(url, body, headers)
        text = f"HTTP {status} {reason}\n\n{data.decode('utf-8', 'replace')}".rstrip()
        if not 200 <= status < 300:
            raise ToolError(text)
        return text

    def _request(self, url: str, body: bytes | None, headers: dict[str, str]) -> tuple[int, str, bytes]:
        parts = urllib.parse.urlsplit(url)
        deadline = time.monotonic() + self.timeout
        target = parts.path or "/"
        if parts.query:
            target += "?" + parts.query
        conn: http.client.HTTPConnection
        if parts.scheme.lower() == "https":
            conn = http.client.HTTPSConnection(
                parts.hostname, parts.port, timeout=self.timeout, context=ssl.create_default_context()
            )
        else:
            conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=self.timeout)
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
            raise ToolError(f"HTTP request to {parts.hostname} timed out after {self.timeout:g} s") from None
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
