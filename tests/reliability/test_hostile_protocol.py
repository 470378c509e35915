"""Hostile input on the socket, hostile conditions around it: every line answered, nothing lost.

The promises: any line (nested past the decoder's depth in any field, huge numbers, odd ids, odd
params) gets a JSON-RPC error and the connection stays usable; a params value out of range or
malformed is -32602, never -32603; a second request with the id of one in flight is refused and a
cancel for that id stops the first; after a half-close every request read is answered, then the
connection closes (raw socket and shim alike); a flood of connections under a low open-file limit
is refused with a reason and never starves the workers, and a spawn that runs out of descriptors
fails its call at once naming the cause; a deleted socket file is made again, and the CLI finds the
daemon by its lock while it is missing.
"""

from __future__ import annotations

import base64
import json
import os
import resource
import signal
import socket
import subprocess
from pathlib import Path
from typing import Any

import psutil
import pytest

from helpers import Daemon, Env, RawConnection, pinging, wait_for
from shim_helpers import SHIM

SLOW = "import time\n\ndef slow(seconds: float) -> str:\n    time.sleep(seconds)\n    return 'slept'\n"
ECHO = "def echo(text: str) -> str:\n    return text\n"
NAP = "import time\n\ndef nap(seconds: float) -> str:\n    time.sleep(seconds)\n    return 'napped'\n"


def _tools(env: Env) -> None:
    env.write_tool(env.global_tools, "echo.py", ECHO)
    env.write_tool(env.global_tools, "slow.py", SLOW)
    env.write_tool(env.global_tools, "nap.py", NAP)


def _deep(depth: int, container: str) -> bytes:
    if container == "array":
        return b"[" * depth + b"]" * depth
    return b'{"k":' * depth + b"1" + b"}" * depth


def _replies_until(raw: RawConnection, wanted: set[Any], own: Any = None) -> list[dict[str, Any]]:
    """Every message until an answer (result or error) for each id in ``wanted`` has come; an error
    with id null (a line too malformed to read its id) answers ``own``."""
    seen: list[dict[str, Any]] = []
    wanted = set(wanted)
    while wanted:
        message = raw.recv()  # raises on EOF: the connection must stay open
        seen.append(message)
        assert message.get("jsonrpc") == "2.0", message
        if "method" not in message:
            assert ("result" in message) != ("error" in message), message
            wanted.discard(own if message.get("id") is None and "error" in message else message.get("id"))
    return seen


def _line(envelope: dict[str, bytes]) -> bytes:
    return b"{" + b",".join(json.dumps(k).encode() + b":" + v for k, v in envelope.items()) + b"}\n"


# -- nesting, numbers, ids, params ----------------------------------------------------------------

DEPTHS = (10, 100, 500, 900, 1000, 2000, 100_000)

