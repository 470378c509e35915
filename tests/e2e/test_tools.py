"""Tool modules served by a real daemon: listing, calls, results, failures and precedence."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from atomictools import RPCError
from helpers import Daemon, Env, serving, wait_for

MATH = '''
    from typing import Annotated
    import msgspec
    from atomictools import tool, Field, ToolError

    class Sum(msgspec.Struct):
        total: int
        count: int

    @tool
    def add(numbers: list[int]) -> Sum:
        """Add numbers."""
        return Sum(total=sum(numbers), count=len(numbers))

    @tool(name="div", annotations={"readOnlyHint": True})
    def divide(a: float, b: Annotated[float, Field("divisor", gt=0)]) -> float:
        """Divide a by b."""
        return a / b

    @tool
    def refuse(reason: str) -> str:
        raise ToolError(f"refused: {reason}")

    @tool
    def oops() -> str:
        return {}["missing"]

    @tool
    def crash() -> str:
        import os
        os._exit(3)

    @tool
    def selfkill() -> str:
        import os, signal
        os.kill(os.getpid(), signal.SIGKILL)
'''


@pytest.fixture(scope="module")
def math_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """One daemon for the module's tests of math.py: they call it and read what it answers."""
    env = Env(tmp_path_factory.mktemp("math"))
    env.write_tool(env.local_tools, "math.py", MATH)
    with serving(env) as daemon:
        yield daemon


def test_listing_shows_names_schemas_and_annotations(math_daemon: Daemon) -> None:
    with math_daemon.client() as client:
        tools = {t["name"]: t for t in client.list_tools()}
    assert sorted(tools) == ["div", "math_add", "math_crash", "math_oops", "math_refuse", "math_selfkill"]
    assert tools["div"]["annotations"] == {"readOnlyHint": True}
    assert tools["div"]["inputSchema"]["properties"]["b"] == {"description": "divisor", "type": "number", "exclusiveMinimum": 0}
    assert tools["math_add"]["outputSchema"]["required"] == ["total", "count"]
    assert "timeout" not in tools["div"], "the daemon's own fields never reach clients"


def test_structured_results_carry_the_same_json_as_text(math_daemon: Daemon) -> None:
    with math_daemon.client() as client:
        result = client.call("math_add", numbers=[1, 2, 3])
        assert not result.is_error
        assert result.structured == {"total": 6, "count": 3}
        assert json.loads(result.text) == result.structured
        wrapped = client.call("div", a=1, b=4)
        assert wrapped.structured == {"result": 0.25}


def test_bad_arguments_never_reach_the_tool(math_daemon: Daemon) -> None:
    with math_daemon.client() as client:
        result = client.call("div", a=1, b=0)
        assert result.is_error
        assert result.text == "Invalid arguments for tool 'div': Expected `float` > 0.0 - at `$.b`"
        missing = client.call("math_add")
        assert missing.is_error and "missing required field `numbers`" in missing.text
        typed = client.call("math_add", numbers=["x"])
        assert typed.is_error and "at `$.numbers[0]`" in typed.text
        extra = client.call("div", a=1, bb=1)  # a near miss of a declared parameter (protocol.md)
        assert extra.is_error and "unknown argument 'bb'; did you mean 'b'?" in extra.text


def test_tool_errors_are_results_the_model_can_read(math_daemon: Daemon) -> None:
    with math_daemon.client() as client:
        refused = client.call("math_refuse", reason="no")
        assert refused.is_error and refused.text == "refused: no"
        oops = client.call("math_oops")
        assert oops.is_error
        assert oops.text.startswith("Tool 'math_oops' raised KeyError: 'missing'")
        assert "math.py" in oops.text and "runtime.py" not in oops.text, "the tool's frames, not ours"


@pytest.mark.parametrize(("tool", "cause"), [("math_crash", "exited with code 3"), ("math_selfkill", "was killed by SIGKILL (9)")])
def test_a_worker_dying_mid_call_names_the_cause_and_the_next_call_works(math_daemon: Daemon, tool: str, cause: str) -> None:
    with math_daemon.client() as client:
        before = {p.pid for p in math_daemon.workers()}
        result = client.call(tool)
        assert result.is_error
        assert result.text == f"Tool {tool!r} failed: its worker process {cause}"
        again = client.call("math_add", numbers=[2])
        assert again.structured == {"total": 2, "count": 1}
        after = {p.pid for p in math_daemon.workers()}
        assert after and after.isdisjoint(before), "a fresh worker serves the module"
        assert math_daemon.proc.poll() is None


def test_unknown_tool_is_a_protocol_error(math_daemon: Daemon) -> None:
    with math_daemon.client() as client, pytest.raises(RPCError) as info:
        client.call("nope")
    assert info.value.code == -32602 and "nope" in info.value.message


