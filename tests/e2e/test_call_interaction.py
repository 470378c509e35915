"""What a tool reports and asks while it runs, as ``Client.call_tool`` and ``atomictoolsd call``
receive it: progress to a callback or the terminal, questions to a handler or a prompt, and a
clear failure, never a hang, where nobody can be asked."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from atomictools import Client
from helpers import Daemon, Env, serving

ASKER = '''
import msgspec
from atomictools import AskError, Context

class Order(msgspec.Struct):
    size: int
    colour: str = "red"

def order(ctx: Context) -> str:
    """Report progress, then ask for an order."""
    for step in range(1, 4):
        ctx.progress(step, 3, f"step {step}")
    try:
        answer = ctx.elicit("Which order?", Order)
    except AskError as exc:
        return f"could not ask: {exc}"
    if not answer.accepted:
        return f"no order ({answer.action})"
    return f"{answer.content.size} {answer.content.colour}"
'''


@pytest.fixture(scope="module")
def asking_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """One daemon for the module: each test calls the order tool and reads what it reported and asked."""
    env = Env(tmp_path_factory.mktemp("order"))
    env.write_tool(env.local_tools, "order.py", ASKER)
    with serving(env) as daemon:
        yield daemon


def test_call_tool_takes_a_progress_callback_and_a_question_handler(asking_daemon: Daemon) -> None:
    env = asking_daemon.env
    reports: list[tuple[float, float | None, str | None]] = []
    asked: list[str] = []

    def answer(message: str, schema: dict[str, Any]) -> dict[str, Any]:
        asked.append(message)
        assert set(schema["properties"]) == {"size", "colour"}
        return {"size": 3, "colour": "blue"}

    with Client(socket_path=str(env.socket), directory=str(env.project), autostart=False) as client:
        plain = client.call_tool("order")  # no handler: the tool cannot ask
        assert plain.text.startswith("could not ask"), plain.text
        result = client.call_tool("order", on_progress=lambda *r: reports.append(r), on_elicit=answer)
        assert result.text == "3 blue"
        assert reports == [(1, 3, "step 1"), (2, 3, "step 2"), (3, 3, "step 3")]
        assert asked == ["Which order?"]
        # The handlers were this call's: the next call has none, its progress is not kept.
        again = client.call("order", on_elicit=lambda message, schema: None)
        assert again.text == "no order (decline)"
        assert len(reports) == 3


def _cli(env: Env, *args: str) -> list[str]:
    return [sys.executable, "-m", "atomictoolsd", *args]


def test_call_without_a_terminal_refuses_the_question_at_once(asking_daemon: Daemon) -> None:
    env = asking_daemon.env
    done = subprocess.run(_cli(env, "call", "order"), env=env.vars, cwd=env.project, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("could not ask: "), done.stdout
    assert "no terminal" in done.stdout
    assert "the tool asks: 'Which order?', but there is no terminal to answer on" in done.stderr
    assert "[3/3]" not in done.stderr  # no progress line where nobody watches


def test_call_on_a_terminal_shows_progress_and_asks(asking_daemon: Daemon) -> None:
    env = asking_daemon.env
    main, side = pty.openpty()
    proc = subprocess.Popen(_cli(env, "call", "order"), env=env.vars, cwd=env.project,
                            stdin=side, stdout=subprocess.PIPE, stderr=side)
    os.close(side)
    seen = b""
    try:
        deadline = time.monotonic() + 30
        answers = iter([b"\n", b"4\n", b"green\n"])  # size is required: the empty answer is asked again
        while time.monotonic() < deadline and proc.poll() is None:
            ready, _, _ = select.select([main], [], [], 0.2)
            if not ready:
                continue
            try:
                chunk = os.read(main, 4096)
            except OSError:
                break
            seen += chunk
            if chunk.rstrip().endswith(b":"):
                os.write(main, next(answers, b"\n"))
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(main)
    assert out.decode() == "4 green\n", (out, seen)
    text = seen.decode(errors="replace")
    assert "[3/3] step 3" in text and "Which order?" in text
    assert "an answer is required" in text


def test_the_async_client_takes_the_same_handlers(asking_daemon: Daemon) -> None:
    env = asking_daemon.env
    import asyncio

    from atomictools import AsyncClient

    async def scenario() -> tuple[str, list[Any]]:
        reports: list[Any] = []
        async with AsyncClient(socket_path=str(env.socket), directory=str(env.project), autostart=False) as client:
            result = await client.call_tool("order", on_progress=lambda *r: reports.append(r),
                                            on_elicit=lambda message, schema: {"size": 2})
            return result.text, reports

    text, reports = asyncio.run(scenario())
    assert text == "2 red"
    assert [r[0] for r in reports] == [1, 2, 3]
