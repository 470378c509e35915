"""Tools that attack the daemon from inside their worker: they find their channel and write forged,
oversized and malformed frames on it, stop the fork server with SIGSTOP, or flood ``ctx.log``. And
the daemon frozen while a call finishes.

What holds: a client sees only well-formed answers of its own calls (isError naming what went wrong,
or the tool's own result), never bytes a tool wrote; the daemon's memory does not follow what a tool
announces or sends; a stopped fork server is replaced, and spawns, attaches and reloads answer while
status names what happened; a result that was waiting when a frozen daemon woke beats its timeout.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from atomictoolsd.worker.output import BURST_BYTES, RATE_BYTES
from helpers import Daemon, Env, RawConnection, pinging, wait_for

LIMIT = 1 << 20  # max_message_bytes for the frame matrix: the attacks go far past it

# The attacker: finds the worker runtime (it holds the channel socket and the sender every frame
# goes through, so that a forged frame is whole and on its own) and writes what it is told to.
HOSTILE = '''
    import gc, os, struct, time
    import msgspec
    from atomictools import Context, tool

    _last = []

    def _runtime():
        for obj in gc.get_objects():
            if type(obj).__name__ == "Runtime" and hasattr(obj, "sock"):
                return obj
        raise RuntimeError("no runtime found")

    def _write(rt, data):
        rt._sender.send(data)

    def _frame(message):
        body = msgspec.msgpack.encode(message)
        return struct.pack(">I", len(body)) + body

    def _raw(body):
        return struct.pack(">I", len(body)) + body

    # Nested far deeper than any decoder recurses, built by hand (no encoder would): in the fields
    # a frame may hold any value in (a load report's), and in the JSON a result, a log message and a
    # question carry.
    N = 100_000
    NESTED_MAP = b"\\x81\\xa1a" * N + b"\\xc0"  # msgpack {"a": {"a": ... None}}
    NESTED_JSON = b"[" * N + b"]" * N
    DEEP = {
        "load report nested too deep": lambda me: b"\\x97\\xa6loaded\\x91" + NESTED_MAP + b"\\xcb" + bytes(8) + b"\\x90\\x90\\xc0\\x90",
        "load failure nested too deep": lambda me: b"\\x92\\xa6failed" + NESTED_MAP,
        "result nested too deep": lambda me: msgspec.msgpack.encode(["result", me, b'{"content":[{"a":' + NESTED_JSON + b"}]}"]),
        "log nested too deep": lambda me: msgspec.msgpack.encode(["log", me, "info", NESTED_JSON]),
        "ask nested too deep": lambda me: msgspec.msgpack.encode(["ask", me, 1, "elicitation/create", b'{"a":' + NESTED_JSON + b"}"]),
    }

    SPLICE = b'{"content":[]},"id":"ghost"'
    TEXT = b'{"content":[{"type":"text","text":'
    NEWLINE = b'{"content":[]}}\\n{"jsonrpc":"2.0","id":"ghost","result":{"content":[]}}'

    @tool
    def remember(ctx: Context) -> str:  # with a ctx: the runtime keeps the call in its calls
        _last.append(max(_runtime().calls))
        return "noted"

    @tool
    def attack(kind: str, ctx: Context) -> str:
        rt = _runtime()
        me = max(rt.calls)  # the only call in flight is this one
        frames = {
            "splice result": ["result", me, SPLICE],
            "newline result": ["result", me, NEWLINE],
            "result not an object": ["result", me, b'[1,2]'],
            "content not a list": ["result", me, b'{"content":"ghost"}'],
            "content holding no block": ["result", me, b'{"content":[{"type":"text","text":"t"},["ghost"]]}'],
            # One text block as the runtime writes it is relayed as it is; these only look like one.
            "text result, a newline before its string": ["result", me, TEXT + b'\\n"survived"}]}'],
            "text result, more after its string": ["result", me, TEXT + b'"survived","more":1}]}'],
            "text result, not UTF-8": ["result", me, TEXT + b'"\\xff"}]}'],
            "text result, a lone surrogate": ["result", me, TEXT + b'"survived\\\\ud800"}]}'],
            "result for an unknown call": ["result", 10**9, NEWLINE],
            "result for an answered call": ["result", _last[-1] if _last else 1, NEWLINE],
            "call id a string": ["result", str(me), SPLICE],
            "call id a bool": ["result", True, SPLICE],
            "call id a float": ["result", float(me), SPLICE],
            "result not bytes": ["result", me, {"content": [], "id": "ghost"}],
            "extra field": ["result", me, b'{"content":[]}', "ghost"],
            "missing field": ["result", me],
            "log spliced": ["log", me, "info", b'1},"id":"ghost"'],
            "log not UTF-8": ["log", me, "info", b'"\\xff"'],
            "log level unknown": ["log", me, "shout", b'"x"'],
            "log data not bytes": ["log", me, "info", {"id": "ghost"}],
            "progress not a number": ["progress", me, "ghost", None, None],
            "output fd unknown": ["output", 7, b"x", 0],
            "ask spliced": ["ask", me, 1, "elicitation/create", SPLICE],
            "ask not UTF-8": ["ask", me, 1, "elicitation/create", b'{"message":"\\xff"}'],
            "ask not an object": ["ask", me, 1, "sampling/createMessage", b'[1]'],
            "ask a method not relayed": ["ask", me, 1, "roots/list", b"{}"],
            "ask for an unknown call": ["ask", 10**9, 1, "elicitation/create", b"{}"],
            "undeclared arguments, 100,000 named": ["dropped", me, [f"k{i}" for i in range(100_000)]],
            "unknown kind": ["ghost", me, b"{}"],
            "not an array": {"id": "ghost"},
            "a bare number": 42,
            "second load report": ["loaded", [{"name": "ghost", "description": "", "inputSchema": {}}], 1.0],
            "load failure after load": ["failed", {"message": "ghost"}],
            "log over the limit": ["log", me, "info", msgspec.json.encode("x" * (LIMIT + 4096))],
            "progress over the limit": ["progress", me, 1.0, None, "x" * (LIMIT + 4096)],
            "result over the limit": ["result", me, b'{"content":[{"type":"text","text":"' + b"x" * (LIMIT + 4096) + b'"}]}'],
            "frame over the limit": ["output", 2, b"x" * (LIMIT + 200_000), 0],
        }
        if kind in frames:
            _write(rt, _frame(frames[kind]))
        elif kind == "not msgpack":
            _write(rt, struct.pack(">I", 4) + b"\\xc1\\xc1\\xc1\\xc1")
        elif kind == "empty frame":
            _write(rt, struct.pack(">I", 0))
        elif kind in DEEP:
            _write(rt, _raw(DEEP[kind](me)))
        elif kind == "announces 700 MB":
            # what a daemon that believes the header would hold
            _write(rt, struct.pack(">I", 700 << 20) + b"x" * (64 << 20))
        elif kind == "ctx.log 48 MB":
            ctx.log("info", "x" * (48 << 20))
        elif kind == "ctx.progress 48 MB":
            ctx.progress(1, 2, "x" * (48 << 20))
        else:
            raise ValueError(kind)
        time.sleep(0.3)  # a worker the daemon kills for its frame dies here, before it answers
        return "survived"

    @tool
    def echo(text: str) -> str:
        return text
'''.replace("LIMIT", str(LIMIT))

OTHER = '''
    def other() -> str:
        return "unaffected"
'''

# What the client must see for each attack: the tool's own answer, or an error of its own call
# that says what the worker did.
MALFORMED = "failed: its worker process sent a malformed message"
TOO_LARGE = f"more than the {LIMIT:,} bytes a message may carry (max_message_bytes)"
EXPECTED = {
    "splice result": "sent a malformed result",
    "newline result": "sent a malformed result",
    "result not an object": "sent a malformed result",
    "content not a list": "sent a malformed result",
    "content holding no block": "sent a malformed result",
    "text result, a newline before its string": "survived",
    "text result, more after its string": "survived",
    "text result, not UTF-8": "sent a malformed result",
    "text result, a lone surrogate": "survived",  # relayed with U+FFFD for the half character (test_half_characters.py)
    "result for an unknown call": "survived",
    "result for an answered call": "survived",
    "call id a string": MALFORMED,
    "call id a bool": MALFORMED,
    "call id a float": MALFORMED,
    "result not bytes": MALFORMED,
    "extra field": MALFORMED,
    "missing field": MALFORMED,
    "log spliced": "sent a malformed log message",
    "log not UTF-8": "sent a malformed log message",
    "log level unknown": MALFORMED,
    "log data not bytes": MALFORMED,
    "progress not a number": MALFORMED,
    "output fd unknown": MALFORMED,
    "ask spliced": "sent a malformed elicitation/create request",
    "ask not UTF-8": "sent a malformed elicitation/create request",
    "ask not an object": "sent a malformed sampling/createMessage request",
    "ask a method not relayed": MALFORMED,
    "ask for an unknown call": "survived",
    "undeclared arguments, 100,000 named": MALFORMED,
    "unknown kind": MALFORMED,
    "not an array": MALFORMED,
    "a bare number": MALFORMED,
    "not msgpack": MALFORMED,
    "empty frame": MALFORMED,
    "load report nested too deep": "failed: its worker process sent a message nested too deep to read",
    "load failure nested too deep": "failed: its worker process sent a message nested too deep to read",
    "result nested too deep": "sent a malformed result (nested too deep)",
    "log nested too deep": "sent a malformed log message (nested too deep)",
    "ask nested too deep": "sent a malformed elicitation/create request",
    "second load report": "failed: its worker process sent a second load report",
    "load failure after load": "failed: its worker process sent a second load report",
    "log over the limit": "sent a log message of 1,052,674 bytes, " + TOO_LARGE,
    "progress over the limit": "sent a progress message of 1,052,672 bytes, " + TOO_LARGE,
    "result over the limit": "sent a result of 1,052,711 bytes, " + TOO_LARGE,
    "frame over the limit": f"failed: its worker process sent a message of 1,248,591 bytes, {TOO_LARGE}",
    "announces 700 MB": f"failed: its worker process sent a message of 734,003,200 bytes, {TOO_LARGE}",
    "ctx.log 48 MB": "sent a log message of 50,331,650 bytes, " + TOO_LARGE,
    "ctx.progress 48 MB": "sent a progress message of 50,331,648 bytes, " + TOO_LARGE,
}


def _peak_rss(pid: int) -> int:
    """The process's resident high-water mark (what it held at its worst), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return psutil.Process(pid).memory_info().rss


