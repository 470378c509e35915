"""Arguments a tool does not declare, as real clients send them: Gemini CLI's injected
``wait_for_previous`` runs the call (and is logged with the client's name), a near miss of a
declared parameter is an error that names it. Through the shim, with the official MCP client."""

from __future__ import annotations

import json

import pytest

from atomictoolsd.eventlog.reader import read_events
from atomictoolsd.worker.arguments import Undeclared, misspelling_of, split_undeclared
from helpers import Daemon, Env, wait_for
from shim_helpers import mcp_session, run

PYTHON_TOOL = """
    def read(path: str, limit: int = 10) -> str:
        return f"{path}:{limit}"
"""


def declarative(env: Env) -> None:
    env.write_tool(env.local_tools, "echo.json", json.dumps({"name": "e", "version": "1.0.0", "tools": [{
        "name": "echo", "description": "echo a word",
        "inputSchema": {"type": "object", "properties": {"word": {"type": "string"}},
                        "required": ["word"], "additionalProperties": False},
        "handler": {"type": "shell", "command": "printf %s {{word}}"},
    }]}))


@pytest.fixture
def tools_daemon(env: Env, make_daemon) -> Daemon:  # type: ignore[no-untyped-def]
    env.write_tool(env.local_tools, "read.py", PYTHON_TOOL)
    declarative(env)
    return make_daemon()


def test_an_injected_argument_is_dropped_and_a_misspelling_names_the_parameter(tools_daemon: Daemon, env: Env) -> None:
    async def scenario() -> None:
        async with mcp_session(env, "--agent", "gemini-cli") as (session, _):
            ok = await session.call_tool("read", {"path": "a.txt", "wait_for_previous": True})
            assert not ok.is_error, ok.content
            assert ok.content[0].text == "a.txt:10"
            ok = await session.call_tool("echo", {"word": "hi", "wait_for_previous": False})
            assert not ok.is_error, ok.content
            assert ok.content[0].text == "hi"

            typo = await session.call_tool("read", {"pth": "a.txt"})
            assert typo.is_error
            assert "unknown argument 'pth'; did you mean 'path'?" in typo.content[0].text
            typo = await session.call_tool("read", {"path": "a.txt", "limt": 3, "wait_for_previous": True})
            assert typo.is_error and "did you mean 'limit'?" in typo.content[0].text
            typo = await session.call_tool("echo", {"wrod": "hi"})
            assert typo.is_error and "did you mean 'word'?" in typo.content[0].text
            # Dropping never hides a declared argument's own error.
            bad = await session.call_tool("read", {"path": 3, "wait_for_previous": True})
            assert bad.is_error and "path" in bad.content[0].text

    run(scenario)
    dropped = wait_for(lambda: [e for e in read_events(env.state_dir / "log") if e["event"] == "tool.arguments_dropped"]
                       if len([e for e in read_events(env.state_dir / "log")
                               if e["event"] == "tool.arguments_dropped"]) >= 2 else None)
    assert {(e["tool"], tuple(e["dropped"]), e["agent"]) for e in dropped} >= {
        ("read", ("wait_for_previous",), "gemini-cli"), ("echo", ("wait_for_previous",), "gemini-cli"),
    }


def test_a_call_with_more_undeclared_arguments_than_a_report_names_runs(tools_daemon: Daemon, env: Env) -> None:
    """The runtime reports the first ``MAX_DROPPED_KEYS`` undeclared arguments (the daemon refuses a
    report naming more): a client sending 200 has its call run, and the log names the first 64."""
    from atomictoolsd.protocol import MAX_DROPPED_KEYS

    extra = {f"zz_extra_{i:03d}": i for i in range(200)}
    with tools_daemon.client() as client:
        assert client.call("read", path="a.txt", **extra).text == "a.txt:10"
        assert client.call("echo", word="hi", **extra).text == "hi"
    dropped = wait_for(lambda: [e for e in read_events(env.state_dir / "log") if e["event"] == "tool.arguments_dropped"]
                       if len([e for e in read_events(env.state_dir / "log")
                               if e["event"] == "tool.arguments_dropped"]) >= 2 else None)
    assert [len(e["dropped"]) for e in dropped] == [MAX_DROPPED_KEYS] * 2, dropped


