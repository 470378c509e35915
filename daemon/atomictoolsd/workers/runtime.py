"""The code inside a tool worker: load one tool module, then serve calls to its tools.

A worker is a process of its own, so whatever a tool does (raise, hang, leak, crash, fork) stays
here. This module must never import the server, uvloop or watchfiles: a fork server pre-imports it,
and every import here is paid by every worker that is not forked.

Messages (see ``channel`` for the framing):

daemon → worker
    ``["call", call_id, tool, arguments_json, context, progress]`` where ``context`` is
    ``[session_id, message_id, agent, directory, worktree, tool_use_id]`` and ``progress`` says whether
    the caller asked for progress notifications.
    ``["cancel", call_id]``: cancel an async call; set ``ctx.cancel_event`` for a sync one.

worker → daemon
    ``["loaded", definitions, load_ms]`` once, when the module imported and its tools were built.
    ``["failed", {file, line, message, traceback}]`` once, instead, when it did not; then it exits.
    ``["result", call_id, result_json]``: the MCP ``CallToolResult`` as JSON; ``None`` for a call that
    ended by cancellation.
    ``["progress", call_id, progress, total, message]`` and ``["log", call_id, level, data]``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib.util
import os
import socket
import sys
import time
import traceback
from typing import Any, Callable

import msgspec

from atomictools._authoring import Context
from atomictools._errors import ToolError
from atomictools._schema import SchemaError, ToolSpec, collect_tools, enc_hook
from atomictoolsd.workers.channel import FrameReader, encode_frame
from atomictoolsd.workers.truncate import truncate

__all__ = ["LoadFailure", "WorkerSpec", "load_tools", "main", "make_result"]

_json_encode = msgspec.json.Encoder(enc_hook=enc_hook).encode


class WorkerSpec(msgspec.Struct, kw_only=True):
    """What the daemon tells a new worker: which module, and the limits to apply."""

    path: str
    kind: str = "python"
    cwd: str = "/"
    threads: int = 16
    memory_limit: int = 0  # bytes; 0 means no limit
    truncate_lines: int = 2000
    truncate_bytes: int = 50 * 1024
    spill_dir: str = ""


class LoadFailure(Exception):
    """A module could not be loaded; carries where and why, for the daemon's listings."""

    def __init__(self, file: str, line: int | None, message: str, trace: str = "") -> None:
        super().__init__(message)
        self.info = {"file": file, "line": line, "message": message, "traceback": trace}


# -- loading -------------------------------------------------------------------------------------


def _module_name(stem: str) -> str:
    # A tool file may be named like a stdlib module (json.py): never shadow the real one.
    if stem in sys.modules or stem in sys.stdlib_module_names:
        return f"_atomic_tool_{stem}"
    return stem


def _error_line(exc: BaseException, path: str) -> int | None:
    if isinstance(exc, SyntaxError) and exc.filename == path:
        return exc.lineno
    line = None
    for frame, lineno in traceback.walk_tb(exc.__traceback__):
        if frame.f_code.co_filename == path:
            line = lineno
    return line


