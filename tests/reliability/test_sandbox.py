"""The sandbox: a project trusted with ``--sandbox`` runs its tools confined (docs/sandbox.md).

Real daemon, real fork server, real workers, the real CLI. The escape matrix tries each way out from
a confined tool and again from a program that tool starts; each must be refused, while the same
tool in a fully trusted project gets through (so a refusal is the sandbox's doing, not the test's).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from atomictools import Client, RPCError
from atomictoolsd.config.command import command_name
from atomictoolsd.worker.forkserver import FORKSERVER_NAME
from atomictoolsd.worker.netns import PROXY_PORT
from atomictoolsd.worker.sandbox import REQUIRED_ABI, kernel_abi
from helpers import Daemon, Env, code_address, pinging, run_in_terminal, wait_for

pytestmark = pytest.mark.skipif(
    kernel_abi() < REQUIRED_ABI,
    reason=f"this machine's kernel offers Landlock ABI {kernel_abi()}; confining workers needs ABI {REQUIRED_ABI}",
)

# A helper (stdlib only) that tries one way out; run inside the worker, or as a program it starts.
ESCAPES = r'''
import ctypes, json, os, signal, socket, sys

def attempt(what, arg):
    try:
        return "done: " + str(_attempt(what, json.loads(arg) if arg else None))
    except OSError as exc:
        return f"refused: {type(exc).__name__} errno {exc.errno}"

def _attempt(what, arg):
    if what == "read":
        with open(arg) as f:
            return f.read()
    if what == "write":
        with open(arg, "a") as f:
            f.write("escaped\n")
        return "written"
    if what == "hardlink":
        os.link(arg[0], arg[1])
        with open(arg[1]) as f:
            return f.read()
    if what == "tcp":
        with socket.create_connection(("127.0.0.1", arg), timeout=5) as s:
            s.sendall(b"escaped")
        return "connected"
    if what == "udp":
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.sendto(b"escaped", ("127.0.0.1", arg))
        return "sent"
    if what == "bind":
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            s.listen()
            return s.getsockname()[1]
    if what == "stop":
        os.kill(arg, signal.SIGSTOP)
        return "stopped"
    if what == "ptrace":
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.ptrace(16, arg, 0, 0) != 0:  # PTRACE_ATTACH
            errno = ctypes.get_errno()
            raise OSError(errno, os.strerror(errno))
        libc.ptrace(17, arg, 0, 0)  # PTRACE_DETACH
        return "attached"
    if what == "rpc":
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(10)
        s.connect(arg["socket"])
        answers = []
        for request in arg["requests"]:
            s.sendall(json.dumps(request).encode() + b"\n")
            line = b""
            while not line.endswith(b"\n"):
                chunk = s.recv(65536)
                if not chunk:
                    break
                line += chunk
            answers.append(json.loads(line) if line else None)
        return json.dumps(answers)
    if what == "keyring":
        libc = ctypes.CDLL(None, use_errno=True)
        number = {"x86_64": 250, "aarch64": 219}[os.uname().machine]  # keyctl
        key = libc.syscall(number, 0, -4, 0)  # KEYCTL_GET_KEYRING_ID of the user keyring
        if key < 0:
            errno = ctypes.get_errno()
            raise OSError(errno, os.strerror(errno))
        return "the user keyring"
    if what == "env":
        return os.environ.get("TMPDIR", "")
    if what == "fs":
        return _fs(arg)
    if what == "environ":
        import subprocess
        with open("/proc/self/environ", "rb") as f:
            initial = f.read().decode(errors="replace")
        child = subprocess.run(["env"], capture_output=True, text=True, timeout=60).stdout
        return json.dumps({"environ": dict(os.environ), "initial": initial, "child": child})
    if what == "caps":  # asked of the kernel (a program's own /proc/PID is not readable confined)
        libc = ctypes.CDLL(None, use_errno=True)
        header, data = (ctypes.c_uint32 * 2)(0x20080522, 0), (ctypes.c_uint32 * 6)()
        if libc.capget(header, data) != 0:
            raise OSError(ctypes.get_errno(), "capget")
        with open("/proc/sys/kernel/cap_last_cap") as f:
            caps = range(int(f.read()) + 1)
        return json.dumps({
            "CapEff": data[0] | data[3] << 32, "CapPrm": data[1] | data[4] << 32, "CapInh": data[2] | data[5] << 32,
            "CapBnd": sum(1 << c for c in caps if libc.prctl(23, c, 0, 0, 0) == 1),  # PR_CAPBSET_READ
            "CapAmb": sum(1 << c for c in caps if libc.prctl(47, 1, c, 0, 0) == 1),  # PR_CAP_AMBIENT_IS_SET
        })
    if what == "run":
        import subprocess
        done = subprocess.run(arg["cmd"], cwd=arg["cwd"], capture_output=True, text=True, timeout=120)
        return json.dumps({"rc": done.returncode, "out": done.stdout, "err": done.stderr})
    raise ValueError(what)

def _fs(arg):
    op, path, scratch = arg["op"], arg["path"], arg.get("scratch")
    if op == "append":
        with open(path, "a") as f:
            f.write("escaped\n")
    elif op == "create":
        open(path, "x").close()
    elif op == "mkdir":
        os.mkdir(path)
    elif op == "replace":  # a file made beside it, moved over it
        with open(scratch, "w") as f:
            f.write("escaped\n")
        os.replace(scratch, path)
    elif op == "move away":
        os.rename(path, scratch)
    elif op == "delete":
        os.rmdir(path) if os.path.isdir(path) and not os.path.islink(path) else os.unlink(path)
    elif op == "symlink swap":
        os.symlink("/tmp", scratch)
        os.replace(scratch, path)
    elif op == "symlink":
        os.symlink("/tmp", path)
    elif op == "hardlink":  # a second name for it, in a directory the tool may write
        os.link(path, scratch)
        with open(scratch, "a") as f:
            f.write("escaped\n")
    elif op == "chmod":
        os.chmod(path, arg["mode"])
    else:
        raise ValueError(op)
    return op

if __name__ == "__main__":
    print(attempt(sys.argv[1], sys.argv[2]))
'''

TOOL = r'''
import os, subprocess, sys

from _escapes import attempt


def escape(what: str, arg: str = "", child: bool = False) -> str:
    """Try one way out, here or from a program this tool starts."""
    if not child:
        return attempt(what, arg)
    helper = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_escapes.py")
    done = subprocess.run([sys.executable, helper, what, arg], capture_output=True, text=True, timeout=60)
    return (done.stdout.strip() or done.stderr.strip()[-400:])
'''

SIBLING = '''
import os


def sibling() -> int:
    return os.getpid()
'''


def cli(env: Env, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "atomictoolsd", *args], env=env.vars, cwd=env.project,
                          capture_output=True, text=True, timeout=60)


class Listener:
    """A TCP listener and a UDP socket on one 127.0.0.1 port; records what reaches them."""

    def __init__(self) -> None:
        self.tcp = socket.create_server(("127.0.0.1", 0))
        self.port = self.tcp.getsockname()[1]
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("127.0.0.1", self.port))
        self.udp.settimeout(0.2)
        self.tcp.settimeout(0.2)
        self.received: list[bytes] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.tcp.accept()
                with conn:
                    conn.settimeout(2)
                    self.received.append(b"tcp:" + conn.recv(100))
            except (TimeoutError, OSError):
                pass
            try:
                self.received.append(b"udp:" + self.udp.recv(100))
            except (TimeoutError, OSError):
                pass

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.tcp.close()
        self.udp.close()


@pytest.fixture
def world(env: Env) -> Iterator[dict[str, Any]]:
    """An untrusted-by-default env with the escape tool in the project, a secret in the home, and a
    listener: the places a confined tool must not reach."""
    env.set_trust_all(False)
    env.write_tool(env.local_tools, "_escapes.py", ESCAPES)
    env.write_tool(env.local_tools, "escape.py", TOOL)
    env.write_tool(env.local_tools, "sibling.py", SIBLING)
    secret = env.home / ".ssh" / "id_secret"
    secret.parent.mkdir()
    secret.write_text("the user's secret\n")
    outside = env.home / "outside.txt"
    outside.write_text("")
    (env.project / "link-read").symlink_to(secret)
    (env.project / "link-write").symlink_to(outside)
    listener = Listener()
    try:
        yield {"secret": secret, "outside": outside, "listener": listener}
    finally:
        listener.close()


def call(client: Client, what: str, arg: Any = None, child: bool = False) -> str:
    result = client.call("escape", what=what, arg=json.dumps(arg) if arg is not None else "", child=child)
    assert not result.is_error, result.text
    return result.text.rstrip("\n")  # a program's output comes back stripped: compare alike


def forkserver_pid(daemon: Daemon) -> int:
    for process in daemon.descendants():
        if process.ppid() == daemon.pid and process.name() == FORKSERVER_NAME:
            return process.pid
    raise AssertionError("no fork server")


def matrix(daemon: Daemon, env: Env, world: dict[str, Any]) -> dict[str, Any]:
    """Each way out: the tool's name for it and its argument."""
    other = env.root / "other"
    (other / ".atomic" / "tools").mkdir(parents=True)
    hard_target = env.project / "hardlink"
    return {
        "read a file in the home": ("read", str(world["secret"])),
        "write outside the project": ("write", str(world["outside"])),
        "read through a symlink out": ("read", str(env.project / "link-read")),
        "write through a symlink out": ("write", str(env.project / "link-write")),
        "hard-link a file in": ("hardlink", [str(world["secret"]), str(hard_target)]),
        "read through /proc/self/root": ("read", "/proc/self/root" + str(world["secret"])),
        "read the daemon's environment": ("read", f"/proc/{daemon.pid}/environ"),
        "read the daemon's command line": ("read", f"/proc/{daemon.pid}/cmdline"),
        "connect over TCP": ("tcp", world["listener"].port),
        "send a UDP datagram": ("udp", world["listener"].port),
        "bind a port": ("bind", None),
        "SIGSTOP the fork server": ("stop", forkserver_pid(daemon)),
        "SIGSTOP the daemon": ("stop", daemon.pid),
        "act through the daemon's socket": ("rpc", {"socket": str(env.socket), "requests": [
            {"jsonrpc": "2.0", "id": 1, "method": "atomic/attach", "params": {"directory": str(other)}},
            {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "other_tool", "arguments": {}}},
            {"jsonrpc": "2.0", "id": 3, "method": "atomic/bridges/create", "params": {"agent": "generic"}},
        ]}),
        "write the trust store": ("write", str(env.state_dir / "trust.json")),
        "use the user's keyring": ("keyring", None),
    }