# Where the deep value goes: (name, builds the line's fields given the deep value and an id).
PLACES = {
    "id": lambda v, i: {"jsonrpc": b'"2.0"', "id": v, "method": b'"ping"'},
    "jsonrpc": lambda v, i: {"jsonrpc": v, "id": i, "method": b'"ping"'},
    "method": lambda v, i: {"jsonrpc": b'"2.0"', "id": i, "method": v},
    "params": lambda v, i: {"jsonrpc": b'"2.0"', "id": i, "method": b'"tools/call"', "params": v},
    "params before id": lambda v, i: {"jsonrpc": b'"2.0"', "params": v, "id": i, "method": b'"tools/list"'},
    "arguments": lambda v, i: {"jsonrpc": b'"2.0"', "id": i, "method": b'"tools/call"',
                               "params": b'{"name":"echo","arguments":' + v + b"}"},
    "argument value": lambda v, i: {"jsonrpc": b'"2.0"', "id": i, "method": b'"tools/call"',
                                    "params": b'{"name":"echo","arguments":{"text":' + v + b"}}"},
    "_meta": lambda v, i: {"jsonrpc": b'"2.0"', "id": i, "method": b'"tools/call"',
                           "params": b'{"name":"echo","arguments":{"text":"x"},"_meta":' + v + b"}"},
    "progressToken": lambda v, i: {"jsonrpc": b'"2.0"', "id": i, "method": b'"tools/call"',
                                   "params": b'{"name":"echo","arguments":{"text":"x"},"_meta":{"progressToken":' + v + b"}}"},
    "cursor": lambda v, i: {"jsonrpc": b'"2.0"', "id": i, "method": b'"tools/list"', "params": b'{"cursor":' + v + b"}"},
    "attach allow": lambda v, i: {"jsonrpc": b'"2.0"', "id": i, "method": b'"atomic/attach"', "params": b'{"allow":' + v + b"}"},
    "unknown member": lambda v, i: {"jsonrpc": b'"2.0"', "id": i, "method": b'"ping"', "extra": v},
    "dispatcher arguments": lambda v, i: {"jsonrpc": b'"2.0"', "id": i, "method": b'"tools/call"',
                                          "params": b'{"name":"atomic_call_tool","arguments":{"name":"echo","arguments":' + v + b"}}"},
    # Messages no one answers: a notification and a response. The connection must stay all the same.
    "cancel requestId": lambda v, i: {"jsonrpc": b'"2.0"', "method": b'"notifications/cancelled"', "params": b'{"requestId":' + v + b"}"},
    "response result": lambda v, i: {"jsonrpc": b'"2.0"', "id": i, "result": v},
}
UNANSWERED = {"cancel requestId", "response result"}


@pytest.fixture
def hostile_daemon(env: Env, make_daemon) -> Daemon:  # type: ignore[no-untyped-def]
    _tools(env)
    return make_daemon({"ATOMICTOOLS_PAGE_SIZE": "1"})


def _attach_dispatcher(raw: RawConnection, env: Env) -> None:
    reply = raw.request("atomic/attach", {"directory": str(env.project), "dispatcher": True})
    assert "result" in reply, reply


def test_any_nesting_in_any_field_is_answered_and_the_connection_stays(hostile_daemon: Daemon, env: Env, record) -> None:  # type: ignore[no-untyped-def]
    raw = hostile_daemon.raw()
    _attach_dispatcher(raw, env)
    tried = errors = results = 0
    next_id = 1000
    for place, build in PLACES.items():
        for container in ("array", "object"):
            for depth in DEPTHS:
                next_id += 1
                tried += 1
                line = _line(build(_deep(depth, container), str(next_id).encode()))
                raw.send_bytes(line)
                raw.send({"jsonrpc": "2.0", "id": "probe", "method": "ping"})
                # The deep value is the id itself, or comes before it and hides it: the answer's id is null.
                hidden = place == "id" or (place in ("jsonrpc", "params before id") and depth >= 1000)
                own = None if hidden or place in UNANSWERED else next_id
                wanted = {"probe"} if own is None else {"probe", own}
                case = f"{place}, {container} nested {depth} deep"
                for reply in _replies_until(raw, wanted):
                    if "error" in reply:
                        code = reply["error"]["code"]
                        assert code in (-32600, -32602), f"{case}: {reply}"
                        assert reply["error"]["message"], case
                        errors += 1
                    elif reply.get("id") == own:
                        results += 1
                        # A value the daemon could read reaches the tool, which refuses a wrong type.
                        if depth >= 1000:
                            raise AssertionError(f"{case}: nested past the decoder and still run: {reply}")
    assert raw.request("ping")["result"] == {}
    raw.close()
    assert hostile_daemon.proc.poll() is None
    record(f"{tried} lines nested 10 to 100,000 deep in {len(PLACES)} places, arrays and objects: "
           f"{errors} errors (-32600/-32602 only), {results} results, one connection throughout")


