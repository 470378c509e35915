"""A tool asks the client that made its call: ``ctx.elicit`` (``elicitation/create``) and
``ctx.sample`` (``sampling/createMessage``), as requests the daemon sends on that client's
connection, whose answers go back to the waiting tool; or, for a client of the stateless revision
(2026-07-28), which takes no requests from a server, as an ``input_required`` result that answers
the call's request, naming the question and a ``requestState``: the client's retry of the call with
that state and its ``inputResponses`` resumes the waiting tool (``resume``), on any session.

One ``Asking`` per session. It owns the requests the daemon has sent the client and not yet seen
answered, and (daemon-wide) the calls waiting for a retry, and nothing else: the session hands it
the client's responses (``response``) and retries (``resume``), and tells it when a call ends
(``call_ended``: the client is told the request is cancelled; a call waiting for a retry is
forgotten, and its late answer is sent to nobody). A client that did
not declare the capability, or whose revision lacks the method, is never sent the request: the tool
gets an ``AskError`` at once saying why, never a wait.
"""

from __future__ import annotations

import itertools
import secrets
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from atomictoolsd.sessions.revisions import older_form

if TYPE_CHECKING:
    from atomictoolsd.pool.worker import Call
    from atomictoolsd.sessions.revisions import Revision

__all__ = ["CAPABILITY", "Asking", "AskingHost"]

_ids = itertools.count(1)
_encode = msgspec.json.encode

# Calls whose request was answered ``input_required``, waiting for the client's retry: by the
# ``requestState`` it was given (unguessable, so only that client resumes it). Daemon-wide, since a
# stateless client's retry may come on another connection (HTTP).
_parked: dict[str, tuple[Call, int, str]] = {}
_INPUT_KEY = "ask"  # one question at a time per call: the tool waits for each answer

# The client capability each method needs (which revisions have it: ``Revision.asks``).
CAPABILITY = {"elicitation/create": "elicitation", "sampling/createMessage": "sampling"}
_WHAT = {"elicitation/create": "ask the user (elicitation)", "sampling/createMessage": "ask its model for a completion (sampling)"}


class _Error(msgspec.Struct):
    code: int = 0
    message: str = ""


class AskingHost(Protocol):
    """What ``Asking`` uses of its session (``session.Session``)."""

    agent: str
    revision: Revision | None  # None: the client never said (no initialize)
    client_capabilities: dict[str, Any]
    call_capabilities: dict[bytes, dict[str, Any]]  # 2026-07-28: each call's, from its request's _meta

    calls: dict[bytes, Any]

    def send_request(self, id_json: bytes, method: str, params: bytes, about: bytes | None = None) -> bool: ...

    def send_result(self, id_json: bytes, result: bytes) -> None: ...

    def send_notification(self, method: str, params: dict[str, Any] | None = None) -> None: ...


