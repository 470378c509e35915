"""How the tiny client answers what a tool asks it (``ctx.elicit``, ``ctx.sample``): the daemon's
``elicitation/create`` and ``sampling/createMessage`` requests, given to the callbacks a ``Client``
or ``AsyncClient`` was made with.

No I/O: the clients read the request and write the response this module builds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from atomictools._asking import Elicitation

__all__ = ["OnElicit", "OnSample", "answer", "capabilities", "response"]

# on_elicit(message, requested_schema) → a dict (accept with this content), None or False
# (decline), or an Elicitation (any action). on_sample(params) → a str (the reply's text) or an MCP
# CreateMessageResult dict. Either may be a coroutine function for AsyncClient.
OnElicit = Callable[[str, dict[str, Any]], Any]
OnSample = Callable[[dict[str, Any]], Any]


def capabilities(on_elicit: OnElicit | None, on_sample: OnSample | None) -> dict[str, Any]:
    """The client capabilities to declare at initialize: only what a callback can answer."""
    declared: dict[str, Any] = {}
    if on_elicit is not None:
        declared["elicitation"] = {"form": {}}
    if on_sample is not None:
        declared["sampling"] = {}
    return declared


def answer(message: dict[str, Any], on_elicit: OnElicit | None, on_sample: OnSample | None) -> tuple[Callable[..., Any] | None, tuple[Any, ...]]:
    """The callback that answers a request from the daemon and its arguments; (None, ()) when none does."""
    method = message.get("method")
    params = message.get("params") or {}
    if method == "elicitation/create" and on_elicit is not None:
        return on_elicit, (params.get("message", ""), params.get("requestedSchema") or {})
    if method == "sampling/createMessage" and on_sample is not None:
        return on_sample, (params,)
    return None, ()


def response(message: dict[str, Any], value: Any = None, error: BaseException | None = None) -> dict[str, Any]:
    """The JSON-RPC response to the daemon's request ``message``, from what its callback returned."""
    request_id = message.get("id")
    method = message.get("method")
    if error is not None:
        return {"jsonrpc": "2.0", "id": request_id, "error": {"code": -32603, "message": f"{type(error).__name__}: {error}"}}
    if method == "elicitation/create":
        if isinstance(value, Elicitation):
            result: dict[str, Any] = {"action": value.action}
            if value.action == "accept":
                result["content"] = value.content or {}
        elif value is None or value is False:
            result = {"action": "decline"}
        else:
            result = {"action": "accept", "content": value if isinstance(value, dict) else {}}
        return {"jsonrpc": "2.0", "id": request_id, "result": result}
    if method == "sampling/createMessage":
        if isinstance(value, str):
            value = {"role": "assistant", "content": {"type": "text", "text": value}, "model": "callback", "stopReason": "endTurn"}
        return {"jsonrpc": "2.0", "id": request_id, "result": value}
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": -32601, "message": f"Method not found: {method}"}}