ODD_VALUES = [
    b"null", b"true", b"-1", b"0", b"1.5", b"1e999", b"-1e999", b"9" * 30, b"9" * 5000, b"-" + b"9" * 5000,
    b'"\\u0000"', b'"\\ud800"', b'"\xff"', b'"' + b"x" * 100_000 + b'"', b"[]", b"{}", b'[1,"a",null]',
    b'{"a":{"b":[1]}}', _deep(50, "array"), _deep(1000, "object"),
]
FIELDS = {
    "initialize": ["protocolVersion", "capabilities", "clientInfo"],
    "tools/list": ["cursor"],
    "tools/call": ["name", "arguments", "_meta"],
    "logging/setLevel": ["level"],
    "atomic/attach": ["directory", "agent", "sessionId", "allow", "deny", "dispatcher", "lock"],
    "atomic/list": ["all"],
    "atomic/bridges/create": ["agent", "directory", "allow", "deny", "dispatcher", "ownerPid", "name"],
    "atomic/bridges/remove": ["id"],
}
META = ["atomic/timeout", "atomic/messageId", "atomic/toolUseId", "progressToken"]


# Millions of elements where the daemon only looks at a key's presence or a short string: decoded
# whole, each line held the event loop 1 to 2 s (every client of every project waited).
_MANY = b"[" + b",".join([b"[]"] * 2_000_000) + b"]"
_V, _C = b'"io.modelcontextprotocol/protocolVersion"', b'"io.modelcontextprotocol/clientCapabilities"'
ELEMENTS = {
    "initialize capabilities": (b'{"jsonrpc":"2.0","id":7,"method":"initialize","params":{"protocolVersion":"2025-06-18",'
                                b'"capabilities":{"x":' + _MANY + b'},"clientInfo":{"name":"n","version":"1"}}}', "result"),
    "initialize clientInfo": (b'{"jsonrpc":"2.0","id":7,"method":"initialize","params":{"protocolVersion":"2025-06-18",'
                              b'"capabilities":{},"clientInfo":{"name":' + _MANY + b'}}}', "result"),
    "tools/call _meta values": (b'{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"echo","arguments":{"text":"t"},'
                                b'"_meta":{"progressToken":' + _MANY + b',"atomic/timeout":' + _MANY + b'}}}', "result"),
    "tools/call _meta capabilities": (b'{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"echo",'
                                      b'"arguments":{"text":"t"},"_meta":{' + _C + b':{"x":' + _MANY + b'}}}}', "result"),
    "tools/list _meta": (b'{"jsonrpc":"2.0","id":7,"method":"tools/list","params":{"_meta":{"x":' + _MANY + b'}}}', "result"),
    "an id": (b'{"jsonrpc":"2.0","id":' + _MANY + b',"method":"ping"}', "error"),
    # Elements of their own: read as a list, each was built (a third of a second a line of 15 MB).
    "a batch of millions of messages": (b"[" + b",".join([b"{}"] * 5_000_000) + b"]", "error"),
    "a batch's method": (b'[{"jsonrpc":"2.0","id":1,"method":' + _MANY + b'},{"jsonrpc":"2.0","id":2,"method":"ping"}]', "batch"),
    "a stateless request's _meta": (b'{"jsonrpc":"2.0","id":7,"method":"tools/list","params":{"_meta":{' + _V + b':"2026-07-28",'
                                    + _C + b':{"x":' + _MANY + b'}}}}', "result"),
}


@pytest.mark.parametrize("where", list(ELEMENTS))
def test_millions_of_elements_in_a_field_only_looked_at_stall_no_one(hostile_daemon: Daemon, env: Env, where: str) -> None:
    line, answer = ELEMENTS[where]
    with RawConnection(env.socket, timeout=30) as warm:  # the project's modules loaded before the watch
        warm.request("atomic/attach", {"directory": str(env.project)})
    with RawConnection(env.socket, timeout=30) as raw:
        if not where.startswith(("initialize", "a stateless")):
            revision = "2025-03-26" if "batch" in where else "2025-06-18"  # the one revision with batches
            raw.request("initialize", {"protocolVersion": revision, "capabilities": {}, "clientInfo": {"name": "c", "version": "1"}})
            raw.request("atomic/attach", {"directory": str(env.project)})
        pings = _hostile_lines(env, raw, line, answer, 10 if "millions of messages" in where else 3)
        after = raw.request("ping", {})  # a stateless session answers a ping without _meta with -32602
        assert "result" in after or where.startswith("a stateless"), ("the connection still serves", after)
    # What a loaded machine's scheduling adds (one ping late by a second) stays below.
    waited = sum(max(0.0, took - 0.1) for took in pings)
    assert waited < 1.0, f"pings waited {waited:.2f} s in all (the slowest {max(pings):.2f} s) while such lines came"


