"""The authoring surface: ``@tool``, ``Field`` and ``Context``.

A tool is a plain function, sync or async. ``@tool`` only records options on it; the worker that
loads the module derives the schema (``atomictoolsd.worker.schema``) and calls it. The function stays an ordinary
function, so a tool's own tests can call it directly.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, overload

import msgspec

from atomictools._asking import (
    Elicitation,
    Sample,
    elicitation_params,
    read_elicitation,
    read_sample,
    sampling_params,
)
from atomictools._errors import AskError
from atomictools._protocol import LOG_LEVELS, LogLevel

__all__ = ["ANNOTATION_KEYS", "Context", "Field", "FieldDefault", "LogLevel", "ToolOptions", "tool"]

_NO_DEFAULT: Any = object()

F = TypeVar("F", bound=Callable[..., Any])

# MCP tool annotations (hints to the client, never enforced by the server).
ANNOTATION_KEYS = frozenset({"title", "readOnlyHint", "destructiveHint", "idempotentHint", "openWorldHint"})


@dataclass(frozen=True)
class ToolOptions:
    """What ``@tool`` records on a function (as ``fn.__atomic_tool__``)."""

    name: str | None = None
    description: str | None = None
    title: str | None = None
    timeout: float | None = None
    annotations: Mapping[str, Any] | None = None


@overload
def tool(fn: F, /) -> F: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    title: str | None = None,
    timeout: float | None = None,
    annotations: Mapping[str, Any] | None = None,
) -> Callable[[F], F]: ...


def tool(
    fn: Any = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    title: str | None = None,
    timeout: float | None = None,
    annotations: Mapping[str, Any] | None = None,
) -> Any:
    """Mark a function as a tool.

    Use it bare (``@tool``) or with options (``@tool(name="x", timeout=5)``).

    Args:
        name: the tool's name; by default the file stem when the function is named like its file,
            else ``<stem>_<function>``. Must match ``^[a-zA-Z_][a-zA-Z0-9_-]{0,63}$``.
        description: what the model reads; by default the function's docstring.
        title: a human-readable title for clients that show one.
        timeout: seconds a call may run before it is stopped (default: the daemon's, 60 s).
        annotations: MCP tool annotations, e.g. ``{"readOnlyHint": True}``.

    Returns:
        The function itself, unchanged except for an ``__atomic_tool__`` attribute.
    """
    if timeout is not None and not timeout > 0:
        raise ValueError(f"@tool timeout must be a positive number of seconds, got {timeout!r}")
    if annotations is not None:
        unknown = set(annotations) - ANNOTATION_KEYS
        if unknown:
            raise ValueError(
                f"unknown tool annotation(s) {sorted(unknown)}; known: {sorted(ANNOTATION_KEYS)}"
            )
    options = ToolOptions(
        name=name,
        description=description,
        title=title,
        timeout=timeout,
        annotations=dict(annotations) if annotations else None,
    )

    def mark(func: F) -> F:
        if not callable(func):
            raise TypeError(f"@tool expects a function, got {type(func).__name__}")
        func.__atomic_tool__ = options  # type: ignore[attr-defined]
        return func

    return mark(fn) if fn is not None else mark


def Field(  # noqa: N802 - reads like a type in annotations, as in pydantic and msgspec
    description: str | None = None,
    *,
    title: str | None = None,
    examples: list[Any] | None = None,
    gt: int | float | None = None,
    ge: int | float | None = None,
    lt: int | float | None = None,
    le: int | float | None = None,
    multiple_of: int | float | None = None,
    pattern: str | None = None,
    min_length: int | None = None,
    max_length: int | None = None,
    default: Any = _NO_DEFAULT,
) -> Any:
    """Describe and constrain a parameter, in either of two places:

    - ``count: Annotated[int, Field("How many", ge=0)] = 1``, or
    - as its default: ``count: int = Field(ge=0)`` (required), ``count: int = Field(ge=0, default=1)``.

    The constraints are enforced before the tool runs and appear in its input schema. Without
    ``default`` this is ``msgspec.Meta`` under a friendlier name (``Meta`` itself works too, and so
    does it in a ``msgspec.Struct``'s fields); with it, a ``FieldDefault`` the tool's schema reads.

    Unlike pydantic's, the first positional argument is the description: a default goes in
    ``default=`` (``Field(default=5, ge=0)``), and a parameter without one is required.
    """
    if description is not None and not isinstance(description, str):
        # pydantic's Field(5, ge=0) or Field(..., ge=0): read as a description it would fail later,
        # in msgspec's words ("`description` must be a str, got int").
        if description is Ellipsis:
            shown, fix = "...", "leave it out: a parameter without a default is required"
        else:
            shown, fix = repr(description), f"write Field(default={description!r}, …)"
        raise TypeError(
            f"Field's first argument is the description, a str, not {shown} "
            f"(pydantic's positional default); {fix}"
        )
    meta = msgspec.Meta(
        description=description,
        title=title,
        examples=examples,
        gt=gt,
        ge=ge,
        lt=lt,
        le=le,
        multiple_of=multiple_of,
        pattern=pattern,
        min_length=min_length,
        max_length=max_length,
    )
    return meta if default is _NO_DEFAULT else FieldDefault(meta, default)


@dataclass(frozen=True)
class FieldDefault:
    """``Field(..., default=x)``: the constraints (``meta``) and the parameter's default."""

    meta: msgspec.Meta
    default: Any


Emit = Callable[[str, tuple[Any, ...]], None]
# Sends a request to the client that made the call; the future holds the JSON of its result, or
# fails with AskError. Set by the worker runtime.
Ask = Callable[[str, dict[str, Any], "float | None"], "Future[bytes]"]


class Context:
    """What a tool knows about the call it is serving.

    Declare a parameter annotated ``Context`` (any name, ``ctx`` by convention) to receive it; it is
    never part of the input schema.

    Attributes:
        session_id: the agent session that made the call (from ``atomic/attach``), or ``""``.
        message_id: the agent's message id when the client sent one in ``_meta``, or ``""``.
        agent: the agent's name (``claude``, ``opencode``, …) when known, or ``""``.
        directory: the directory the session works in.
        worktree: the project root of that directory (its git worktree root, when it has one).
        tool_use_id: the agent's id for this tool use when the client sent one, or ``""``.

    Besides ``progress`` and ``log``, a tool can ask the client mid-call: ``elicit`` (a question to
    the user) and ``sample`` (a completion from the client's model), with ``aelicit``/``asample``
    for ``async def`` tools.
    """

    __slots__ = (
        "_ask",
        "_cancelled",
        "_emit",
        "_event",
        "_last_progress",
        "agent",
        "directory",
        "message_id",
        "session_id",
        "tool_use_id",
        "worktree",
    )

    def __init__(
        self,
        *,
        session_id: str = "",
        message_id: str = "",
        agent: str = "",
        directory: str = "",
        worktree: str = "",
        tool_use_id: str = "",
        emit: Emit | None = None,
        ask: Ask | None = None,
    ) -> None:
        self.session_id = session_id
        self.message_id = message_id
        self.agent = agent
        self.directory = directory
        self.worktree = worktree
        self.tool_use_id = tool_use_id
        self._emit = emit
        self._ask = ask
        self._last_progress: float | None = None
        self._cancelled = False
        self._event: threading.Event | None = None  # made on first use: most tools never wait on it

    @property
    def cancelled(self) -> bool:
        """True once the caller cancelled the call or it timed out: stop work and return soon."""
        return self._cancelled

    @property
    def cancel_event(self) -> threading.Event:
        """A ``threading.Event`` set on cancellation, for tools that wait (``ctx.cancel_event.wait(t)``)."""
        event = self._event
        if event is None:
            event = threading.Event()
            self._event = event  # published before the flag is read: see _cancel
            if self._cancelled:
                event.set()
        return event

    def _cancel(self) -> None:
        """Mark the call cancelled (called by the worker runtime, from another thread)."""
        self._cancelled = True
        event = self._event
        if event is not None:
            event.set()

    def progress(self, progress: float, total: float | None = None, message: str | None = None) -> None:
        """Report progress; it reaches the caller as ``notifications/progress``.

        Only reaches the caller when its request asked for progress (``_meta.progressToken``). Values
        must increase: a value not above the previous one is dropped, as MCP requires.
        """
        if self._last_progress is not None and progress <= self._last_progress:
            return
        self._last_progress = progress
        if self._emit is not None:
            self._emit("progress", (progress, total, message))

    def log(self, level: LogLevel, data: Any) -> None:
        """Send a log message to the caller as ``notifications/message`` (filtered by its log level)."""
        if level not in LOG_LEVELS:
            raise ValueError(f"log level must be one of {', '.join(LOG_LEVELS)}; got {level!r}")
        if self._emit is not None:
            self._emit("log", (level, data))

    # -- asking the client -----------------------------------------------------------------------

    def elicit(self, message: str, schema: Any = None, *, timeout: float | None = None) -> Elicitation:
        """Ask the user a question through the client (MCP elicitation); wait for the answer.

        Args:
            message: what the user reads.
            schema: what to ask for: None for a plain yes/no confirmation; a ``msgspec.Struct``,
                dataclass or TypedDict type (its defaults and ``Literal`` choices go into the form,
                and an accepted answer comes back as an instance); or a JSON Schema dict.
            timeout: seconds to wait (default: the daemon's ``ask_timeout``, 10 minutes). The wait
                does not count against the call's own timeout.

        Returns:
            An ``Elicitation``: ``.accepted``, ``.action`` (accept/decline/cancel), ``.content``.

        Raises:
            AskError: the client cannot be asked (it did not declare elicitation), answered with an
                error, did not answer in time, or the call was cancelled.
        """
        params = elicitation_params(message, schema)
        return self._read(read_elicitation, self._wait(self._send_ask("elicitation/create", params, timeout), timeout), schema)

    async def aelicit(self, message: str, schema: Any = None, *, timeout: float | None = None) -> Elicitation:
        """``elicit`` for an ``async def`` tool: the same arguments, awaited."""
        params = elicitation_params(message, schema)
        return self._read(read_elicitation, await self._await(self._send_ask("elicitation/create", params, timeout), timeout), schema)

    def sample(
        self,
        messages: str | list[Any],
        *,
        max_tokens: int = 1000,
        system: str | None = None,
        temperature: float | None = None,
        stop: list[str] | None = None,
        model_hints: list[str] | None = None,
        include_context: Literal["none", "thisServer", "allServers"] | None = None,
        timeout: float | None = None,
    ) -> Sample:
        """Ask the client's model for a completion (MCP sampling); wait for it.

        Args:
            messages: a prompt, or a list of turns (strings are user turns; dicts are MCP
                ``SamplingMessage``s such as ``{"role": "assistant", "content": {...}}``).
            max_tokens: the most tokens the reply may take.
            system: a system prompt.
            temperature, stop, model_hints, include_context: as MCP's ``sampling/createMessage``.
            timeout: seconds to wait (default: the daemon's ``ask_timeout``, 10 minutes). The wait
                does not count against the call's own timeout.

        Returns:
            A ``Sample``: ``.text``, ``.content``, ``.model``, ``.stop_reason``.

        Raises:
            AskError: as for ``elicit`` (the capability is ``sampling``).
        """
        params = sampling_params(
            messages, max_tokens=max_tokens, system=system, temperature=temperature, stop=stop,
            model_hints=model_hints, include_context=include_context,
        )
        return self._read(read_sample, self._wait(self._send_ask("sampling/createMessage", params, timeout), timeout))

    async def asample(
        self,
        messages: str | list[Any],
        *,
        max_tokens: int = 1000,
        system: str | None = None,
        temperature: float | None = None,
        stop: list[str] | None = None,
        model_hints: list[str] | None = None,
        include_context: Literal["none", "thisServer", "allServers"] | None = None,
        timeout: float | None = None,
    ) -> Sample:
        """``sample`` for an ``async def`` tool: the same arguments, awaited."""
        params = sampling_params(
            messages, max_tokens=max_tokens, system=system, temperature=temperature, stop=stop,
            model_hints=model_hints, include_context=include_context,
        )
        return self._read(read_sample, await self._await(self._send_ask("sampling/createMessage", params, timeout), timeout))

    def _send_ask(self, method: str, params: dict[str, Any], timeout: float | None) -> Future[bytes]:
        if self._ask is None:
            raise AskError(f"{method} is not available here: this call has no client to ask (only a tool the daemon runs can ask)")
        if self._cancelled:
            raise AskError("the call was cancelled; nothing was asked")
        return self._ask(method, params, timeout)

    @staticmethod
    def _wait(future: Future[bytes], timeout: float | None) -> bytes:
        try:
            return future.result(timeout)
        except FutureTimeout:
            future.cancel()
            raise AskError(f"the client did not answer within {timeout:g} s") from None

    @staticmethod
    async def _await(future: Future[bytes], timeout: float | None) -> bytes:
        import asyncio  # lazy: most tools never ask, and sync ones never need it

        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), timeout)
        except TimeoutError:
            raise AskError(f"the client did not answer within {timeout:g} s") from None

    @staticmethod
    def _read(reader: Callable[..., Any], result: bytes, *args: Any) -> Any:
        try:
            return reader(result, *args)
        except (ValueError, msgspec.DecodeError) as exc:
            raise AskError(str(exc)) from None

    def __repr__(self) -> str:
        return (
            f"Context(session_id={self.session_id!r}, agent={self.agent!r}, "
            f"directory={self.directory!r}, cancelled={self.cancelled})"
        )
