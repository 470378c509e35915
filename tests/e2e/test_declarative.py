"""Declarative (JSON) tool files served by a real daemon: shell, http and file-read handlers, their
security rules, argument validation, and malformed files and tools."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from atomictools import RPCError
from atomictoolsd.eventlog.reader import read_events
from helpers import Daemon, Env, serving, wait_for


def write_json(env: Env, filename: str, tools: list[dict[str, Any]] | str, where: Path | None = None) -> Path:
    text = tools if isinstance(tools, str) else json.dumps({"name": "t", "version": "1.0.0", "tools": tools}, indent=2)
    return env.write_tool(where or env.local_tools, filename, text)


def shell_tool(name: str, command: str, properties: dict[str, Any], **handler: Any) -> dict[str, Any]:
    return {
        "name": name,
        "description": f"{name} test tool",
        "inputSchema": {"type": "object", "properties": properties, "additionalProperties": False},
        "handler": {"type": "shell", "command": command, **handler},
    }


STRING = {"type": "string"}

# Each payload would run `touch <marker>` if any shell ever read it.
INJECTIONS = [
    "; touch {marker}",
    "$(touch {marker})",
    "`touch {marker}`",
    "x\ntouch {marker}",
    "| touch {marker}",
    "&& touch {marker}",
    "' ; touch {marker} ; '",
]


@pytest.fixture(scope="module")
def shell_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    env = Env(tmp_path_factory.mktemp("shell"))
    write_json(env, "shell.json", [
        # printf prints each argument it gets on a line of its own, bracketed: one line per argument.
        shell_tool("args", "printf '[%s]\\n' {{first}} --flag={{second}} {{third}}",
                   {"first": STRING, "second": STRING, "third": STRING}),
        shell_tool("fails", "sh -c 'echo out; echo oops >&2; exit 3'", {}),
        shell_tool("slow", "sleep 7.25", {}, timeout=300),
        shell_tool("here", "pwd", {}),
        shell_tool("missing", "no-such-program-atomictools", {}),
    ])
    with serving(env) as daemon:
        yield daemon


def test_injection_through_every_parameter_never_executes(shell_daemon: Daemon) -> None:
    env = shell_daemon.env
    marker = env.root / "injected"
    with shell_daemon.client() as client:
        for template in INJECTIONS:
            payload = template.format(marker=marker)
            for param in ("first", "second", "third"):
                args = {"first": "a", "second": "b", "third": "c", param: payload}
                result = client.call("args", **args)
                assert not result.is_error, result.text
                expected = [f"[{args['first']}]", f"[--flag={args['second']}]", f"[{args['third']}]"]
                assert result.text == "\n".join(expected) + "\n", "each value stays one whole argument"
    assert not marker.exists(), "no shell ever ran a payload"
    # The worker's stderr goes to the event log, as what its module printed.
    log = wait_for(lambda: [e["message"] for e in read_events(env.state_dir / "log")
                            if e["event"] == "tool.output" and "shell metacharacters" in e["message"]],
                   message="the log line about metacharacters")
    assert "tool 'args': shell metacharacters in parameter(s) first" in "\n".join(log)


def test_absent_optional_values_drop_their_words(shell_daemon: Daemon) -> None:
    with shell_daemon.client() as client:
        assert client.call("args", first="only").text == "[only]\n"


def test_nul_bytes_and_overlong_values_are_refused(shell_daemon: Daemon) -> None:
    with shell_daemon.client() as client:
        nul = client.call("args", first="a\x00b")
        assert nul.is_error and nul.text == "Refused: parameter 'first' contains a NUL byte, which is not allowed"
        long = client.call("args", first="x" * 10_001)
        assert long.is_error and "parameter 'first' is 10001 characters long; the limit is 10000" in long.text
        assert client.call("args", first="x" * 10_000).text == f"[{'x' * 10_000}]\n"


def test_failure_carries_exit_code_stderr_and_stdout(shell_daemon: Daemon) -> None:
    with shell_daemon.client() as client:
        result = client.call("fails")
        assert result.is_error
        assert result.text == "Command sh exited with code 3\n\nstderr:\noops\n\nstdout:\nout"
        missing = client.call("missing")
        assert missing.is_error and "no such program on PATH" in missing.text


def test_timeout_stops_the_command_and_its_process(shell_daemon: Daemon) -> None:
    def sleepers() -> list[psutil.Process]:
        found = []
        for process in psutil.process_iter(["cmdline"]):
            if process.info["cmdline"] == ["sleep", "7.25"]:
                found.append(process)
        return found

    with shell_daemon.client() as client:
        started = time.monotonic()
        result = client.call("slow")
        assert result.is_error and result.text == "Command timed out after 0.3 s and was stopped"
        assert time.monotonic() - started < 5
    wait_for(lambda: not sleepers(), timeout=5, message="the timed-out command to be gone")


def test_commands_run_in_the_callers_directory(shell_daemon: Daemon) -> None:
    env = shell_daemon.env
    sub = env.project / "sub"
    sub.mkdir()
    with shell_daemon.client(directory=sub) as client:
        assert client.call("here").text.strip() == str(sub.resolve())


def test_arguments_are_validated_against_the_schema_before_the_handler(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    write_json(env, "touch.json", [{
        "name": "make",
        "description": "Create a file",
        "inputSchema": {
            "type": "object",
            "properties": {"name": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 5}, "n": {"type": "integer", "minimum": 1}},
            "required": ["name"],
            "additionalProperties": False,
        },
        "handler": {"type": "shell", "command": "touch -- {{name}}"},
    }])
    daemon = make_daemon()
    with daemon.client() as client:
        cases = {
            json.dumps({"name": "toolong"}): "$.name must be shorter than or equal to 5 characters",
            json.dumps({"name": "UP"}): "$.name must match pattern ^[a-z]+$",
            json.dumps({"name": "ok", "n": 0}): "$.n must be bigger than or equal to 1",
            json.dumps({"name": "ok", "nn": 1}): "unknown argument 'nn'; did you mean 'n'?",
            json.dumps({}): "$ must contain ['name'] properties",
        }
        for arguments, message in cases.items():
            result = client.call_tool("make", json.loads(arguments))
            assert result.is_error and result.text.startswith("Invalid arguments for tool 'make': "), result.text
            assert message in result.text
        assert [p.name for p in env.project.iterdir() if p.name != ".atomic"] == [], "the handler never ran"
        assert not client.call("make", name="made").is_error
        assert (env.project / "made").exists()


def test_an_integer_sent_as_2_0_reaches_the_command_as_2(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    """JSON Schema's ``integer`` takes ``2.0`` (Python clients send it); the command gets the integer
    it declared (``head -n 2.0`` fails), at any depth, and a ``number`` keeps what was sent."""
    lines = shell_tool("lines", "echo n={{n}} x={{x}} sizes={{box}} m={{m}}", {
        "n": {"type": "integer", "minimum": 1}, "x": {"type": "number"},
        "box": {"type": "object", "properties": {"sizes": {"type": "array", "items": {"type": ["integer", "null"]}}}},
        "m": {"anyOf": [{"$ref": "#/$defs/count"}, {"type": "null"}]},
    })
    lines["inputSchema"]["$defs"] = {"count": {"type": "integer"}}
    write_json(env, "lines.json", [lines])
    daemon = make_daemon()
    with daemon.client() as client:
        result = client.call_tool("lines", {"n": 2.0, "x": 2.0, "box": {"sizes": [1.0, None, 3]}, "m": 4.0})
        assert not result.is_error, result.text
        assert result.text.strip() == 'n=2 x=2.0 sizes={"sizes":[1,null,3]} m=4'
        assert client.call_tool("lines", {"n": 2.5, "x": 1, "box": {}, "m": None}).is_error


def test_a_broken_file_next_to_a_good_one(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    write_json(env, "broken.json", '{"name": "broken",\n "tools": [\n  {"name": "x",,}\n ]}\n')
    good = write_json(env, "good.json", [
        shell_tool("hello", "echo hello", {}),
        {"name": "bad name!", "description": "x", "handler": {"type": "shell", "command": "true"}},
        {"name": "wrong-type", "description": "x", "handler": {"type": "bash", "command": "true"}},
        {"name": "typo", "description": "x", "handler": {"type": "shell", "comand": "true"}},
        {"name": "undeclared", "description": "x", "inputSchema": {"type": "object", "properties": {}},
         "handler": {"type": "shell", "command": "echo {{who}}"}},
        {"name": "bad-schema", "description": "x", "inputSchema": {"type": "object", "properties": {"a": {"type": "nonsense"}}},
         "handler": {"type": "shell", "command": "true"}},
        {"name": "program-param", "description": "x", "handler": {"type": "shell", "command": "{{prog}} --version"}},
        {"name": "file-url", "description": "x", "handler": {"type": "http", "url": "file:///etc/{{name}}"}},
        {"name": "hello", "description": "again", "handler": {"type": "shell", "command": "echo twice"}},
    ])
    write_json(env, "other.json", [shell_tool("world", "echo world", {})])
    daemon = make_daemon()
    with daemon.client() as client:
        reload = client.reload()
        assert reload["success"] is False
        assert reload["toolCount"] == 2
        errors = reload["errors"]
        broken = [e for e in errors if e["file"].endswith("broken.json")]
        assert broken == [{
            "file": str(env.local_tools / "broken.json"), "line": 3, "scope": "local",
            "message": "not valid JSON: Expecting property name enclosed in double quotes (line 3, column 16)",
        }]
        skipped = {e["tool"]: (e["line"], e["message"]) for e in errors if e["file"].endswith("good.json")}
        lines = good.read_text().splitlines()

        def line(name: str, nth: int = 0) -> int:
            return [i for i, text in enumerate(lines, 1) if f'"name": "{name}"' in text][nth]

        assert skipped == {
            "bad name!": (line("bad name!"), "tool name 'bad name!' may contain only letters, digits, '_' and '-'"),
            "wrong-type": (line("wrong-type"), "Invalid value 'bash' - at `$.tools[2].handler.type` "
                                               '(a handler is an object whose "type" is one of shell, http, file-read)'),
            "typo": (line("typo"), "Object contains unknown field `comand` - at `$.tools[3].handler`; did you mean 'command'?"),
            "undeclared": (line("undeclared"), "the handler uses {{who}} but inputSchema.properties does not declare 'who'"),
            "bad-schema": (line("bad-schema"), "inputSchema is not a valid JSON Schema: Unknown type"),
            "program-param": (line("program-param"),
                              "handler.command must start with a fixed program name; a parameter cannot choose the program"),
            "file-url": (line("file-url"), "handler.url must be an http or https URL, not 'file'"),
            "hello": (line("hello", 1), "tools[0] already has this name; this one is skipped"),
        }
        listing = client.request("atomic/list")
        assert [(t["name"], t["kind"]) for t in listing["tools"]] == [("hello", "declarative"), ("world", "declarative")]
        assert listing["errors"] == errors
        assert listing["counts"] == {"declarative": 2}
        assert client.call("hello").text == "hello\n"
        states = {Path(m["path"]).name: (m["state"], len(m["problems"])) for m in client.status()["modules"]}
        assert states == {"broken.json": ("failed", 0), "good.json": ("ready", 8), "other.json": ("ready", 0)}
    out = subprocess.run([sys.executable, "-m", "atomictoolsd", "list"], env=env.vars, cwd=env.project,
                         capture_output=True, text=True, timeout=60).stdout
    assert "hello  local (json)" in out
    assert f"{good}:{line('wrong-type')}: tool 'wrong-type': Invalid value 'bash' - at `$.tools[2].handler.type`" in out
    assert f"{env.local_tools / 'broken.json'}:3: not valid JSON" in out


def test_skipped_tools_reach_subscribed_sessions_as_log_messages(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    path = write_json(env, "tools.json", [shell_tool("fine", "echo fine", {})])
    daemon = make_daemon()
    with daemon.raw() as raw:
        raw.request("atomic/attach", {"directory": str(env.project)})
        raw.request("atomic/subscribe")
        path.write_text(json.dumps({"tools": [shell_tool("fine", "echo fine", {}),
                                              {"name": "oops", "description": "x", "handler": {"type": "nope"}}]}))
        raw.send({"jsonrpc": "2.0", "id": 99, "method": "atomic/reload"})
        messages = []
        while (message := raw.recv()).get("id") != 99:
            messages.append(message)
    logs = [m["params"]["data"] for m in messages if m.get("method") == "notifications/message"]
    assert len(logs) == 1 and logs[0]["tool"] == "oops" and logs[0]["line"] == 1
    assert logs[0]["message"] == (
        f"skipped tool 'oops' in {path}:1: Invalid value 'nope' - at `$.tools[1].handler.type` "
        '(a handler is an object whose "type" is one of shell, http, file-read)'
    )


def test_each_file_is_a_module_with_its_own_worker_reloaded_alone(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    first = write_json(env, "one.json", [shell_tool("one", "echo one", {})])
    write_json(env, "two.json", [shell_tool("two", "echo two", {})])
    daemon = make_daemon()
    with daemon.client() as client:
        assert client.call("one").text == "one\n" and client.call("two").text == "two\n"
        workers = {Path(m["path"]).name: m["worker"] for m in client.status()["modules"]}
        assert workers["one.json"] != workers["two.json"]
        first.write_text(json.dumps({"tools": [shell_tool("one", "echo changed", {}), shell_tool("three", "echo 3", {})]}))
        reload = client.reload()
        assert reload == {"success": True, "toolCount": 3, "errors": []}
        assert client.call("one").text == "changed\n" and client.call("three").text == "3\n"
        after = {Path(m["path"]).name: m["worker"] for m in client.status()["modules"]}
        assert after["two.json"] == workers["two.json"], "the other file's worker was not touched"
        assert after["one.json"] != workers["one.json"]


def test_json_tools_follow_the_same_precedence_as_python_tools(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    write_json(env, "g.json", [shell_tool("same", "echo global", {})], where=env.global_tools)
    env.write_tool(env.local_tools, "same.py", "def same() -> str:\n    return 'local python'\n")
    daemon = make_daemon()
    with daemon.client() as client:
        assert client.call("same").text == "local python"
        shadowed = client.request("atomic/list", {"all": True})["shadowed"]
        assert [(t["name"], t["scope"], t["kind"]) for t in shadowed] == [("same", "global", "declarative")]


# -- http ---------------------------------------------------------------------------------------------


class _Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass

    def _answer(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802
        self.server.seen.append(("GET", self.path, dict(self.headers), b""))  # type: ignore[attr-defined]
        if self.path.startswith("/slow"):
            self.server.release.wait(10)  # type: ignore[attr-defined]
            self._answer(200, b"late")
        elif self.path.startswith("/fail"):
            self._answer(503, b"down for maintenance")
        elif self.path.startswith("/redirect"):
            self._answer(302, b"", {"Location": "file:///etc/passwd"})
        else:
            self._answer(200, b"ok " + self.path.encode())

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.server.seen.append(("POST", self.path, dict(self.headers), body))  # type: ignore[attr-defined]
        self._answer(201, b"created " + body)

    do_PUT = do_POST  # noqa: N815


@pytest.fixture
def web() -> Iterator[Any]:
    """A local HTTP server, started and stopped by this test."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.seen = []  # type: ignore[attr-defined]
    server.release = threading.Event()  # type: ignore[attr-defined]
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield server
    server.release.set()  # type: ignore[attr-defined]
    server.shutdown()
    server.server_close()
    thread.join(5)