def _hostile_lines(env: Env, raw: RawConnection, line: bytes, answer: str, times: int) -> list[float]:
    """Send ``line`` ``times`` times, each answered as ``answer`` says, while a bystander pings."""
    with pinging(env.socket) as pings:
        for _ in range(times):
            raw.sock.sendall(line + b"\n")
            reply = json.loads(raw.file.readline())
            if answer == "batch":  # the bad method's error and the ping's result, in one array
                assert sorted("result" in part for part in reply) == [False, True], reply
                continue
            assert answer in reply, str(reply)[:300]
            if answer == "error":
                assert reply["id"] is None and reply["error"]["code"] == -32600, reply
    return pings


def test_allow_and_deny_lists_are_bounded_before_they_are_read(hostile_daemon: Daemon, env: Env) -> None:
    """Each glob of a session's allow and deny lists is matched against every tool of each view of
    its project (and a bridge's go into its script's command line): a list of millions of globs held
    the event loop minutes. They are refused by their size, before any is built."""
    from atomictoolsd.sessions.messages import GLOB_MOST, MOST_GLOBS

    many = b"[" + b",".join([b'"echo*"'] * 2_000_000) + b"]"
    with pinging(env.socket) as pings, RawConnection(env.socket, timeout=30) as raw:
        for method, extra in (("atomic/attach", b""), ("atomic/bridges/create", b'"agent":"generic",')):
            for key in ("allow", "deny"):
                line = (b'{"jsonrpc":"2.0","id":7,"method":"' + method.encode() + b'","params":{' + extra
                        + b'"directory":' + json.dumps(str(env.project)).encode() + b',"' + key.encode() + b'":' + many + b"}}\n")
                raw.sock.sendall(line)
                reply = json.loads(raw.file.readline())
                assert reply["error"]["code"] == -32602 and f"at most {MOST_GLOBS} globs" in reply["error"]["message"], reply
        # Within the bounds, taken; one past either, refused saying which.
        most = ["echo*"] * (MOST_GLOBS - 1) + ["e" * GLOB_MOST]
        assert "result" in raw.request("atomic/attach", {"directory": str(env.project), "allow": most})
        for past in (most + ["echo"], ["e" * (GLOB_MOST + 1)]):
            reply = raw.request("atomic/attach", {"directory": str(env.project), "deny": past})
            assert reply["error"]["code"] == -32602 and "deny" in reply["error"]["message"], reply
    waited = sum(max(0.0, took - 0.1) for took in pings)
    assert waited < 1.0, f"pings waited {waited:.2f} s in all (the slowest {max(pings):.2f} s)"


