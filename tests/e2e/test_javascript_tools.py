"""TypeScript tool files of Atomic, OpenCode and the Copilot SDK, served unchanged: the examples of
their documentation (tests/fixtures/javascript), on Bun and on Node 22, listed and called through
the shim by the official MCP client; on Node also with the module hooks of Node before 22.15 (they
run in a thread of their own there).

One daemon per runtime serves every test of this file (a module fixture): Atomic's files are in the
project's ``.atomic/tools``, OpenCode's in its ``.opencode/tools``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest

from helpers import Daemon, Env
from javascript_helpers import js_settings
from shim_helpers import SHIM, mcp_session

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "javascript"
ATOMIC = ["lint", "weather_getTemp", "weather_forecast", "squad_decide", "squad_status"]
OPENCODE = ["patterns", "timestamp", "greet", "log_session", "context_report", "context_edit", "context_lines"]


@pytest.fixture(scope="module", params=["bun", "node", "node-thread"])
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Env, Daemon]]:
    runtime = request.param
    settings = js_settings(runtime)
    env = Env(tmp_path_factory.mktemp(f"js-{runtime}"))
    shutil.copytree(FIXTURES / "atomic", env.local_tools)
    shutil.copytree(FIXTURES / "opencode", env.project / ".opencode" / "tools")
    # What Atomic's lint example runs: `bun lint FILE`, the project's own lint script.
    (env.project / "package.json").write_text(json.dumps({"scripts": {"lint": "echo lint-ok"}}))
    env.vars["PATH"] = settings["PATH"]
    # A listing waits this long for modules still importing: twelve Bun or Node workers start at once
    # here, on a machine the other tests load too.
    daemon = Daemon(env, {**settings, "ATOMICTOOLS_LOAD_WAIT": "15"}).start()
    try:
        yield runtime, env, daemon
    finally:
        daemon.stop()
        left = daemon.reap_leftovers() if daemon.leftovers() else []
        env.cleanup()
        assert not left, f"processes left behind: {[p.pid for p in left]}"


def _text(result: Any) -> str:
    return "".join(block.text for block in result.content if block.type == "text")


def test_every_example_is_listed_with_its_schema(served: tuple[str, Env, Daemon]) -> None:
    runtime, env, daemon = served

    async def main() -> dict[str, Any]:
        async with mcp_session(env) as (session, _seen):
            return {tool.name: tool for tool in (await session.list_tools()).tools}

    tools = anyio.run(main)
    assert sorted(tools) == sorted(ATOMIC + OPENCODE)
    lint = tools["lint"].input_schema
    assert lint["properties"]["filePath"] == {"type": "string", "description": "Path to the file to lint"}
    assert lint["required"] == ["filePath"] and lint["additionalProperties"] is False
    assert tools["weather_getTemp"].description == "The current temperature in a city"
    unit = tools["weather_getTemp"].input_schema["properties"]["unit"]
    assert unit["enum"] == ["celsius", "fahrenheit"] and unit["type"] == "string"
    assert tools["weather_getTemp"].input_schema["required"] == ["city"]  # an optional field is not required
    days = tools["weather_forecast"].input_schema["properties"]["days"]
    assert (days["type"], days["minimum"], days["maximum"], days["default"]) == ("integer", 1, 7, 3)
    patterns = tools["patterns"].input_schema["properties"]
    assert patterns["email"]["format"] == "email"
    assert (patterns["limited"]["minLength"], patterns["limited"]["maxLength"]) == (1, 100)
    assert patterns["pattern"]["pattern"] == r"^\d{3}-\d{3}-\d{4}$"
    assert patterns["coords"]["minItems"] == patterns["coords"]["maxItems"] == 2
    assert patterns["items"]["items"]["properties"]["quantity"]["type"] == "number"
    assert patterns["config"]["required"] == ["host", "port"]
    assert [choice["const"] for choice in patterns["mode"]["anyOf"]] == ["auto", "manual"]
    assert "count" not in tools["patterns"].input_schema["required"]  # a default makes it optional for the caller
    assert patterns["note"]["description"] == "Anything else"
    status = tools["squad_status"].input_schema
    assert status["properties"]["agent"] == {"type": "string", "description": "The agent's name"}
    decide = tools["squad_decide"].input_schema["properties"]["category"]
    assert decide["default"] == "general" and "architecture" in decide["enum"]


def test_every_example_is_called_through_the_shim(served: tuple[str, Env, Daemon]) -> None:
    runtime, env, daemon = served

    async def main() -> dict[str, Any]:
        async with mcp_session(env) as (session, _seen):
            calls = {
                "getTemp": ("weather_getTemp", {"city": "Oslo", "unit": "fahrenheit"}),
                "forecast": ("weather_forecast", {"city": "Oslo"}),
                "greet": ("greet", {"name": "Alice", "enthusiastic": True}),
                "timestamp": ("timestamp", {}),
                "log": ("log_session", {}),
                "patterns": ("patterns", {
                    "email": "a@b.co", "limited": "x", "pattern": "555-123-4567", "age": 30, "score": 99.5,
                    "tags": ["a"], "coords": [1, 2], "items": [{"id": "i", "quantity": 2}],
                    "config": {"host": "h", "port": 80}, "format": "yaml", "mode": "auto", "name": "MiXeD",
                }),
                "bad": ("patterns", {"email": "not-an-email", "limited": "", "pattern": "x", "age": -1, "score": 1,
                                     "tags": [], "coords": [1], "items": [], "config": {"host": "h", "port": 1},
                                     "format": "ini", "mode": "auto", "name": "n"}),
                "decide": ("squad_decide", {"title": "Use Bun", "body": "Because.", "agentName": "fenster"}),
                "status": ("squad_status", {"agent": "hockney"}),
                "unknown_agent": ("squad_status", {"agent": "nobody"}),
                "status_bad": ("squad_status", {"verbose": True}),
                "typo": ("weather_getTemp", {"cty": "Oslo"}),
                "extra": ("weather_getTemp", {"city": "Rome", "wait_for_previous": True}),
                # More than a report of undeclared arguments names (the daemon refuses a longer one).
                "many_extra": ("weather_getTemp", {"city": "Rome", **{f"zz_extra_{i:03d}": i for i in range(200)}}),
            }
            if runtime == "bun":
                calls["lint"] = ("lint", {"filePath": "a.py"})
            return {key: await session.call_tool(name, arguments) for key, (name, arguments) in calls.items()}

    results = anyio.run(main)
    assert _text(results["getTemp"]) == "Oslo: 69.8°F"
    forecast = results["forecast"]
    assert forecast.structured_content == {"city": "Oslo", "days": [{"day": 1, "sky": "clear"}, {"day": 2, "sky": "clear"},
                                                                    {"day": 3, "sky": "clear"}]}
    assert json.loads(_text(forecast)) == forecast.structured_content
    assert _text(results["greet"]) == "HELLO, ALICE!"
    assert _text(results["timestamp"]).startswith("20")
    assert _text(results["log"]).startswith("Logged session ") and str(env.project) in _text(results["log"])
    echoed = json.loads(_text(results["patterns"]))
    assert echoed["count"] == 10 and echoed["name"] == "mixed"  # default and transform applied before execute
    bad = results["bad"]
    assert bad.is_error
    for field in ("$.email", "$.limited", "$.pattern", "$.age", "$.coords", "$.format"):
        assert f"`{field}`" in _text(bad), _text(bad)
    assert _text(results["decide"]).startswith('Decision "Use Bun" written to inbox') and not results["decide"].is_error
    inbox = env.project / ".squad" / "decisions" / "inbox" / "fenster-use-bun.md"
    assert "**Category:** general" in inbox.read_text()
    assert _text(results["status"]).startswith("hockney is working on the parser (session ")
    assert results["unknown_agent"].is_error and 'Agent "nobody" not found' in _text(results["unknown_agent"])
    assert results["status_bad"].is_error and "`$.agent`" in _text(results["status_bad"])
    assert results["typo"].is_error and "did you mean 'city'?" in _text(results["typo"])
    assert _text(results["extra"]) == "Rome: 21°C"  # a client's own argument is dropped, not refused
    assert _text(results["many_extra"]) == "Rome: 21°C"
    if runtime == "bun":
        assert _text(results["lint"]).strip() == "lint-ok a.py"


def test_list_shows_each_tool_s_runtime(served: tuple[str, Env, Daemon]) -> None:
    runtime, env, daemon = served
    done = subprocess.run([SHIM, "list", "--json"], env=env.vars, cwd=env.project, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    listed = {tool["name"]: tool for tool in json.loads(done.stdout)["tools"]}
    assert listed["greet"]["runtime"].startswith(f"{runtime.split('-')[0]} ")
    assert listed["greet"]["kind"] == "javascript" and listed["greet"]["path"].endswith("/.opencode/tools/myplugin.ts")
    plain = subprocess.run([SHIM, "list"], env=env.vars, cwd=env.project, capture_output=True, text=True, timeout=60).stdout
    assert f"({runtime.split('-')[0]} " in plain


def test_opencode_is_not_offered_the_tools_it_loads_itself(served: tuple[str, Env, Daemon]) -> None:
    runtime, env, daemon = served
    with daemon.client(agent="opencode") as client:
        names = {tool["name"] for tool in client.list_tools()}
    assert names == set(ATOMIC)
    with daemon.client(agent="claude") as client:
        assert {tool["name"] for tool in client.list_tools()} == set(ATOMIC + OPENCODE)


def test_each_call_has_its_own_sessions_context_when_sessions_take_turns(served: tuple[str, Env, Daemon]) -> None:
    # The worker is sent a call's context only when it differs from the call before's.
    runtime, env, daemon = served
    with daemon.client(agent="first") as a, daemon.client(agent="second") as b:
        seen = [a.call("greet", name="x").text, a.call("log_session").text, b.call("log_session").text,
                b.call("greet", name="y").text, a.call("log_session").text]
    assert seen[0] == "Hello, x!" and seen[3] == "Hello, y!"
    assert [seen[i].split(" in ")[0] for i in (1, 2, 4)] == [
        f"Logged session {a.session_id} for first", f"Logged session {b.session_id} for second", f"Logged session {a.session_id} for first",
    ]


def test_context_metadata_ask_and_a_long_result(served: tuple[str, Env, Daemon]) -> None:
    runtime, env, daemon = served
    progress: list[tuple[float, float | None, str | None]] = []
    logged: list[Any] = []
    asked: list[types.ElicitRequestParams] = []
    answers = iter([types.ElicitResult(action="accept", content={"allow": True}), types.ElicitResult(action="decline")])

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append((value, total, message))

    async def elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params)
        return next(answers)

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        logged.append(params.data)

    async def main() -> dict[str, Any]:
        async with mcp_session(env, elicitation_callback=elicit, logging_callback=on_log) as (session, _seen):
            return {
                "report": await session.call_tool("context_report", {}, progress_callback=on_progress),
                "allowed": await session.call_tool("context_edit", {"file": "a.txt"}),
                "denied": await session.call_tool("context_edit", {"file": "b.txt"}),
                "lines": await session.call_tool("context_lines", {"count": 2500}),
            }

    results = anyio.run(main)
    assert _text(results["report"]) == "reported"
    assert [message for _value, _total, message in progress] == ["step 1", "step 2"]
    assert {"title": "step 2", "metadata": {"done": 2}} in logged
    assert _text(results["allowed"]) == "edited a.txt"
    assert results["denied"].is_error and "permission denied: edit" in _text(results["denied"])
    assert "edit" in asked[0].message and "a.txt" in asked[0].message
    text = _text(results["lines"])
    assert text.startswith("line 1\nline 2\n") and "[output truncated: showing 2,000 of 2,500 lines" in text
    spill = Path(results["lines"].meta["atomic/fullOutput"])
    assert spill.read_text().count("\n") == 2499 and spill.read_text().endswith("line 2500")