def reset(env: Env, world: dict[str, Any]) -> None:
    world["outside"].write_text("")
    (env.project / "hardlink").unlink(missing_ok=True)
    world["listener"].received.clear()


def resume(daemon: Daemon) -> None:
    """Undo a SIGSTOP that got through (so the test fails on its assertion, not on a hang)."""
    for process in [psutil.Process(daemon.pid), *daemon.descendants()]:
        try:
            process.send_signal(signal.SIGCONT)
        except psutil.Error:
            pass


def test_a_confined_tool_and_what_it_starts_cannot_get_out(env: Env, world: dict[str, Any], make_daemon, record) -> None:  # type: ignore[no-untyped-def]
    trust_store_before = None
    assert cli(env, "trust", "--yes", "--sandbox").returncode == 0
    trust_store_before = (env.state_dir / "trust.json").read_text()
    daemon: Daemon = make_daemon()
    with daemon.client() as client:
        ways = matrix(daemon, env, world)
        sibling_pid = json.loads(client.call("sibling").text)["result"]
        ways["ptrace a sibling worker"] = ("ptrace", sibling_pid)
        outcomes: dict[str, str] = {}
        try:
            for child in (False, True):
                for name, (what, arg) in ways.items():
                    reset(env, world)
                    outcome = call(client, what, arg, child=child)
                    where = "from a program it starts" if child else "from the tool"
                    outcomes[f"{name} ({where})"] = outcome
                    assert world["listener"].received == [], (name, where, world["listener"].received)
                    assert world["outside"].read_text() == "", (name, where)
        finally:
            resume(daemon)
    escaped = {name: outcome for name, outcome in outcomes.items() if not outcome.startswith("refused")}
    assert not escaped, escaped
    assert (env.state_dir / "trust.json").read_text() == trust_store_before
    assert not (env.project / "hardlink").exists()
    assert psutil.Process(daemon.pid).status() != psutil.STATUS_STOPPED
    record(f"{len(outcomes)} escapes tried ({len(ways)} ways, from the tool and from a child): all refused")


def test_the_same_tool_fully_trusted_gets_through(env: Env, world: dict[str, Any], make_daemon, record) -> None:  # type: ignore[no-untyped-def]
    # The control: each refusal above is the sandbox's, not a broken probe. (Signals and the
    # daemon's socket are left out: getting through them would stop or change the daemon.)
    assert cli(env, "trust", "--yes").returncode == 0
    daemon: Daemon = make_daemon()
    with daemon.client() as client:
        ways = matrix(daemon, env, world)
        tried = 0
        for name in ("read a file in the home", "write outside the project", "read through a symlink out",
                     "read through /proc/self/root", "read the daemon's environment", "use the user's keyring",
                     "connect over TCP", "send a UDP datagram", "bind a port"):
            what, arg = ways[name]
            for child in (False, True):
                reset(env, world)
                outcome = call(client, what, arg, child=child)
                assert outcome.startswith("done"), (name, child, outcome)
                if what in ("tcp", "udp"):
                    wait_for(lambda: world["listener"].received, message=f"the listener to hear {name}")
                tried += 1
    record(f"{tried} of the same attempts succeed with full trust")


def test_inside_the_project_a_confined_tool_reads_and_writes(env: Env, world: dict[str, Any], make_daemon) -> None:  # type: ignore[no-untyped-def]
    env.write_tool(env.local_tools, "later.py", '''
        import asyncio, subprocess

        async def later() -> str:
            await asyncio.sleep(0)  # the worker's event loop (a socket pair) works confined
            return subprocess.run(["sh", "-c", "echo from a shell"], capture_output=True, text=True).stdout
    ''')
    assert cli(env, "trust", "--yes", "--sandbox").returncode == 0
    daemon: Daemon = make_daemon()
    inside = env.project / "notes" / "a.txt"
    inside.parent.mkdir()
    with daemon.client() as client:
        for child in (False, True):
            inside.write_text("")
            assert call(client, "write", str(inside), child=child) == "done: written"
            assert call(client, "read", str(inside), child=child).rstrip() == "done: escaped"
        assert client.call("later").text == "from a shell\n"
        tmpdir = call(client, "env").removeprefix("done: ")
        assert tmpdir and not tmpdir.startswith(str(env.project))
        assert call(client, "write", os.path.join(tmpdir, "scratch")) == "done: written"
        status = client.status()
    confined = {Path(m["path"]).name: m["confined"] for m in status["modules"] if m["scope"] == "local"}
    assert confined == {"escape.py": True, "sibling.py": True, "later.py": True}
    assert status["sandbox"]["available"] and status["sandbox"]["abi"] >= REQUIRED_ABI
    escape_pid = next(m["worker"] for m in status["modules"] if m["path"].endswith("escape.py"))
    daemon.stop()
    wait_for(lambda: not psutil.pid_exists(escape_pid), message="the worker to end")
    assert not os.path.exists(tmpdir), "the worker's private TMPDIR outlived it"


