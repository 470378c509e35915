"""Where a session's messages go: the ``Output`` a session is built with, which each wire implements.

A ``session.Session`` knows no wire. It is handed decoded messages (``handle_message``,
``handle_request``, ``handle_notification``) and writes what it says to its ``Output``: the answer
to a request (``result``, ``error``), a request of its own (a tool's question: ``request``), and a
notification. ``connection.Connection`` is the Unix socket's (one NDJSON line each), the HTTP
transport's ``HttpOutput`` hands each to the exchange of the request it belongs to
(``transports/http.py``); a test drives a session through one of its own.

Ids are JSON text, as the session keys its requests by them (``b'7'``, ``b'"a"'``). ``about`` is
the id of the request a message belongs to (a call's progress, logs and questions; the
notifications of a ``subscriptions/listen``), or None when it belongs to none of them (a list
change, a log of the daemon's). A wire that carries one stream (the socket) writes every message
alike; one with a stream per request (HTTP) sends each where ``about`` says.
"""

from __future__ import annotations

from typing import Any, Protocol

import msgspec

from atomictoolsd.config.discovery import escape_strings

__all__ = ["Output", "encode_error", "encode_report"]

_encode = msgspec.json.encode


class Output(Protocol):
    """What a session writes to, and the little it asks of the wire that carries it."""

    def result(self, id_json: bytes, result: bytes) -> None:
        """Answer request ``id_json`` with ``result`` (a JSON value)."""

    def error(self, id_json: bytes, error: bytes) -> None:
        """Answer request ``id_json`` with ``error`` (a JSON-RPC error object); ``b"null"``: a
        message that could not be told apart."""

    def request(self, id_json: bytes, method: str, params: bytes, about: bytes | None) -> bool:
        """Send the client a request of the daemon's own; False when nobody can be asked."""

    def notification(self, method: str, message: bytes, about: bytes | None) -> None:
        """Send ``message``, the whole notification ``method`` as JSON."""

    def backlog(self) -> int:
        """Bytes written to the client that it has not read yet."""

    def request_id(self, id_json: bytes) -> Any:
        """The id the client gave the request the session knows as ``id_json`` (a wire that
        carries several clients' requests in one session gives them ids of its own)."""

    def ended(self, id_json: bytes) -> None:
        """Request ``id_json`` is no longer in flight and no answer to it follows (cancelled,
        answered earlier, or the task that answers it is done). A wire may now let go of what
        waits for it, or close once nothing does."""

    def close(self) -> None:
        """Close the wire; the session's ``close`` follows once it is closed."""


def encode_report(value: Any) -> bytes:
    """A report (status, list, attach, reload, an error) as JSON. Its paths come from the file system,
    whose names need not be UTF-8: such a string is sent escaped rather than failing the answer."""
    try:
        return _encode(value)
    except UnicodeEncodeError:
        return _encode(escape_strings(value))


def encode_error(code: int, message: str, data: Any = None) -> bytes:
    """A JSON-RPC error object."""
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return encode_report(error)