def test_odd_values_in_every_field_are_32602_never_32603(hostile_daemon: Daemon, env: Env, record) -> None:  # type: ignore[no-untyped-def]
    tried = 0
    next_id = 0
    lines: list[tuple[str, bytes, int | None]] = []
    for method, fields in FIELDS.items():
        base = {"tools/call": b'"name":"echo",', "atomic/bridges/create": b'"agent":"generic","directory":"/tmp",'}.get(method, b"")
        for field in fields:
            for value in ODD_VALUES:
                next_id += 1
                params = b"{" + (base if field not in ("name", "agent") else b"") + json.dumps(field).encode() + b":" + value + b"}"
                lines.append((f"{method} {field}={value[:12]!r}", params, next_id))
        for value in ODD_VALUES:  # params itself not an object
            next_id += 1
            lines.append((f"{method} params={value[:12]!r}", value, next_id))
    for key in META:
        for value in ODD_VALUES:
            next_id += 1
            params = b'{"name":"echo","arguments":{"text":"x"},"_meta":{' + json.dumps(key).encode() + b":" + value + b"}}"
            lines.append((f"tools/call _meta.{key}={value[:12]!r}", params, next_id))
    raws: dict[str, RawConnection] = {}
    for case, params, request_id in lines:
        method = case.split(" ")[0]
        if method not in raws:  # a connection per method: an attach with lock would refuse the bridges
            raws[method] = hostile_daemon.raw()
        raw = raws[method]
        tried += 1
        raw.send_bytes(_line({"jsonrpc": b'"2.0"', "id": str(request_id).encode(), "method": json.dumps(method).encode(), "params": params}))
        for reply in _replies_until(raw, {request_id}, own=request_id):
            if "error" in reply:
                assert reply["error"]["code"] != -32603, f"{case}: {reply}"
    # Odd ids: answered with id null, the connection usable.
    raw = hostile_daemon.raw()
    for value in ODD_VALUES + [b'"' + b"i" * 1000 + b'"']:
        tried += 1
        raw.send_bytes(b'{"jsonrpc":"2.0","id":' + value + b',"method":"ping"}\n')
        raw.send({"jsonrpc": "2.0", "id": "probe", "method": "ping"})
        for reply in _replies_until(raw, {"probe"}):
            if "error" in reply:
                assert reply["error"]["code"] in (-32600, -32700) and reply["id"] is None, reply
    # Bridges the matrix made go at stop with the daemon; remove them now all the same.
    for bridge in raw.request("atomic/bridges/list")["result"]["bridges"]:
        raw.request("atomic/bridges/remove", {"id": bridge["id"]})
    for each in raws.values():
        each.close()
    record(f"{tried} requests with huge numbers, odd types, NUL, lone surrogates and bytes that are not UTF-8, 100 kB strings and deep "
           f"values in {sum(map(len, FIELDS.values())) + len(META)} params fields and the id: none -32603")


def test_cursor_edge_cases_are_32602(hostile_daemon: Daemon, record) -> None:  # type: ignore[no-untyped-def]
    def b64(text: bytes) -> str:
        return base64.urlsafe_b64encode(text).decode()

    cursors = [
        b64(b"o" + b"9" * 5000), "9" * 5000, b64(b"o" + b"9" * 19), b64(b"o-1"), b64(b"o"), b64("o\u00b2".encode()),
        b64("o\u0661".encode()), b64(b"o99"), "", "x" * 100_000, "\u00e9", "o5", b64(b"\xff\xfe"), "====",
    ]
    with hostile_daemon.raw() as raw:
        page = raw.request("tools/list")["result"]
        names = [t["name"] for t in page["tools"]]
        while "nextCursor" in page:  # one tool a page: the cursors the daemon issues still work
            page = raw.request("tools/list", {"cursor": page["nextCursor"]})["result"]
            names += [t["name"] for t in page["tools"]]
        assert names == ["echo", "nap", "slow"]
        for cursor in cursors:
            reply = raw.request("tools/list", {"cursor": cursor})
            assert reply.get("error", {}).get("code") == -32602, (cursor[:20], reply)
            assert len(reply["error"]["message"]) < 300, "the error echoes the whole cursor"
    record(f"{len(cursors)} forged cursors (5,000 digits, non-ASCII digits, negative, 100 kB): all -32602; paging intact")


