"""The tools REST API (aynd's routes) on the daemon's HTTP endpoint: every route, for a project named
in the query, behind the same token and Host/Origin checks as /mcp; and docs/http.md's curl examples,
run as written against a real daemon."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from e2e.test_http import Http
from helpers import Env, serving, wait_for

pytestmark = pytest.mark.slow

DOCS = Path(__file__).resolve().parents[2] / "docs" / "http.md"

ECHO = '''
def echo(text: str) -> str:
    """Say it back."""
    return text
'''

FAILS = '''
from atomictools import ToolError

def fails() -> str:
    """Always fails."""
    raise ToolError("it went wrong")
'''

ASKS = '''
from pathlib import Path

from atomictools import AskError, Context

def asks(ctx: Context) -> str:
    """Ask the user whether to go on."""
    ctx.progress(1, 2, "about to ask")
    try:
        return "yes" if ctx.elicit("Proceed?").accepted else "no"
    except AskError as exc:
        return f"not asked: {exc}"
'''

TOUCH = '''
from pathlib import Path

def touch(name: str) -> str:
    """Write a marker file in the project, so a test can tell whether this ran."""
    Path(__file__).resolve().parents[2].joinpath(name).write_text("ran")
    return "touched " + name
'''

HELLO = '''
def hello() -> str:
    """Greet from the global tools."""
    return "hello"
'''

DECLARATIVE = {
    "name": "my-tools",
    "tools": [{
        "name": "readme",
        "description": "Read a file of the project.",
        "handler": {"type": "file-read", "basePath": "."},
    }],
}


SETTINGS = {"ATOMICTOOLS_HTTP": "127.0.0.1:0", "ATOMICTOOLS_BUILTINS": "1"}


def _write_tools(env: Env) -> None:
    for name, source in (("echo.py", ECHO), ("fails.py", FAILS), ("asks.py", ASKS), ("touch.py", TOUCH)):
        env.write_tool(env.local_tools, name, source)
    env.write_tool(env.global_tools, "hello.py", HELLO)
    (env.local_tools / "kit.json").write_text(json.dumps(DECLARATIVE))
    (env.project / "README.md").write_text("the readme\n")


@pytest.fixture(scope="module")
def shared_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Env, Http]]:
    """One daemon for the module's tests that list, get and call (they change no tool)."""
    env = Env(tmp_path_factory.mktemp("rest"))
    _write_tools(env)
    with serving(env, SETTINGS) as daemon:
        yield env, _http(daemon)


@pytest.fixture
def api(env: Env, make_daemon: Any) -> Http:
    """A daemon of the test's own, for a test that adds tools."""
    _write_tools(env)
    return _http(make_daemon(SETTINGS))


def _http(daemon: Any) -> Http:
    with daemon.raw() as raw:
        info = raw.request("atomic/status")["result"]["http"]
    return Http(info["url"], Path(info["tokenFile"]).read_text().strip())


def _in(env: Env, path: str, **query: str) -> str:
    """``path`` for the test's project (and any other query parameters)."""
    params = {"directory": str(env.project), **query}
    return path + "?" + "&".join(f"{k}={quote(v, safe='/')}" for k, v in params.items())


def _get(api: Http, path: str, **kwargs: Any) -> tuple[int, Any]:
    status, _, body = api.request("GET", path=path, **kwargs)
    return status, json.loads(body)


def _post(api: Http, path: str, body: Any = None, **kwargs: Any) -> tuple[int, Any]:
    status, _, payload = api.request("POST", body, path=path, **kwargs)
    return status, json.loads(payload) if payload else None


