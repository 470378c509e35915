"""The sandbox's escape matrix (test_sandbox.py) for a TypeScript tool: a Bun or Node worker of a
project trusted with ``--sandbox`` is confined before the runtime starts (Landlock and seccomp hold
across its exec), so every way out is refused from the tool and from a program it starts; the same
tool fully trusted gets through, so each refusal is the sandbox's doing."""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest

from atomictools import Client
from atomictoolsd.worker.sandbox import REQUIRED_ABI, kernel_abi
from helpers import Daemon, Env, wait_for
from javascript_helpers import js_settings
from reliability.test_sandbox import cli, matrix, reset, resume, world  # noqa: F401 - world: the fixture ts_world asks for

pytestmark = pytest.mark.skipif(
    kernel_abi() < REQUIRED_ABI,
    reason=f"this machine's kernel offers Landlock ABI {kernel_abi()}; confining workers needs ABI {REQUIRED_ABI}",
)

# Each way out, tried from the tool's own code; what JavaScript cannot do itself (ptrace, keyctl:
# system calls with no API) is tried from a program the tool starts only (`child`).
ESCAPE_TS = r'''
import { tool } from "@atomic/plugin"
import { appendFileSync, linkSync, readFileSync } from "node:fs"
import { spawnSync } from "node:child_process"
import { dirname, join } from "node:path"
import * as dgram from "node:dgram"
import * as net from "node:net"

const settle = (open: (resolve: (v: unknown) => void, reject: (e: unknown) => void) => void) =>
  new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error("timed out")), 5000)
    open((v) => { clearTimeout(timer); resolve(v) }, (e) => { clearTimeout(timer); reject(e) })
  })

async function attempt(what: string, arg: any): Promise<unknown> {
  switch (what) {
    case "read": return readFileSync(arg, "utf8")
    case "write": appendFileSync(arg, "escaped\n"); return "written"
    case "hardlink": linkSync(arg[0], arg[1]); return readFileSync(arg[1], "utf8")
    case "tcp": return settle((resolve, reject) => {
      const socket = net.connect({ host: "127.0.0.1", port: arg }, () => socket.end("escaped", () => resolve("connected")))
      socket.on("error", reject)
    })
    case "udp": return settle((resolve, reject) => {
      const socket = dgram.createSocket("udp4")
      socket.on("error", reject)
      socket.send("escaped", arg, "127.0.0.1", (error) => { socket.close(); error ? reject(error) : resolve("sent") })
    })
    case "bind": return settle((resolve, reject) => {
      const server = net.createServer()
      server.on("error", reject)
      server.listen(0, "127.0.0.1", () => { const port = (server.address() as any).port; server.close(); resolve(port) })
    })
    case "stop": process.kill(arg, "SIGSTOP"); return "stopped"
    case "rpc": return settle((resolve, reject) => {
      const socket = net.connect({ path: arg.socket }, () => socket.write(arg.requests.map((r: any) => JSON.stringify(r) + "\n").join("")))
      let received = ""
      socket.on("data", (chunk) => { received += chunk; if (received.split("\n").length > arg.requests.length) { socket.end(); resolve(received) } })
      socket.on("error", reject)
    })
    case "env": return process.env.TMPDIR ?? ""
    default: throw Object.assign(new Error(`not from JavaScript: ${what}`), { code: "NOTHERE" })
  }
}

export default tool({
  description: "Try one way out, here or from a program this tool starts",
  args: { what: tool.schema.string(), arg: tool.schema.string(), child: tool.schema.boolean(), python: tool.schema.string() },
  async execute(args, context) {
    if (args.child) {
      const helper = join(dirname(new URL(import.meta.url).pathname), "_escapes.py")
      const done = spawnSync(args.python, [helper, args.what, args.arg], { encoding: "utf8", timeout: 60_000 })
      return (done.stdout ?? "").trim() || String(done.stderr ?? done.error).trim().slice(-400)
    }
    try {
      return "done: " + String(await attempt(args.what, args.arg ? JSON.parse(args.arg) : null))
    } catch (error: any) {
      return `refused: ${error?.code ?? error?.name} ${error?.message ?? error}`
    }
  },
})
'''
SIBLING_TS = 'export default {description: "Its pid", args: {}, execute: () => String(process.pid)}\n'
FROM_CHILD_ONLY = ("ptrace", "keyring")


