"""Found by an outside review: bytes that are not UTF-8 inside a call's arguments or a batch's id,
a connection closed mid-line, and exceptions whose message cannot be made or is megabytes long.
Each is answered with a clear error; the worker, the connection and other clients serve on, and
nothing is held after its connection is gone."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import psutil

from helpers import Daemon, Env, wait_for

TOOLS = '''
import asyncio, dataclasses, os, time
from typing import Any
from atomictools import Context, tool

@tool
def pid() -> str:
    return str(os.getpid())

@tool
def echo(text: str) -> str:
    return text

@tool
def sleep(seconds: float) -> str:
    time.sleep(seconds)
    return "slept"

class Unsayable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no words")

@tool
def unsayable() -> str:
    raise Unsayable()

@tool
async def unsayable_async() -> str:
    await asyncio.sleep(0)
    raise Unsayable()

@tool
def verbose() -> str:
    raise ValueError("x" * 1_000_000)

@dataclasses.dataclass
class Point:
    x: int

    def __post_init__(self) -> None:
        if self.x == 13:
            raise RuntimeError("unlucky")

@tool
def place(p: Point) -> str:
    return f"at {p.x}"

@tool
def place_ctx(p: Point, ctx: Context) -> str:
    return f"at {p.x}"

@tool
async def place_async(p: Point) -> str:
    return f"at {p.x}"
'''


def _call_bytes(raw: Any, request_id: int, arguments: bytes) -> dict[str, Any]:
    raw.send_bytes(b'{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"t_echo","arguments":%s}}\n'
                   % (request_id, arguments))
    return raw.reply(request_id)


def _busy(other: Any) -> tuple[threading.Thread, list[Any]]:
    """Another client's one-second call running in the worker (started, and under way): its thread,
    and the list its answer lands in."""
    slept: list[Any] = []
    sleeper = threading.Thread(target=lambda: slept.append(other.request("tools/call", {"name": "t_sleep", "arguments": {"seconds": 1}})))
    sleeper.start()
    time.sleep(0.2)
    return sleeper, slept


def test_a_byte_that_is_not_utf8_in_an_argument_is_an_invalid_argument_and_stalls_no_one(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    env.write_tool(env.global_tools, "t.py", TOOLS)
    daemon: Daemon = make_daemon()
    with daemon.raw() as raw, daemon.raw() as other:
        worker = raw.request("tools/call", {"name": "t_pid"})["result"]["content"][0]["text"]
        # The worker busy with another client's call, then the bad one, then that client's next call.
        sleeper, slept = _busy(other)
        answer = _call_bytes(raw, 90, b'{"text":"\xff"}')
        sleeper.join(10)
        assert slept and slept[0]["result"]["content"][0]["text"] == "slept"
        started = time.monotonic()
        after = other.request("tools/call", {"name": "t_sleep", "arguments": {"seconds": 0}})
        assert after["result"]["content"][0]["text"] == "slept" and time.monotonic() - started < 5, after
        result = answer["result"]
        assert result["isError"] and "Invalid arguments for tool 't_echo': a string in them is not UTF-8" in result["content"][0]["text"], result
        assert raw.request("tools/call", {"name": "t_pid"})["result"]["content"][0]["text"] == worker  # not a crash


def test_a_batch_message_whose_id_is_not_utf8_is_answered_in_the_array(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    daemon: Daemon = make_daemon()
    with daemon.raw() as raw:
        raw.result("initialize", {"protocolVersion": "2025-03-26", "capabilities": {}, "clientInfo": {"name": "b", "version": "1"}})
        raw.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        raw.send_bytes(b'[{"jsonrpc":"2.0","id":7,"method":"ping"},{"jsonrpc":"2.0","id":"\xff","method":"ping"}]\n')
        answers = raw.recv()
        assert isinstance(answers, list) and len(answers) == 2, answers
        assert {"jsonrpc": "2.0", "id": 7, "result": {}} in answers
        assert any(a.get("error", {}).get("code") == -32700 for a in answers), answers
        assert raw.request("ping")["result"] == {}  # the connection serves on


def test_a_line_left_half_read_is_freed_with_its_connection(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    daemon: Daemon = make_daemon()
    process = psutil.Process(daemon.pid)
    before = process.memory_info().rss
    connections = [daemon.raw() for _ in range(4)]
    for raw in connections:
        raw.send_bytes(b'{"jsonrpc":"2.0","id":1,"method":"ping","params":{"x":"' + b"a" * (15 << 20))
    wait_for(lambda: process.memory_info().rss > before + (50 << 20), timeout=30, message="the four half lines held")
    for raw in connections:
        raw.close()
    wait_for(lambda: process.memory_info().rss < before + (20 << 20), timeout=10,
             message=f"the half lines freed (RSS {process.memory_info().rss >> 20} MiB, {before >> 20} MiB before)")


def test_an_exception_without_a_message_or_with_megabytes_of_one_is_answered(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    env.write_tool(env.global_tools, "t.py", TOOLS)
    daemon: Daemon = make_daemon()
    with daemon.raw() as raw:
        worker = raw.request("tools/call", {"name": "t_pid"})["result"]["content"][0]["text"]
        for name in ("t_unsayable", "t_unsayable_async"):
            started = time.monotonic()
            result = raw.request("tools/call", {"name": name})["result"]
            text = result["content"][0]["text"]
            assert result["isError"] and text.startswith(f"Tool {name!r} raised Unsayable: (its message could not be made"), text
            assert time.monotonic() - started < 5
        result = raw.request("tools/call", {"name": "t_verbose"})["result"]
        text = result["content"][0]["text"]
        assert result["isError"] and text.startswith("Tool 't_verbose' raised ValueError: xxx") and "characters left out" in text
        assert len(json.dumps(result)) < 30_000, len(json.dumps(result))
        assert raw.request("tools/call", {"name": "t_pid"})["result"]["content"][0]["text"] == worker  # not a crash


def test_an_argument_whose_own_check_raises_fails_its_call_not_the_worker(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    """An argument type's own code (a dataclass's ``__post_init__``) raising what no validation error
    is: the call fails with what happened, and the worker, another client's call running in it, and
    the next call are untouched."""
    env.write_tool(env.global_tools, "t.py", TOOLS)
    daemon: Daemon = make_daemon()
    with daemon.raw() as raw, daemon.raw() as other:
        worker = raw.request("tools/call", {"name": "t_pid"})["result"]["content"][0]["text"]
        sleeper, slept = _busy(other)
        for name in ("t_place", "t_place_ctx", "t_place_async"):
            result = raw.request("tools/call", {"name": name, "arguments": {"p": {"x": 13}}})["result"]
            text = result["content"][0]["text"]
            assert result["isError"] and text.startswith(f"Tool {name!r} raised RuntimeError: unlucky"), text
            assert raw.request("tools/call", {"name": name, "arguments": {"p": {"x": 2}}})["result"]["content"][0]["text"] == "at 2"
        sleeper.join(10)
        assert slept and slept[0]["result"]["content"][0]["text"] == "slept", slept
        assert raw.request("tools/call", {"name": "t_pid"})["result"]["content"][0]["text"] == worker  # not a crash
