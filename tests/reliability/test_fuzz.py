"""Fuzz the socket: random bytes, truncated and oversized lines, random JSON-RPC.

The invariants: the daemon never dies, every line it sends is a well-formed JSON-RPC message, the
connection stays usable after every input, and its open file descriptors and memory come back to
their baseline afterwards.
"""

from __future__ import annotations

import json
import os
import socket
import time
from typing import Any

import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import Daemon, Env, RawConnection

METHODS = [
    "initialize", "ping", "tools/list", "tools/call", "logging/setLevel", "atomic/attach", "atomic/list",
    "atomic/status", "atomic/subscribe", "atomic/reload", "atomic/bridges/create", "atomic/bridges/list",
    "atomic/bridges/remove", "atomic/trust/refresh", "notifications/cancelled", "notifications/initialized",
    "notifications/progress", "server/discover", "resources/list", "", "tools/", "\u2603",
]  # never atomic/shutdown: stopping is what that method is for

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=30),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=12,
)

# Parameters of the daemon's own methods, near enough to valid that they get past the first check.
atomic_params = st.fixed_dictionaries(
    {},
    optional={
        "directory": st.sampled_from(["/", "/tmp", "", ".", "relative", "/no/such/dir", "\x00"]) | st.text(max_size=20),
        "agent": st.sampled_from(["claude", "codex", "generic", "nope", ""]) | json_values,
        "allow": st.lists(st.text(max_size=5), max_size=3) | json_values,
        "deny": st.lists(st.text(max_size=5), max_size=3),
        "ownerPid": st.integers(-2, 2**31) | json_values,
        "name": st.text(max_size=70),
        "id": st.text(max_size=10) | json_values,
        "dispatcher": json_values,
        "events": st.lists(st.sampled_from(["tools", "logs", "x"]), max_size=3) | json_values,
        "requestId": st.integers() | st.text(max_size=5),
        "all": json_values,
    },
)

call_params = st.fixed_dictionaries(
    {"name": st.sampled_from(["echo", "nope", "", "e" * 100])},
    optional={"arguments": st.dictionaries(st.sampled_from(["text", "x", ""]), json_values, max_size=3) | json_values, "_meta": json_values},
)

rpc_messages = st.fixed_dictionaries(
    {"jsonrpc": st.sampled_from(["2.0", "2.0", "2.0", "1.0", 2]), "method": st.sampled_from(METHODS) | st.text(max_size=20)},
    optional={"id": st.integers() | st.text(max_size=8) | st.none() | st.floats(allow_nan=False), "params": call_params | atomic_params | json_values},
)


def _line(message: Any) -> bytes:
    return json.dumps(message).encode() + b"\n"


# Bridge requests valid enough to make a bridge now and then, with odd names, globs and owners.
bridge_requests = st.fixed_dictionaries({
    "jsonrpc": st.just("2.0"), "id": st.integers(), "method": st.just("atomic/bridges/create"),
    "params": st.fixed_dictionaries(
        {"agent": st.sampled_from(["claude", "opencode", "codex", "copilot", "cursor", "generic"]),
         "directory": st.sampled_from(["/", "/tmp"])},
        optional={"allow": st.lists(st.text(max_size=8), max_size=3), "deny": st.lists(st.text(max_size=8), max_size=3),
                  "name": st.text(max_size=70), "dispatcher": st.booleans(), "ownerPid": st.integers(-1, 4_194_304)},
    ),
})

fuzz_inputs = st.one_of(
    bridge_requests.map(_line),
    st.binary(max_size=300).map(lambda b: b + b"\n"),
    rpc_messages.map(_line),
    rpc_messages.map(_line).flatmap(lambda line: st.integers(1, max(1, len(line) - 1)).map(lambda cut: line[:cut] + b"\n")),
    st.lists(rpc_messages.map(_line), min_size=2, max_size=5).map(b"".join),
    st.integers(70_000, 200_000).map(lambda n: b'{"jsonrpc":"2.0","id":1,"method":"ping","params":"' + b"x" * n + b'"}\n'),
)


