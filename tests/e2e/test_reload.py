"""Hot reload: editing tool files while clients are attached, with a real daemon and real files."""

from __future__ import annotations

import os
import shutil
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from listener import Listener

from atomictools import RPCError
from helpers import Daemon, Env, wait_for


def names(client: Any) -> list[str]:
    return [t["name"] for t in client.list_tools()]


def module_status(client: Any, filename: str) -> dict[str, Any]:
    return next(m for m in client.status()["modules"] if Path(m["path"]).name == filename)


def write_atomically(path: Path, source: str) -> None:
    """Save like an editor does: write a temporary file beside it, then rename it into place."""
    temp = path.with_name(f".{path.name}.swp")
    temp.write_text(textwrap.dedent(source))
    os.replace(temp, path)


@pytest.fixture
def watched(env: Env, make_daemon) -> Daemon:  # type: ignore[no-untyped-def]
    """A daemon whose project has ``.atomic/`` but no ``tools/`` yet."""
    return make_daemon()


def test_added_module_appears_in_a_tools_dir_created_after_attach(env: Env, watched: Daemon) -> None:
    assert not env.local_tools.exists()
    with Listener(env.socket, env.project) as listener, watched.client() as client:
        assert names(client) == []
        env.write_tool(env.local_tools, "greet.py", '''
            def greet(name: str) -> str:
                """Say hello."""
                return f"hello {name}"
        ''')
        listener.next("notifications/tools/list_changed")
        assert names(client) == ["greet"]
        assert client.call("greet", name="Ada").text == "hello Ada"


