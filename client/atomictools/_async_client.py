"""``AsyncClient``: the asyncio twin of ``Client``, with the same arguments and methods, awaited."""

from __future__ import annotations

import asyncio
import inspect
import itertools
import os
import uuid
from collections.abc import AsyncIterator
from typing import Any

from atomictools._answering import OnElicit, OnSample, answer, capabilities, response
from atomictools._client import (
    _CONNECT_ERRORS,
    _LINE_LIMIT,
    ToolFormat,
    ToolResult,
    _attach_params,
    _decode,
    _default_socket_path,
    _encode,
    _result_or_raise,
    _start_daemon,
    convert_tools,
)
from atomictools._errors import ConnectError
from atomictools._protocol import LATEST_PROTOCOL_VERSION

__all__ = ["AsyncClient"]

_LOST: dict[str, Any] = {}  # put in the notification queue when the daemon closes the connection


class AsyncClient:
    """The asyncio twin of ``Client``: same arguments, same methods, awaited."""

    def __init__(
        self,
        socket_path: str | None = None,
        *,
        directory: str | None = None,
        autostart: bool = True,
        timeout: float | None = None,
        agent: str = "python",
        on_elicit: OnElicit | None = None,
        on_sample: OnSample | None = None,
    ) -> None:
        self.socket_path = socket_path or _default_socket_path()
        self.on_elicit = on_elicit
        self.on_sample = on_sample
        self.directory = os.path.abspath(directory or os.getcwd())
        self.autostart = autostart
        self.timeout = timeout
        self.agent = agent
        self.session_id = uuid.uuid4().hex
        self._ids = itertools.count(1)
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._notifications: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._reader_task: asyncio.Task[None] | None = None
        self._lost = False  # the daemon closed the connection and no request has been told yet
        self._answering: set[asyncio.Task[None]] = set()

    async def connect(self) -> AsyncClient:
        if self._writer is not None:
            return self
        started = False
        delay = 0.005
        while True:
            try:
                self._reader, self._writer = await asyncio.open_unix_connection(
                    self.socket_path, limit=_LINE_LIMIT
                )
                break
            except _CONNECT_ERRORS as exc:
                if not self.autostart:
                    raise ConnectError(
                        f"no daemon is listening on {self.socket_path}; start one with `atomictoolsd start`"
                    ) from exc
                if started and delay > 2:
                    raise ConnectError(f"the daemon started but {self.socket_path} does not accept") from exc
                if not started:
                    await asyncio.get_running_loop().run_in_executor(None, _start_daemon)
                    started = True
                await asyncio.sleep(delay)
                delay *= 2
        self._notifications = asyncio.Queue()
        self._reader_task = asyncio.create_task(self._read_loop())
        await self.request("atomic/attach", _attach_params(self.directory, self.agent, self.session_id))
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
                message = _decode(line)
                if "method" in message and "id" in message:
                    task = asyncio.create_task(self._answer(message))  # a tool asks; reading goes on
                    self._answering.add(task)
                    task.add_done_callback(self._answering.discard)
                    continue
                if "method" in message:
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
                    future.set_exception(ConnectError("the daemon closed the connection"))
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
        if self._writer is not None:
            self._writer.write(_encode(reply) + b"\n")

    async def close(self) -> None:
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
        if self._lost:
            self._lost = False
            raise ConnectError("the daemon closed the connection")
        if self._writer is None:
            await self.connect()
        assert self._writer is not None
        request_id = next(self._ids)
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        self._writer.write(_encode(message) + b"\n")
        try:
            reply = await asyncio.wait_for(future, self.timeout)
        finally:
            self._pending.pop(request_id, None)
        return _result_or_raise(reply)

    async def notify(self, method: str, params: dict[str, Any] | None = None) -> None:
        if self._writer is None:
            await self.connect()
        assert self._writer is not None
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        self._writer.write(_encode(message) + b"\n")

    async def initialize(self, protocol_version: str = LATEST_PROTOCOL_VERSION) -> dict[str, Any]:
        result = await self.request(
            "initialize",
            {
                "protocolVersion": protocol_version,
                "capabilities": capabilities(self.on_elicit, self.on_sample),
                "clientInfo": {"name": f"atomictools-{self.agent}", "version": "0"},
            },
        )
        await self.notify("notifications/initialized")
        return result

    async def attach(self, directory: str) -> dict[str, Any]:
        self.directory = os.path.abspath(directory)
        return await self.request(
            "atomic/attach", _attach_params(self.directory, self.agent, self.session_id)
        )

    async def list_tools(
        self, directory: str | None = None, format: ToolFormat = "mcp"
    ) -> list[dict[str, Any]]:
        if directory is not None and os.path.abspath(directory) != self.directory:
            await self.attach(directory)
        tools: list[dict[str, Any]] = []
        cursor: str | None = None
        while True:
            result = await self.request("tools/list", {"cursor": cursor} if cursor else {})
            tools.extend(result["tools"])
            cursor = result.get("nextCursor")
            if not cursor:
                return convert_tools(tools, format)

    async def call(self, name: str, /, **arguments: Any) -> ToolResult:
        return await self.call_tool(name, arguments)

    async def call_tool(
        self, name: str, arguments: dict[str, Any] | None = None, *, timeout: float | None = None
    ) -> ToolResult:
        params: dict[str, Any] = {"name": name, "arguments": arguments or {}}
        if timeout is not None:
            params["_meta"] = {"atomic/timeout": timeout}
        return ToolResult.from_mcp(await self.request("tools/call", params))

    async def status(self) -> dict[str, Any]:
        return await self.request("atomic/status")

    async def reload(self) -> dict[str, Any]:
        return await self.request("atomic/reload")

    async def watch(self, timeout: float | None = None) -> AsyncIterator[dict[str, Any]]:
        await self.request("atomic/subscribe")
        while True:
            try:
                message = await asyncio.wait_for(self._notifications.get(), timeout)
            except TimeoutError:
                return
            if message is _LOST:
                raise ConnectError("the daemon closed the connection")
            yield message