@pytest.fixture(scope="module")
def http_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    env = Env(tmp_path_factory.mktemp("web"))
    def tool(name: str, props: dict[str, Any], **handler: Any) -> dict[str, Any]:
        return {"name": name, "description": name,
                "inputSchema": {"type": "object", "properties": props},
                "handler": {"type": "http", **handler}}

    write_json(env, "web.json", [
        tool("get", {"url": STRING, "q": STRING, "page": {"type": "integer"}}, url="{{url}}/search/{{q}}"),
        tool("post", {"url": STRING, "id": STRING, "title": STRING, "tags": {"type": "array"}},
             url="{{url}}/items/{{id}}", method="POST", headers={"X-Item": "{{id}}"}),
        tool("slow", {"url": STRING}, url="{{url}}/slow", timeout=500),
        tool("fail", {"url": STRING}, url="{{url}}/fail"),
        tool("redirect", {"url": STRING}, url="{{url}}/redirect"),
    ])
    with serving(env) as daemon:
        yield daemon


def test_http_get_percent_encodes_parameters(http_daemon: Daemon, web: Any) -> None:
    base = f"http://127.0.0.1:{web.server_port}"
    with http_daemon.client() as client:
        result = client.call("get", url=base, q="a b/c/admin?x=1#frag", page=2)
        assert not result.is_error
        path = "/search/a%20b%2Fc%2Fadmin%3Fx%3D1%23frag?page=2"
        assert result.text == f"HTTP 200 OK\n\nok {path}"
        assert web.seen[-1][1] == path


