"""TypeScript tools that go wrong, each as a Python tool's would: a syntax error and its fix, an
import of a package nobody installed, a save that reloads, abort on cancel, a tool that never
returns, one that floods its output, one that crashes its worker, one that outgrows the memory
limit, and no runtime at all. On Bun: one daemon serves the tests that share its settings."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest

from atomictoolsd.eventlog.reader import read_events
from atomictoolsd.worker.output import BURST_BYTES, CHUNK_BYTES, RATE_BYTES
from helpers import Daemon, Env, wait_for
from javascript_helpers import js_settings
from shim_helpers import mcp_session, wait_until

FAULTS = '''
import { tool } from "@atomic/plugin"
import { writeFileSync } from "node:fs"
import { spawnSync } from "node:child_process"

export const waits = tool({
  description: "Waits until the call is cancelled",
  args: { marker: tool.schema.string() },
  async execute(args, context) {
    await new Promise((resolve) => context.abort.addEventListener("abort", resolve))
    writeFileSync(args.marker, `aborted: ${context.abort.aborted}`)
    return "Operation cancelled"
  },
})

export const spins = tool({ description: "Never returns", args: {}, execute() { for (;;) {} } })

export const exits = tool({
  description: "Ends its own process",
  args: { how: tool.schema.enum(["exit", "abort"]) },
  execute(args) { if (args.how === "exit") process.exit(3); process.abort() },
})

export const floods = tool({
  description: "Prints far more than is logged",
  args: {},
  async execute() {
    for (let i = 0; i < 50; i++) console.log("x".repeat(100_000))
    // A program that writes far more than a pipe holds while the tool waits for it, blocking the
    // worker's thread: its output is drained all the same.
    spawnSync("sh", ["-c", "head -c 3000000 /dev/zero | tr '\\\\0' y"], { stdio: ["ignore", "inherit", "inherit"] })
    return "flooded"
  },
})

export const grows = tool({
  description: "Holds the memory it allocates",
  args: { mb: tool.schema.number().int() },
  async execute(args) {
    const held = []
    for (let i = 0; i < args.mb; i++) held.push(new Uint8Array(1 << 20).fill(1))
    await new Promise((resolve) => setTimeout(resolve, 10_000))
    return String(held.length)
  },
})

export const pid = tool({ description: "Its worker's pid", args: {}, execute: () => String(process.pid) })

export const claims = tool({
  description: "Claims a name no one has (an async refinement)",
  args: { name: tool.schema.string().refine(async (name) => name !== "taken", "already taken") },
  execute: (args) => `claimed ${args.name}`,
})
'''


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Env, Daemon]]:
    settings = js_settings("bun")
    env = Env(tmp_path_factory.mktemp("js-faults"))
    env.write_tool(env.local_tools, "faults.ts", FAULTS)
    daemon = Daemon(env, {**settings, "ATOMICTOOLS_CALL_TIMEOUT": "3", "ATOMICTOOLS_CANCEL_GRACE": "0.5",
                          "ATOMICTOOLS_MEMORY_LIMIT_MB": "256"}).start()
    try:
        yield env, daemon
    finally:
        daemon.stop()
        left = daemon.reap_leftovers() if daemon.leftovers() else []
        env.cleanup()
        assert not left, f"processes left behind: {[p.pid for p in left]}"


def listing(daemon: Daemon, env: Env) -> dict[str, Any]:
    with daemon.raw() as raw:
        raw.request("atomic/attach", {"directory": str(env.project)})
        return raw.request("atomic/list", {})["result"]


def errors_of(daemon: Daemon, env: Env, name: str) -> list[dict[str, Any]]:
    return [e for e in listing(daemon, env)["errors"] if e["file"].endswith(name)]


def test_a_save_reloads_a_syntax_error_withdraws_and_its_fix_restores(served: tuple[Env, Daemon]) -> None:
    env, daemon = served
    path = env.local_tools / "hello.ts"
    source = 'import { tool } from "@atomic/plugin"\nexport default tool({description: "VERSION", args: {}, execute: () => "VERSION"})\n'
    path.write_text(source.replace("VERSION", "v1"))
    wait_for(lambda: "hello" in {t["name"] for t in listing(daemon, env)["tools"]}, message="hello.ts to load")

    async def main() -> None:
        async with mcp_session(env) as (session, seen):
            assert "hello" in {t.name for t in (await session.list_tools()).tools}  # what it is told changes from
            assert await text(session, "hello") == "v1"
            for expected in ("v2", None, "v3"):
                before = seen.methods().count("notifications/tools/list_changed")
                started = time.monotonic()
                if expected is None:  # a syntax error on line 3
                    path.write_text(source.replace("VERSION", "v2") + "export const broken = tool({\n  description: ,\n})\n")
                else:
                    path.write_text(source.replace("VERSION", expected))
                await wait_until(lambda b=before: seen.methods().count("notifications/tools/list_changed") > b,
                                 message="list_changed after the save")
                names = {t.name for t in (await session.list_tools()).tools}
                if expected is None:
                    assert "hello" not in names
                    [error] = errors_of(daemon, env, "hello.ts")
                    assert error["line"] == 4 and error["message"].startswith("BuildMessage: Unexpected"), error
                else:
                    assert "hello" in names and await text(session, "hello") == expected
                assert time.monotonic() - started < 10

    anyio.run(main)


async def text(session: Any, name: str, **arguments: Any) -> str:
    result = await session.call_tool(name, arguments)
    return "".join(block.text for block in result.content if block.type == "text")


def test_an_edit_to_a_helper_it_imports_reloads_the_module(served: tuple[Env, Daemon]) -> None:
    env, daemon = served
    helper = env.write_tool(env.local_tools, "_words.ts", 'export const word: string = "one"\n')
    env.write_tool(env.local_tools, "speak.ts", '''
        import { tool } from "@atomic/plugin"
        import { word } from "./_words"
        export default tool({ description: "Say the helper's word", args: {}, execute: () => word })
    ''')
    with daemon.client() as client:
        wait_for(lambda: "speak" in {t["name"] for t in client.list_tools()}, message="speak.ts to load")
        assert client.call("speak").text == "one"
        helper.write_text('export const word: string = "two"\n')
        wait_for(lambda: client.call("speak").text == "two", message="the module to reload with its helper")
    for name in ("speak.ts", "_words.ts"):
        (env.local_tools / name).unlink()


def test_an_import_of_a_package_nobody_installed_says_what_to_install(served: tuple[Env, Daemon]) -> None:
    env, daemon = served
    env.write_tool(env.local_tools, "needs.ts", '''
        import { tool } from "@atomic/plugin"
        import leftPad from "left-pad-nowhere"
        export default tool({ description: "d", args: {}, execute: () => leftPad("x", 3) })
    ''')
    error = wait_for(lambda: errors_of(daemon, env, "needs.ts"), message="the module's error")[0]
    assert error["line"] == 3
    assert "Cannot find package 'left-pad-nowhere'" in error["message"]
    assert f"cd {env.local_tools} && npm install left-pad-nowhere" in error["message"]
    (env.local_tools / "needs.ts").unlink()


def test_definitions_larger_than_a_load_report_may_take_fail_the_module_saying_so(served: tuple[Env, Daemon]) -> None:
    env, daemon = served
    env.write_tool(env.local_tools, "wordy.ts", '''
        import { tool } from "@atomic/plugin"
        export default tool({ description: "w".repeat(5 * 1024 * 1024), args: {}, execute: () => "said" })
    ''')
    error = wait_for(lambda: errors_of(daemon, env, "wordy.ts"), message="the module's error")[0]
    assert "takes 5.0 MiB, more than the 4 MiB one may take: split the module" in error["message"], error
    (env.local_tools / "wordy.ts").unlink()


def test_an_import_error_of_megabytes_keeps_its_start_and_end(served: tuple[Env, Daemon]) -> None:
    env, daemon = served
    # "q": the daemon's log is shared with the flood test, which looks for its own x and y.
    env.write_tool(env.local_tools, "loud.ts", 'throw new Error("start " + "q".repeat(5 * 1024 * 1024) + " end")\n')
    error = wait_for(lambda: errors_of(daemon, env, "loud.ts"), message="the module's error")[0]
    assert error["message"].startswith("Error: start qqq") and error["message"].endswith("qqq end"), error["message"][:100]
    assert "characters left out" in error["message"] and len(error["message"]) < 20_000
    (env.local_tools / "loud.ts").unlink()


def test_cancel_and_timeout_fire_the_abort_signal(served: tuple[Env, Daemon], tmp_path: Path) -> None:
    env, daemon = served
    marker = tmp_path / "cancelled"
    with daemon.raw() as raw:
        raw.request("atomic/attach", {"directory": str(env.project)})
        request = raw.send_request("tools/call", {"name": "faults_waits", "arguments": {"marker": str(marker)}})
        time.sleep(0.3)
        raw.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": request}})
        wait_for(marker.exists, message="the tool to see its abort signal")
        assert marker.read_text() == "aborted: true"
    with daemon.client() as client:
        marker = tmp_path / "timed-out"
        result = client.call("faults_waits", marker=str(marker))
        assert result.is_error and "timed out after 3 s" in result.text
        wait_for(marker.exists, message="the abort signal at the timeout")
        assert client.call("faults_pid").text  # the worker serves on: the tool stopped when asked


def test_a_tool_that_never_returns_is_killed_with_its_worker(served: tuple[Env, Daemon]) -> None:
    env, daemon = served
    with daemon.client() as client:
        before = int(client.call("faults_pid").text)
        started = time.monotonic()
        result = client.call("faults_spins")
        assert result.is_error and "timed out after 3 s" in result.text
        assert time.monotonic() - started < 10  # answered at its timeout, not when the tool ends
        wait_for(lambda: not psutil.pid_exists(before) or psutil.Process(before).status() == psutil.STATUS_ZOMBIE,
                 message="the spinning worker to be killed after the grace period")
        assert int(client.call("faults_pid").text) != before


@pytest.mark.parametrize(("how", "cause"), [("exit", "exited with code 3"), ("abort", "was killed by SIGABRT")])
def test_a_worker_that_crashes_answers_with_how_it_ended(served: tuple[Env, Daemon], how: str, cause: str) -> None:
    env, daemon = served
    with daemon.client() as client:
        result = client.call("faults_exits", how=how)
        assert result.is_error and f"its worker process {cause}" in result.text, result.text
        assert client.call("faults_pid").text.isdigit()  # a new worker serves the next call


def test_a_flood_of_output_is_logged_bounded(served: tuple[Env, Daemon]) -> None:
    env, daemon = served
    module = str(env.local_tools / "faults.ts")
    with daemon.client() as client:
        started = time.monotonic()
        assert client.call("faults_floods").text == "flooded"
        assert time.monotonic() - started < 10

    def flood() -> list[dict[str, Any]]:
        return [e for e in read_events(env.state_dir / "log") if e.get("event") == "tool.output" and e["module"] == module]

    wait_for(lambda: any(e.get("dropped") for e in flood()), message="the dropped bytes to be reported")
    elapsed = time.monotonic() - started
    events = flood()
    logged = sum(len(e["message"]) for e in events if not e["message"].startswith("("))
    assert all(len(e["message"]) <= CHUNK_BYTES for e in events)
    assert logged <= BURST_BYTES + RATE_BYTES * elapsed + CHUNK_BYTES, "a flood is rate-limited"
    assert "xxxxxxxxxx" not in daemon.stderr() and "yyyyyyyyyy" not in daemon.stderr()


def test_a_tool_past_the_memory_limit_is_stopped_by_its_resident_memory(served: tuple[Env, Daemon]) -> None:
    env, daemon = served
    with daemon.client() as client:
        result = client.call("faults_grows", mb=400)
        assert result.is_error and "over the worker memory limit of 256 MiB" in result.text, result.text


def test_without_a_runtime_the_module_fails_with_what_to_install(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    env.write_tool(env.local_tools, "lint.ts", 'export default {description: "d", args: {}, execute: () => "x"}\n')
    env.write_tool(env.local_tools, "py.py", "def py() -> str:\n    return 'still serving'\n")
    daemon: Daemon = make_daemon({"ATOMICTOOLS_JS_RUNTIME": str(env.root / "no-such-bun")})
    [error] = errors_of(daemon, env, "lint.ts")
    assert "no JavaScript runtime to run it" in error["message"] and "npm install -g bun" in error["message"]
    with daemon.client() as client:
        assert client.call("py").text == "still serving"


def test_an_async_refinement_checks_the_arguments(served: tuple[Env, Daemon]) -> None:
    env, daemon = served
    with daemon.client() as client:
        assert client.call("faults_claims", name="free").text == "claimed free"
        taken = client.call("faults_claims", name="taken")
        assert taken.is_error and "already taken - at `$.name`" in taken.text
