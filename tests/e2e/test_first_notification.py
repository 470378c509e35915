"""When the shim starts the daemon, the agent gets at most one notifications/tools/list_changed right
after initialize (the official MCP client, a fresh daemon with global, project and built-in tools)."""

from __future__ import annotations

import anyio

from helpers import Env
from shim_helpers import mcp_session, run, wait_until


def test_at_most_one_list_changed_after_initialize_when_the_shim_starts_the_daemon(detached: Env) -> None:
    env = detached
    del env.vars["ATOMICTOOLS_BUILTINS"]  # built-ins load too, as for a user
    env.write_tool(env.global_tools, "hello.py", "def hello() -> str:\n    return 'hello'\n")
    env.write_tool(env.local_tools, "local.py", "def local() -> str:\n    return 'local'\n")
    env.write_tool(env.local_tools, "slow.py", "import time\ntime.sleep(0.5)\ndef slow() -> str:\n    return 's'\n")

    async def scenario() -> list[str]:
        async with mcp_session(env, "--agent", "claude") as (session, seen):
            first = await session.list_tools()
            await anyio.sleep(2.0)  # every module has loaded, every notification has arrived
            listed = {t.name for t in (await session.list_tools()).tools}
            assert {"hello", "local", "slow", "file-reader"} <= listed, listed
            assert {t.name for t in first.tools} <= listed
            early = seen.methods().count("notifications/tools/list_changed")
            env.write_tool(env.local_tools, "later.py", "def later() -> str:\n    return 'later'\n")
            await wait_until(lambda: seen.methods().count("notifications/tools/list_changed") > early,
                             message="a real change is still announced")
            return early

    assert run(scenario) <= 1

