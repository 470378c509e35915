"""The one raw client of the daemon's socket, for the tests and the benchmarks: NDJSON over a plain
Unix socket, with nothing between the bytes and the daemon (no SDK, no atomictools client).

Lives in bench/ because the benchmarks run as plain scripts with only their own directory on the
path and must not depend on the test suite; the tests' ``helpers`` load it from here by file path
(``tests/unit`` already loads bench modules that way). Standard library only, so it costs a
benchmark nothing to import and can be copied into a peer environment.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

__all__ = ["RawConnection"]


class RawConnection:
    """A plain socket speaking NDJSON. ``send_request`` lets many requests go out before any answer
    is read; ``request`` sends one and returns its whole reply; ``result`` returns its result."""

    def __init__(self, path: str | Path, timeout: float | None = 15.0) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        try:
            self.sock.connect(str(path))
        except BaseException:
            self.sock.close()
            raise
        self.file = self.sock.makefile("rb")
        self._next_id = 0

    def send_bytes(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send(self, message: dict[str, Any]) -> None:
        self.sock.sendall(json.dumps(message).encode() + b"\n")

    def send_request(self, method: str, params: dict[str, Any] | None = None) -> int:
        """Send a request without waiting; return its id (for ``reply``)."""
        self._next_id += 1
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": self._next_id, "method": method}
        if params is not None:
            message["params"] = params
        self.send(message)
        return self._next_id

    def recv(self) -> dict[str, Any]:
        line = self.file.readline()
        if not line:
            raise EOFError("the daemon closed the connection")
        return json.loads(line)

    def reply(self, request_id: int) -> dict[str, Any]:
        """The reply to request ``request_id``, skipping notifications and other replies."""
        while True:
            message = self.recv()
            if message.get("id") == request_id and "method" not in message:
                return message

    def request(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """Send a request; return its whole reply (``result`` or ``error``)."""
        return self.reply(self.send_request(method, params))

    def answer(self, request_id: int) -> Any:
        """The result of request ``request_id``, or RuntimeError with its error."""
        reply = self.reply(request_id)
        if "error" in reply:
            raise RuntimeError(f"request {request_id}: {reply['error']}")
        return reply["result"]

    def result(self, method: str, params: dict[str, Any] | None = None) -> Any:
        """Send a request; return its result, or raise RuntimeError with its error."""
        reply = self.request(method, params)
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return reply["result"]

    def close(self) -> None:
        self.file.close()
        self.sock.close()

    def __enter__(self) -> RawConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
