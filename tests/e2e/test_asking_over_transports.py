"""The example of what a tool can give and ask (examples/tools/images.py: an image result, and a
deletion confirmed with ``ctx.elicit``) and ``ctx.sample``, driven by the official MCP client
through the stdio shim and over the daemon's Streamable HTTP endpoint in a revision that asks the
client with requests (2025-11-25); and a question goes to the session whose call asked, never to
another session of the same project."""

from __future__ import annotations

import base64
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import ClientSession

from helpers import Daemon, Env
from shim_helpers import mcp_session, run

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tools" / "images.py"
PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010802000000907753de0000000c4944415408d763f8cfc0"
    "000003010100c9fe92ef0000000049454e44ae426082"
)
SAMPLE = '''
from atomictools import Context

def sample(ctx: Context, prompt: str) -> str:
    """Ask the client's model."""
    return "model says: " + ctx.sample(prompt, max_tokens=20).text
'''


@pytest.fixture
def project(env: Env) -> Env:
    env.local_tools.mkdir(parents=True, exist_ok=True)
    shutil.copy(EXAMPLE, env.local_tools / "images.py")
    env.write_tool(env.local_tools, "sample.py", SAMPLE)
    (env.project / "shot.png").write_bytes(PNG)
    return env


@asynccontextmanager
async def _http_session(env: Env, daemon: Daemon, **callbacks: Any) -> AsyncIterator[ClientSession]:
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    with daemon.raw() as raw:
        info = raw.request("atomic/status")["result"]["http"]
    token = Path(info["tokenFile"]).read_text().strip()
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=30) as http:
        async with streamable_http_client(f"{info['url']}?directory={env.project}", http_client=http) as (read, write):
            async with ClientSession(read, write, **callbacks) as session:
                await session.initialize()
                yield session


@asynccontextmanager
async def _session(via: str, env: Env, daemon: Daemon, **callbacks: Any) -> AsyncIterator[ClientSession]:
    if via == "shim":
        async with mcp_session(env, **callbacks) as (session, _):
            yield session
    else:
        async with _http_session(env, daemon, **callbacks) as session:
            yield session


@pytest.mark.parametrize("via", ["shim", "http"])
def test_the_example_shows_an_image_and_asks_before_deleting(project: Env, make_daemon: Any, via: str) -> None:
    env = project
    daemon = make_daemon({"ATOMICTOOLS_HTTP": "127.0.0.1:0"} if via == "http" else None)
    shot = env.project / "shot.png"
    asked: list[str] = []
    answers = iter([types.ElicitResult(action="decline"), types.ElicitResult(action="accept", content={})])

    async def elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return next(answers)

    async def sample(context: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        return types.CreateMessageResult(role="assistant", content=types.TextContent(type="text", text="hello"),
                                         model="m", stop_reason="endTurn")

    async def scenario() -> None:
        async with _session(via, env, daemon, elicitation_callback=elicit, sampling_callback=sample) as session:
            with anyio.fail_after(30):
                shown = await session.call_tool("images", {"path": "shot.png"})
                [block] = shown.content
                assert block.type == "image" and block.mime_type == "image/png" and base64.b64decode(block.data) == PNG

                kept = await session.call_tool("images_delete", {"path": "shot.png"})
                assert kept.content[0].text == "kept shot.png: the user chose decline" and shot.exists()
                deleted = await session.call_tool("images_delete", {"path": "shot.png"})
                assert deleted.content[0].text == "deleted shot.png" and not shot.exists()
                assert asked == ["Delete shot.png (69 bytes)?"] * 2

                sampled = await session.call_tool("sample", {"prompt": "hi"})
                assert not sampled.is_error and sampled.content[0].text == "model says: hello"

        # A client that cannot ask its user: the tool fails at once, readably, and deletes nothing.
        shot.write_bytes(PNG)
        async with _session(via, env, daemon) as session:
            with anyio.fail_after(20):
                refused = await session.call_tool("images_delete", {"path": "shot.png"})
                assert refused.is_error and "'elicitation' capability" in refused.content[0].text and shot.exists()

    run(scenario)


def test_a_question_goes_only_to_the_session_whose_call_asked(project: Env, make_daemon: Any) -> None:
    env = project
    daemon = make_daemon({"ATOMICTOOLS_HTTP": "127.0.0.1:0"})
    asked: dict[str, list[str]] = {"shim": [], "http": [], "bystander": []}

    def answering(who: str, action: str) -> Any:
        async def elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
            asked[who].append(params.message)
            return types.ElicitResult(action=action)  # type: ignore[arg-type]
        return elicit

    async def scenario() -> None:
        # Three sessions of one project, each able to answer: two over HTTP, one through the shim.
        async with _http_session(env, daemon, elicitation_callback=answering("bystander", "accept")) as bystander, \
                _http_session(env, daemon, elicitation_callback=answering("http", "decline")) as over_http, \
                mcp_session(env, elicitation_callback=answering("shim", "cancel")) as (through_shim, _):
            with anyio.fail_after(30):
                kept = await over_http.call_tool("images_delete", {"path": "shot.png"})
                assert kept.content[0].text == "kept shot.png: the user chose decline"
                kept = await through_shim.call_tool("images_delete", {"path": "shot.png"})
                assert kept.content[0].text == "kept shot.png: the user chose cancel"
                assert (await bystander.list_tools()).tools
        assert asked == {"shim": ["Delete shot.png (69 bytes)?"], "http": ["Delete shot.png (69 bytes)?"], "bystander": []}
        assert (env.project / "shot.png").exists()

    run(scenario)