def _call(raw: RawConnection, request_id: str, name: str, arguments: dict, progress: bool = False) -> tuple[dict, list[dict]]:  # type: ignore[type-arg]
    """Call a tool; return its response and the notifications that came before it. Every line the
    daemon sends must be JSON, and every response must be this call's."""
    params: dict = {"name": name, "arguments": arguments}  # type: ignore[type-arg]
    if progress:
        params["_meta"] = {"progressToken": request_id}
    raw.send({"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params})
    notes = []
    while True:
        line = raw.file.readline()
        assert line, "the daemon closed the connection"
        assert line.endswith(b"\n") and line.count(b"\n") == 1
        message = json.loads(line)  # raises on anything that is not one JSON value
        assert message.get("jsonrpc") == "2.0", message
        if "method" in message:
            assert "id" not in message, f"a request from the daemon: {message}"
            assert message["method"] in ("notifications/message", "notifications/progress", "notifications/tools/list_changed"), message
            if message["method"] == "notifications/progress":
                assert message["params"]["progressToken"] == request_id, message
            notes.append(message)
            continue
        assert message.get("id") == request_id, f"an answer that is not this call's: {str(message)[:300]}"
        assert set(message) == {"jsonrpc", "id", "result"}, str(message)[:300]
        return message, notes


def _text(response: dict) -> str:  # type: ignore[type-arg]
    result = response["result"]
    assert isinstance(result["content"], list)
    return "".join(block.get("text", "") for block in result["content"])


def test_forged_oversized_and_malformed_frames_reach_no_client(env: Env, make_daemon, record) -> None:  # type: ignore[no-untyped-def]
    env.write_tool(env.global_tools, "hostile.py", HOSTILE)
    env.write_tool(env.global_tools, "other.py", OTHER)
    daemon: Daemon = make_daemon({"ATOMICTOOLS_MAX_MESSAGE_BYTES": str(LIMIT)})
    outcomes: dict[str, str] = {}
    with daemon.raw() as raw, daemon.raw() as bystander:
        raw.request("atomic/attach", {"directory": str(env.project)})
        # A client that may be asked: a forged question must still never reach it.
        raw.request("initialize", {"protocolVersion": "2025-11-25", "capabilities": {"elicitation": {}, "sampling": {}},
                                   "clientInfo": {"name": "raw"}})
        raw.request("logging/setLevel", {"level": "debug"})
        bystander.request("atomic/attach", {"directory": str(env.project)})
        response, _ = _call(raw, "warm", "hostile_echo", {"text": "hi"})
        assert _text(response) == "hi"
        _call(bystander, "warm", "other", {})
        baseline = _peak_rss(daemon.pid)
        for n, kind in enumerate(EXPECTED):
            remembered, _ = _call(raw, f"r{n}", "hostile_remember", {})
            assert _text(remembered) == "noted", remembered  # the next attack may forge its id
            response, notes = _call(raw, f"a{n}", "hostile_attack", {"kind": kind}, progress="progress" in kind)
            text = _text(response)
            outcomes[kind] = text
            assert EXPECTED[kind] in text, f"{kind}: {text[:300]}"
            assert response["result"].get("isError", False) == (EXPECTED[kind] != "survived"), (kind, text[:300])
            assert not notes, f"{kind}: a tool's message reached the client: {str(notes)[:300]}"
            # The connection, the module (a new worker where its channel was not to be trusted)
            # and other modules serve on.
            assert _text(_call(raw, f"e{n}", "hostile_echo", {"text": kind})[0]) == kind
            assert _text(_call(bystander, f"b{n}", "other", {})[0]) == "unaffected"
        grown = _peak_rss(daemon.pid) - baseline
        # Nothing came to the bystander but its own answers (checked line by line in _call); and
        # nothing else is waiting for it.
        bystander.sock.settimeout(0.2)
        with pytest.raises(TimeoutError):
            bystander.file.readline()
    assert grown < 48 << 20, f"the daemon's peak RSS grew by {grown / 2**20:.0f} MiB"
    killed = sum(1 for text in outcomes.values() if "its worker process sent" in text)
    record(
        f"{len(EXPECTED)} hostile frames (forged, spliced, mistyped, out of turn, oversized, a 700 MB header, "
        f"48 MB ctx.log/progress): each client saw only its own call's well-formed answer; {killed} workers "
        f"replaced; daemon peak RSS +{grown / 2**20:.1f} MiB"
    )


STOPPER = '''
    import os, signal

    def stopper() -> str:
        os.kill(os.getppid(), signal.SIGSTOP)
        return str(os.getppid())
'''


def _stopped(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_STOPPED
    except psutil.NoSuchProcess:
        return False


def test_a_stopped_fork_server_is_replaced(env: Env, make_daemon, record) -> None:  # type: ignore[no-untyped-def]
    """A tool stops its parent, the fork server: spawns, attaches and reloads still answer, and
    status says what happened."""
    env.write_tool(env.global_tools, "stopper.py", STOPPER)
    make_daemon()
    stopped: list[int] = []
    try:
        with RawConnection(env.socket, timeout=30) as raw:
            raw.request("atomic/attach", {"directory": str(env.project)})
            response, _ = _call(raw, "stop", "stopper", {})
            fork_pid = int(_text(response))
            stopped.append(fork_pid)
            # The daemon reads the fork server's state from /proc as status asks; the SIGSTOP may
            # land a moment after the tool answered.
            status = wait_for(lambda: (s := raw.request("atomic/status")["result"]["forkserver"]).get("problem") and s,
                              timeout=5, message="status to show the stopped fork server")
            assert "stopped" in status["problem"] and str(fork_pid) in status["problem"], status

            bound = 15.0  # seconds; the fork server is checked every second
            started = time.monotonic()
            env.write_tool(env.global_tools, "fresh.py", "def fresh() -> str:\n    return 'fresh'\n")
            wait_for(lambda: any(t["name"] == "fresh" for t in raw.request("tools/list")["result"]["tools"]),
                     timeout=bound, message="the new module to be listed")
            assert _text(_call(raw, "fresh", "fresh", {})[0]) == "fresh"
            fresh_s = time.monotonic() - started

            project = env.root / "other-project"
            env.write_tool(project / ".atomic" / "tools", "local.py", "def local() -> str:\n    return 'local'\n")
            started = time.monotonic()
            with RawConnection(env.socket, timeout=bound) as other:
                attached = other.request("atomic/attach", {"directory": str(project)})
                assert "result" in attached, attached
                assert _text(_call(other, "local", "local", {})[0]) == "local"
            attach_s = time.monotonic() - started

            started = time.monotonic()
            reloaded = raw.request("atomic/reload")
            assert reloaded["result"]["success"] is True, reloaded
            reload_s = time.monotonic() - started

            status = raw.request("atomic/status")["result"]["forkserver"]
            assert status["pid"] not in (None, fork_pid), status
            assert status["state"] == "running" and status["replaced"] >= 1, status
            assert status["problem"] == f"the fork server (pid {fork_pid}) was stopped (SIGSTOP, or a debugger); it was replaced"
            assert not psutil.pid_exists(fork_pid) or psutil.Process(fork_pid).status() == psutil.STATUS_ZOMBIE
    finally:
        for pid in stopped:
            if _stopped(pid):
                os.kill(pid, signal.SIGCONT)  # the daemon's stop ends it
    record(
        f"fork server SIGSTOPped by a tool: replaced; a new module answered its first call in {fresh_s:.1f} s, "
        f"a new project's attach and call in {attach_s:.1f} s, reload in {reload_s:.1f} s; status named the stop"
    )


NAP = '''
    import time
    from atomictools import tool

    @tool(timeout=2)
    def nap() -> str:
        time.sleep(1)
        return "finished in time"
'''


def test_a_result_waiting_when_the_daemon_wakes_beats_its_timeout(env: Env, make_daemon, record) -> None:  # type: ignore[no-untyped-def]
    env.write_tool(env.global_tools, "nap.py", NAP)
    daemon: Daemon = make_daemon()
    outcomes = []
    for _ in range(2):
        try:
            with daemon.raw() as raw:
                raw.request("atomic/attach", {"directory": str(env.project)})
                raw.send({"jsonrpc": "2.0", "id": "nap", "method": "tools/call", "params": {"name": "nap", "arguments": {}}})
                with daemon.raw() as watcher:
                    wait_for(lambda: any(m["inflight"] for m in watcher.request("atomic/status")["result"]["modules"]),
                             message="the call to start")
                os.kill(daemon.pid, signal.SIGSTOP)
                time.sleep(3)  # the call finishes after 1 s; its deadline passes at 2 s
                os.kill(daemon.pid, signal.SIGCONT)
                response = raw.recv()
                assert response["id"] == "nap"
                outcomes.append(_text(response))
        finally:
            os.kill(daemon.pid, signal.SIGCONT)
    assert outcomes == ["finished in time"] * 2, outcomes
    record("daemon SIGSTOPped past 2 calls' deadlines while they finished: after SIGCONT each answered with its result")


SLOW_IMPORT = '''
    import time
    from pathlib import Path

    Path({mark!r}).write_text("importing")
    time.sleep(1)

    def slow_import() -> str:
        return "loaded in time"
'''


def test_a_load_report_waiting_when_the_daemon_wakes_beats_the_load_timeout(env: Env, make_daemon, record) -> None:  # type: ignore[no-untyped-def]
    mark = env.root / "importing"
    env.write_tool(env.global_tools, "slow_import.py", SLOW_IMPORT.format(mark=str(mark)))
    daemon: Daemon = make_daemon({"ATOMICTOOLS_LOAD_TIMEOUT": "2"})
    try:
        with RawConnection(env.socket, timeout=30) as raw:
            raw.send({"jsonrpc": "2.0", "id": "list", "method": "tools/list"})  # starts the load if nothing has
            wait_for(mark.exists, message="the module's import to start")
            os.kill(daemon.pid, signal.SIGSTOP)
            time.sleep(3)  # the import ends after 1 s; the load timeout passes at 2 s
            os.kill(daemon.pid, signal.SIGCONT)
            wait_for(lambda: any(t["name"] == "slow_import" for t in raw.request("tools/list")["result"]["tools"]),
                     timeout=5, message="the module to be listed")
            assert _text(_call(raw, "call", "slow_import", {})[0]) == "loaded in time"
            module = next(m for m in raw.request("atomic/status")["result"]["modules"] if m["path"].endswith("slow_import.py"))
            assert not module.get("error") and "longer" not in str(module.get("lastError")), module
    finally:
        os.kill(daemon.pid, signal.SIGCONT)
    record("daemon SIGSTOPped past a module's load timeout while it finished importing: after SIGCONT the module loaded")


def _cli(env: Env, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    if args[:1] == ("trust",):
        args = (*args, "--yes")  # no terminal here: trust asks for one otherwise
    return subprocess.run([sys.executable, "-m", "atomictoolsd", *args], env=env.vars, cwd=env.project,
                          capture_output=True, text=True, timeout=timeout)


def _stop_in_time(env: Env, daemon: Daemon, grace: float) -> float:
    """``atomictoolsd stop``: it must finish within the daemon's shutdown grace and a few seconds; how long it took."""
    started = time.monotonic()
    try:
        stopped = _cli(env, "stop", timeout=grace + 15)
    except subprocess.TimeoutExpired:
        pytest.fail(f"atomictoolsd stop did not finish within {grace + 15:g} s:\n{daemon.stderr()[-3000:]}")
    took = time.monotonic() - started
    assert stopped.returncode == 0, stopped.stderr
    assert daemon.proc is not None and daemon.proc.wait(5) == 0
    return took


# A module that forges, while it imports, a load report nested far deeper than a decoder recurses,
# then stays in its import: it never reads its channel, so only a kill ends it. Its tool, had it
# loaded, would start a process in its group.
DEEP_AT_IMPORT = '''
    import gc, os, struct, subprocess, time
    from pathlib import Path

    child = subprocess.Popen(["sleep", "300"])  # in the worker's process group
    Path({mark!r}).write_text(f"{{os.getpid()}} {{child.pid}}")
    sender = next(o for o in gc.get_objects() if type(o).__name__ == "Sender")
    body = b"\\x97\\xa6loaded\\x91" + b"\\x81\\xa1a" * 100_000 + b"\\xc0\\xcb" + bytes(8) + b"\\x90\\x90\\xc0\\x90"
    sender.send(struct.pack(">I", len(body)) + body)
    time.sleep(3600)

    def deep() -> str:
        return "never"
'''


def test_a_frame_too_deep_to_read_ends_its_worker_and_stop_finishes(env: Env, make_daemon, record) -> None:  # type: ignore[no-untyped-def]
    """A load report nested too deep to decode: the worker is killed with its process group, the
    module fails saying what it sent, untrust leaves nothing running, and stop finishes in time."""
    env.set_trust_all(False)
    assert _cli(env, "trust", str(env.project)).returncode == 0
    mark = env.root / "deep.pids"
    env.write_tool(env.local_tools, "deep.py", DEEP_AT_IMPORT.format(mark=str(mark)))
    grace = 3.0
    env.write_config(shutdown_grace=grace)
    daemon: Daemon = make_daemon()
    with RawConnection(env.socket, timeout=30) as raw:
        raw.request("atomic/attach", {"directory": str(env.project)})
        wait_for(mark.exists, message="the module to start importing")
        worker, child = (int(pid) for pid in mark.read_text().split())

        def failed() -> dict | None:  # type: ignore[type-arg]
            errors = raw.result("atomic/list", {"directory": str(env.project)}).get("errors") or []
            return next((e for e in errors if e["file"].endswith("deep.py")), None)

        error = wait_for(failed, timeout=10, message="the module to fail")
        assert "sent a message nested too deep to read" in error["message"], error
        # Killed with its group, at once: not left running once its channel could not be read.
        wait_for(lambda: not psutil.pid_exists(worker) and not psutil.pid_exists(child), timeout=5,
                 message="the worker and the process in its group to be gone")
        assert _cli(env, "untrust", str(env.project)).returncode == 0
        assert "result" in raw.request("ping")
    took = _stop_in_time(env, daemon, grace)
    record(f"a load report nested 100,000 deep: its worker and its group killed, the module failed naming it; "
           f"stop took {took:.1f} s (shutdown_grace {grace:g} s)")


SLOW_FOREVER = '''
    import os, time
    from pathlib import Path

    Path({mark!r}).write_text(str(os.getpid()))
    time.sleep(3600)

    def slow_forever() -> str:
        return "never"
'''


def test_stop_finishes_after_a_loading_worker_died_with_its_fork_server(env: Env, make_daemon, record) -> None:  # type: ignore[no-untyped-def]
    """A module that takes long to import is loading while its fork server is stopped and replaced:
    the worker dies with it, and stop still finishes within its grace."""
    mark = env.root / "slow.pid"
    env.write_tool(env.global_tools, "slow_forever.py", SLOW_FOREVER.format(mark=str(mark)))
    grace = 3.0
    env.write_config(shutdown_grace=grace)
    daemon: Daemon = make_daemon()
    stopped: list[int] = []
    try:
        with RawConnection(env.socket, timeout=30) as raw:
            raw.send({"jsonrpc": "2.0", "id": "list", "method": "tools/list"})  # starts the load
            wait_for(mark.exists, message="the module's import to start")
            fork_server = psutil.Process(int(mark.read_text())).ppid()
            os.kill(fork_server, signal.SIGSTOP)
            stopped.append(fork_server)
            wait_for(lambda: raw.result("atomic/status")["forkserver"]["replaced"] >= 1, timeout=15,
                     message="the stopped fork server to be replaced")
        took = _stop_in_time(env, daemon, grace)
    finally:
        for pid in stopped:
            if _stopped(pid):
                os.kill(pid, signal.SIGCONT)
    record(f"a module importing while its fork server was stopped and replaced: stop took {took:.1f} s "
           f"(shutdown_grace {grace:g} s)")


# A tool whose child stops the worker (SIGSTOP: it reads nothing more) and writes frames on the
# worker's channel as fast as the daemon reads them: questions to the client (``ctx.elicit``'s
# frame), each with a question id of its own, or output past the runtime's own rate limit.
FLOODER = '''
    import gc, os, signal, struct, time
    import msgspec
    from pathlib import Path
    from atomictools import Context, tool

    def _frame(message):
        body = msgspec.msgpack.encode(message)
        return struct.pack(">I", len(body)) + body

    @tool(timeout=30)
    def flood(kind: str, ctx: Context) -> str:
        rt = next(o for o in gc.get_objects() if type(o).__name__ == "Runtime" and hasattr(o, "sock"))
        me = max(rt.calls)
        fd = rt.sock.fileno()
        child = os.fork()
        if child == 0:
            try:
                Path({mark!r}).write_text(f"{{os.getppid()}} {{os.getpid()}}")
                if kind == "ask":
                    os.kill(os.getppid(), signal.SIGSTOP)
                text = "x" * 1000
                deadline = time.monotonic() + (20 if kind == "ask" else 3)
                n = 0
                while time.monotonic() < deadline:
                    n += 1
                    if kind == "ask":
                        frame = _frame(["ask", me, n, "elicitation/create", msgspec.json.encode({{"message": text, "requestedSchema": {{"type": "object", "properties": {{}}}}}})])
                    elif kind == "dropped":  # the runtime sends one, before its result, naming the client's keys
                        frame = _frame(["dropped", me, [f"k{{n}}-{{i}}" * 100 for i in range(64)]])
                    else:
                        frame = _frame(["output", 2, b"y" * 8192, 0])
                    os.write(fd, frame)
            finally:
                os._exit(0)
        if kind == "ask":
            time.sleep(25)
        else:
            os.waitpid(child, 0)
        return "survived"

    @tool
    def echo(text: str) -> str:
        return text
'''


def _flood(env: Env, daemon: Daemon, raw: RawConnection, kind: str, mark: Path) -> tuple[dict, float, list[int]]:  # type: ignore[type-arg]
    """Start a flood; return the call's answer, the daemon's growth in peak RSS (MiB), and the
    pids of the worker and its child."""
    mark.unlink(missing_ok=True)
    baseline = _peak_rss(daemon.pid)
    raw.send({"jsonrpc": "2.0", "id": f"flood-{kind}", "method": "tools/call",
              "params": {"name": "flooder_flood", "arguments": {"kind": kind}}})
    pids = wait_for(lambda: mark.exists() and len(found := mark.read_text().split()) == 2 and [int(pid) for pid in found],
                    message="the flood to start")
    deadline = time.monotonic() + 15  # the call's timeout is 30 s: it must fail long before
    try:
        while True:
            raw.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                message = raw.recv()
            except TimeoutError:
                grown = (_peak_rss(daemon.pid) - baseline) / 2**20
                pytest.fail(f"{kind} flood: no answer after 15 s; the daemon's peak RSS grew by {grown:.0f} MiB")
            if message.get("id") == f"flood-{kind}":
                break  # questions the client is sent meanwhile are left unanswered
    finally:
        try:
            os.kill(pids[1], signal.SIGKILL)  # a test that failed leaves nothing (the daemon kills it with its worker)
        except ProcessLookupError:
            pass
    return message, (_peak_rss(daemon.pid) - baseline) / 2**20, pids


def test_a_stopped_worker_flooding_questions_is_recycled_and_the_daemon_does_not_grow(env: Env, make_daemon, record) -> None:  # type: ignore[no-untyped-def]
    mark = env.root / "flood.pids"
    env.write_tool(env.global_tools, "flooder.py", FLOODER.format(mark=str(mark)))
    daemon: Daemon = make_daemon()
    outcomes = {}
    with RawConnection(env.socket, timeout=60) as raw, RawConnection(env.socket, timeout=60) as asked:
        raw.request("atomic/attach", {"directory": str(env.project)})
        # A client that may be asked (and never answers), and one that may not: the questions go
        # to the client, or are answered at once to a worker that reads nothing.
        asked.request("initialize", {"protocolVersion": "2025-11-25", "capabilities": {"elicitation": {}},
                                     "clientInfo": {"name": "asked"}})
        asked.request("atomic/attach", {"directory": str(env.project)})
        for name, connection in (("a client that may be asked", asked), ("a client that may not", raw)):
            response, grown, pids = _flood(env, daemon, connection, "ask", mark)
            text = _text(response)
            outcomes[name] = (text, grown)
            assert response["result"].get("isError") and "its worker process" in text, text
            assert grown < 32, f"{name}: the daemon's peak RSS grew by {grown:.0f} MiB"
            wait_for(lambda pids=pids: not any(psutil.pid_exists(pid) for pid in pids), timeout=5, message="the worker to be gone")
            assert _text(_call(connection, f"echo-{name}", "flooder_echo", {"text": "again"})[0]) == "again"
    record("a stopped worker's child flooding questions: " + "; ".join(
        f"{name}: the call failed ({text.split(': ', 1)[-1][:80]}), the daemon grew {grown:.1f} MiB"
        for name, (text, grown) in outcomes.items()))


def _flooded(env: Env, make_daemon, kind: str) -> tuple[list[dict[str, Any]], float]:  # type: ignore[no-untyped-def]
    """Run the flooder's ``kind`` flood for 3 s, then an echo: the event log through the echo's end,
    and how much the daemon's peak RSS grew (MiB)."""
    mark = env.root / "flood.pids"
    env.write_tool(env.global_tools, "flooder.py", FLOODER.format(mark=str(mark)))
    daemon: Daemon = make_daemon()
    with RawConnection(env.socket, timeout=60) as raw:
        raw.request("atomic/attach", {"directory": str(env.project)})
        log_file = Path(raw.result("atomic/status")["log"]["file"])
        response, grown, _ = _flood(env, daemon, raw, kind, mark)
        assert _text(response) == "survived", response
        assert _text(_call(raw, "echo", "flooder_echo", {"text": "flushed"})[0]) == "flushed"

    def logged_through_the_echo() -> list[dict[str, Any]]:
        """The log once it has the echo's end: what was logged before that call ended is in it."""
        events = [json.loads(line) for line in log_file.read_text().splitlines()]
        ended = any(e.get("event") == "tool.complete" and e.get("tool") == "flooder_echo" for e in events)
        return events if ended else []

    events = wait_for(logged_through_the_echo, message="the echo's end in the event log")
    assert any(e.get("event") == "daemon.start" for e in events), f"the {kind} flood rotated the log away"
    return events, grown


def test_output_written_past_the_runtime_is_still_rate_limited(env: Env, make_daemon, record) -> None:  # type: ignore[no-untyped-def]
    """A child writes output frames on its worker's channel for 3 s, past the runtime's own rate
    limit: the daemon logs what the runtime would have sent, and counts the rest."""
    events, grown = _flooded(env, make_daemon, "output")
    output = [e for e in events if e.get("event") == "tool.output" and e.get("module", "").endswith("flooder.py")]
    logged = sum(len(e["message"]) for e in output)
    dropped = sum(e.get("dropped", 0) for e in output)
    # 3 s at the runtime's rate after twice its burst (frames it sent in time may arrive together).
    assert logged <= 2 * BURST_BYTES + 4 * RATE_BYTES, f"{logged:,} bytes of output logged"
    assert dropped > 10 * logged, (logged, dropped)
    assert grown < 32, f"the daemon's peak RSS grew by {grown:.0f} MiB"
    record(f"a child writing output frames past the runtime's rate limit for 3 s: {logged:,} bytes logged, "
           f"{dropped:,} counted as dropped; the daemon grew {grown:.1f} MiB")


def test_undeclared_arguments_reported_past_the_runtime_are_logged_once(env: Env, make_daemon, record) -> None:  # type: ignore[no-untyped-def]
    """A child writes, for 3 s, reports of undeclared arguments the call ran without (the frame the
    runtime sends once, before its result): the daemon logs one, bounded, and the log keeps its start."""
    env.write_config(log_max_bytes=4 * 1024 * 1024)
    events, grown = _flooded(env, make_daemon, "dropped")
    reports = [e for e in events if e.get("event") == "tool.arguments_dropped"]
    assert len(reports) <= 1, f"{len(reports)} reports of dropped arguments logged for one call"
    assert all(len(json.dumps(e["dropped"])) <= 8192 for e in reports), "a report logged unbounded"
    assert grown < 32, f"the daemon's peak RSS grew by {grown:.0f} MiB"
    record(f"a child writing reports of undeclared arguments for 3 s: {len(reports)} logged for the call, the log "
           f"kept its start; the daemon grew {grown:.1f} MiB")


# A tool that sends, for its own call, a result whose blocks are of the right shape for the frame
# but hold values of the wrong type where a client of an older revision needs them read (an audio
# block becomes a text describing it; a resource link's title is taken as text).
ODD_BLOCKS = '''
    import gc, struct
    import msgspec
    from atomictools import Context, tool

    @tool
    def odd(block: str, ctx: Context) -> str:
        rt = next(o for o in gc.get_objects() if type(o).__name__ == "Runtime" and hasattr(o, "sock"))
        body = msgspec.msgpack.encode(["result", max(rt.calls), ('{"content":[' + block + ']}').encode()])
        rt._sender.send(struct.pack(">I", len(body)) + body)
        return "after"

    @tool
    def echo(text: str) -> str:
        return text
'''
ODD = ['{"type":"audio","data":5,"mimeType":"audio/wav"}', '{"type":"audio","data":null}',
       '{"type":"resource_link","uri":"file:///x","name":"n","title":["a"],"description":{"b":1}}',
       '{"type":"resource_link","uri":"file:///x","name":"n","mimeType":"text/plain","size":[1]}']


def test_a_result_of_odd_blocks_for_an_older_client_is_answered(env: Env, make_daemon, record) -> None:  # type: ignore[no-untyped-def]
    env.write_tool(env.global_tools, "odd.py", ODD_BLOCKS)
    make_daemon()
    answers = []
    with RawConnection(env.socket, timeout=15) as raw:
        # A client of the first revision: no audio and no resource links, so the daemon rewrites them.
        raw.request("initialize", {"protocolVersion": "2024-11-05", "capabilities": {}, "clientInfo": {"name": "old"}})
        for index, block in enumerate(ODD):
            response, _ = _call(raw, f"odd-{index}", "odd", {"block": block})
            assert "result" in response, response
            answers.append(_text(response))
            assert _text(_call(raw, f"echo-{index}", "odd_echo", {"text": "again"})[0]) == "again"
    record(f"{len(ODD)} results whose audio and resource-link blocks hold values of the wrong type, to a client of "
           f"2024-11-05: each answered ({answers[0][:60]!r}), the module served on")


# A tool whose result and log message hold two million elements each (a big structured result is
# ordinary; the log message is the tool's own value, as ctx.log takes any JSON).
MILLION = '''
    from atomictools import Context, tool

    @tool
    def million(ctx: Context) -> dict:
        ctx.log("info", {"items": [[] for _ in range(2_000_000)]})
        return {"items": [[] for _ in range(2_000_000)]}
'''


def test_a_result_and_a_log_message_of_millions_of_elements_stall_no_one(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    """The daemon checks what it relays of a worker as JSON without building it: decoded whole and
    encoded again, a result or a log message of two million elements held its event loop about a second."""
    env.write_tool(env.global_tools, "million.py", MILLION)
    make_daemon()
    with pinging(env.socket) as pings, RawConnection(env.socket, timeout=60) as raw:
        raw.request("logging/setLevel", {"level": "info"})
        for n in range(3):
            response, notes = _call(raw, f"m{n}", "million", {})
            result = response["result"]
            assert not result.get("isError") and len(result["structuredContent"]["items"]) == 2_000_000, str(result)[:300]
            [log] = [note for note in notes if note["method"] == "notifications/message"]
            assert len(log["params"]["data"]["items"]) == 2_000_000
    waited = sum(max(0.0, took - 0.1) for took in pings)
    # What a loaded machine's scheduling adds (one ping late by a second) stays below.
    assert waited < 1.0, f"pings waited {waited:.2f} s in all (the slowest {max(pings):.2f} s) while three such calls came"
