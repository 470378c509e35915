"""The example tool packs (examples/tools, examples/squad), installed as a user would and called
through a real daemon."""

from __future__ import annotations

import http.server
import shutil
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from helpers import Daemon, Env, wait_for

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def install(env: Env, pack: str) -> None:
    env.local_tools.mkdir(parents=True, exist_ok=True)
    for path in (EXAMPLES / pack).iterdir():
        if path.suffix in (".py", ".json"):
            shutil.copy(path, env.local_tools / path.name)


@pytest.fixture
def tools_daemon(env: Env, make_daemon) -> Daemon:  # type: ignore[no-untyped-def]
    install(env, "tools")
    # A long grace: pytest must be stopped by the tool itself, not by the daemon giving up on it.
    return make_daemon({"ATOMICTOOLS_CANCEL_GRACE": "30"})


def test_every_example_loads_with_the_documented_names(tools_daemon: Daemon) -> None:
    with tools_daemon.client() as client:
        listing = client.request("atomic/list")
    assert listing["errors"] == []
    assert [t["name"] for t in listing["tools"]] == [
        "grep", "health", "images", "images_delete", "lint", "loc", "notes", "notes_add", "notes_remove", "read-doc",
        "run_tests",
    ]
    assert listing["counts"] == {"local": 8, "declarative": 3}


# -- images.py: an image result, and a confirmation asked with ctx.elicit ------------------------------

PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010802000000907753de0000000c4944415408d763f8cfc0"
    "000003010100c9fe92ef0000000049454e44ae426082"
)


def test_images_shows_an_image_and_deletes_only_what_the_user_confirms(env: Env, tools_daemon: Daemon) -> None:
    shot = env.project / "shot.png"
    shot.write_bytes(PNG)
    with tools_daemon.client() as client:
        [image] = client.call("images", path="shot.png").blocks("image")
        assert image["mimeType"] == "image/png"
        assert client.call("images", path="../x.png").is_error

        refused = client.call("images_delete", path="shot.png")  # this client cannot ask its user
        assert refused.is_error and "elicitation" in refused.text and shot.exists()

    asked: list[str] = []
    with tools_daemon.client(on_elicit=lambda message, schema: asked.append(message)) as client:  # None: declines
        assert client.call("images_delete", path="shot.png").text == "kept shot.png: the user chose decline"
        assert shot.exists() and asked == ["Delete shot.png (69 bytes)?"]
    with tools_daemon.client(on_elicit=lambda message, schema: {}) as client:
        assert client.call("images_delete", path="shot.png").text == "deleted shot.png"
        assert not shot.exists()


# -- lint.py: a linter wrapper ------------------------------------------------------------------------


def test_lint_wraps_ruff(env: Env, tools_daemon: Daemon) -> None:
    if not Path(sys.executable).with_name("ruff").exists() and shutil.which("ruff") is None:
        pytest.skip("ruff is not installed (it comes with the test extras)")
    (env.project / "bad.py").write_text("import os\n\nx = 1\n")
    (env.project / "good.py").write_text("print('fine')\n")
    with tools_daemon.client() as client:
        bad = client.call("lint", path="bad.py")
        assert not bad.is_error and bad.text.startswith("bad.py:1:8: F401"), bad.text
        assert client.call("lint", path="good.py").text == "No problems found in good.py"
        assert client.call("lint", path="bad.py", select="E9").text == "No problems found in bad.py"
        outside = client.call("lint", path="../..")
        assert outside.is_error and "outside the project" in outside.text
        typed = client.call("lint", path="bad.py", select="F401; rm -rf /")
        assert typed.is_error and typed.text.startswith("Invalid arguments for tool 'lint'")


# -- notes.py: one file, several tools ----------------------------------------------------------------