def test_the_list_gives_every_tool_with_its_source_and_counts(shared_api: tuple[Env, Http]) -> None:
    env, api = shared_api
    status, listing = _get(api, _in(env, "/api/tools"))
    assert status == 200, listing
    tools = {tool["name"]: tool for tool in listing["tools"]}
    assert listing["errors"] == [] and listing["blocked"] == [], listing
    assert {name: tools[name]["source"] for name in ("echo", "readme", "hello", "git-status")} == {
        "echo": "project", "readme": "project", "hello": "global", "git-status": "builtin"}
    assert tools["echo"]["file"] == str(env.local_tools / "echo.py") and tools["echo"]["kind"] == "python"
    assert tools["readme"]["file"] == str(env.local_tools / "kit.json") and tools["readme"]["kind"] == "declarative"
    assert tools["echo"]["description"] == "Say it back."
    assert tools["echo"]["inputSchema"]["required"] == ["text"]
    builtins = sum(1 for tool in tools.values() if tool["source"] == "builtin")
    assert builtins >= 4
    assert listing["counts"] == {"total": len(tools), "builtin": builtins, "global": 1, "project": 5, "declarative": 1}
    assert listing["errors"] == [] and listing["blocked"] == []
    # Without a directory: the global and built-in tools only; the URL's lists apply.
    status, listing = _get(api, "/api/tools")
    assert status == 200 and {t["source"] for t in listing["tools"]} == {"builtin", "global"}
    status, listing = _get(api, _in(env, "/api/tools", allow="e*,h*", deny="hello"))
    assert [t["name"] for t in listing["tools"]] == ["echo"]


def test_one_tool_is_given_by_name_and_an_unknown_one_is_404(shared_api: tuple[Env, Http]) -> None:
    env, api = shared_api
    status, tool = _get(api, _in(env, "/api/tools/echo"))
    assert status == 200 and tool["name"] == "echo" and tool["source"] == "project"
    status, body = _get(api, _in(env, "/api/tools/ecko"))
    assert status == 404
    assert "Unknown tool: 'ecko'" in body["error"]["message"] and body["error"]["data"]["suggestions"] == ["echo"]
    status, body = _get(api, "/api/tools/echo")  # not a global tool: this project's only
    assert status == 404


def test_a_call_answers_the_result_as_mcp_gives_it_and_a_refused_call_a_4xx(shared_api: tuple[Env, Http]) -> None:
    env, api = shared_api
    status, result = _post(api, _in(env, "/api/tools/echo/call"), {"text": "hi"})
    assert (status, result) == (200, {"content": [{"type": "text", "text": "hi"}]})
    status, result = _post(api, _in(env, "/api/tools/fails/call"))  # no body: no arguments
    assert status == 200 and result["isError"] and "it went wrong" in result["content"][0]["text"]
    status, result = _post(api, _in(env, "/api/tools/readme/call"), {"path": "README.md"})
    assert status == 200 and "the readme" in result["content"][0]["text"]
    # Arguments that do not fit the schema, a body that is not an object: 400 with the message.
    status, body = _post(api, _in(env, "/api/tools/echo/call"), {"txt": "hi"})
    assert status == 400, body
    assert "Invalid arguments for tool 'echo'" in body["error"]["message"] and "text" in body["error"]["message"]
    status, body = _post(api, _in(env, "/api/tools/echo/call"), ["hi"])
    assert status == 400 and "JSON object" in body["error"]["message"]
    status, body = _post(api, _in(env, "/api/tools/echo/call"), raw=b'{"text": ')
    assert status == 400 and body["error"]["code"] == -32700
    # Unknown: 404; hidden by the URL's lists: 403.
    status, body = _post(api, _in(env, "/api/tools/ecko/call"), {"text": "hi"})
    assert status == 404 and "did you mean 'echo'" in body["error"]["message"]
    status, body = _post(api, _in(env, "/api/tools/echo/call", deny="echo"), {"text": "hi"})
    assert status == 403 and "not allowed" in body["error"]["message"]
    # A tool that asks is told it cannot ask; its progress goes nowhere.
    status, result = _post(api, _in(env, "/api/tools/asks/call"))
    assert status == 200 and result["content"][0]["text"].startswith("not asked: "), result
    assert "cannot ask the user" in result["content"][0]["text"]