def test_edit_changes_answers_and_notifies_only_when_definitions_change(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    env.write_tool(env.local_tools, "calc.py", "def calc(x: int) -> str:\n    return f'one {x}'\n")
    daemon = make_daemon()
    with Listener(env.socket, env.project) as listener, daemon.client() as client:
        assert client.call("calc", x=1).text == "one 1"
        # A new body, the same definition: new answers, and no list_changed (the toolset did not change).
        env.write_tool(env.local_tools, "calc.py", "def calc(x: int) -> str:\n    return f'two {x}'\n")
        wait_for(lambda: client.call("calc", x=1).text == "two 1", message="the edited body to serve")
        assert "notifications/tools/list_changed" not in listener.methods(listener.sync())
        # A new parameter: list_changed, and the listing shows the new schema.
        env.write_tool(env.local_tools, "calc.py", "def calc(x: int, y: int = 0) -> str:\n    return f'three {x + y}'\n")
        listener.next("notifications/tools/list_changed")
        (tool,) = client.list_tools()
        assert sorted(tool["inputSchema"]["properties"]) == ["x", "y"]
        assert client.call("calc", x=1, y=2).text == "three 3"


def test_broken_edit_withdraws_tools_with_the_error_and_the_fix_brings_them_back(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    env.write_tool(env.local_tools, "calc.py", "def calc(x: int) -> str:\n    return str(x)\n")
    env.write_tool(env.local_tools, "other.py", "def other() -> str:\n    return 'still here'\n")
    daemon = make_daemon()
    with Listener(env.socket, env.project) as listener, daemon.client() as client:
        assert names(client) == ["calc", "other"]
        env.write_tool(env.local_tools, "calc.py", "import os\n\ndef calc(x: int) -> str\n    return str(x)\n")
        listener.next("notifications/tools/list_changed")
        logs = [m for m in listener.seen if m.get("method") == "notifications/message"]
        assert logs, "the load error is sent as a log notification"
        data = logs[-1]["params"]["data"]
        assert logs[-1]["params"]["level"] == "error"
        assert (Path(data["file"]).name, data["line"]) == ("calc.py", 3)
        assert "SyntaxError" in data["message"] and "calc.py:3" in data["message"]

        assert names(client) == ["other"], "only the broken module's tools are withdrawn"
        with pytest.raises(RPCError) as excinfo:
            client.call("calc", x=1)
        assert excinfo.value.code == -32602
        (error,) = client.request("atomic/list")["errors"]
        assert (Path(error["file"]).name, error["line"]) == ("calc.py", 3) and "SyntaxError" in error["message"]
        status = module_status(client, "calc.py")
        assert status["state"] == "failed" and status["error"]["line"] == 3
        assert client.call("other").text == "still here"

        env.write_tool(env.local_tools, "calc.py", "def calc(x: int) -> str:\n    return f'fixed {x}'\n")
        listener.next("notifications/tools/list_changed")
        assert names(client) == ["calc", "other"]
        assert client.call("calc", x=2).text == "fixed 2"
        assert client.request("atomic/list")["errors"] == []


def test_deleted_module_withdraws_its_tools_and_its_worker(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    path = env.write_tool(env.local_tools, "gone.py", "import os\ndef gone() -> str:\n    return str(os.getpid())\n")
    daemon = make_daemon()
    with Listener(env.socket, env.project) as listener, daemon.client() as client:
        pid = int(client.call("gone").text)
        path.unlink()
        listener.next("notifications/tools/list_changed")
        assert names(client) == []
        wait_for(lambda: pid not in {p.pid for p in daemon.workers()}, message="the deleted module's worker to stop")


def test_same_length_rewrites_within_a_second_serve_the_new_code(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    """Python's bytecode cache trusts a file with the same size and mtime second: tools bypass it."""
    path = env.write_tool(env.local_tools, "ver.py", "def ver() -> str:\n    return 'v1'\n")
    daemon = make_daemon({"PYTHONDONTWRITEBYTECODE": ""})  # as on most machines: Python writes .pyc files
    with daemon.client() as client:
        assert client.call("ver").text == "v1"
        for version in ("v2", "v3"):
            path.write_text(f"def ver() -> str:\n    return '{version}'\n")
            wait_for(lambda v=version: client.call("ver").text == v, message=f"{version} to serve")
    assert not (env.local_tools / "__pycache__").exists(), "workers write no bytecode into tools dirs"


def test_atomic_saves_and_bursts_settle_to_the_final_content(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    path = env.local_tools / "burst.py"
    env.write_tool(env.local_tools, "burst.py", "def burst() -> str:\n    '''v0'''\n    return 'v0'\n")
    daemon = make_daemon()
    with Listener(env.socket, env.project) as listener, daemon.client() as client:
        assert client.call("burst").text == "v0"
        for i in range(1, 21):
            write_atomically(path, f"def burst() -> str:\n    '''v{i}'''\n    return 'v{i}'\n")
        listener.next("notifications/tools/list_changed")
        wait_for(lambda: client.call("burst").text == "v20", message="the last save to serve")
        wait_for(lambda: client.list_tools()[0].get("description") == "v20", message="the listing to settle")
        status = module_status(client, "burst.py")
        assert status["state"] == "ready"
        settled = lambda: (m := module_status(client, "burst.py"))["retiring"] == [] and m["starting"] == 0  # noqa: E731
        wait_for(settled, message="old generations to stop and no new one to be loading")
        wait_for(lambda: len(daemon.workers()) == 1, message="one worker: the last generation's")
    assert not list(env.local_tools.glob(".*.swp"))


def test_an_editor_that_moves_the_old_file_away_first_never_withdraws_the_tools(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    path = env.write_tool(env.local_tools, "keep.py", "def keep() -> str:\n    return 'old'\n")
    daemon = make_daemon()
    with Listener(env.socket, env.project) as listener, daemon.client() as client:
        assert client.call("keep").text == "old"
        backup = path.with_name("keep.py~")
        os.rename(path, backup)  # vim without backupcopy: the file is absent for a moment
        time.sleep(0.03)  # the editor's gap, longer than the watcher's quiet step
        path.write_text("def keep() -> str:\n    return 'new'\n")
        backup.unlink()
        wait_for(lambda: client.call("keep").text == "new", message="the new content to serve")
        assert "notifications/tools/list_changed" not in listener.methods(listener.sync())


def test_a_vanished_file_holds_back_only_itself(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    """The grace a deleted module file gets (an editor may be about to put it back) delays no other
    module's reload in its directory."""
    env.write_tool(env.local_tools, "gone.py", "def gone() -> str:\n    return 'gone'\n")
    kept = env.write_tool(env.local_tools, "kept.py", "def kept() -> str:\n    '''v1'''\n    return 'v1'\n")
    # A long debounce makes the grace long (ten looks of twice the debounce: 6 s), so that a slow
    # machine cannot blur "kept.py reloaded at once" with "kept.py reloaded after the grace".
    daemon = make_daemon({"ATOMICTOOLS_WATCH_DEBOUNCE_MS": "300"})
    with daemon.client() as client:
        assert names(client) == ["gone", "kept"]
        (env.local_tools / "gone.py").unlink()
        kept.write_text("def kept() -> str:\n    '''v2'''\n    return 'v2'\n")
        wait_for(lambda: {t["name"]: t.get("description") for t in client.list_tools()}.get("kept") == "v2",
                 timeout=30, message="the edit of kept.py to serve")
        assert "gone" in names(client)  # still within its grace
        wait_for(lambda: "gone" not in names(client), timeout=30, message="gone.py's tools to go once the grace ends")


def test_a_slow_call_across_a_reload_returns_the_old_generations_answer(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    release = env.root / "release"  # the slow call ends once it exists (or after 30 s)
    source = f'''
        import os, time
        def slow(seconds: float) -> str:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline and not os.path.exists({str(release)!r}):
                time.sleep(0.01)
            return f"{{VERSION}} from {{os.getpid()}}"
    '''
    path = env.write_tool(env.local_tools, "slow.py", "VERSION = 'old'\n" + textwrap.dedent(source))
    daemon = make_daemon()
    answers: list[str] = []
    with daemon.client() as client, daemon.client() as other:
        old_pid = int(client.call("slow", seconds=0).text.split()[-1])

        def slow_call() -> None:
            answers.append(other.call("slow", seconds=30.0).text)

        thread = threading.Thread(target=slow_call)
        thread.start()
        wait_for(lambda: module_status(client, "slow.py")["inflight"] == 1, message="the slow call to run")
        path.write_text("VERSION = 'new'\n" + textwrap.dedent(source))
        wait_for(lambda: client.call("slow", seconds=0).text.startswith("new"), message="the new generation")
        assert old_pid in {p.pid for p in daemon.workers()}, "the old generation still serves its call"
        release.touch()
        thread.join(15)
        assert answers == [f"old from {old_pid}"]
        wait_for(lambda: old_pid not in {p.pid for p in daemon.workers()}, message="the old generation to stop")


def test_no_call_fails_while_a_module_is_reloaded_again_and_again(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    path = env.write_tool(env.local_tools, "steady.py", "def steady(x: int) -> int:\n    return x + 0\n")
    daemon = make_daemon()
    failures: list[str] = []
    done = threading.Event()
    counts = [0]

    def hammer() -> None:
        with daemon.client() as client:
            while not done.is_set():
                try:
                    result = client.call("steady", x=1)
                except RPCError as exc:
                    failures.append(f"RPCError {exc}")
                    continue
                if result.is_error or result.structured != {"result": 1}:
                    failures.append(result.text)
                counts[0] += 1

    threads = [threading.Thread(target=hammer) for _ in range(4)]
    for thread in threads:
        thread.start()
    with daemon.client() as client:
        for i in range(1, 11):
            path.write_text(f"def steady(x: int) -> int:\n    return x + {i} - {i}\n")
            wait_for(lambda n=i: module_status(client, "steady.py")["spawns"] >= n + 1, message=f"reload {i}")
    done.set()
    for thread in threads:
        thread.join(15)
    assert failures == []
    assert counts[0] > 0


def test_global_tools_dir_created_after_the_daemon_started(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    shutil.rmtree(env.home / ".atomic", ignore_errors=True)
    daemon = make_daemon()
    with Listener(env.socket, env.project) as listener, daemon.client() as client:
        env.write_tool(env.global_tools, "everywhere.py", "def everywhere() -> str:\n    return 'global'\n")
        listener.next("notifications/tools/list_changed")
        assert names(client) == ["everywhere"]
        assert client.list_tools()[0]["name"] == "everywhere"
        assert client.call("everywhere").text == "global"


def test_a_project_whose_atomic_tools_appears_later(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    repo = env.root / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / "src").mkdir()
    daemon = make_daemon()
    with Listener(env.socket, repo / "src") as listener, daemon.client(directory=repo / "src") as client:
        assert names(client) == []
        (repo / "src" / "main.py").write_text("print('unrelated')\n")  # the repository's own files: no reload
        env.write_tool(repo / ".atomic" / "tools", "late.py", "def late() -> str:\n    return 'late'\n")
        listener.next("notifications/tools/list_changed")
        assert names(client) == ["late"]
        assert client.call("late").text == "late"
        # The watch moves from the repository to its tools dir when the watcher thread's event for
        # the new directory reaches the loop, which a loaded machine may deliver after the scan
        # its parent's event started has loaded the module.
        wait_for(lambda: str(repo / ".atomic" / "tools") in client.status()["watcher"]["watching"],
                 message="the watch to move to the tools dir")
        watching = client.status()["watcher"]["watching"]
        assert str(repo) not in watching
        assert str(repo / "src") not in watching, "nothing in the repository is watched but its tools dir"


def test_a_helper_edit_reloads_the_modules_that_import_it(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    env.write_tool(env.local_tools, "_shared.py", "PREFIX = 'a'\n")
    env.write_tool(env.local_tools, "uses.py", "from _shared import PREFIX\n\ndef uses() -> str:\n    return PREFIX\n")
    env.write_tool(env.local_tools, "alone.py", "import os\n\ndef alone() -> str:\n    return str(os.getpid())\n")
    daemon = make_daemon()
    with daemon.client() as client:
        assert client.call("uses").text == "a"
        alone = client.call("alone").text
        env.write_tool(env.local_tools, "_shared.py", "PREFIX = 'b'\n")
        wait_for(lambda: client.call("uses").text == "b", message="the helper's change to reach its user")
        assert client.call("alone").text == alone, "a module that does not import the helper keeps its worker"


def test_a_module_that_failed_for_a_missing_helper_loads_once_the_helper_exists(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    env.write_tool(env.local_tools, "needs.py", "from _lib.text import shout\n\ndef needs() -> str:\n    return shout('x')\n")
    daemon = make_daemon()
    with Listener(env.socket, env.project) as listener, daemon.client() as client:
        assert names(client) == []
        assert "No module named '_lib'" in client.request("atomic/list")["errors"][0]["message"]
        env.write_tool(env.local_tools / "_lib", "__init__.py", "")
        env.write_tool(env.local_tools / "_lib", "text.py", "def shout(s: str) -> str:\n    return s.upper()\n")
        listener.next("notifications/tools/list_changed")
        wait_for(lambda: names(client) == ["needs"], message="the module to load")
        assert client.call("needs").text == "X"
        # A file of the helper package is watched too: editing it reloads the module.
        env.write_tool(env.local_tools / "_lib", "text.py", "def shout(s: str) -> str:\n    return s.upper() + '!'\n")
        wait_for(lambda: client.call("needs").text == "X!", message="the package edit to reach its user")


def test_removing_the_whole_tools_dir_withdraws_its_tools_and_recreating_it_brings_them_back(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    env.write_tool(env.local_tools, "one.py", "def one() -> str:\n    return '1'\n")
    env.write_tool(env.local_tools / "_lib", "__init__.py", "")
    daemon = make_daemon()
    with Listener(env.socket, env.project) as listener, daemon.client() as client:
        assert names(client) == ["one"]
        shutil.rmtree(env.local_tools)
        listener.next("notifications/tools/list_changed")
        assert names(client) == []
        wait_for(lambda: str(env.local_tools) not in client.status()["watcher"]["watching"], message="the watch to move up")
        assert str(env.project / ".atomic") in client.status()["watcher"]["watching"]
        env.write_tool(env.local_tools, "two.py", "def two() -> str:\n    return '2'\n")
        listener.next("notifications/tools/list_changed")
        wait_for(lambda: names(client) == ["two"], message="the recreated dir's tool")
        assert client.call("two").text == "2"
        if sys.platform.startswith("linux"):
            assert client.status()["watcher"]["inotify"] is True, "idle, the watcher sleeps on inotify"


def test_a_reload_whose_client_hangs_up_still_commits_and_leaves_no_worker(env: Env, make_daemon, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """``atomic/reload`` loads in workers; the client that asked goes away mid-load. The reload must
    still commit (the module serves from the worker it loaded) rather than strand that worker."""
    flag = tmp_path / "ready"
    env.write_tool(env.global_tools, "slow.py", f'''
        import pathlib, time
        if not pathlib.Path({str(flag)!r}).exists():
            raise RuntimeError("not yet")
        time.sleep(1.0)  # the import is under way when the client hangs up

        def slow() -> str:
            return "loaded"
    ''')
    daemon = make_daemon()
    with daemon.client() as client:
        assert names(client) == [] and module_status(client, "slow.py")["state"] == "failed"
    flag.touch()
    with daemon.raw() as raw:
        raw.send({"jsonrpc": "2.0", "id": 1, "method": "atomic/reload"})
        wait_for(lambda: len(daemon.workers()) == 1, message="the reload's worker to start")
    with daemon.client() as client:
        wait_for(lambda: names(client) == ["slow"], message="the reload to commit without its client")
        assert client.call("slow").text == "loaded"
        serving = module_status(client, "slow.py")["worker"]
    assert [p.pid for p in daemon.workers()] == [serving], "no worker is left over from the reload"


def test_a_module_importing_more_helpers_than_a_load_report_names_loads_and_fails_as_any(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    """A load report names at most ``MAX_REPORTED_FILES`` helpers, and the daemon refuses a report
    naming more: the runtime itself reports no more, so a module that imports more loads (and one that
    fails after importing them fails with its own error, not the daemon's refusal)."""
    from atomictoolsd.protocol import MAX_REPORTED_FILES

    count = MAX_REPORTED_FILES + 100
    package = env.local_tools / "_many"
    package.mkdir(parents=True)
    for i in range(count):
        (package / f"m{i}.py").write_text(f"VALUE = {i}\n")
    (package / "__init__.py").write_text(
        f"import importlib\n\nTOTAL = sum(importlib.import_module(f'_many.m{{i}}').VALUE for i in range({count}))\n"
    )
    env.write_tool(env.local_tools, "many.py", "from _many import TOTAL\n\ndef many() -> str:\n    return str(TOTAL)\n")
    env.write_tool(env.local_tools, "many_failing.py", "from _many import TOTAL\n\nraise RuntimeError(f'own error after {TOTAL}')\n")
    daemon = make_daemon()
    with daemon.client() as client:
        assert client.call("many").text == str(sum(range(count)))
        # The failing module imports as many helpers: it may still be loading when "many" answers.
        wait_for(lambda: client.request("atomic/list")["errors"], message="many_failing.py to fail")
        errors = client.request("atomic/list")["errors"]
        assert [e["message"] for e in errors] == [f"RuntimeError: own error after {sum(range(count))}"], errors


def test_definitions_larger_than_a_load_report_may_take_fail_the_module_saying_so(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    env.write_tool(env.local_tools, "wordy.py", "def wordy() -> str:\n    return 'said'\n\nwordy.__doc__ = 'w' * (5 << 20)\n")
    env.write_tool(env.local_tools, "good.py", "def good() -> str:\n    return 'served'\n")
    daemon = make_daemon()
    with daemon.client() as client:
        assert client.call("good").text == "served"
        [error] = client.request("atomic/list")["errors"]
        assert error["file"].endswith("wordy.py")
        assert "the module's load report (the definitions of its 1 tool(s), the files it imported) takes 5.0 MiB, more than the 4 MiB one may take" in error["message"], error


def test_an_import_error_of_megabytes_keeps_its_start_and_end(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    """A load report has 4 MiB in all: an exception's message of 5 MB (twice over, with its
    traceback) is cut in its middle, so the author still reads what went wrong."""
    env.write_tool(env.local_tools, "loud.py", "raise RuntimeError('start ' + 'x' * (5 << 20) + ' end')\n")
    daemon = make_daemon()
    with daemon.client() as client:
        [error] = client.request("atomic/list")["errors"]
    message = error["message"]
    assert message.startswith("RuntimeError: start xxx") and message.endswith("xxx end"), message[:100]
    assert "characters left out" in message and len(message) < 20_000