def test_notes_show_stem_func_naming(env: Env, tools_daemon: Daemon) -> None:
    with tools_daemon.client() as client:
        first = client.call("notes_add", text="Use uv for installs", tags=["tooling"])
        assert first.structured["id"] == 1 and first.structured["tags"] == ["tooling"]
        client.call("notes_add", text="Ports: 8080 dev")
        assert [n["id"] for n in client.call("notes").structured["result"]] == [1, 2]
        assert [n["text"] for n in client.call("notes", tag="tooling").structured["result"]] == ["Use uv for installs"]
        assert [n["id"] for n in client.call("notes", search="PORTS").structured["result"]] == [2]
        assert client.call("notes_remove", id=1).text == "Removed note 1"
        missing = client.call("notes_remove", id=1)
        assert missing.is_error and "call `notes` to see the ids" in missing.text
        bad_tag = client.call("notes_add", text="x", tags=["Not A Tag"])
        assert bad_tag.is_error and "$.tags[0]" in bad_tag.text
    assert (env.project / ".atomic" / "notes.jsonl").read_text().count("\n") == 1


# -- run_tests.py: async, progress, cancellation -------------------------------------------------------


FAST_TESTS = "def test_one():\n    assert 1\n\ndef test_two():\n    assert 2\n"
SLOW_TEST = "import time\n\ndef test_slow():\n    time.sleep(120)\n"


def _pytest_of(path: str) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info["cmdline"] or []
        if "pytest" in cmdline and path in cmdline:
            found.append(process)
    return found


def test_run_tests_reports_progress(env: Env, tools_daemon: Daemon) -> None:
    (env.project / "tests").mkdir()
    (env.project / "tests" / "test_fast.py").write_text(FAST_TESTS)
    with tools_daemon.raw() as raw:
        raw.request("atomic/attach", {"directory": str(env.project)})
        raw.send({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                  "params": {"name": "run_tests", "arguments": {"target": "tests/test_fast.py"}, "_meta": {"progressToken": "t"}}})
        progress = []
        while True:
            message = raw.recv()
            if message.get("method") == "notifications/progress":
                progress.append(message["params"])
            elif message.get("id") == 7:
                break
    assert message["result"].get("isError") is not True, message
    assert message["result"]["content"][0]["text"] == "2 passed in " + message["result"]["content"][0]["text"].split(" in ")[1]
    assert [(p["progress"], p["total"]) for p in progress] == [(1, 2), (2, 2)]
    assert progress[0]["message"].endswith("test_fast.py::test_one")


def test_run_tests_failures_are_errors_with_the_traceback(env: Env, tools_daemon: Daemon) -> None:
    (env.project / "test_bad.py").write_text("def test_bad():\n    assert 1 == 2, 'numbers differ'\n")
    with tools_daemon.client() as client:
        result = client.call("run_tests", target="test_bad.py")
    assert result.is_error and "= FAILURES =" in result.text and "numbers differ" in result.text


def test_cancelling_run_tests_kills_pytest_and_sends_no_answer(env: Env, tools_daemon: Daemon) -> None:
    (env.project / "test_slow.py").write_text(SLOW_TEST)
    with tools_daemon.raw() as raw:
        raw.request("atomic/attach", {"directory": str(env.project)})
        raw.send({"jsonrpc": "2.0", "id": 9, "method": "tools/call",
                  "params": {"name": "run_tests", "arguments": {"target": "test_slow.py"}}})
        wait_for(lambda: _pytest_of("test_slow.py"), timeout=30, message="pytest to start")
        raw.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 9, "reason": "user"}})
        wait_for(lambda: not _pytest_of("test_slow.py"), timeout=10, message="pytest to be killed by the tool")
        raw.send({"jsonrpc": "2.0", "id": 10, "method": "ping"})
        while (message := raw.recv()).get("id") != 10:
            assert message.get("id") != 9, f"the cancelled call was answered: {message}"


# -- loc.py: structured output ------------------------------------------------------------------------


def test_loc_returns_structured_data_matching_its_output_schema(env: Env, tools_daemon: Daemon) -> None:
    (env.project / "pkg").mkdir()
    (env.project / "pkg" / "a.py").write_text("a = 1\nb = 2\n")
    (env.project / "pkg" / "b.py").write_text("c = 3\n")
    (env.project / "README.md").write_text("# hi\n")
    (env.project / "node_modules").mkdir()
    (env.project / "node_modules" / "x.js").write_text("skip()\n")
    with tools_daemon.client() as client:
        schema = next(t for t in client.list_tools() if t["name"] == "loc")["outputSchema"]
        result = client.call("loc")
    assert set(schema["required"]) == {"root", "files", "lines", "languages"}
    assert result.structured == {
        "root": str(env.project.resolve()), "files": 3, "lines": 4,
        "languages": [{"language": "Python", "files": 2, "lines": 3}, {"language": "Markdown", "files": 1, "lines": 1}],
    }


