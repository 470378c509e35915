"""``AsyncClient``: the asyncio twin of ``Client``, with the same arguments and methods, awaited.

What it says and how it reads the answers is ``_base``'s, as for ``Client``; this module only moves
bytes, with a task that reads the connection and routes each answer to the request awaiting it.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncIterator
from typing import Any

from atomictools import _base
from atomictools._answering import answer, response
from atomictools._base import CONNECT_ERRORS, CONNECT_WAIT, LINE_LIMIT, LOST, ClientBase, awaited, decode, encode
from atomictools._errors import ConnectionLost

__all__ = ["AsyncClient"]

_LOST: dict[str, Any] = {}  # put in the notification queue when the daemon closes the connection


class AsyncClient(ClientBase):
    """The asyncio twin of ``Client``: same arguments, same methods, awaited."""

    __doc__ = f"{__doc__}\n{ClientBase.__doc__}"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._notifications: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._reader_task: asyncio.Task[None] | None = None
        self._lost = False  # the daemon closed the connection and no request has been told yet
        self._answering: set[asyncio.Task[None]] = set()

    async def connect(self) -> AsyncClient:
        """Connect (starting the daemon if allowed and needed) and attach to ``directory``."""
        if self._writer is not None:
            return self
        started = False
        delay = 0.005
        deadline = time.monotonic() + CONNECT_WAIT
        while True:
            try:
                self._reader, self._writer = await asyncio.open_unix_connection(
                    self.socket_path, limit=LINE_LIMIT
                )
                break
            except CONNECT_ERRORS as exc:
                if self._refused(exc, started, deadline):
                    await asyncio.get_running_loop().run_in_executor(None, _base.start_daemon, self.directory)
                    started = True
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.25)
        self._notifications = asyncio.Queue()
        self._reader_task = asyncio.create_task(self._read_loop())
        await self.request("atomic/attach", self._attach_params())
        if self.on_elicit is not None or self.on_sample is not None:
            await self.initialize()  # declares what the callbacks answer: tools may then ask
        return self

    async def _read_loop(self) -> None:
        assert self._reader is not None
        by_daemon = True
        try:
            while True:
                line = await self._reader.readline()
                if not line:
                    break
                message = decode(line)
                if "method" in message and "id" in message:
                    task = asyncio.create_task(self._answer(message))  # a tool asks; reading goes on
                    self._answering.add(task)
                    task.add_done_callback(self._answering.discard)
                    continue
                if "method" in message:
                    if not (message["method"] == "notifications/progress" and self._progress(message)):
                        self._notifications.put_nowait(message)
                    continue
                future = self._pending.pop(message.get("id"), None)  # type: ignore[arg-type]
                if future is not None and not future.done():
                    future.set_result(message)
        except asyncio.CancelledError:
            by_daemon = False  # close() stops us
            raise
        finally:
            told = False
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(ConnectionLost(LOST))
                    told = True
            self._pending.clear()
            if by_daemon and self._writer is not None:
                # Nothing reads this connection any more: the next request must not wait forever
                # for an answer. It is told the connection was lost (unless a waiting one was just
                # told), and the one after connects again, as with the sync Client.
                self._lost = not told
                self._notifications.put_nowait(_LOST)
                self._writer.close()
                self._writer = None

    async def _answer(self, message: dict[str, Any]) -> None:
        callback, args = answer(message, self.on_elicit, self.on_sample)
        try:
            value = callback(*args) if callback is not None else None
            if inspect.isawaitable(value):
                value = await value
            reply = response(message, value) if callback is not None else response(message)
        except Exception as exc:  # noqa: BLE001 - the tool gets the callback's failure as its AskError
            reply = response(message, error=exc)
        self._write(reply)

    def _write(self, message: dict[str, Any]) -> None:
        if self._writer is not None:
            self._writer.write(encode(message) + b"\n")

    async def close(self) -> None:
        """Close the connection. Calls still running in the daemon are cancelled."""
        self._lost = False
        if self._writer is not None:
            self._writer.close()
            try:
                await self._writer.wait_closed()
            except OSError:
                pass
            self._writer = None
        if self._reader_task is not None:
            self._reader_task.cancel()
            try:
                await self._reader_task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 - how the loop ended no longer matters
                pass
            self._reader_task = None

    async def __aenter__(self) -> AsyncClient:
        return await self.connect()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def request(self, method: str, params: dict[str, Any] | None = None) -> Any:
        """Send one JSON-RPC request and return its result; raises as ``_errors`` draws."""
        if self._lost:
            self._lost = False
            raise ConnectionLost(LOST)
        if self._writer is None:
            await self.connect()
        request_id, message = self._request_message(method, params)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        self._write(message)
        try:
            reply = await asyncio.wait_for(future, self.timeout)
        except TimeoutError:
            cancel, error = self._timed_out(request_id, method)
            self._write(cancel)
            raise error from None
        except asyncio.CancelledError:  # the caller gave up on it: so does the daemon
            self._write(self._notification("notifications/cancelled", {"requestId": request_id}))
            raise
        finally:
            self._pending.pop(request_id, None)
        return self._result(method, reply)

    async def notify(self, method: str, params: dict[str, Any] | None = None) -> None:
        """Send a JSON-RPC notification (no answer)."""
        if self._writer is None:
            await self.connect()
        self._write(self._notification(method, params))

    # -- the API (written once in _base) ---------------------------------------------------------

    initialize = awaited(_base.initialize)
    attach = awaited(_base.attach)
    list_tools = awaited(_base.list_tools)
    call = awaited(_base.call)
    call_tool = awaited(_base.call_tool)
    status = awaited(_base.status)
    reload = awaited(_base.reload)

    async def watch(self, timeout: float | None = None) -> AsyncIterator[dict[str, Any]]:
        """Yield the daemon's notifications as they come; see ``Client.watch``."""
        await self.request("atomic/subscribe")
        while True:
            try:
                message = await asyncio.wait_for(self._notifications.get(), timeout)
            except TimeoutError:
                return
            if message is _LOST:
                raise ConnectionLost(LOST)
            yield message