class Probe:
    """One connection that checks every line the daemon sends and that it still answers."""

    def __init__(self, path: str) -> None:
        self.raw = RawConnection(path)  # type: ignore[arg-type]
        self.lines = 0
        self.next_ping = 10**9

    def send_and_check(self, data: bytes) -> None:
        self.raw.send_bytes(data)
        self.next_ping += 1
        self.raw.send({"jsonrpc": "2.0", "id": self.next_ping, "method": "ping"})
        while True:
            message = self.raw.recv()  # raises on EOF: the connection must stay open
            self.lines += 1
            assert message.get("jsonrpc") == "2.0", message
            assert ("result" in message) != ("error" in message) or "method" in message, message
            if "error" in message:
                assert isinstance(message["error"]["code"], int) and message["error"]["message"], message
            if message.get("id") == self.next_ping and "result" in message:
                return


def _descriptors(pid: int) -> set[tuple[str, str]]:
    """What each descriptor of ``pid`` refers to (its number, its link), for a failure to show."""
    found = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            found.add((fd, os.readlink(f"/proc/{pid}/fd/{fd}")))
        except OSError:
            continue
    return found


@pytest.fixture
def fuzz_daemon(env: Env, make_daemon) -> Daemon:  # type: ignore[no-untyped-def]
    env.write_tool(env.global_tools, "echo.py", "def echo(text: str) -> str:\n    return text\n")
    return make_daemon({"ATOMICTOOLS_MAX_MESSAGE_BYTES": "65536"})


def test_fuzzed_input_never_breaks_the_daemon(fuzz_daemon: Daemon, env: Env, record) -> None:  # type: ignore[no-untyped-def]
    process = psutil.Process(fuzz_daemon.pid)
    with fuzz_daemon.raw() as warm:  # load the echo module and settle the baseline first
        warm.request("tools/call", {"name": "echo", "arguments": {"text": "warm"}})
    fds_before = process.num_fds()
    opened_before = _descriptors(process.pid)
    rss_before = process.memory_info().rss
    probe = Probe(str(env.socket))
    tried = [0]

    @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), derandomize=False)
    @given(fuzz_inputs)
    def check(data: bytes) -> None:
        tried[0] += 1
        probe.send_and_check(data)

    check()
    probe.raw.close()

    # Connections that end abruptly, mid-line, many times.
    for i in range(200):
        sock = socket.socket(socket.AF_UNIX)
        sock.connect(str(env.socket))
        sock.sendall(b'{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"echo","argu' % i)
        sock.close()

    with fuzz_daemon.raw() as after:
        assert after.request("ping")["result"] == {}
        listed = after.request("atomic/bridges/list")["result"]["bridges"]
        bridges = len(listed)
        # A bridge whose owner lives (the fuzz names pids such as 1) watches it through a pidfd for
        # as long as it lasts: a descriptor held by design, not leaked.
        allowed = fds_before + 2 + sum(1 for bridge in listed if bridge.get("ownerPid"))
        # A torn connection's descriptor goes when the loop reads its end, which may be a few turns
        # after this one was answered: a leak is a count that stays up, not one that was up.
        settle = time.monotonic() + 5
        while (fds_after := process.num_fds()) > allowed and time.monotonic() < settle:
            time.sleep(0.05)
        rss_after = process.memory_info().rss
    assert fuzz_daemon.proc.poll() is None
    assert fds_after <= allowed, f"file descriptors {fds_before} → {fds_after}: {_descriptors(process.pid) - opened_before}"
    # Whatever the fuzz made (bridges, above all) goes when the daemon stops: nothing is left.
    assert fuzz_daemon.stop() == 0
    assert os.listdir(env.runtime_dir) == [], "the daemon left files in its runtime dir"
    assert rss_after - rss_before < 64 * 1024 * 1024, f"RSS {rss_before / 1e6:.0f} → {rss_after / 1e6:.0f} MB"
    record(
        f"{tried[0]} fuzzed inputs and 200 torn connections; {probe.lines} reply lines all well-formed; "
        f"{bridges} bridges the fuzz made, all gone at stop with everything else in the runtime dir; "
        f"fds {fds_before}→{fds_after}; RSS {rss_before / 1e6:.1f}→{rss_after / 1e6:.1f} MB"
    )