# -- toolbox.json: one tool of each handler type --------------------------------------------------------


class _Health(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802
        body = b'{"status": "ok"}' if self.path == "/health" else b"no"
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def health_server() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()
    thread.join(5)


def test_toolbox_json_has_one_working_tool_per_handler(env: Env, tools_daemon: Daemon, health_server: str) -> None:
    (env.project / "src").mkdir()
    (env.project / "src" / "main.py").write_text("def main():\n    return 'TODO: ship it'\n")
    (env.project / "docs").mkdir()
    (env.project / "docs" / "guide.md").write_text("# Guide\n\nStep one.\nStep two.\n")
    with tools_daemon.client() as client:
        assert client.call("grep", pattern="TODO").text == "./src/main.py:2:    return 'TODO: ship it'\n"
        assert client.call("grep", pattern="TODO", path="src").text == "src/main.py:2:    return 'TODO: ship it'\n"
        assert client.call("health", url=health_server).text == 'HTTP 200 OK\n\n{"status": "ok"}'
        bad_url = client.call("health", url="file:///etc/passwd")
        assert bad_url.is_error and "must match pattern" in bad_url.text
        assert client.call("read-doc", path="guide.md", start_line=3, end_line=4).text == "Step one.\nStep two.\n"
        escape = client.call("read-doc", path="../src/main.py")
        assert escape.is_error and escape.text.startswith("Refused:")


# -- squad ----------------------------------------------------------------------------------------------

HISTORY = "# Keaton\n\n## Core Context\n\nLead.\n\n## Learnings\n\n- **2026-01-01:** old lesson\n\n## Notes\n\nkeep me\n"


@pytest.fixture
def squad(env: Env, make_daemon) -> tuple[Daemon, Path]:  # type: ignore[no-untyped-def]
    install(env, "squad")
    team = env.project / ".squad"
    (team / "agents" / "keaton").mkdir(parents=True)
    (team / "agents" / "keaton" / "history.md").write_text(HISTORY)
    (team / "agents" / "fenster").mkdir()
    return make_daemon(), team


def test_squad_tools_are_named_and_typed(squad: tuple[Daemon, Path]) -> None:
    daemon, _team = squad
    with daemon.client() as client:
        tools = {t["name"]: t for t in client.list_tools()}
        assert sorted(tools) == ["squad_decide", "squad_memory", "squad_skill"]
        assert tools["squad_memory"]["inputSchema"]["properties"]["agent"]["pattern"] == "^[a-z0-9][a-z0-9-]{0,47}$"
        assert tools["squad_skill"]["inputSchema"]["properties"]["action"]["enum"] == ["list", "read", "write"]
        refused = client.call("squad_memory", agent="Keaton!", learning="x y z")
        assert refused.is_error and "$.agent" in refused.text


def test_squad_decide_writes_slugged_decisions_and_never_overwrites(squad: tuple[Daemon, Path]) -> None:
    daemon, team = squad
    with daemon.client() as client:
        first = client.call("squad_decide", author="Keaton", summary="Use PostgreSQL, not MongoDB!",
                            body="Transactions matter.", why="Team knows it.", references=["spike-3"])
        second = client.call("squad_decide", author="Keaton", summary="Use PostgreSQL, not MongoDB!", body="Again.")
    assert first.structured == {"ok": True, "path": ".squad/decisions/inbox/keaton-use-postgresql-not-mongodb.md"}
    assert second.structured == {"ok": True, "path": ".squad/decisions/inbox/keaton-use-postgresql-not-mongodb-2.md"}
    text = (team / "decisions" / "inbox" / "keaton-use-postgresql-not-mongodb.md").read_text()
    lines = text.splitlines()
    assert lines[0].endswith(": Use PostgreSQL, not MongoDB!") and lines[0].startswith("### 20")
    assert lines[1:] == ["**By:** Keaton", "**What:** Transactions matter.", "**Why:** Team knows it.", "**References:** spike-3"]


def test_squad_memory_appends_under_learnings_and_changes_nothing_else(squad: tuple[Daemon, Path]) -> None:
    daemon, team = squad
    history = team / "agents" / "keaton" / "history.md"
    with daemon.client() as client:
        result = client.call("squad_memory", agent="keaton", learning="Tailwind v4 config lives in .styles/")
        assert result.structured["ok"] is True
        entry = result.structured["entry"]
        assert entry.endswith(":** Tailwind v4 config lives in .styles/")
        assert history.read_text() == HISTORY.replace("old lesson\n", f"old lesson\n{entry}\n")
        fresh = client.call("squad_memory", agent="fenster", learning="First thing learned")
        assert (team / "agents" / "fenster" / "history.md").read_text() == f"# fenster\n\n## Learnings\n\n{fresh.structured['entry']}\n"
        (team / "agents" / "fenster" / "history.md").write_text("# Fenster\n\nNo sections yet.")
        appended = client.call("squad_memory", agent="fenster", learning="Second thing")
        assert (team / "agents" / "fenster" / "history.md").read_text() == (
            f"# Fenster\n\nNo sections yet.\n\n## Learnings\n\n{appended.structured['entry']}\n"
        )
        unknown = client.call("squad_memory", agent="mcmanus", learning="Something")
    assert not unknown.is_error
    assert unknown.structured == {"ok": False, "error": {
        "code": "unknown_agent", "message": f"There is no agent 'mcmanus' in {team / 'agents'}.",
        "fix": "Use one of: fenster, keaton."}}


def test_squad_skill_list_read_write(squad: tuple[Daemon, Path]) -> None:
    daemon, team = squad
    skill = "---\nname: react-patterns\ndescription: Patterns for React server components\n---\n\n# React\n\nUse server components.\n"
    with daemon.client() as client:
        def call(**arguments: Any) -> dict[str, Any]:
            result = client.call("squad_skill", **arguments)
            assert not result.is_error, result.text
            return result.structured

        assert call(action="list") == {"ok": True, "skills": []}
        assert call(action="read")["error"]["code"] == "missing_argument"
        assert call(action="read", name="react-patterns")["error"]["code"] == "not_found"
        invalid = call(action="write", name="react-patterns", content="# no front matter")
        assert invalid["error"]["code"] == "invalid_skill" and "name: <name>" in invalid["error"]["fix"]
        assert call(action="write", name="other", content=skill)["error"]["code"] == "invalid_skill"
        assert call(action="write", name="react-patterns", content=skill) == {
            "ok": True, "name": "react-patterns", "path": ".squad/skills/react-patterns/SKILL.md"}
        exists = call(action="write", name="react-patterns", content=skill.replace("server", "client"))
        assert exists["error"]["code"] == "exists" and "replace=true" in exists["error"]["fix"]
        assert (team / "skills" / "react-patterns" / "SKILL.md").read_text() == skill, "not replaced without asking"
        assert call(action="write", name="react-patterns", content=skill.replace("server", "client"), replace=True)["ok"]
        assert call(action="read", name="react-patterns")["content"] == skill.replace("server", "client")
        assert call(action="list") == {"ok": True, "skills": [
            {"name": "react-patterns", "description": "Patterns for React client components"}]}


def test_squad_failures_are_structured_never_exceptions(env: Env, squad: tuple[Daemon, Path]) -> None:
    daemon, team = squad
    (team / "decisions").mkdir()
    (team / "decisions" / "inbox").write_text("a file where a directory should be")
    elsewhere = env.root / "no-team"  # a project with the squad tools and no team directory
    (elsewhere / ".atomic" / "tools").mkdir(parents=True)
    shutil.copy(EXAMPLES / "squad" / "squad.py", elsewhere / ".atomic" / "tools" / "squad.py")
    with daemon.client() as client:
        blocked = client.call("squad_decide", author="Keaton", summary="Something", body="x")
        assert not blocked.is_error and blocked.structured["ok"] is False
        assert blocked.structured["error"]["code"] == "io_error"
    with daemon.client(directory=elsewhere) as client:
        for name, arguments in (("squad_decide", {"author": "K", "summary": "abc", "body": "x"}),
                                ("squad_memory", {"agent": "keaton", "learning": "abc"}),
                                ("squad_skill", {"action": "list"})):
            result = client.call(name, **arguments)
            assert not result.is_error and result.structured["error"]["code"] == "no_team", result.text