def test_the_api_takes_the_token_and_the_host_checks_of_the_mcp_endpoint(shared_api: tuple[Env, Http]) -> None:
    env, api = shared_api
    call = _in(env, "/api/tools/touch/call")
    for token in (None, "wrong-token-" + "x" * 40):
        status, headers, body = api.request("POST", {"name": "marker"}, path=call, token=token)
        assert status == 401 and headers["www-authenticate"].startswith("Bearer"), (status, body)
        status, _, _ = api.request("GET", path=_in(env, "/api/tools"), token=token)
        assert status == 401
    for headers in ({"Host": "evil.example:80"}, {"Origin": "http://evil.example"}, {"Origin": "null"}):
        status, _, body = api.request("POST", {"name": "marker"}, path=call, headers=headers)
        assert status == 403 and "Forbidden" in json.loads(body)["error"]["message"]
    status, _, _ = api.request("POST", {"name": "marker"}, path=call, headers={"Content-Type": "text/plain"})
    assert status == 415  # a form a browser may post without asking first
    # A call of touch made after the refused ones: once it is done, they would have run too.
    status, result = _post(api, call, {"name": "after-refused"})
    assert status == 200 and result["content"][0]["text"] == "touched after-refused"
    assert not (env.project / "marker").exists()
    # Unknown paths are 404 before the token, as for /mcp; a route takes only its methods.
    for path in ("/api/nope", "/api/tools/echo/run", "/api"):
        status, _, _ = api.request("GET", path=path, token=None)
        assert status == 404, path
    status, headers, _ = api.request("DELETE", path=_in(env, "/api/tools/echo"))
    assert status == 405 and headers["allow"] == "GET"
    status, headers, _ = api.request("GET", path=call)
    assert status == 405 and headers["allow"] == "POST"
    status, body = _get(api, "/api/tools?directory=/no/such/dir")
    assert status == 400 and "directory" in body["error"]["message"]
    status, result = _post(api, call, {"name": "marker"})
    assert status == 200 and result["content"][0]["text"] == "touched marker"
    assert (env.project / "marker").read_text() == "ran"


def test_reload_answers_success_tool_count_and_errors(env: Env, api: Http) -> None:
    path = _in(env, "/api/tools/reload")
    status, before = _post(api, path)
    assert status == 200 and before["success"] is True and before["errors"] == [], before
    env.write_tool(env.local_tools, "later.py", 'def later() -> str:\n    """New."""\n    return "later"\n')
    env.write_tool(env.local_tools, "broken.py", "def broken(:\n")
    status, after = _post(api, path)
    assert status == 200 and after["toolCount"] == before["toolCount"] + 1, (before, after)
    assert after["success"] is False and [Path(e["file"]).name for e in after["errors"]] == ["broken.py"]
    status, tool = _get(api, _in(env, "/api/tools/later"))
    assert status == 200 and tool["source"] == "project"
    # A tool named "reload" is still read with GET; POST is the reload.
    status, body = _get(api, _in(env, "/api/tools/reload"))
    assert status == 404 and "Unknown tool: 'reload'" in body["error"]["message"]


def _examples() -> list[str]:
    """The lines of docs/http.md's REST example, continuations joined."""
    section = DOCS.read_text().split("\n## The tools REST API\n", 1)[1].split("\n## ", 1)[0]
    [block] = re.findall(r"```sh\n(.*?)```", section, re.DOTALL)
    return [line.strip() for line in block.replace("\\\n", " ").splitlines() if line.strip()]


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_the_curl_examples_of_the_docs_run_as_written(env: Env, api: Http) -> None:
    shell_env = {**env.vars, "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"}
    subprocess.run(["atomictoolsd", "new", "greet"], cwd=env.project, env=shell_env, check=True, capture_output=True)
    wait_for(lambda: _get(api, _in(env, "/api/tools/greet"))[0] == 200, message="greet served")
    first, *lines = _examples()
    assert first == "TOKEN=$(atomictoolsd http token --show)"
    token = subprocess.run(["bash", "-c", first + ' && echo "$TOKEN"'], env=shell_env, capture_output=True, text=True)
    assert token.stdout.strip() == api.token, token.stderr
    assert len(lines) == 6 and all(line.startswith("curl ") for line in lines), lines
    for line in lines:
        command, _, promise = line.partition("  # ")
        command = command.replace("127.0.0.1:8765", f"127.0.0.1:{api.port}")
        ran = subprocess.run(["bash", "-c", command], env={**shell_env, "TOKEN": api.token}, cwd=env.project,
                             capture_output=True, text=True, timeout=60)
        assert ran.returncode == 0, (command, ran.stderr)
        parts = [part for part in promise.split("…") if part]
        assert parts and all(part in ran.stdout for part in parts), (line, ran.stdout)