def test_a_duplicate_id_in_flight_is_refused_and_a_cancel_stops_the_first(hostile_daemon: Daemon, record) -> None:  # type: ignore[no-untyped-def]
    with hostile_daemon.raw() as raw:
        raw.request("tools/call", {"name": "slow", "arguments": {"seconds": 0}})  # a worker up
        for request_id in (7, "seven"):
            call = {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": {"name": "slow", "arguments": {"seconds": 1.5}}}
            raw.send(call)
            raw.send(call)
            refused = raw.recv()
            assert refused["id"] == request_id and refused["error"]["code"] == -32600, refused
            assert "already used" in refused["error"]["message"]
            raw.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": request_id}})
        # The same number as a string is another id; a listing with an id of a call in flight is refused too.
        # In one write, so that the listing is read while the call is surely in flight.
        raw.send_bytes(b"".join(json.dumps(m).encode() + b"\n" for m in [
            {"jsonrpc": "2.0", "id": 8, "method": "tools/call", "params": {"name": "nap", "arguments": {"seconds": 1.5}}},
            {"jsonrpc": "2.0", "id": "8", "method": "ping"},
            {"jsonrpc": "2.0", "id": 8, "method": "tools/list"},
        ]))
        # The cancelled calls' own tool, as long, sent after them: once it is answered, they would
        # have been too (it ran beside them, or after them).
        raw.send({"jsonrpc": "2.0", "id": "after", "method": "tools/call", "params": {"name": "slow", "arguments": {"seconds": 1.5}}})
        raw.send({"jsonrpc": "2.0", "id": "end", "method": "ping"})
        answers: dict[Any, list[dict[str, Any]]] = {}
        for message in _replies_until(raw, {"end", "after"}):
            answers.setdefault(message.get("id"), []).append(message)
        while len(answers.get(8, [])) < 2:  # the refused listing's answer, then the nap's
            for message in _replies_until(raw, {8}):
                answers.setdefault(message.get("id"), []).append(message)
        late = answers.get(7, []) + answers.get("seven", [])
        assert not late, f"a cancelled id was answered: {late}"
        assert answers["8"][0]["result"] == {}
        assert [m.get("error", {}).get("code") for m in answers[8]] == [-32600, None], answers[8]
        assert answers[8][1]["result"]["content"][0]["text"] == "napped"
        # Once answered, an id may be used again.
        assert raw.request("tools/call", {"name": "echo", "arguments": {"text": "again"}})["result"]
    record("2 duplicate ids (int and string) refused -32600 while in flight; their cancel left nothing answered; "
           "a listing reusing a call's id refused, the call answered once")


# -- half-close ----------------------------------------------------------------------------------

REQUESTS = [
    {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}},
    {"jsonrpc": "2.0", "method": "notifications/initialized"},
    {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
    {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "slow", "arguments": {"seconds": 1.0}}},
    {"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": "echo", "arguments": {"text": "hi"}}},
]


def _requests(extra: list[dict[str, Any]] = ()) -> bytes:  # type: ignore[assignment]
    return b"".join(json.dumps(m).encode() + b"\n" for m in [*REQUESTS, *extra])


def _check_all_answered(out: bytes, ids: set[int]) -> None:
    answers = {m["id"]: m for m in map(json.loads, out.splitlines()) if "id" in m}
    assert set(answers) == ids, f"answered {sorted(answers)} of {sorted(ids)}"
    assert answers[3]["result"]["content"][0]["text"] == "slept"
    assert answers[4]["result"]["content"][0]["text"] == "hi"


def test_after_a_half_close_every_request_is_answered(hostile_daemon: Daemon, env: Env, record) -> None:  # type: ignore[no-untyped-def]
    ways = 0
    for last_newline in (True, False):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(30)
        sock.connect(str(env.socket))
        data = _requests()
        sock.sendall(data if last_newline else data.rstrip(b"\n"))
        sock.shutdown(socket.SHUT_WR)  # what `echo … | socat - UNIX-CONNECT:…` does
        out = b""
        while chunk := sock.recv(65536):  # the daemon closes once it has answered all
            out += chunk
        sock.close()
        _check_all_answered(out, {1, 2, 3, 4})
        ways += 1
    # The shim: stdin closes after the requests, as with `printf … | atomictoolsd mcp`; also through
    # the dispatcher's meta-tool.
    dispatched = [{"jsonrpc": "2.0", "id": 5, "method": "tools/call",
                   "params": {"name": "atomic_call_tool", "arguments": {"name": "slow", "arguments": {"seconds": 1.0}}}}]
    for args, extra in ((["mcp", "--no-autostart"], []), (["mcp", "--no-autostart", "--dispatcher"], dispatched)):
        done = subprocess.run([SHIM, *args], input=_requests(extra), capture_output=True, env=env.vars,
                              cwd=env.project, timeout=60)
        assert done.returncode == 0, done.stderr
        _check_all_answered(done.stdout, {1, 2, 3, 4} | {m["id"] for m in extra})
        if extra:
            answer = [m for m in map(json.loads, done.stdout.splitlines()) if m.get("id") == 5][0]
            assert answer["result"]["content"][0]["text"] == "slept"
        ways += 1
    record(f"{ways} half-closed sessions (raw socket with and without a last newline, shim, shim with the "
           f"dispatcher): initialize, tools/list and slow and fast calls all answered before the close")