def call(client: Client, what: str, arg: Any = None, child: bool = False) -> str:
    result = client.call("escape", what=what, arg=json.dumps(arg) if arg is not None else "", child=child,
                         python=sys.executable)
    assert not result.is_error, result.text
    return result.text.rstrip("\n")


@pytest.fixture(params=["bun", "node"])
def ts_world(request: pytest.FixtureRequest, env: Env) -> dict[str, Any]:
    """``world`` with the escape tool written in TypeScript (the Python one removed)."""
    places: dict[str, Any] = request.getfixturevalue("world")
    for name in ("escape.py", "sibling.py"):
        (env.local_tools / name).unlink()
    env.write_tool(env.local_tools, "escape.ts", ESCAPE_TS)
    env.write_tool(env.local_tools, "sibling.ts", SIBLING_TS)
    return {**places, "settings": js_settings(request.param), "runtime": request.param}


def test_a_confined_typescript_tool_and_what_it_starts_cannot_get_out(env: Env, ts_world: dict[str, Any], make_daemon, record) -> None:  # type: ignore[no-untyped-def]
    assert cli(env, "trust", "--yes", "--sandbox").returncode == 0
    trust_store_before = (env.state_dir / "trust.json").read_text()
    daemon: Daemon = make_daemon(ts_world["settings"])
    outcomes: dict[str, str] = {}
    with daemon.client() as client:
        ways = matrix(daemon, env, ts_world)
        ways["ptrace a sibling worker"] = ("ptrace", int(client.call("sibling").text))
        try:
            for child in (False, True):
                for name, (what, arg) in ways.items():
                    if what in FROM_CHILD_ONLY and not child:
                        continue
                    reset(env, ts_world)
                    outcome = call(client, what, arg, child=child)
                    where = "from a program it starts" if child else "from the tool"
                    outcomes[f"{name} ({where})"] = outcome
                    assert ts_world["listener"].received == [], (name, where, ts_world["listener"].received)
                    assert ts_world["outside"].read_text() == "", (name, where)
        finally:
            resume(daemon)
        status = client.status()
    escaped = {name: outcome for name, outcome in outcomes.items() if not outcome.startswith("refused")}
    assert not escaped, escaped
    assert (env.state_dir / "trust.json").read_text() == trust_store_before
    assert not (env.project / "hardlink").exists()
    assert {m["path"].rsplit("/", 1)[1]: m["confined"] for m in status["modules"] if m["scope"] == "local"} == {
        "escape.ts": True, "sibling.ts": True}
    record(f"{ts_world['runtime']}: {len(outcomes)} escapes tried from a confined TypeScript tool and its child: all refused")


def test_the_same_typescript_tool_fully_trusted_gets_through(env: Env, ts_world: dict[str, Any], make_daemon) -> None:  # type: ignore[no-untyped-def]
    assert cli(env, "trust", "--yes").returncode == 0
    daemon: Daemon = make_daemon(ts_world["settings"])
    with daemon.client() as client:
        ways = matrix(daemon, env, ts_world)
        for name in ("read a file in the home", "write outside the project", "read through a symlink out",
                     "read the daemon's environment", "connect over TCP", "send a UDP datagram", "bind a port"):
            what, arg = ways[name]
            for child in (False, True):
                reset(env, ts_world)
                outcome = call(client, what, arg, child=child)
                assert outcome.startswith("done"), (name, child, outcome)
                if what in ("tcp", "udp"):
                    wait_for(lambda: ts_world["listener"].received, message=f"the listener to hear {name}")