@pytest.mark.parametrize("abi", ["0", str(REQUIRED_ABI - 1)])
def test_a_kernel_without_the_feature_blocks_the_project(env: Env, world: dict[str, Any], make_daemon, abi: str) -> None:  # type: ignore[no-untyped-def]
    marker = env.root / "imported"
    env.write_tool(env.local_tools, "probe.py", f"open({str(marker)!r}, 'w').close()\n\ndef probe() -> str:\n    return 'ran'\n")
    assert cli(env, "trust", "--yes", "--sandbox").returncode == 0
    env.write_config(sandbox_abi=int(abi))
    daemon: Daemon = make_daemon()
    with daemon.client() as client:
        listing = client.request("atomic/list", {})
        with pytest.raises(RPCError) as refused:
            client.call("probe")
        status = client.status()
    assert listing["trust"] == "blocked"
    assert not [t for t in listing["tools"] if t["scope"] == "local"]
    reasons = {entry["reason"] for entry in listing["blocked"]}
    assert len(reasons) == 1 and len(listing["blocked"]) == 3, listing["blocked"]
    reason = reasons.pop()
    assert "--sandbox" in reason and "do not run unconfined" in reason
    assert ("no Landlock" in reason) if abi == "0" else (f"Landlock ABI {abi}" in reason)
    assert "do not run unconfined" in str(refused.value)
    assert not status["sandbox"]["available"] and status["sandbox"]["reason"]
    assert not marker.exists(), "a module of a project that cannot be confined was imported"
    shown = cli(env, "list")
    assert "do not run unconfined" in shown.stdout, shown.stdout


def instructions(daemon: Daemon, project: Path) -> str:
    """What an agent is told when it connects through the shim (attach, then initialize)."""
    with daemon.raw() as raw:
        raw.send_bytes(
            json.dumps({"jsonrpc": "2.0", "id": 1, "method": "atomic/attach", "params": {"directory": str(project)}}).encode()
            + b"\n"
            + json.dumps({"jsonrpc": "2.0", "id": 2, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}).encode()
            + b"\n"
        )
        replies = {r["id"]: r for r in (raw.recv() for _ in range(2))}
    return str(replies[2]["result"]["instructions"])


@pytest.mark.parametrize("sandbox", ["available", "missing"])
def test_a_blocked_project_is_offered_the_trust_this_kernel_can_give(env: Env, world: dict[str, Any], make_daemon, sandbox: str) -> None:  # type: ignore[no-untyped-def]
    """Where the kernel has no sandbox, ``trust --sandbox`` would leave the project blocked: the agent
    (its instructions, a call refused), the CLI and ``atomic/list`` are told so, with the reason, and
    offered the full trust for what it is; the command offered unblocks the project."""
    root = str(env.project.resolve())
    confined, full = f"{command_name()} trust --sandbox {root}", f"{command_name()} trust {root}"
    if sandbox == "missing":
        env.write_config(sandbox_abi=0)  # as a kernel without Landlock; the CLI reads it too
    daemon: Daemon = make_daemon()
    told = instructions(daemon, env.project)
    with daemon.client() as client:
        listing = client.request("atomic/list", {})
        with pytest.raises(RPCError) as refused:
            call(client, "read", "")
    shown = cli(env, "list").stdout
    offers = {(entry["command"], entry["fullCommand"], entry["message"], entry["agentMessage"]) for entry in listing["blocked"]}
    assert len(offers) == 1 and len(listing["blocked"]) == 2, listing["blocked"]
    command, full_command, message, to_agent = offers.pop()
    assert full_command == full
    if sandbox == "missing":
        assert command == full, "trust --sandbox is offered where it would leave the project blocked"
        assert "no Landlock" in message and "trust --sandbox would leave them blocked" in message, message
        assert f"run: {full} (their code then runs with all your rights)" in message, message
        assert confined not in told and confined not in str(refused.value) and confined not in shown
    else:
        assert command == confined and message.startswith("to load them confined (no network, nothing outside the project)"), message
        assert message.index(confined) < message.index(full), "the confined trust comes first where it works"
    assert to_agent.startswith("only the user can trust a project") and command in to_agent, to_agent
    for where, text in (("instructions", told), ("the refused call", str(refused.value))):
        assert to_agent in text and message not in text, f"{where}: {text}"  # about the user, to the agent
    assert message in shown, shown
    hint = cli(env, "trust", "--list").stdout
    assert ("trust --sandbox" in hint) == (sandbox == "available"), hint

    offered = run_in_terminal([sys.executable, "-m", "atomictoolsd", *shlex.split(command)[1:]], env=env.vars, cwd=env.project)
    assert offered.returncode == 0, offered.stderr  # what was offered works here, in the user's terminal
    with daemon.client() as client:
        assert client.request("atomic/list", {})["trust"] == ("full" if sandbox == "missing" else "sandbox")
        assert call(client, "read", str(env.project / "link-read")).startswith("done" if sandbox == "missing" else "refused")


def test_trust_levels_switch_while_the_daemon_runs(env: Env, world: dict[str, Any], make_daemon) -> None:  # type: ignore[no-untyped-def]
    daemon: Daemon = make_daemon()
    secret = str(world["secret"])
    root = str(env.project.resolve())
    assert cli(env, "trust", "--yes", "--sandbox").returncode == 0
    with daemon.client() as client:
        assert client.request("atomic/list", {})["trust"] == "sandbox"
        assert call(client, "read", secret).startswith("refused")
    listed = cli(env, "trust", "--list")
    assert [line.split()[:2] for line in listed.stdout.splitlines()[1:]] == [[root, "sandbox"]], listed.stdout
    shown = cli(env, "list").stdout
    assert "local (confined)" in shown and "its own tools run confined" in shown, shown
    status = cli(env, "status", "--verbose").stdout
    assert "(confined)" in status and "sandbox   Landlock ABI" in status, status

    assert cli(env, "trust", "--yes").returncode == 0  # full trust: the modules load again, unconfined
    with daemon.client() as client:
        assert client.request("atomic/list", {})["trust"] == "full"
        assert call(client, "read", secret) == "done: the user's secret"
    assert cli(env, "trust", "--list").stdout.splitlines()[1].split()[:2] == [root, "full"]

    assert cli(env, "trust", "--yes", "--sandbox").returncode == 0  # and back
    with daemon.client() as client:
        assert call(client, "read", secret).startswith("refused")
    untrusted = cli(env, "untrust")
    assert untrusted.returncode == 0 and untrusted.stdout.startswith("untrusted:"), untrusted.stdout
    with daemon.client() as client:
        assert client.request("atomic/list", {})["trust"] == "untrusted"
        with pytest.raises(RPCError):
            call(client, "read", secret)