class Asking:
    """The requests one session's tools have sent its client, by the request's id as JSON."""

    __slots__ = ("session", "waiting")

    def __init__(self, session: AskingHost) -> None:
        self.session = session
        self.waiting: dict[bytes, tuple[Call, int, str]] = {}

    def refusal(self, method: str, call: Call | None = None) -> str | None:
        """Why the client that made ``call`` cannot be sent ``method``, or None when it can."""
        session = self.session
        who = f"the client ({session.agent})" if session.agent else "the client"
        capability = CAPABILITY[method]
        revision = session.revision
        if revision is None:
            return (
                f"{who} cannot {_WHAT[method]}: it connected without MCP's initialize, so it declared "
                f"no '{capability}' capability; go on without the answer"
            )
        if method not in revision.asks:
            return (
                f"{who} cannot {_WHAT[method]}: its MCP revision {revision.version} has no {method}; "
                f"go on without the answer"
            )
        declared = session.client_capabilities  # 2026-07-28: the session's latest request's
        if revision.stateless and call is not None:
            # Each request declares its own. A call without one has had its request answered with a
            # question (input_required) and waits for the retry: nothing declared lets it ask again.
            declared = session.call_capabilities.get(call.request_id)
            if declared is None:
                return (
                    f"{who} cannot {_WHAT[method]} now: this call already waits for the answer to "
                    f"another question (one at a time); go on without the answer"
                )
        if capability not in declared:
            return (
                f"{who} cannot {_WHAT[method]}: it did not declare the '{capability}' capability when it "
                f"connected; go on without the answer"
            )
        return None

    def ask(self, call: Call, ask_id: int, method: str, params: bytes, wait: float) -> None:
        """Send ``method`` to the client for ``call``'s tool, or answer the tool at once why not.

        The call's timeout stops while the client has the question, for at most ``wait`` seconds.
        """
        why = self.refusal(method, call)
        session = self.session
        if why is None and method == "elicitation/create" and session.revision is not None \
                and not session.revision.elicitation_forms:
            shaped = older_form(params)
            if isinstance(shaped, str):
                who = f"the client ({session.agent})" if session.agent else "the client"
                why = f"{who} cannot be asked this: {shaped}; ask with single choices, or go on without the answer"
            else:
                params = shaped
        if why is not None:
            call.answer(ask_id, None, why)
            return
        if session.revision is not None and session.revision.stateless:
            self._park(call, ask_id, method, params, wait)
            return
        id_json = _encode(f"atomic-{next(_ids)}")
        if not self.session.send_request(id_json, method, params, call.request_id):
            call.answer(ask_id, None, "the client has gone away")
            return
        self.waiting[id_json] = (call, ask_id, method)
        call.hold(wait)

    def _park(self, call: Call, ask_id: int, method: str, params: bytes, wait: float) -> None:
        """Answer the call's request ``input_required`` and keep the call waiting for the retry."""
        session = self.session
        if session.calls.get(call.request_id) is call:
            del session.calls[call.request_id]  # answered now: its id is free, a cancel of it is moot
        session.call_capabilities.pop(call.request_id, None)  # the retry brings its own
        state = secrets.token_urlsafe(18)
        _parked[state] = (call, ask_id, method)
        call.hold(wait)
        session.send_result(call.request_id, (
            b'{"resultType":"input_required","inputRequests":{"' + _INPUT_KEY.encode() + b'":{"method":'
            + _encode(method) + b',"params":' + params + b'}},"requestState":' + _encode(state) + b"}"
        ))

    def resume(self, id_json: bytes, name: str | None, state: str, responses: dict[str, msgspec.Raw] | None,
               capabilities: dict[str, msgspec.Raw]) -> str | None:
        """The client's retry (request ``id_json`` calling ``name``, declaring ``capabilities``) of a
        call it was answered ``input_required``: the call now answers this request and its tool gets
        the response. The reason it cannot be resumed, or None."""
        entry = _parked.get(state)
        if entry is None:
            return (
                "Invalid params: unknown requestState: the call it resumed has ended (answered, timed out or "
                "its client gone); call the tool again without requestState"
            )
        call, ask_id, method = entry
        if name is not None and call.tool != name:
            return f"Invalid params: this requestState belongs to a call of {call.tool!r}, not {name!r}"
        del _parked[state]
        session = self.session
        call.owner = session  # the retry may come on another connection: the answer goes there
        call.request_id = id_json
        session.calls[id_json] = call
        session.call_capabilities[id_json] = capabilities
        call.release()
        response = (responses or {}).get(_INPUT_KEY)  # its JSON, as the client sent it
        if response is None or bytes(response).strip() == b"null":
            call.answer(ask_id, None, f"the client retried without answering {method}")
        else:
            call.answer(ask_id, bytes(response))
        return None

    def response(self, id_json: bytes, result: Any, error: Any) -> bool:
        """Take the client's response to one of these requests; False when it answers none of them."""
        entry = self.waiting.pop(id_json, None)
        if entry is None:
            return False
        call, ask_id, method = entry
        call.release()
        if result is not msgspec.UNSET:
            call.answer(ask_id, bytes(result))
            return True
        try:
            err = msgspec.json.decode(bytes(error), type=_Error)
            text = f"{err.message} (code {err.code})"
        except (msgspec.DecodeError, msgspec.ValidationError):
            text = bytes(error).decode("utf-8", "replace")[:200]
        call.answer(ask_id, None, f"the client answered {method} with an error: {text}")
        return True

    def call_ended(self, call: Any) -> bool:
        """``call`` has answered or was cancelled: cancel what it still waits for at the client.
        True when its request was already answered (``input_required``): nothing is to be sent."""
        if _parked:
            for state, entry in list(_parked.items()):
                if entry[0] is call:
                    del _parked[state]
                    return True
        if not self.waiting:
            return False
        for id_json, entry in list(self.waiting.items()):
            if entry[0] is call:
                del self.waiting[id_json]
                self.session.send_notification(
                    "notifications/cancelled",
                    {"requestId": msgspec.json.decode(id_json), "reason": "the tool call that asked has ended"},
                )
        return False