def test_http_post_sends_the_other_arguments_as_json(http_daemon: Daemon, web: Any) -> None:
    base = f"http://127.0.0.1:{web.server_port}"
    with http_daemon.client() as client:
        result = client.call("post", url=base, id="42", title="Fix", tags=["a", "b"])
        assert result.text == 'HTTP 201 Created\n\ncreated {"title": "Fix", "tags": ["a", "b"]}'
    method, path, headers, body = web.seen[-1]
    assert (method, path, headers["Content-Type"], headers["X-Item"]) == ("POST", "/items/42", "application/json", "42")
    assert json.loads(body) == {"title": "Fix", "tags": ["a", "b"]}


def test_http_non_2xx_is_an_error_and_redirects_are_not_followed(http_daemon: Daemon, web: Any) -> None:
    base = f"http://127.0.0.1:{web.server_port}"
    with http_daemon.client() as client:
        fail = client.call("fail", url=base)
        assert fail.is_error and fail.text == "HTTP 503 Service Unavailable\n\ndown for maintenance"
        moved = client.call("redirect", url=base)
        assert moved.is_error and moved.text.startswith("HTTP 302 Found")


def test_http_refuses_every_scheme_but_http_and_https(http_daemon: Daemon) -> None:
    with http_daemon.client() as client:
        for url in ("file:///etc/passwd", "FILE:///etc/passwd", "ftp://127.0.0.1/x", "gopher://127.0.0.1:70/",
                    "data:text/plain,hi", "javascript:alert(1)", "/relative"):
            result = client.call("fail", url=url)
            assert result.is_error and result.text.startswith("Refused: only http and https URLs may be requested"), url