def test_the_user_widens_a_sandbox_and_a_module_narrows_it(env: Env, world: dict[str, Any], make_daemon) -> None:  # type: ignore[no-untyped-def]
    shared = env.home / "shared"
    shared.mkdir()
    (shared / "data.txt").write_text("shared data\n")
    out = env.home / "out"
    out.mkdir()
    port = world["listener"].port
    assert cli(env, "trust", "--yes", "--allow-net").returncode == 2, "widening without --sandbox is refused"
    done = cli(env, "trust", "--yes", "--sandbox", "--allow-net", "--allow-read", str(shared), "--allow-write", str(out))
    assert done.returncode == 0, done.stderr
    assert "sandbox (+net" in cli(env, "trust", "--list").stdout
    daemon: Daemon = make_daemon()
    with daemon.client() as client:
        for child in (False, True):
            assert call(client, "read", str(shared / "data.txt"), child=child) == "done: shared data"
            assert call(client, "write", str(out / "result.txt"), child=child) == "done: written"
            assert call(client, "write", str(shared / "data.txt"), child=child).startswith("refused"), "read only"
            # The network is the daemon's proxy (test_sandbox_net.py), never this machine's loopback.
            assert call(client, "tcp", port, child=child).startswith("refused")
            assert call(client, "tcp", PROXY_PORT, child=child) == "done: connected"
            assert call(client, "read", str(world["secret"]), child=child).startswith("refused"), "only what was allowed"
            # Even with the network, never a Unix socket: the daemon stays out of reach.
            rpc = call(client, "rpc", {"socket": str(env.socket), "requests": [{"jsonrpc": "2.0", "id": 1, "method": "ping"}]},
                       child=child)
            assert rpc.startswith("refused"), rpc
        # A module may declare that it needs less, never more.
        env.write_tool(env.local_tools, "narrow.py", f'''
            import socket
            __atomic_sandbox__ = {{"write": False, "net": False}}

            def narrow(what: str) -> str:
                try:
                    if what == "write":
                        open({str(env.project / "narrow.txt")!r}, "w").close()
                    elif what == "read":
                        return open({str(shared / "data.txt")!r}).read()
                    else:
                        socket.create_connection(("127.0.0.1", {PROXY_PORT}), timeout=5).close()
                    return "done"
                except OSError as exc:
                    return f"refused: errno {{exc.errno}}"
        ''')
        wait_for(lambda: "narrow" in [t["name"] for t in client.list_tools()], message="narrow.py to load")
        assert client.call("narrow", what="read").text == "shared data\n"
        assert client.call("narrow", what="write").text.startswith("refused")
        assert client.call("narrow", what="tcp").text.startswith("refused")
        assert not (env.project / "narrow.txt").exists()


def test_a_module_cannot_declare_more(env: Env, world: dict[str, Any], make_daemon) -> None:  # type: ignore[no-untyped-def]
    env.write_tool(env.local_tools, "greedy.py", '''
        __atomic_sandbox__ = {"net": True, "read": ["/"]}

        def greedy() -> str:
            return "ran"
    ''')
    assert cli(env, "trust", "--yes", "--sandbox").returncode == 0
    daemon: Daemon = make_daemon()
    with daemon.client() as client:
        errors = client.request("atomic/list", {})["errors"]
    assert any(e["file"].endswith("greedy.py") and "unknown keys ['read']" in e["message"] for e in errors), errors


def test_confined_global_tools_and_spilled_output(env: Env, world: dict[str, Any], make_daemon) -> None:  # type: ignore[no-untyped-def]
    env.write_tool(env.global_tools, "peek.py", f'''
        def peek(what: str) -> str:
            if what == "big":
                return "line\\n" * 5000
            try:
                return open({str(world["secret"])!r}).read()
            except OSError as exc:
                return f"refused: errno {{exc.errno}}"
    ''')
    env.write_config(sandbox_global=True)
    daemon: Daemon = make_daemon()
    with daemon.client() as client:
        assert client.call("peek", what="secret").text.startswith("refused")
        big = client.call("peek", what="big")
        status = client.status()
    assert [m["confined"] for m in status["modules"] if m["path"].endswith("peek.py")] == [True]
    spilled = big.meta["atomic/fullOutput"]  # written from inside the sandbox, readable by the user
    assert Path(spilled).read_text() == "line\n" * 5000

    blocked = make_daemon(start=False)
    daemon.stop()
    env.write_config(sandbox_global=True, sandbox_abi=0)
    blocked.start()
    with blocked.client() as client:
        listing = client.request("atomic/list", {})
    assert "peek" not in [t["name"] for t in listing["tools"]]
    assert any("sandbox_global" in entry.get("reason", "") for entry in listing["blocked"]), listing["blocked"]


def test_a_level_changed_behind_the_daemons_back_applies_to_the_next_worker(env: Env, world: dict[str, Any], make_daemon) -> None:  # type: ignore[no-untyped-def]
    # The CLI tells a running daemon; when it could not (or the store was edited), the next worker
    # that starts is confined as the store says then, never as it said before.
    from atomictoolsd.registry.trust import TrustStore

    assert cli(env, "trust", "--yes").returncode == 0
    daemon: Daemon = make_daemon()
    secret = str(world["secret"])
    with daemon.client() as client:
        assert call(client, "read", secret) == "done: the user's secret"
        TrustStore(env.state_dir).trust(env.project.resolve(), "sandbox")  # no refresh sent
        worker = next(m["worker"] for m in client.status()["modules"] if m["path"].endswith("escape.py"))
        os.kill(worker, signal.SIGKILL)
        wait_for(lambda: next(m["worker"] for m in client.status()["modules"] if m["path"].endswith("escape.py")) != worker,
                 message="the dead worker to be noticed")
        assert call(client, "read", secret).startswith("refused")


def test_confined_workers_come_from_an_execd_fork_server_of_their_own(env: Env, world: dict[str, Any], make_daemon) -> None:  # type: ignore[no-untyped-def]
    # The unconfined workers' fork server is forked from the daemon and shares its code addresses;
    # a confined worker must not learn them (the daemon parses what it sends), so its fork server
    # is exec'd, and a randomized address space is its own.
    assert cli(env, "trust", "--yes", "--sandbox").returncode == 0
    env.write_tool(env.global_tools, "plain.py", "import os\n\ndef plain() -> str:\n    return str(os.getpid())\n")
    daemon: Daemon = make_daemon()
    with daemon.client() as client:
        assert call(client, "read", str(world["secret"])).startswith("refused")  # confined
        confined = psutil.Process(next(m["worker"] for m in client.status()["modules"] if m["path"].endswith("escape.py")))
        plain = psutil.Process(int(client.call("plain").text))
        status = client.status()
    ours, theirs = plain.parent(), confined.parent()
    assert ours is not None and theirs is not None and ours.pid != theirs.pid
    confined_pids = {entry["project"]: entry["pid"] for entry in status["confinedForkservers"]}
    assert (status["forkserver"]["pid"], confined_pids[str(env.project)]) == (ours.pid, theirs.pid)
    assert theirs.ppid() == daemon.pid and theirs.name() == FORKSERVER_NAME
    assert theirs.cmdline()[1:4] == ["-P", "-m", "atomictoolsd.worker.forkserver"]
    if Path("/proc/sys/kernel/randomize_va_space").read_text().strip() != "0":
        assert code_address(plain.pid) == code_address(daemon.pid)
        assert code_address(confined.pid) != code_address(daemon.pid)


# -- the built-in tools: confined to the project they are called for --------------------------------


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout


