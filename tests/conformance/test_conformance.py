"""The official MCP conformance suite (``@modelcontextprotocol/conformance``) against the daemon's
Streamable HTTP endpoint, with a fixture project whose tools implement the scenarios through the
public authoring API (``project/.atomic/tools/``).

The suite runs every server scenario of the active suite; ``expected-failures.yml`` lists the ones
this product does not serve, each with its reason, and the suite itself fails on a scenario that
fails without being listed or passes while listed. Installed by ``.ci/run`` (Node 22 and the suite
from npm, into ``.ci/agents``); without them the test skips and says how to install.

The suite sends no credentials, and the daemon answers no request without its token: a preload
module (``auth-preload.mjs``) gives the suite's HTTP client the token, as an agent configured with
it would send it. Nothing in the daemon knows about the test.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from helpers import Env

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
AGENTS = HERE.parents[1] / ".ci" / "agents" / "node_modules"
NODE = AGENTS / ".bin" / "node"
SUITE = AGENTS / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"


def _node_major() -> int:
    try:
        out = subprocess.run([str(NODE), "--version"], capture_output=True, text=True, timeout=30).stdout
        return int(out.strip().lstrip("v").split(".")[0])
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return 0


@pytest.fixture
def endpoint(env: Env, make_daemon: Any) -> tuple[str, str]:
    if not SUITE.exists() or _node_major() < 22:
        pytest.skip("the conformance suite or Node 22 is not installed: "
                    "run `npm install --prefix .ci/agents --no-audit --no-fund` (.ci/run does)")
    shutil.copytree(HERE / "project" / ".atomic" / "tools", env.local_tools)
    daemon = make_daemon({"ATOMICTOOLS_HTTP": "127.0.0.1:0"})
    with daemon.raw() as raw:
        info = raw.request("atomic/status")["result"]["http"]
    token = Path(info["tokenFile"]).read_text().strip()
    return f"{info['url']}?directory={env.project}", token


def test_the_official_conformance_suite_passes_all_but_the_listed_scenarios(endpoint: tuple[str, str], tmp_path: Path) -> None:
    url, token = endpoint
    environ = {
        **os.environ,
        "PATH": f"{NODE.parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "NODE_OPTIONS": f"--import {(HERE / 'auth-preload.mjs').as_uri()}",
        "ATOMICTOOLS_TEST_BEARER": token,
        "ATOMICTOOLS_TEST_UNDICI": (AGENTS / "@modelcontextprotocol" / "conformance" / "node_modules" / "undici").as_posix()
        if (AGENTS / "@modelcontextprotocol" / "conformance" / "node_modules" / "undici").exists()
        else (AGENTS / "undici").as_posix(),
    }
    started = time.monotonic()
    run = subprocess.run(
        [str(NODE), str(SUITE), "server", "--url", url, "--suite", "all", "--expected-failures", str(HERE / "expected-failures.yml"),
         "--output-dir", str(tmp_path / "results")],
        env=environ, capture_output=True, text=True, timeout=300,
    )
    took = time.monotonic() - started
    report = run.stdout[-6000:] + "\n" + run.stderr[-6000:]
    print(f"conformance suite: exit {run.returncode} in {took:.1f} s")
    assert run.returncode == 0, report
    # The baseline was honoured, not bypassed: the listed scenarios really ran and failed.
    assert "expected" in (run.stdout + run.stderr).lower(), report


def test_the_baseline_gives_a_reason_for_each_expected_failure() -> None:
    lines = (HERE / "expected-failures.yml").read_text().splitlines()
    entries = [line for line in lines if line.strip().startswith("- ")]
    assert entries
    for entry in entries:
        assert "#" in entry, f"no reason given: {entry}"
        name = entry.strip()[2:].split("#")[0].strip()
        assert name.startswith(("resources-", "prompts-", "completion-")), f"{name}: only resources, prompts and completions may fail"