def test_http_honours_the_timeout(http_daemon: Daemon, web: Any) -> None:
    with http_daemon.client() as client:
        started = time.monotonic()
        result = client.call("slow", url=f"http://127.0.0.1:{web.server_port}")
        took = time.monotonic() - started
    assert result.is_error and result.text == "HTTP request to 127.0.0.1 timed out after 0.5 s"
    assert took < 5, "the request gave up at its own timeout, not the server's 10 s"


# -- file-read --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def files_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    env = Env(tmp_path_factory.mktemp("files"))
    docs = env.project / "docs"
    (docs / "guide").mkdir(parents=True)
    (docs / "guide" / "intro.md").write_text("".join(f"line {i}\n" for i in range(1, 11)))
    (docs / "big.txt").write_text("x" * 2000)
    (docs / "blob.bin").write_bytes(b"\x00\x01\x02")
    (env.root / "secret.txt").write_text("top secret\n")
    (docs / "escape").symlink_to(env.root / "secret.txt")
    (docs / "outside-dir").symlink_to(env.root)
    (docs / "alias.md").symlink_to(docs / "guide" / "intro.md")
    os.mkfifo(docs / "pipe")
    write_json(env, "files.json", [
        {"name": "doc", "description": "Read a doc", "handler": {"type": "file-read", "basePath": "docs", "maxSize": 1024}},
    ])
    with serving(env) as daemon:
        yield daemon