@pytest.mark.parametrize(("key", "declared", "meant"), [
    ("pth", ["path", "limit"], "path"),
    ("Path", ["path"], "path"),
    ("file-path", ["file_path"], "file_path"),
    ("filePath", ["file_path"], "file_path"),
    ("recursve", ["recursive"], "recursive"),
    ("recrusive", ["recursive"], "recursive"),
    ("wait_for_previous", ["path", "query", "wait"], None),
    ("x", ["path"], None),
    ("verbose", ["path", "query"], None),
])
def test_which_undeclared_keys_are_taken_for_typos(key: str, declared: list[str], meant: str | None) -> None:
    assert misspelling_of(key, declared) == meant


def test_split_keeps_declared_arguments_and_leaves_other_errors_alone() -> None:
    assert split_undeclared(b'{"path":"a","wait_for_previous":true,"_x":1}', ["path"]) == (b'{"path":"a"}', ["wait_for_previous", "_x"])
    assert split_undeclared(b'{"path":"a"}', ["path"]) is None
    assert split_undeclared(b"[1]", ["path"]) is None
    with pytest.raises(Undeclared, match="did you mean 'path'"):
        split_undeclared(b'{"pathh":"a"}', ["path"])


INTEGER_TOOL = """
    import msgspec

    class Box(msgspec.Struct):
        sizes: list[int]

    def repeat(word: str, times: int, box: Box | None = None, scale: float = 1.0) -> str:
        return f"{word * times}:{box.sizes if box else None}:{scale}"
"""


def test_an_integer_parameter_takes_a_number_with_no_fractional_part(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    """JSON Schema's ``integer`` is any number with no fractional part: ``2.0`` is one (Python
    clients send it), at any depth; ``2.5`` is not, and a float parameter keeps its ``2.0``."""
    env.write_tool(env.local_tools, "repeat.py", INTEGER_TOOL)
    make_daemon()

    async def scenario() -> None:
        async with mcp_session(env) as (session, _):
            ok = await session.call_tool("repeat", {"word": "ab", "times": 2.0, "box": {"sizes": [1.0, 3]}, "scale": 2.0})
            assert not ok.is_error, ok.content
            assert ok.content[0].text == "abab:[1, 3]:2.0"
            bad = await session.call_tool("repeat", {"word": "ab", "times": 2.5})
            assert bad.is_error and "times" in bad.content[0].text
            bad = await session.call_tool("repeat", {"word": "ab", "times": "2"})
            assert bad.is_error and "times" in bad.content[0].text

    run(scenario)


ENUM_TOOL = """
    import enum
    from typing import Literal

    import msgspec

    class Colour(enum.Enum):
        RED = "red"
        BLUE = "blue"

    class Topcoat(msgspec.Struct):
        sheen: Literal["satin", "high"]

    def paint(colour: Colour | None, finish: Literal["matte", "gloss"] = "matte", coats: list[Literal[1, 2]] = [],
              rooms: dict[str, Literal["wall", "door"]] | None = None, topcoat: Topcoat | None = None,
              mix: tuple[Literal["a", "b"], int] | None = None) -> str:
        return f"{colour.value if colour else None}:{finish}:{coats}"
"""


def test_a_value_outside_an_enum_is_an_error_that_lists_the_allowed_values(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    env.write_tool(env.local_tools, "paint.py", ENUM_TOOL)
    make_daemon()

    async def scenario() -> None:
        async with mcp_session(env) as (session, _):
            for arguments, expected in [
                ({"colour": "green"}, "expected one of 'blue', 'red'"),
                ({"colour": "red", "finish": "satin"}, "expected one of 'gloss', 'matte'"),
                ({"colour": "red", "coats": [1, 3]}, "expected one of 1, 2"),
                # A dict's value, a field of an optional struct, a tuple's item: the values there.
                ({"colour": "red", "rooms": {"hall": "roof"}}, "expected one of 'door', 'wall'"),
                ({"colour": "red", "topcoat": {"sheen": "dull"}}, "expected one of 'high', 'satin'"),
                ({"colour": "red", "mix": ["c", 1]}, "expected one of 'a', 'b'"),
            ]:
                result = await session.call_tool("paint", arguments)
                assert result.is_error and expected in result.content[0].text, (arguments, result.content)

    run(scenario)