# -- file descriptors ------------------------------------------------------------------------------

def _flood(path: Path, count: int) -> tuple[list[socket.socket], list[str]]:
    """Open ``count`` connections; return those the daemon kept and the refusals the others read."""
    opened: list[socket.socket] = []
    for _ in range(count):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(15)
        sock.connect(str(path))
        opened.append(sock)
    kept: list[socket.socket] = []
    refusals: list[str] = []
    for sock in opened:  # a kept one answers a ping; a refused one has read its error line
        try:
            sock.sendall(b'{"jsonrpc":"2.0","id":0,"method":"ping"}\n')
        except OSError:
            pass  # refused and closed already
        line = sock.makefile("rb").readline()
        if b'"result"' in line:
            kept.append(sock)
        else:
            refusals.append(line.decode())
            sock.close()
    return kept, refusals


def test_a_connection_flood_under_a_low_fd_limit_spares_the_workers(env: Env, make_daemon, record) -> None:  # type: ignore[no-untyped-def]
    _tools(env)
    daemon = make_daemon()
    process = psutil.Process(daemon.pid)
    soft, hard = resource.prlimit(daemon.pid, resource.RLIMIT_NOFILE)
    probe = daemon.raw()  # opened before the flood, so that it is among the connections kept
    assert probe.request("tools/call", {"name": "echo", "arguments": {"text": "warm"}})["result"]

    def kill_worker() -> None:
        (module,) = [m for m in probe.request("atomic/status")["result"]["modules"] if m["path"].endswith("echo.py")]
        os.kill(module["worker"], signal.SIGKILL)

        def noticed() -> bool:
            modules = probe.request("atomic/status")["result"]["modules"]
            return all(m["worker"] != module["worker"] for m in modules if m["path"].endswith("echo.py"))

        wait_for(noticed, message="the daemon to notice its worker died")

    resource.prlimit(daemon.pid, resource.RLIMIT_NOFILE, (256, hard))
    flood: list[socket.socket] = []
    try:
        flood, refusals = _flood(env.socket, 300)
        assert refusals, "no connection was refused under a 256 fd limit"
        refusal = json.loads(refusals[0].splitlines()[0])
        assert refusal["error"]["code"] == -32000 and "Too many connections" in refusal["error"]["message"]
        assert "ATOMICTOOLS_MAX_CONNECTIONS" in refusal["error"]["message"]
        kept = len(flood)
        # A call that needs a new worker still gets one: descriptors were kept for it.
        kill_worker()
        answer = probe.request("tools/call", {"name": "echo", "arguments": {"text": "respawned"}})
        assert answer["result"]["content"][0]["text"] == "respawned", answer
        # Below what is open already, a spawn cannot get its descriptors: the call fails at once,
        # naming the cause, not "timed out" after a minute.
        kill_worker()
        resource.prlimit(daemon.pid, resource.RLIMIT_NOFILE, (process.num_fds(), hard))
        failed = probe.request("tools/call", {"name": "echo", "arguments": {"text": "x"}, "_meta": {"atomic/timeout": 50}})
        assert failed["result"].get("isError"), failed
        text = failed["result"]["content"][0]["text"]
        assert "Too many open files" in text and "timed out" not in text, text
    finally:
        resource.prlimit(daemon.pid, resource.RLIMIT_NOFILE, (soft, hard))
        for sock in flood:
            sock.close()
        probe.close()
    # The flood gone and the limit back, new clients work, workers included.
    def fresh_call() -> bool:
        with daemon.raw() as raw:
            reply = raw.request("tools/call", {"name": "echo", "arguments": {"text": "after"}})
        return reply.get("result", {}).get("content", [{}])[0].get("text") == "after"

    wait_for(fresh_call, timeout=20, message="a new client's call to work after the flood")
    record(f"300 connections under a 256-fd limit: {kept} kept, {len(refusals)} refused with -32000 and the reason; "
           f"a respawn within the limit served; a spawn past it failed at once naming EMFILE; new clients then served")