def test_file_read_reads_inside_the_base_with_line_ranges(files_daemon: Daemon) -> None:
    with files_daemon.client() as client:
        assert client.call("doc", path="guide/intro.md").text.startswith("line 1\nline 2\n")
        assert client.call("doc", path="guide/intro.md", start_line=3, end_line=4).text == "line 3\nline 4\n"
        assert client.call("doc", path="alias.md", start_line=10).text == "line 10\n", "a symlink inside the base is fine"
        past = client.call("doc", path="guide/intro.md", start_line=11)
        assert past.is_error and "has 10 lines" in past.text


def test_file_read_refuses_traversal_and_symlink_escapes(files_daemon: Daemon) -> None:
    env = files_daemon.env
    with files_daemon.client() as client:
        for path in ("../secret.txt", "guide/../../secret.txt", "escape", "outside-dir/secret.txt",
                     f"{env.root}/secret.txt", "/etc/passwd"):
            result = client.call("doc", path=path)
            assert result.is_error and result.text.startswith("Refused:") and "outside" in result.text, result.text
            assert "top secret" not in result.text


def test_file_read_refuses_large_binary_and_special_files(files_daemon: Daemon) -> None:
    with files_daemon.client() as client:
        big = client.call("doc", path="big.txt")
        assert big.is_error and big.text == "Refused: 'big.txt' is 2000 bytes; the limit is 1024 bytes"
        blob = client.call("doc", path="blob.bin")
        assert blob.is_error and "binary" in blob.text
        pipe = client.call("doc", path="pipe")
        assert pipe.is_error and pipe.text == "'pipe' is not a regular file"


def test_unknown_tool_in_a_json_file_is_still_a_protocol_error(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    write_json(env, "one.json", [shell_tool("one", "echo one", {})])
    daemon = make_daemon()
    with daemon.client() as client, pytest.raises(RPCError) as info:
        client.call("two")
    assert info.value.code == -32602
