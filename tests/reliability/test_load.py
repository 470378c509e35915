"""Load: 200 concurrent clients making mixed calls, several in flight on each connection, some
cancelled; every call answered exactly once (a cancelled one never), correctly."""

from __future__ import annotations

import asyncio
import json
import random
import time

import pytest

from helpers import Daemon, Env

TOOLS = '''
    import time
    from typing import Annotated
    from atomictools import Field, tool

    @tool
    def mix(text: str) -> str:
        return text[::-1]

    @tool
    def add(a: int, b: Annotated[int, Field(ge=0)]) -> int:
        return a + b

    @tool
    def nap(ms: int) -> str:
        time.sleep(ms / 1000)
        return f"slept {ms}"

    @tool
    async def anap(ms: int) -> str:
        import asyncio
        await asyncio.sleep(ms / 1000)
        return f"async slept {ms}"
'''

CLIENTS = 200
SECONDS = 5.0


def _request(kind: str, rng: random.Random) -> tuple[dict, object]:  # type: ignore[type-arg]
    """A request and what its answer must be: ('text', …), ('error_text', prefix) or ('rpc_error', code)."""
    if kind == "mix":
        text = f"{rng.random():.12f}"
        return {"name": "mix", "arguments": {"text": text}}, ("text", text[::-1])
    if kind == "add":
        a, b = rng.randint(-1000, 1000), rng.randint(0, 1000)
        return {"name": "mix_add", "arguments": {"a": a, "b": b}}, ("structured", {"result": a + b})
    if kind == "nap":
        ms = rng.randint(1, 20)
        return {"name": "mix_nap", "arguments": {"ms": ms}}, ("text", f"slept {ms}")
    if kind == "anap":
        ms = rng.randint(1, 20)
        return {"name": "mix_anap", "arguments": {"ms": ms}}, ("text", f"async slept {ms}")
    if kind == "bad":
        return {"name": "mix_add", "arguments": {"a": 1, "b": -1}}, ("error_text", "Invalid arguments for tool 'mix_add'")
    return {"name": "no_such_tool", "arguments": {}}, ("rpc_error", -32602)


WINDOW = 4  # requests each client keeps in flight on its one connection


def _check(reply: dict, expected: tuple[str, object]) -> None:  # type: ignore[type-arg]
    how, want = expected
    if how == "rpc_error":
        assert reply["error"]["code"] == want, reply
        return
    result = reply["result"]
    if how == "text":
        assert result["content"][0]["text"] == want and not result.get("isError"), reply
    elif how == "structured":
        assert result["structuredContent"] == want, reply
    else:
        assert result["isError"] and result["content"][0]["text"].startswith(want), reply


async def _client(path: str, index: int, deadline: float, stats: dict) -> None:  # type: ignore[type-arg]
    """Keep ``WINDOW`` calls in flight, answers in any order; cancel some. Every call is answered
    exactly once (a cancelled one never), with the right result."""
    rng = random.Random(index)
    reader, writer = await asyncio.open_unix_connection(path, limit=1 << 22)
    waiting: dict[int, tuple[tuple[str, object], float, str]] = {}  # id → (expected, sent at, kind)
    cancelled: set[int] = set()
    request_id = 0
    try:
        while time.monotonic() < deadline or waiting:
            while time.monotonic() < deadline and len(waiting) < WINDOW:
                request_id += 1
                kind = rng.choice(["mix", "mix", "add", "nap", "anap", "bad", "unknown", "cancel"])
                if kind == "cancel":  # a slow call, cancelled at once: it must never be answered
                    params: dict = {"name": "mix_anap", "arguments": {"ms": 5000}}  # type: ignore[type-arg]
                    writer.write(json.dumps({"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}).encode() + b"\n")
                    writer.write(json.dumps({"jsonrpc": "2.0", "method": "notifications/cancelled",
                                             "params": {"requestId": request_id}}).encode() + b"\n")
                    cancelled.add(request_id)
                    stats["kinds"]["cancel"] = stats["kinds"].get("cancel", 0) + 1
                    continue
                params, expected = _request(kind, rng)
                waiting[request_id] = (expected, time.perf_counter(), kind)
                writer.write(json.dumps({"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}).encode() + b"\n")
            reply = json.loads(await reader.readline())
            answered = reply.get("id")
            assert answered not in cancelled, f"client {index}: cancelled call {answered} was answered: {reply}"
            assert answered in waiting, f"client {index}: an answer to nothing in flight (lost, duplicated or stray): {reply}"
            expected, sent, kind = waiting.pop(answered)
            stats["latencies"].append(time.perf_counter() - sent)
            _check(reply, expected)
            stats["calls"] += 1
            stats["kinds"][kind] = stats["kinds"].get(kind, 0) + 1
        # Nothing more may arrive: no duplicate, and no answer to a cancelled call, even late.
        writer.write(b'{"jsonrpc":"2.0","id":"last","method":"ping"}\n')
        last = json.loads(await reader.readline())
        assert last["id"] == "last", f"client {index}: a duplicate or stray answer arrived: {last}"
    finally:
        writer.close()


@pytest.mark.slow
def test_200_clients_every_call_answered_once_and_right(env: Env, make_daemon, record) -> None:  # type: ignore[no-untyped-def]
    env.write_tool(env.global_tools, "mix.py", TOOLS)
    daemon: Daemon = make_daemon()
    stats: dict = {"calls": 0, "latencies": [], "kinds": {}}  # type: ignore[type-arg]

    async def main() -> None:
        deadline = time.monotonic() + SECONDS
        await asyncio.gather(*(_client(str(env.socket), i, deadline, stats) for i in range(CLIENTS)))

    asyncio.run(main())
    latencies = sorted(stats["latencies"])
    p50 = latencies[len(latencies) // 2] * 1000
    p99 = latencies[int(len(latencies) * 0.99)] * 1000
    assert daemon.proc.poll() is None
    assert stats["calls"] > CLIENTS * 5, f"only {stats['calls']} calls in {SECONDS} s"
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(stats["kinds"].items()))
    record(
        f"{CLIENTS} clients, {WINDOW} calls in flight each, for {SECONDS:g} s: {stats['calls']} calls each answered "
        f"exactly once and correctly, {stats['kinds'].get('cancel', 0)} cancelled calls never answered ({kinds}); "
        f"p50 {p50:.1f} ms, p99 {p99:.1f} ms"
    )
