"""The JSON-RPC protocol on the socket, byte by byte: what a raw client (or socat) sees."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from atomictools._protocol import SUPPORTED_PROTOCOL_VERSIONS
from helpers import Daemon, Env, serving


@pytest.fixture(scope="module")
def echo_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """One daemon for the module's tests of the wire: they send lines and read what it answers."""
    env = Env(tmp_path_factory.mktemp("echo"))
    env.write_tool(env.global_tools, "echo.py", '''
        def echo(text: str) -> str:
            """Echo the text back."""
            return text
    ''')
    with serving(env) as daemon:
        yield daemon


def test_each_error_answers_and_the_connection_stays_usable(echo_daemon: Daemon) -> None:
    with echo_daemon.raw() as raw:
        cases = [
            (b"{not json\n", None, -32700),
            (b'{"jsonrpc":"2.0","id":7}\n', 7, -32600),
            (b'{"jsonrpc":"1.0","id":8,"method":"ping"}\n', 8, -32600),
            (b'{"jsonrpc":"2.0","id":9,"method":42}\n', 9, -32600),
            (b'[{"jsonrpc":"2.0","id":10,"method":"ping"}]\n', None, -32600),
            (b'{"jsonrpc":"2.0","id":11,"method":"no/such"}\n', 11, -32601),
            (b'{"jsonrpc":"2.0","id":12,"method":"tools/call","params":{"arguments":{}}}\n', 12, -32602),
            (b'{"jsonrpc":"2.0","id":13,"method":"tools/call","params":{"name":"missing"}}\n', 13, -32602),
            (b'{"jsonrpc":"2.0","id":14,"method":"tools/list","params":{"cursor":"bogus"}}\n', 14, -32602),
            (b'{"jsonrpc":"2.0","id":15,"method":"logging/setLevel","params":{"level":"chatty"}}\n', 15, -32602),
        ]
        for line, expected_id, code in cases:
            raw.send_bytes(line)
            reply = raw.recv()
            assert reply["jsonrpc"] == "2.0"
            assert reply["id"] == expected_id, line
            assert reply["error"]["code"] == code, (line, reply)
            assert reply["error"]["message"]
        assert raw.request("ping")["result"] == {}


def test_an_integer_id_of_any_size_is_answered_with_its_digits(echo_daemon: Daemon) -> None:
    """JSON's integers have no size: an id past 64 bits is answered as sent, a call's too."""
    with echo_daemon.raw() as raw:
        for digits in (b"18446744073709551616", b"-9223372036854775809", b"1" + b"0" * 40):
            raw.send_bytes(b'{"jsonrpc":"2.0","id":%s,"method":"tools/call","params":{"name":"echo","arguments":{"text":"x"}}}\n'
                           % digits)
            reply = raw.recv()
            assert reply["id"] == int(digits) and reply["result"]["content"][0]["text"] == "x", reply


def test_unknown_method_is_answered_at_once(echo_daemon: Daemon) -> None:
    """A client probing a method the daemon lacks (an SDK may wait seconds for silence) is answered now."""
    with echo_daemon.raw() as raw:
        raw.sock.settimeout(1.0)
        reply = raw.request("resources/list", {})
        assert reply["error"] == {"code": -32601, "message": "Method not found: resources/list"}


def test_notifications_get_no_answer_even_when_wrong(echo_daemon: Daemon) -> None:
    with echo_daemon.raw() as raw:
        raw.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        raw.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "nope"}})
        raw.send({"jsonrpc": "2.0", "method": "notifications/unknown"})
        reply = raw.request("ping")
        assert reply == {"jsonrpc": "2.0", "id": 1, "result": {}}