def make_repo(root: Path, files: dict[str, str]) -> str:
    """A git repository at ``root`` with one commit of ``files``; returns the commit."""
    root.mkdir(parents=True, exist_ok=True)
    git(root, "init", "-q", "-b", "main")
    git(root, "config", "user.email", "t@example.com")
    git(root, "config", "user.name", "T")
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    git(root, "add", "-A")
    git(root, "commit", "-qm", "first")
    return git(root, "rev-parse", "HEAD").strip()


def confined_by_the_kernel(pid: int) -> bool:
    """Whether the kernel holds ``pid`` under no_new_privs and a seccomp filter (what confine sets)."""
    fields = dict(line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":\t" in line)
    return fields["NoNewPrivs"].strip() == "1" and fields["Seccomp"].strip() == "2"


def builtin_modules(client: Client) -> list[dict[str, Any]]:
    return [m for m in client.status()["modules"] if m["scope"] == "builtin"]


@pytest.fixture
def borrowed(env: Env) -> dict[str, Any]:
    """Project A (the test project) whose repository borrows the objects of project B through
    ``objects/info/alternates`` (a downloaded ``.git`` can hold that), its HEAD at B's commit: git,
    let loose, would read B's files. Built-ins enabled, every project trusted."""
    del env.vars["ATOMICTOOLS_BUILTINS"]
    other = env.root / "other"
    commit = make_repo(other, {"b-secret-plans.txt": "project B's secret\n"})
    make_repo(env.project, {"a.txt": "project A\n"})
    alternates = env.project / ".git" / "objects" / "info" / "alternates"
    alternates.write_text(f"{other / '.git' / 'objects'}\n")
    (env.project / ".git" / "refs" / "heads" / "main").write_text(commit + "\n")
    (env.home / "home-secret.txt").write_text("the home's secret\n")
    return {"other": other}


def test_a_builtin_cannot_read_another_project_or_the_home(env: Env, borrowed: dict[str, Any], make_daemon) -> None:  # type: ignore[no-untyped-def]
    daemon: Daemon = make_daemon()
    with daemon.client() as client:
        status = client.call("git-status")
        staged = client.call("git-diff-summary", staged=True)
        link = env.project / "home-link"
        link.symlink_to(env.home / "home-secret.txt")
        through_link = client.call("file-reader", path="home-link")
        elsewhere = client.call("file-reader", path=str(borrowed["other"] / "b-secret-plans.txt"))
        modules = builtin_modules(client)
    assert "b-secret-plans" not in status.text + staged.text, "git read project B's objects"
    assert status.is_error and "b-secret-plans" not in status.text
    assert through_link.is_error and "secret" not in through_link.text.replace("home-secret", "")
    assert elsewhere.is_error and "project B's secret" not in elsewhere.text
    own = [m for m in modules if m.get("project") == str(env.project.resolve())]
    assert len(own) == 3 and all(m["confined"] for m in own)
    assert any(m["worker"] for m in own) and all(confined_by_the_kernel(m["worker"]) for m in own if m["worker"])
    # Besides project A's own, only the shared ones (loaded at start, serving no project here).
    assert all("project" not in m and not m["confined"] for m in modules if m not in own)


def test_unconfined_the_same_trick_reads_the_other_project(env: Env, borrowed: dict[str, Any], make_daemon) -> None:  # type: ignore[no-untyped-def]
    """The control: where the sandbox is unavailable (simulated), the built-ins run as before, and
    git follows the alternates into project B — so the refusal above is the sandbox's."""
    env.write_config(sandbox_abi=0)
    daemon: Daemon = make_daemon()
    with daemon.client() as client:
        staged = client.call("git-diff-summary", staged=True)
        modules = builtin_modules(client)
    assert "b-secret-plans.txt" in staged.text
    assert not any(m["confined"] for m in modules)
    assert not any(confined_by_the_kernel(m["worker"]) for m in modules if m["worker"])
    out = cli(env, "status").stdout
    assert "built-in tools: not confined" in out


@pytest.mark.parametrize("level", ["--sandbox", "full"])
def test_builtins_answer_right_confined_in_a_sandboxed_and_a_fully_trusted_project(env: Env, make_daemon, level: str) -> None:  # type: ignore[no-untyped-def]
    del env.vars["ATOMICTOOLS_BUILTINS"]
    env.set_trust_all(False)
    make_repo(env.project, {"src/app.py": "print('one')\n", "README.md": "# demo\n", "pkg/mod.py": "x = 1\n"})
    (env.project / "src" / "app.py").write_text("print('one')\nprint('two')\n")
    (env.project / "new.txt").write_text("new\n")
    assert cli(env, "trust", "--yes", *([level] if level != "full" else [])).returncode == 0
    # A project of its own inside a larger repository, and a linked worktree outside the project.
    inner = env.project / "pkg"
    (inner / ".atomic").mkdir(parents=True)
    (inner / "mod.py").write_text("x = 2\n")
    worktree = env.root / "wt"
    git(env.project, "worktree", "add", "-q", "-b", "side", str(worktree))
    (worktree / "README.md").write_text("# changed in the worktree\n")
    daemon: Daemon = make_daemon()
    with daemon.client() as client:
        assert set(client.call("git-status").text.splitlines()) == {" M src/app.py", "?? new.txt", " M pkg/mod.py"}
        assert "src/app.py | 1 +" in client.call("git-diff-summary").text
        assert client.call("file-reader", path="README.md").text == "# demo\n"
        info = client.call("workspace-info").structured
        assert (info["branch"], info["trusted"]) == ("main", True)
        root_modules = builtin_modules(client)
    with daemon.client(directory=inner) as client:
        assert client.call("git-status").text == " M pkg/mod.py\n"
        assert client.call("file-reader", path="mod.py").text == "x = 2\n"
    with daemon.client(directory=worktree) as client:
        assert client.call("git-status").text == " M README.md\n"
        assert client.call("workspace-info").structured["branch"] == "side"
        modules = builtin_modules(client)
    assert all(m["confined"] for m in root_modules if m.get("project") == str(env.project.resolve()))
    projects = {m["project"] for m in modules if m["worker"] and "project" in m}
    assert projects == {str(env.project.resolve()), str(inner.resolve()), str(worktree.resolve())}
    assert all(confined_by_the_kernel(m["worker"]) for m in modules if m["worker"] and "project" in m)
    out = cli(env, "status", "--verbose").stdout
    assert "built-in tools: confined to the project they are called for" in out
    assert f"builtin (confined to {worktree.resolve()})" in out