def _load_python(path: str) -> list[ToolSpec]:
    directory, filename = os.path.split(path)
    stem = filename.rsplit(".", 1)[0]
    # Appended, not prepended: helpers (_util.py) import by name, but never shadow the stdlib.
    if directory not in sys.path:
        sys.path.append(directory)
    name = _module_name(stem)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise LoadFailure(path, None, "not a loadable Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:  # noqa: BLE001 - a tool module may raise anything, SystemExit included
        message = (
            f"SyntaxError: {exc.msg}" if isinstance(exc, SyntaxError) else f"{type(exc).__name__}: {exc}"
        )
        raise LoadFailure(path, _error_line(exc, path), message, traceback.format_exc()) from None
    try:
        return collect_tools(vars(module), name, stem)
    except SchemaError as exc:
        raise LoadFailure(path, None, str(exc)) from None


# Loaders by module kind. Declarative JSON tool files and built-ins register theirs here.
LOADERS: dict[str, Callable[[str], list[ToolSpec]]] = {"python": _load_python}


def load_tools(spec: WorkerSpec) -> list[ToolSpec]:
    """Load the module a worker serves. Raises ``LoadFailure``."""
    loader = LOADERS.get(spec.kind)
    if loader is None:
        raise LoadFailure(spec.path, None, f"unknown module kind {spec.kind!r}")
    return loader(spec.path)


# -- results -------------------------------------------------------------------------------------


def _error_result(text: str) -> bytes:
    return b'{"content":[{"type":"text","text":' + _json_encode(text) + b'}],"isError":true}'


def _exception_text(tool: str, exc: BaseException) -> str:
    if isinstance(exc, ToolError):
        return str(exc) or type(exc).__name__
    # Drop the runtime's own frame: the model and the author need the tool's frames only.
    tb = exc.__traceback__.tb_next if exc.__traceback__ is not None else None
    trace = "".join(traceback.format_exception(type(exc), exc, tb))
    return f"Tool {tool!r} raised {type(exc).__name__}: {exc}\n\n{trace}".rstrip()


def make_result(spec: ToolSpec, value: Any, worker: WorkerSpec) -> bytes:
    """Turn what a tool returned into an MCP ``CallToolResult`` (JSON bytes)."""
    structured = None
    if spec.output_schema is not None:
        try:
            if not (isinstance(spec.output_type, type) and type(value) is spec.output_type):
                value = msgspec.convert(value, spec.output_type, from_attributes=True)
        except (msgspec.ValidationError, TypeError) as exc:
            return _error_result(
                f"Tool {spec.name!r} returned a value that does not match its return annotation: {exc}"
            )
        structured = {"result": value} if spec.wrap_output else value
        text = _json_encode(structured).decode()
    elif isinstance(value, str):
        text = value
    elif value is None:
        text = None
    elif isinstance(value, (bytes, bytearray)):
        text = bytes(value).decode("utf-8", "replace")
    else:
        text = _json_encode(value).decode()

    meta = None
    if text is not None:
        cut = truncate(text, worker.truncate_lines, worker.truncate_bytes, worker.spill_dir, spec.name)
        if cut is not None:
            text = cut.text
            meta = {"atomic/fullOutput": cut.path}
    result: dict[str, Any] = {"content": [] if text is None else [{"type": "text", "text": text}]}
    if structured is not None:
        result["structuredContent"] = structured
    if meta is not None:
        result["_meta"] = meta
    return _json_encode(result)


# -- serving -------------------------------------------------------------------------------------


class Runtime(asyncio.Protocol):
    """Serves calls from the daemon on the worker's channel."""

    def __init__(self, tools: dict[str, ToolSpec], worker: WorkerSpec, loop: asyncio.AbstractEventLoop) -> None:
        self.tools = tools
        self.worker = worker
        self.loop = loop
        self.executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=max(1, worker.threads), thread_name_prefix="tool"
        )
        self.reader = FrameReader()
        self.transport: asyncio.Transport | None = None
        self.calls: dict[int, tuple[Context, asyncio.Future[Any]]] = {}
        self.closed = loop.create_future()

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        for message in self.reader.feed(data):
            op = message[0]
            if op == "call":
                self.start_call(*message[1:])
            elif op == "cancel":
                self.cancel_call(message[1])

    def connection_lost(self, exc: Exception | None) -> None:
        # The daemon is gone (or retired us): nothing left to serve.
        if not self.closed.done():
            self.closed.set_result(None)

    # calls

    def send(self, message: list[Any]) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(encode_frame(message))

    def start_call(
        self, call_id: int, name: str, arguments: bytes, context: list[str], progress: bool
    ) -> None:
        spec = self.tools.get(name)
        if spec is None:
            self.send(["result", call_id, _error_result(f"Unknown tool {name!r} in this module")])
            return
        try:
            kwargs = spec.parse_arguments(arguments or b"{}")
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            self.send(["result", call_id, _error_result(f"Invalid arguments for tool {name!r}: {exc}")])
            return
        ctx = Context(
            session_id=context[0],
            message_id=context[1],
            agent=context[2],
            directory=context[3],
            worktree=context[4],
            tool_use_id=context[5],
            emit=self._emitter(call_id, progress),
        )
        if spec.context_param is not None:
            kwargs[spec.context_param] = ctx
        if spec.is_async:
            future: asyncio.Future[Any] = self.loop.create_task(_call_async(spec.fn, kwargs))
        else:
            future = self.loop.run_in_executor(self.executor, _call_sync, spec.fn, kwargs)
        self.calls[call_id] = (ctx, future)
        future.add_done_callback(lambda f: self.finish_call(call_id, spec, f))

    def finish_call(self, call_id: int, spec: ToolSpec, future: asyncio.Future[Any]) -> None:
        self.calls.pop(call_id, None)
        if future.cancelled():
            self.send(["result", call_id, None])
            return
        exc = future.exception()
        if exc is not None:
            result = _error_result(_exception_text(spec.name, exc))
        else:
            try:
                result = make_result(spec, future.result(), self.worker)
            except Exception as err:  # noqa: BLE001 - an unencodable result is the tool's error
                result = _error_result(f"Tool {spec.name!r} returned a value that cannot be sent: {err}")
        self.send(["result", call_id, result])

    def cancel_call(self, call_id: int) -> None:
        entry = self.calls.get(call_id)
        if entry is None:
            return
        ctx, future = entry
        ctx.cancel_event.set()
        if isinstance(future, asyncio.Task):
            future.cancel()

    def _emitter(self, call_id: int, progress: bool) -> Callable[[str, tuple[Any, ...]], None]:
        loop = self.loop

        def emit(kind: str, payload: tuple[Any, ...]) -> None:
            if kind == "progress" and not progress:
                return
            if call_id not in self.calls:
                return  # the call has answered: MCP forbids progress after the response
            if kind == "log":
                payload = (payload[0], _json_encode(payload[1]))
            message = [kind, call_id, *payload]
            if _on_loop_thread(loop):
                self.send(message)
            else:
                loop.call_soon_threadsafe(self.send, message)

        return emit


