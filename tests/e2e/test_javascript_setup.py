"""What stands around a TypeScript tool: the starter `new --ts` writes, trust, the configuration a
runtime would read by itself (never read), and the support packages the daemon installs."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import Daemon, Env, wait_for
from javascript_helpers import js_settings


def run(env: Env, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "atomictoolsd", *args], env=env.vars, cwd=cwd or env.project,
                          capture_output=True, text=True, timeout=60)


def errors(daemon: Daemon, env: Env) -> list[dict[str, object]]:
    with daemon.raw() as raw:
        raw.request("atomic/attach", {"directory": str(env.project)})
        return raw.request("atomic/list", {})["result"]["errors"]


def test_new_ts_writes_a_starter_that_loads_and_runs_as_its_printed_commands_say(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    runtime = "bun"
    env.vars.update(js_settings(runtime))
    made = run(env, "new", "echo-twice", "--ts")
    assert made.returncode == 0, made.stderr
    path = env.local_tools / "echo-twice.ts"
    assert made.stdout.startswith(f"wrote {path} (the project {env.project.resolve()})")
    assert 'import { tool } from "@atomic/plugin"' in path.read_text()
    make_daemon(js_settings(runtime))
    printed = {line.split(":", 1)[0]: shlex.split(line.split(":", 1)[1]) for line in made.stdout.splitlines() if ":  " in line}
    called = subprocess.run(printed["call it"], env=env.vars, cwd=env.project, capture_output=True, text=True, timeout=60)
    assert called.stdout == f"hello hello (from {env.project.resolve()})\n", called.stderr
    refused = subprocess.run([*printed["call it"][:-1], "times=11"], env=env.vars, cwd=env.project, capture_output=True,
                             text=True, timeout=60)
    assert refused.returncode == 1 and "`$.times`" in refused.stdout + refused.stderr
    assert run(env, "new", "echo-twice", "--ts").returncode == 1  # never overwrites


def test_an_untrusted_project_s_typescript_tools_are_blocked_and_never_run(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    runtime = "bun"
    env.set_trust_all(False)
    marker = env.root / "ran"
    env.write_tool(env.local_tools, "probe.ts", f'''
        import {{ writeFileSync }} from "node:fs"
        writeFileSync({json.dumps(str(marker))}, "imported")
        export default {{ description: "d", args: {{}}, execute: () => "ran" }}
    ''')
    daemon: Daemon = make_daemon(js_settings(runtime))
    with daemon.client() as client:
        listing = client.request("atomic/list", {})
    assert listing["tools"] == [] and listing["blocked"][0]["file"].endswith("probe.ts")
    assert not marker.exists()
    assert run(env, "trust", "--yes").returncode == 0
    with daemon.client() as client:
        assert client.call("probe").text == "ran"


@pytest.mark.parametrize("runtime", ["bun", "node"])
def test_a_worker_reads_no_runtime_configuration_of_its_directory_or_environment(env: Env, make_daemon, runtime: str) -> None:  # type: ignore[no-untyped-def]
    """A global tool's worker starts in the home: a bunfig.toml preload or a .env there, and
    NODE_OPTIONS or BUN_OPTIONS in the daemon's environment, are never read."""
    marker = env.root / "planted-code-ran"
    planted = env.root / "planted.cjs"
    planted.write_text(f"require('fs').writeFileSync({json.dumps(str(marker))}, 'ran')\n")
    (env.home / "bunfig.toml").write_text(f'preload = ["{planted}"]\n')
    (env.home / ".env").write_text("PLANTED_SECRET=from-a-dotenv\n")
    (env.home / "package.json").write_text(json.dumps({"type": "module", "imports": {"#x": str(planted)}}))
    env.write_tool(env.global_tools, "seen.ts", '''
        export default {
          description: "What the worker's environment holds",
          args: {},
          execute: () => JSON.stringify({ dotenv: process.env.PLANTED_SECRET ?? null, options: process.env.NODE_OPTIONS ?? null,
                                          bun: process.env.BUN_OPTIONS ?? null, cwd: process.cwd() }),
        }
    ''')
    settings = js_settings(runtime)
    daemon: Daemon = make_daemon({**settings, "NODE_OPTIONS": f"--require {planted}", "BUN_OPTIONS": f"--preload {planted}"})
    with daemon.client() as client:
        seen = json.loads(client.call("seen").text)
    assert seen == {"dotenv": None, "options": None, "bun": None, "cwd": str(env.home)}
    assert not marker.exists()