def test_oversized_messages_are_refused_and_the_next_line_is_served(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    daemon = make_daemon({"ATOMICTOOLS_MAX_MESSAGE_BYTES": "4096"})
    with daemon.raw() as raw:
        # Whole oversized line in one write.
        raw.send_bytes(b'{"jsonrpc":"2.0","id":1,"method":"ping","params":{"x":"' + b"a" * 10000 + b'"}}\n')
        reply = raw.recv()
        assert reply["error"]["code"] == -32600
        assert "too large" in reply["error"]["message"] and "4096" in reply["error"]["message"]
        # An oversized line arriving in pieces, with no newline yet: refused once, the rest discarded.
        raw.send_bytes(b'{"jsonrpc":"2.0","id":2,"method":"ping","params":{"x":"' + b"b" * 6000)
        reply = raw.recv()
        assert reply["error"]["code"] == -32600
        raw.send_bytes(b"b" * 6000 + b'"}}\n')
        assert raw.request("ping")["result"] == {}


def test_messages_split_across_writes_and_coalesced_in_one(echo_daemon: Daemon) -> None:
    with echo_daemon.raw() as raw:
        line = b'{"jsonrpc":"2.0","id":1,"method":"ping"}\n'
        for byte in line:
            raw.send_bytes(bytes([byte]))
        assert raw.recv()["id"] == 1
        raw.send_bytes(b"".join(b'{"jsonrpc":"2.0","id":%d,"method":"ping"}\n' % i for i in range(2, 50)))
        assert sorted(raw.recv()["id"] for _ in range(2, 50)) == list(range(2, 50))
        # Two lines cut at every byte: the first write ends in either line, the second ends the other.
        for cut in range(1, 2 * len(line)):
            stream = b'{"jsonrpc":"2.0","id":%d,"method":"ping"}\n{"jsonrpc":"2.0","id":%d,"method":"ping"}\n' % (
                100 + 2 * cut, 101 + 2 * cut)
            raw.send_bytes(stream[:cut])
            time.sleep(0.005)  # read on its own, most times
            raw.send_bytes(stream[cut:])
            assert sorted(raw.recv()["id"] for _ in range(2)) == [100 + 2 * cut, 101 + 2 * cut]


@pytest.mark.parametrize("version", SUPPORTED_PROTOCOL_VERSIONS)
def test_initialize_answers_with_the_clients_supported_version(echo_daemon: Daemon, version: str) -> None:
    with echo_daemon.raw() as raw:
        result = raw.request("initialize", {"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}})["result"]
        assert result["protocolVersion"] == version
        assert result["capabilities"] == {"tools": {"listChanged": True}, "logging": {}}
        assert result["serverInfo"]["name"] == "atomictoolsd"


def test_initialize_with_an_unknown_version_gets_the_latest(echo_daemon: Daemon) -> None:
    with echo_daemon.raw() as raw:
        result = raw.request("initialize", {"protocolVersion": "1999-01-01", "capabilities": {}, "clientInfo": {}})["result"]
        assert result["protocolVersion"] == SUPPORTED_PROTOCOL_VERSIONS[-1]


def test_tools_list_pages_with_opaque_cursors(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    for i in range(7):
        env.write_tool(env.global_tools, f"t{i}.py", f"def t{i}() -> str:\n    return '{i}'\n")
    daemon = make_daemon({"ATOMICTOOLS_PAGE_SIZE": "3"})
    with daemon.raw() as raw:
        names, cursor, pages = [], None, 0
        while True:
            reply = raw.request("tools/list", {"cursor": cursor} if cursor else {})["result"]
            names += [t["name"] for t in reply["tools"]]
            pages += 1
            cursor = reply.get("nextCursor")
            if not cursor:
                break
            assert not cursor.isdigit(), "cursors are opaque"
        assert names == [f"t{i}" for i in range(7)]
        assert pages == 3


def test_calls_by_socket_work_without_initialize_like_socat(echo_daemon: Daemon) -> None:
    with echo_daemon.raw() as raw:
        raw.send_bytes(b'{"jsonrpc":"2.0","id":"a","method":"tools/call","params":{"name":"echo","arguments":{"text":"hi"}}}\n')
        assert raw.recv() == {"jsonrpc": "2.0", "id": "a", "result": {"content": [{"type": "text", "text": "hi"}]}}


def test_null_arguments_mean_none(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    env.write_tool(env.global_tools, "now.py", "def now() -> str:\n    return 'ok'\n")
    daemon = make_daemon()
    with daemon.raw() as raw:
        for params in ({"name": "now"}, {"name": "now", "arguments": None}, {"name": "now", "arguments": {}}):
            assert raw.request("tools/call", params)["result"]["content"][0]["text"] == "ok"


def test_many_calls_in_flight_are_each_answered_once(echo_daemon: Daemon) -> None:
    with echo_daemon.raw() as raw:
        count = 500
        raw.send_bytes(b"".join(
            json.dumps({"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {"name": "echo", "arguments": {"text": f"m{i}"}}}).encode() + b"\n"
            for i in range(count)
        ))
        answers = [raw.recv() for _ in range(count)]
        assert sorted(a["id"] for a in answers) == list(range(count))
        assert all(a["result"]["content"][0]["text"] == f"m{a['id']}" for a in answers)


def test_requests_pipelined_behind_attach_see_the_attached_project(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    """The shim writes attach and the agent's first requests back to back: order must hold."""
    env.write_tool(env.local_tools, "local_only.py", "def local_only() -> str:\n    return 'here'\n")
    daemon = make_daemon()
    with daemon.raw() as raw:
        raw.send_bytes(
            json.dumps({"jsonrpc": "2.0", "id": 1, "method": "atomic/attach", "params": {"directory": str(env.project)}}).encode() + b"\n"
            + b'{"jsonrpc":"2.0","id":2,"method":"tools/list"}\n'
            + b'{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"local_only"}}\n'
        )
        replies = {reply["id"]: reply for reply in (raw.recv() for _ in range(3))}
    assert [t["name"] for t in replies[2]["result"]["tools"]] == ["local_only"]
    assert replies[3]["result"]["content"][0]["text"] == "here"


def test_a_client_that_never_reads_cannot_grow_the_daemon(echo_daemon: Daemon) -> None:
    """Requests keep coming, answers are never read: the daemon stops reading that client."""
    import psutil

    process = psutil.Process(echo_daemon.pid)
    before = process.memory_info().rss
    line = b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"' + b"x" * 4000 + b'"}}}\n'
    with echo_daemon.raw() as greedy:
        greedy.sock.settimeout(0.2)
        sent = 0
        try:
            while sent < 200_000:  # up to ~800 MB of requests, if the daemon kept reading
                greedy.sock.sendall(line)
                sent += 1
        except (TimeoutError, BlockingIOError):
            pass  # our send buffer is full: the daemon stopped reading us
        grown = process.memory_info().rss - before
        assert sent < 200_000, "the daemon kept reading a client that never reads"
        assert grown < 200 * 1024 * 1024, f"daemon grew by {grown / 1e6:.0f} MB"
        with echo_daemon.raw() as other:
            assert other.request("ping")["result"] == {}, "other clients are still served"
    print(f"requests accepted before the daemon pushed back: {sent}; daemon RSS growth: {grown / 1e6:.1f} MB")


def test_a_request_that_fails_unexpectedly_is_answered_and_the_connection_lives(echo_daemon: Daemon) -> None:
    """``~nosuchuser`` makes Path.expanduser raise RuntimeError inside a synchronous handler."""
    with echo_daemon.raw() as raw:
        reply = raw.request("atomic/attach", {"directory": "~nosuchuser-atomictools/x"})
        assert reply["error"]["code"] in (-32602, -32603), reply
        assert "nosuchuser" in reply["error"]["message"]
        assert raw.request("ping")["result"] == {}


def test_a_call_cancelled_while_its_project_still_loads_is_never_answered(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    env.write_tool(env.global_tools, "echo.py", "def echo(text: str) -> str:\n    return text\n")
    env.write_tool(env.local_tools, "slow_import.py", "import time\ntime.sleep(1.5)\n\ndef slow_import() -> str:\n    return 'x'\n")
    daemon = make_daemon()
    with daemon.raw() as raw:
        raw.send_bytes(
            json.dumps({"jsonrpc": "2.0", "id": 1, "method": "atomic/attach", "params": {"directory": str(env.project)}}).encode() + b"\n"
            + b'{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","arguments":{"text":"late"}}}\n'
            + b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":2}}\n'
        )
        assert raw.recv()["id"] == 1  # the attach answers once the project has loaded
        # The same call sent after it: had the cancelled one run, its answer would come first.
        raw.send_bytes(b'{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"echo","arguments":{"text":"after"}}}\n')
        assert raw.recv()["id"] == 3, "the cancelled call was answered"


def test_a_call_answered_at_once_after_its_project_loaded_is_not_left_in_flight(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    """A call that waited for its project's first scan and then named no tool is answered with an
    error; nothing of it stays among the session's calls in flight."""
    env.write_tool(env.local_tools, "slow_import.py", "import time\ntime.sleep(1.0)\n\ndef slow_import() -> str:\n    return 'x'\n")
    daemon = make_daemon()
    with daemon.raw() as raw:
        raw.send_bytes(
            json.dumps({"jsonrpc": "2.0", "id": 1, "method": "atomic/attach", "params": {"directory": str(env.project)}}).encode() + b"\n"
            + b'{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"nosuch","arguments":{}}}\n'
        )
        replies = {reply["id"]: reply for reply in (raw.recv(), raw.recv())}
        assert replies[2]["error"]["code"] == -32602
        status = raw.request("atomic/status")["result"]
    mine = [s for s in status["sessions"] if s["directory"] == str(env.project.resolve())]
    assert mine and mine[0]["inflight"] == 0, mine