def test_a_broken_file_next_to_a_good_one(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    env.write_tool(env.local_tools, "good.py", "def good() -> str:\n    return 'fine'\n")
    env.write_tool(env.local_tools, "syntax.py", "x = 1\ndef syntax(:\n    pass\n")
    env.write_tool(env.local_tools, "raises.py", "import json\n\nraise RuntimeError('no config')\n")
    env.write_tool(env.local_tools, "empty.py", "X = 1\n")
    daemon = make_daemon()
    with daemon.client() as client:
        listing = client.request("atomic/list")
        assert [t["name"] for t in listing["tools"]] == ["good"]
        errors = {Path(e["file"]).name: e for e in listing["errors"]}
        assert errors["syntax.py"]["line"] == 2 and errors["syntax.py"]["message"].startswith("SyntaxError")
        assert errors["raises.py"]["line"] == 3 and errors["raises.py"]["message"] == "RuntimeError: no config"
        assert "no tools found" in errors["empty.py"]["message"]
        assert client.call("good").text == "fine"
        status = client.status()
        states = {Path(m["path"]).name: m["state"] for m in status["modules"]}
        assert states == {"good.py": "ready", "syntax.py": "failed", "raises.py": "failed", "empty.py": "failed"}


def test_local_tools_shadow_global_ones(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    env.write_tool(env.global_tools, "where.py", "def where() -> str:\n    return 'global'\n")
    env.write_tool(env.global_tools, "shared.py", "def shared() -> str:\n    return 'global shared'\n")
    env.write_tool(env.local_tools, "where.py", "def where() -> str:\n    return 'local'\n")
    daemon = make_daemon()
    elsewhere = env.root / "elsewhere"
    elsewhere.mkdir()
    with daemon.client() as client:
        assert client.call("where").text == "local"
        assert client.call("shared").text == "global shared"
        listing = client.request("atomic/list", {"all": True})
        assert {(t["name"], t["scope"]) for t in listing["tools"]} == {("where", "local"), ("shared", "global")}
        shadowed = listing["shadowed"]
        assert [(t["name"], t["scope"], t["shadowedBy"]["scope"]) for t in shadowed] == [("where", "global", "local")]
    with daemon.client(directory=elsewhere) as client:
        assert client.call("where").text == "global"


def test_name_clash_between_two_files_of_one_dir_keeps_the_first(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    env.write_tool(env.local_tools, "a.py", "from atomictools import tool\n@tool(name='same')\ndef f() -> str:\n    return 'a'\n")
    env.write_tool(env.local_tools, "b.py", "from atomictools import tool\n@tool(name='same')\ndef f() -> str:\n    return 'b'\n")
    daemon = make_daemon()
    with daemon.client() as client:
        assert client.call("same").text == "a"
        errors = client.request("atomic/list")["errors"]
        assert len(errors) == 1 and errors[0]["file"].endswith("b.py") and "already defined" in errors[0]["message"]


def test_helpers_are_importable_and_never_tools(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    env.write_tool(env.local_tools, "_shared.py", "PREFIX = 'shared:'\ndef helper() -> str:\n    return 'no'\n")
    env.write_tool(env.local_tools, "json.py", "from _shared import PREFIX\nimport json as stdlib\n\ndef json(x: int) -> str:\n    return PREFIX + stdlib.dumps([x])\n")
    daemon = make_daemon()
    with daemon.client() as client:
        assert [t["name"] for t in client.list_tools()] == ["json"]
        assert client.call("json", x=1).text == "shared:[1]", "a tool named like a stdlib module shadows nothing"


def test_context_is_filled_from_the_session_and_the_call(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    env.write_tool(env.local_tools, "who.py", '''
        from atomictools import Context
        def who(ctx: Context) -> dict:
            return {k: getattr(ctx, k) for k in ("session_id", "message_id", "agent", "directory", "worktree", "tool_use_id", "cancelled")}
    ''')
    (env.project / ".git").mkdir()
    sub = env.project / "src"
    sub.mkdir()
    daemon = make_daemon()
    with daemon.client(directory=sub, agent="tester") as client:
        params = {"name": "who", "arguments": {}, "_meta": {"atomic/messageId": "m1", "claudecode/toolUseId": "toolu_1"}}
        result = json.loads(client.request("tools/call", params)["content"][0]["text"])
    assert result == {
        "session_id": client.session_id,
        "message_id": "m1",
        "agent": "tester",
        "directory": str(sub),
        "worktree": str(env.project),
        "tool_use_id": "toolu_1",
        "cancelled": False,
    }


def test_each_call_has_its_own_sessions_context_when_sessions_take_turns(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    # A worker is sent a call's context only when it differs from the call before's: a call without
    # a ctx in between, a second session, and a call's own _meta must each still be told apart.
    env.write_tool(env.local_tools, "who.py", '''
        from atomictools import Context, tool

        @tool
        def who(ctx: Context) -> str:
            return f"{ctx.session_id} {ctx.agent} {ctx.message_id}"

        @tool
        def plain() -> str:
            return "plain"
    ''')
    daemon = make_daemon()
    with daemon.client(agent="first") as a, daemon.client(agent="second") as b:
        seen = [
            a.call("who_plain").text,
            a.call("who").text,
            b.call("who").text,
            b.call("who_plain").text,
            a.call("who").text,
            a.request("tools/call", {"name": "who", "arguments": {}, "_meta": {"atomic/messageId": "m1"}})["content"][0]["text"],
            a.call("who").text,
        ]
    mine, theirs = f"{a.session_id} first ", f"{b.session_id} second "
    assert seen == ["plain", mine, theirs, "plain", mine, mine + "m1", mine]


def test_async_and_sync_tools_run_concurrently(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    env.write_tool(env.local_tools, "slow.py", '''
        import asyncio, time
        from atomictools import tool

        @tool
        def slow(seconds: float) -> str:
            time.sleep(seconds)
            return "sync"

        @tool
        async def aslow(seconds: float) -> str:
            await asyncio.sleep(seconds)
            return "async"
    ''')
    daemon = make_daemon()
    results: list[str] = []

    def call(name: str) -> None:
        with daemon.client() as client:
            results.append(client.call(name, seconds=1.0).text)

    started = time.monotonic()
    threads = [threading.Thread(target=call, args=("slow" if i % 2 else "slow_aslow",)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - started
    assert sorted(results) == ["async"] * 8 + ["sync"] * 8
    # Queued one after another they would take 16 s; half that proves overlap on a noisy machine.
    assert elapsed < 8.0, f"16 one-second calls took {elapsed:.1f} s: they queued instead of overlapping"


def test_large_output_is_truncated_and_spilled(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    env.write_tool(env.local_tools, "big.py", "def big(n: int) -> str:\n    return ''.join(f'line {i}\\n' for i in range(n))\n")
    daemon = make_daemon()
    with daemon.client() as client:
        result = client.call("big", n=10000)
    spill = Path(result.meta["atomic/fullOutput"])
    assert spill.parent == env.state_dir / "spill"
    assert spill.read_text().count("\n") == 10000
    shown = result.text.split("\n[output truncated")[0].splitlines()
    assert len(shown) == 2000 and shown[-1] == "line 1999"
    assert str(spill) in result.text


def test_reload_reports_success_count_and_errors(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    env.write_tool(env.local_tools, "one.py", "def one() -> str:\n    return '1'\n")
    daemon = make_daemon()
    with daemon.client() as client:
        assert client.reload() == {"success": True, "toolCount": 1, "errors": []}
        env.write_tool(env.local_tools, "two.py", "def two() -> str:\n    return '2'\n")
        env.write_tool(env.local_tools, "bad.py", "raise ValueError('x')\n")
        result = client.reload()
        assert result["success"] is False and result["toolCount"] == 2
        assert [Path(e["file"]).name for e in result["errors"]] == ["bad.py"]
        assert client.call("two").text == "2"


def test_the_daemon_never_imports_tool_code(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    env.write_tool(env.local_tools, "mark.py", "import os\nMARK = os.getpid()\ndef mark() -> str:\n    return str(MARK)\n")
    daemon = make_daemon()
    with daemon.client() as client:
        pid = int(client.call("mark").text)
    assert pid != daemon.pid
    assert pid in {p.pid for p in daemon.workers()}
    assert psutil.Process(pid).ppid() != daemon.pid, "workers are forked by the fork server"


def test_status_counts_calls_and_errors(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    env.write_tool(env.local_tools, "math.py", MATH)
    math_daemon = make_daemon()  # its own: it counts every call the daemon answered
    with math_daemon.client() as client:
        client.call("math_add", numbers=[1])
        client.call("math_refuse", reason="x")
        module = next(m for m in client.status()["modules"] if m["path"].endswith("math.py"))
    assert (module["calls"], module["failedCalls"]) == (2, 1)
    assert module["state"] == "ready" and module["worker"] in {p.pid for p in math_daemon.workers()}
    assert module["p50Ms"] is not None


def test_each_module_has_its_own_worker(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    env.write_tool(env.local_tools, "a.py", "import os\ndef a() -> str:\n    return str(os.getpid())\n")
    env.write_tool(env.local_tools, "b.py", "import os\ndef b() -> str:\n    return str(os.getpid())\n")
    daemon = make_daemon()
    with daemon.client() as client:
        a, b = client.call("a").text, client.call("b").text
    assert a != b
    wait_for(lambda: {int(a), int(b)} <= {p.pid for p in daemon.workers()}, message="both workers listed")