def test_offline_without_the_packages_the_module_says_what_to_run_and_nothing_hangs(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    if shutil.which("npm") is None:
        pytest.skip("npm is not installed: the install it tries needs it")
    settings = js_settings("node")  # Node's installer is npm, pointed here at a registry that refuses
    del settings["ATOMICTOOLS_JS_PACKAGES"]
    env.write_tool(env.local_tools, "needs.ts", '''
        import { tool } from "@opencode-ai/plugin"
        export default tool({ description: "d", args: {}, execute: () => "x" })
    ''')
    daemon: Daemon = make_daemon({**settings, "npm_config_registry": "http://127.0.0.1:9/"})
    [error] = [e for e in errors(daemon, env) if str(e["file"]).endswith("needs.ts")]
    assert "Cannot find package '@opencode-ai/plugin'" in str(error["message"])
    assert "`atomictoolsd js install` installs them by hand" in str(error["message"])
    with daemon.client() as client:
        status = wait_for(lambda: (s := client.status()["javascript"])["packages"] == "failed" and s,
                          timeout=30, message="the install to fail")
    assert "ECONNREFUSED" in status["installError"] and "atomictoolsd js install" in status["installError"]
    assert not any(Path(status["packagesDir"]).parent.glob(".install-*")), "a failed install leaves nothing behind"


def test_the_readme_s_typescript_tool_runs_as_written(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    import re

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    found = re.search(r"<!-- readme-test: lint-ts -->\n```ts\n(.*?)```", readme, re.DOTALL)
    assert found, "README.md has no block marked readme-test: lint-ts"
    env.write_tool(env.local_tools, "lint.ts", found.group(1))
    (env.project / "bad.py").write_text("import os\n")
    daemon: Daemon = make_daemon(js_settings("bun"))
    with daemon.client() as client:
        report = client.call("lint", path="bad.py")
        assert "F401" in report.text and "os" in report.text, report.text
        counted = client.call("lint_count", path="bad.py")
        assert counted.structured == {"path": "bad.py", "problems": 0}
        refused = client.call("lint_count", path="notes.txt")
        assert refused.is_error and "not a Python file - at `$.path`" in refused.text


@pytest.mark.parametrize("runtime", ["node", "node-thread"])
def test_node_finds_a_helper_as_bun_does_and_reloads_the_module_when_it_changes(env: Env, make_daemon, runtime: str) -> None:  # type: ignore[no-untyped-def]
    """`./_words` (no extension, as Bun and TypeScript write it) is `_words.ts`; the worker reports
    it as loaded, on Node 22.15+'s hooks and on the older ones' thread alike, so editing it reloads."""
    from helpers import wait_for as wait

    helper = env.write_tool(env.local_tools, "_words.ts", 'export const word: string = "one"\n')
    env.write_tool(env.local_tools, "speak.ts", '''
        import { tool } from "@atomic/plugin"
        import { word } from "./_words"
        export default tool({ description: "Say the helper's word", args: {}, execute: () => word })
    ''')
    daemon: Daemon = make_daemon(js_settings(runtime))
    with daemon.client() as client:
        assert client.call("speak").text == "one"
        helper.write_text('export const word: string = "two"\n')
        wait(lambda: client.call("speak").text == "two", message="the module to reload with its helper")


def test_a_file_other_users_can_write_is_never_loaded(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    import os

    helper = env.write_tool(env.local_tools, "_shared.ts", 'export const word = "x"\n')
    env.write_tool(env.local_tools, "uses.ts", 'import { word } from "./_shared"\nexport default { description: "d", args: {}, execute: () => word }\n')
    module = env.write_tool(env.local_tools, "open.ts", 'export default { description: "d", args: {}, execute: () => "x" }\n')
    os.chmod(helper, 0o666)
    os.chmod(module, 0o666)
    daemon: Daemon = make_daemon(js_settings("bun"))
    found = {str(e["file"]).rsplit("/", 1)[1]: str(e["message"]) for e in errors(daemon, env)}
    assert f"refused to load {helper}: other users can write it" in found["uses.ts"]
    assert f"refused to load {module}: other users can write it" in found["open.ts"]