# -- the socket file deleted ---------------------------------------------------------------------

def _cli(env: Env, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SHIM, *args], env=env.vars, cwd=env.project, capture_output=True, text=True, timeout=timeout)


def _connectable(path: Path) -> bool:
    try:
        with RawConnection(path, timeout=2) as raw:
            return "result" in raw.request("ping")
    except OSError:
        return False


def _sigterm_pending(pid: int) -> bool:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("ShdPnd:"):
                return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    return False


def test_a_deleted_socket_is_made_again_and_the_cli_finds_the_daemon_by_its_lock(env: Env, make_daemon, record) -> None:  # type: ignore[no-untyped-def]
    _tools(env)
    daemon = make_daemon()
    old = daemon.raw()
    env.socket.unlink()
    wait_for(lambda: _connectable(env.socket), timeout=10, message="the daemon to listen on a new socket")
    assert old.request("ping")["result"] == {}, "an open connection was lost"
    old.close()
    # A new shim (it would autostart a daemon if none listened) reaches the same daemon.
    done = subprocess.run([SHIM, "mcp", "--no-autostart"], input=_requests(), capture_output=True,
                          env=env.vars, cwd=env.project, timeout=60)
    _check_all_answered(done.stdout, {1, 2, 3, 4})
    status = _cli(env, "status", "--json")
    assert status.returncode == 0 and json.loads(status.stdout)["pid"] == daemon.pid, status

    # The whole runtime dir deleted: socket and lock come back, and the daemon is still the one.
    for entry in env.runtime_dir.iterdir():
        if entry.is_file() or entry.is_socket():
            entry.unlink()
    wait_for(lambda: _connectable(env.socket) and (env.runtime_dir / "atomictoolsd.lock").exists(),
             timeout=10, message="the socket and lock made again")
    assert (env.runtime_dir / "atomictoolsd.lock").read_text().strip() == str(daemon.pid)

    # A daemon that cannot put its socket back (stopped here): status and stop find it by its lock.
    os.kill(daemon.pid, signal.SIGSTOP)
    try:
        env.socket.unlink()
        status = _cli(env, "status")
        assert status.returncode == 1 and f"pid {daemon.pid}" in status.stderr and "lock" in status.stderr, status
        stop = subprocess.Popen([SHIM, "stop"], env=env.vars, cwd=env.project, stdout=subprocess.PIPE, text=True)
        wait_for(lambda: _sigterm_pending(daemon.pid), timeout=30, message="stop to signal the daemon it found by its lock")
    finally:
        os.kill(daemon.pid, signal.SIGCONT)
    out, _ = stop.communicate(timeout=60)
    assert stop.returncode == 0 and f"stopped (pid {daemon.pid})" in out, out
    assert daemon.proc.wait(timeout=30) == 0
    assert not env.socket.exists() and not (env.runtime_dir / "atomictoolsd.lock").exists()
    record("socket deleted: a new one within a second, the open connection kept, a new shim served; the runtime "
           "dir emptied: socket and lock made again by the same daemon; socket gone and daemon stopped: "
           "status names its pid from the lock, stop stops it")
