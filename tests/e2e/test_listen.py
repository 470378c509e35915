"""``subscriptions/listen`` (2026-07-28) over the socket and through the shim, read line by line: a
session that listens is sent each tool-list change on its listen request; one that does not listen
is sent nothing at all; a listen the client cancelled is sent nothing more. (``RawConnection.request``
skips notifications, so each check here reads the very next line instead.)"""

from __future__ import annotations

from typing import Any

import pytest

from e2e.test_revisions import ShimConnection
from helpers import Daemon, Env

pytestmark = pytest.mark.slow

META = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"}}
TOOL = 'def {name}() -> str:\n    """{name}."""\n    return "{name}"\n'


def _listen(connection: Any, listen_id: str) -> None:
    connection.send({"jsonrpc": "2.0", "id": listen_id, "method": "subscriptions/listen",
                     "params": {"notifications": {"toolsListChanged": True}, "_meta": META}})
    ack = connection.recv()
    assert ack["method"] == "notifications/subscriptions/acknowledged", ack


def _change_on(connection: Any, listen_id: str) -> None:
    change = connection.recv()
    assert change["method"] == "notifications/tools/list_changed", change
    assert change["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"] == listen_id


def _next_is_the_answer(connection: Any) -> None:
    """The next line this connection reads is the answer to a request sent now: nothing came before."""
    sent = connection.send_request("server/discover", {"_meta": META})
    message = connection.recv()
    assert message.get("id") == sent and "method" not in message, f"sent before the answer: {message}"


@pytest.mark.parametrize("via", ["socket", "shim"])
def test_only_a_listening_session_is_sent_changes_and_a_cancelled_listen_none(env: Env, daemon: Daemon, via: str) -> None:
    env.write_tool(env.global_tools, "first.py", TOOL.format(name="first"))
    connect = daemon.raw if via == "socket" else (lambda: ShimConnection(env))
    with connect() as quiet, connect() as listener, daemon.raw() as witness:
        quiet.request("tools/list", {"_meta": META})  # a 2026-07-28 session that never listens
        _listen(listener, "mine")
        _listen(witness, "theirs")
        env.write_tool(env.global_tools, "second.py", TOOL.format(name="second"))
        _change_on(witness, "theirs")
        _change_on(listener, "mine")
        _next_is_the_answer(quiet)

        listener.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "mine"}})
        _next_is_the_answer(listener)  # the cancel has been read before the change below
        env.write_tool(env.global_tools, "third.py", TOOL.format(name="third"))
        _change_on(witness, "theirs")
        _next_is_the_answer(listener)
        _next_is_the_answer(quiet)
