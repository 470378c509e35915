"""A socket client that sees what an agent sees: it initializes, then collects every message the
daemon sends it (notifications included) on a thread, so a test can act and then wait for them."""

from __future__ import annotations

import json
import queue
import socket
import threading
import time
from pathlib import Path
from typing import Any

from helpers import RawConnection

__all__ = ["Listener"]


class Listener:
    """An initialized MCP session on the daemon's socket, attached to ``directory``."""

    def __init__(self, socket_path: Path, directory: Path) -> None:
        self.raw = RawConnection(socket_path)
        self.raw.request("atomic/attach", {"directory": str(directory)})
        self.raw.request("initialize", {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "listener"}})
        self.raw.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        self.messages: queue.Queue[dict[str, Any]] = queue.Queue()
        self.seen: list[dict[str, Any]] = []
        self._next_id = 1000
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while True:
            try:
                line = self.raw.file.readline()
            except (OSError, ValueError):
                return
            if not line:
                return
            self.messages.put(json.loads(line))

    def next(self, method: str, timeout: float = 15.0) -> dict[str, Any]:
        """The next message with ``method`` (earlier ones are kept in ``seen``)."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {method} within {timeout} s; saw {[m.get('method') for m in self.seen]}")
            try:
                message = self.messages.get(timeout=left)
            except queue.Empty:
                continue
            self.seen.append(message)
            if message.get("method") == method:
                return message

    def sync(self, timeout: float = 15.0) -> list[dict[str, Any]]:
        """Everything the daemon sent before a ping answered now (so nothing sent earlier is missed)."""
        self._next_id += 1
        ping_id = self._next_id
        self.raw.send({"jsonrpc": "2.0", "id": ping_id, "method": "ping"})
        got: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout
        while True:
            message = self.messages.get(timeout=max(0.01, deadline - time.monotonic()))
            self.seen.append(message)
            if message.get("id") == ping_id and "method" not in message:
                return got
            got.append(message)

    def methods(self, messages: list[dict[str, Any]]) -> list[str]:
        return [m["method"] for m in messages if "method" in m]

    def close(self) -> None:
        try:
            self.raw.sock.shutdown(socket.SHUT_RDWR)  # ends the reader's readline, which holds the file's lock
        except OSError:
            pass
        self._thread.join(5)
        self.raw.close()

    def __enter__(self) -> Listener:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