def _call_sync(fn: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
    return fn(**kwargs)


async def _call_async(fn: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
    try:
        return await fn(**kwargs)
    except (SystemExit, KeyboardInterrupt) as exc:
        # A task re-raises these out of the event loop; report them as the tool's failure instead.
        raise RuntimeError(f"the tool raised {type(exc).__name__}({exc})") from None


def _on_loop_thread(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def _send_blocking(sock: socket.socket, message: list[Any]) -> None:
    sock.sendall(encode_frame(message))


def serve(fd: int, spec: WorkerSpec) -> None:
    """Load the module and serve calls on channel ``fd`` until the daemon closes it. Never returns."""
    sock = socket.socket(fileno=fd)
    started = time.perf_counter()
    try:
        if spec.cwd:
            os.chdir(spec.cwd)
        tools = {t.name: t for t in load_tools(spec)}
    except LoadFailure as failure:
        _send_blocking(sock, ["failed", failure.info])
        os._exit(0)
    except BaseException as exc:  # noqa: BLE001 - report anything, then go
        _send_blocking(sock, ["failed", {"file": spec.path, "line": None, "message": repr(exc), "traceback": ""}])
        os._exit(0)
    load_ms = (time.perf_counter() - started) * 1000
    _send_blocking(sock, ["loaded", [t.definition() for t in tools.values()], load_ms])

    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    runtime = Runtime(tools, spec, loop)
    sock.setblocking(False)
    loop.run_until_complete(loop.connect_accepted_socket(lambda: runtime, sock=sock))
    loop.run_until_complete(runtime.closed)
    # Threads may be stuck in a tool: exit without joining them.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main(argv: list[str] | None = None) -> None:
    """Cold start, without the fork server: ``python -m atomictoolsd.workers.runtime FD SPEC_JSON``."""
    args = sys.argv[1:] if argv is None else argv
    serve(int(args[0]), msgspec.json.decode(args[1], type=WorkerSpec))


if __name__ == "__main__":
    main()