def test_a_builtin_learns_a_trust_change_and_idle_builtin_workers_are_reaped(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    del env.vars["ATOMICTOOLS_BUILTINS"]
    env.set_trust_all(False)
    daemon: Daemon = make_daemon({"ATOMICTOOLS_IDLE_TIMEOUT": "1"})
    with daemon.client() as client:
        assert client.call("workspace-info").structured["trusted"] is False
        assert cli(env, "trust", "--yes", "--sandbox").returncode == 0
        assert client.call("workspace-info").structured["trusted"] is True
        wait_for(lambda: not [m for m in builtin_modules(client) if m["worker"]], timeout=15,
                 message="the idle built-in workers to be reaped")
        assert client.call("workspace-info").structured["trusted"] is True


def test_a_confined_worker_keeps_the_memory_limit_and_gains_no_privileges(env: Env, world: dict[str, Any], make_daemon) -> None:  # type: ignore[no-untyped-def]
    env.write_tool(env.local_tools, "hog.py", '''
        import os
        from atomictools import tool

        @tool
        def hog(mb: int) -> str:
            return str(len(bytearray(mb * 1024 * 1024)))

        @tool
        def whoami() -> int:
            return os.getpid()
    ''')
    assert cli(env, "trust", "--yes", "--sandbox").returncode == 0
    daemon: Daemon = make_daemon({"ATOMICTOOLS_MEMORY_LIMIT_MB": "200"})
    with daemon.client() as client:
        assert client.call("hog", mb=10).text == str(10 * 1024 * 1024)
        result = client.call("hog", mb=400)
        pid = json.loads(client.call("hog_whoami").text)["result"]
    assert result.is_error and "past the worker memory limit of 200 MiB" in result.text, result.text
    assert confined_by_the_kernel(pid)


def test_a_confined_builtin_reads_your_git_config_as_it_is_now(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    """A Landlock rule binds the file there when the worker started; ~/.gitconfig made or rewritten
    since (``git config --global`` writes a new file) is read by the next call all the same."""
    del env.vars["ATOMICTOOLS_BUILTINS"]
    make_repo(env.project, {"a.txt": "a\n"})
    (env.project / "new.txt").write_text("new\n")
    daemon: Daemon = make_daemon()
    gitconfig = env.home / ".gitconfig"
    with daemon.client() as client:
        assert client.call("git-status").text == "?? new.txt\n"
        gitconfig.write_text("[status]\n\tshowUntrackedFiles = no\n")
        wait_for(lambda: client.call("git-status").text.startswith("Clean"), timeout=15, message="the new ~/.gitconfig read")
        subprocess.run(["git", "config", "--global", "status.showUntrackedFiles", "normal"], env=env.vars, check=True)
        wait_for(lambda: client.call("git-status").text == "?? new.txt\n", timeout=15, message="the rewritten ~/.gitconfig read")
        assert all(m["confined"] for m in builtin_modules(client) if "project" in m)


# -- what others execute stays read-only: protected entries -------------------------------------------


@pytest.fixture
def guarded(env: Env, world: dict[str, Any]) -> dict[str, Any]:
    """The project as a git repository with what others execute: git's own files, a submodule the
    index lists but that is not checked out (``vendor/lib``) and one that is (``vendor/used``, its
    ``.git`` a file, and a submodule of its own, ``deep``), direnv's ``.envrc``, an editor's tasks; agents' configs that are not there
    yet; an entry the user protects by name (``--protect docs/conf.py``) and one by the
    configuration (``sandbox_protect``)."""
    make_repo(env.project, {"README.md": "# app\n", "src/app.py": "x = 1\n", "docs/conf.py": "project = 'app'\n",
                            "vendor/README": "vendored\n"})
    commit = git(env.project, "rev-parse", "HEAD").strip()
    for link in ("vendor/lib", "vendor/used"):
        git(env.project, "update-index", "--add", "--cacheinfo", f"160000,{commit},{link}")
    (env.project / "vendor" / "lib").mkdir()
    (env.project / ".git" / "modules").mkdir()
    git(env.project, "init", "-q", "--separate-git-dir", str(env.project / ".git" / "modules" / "used"), "vendor/used")
    git(env.project / "vendor" / "used", "update-index", "--add", "--cacheinfo", f"160000,{commit},deep")  # its own submodule
    (env.project / "vendor" / "used" / "deep").mkdir()
    (env.project / ".envrc").write_text("export APP=1\n")
    (env.project / ".vscode").mkdir()
    (env.project / ".vscode" / "tasks.json").write_text('{"tasks": []}\n')
    # Agent configs that are there: OpenCode's at the root (a file, writable were it not protected)
    # and Qwen Code's; the MCP servers they name are started by the agent.
    (env.project / "opencode.json").write_text('{"mcp": {}}\n')
    (env.project / ".qwen").mkdir()
    (env.project / ".qwen" / "settings.json").write_text('{"mcpServers": {}}\n')
    # What the repository's own git config names in the work tree: a hooks directory, a config file
    # it includes, and (in that file) an fsmonitor program; your next git runs or reads each.
    (env.project / ".githooks").mkdir()
    (env.project / ".githooks" / "pre-commit").write_text("#!/bin/sh\nexit 0\n")
    (env.project / "tools" / "git").mkdir(parents=True)
    (env.project / "tools" / "git" / "fsmonitor").write_text("#!/bin/sh\nexit 1\n")
    (env.project / ".gitconfig").write_text("[core]\n\tfsmonitor = tools/git/fsmonitor --v2\n")
    git(env.project, "config", "core.hooksPath", ".githooks")
    git(env.project, "config", "include.path", "../.gitconfig")
    env.write_config(sandbox_protect=".foo:.bar")
    files = [".envrc", ".git/config", ".git/HEAD", ".vscode/tasks.json", "docs/conf.py", "vendor/used/.git",
             "opencode.json", ".qwen/settings.json", ".githooks/pre-commit", ".gitconfig", "tools/git/fsmonitor"]
    return {
        "files": files,
        "dirs": [".git", ".git/hooks", ".vscode", ".atomic", ".qwen", ".githooks"],
        "missing": [".mcp.json", ".claude", ".cursor", ".foo", "vendor/lib/.git", "vendor/used/deep/.git",
                    ".git/hooks/pre-commit", "opencode.jsonc", ".githooks/post-checkout"],
        "before": {name: ((env.project / name).read_bytes(), (env.project / name).stat().st_mode) for name in files},
    }


def protected_matrix(env: Env, guarded: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Each protected entry, and each way to change it: write it, make it (when it is not there),
    move something over it, remove it or move it away, put a symlink in its place, widen its mode."""
    project = env.project
    scratch = str(project / "src" / "scratch")
    ways: list[tuple[str, dict[str, Any]]] = []
    for name in guarded["files"]:
        path = str(project / name)
        ways += [(f"{op} {name}", {"op": op, "path": path, "scratch": scratch})
                 for op in ("append", "replace", "move away", "delete", "symlink swap", "hardlink")]
        ways += [(f"chmod {mode:o} {name}", {"op": "chmod", "path": path, "mode": mode}) for mode in (0o666, 0o4755)]
    for name in guarded["dirs"]:
        path = str(project / name)
        ways += [(f"create in {name}", {"op": "create", "path": f"{path}/evil"}),
                 (f"move {name} away", {"op": "move away", "path": path, "scratch": scratch}),
                 (f"symlink swap {name}", {"op": "symlink swap", "path": path, "scratch": scratch}),
                 (f"chmod 777 {name}", {"op": "chmod", "path": path, "mode": 0o777})]
    for name in guarded["missing"]:
        path = str(project / name)
        ways += [(f"{op} {name}", {"op": op, "path": path, "scratch": scratch})
                 for op in ("create", "mkdir", "replace", "symlink")]
    return ways


def test_what_others_execute_stays_read_only_to_a_confined_tool(env: Env, world: dict[str, Any], guarded: dict[str, Any], make_daemon, record) -> None:  # type: ignore[no-untyped-def]
    assert cli(env, "trust", "--yes", "--sandbox", "--protect", "docs/conf.py").returncode == 0
    daemon: Daemon = make_daemon()
    ways = protected_matrix(env, guarded)
    outcomes: dict[str, str] = {}
    with daemon.client() as client:
        for child in (False, True):
            for name, arg in ways:
                where = "from a program it starts" if child else "from the tool"
                outcomes[f"{name} ({where})"] = call(client, "fs", arg, child=child)
                scratch = env.project / "src" / "scratch"
                shutil.rmtree(scratch) if scratch.is_dir() and not scratch.is_symlink() else scratch.unlink(missing_ok=True)
        # What is not protected stays writable: the files and directories there, the root's files.
        works = {
            "write src/": call(client, "fs", {"op": "create", "path": str(env.project / "src" / "new.py")}),
            "write a file at the root": call(client, "fs", {"op": "append", "path": str(env.project / "README.md")}),
            "make a directory in src/": call(client, "fs", {"op": "mkdir", "path": str(env.project / "src" / "pkg")}),
            "git status": call(client, "run", {"cmd": ["git", "status", "--short"], "cwd": str(env.project)}),
        }
        new_at_root = call(client, "fs", {"op": "create", "path": str(env.project / "new.txt")})
    escaped = {name: outcome for name, outcome in outcomes.items() if not outcome.startswith("refused")}
    assert not escaped, escaped
    assert all(outcome.startswith("done") for outcome in works.values()), works
    assert json.loads(works["git status"].removeprefix("done: "))["rc"] == 0, works["git status"]
    # The price of refusing a protected name that is not there: nothing new is made at the root.
    assert new_at_root.startswith("refused"), new_at_root
    for name, (content, mode) in guarded["before"].items():
        path = env.project / name
        assert not path.is_symlink() and (path.read_bytes(), path.stat().st_mode) == (content, mode), name
    for name in guarded["missing"]:
        assert not os.path.lexists(env.project / name), name
    assert (env.project / ".vscode").is_dir() and (env.project / ".git").is_dir()
    record(f"{len(outcomes)} changes to what others execute tried ({len(ways)} ways, from the tool and a child): all refused")


def test_fully_trusted_the_same_changes_go_through(env: Env, world: dict[str, Any], guarded: dict[str, Any], make_daemon) -> None:  # type: ignore[no-untyped-def]
    # The control: the probes work, so each refusal above is the sandbox's.
    assert cli(env, "trust", "--yes").returncode == 0
    daemon: Daemon = make_daemon()
    tried = {name: arg for name, arg in protected_matrix(env, guarded)
             if name in ("append .git/config", "chmod 666 .envrc", "create .mcp.json", "create in .git/hooks",
                         "mkdir vendor/lib/.git", "replace .foo")}
    with daemon.client() as client:
        outcomes = {name: call(client, "fs", arg) for name, arg in tried.items()}
    assert len(outcomes) == 6 and all(o.startswith("done") for o in outcomes.values()), outcomes


def test_an_entry_made_at_the_root_is_writable_by_the_next_call(env: Env, world: dict[str, Any], make_daemon) -> None:  # type: ignore[no-untyped-def]
    """A worker may write what its project's root held when it was made; a directory you make there
    later (mkdir build) sends the next call to a new worker, which may write it."""
    assert cli(env, "trust", "--yes", "--sandbox").returncode == 0
    daemon: Daemon = make_daemon()
    build = env.project / "build"
    with daemon.client() as client:
        assert call(client, "fs", {"op": "mkdir", "path": str(build)}).startswith("refused")
        build.mkdir()
        assert call(client, "fs", {"op": "create", "path": str(build / "out.o")}) == "done: create"
    assert (build / "out.o").exists()



def test_a_repository_naming_a_symlink_loop_in_its_git_config_is_served(env: Env, world: dict[str, Any], make_daemon) -> None:  # type: ignore[no-untyped-def]
    """The repository's config includes ``../loop``, a symlink to itself: the project's policy is
    made all the same (every attach failed with 'Internal error: RuntimeError: Symlink loop')."""
    git(env.project, "init", "-q")
    (env.project / "loop").symlink_to("loop")
    with open(env.project / ".git" / "config", "a") as config:
        config.write("[include]\n\tpath = ../loop\n")
    (env.project / "src").mkdir()
    assert cli(env, "trust", "--yes", "--sandbox").returncode == 0
    daemon: Daemon = make_daemon()
    with daemon.client() as client:
        assert call(client, "fs", {"op": "create", "path": str(env.project / "src" / "made")}) == "done: create"


def test_a_repository_config_of_many_includes_is_read_off_the_event_loop(env: Env, world: dict[str, Any], make_daemon) -> None:  # type: ignore[no-untyped-def]
    """What a confined project's git config names is read with ``git config``, once for each file
    it includes: 79 includes of 800 lines each took the event loop 0.4 s at each reload after one
    of them changed. It is read in a thread; the policy made on the loop finds it there."""
    git(env.project, "init", "-q")
    includes = env.project / ".git" / "inc"
    includes.mkdir()
    body = "".join(f"[section{i}]\n\tkey = value{i}\n" for i in range(400))
    chain = [includes / f"c{i}" for i in range(79)]
    for i, path in enumerate(chain):
        path.write_text(body + (f"[include]\n\tpath = {chain[i + 1]}\n" if i + 1 < len(chain) else ""))
    with open(env.project / ".git" / "config", "a") as config:
        config.write(f"[include]\n\tpath = {chain[0]}\n")
    assert cli(env, "trust", "--yes", "--sandbox").returncode == 0
    daemon: Daemon = make_daemon()
    with daemon.client() as client:
        pid = client.call("sibling").text
        with pinging(env.socket) as pings:
            for round_ in range(5):
                for path in chain:  # each include changed: the next policy reads them all again
                    path.write_text(path.read_text() + f"[round{round_}]\n\tkey = 1\n")
                env.write_tool(env.local_tools, "sibling.py", SIBLING + f"\n# round {round_}\n")
                pid = wait_for(lambda old=pid: (new := client.call("sibling").text) != old and new, message="the reload")
    waited = sum(max(0.0, took - 0.1) for took in pings)
    assert waited < 0.5, f"pings waited {waited:.2f} s in all (the slowest {max(pings):.2f} s) over five reloads"


# -- the environment: an allowlist, and what the user allows by name ----------------------------------

SECRETS = {"GITHUB_TOKEN": "ghp_daemon_secret", "AWS_SECRET_ACCESS_KEY": "aws-daemon-secret",
           "ATOMICTOOLS_TOKEN": "the-daemons-http-token", "MY_API_KEY": "allowed-by-name", "OTHER_KEY": "allowed-by-config"}


def environments(client: Client) -> dict[str, str]:
    """What a confined tool sees of its environment: ``os.environ``, ``/proc/self/environ`` (its
    fork server's, as exec'd) and a program's it starts, each as text."""
    seen = json.loads(call(client, "environ").removeprefix("done: "))
    return {"os.environ": json.dumps(seen["environ"]), "/proc/self/environ": seen["initial"], "a child's": seen["child"]}


def test_a_confined_worker_gets_an_allowlisted_environment(env: Env, world: dict[str, Any], make_daemon) -> None:  # type: ignore[no-untyped-def]
    del env.vars["ATOMICTOOLS_BUILTINS"]
    other = env.root / "other"
    (other / ".atomic").mkdir(parents=True)
    env.write_tool(other / ".atomic" / "tools", "_escapes.py", ESCAPES)
    env.write_tool(other / ".atomic" / "tools", "escape.py", TOOL)
    outside = env.root / "outside"
    outside.mkdir()
    env.write_config(sandbox_allow_env="OTHER_KEY")
    assert cli(env, "trust", "--yes", "--sandbox", "--allow-env", "MY_API_KEY").returncode == 0
    refused = cli(env, "trust", "--yes", "--sandbox", "--allow-env", "ATOMICTOOLS_TOKEN")
    assert refused.returncode == 2 and "never given to a confined tool" in refused.stderr, refused.stderr
    assert cli(env, "trust", "--yes", "--sandbox", str(other)).returncode == 0
    # Widening from the environment (an agent's entry can set it) is not the user's configuration.
    daemon: Daemon = make_daemon({**SECRETS, "ATOMICTOOLS_SANDBOX_ALLOW_WRITE": str(outside),
                                  "ATOMICTOOLS_SANDBOX_ALLOW_NET": "1"})
    assert "ghp_daemon_secret" in Path(f"/proc/{daemon.pid}/environ").read_text(errors="replace")  # the setting
    with daemon.client() as client:
        seen = environments(client)
        ignored = {
            "ATOMICTOOLS_SANDBOX_ALLOW_WRITE": call(client, "write", str(outside / "x")),
            "ATOMICTOOLS_SANDBOX_ALLOW_NET": call(client, "tcp", world["listener"].port),
        }
        client.call("workspace-info")  # a built-in worker of this project
        builtin_pids = [m["worker"] for m in client.status()["modules"]
                        if m["scope"] == "builtin" and m.get("project") and m["worker"]]
        status = client.status()
    with daemon.client(directory=other) as client:
        seen_elsewhere = environments(client)
    assert builtin_pids
    builtins_seen = {f"built-in worker {pid}": Path(f"/proc/{pid}/environ").read_text(errors="replace") for pid in builtin_pids}
    for entry in status["confinedForkservers"]:
        if entry["pid"]:
            builtins_seen[f"the confined fork server of {entry['project']}"] = \
                Path(f"/proc/{entry['pid']}/environ").read_text(errors="replace")
    for where, text in {**seen, **builtins_seen}.items():
        for name in ("GITHUB_TOKEN", "AWS_SECRET_ACCESS_KEY", "ATOMICTOOLS_TOKEN"):
            assert SECRETS[name] not in text and name not in text, (where, name)
        assert "ATOMICTOOLS_" not in text, where
    for where in ("os.environ", "a child's"):
        assert "allowed-by-name" in seen[where] and "allowed-by-config" in seen[where], where
        assert "PATH" in seen[where] and str(env.home) in seen[where], where
        assert "allowed-by-name" not in seen_elsewhere[where], "a variable one project is allowed reached another"
        assert "allowed-by-config" in seen_elsewhere[where], where
    for where, text in builtins_seen.items():
        assert "allowed-by-name" not in text and "allowed-by-config" not in text, where
    assert all(outcome.startswith("refused") for outcome in ignored.values()), ignored
    assert not (outside / "x").exists() and world["listener"].received == []


@pytest.mark.skipif(os.geteuid() != 0, reason="a daemon run by a user holds no capabilities to drop")
def test_a_confined_worker_of_a_root_daemon_holds_no_capabilities(env: Env, world: dict[str, Any], make_daemon) -> None:  # type: ignore[no-untyped-def]
    assert cli(env, "trust", "--yes", "--sandbox").returncode == 0
    daemon: Daemon = make_daemon()
    daemon_caps = {line.split(":")[0]: line.split(":")[1].strip()
                   for line in Path(f"/proc/{daemon.pid}/status").read_text().splitlines() if line.startswith("Cap")}
    assert int(daemon_caps["CapEff"], 16) != 0  # the setting: root, with its capabilities
    nothing = dict.fromkeys(("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"), 0)
    with daemon.client() as client:
        for child in (False, True):
            assert json.loads(call(client, "caps", child=child).removeprefix("done: ")) == nothing, child
        worker = next(m["worker"] for m in client.status()["modules"] if m["path"].endswith("escape.py"))
    seen = {line.split(":")[0]: int(line.split(":")[1], 16)
            for line in Path(f"/proc/{worker}/status").read_text().splitlines() if line.startswith("Cap")}
    assert seen == nothing, seen


# -- everyday programs: git with your configuration's harmless part, a file allowed by name -----------


def test_a_confined_tool_runs_everyday_programs_and_git_without_your_credentials(env: Env, world: dict[str, Any], make_daemon) -> None:  # type: ignore[no-untyped-def]
    (env.home / ".gitconfig").write_text(
        '[user]\n\tname = Jane Doe\n\temail = jane@example.com\n'
        '[url "https://x-access-token:ghp_gitconfig_secret@github.com/"]\n\tinsteadOf = https://github.com/\n'
        '[http]\n\textraHeader = Authorization: Bearer gitconfig_header_secret\n[credential]\n\thelper = store --file ~/.my-credential-store\n'
    )
    make_repo(env.project, {"README.md": "# app\n", "tests/test_app.py": "def test_app():\n    assert True\n",
                            "Makefile": "all:\n\t@echo made\n", "app.js": "console.log('from node')\n",
                            "app.py": "print('ok')\n"})
    notes = env.home / "notes.txt"
    notes.write_text("notes the user allows\n")
    (env.home / "diary.txt").write_text("not allowed\n")
    assert cli(env, "trust", "--yes", "--sandbox", "--allow-read", str(notes)).returncode == 0
    daemon: Daemon = make_daemon()
    project = str(env.project)
    programs = {
        "git status": ["git", "status", "--short"],
        "git log": ["git", "log", "--oneline"],
        "git config": ["git", "config", "--list", "--show-origin"],
        "pytest": [sys.executable, "-m", "pytest", "-q", "tests"],
        "ruff": [sys.executable, "-m", "ruff", "check", "--no-cache", "--isolated", "app.py"],
        "make": ["make"],
        "node": ["node", "app.js"],
    }
    with daemon.client() as client:
        ran = {name: json.loads(call(client, "run", {"cmd": cmd, "cwd": project}).removeprefix("done: "))
               for name, cmd in programs.items() if shutil.which(cmd[0])}
        allowed = call(client, "read", str(notes))
        diary = call(client, "read", str(env.home / "diary.txt"))
        gitconfig = call(client, "read", str(env.home / ".gitconfig"))
        seen = environments(client)
    assert set(ran) >= {"git status", "git log", "git config", "pytest", "ruff"}
    failed = {name: done for name, done in ran.items() if done["rc"] != 0}
    assert not failed, failed
    assert "first" in ran["git log"]["out"] and "1 passed" in ran["pytest"]["out"]
    assert "user.name=Jane Doe" in ran["git config"]["out"]  # the harmless part of your configuration
    everything = json.dumps([ran, seen])
    for secret in ("ghp_gitconfig_secret", "gitconfig_header_secret", "my-credential-store"):
        assert secret not in everything, secret
    assert gitconfig.startswith("refused") and diary.startswith("refused"), (gitconfig, diary)
    assert allowed == "done: notes the user allows"


def test_built_ins_get_the_allowlisted_environment_where_the_kernel_cannot_confine_them(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    """Without Landlock the built-ins run unconfined, the product's own code; they still come from
    the fork server of the allowlisted environment, so no variable of the daemon's reaches them."""
    del env.vars["ATOMICTOOLS_BUILTINS"]
    env.write_config(sandbox_abi=0)  # as a kernel without Landlock
    daemon: Daemon = make_daemon(SECRETS)
    with daemon.client() as client:
        client.call("workspace-info")  # a built-in worker of this project
        pids = [m["worker"] for m in client.status()["modules"] if m["scope"] == "builtin" and m["worker"]]
    assert pids
    for pid in pids:
        seen = Path(f"/proc/{pid}/environ").read_text(errors="replace")
        assert "PATH=" in seen, seen
        for name in ("GITHUB_TOKEN", "AWS_SECRET_ACCESS_KEY", "ATOMICTOOLS_TOKEN"):
            assert SECRETS[name] not in seen and f"{name}=" not in seen, (pid, name)
