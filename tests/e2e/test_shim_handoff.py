"""The shim hands its stdin and stdout to the daemon, which then reads and answers the agent there
itself; where it cannot (a file, ``--relay``, a refusal) the shim relays. And what a client that is
no shim can make of ``atomic/handoff``."""

from __future__ import annotations

import array
import json
import os
import resource
import select
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from helpers import Daemon, Env, RawConnection, wait_for
from shim_helpers import SHIM

ECHO = '''
from atomictools import tool


@tool
def echo(text: str) -> str:
    """Echo the text back."""
    return text
'''

INITIALIZE = {
    "jsonrpc": "2.0", "id": 1, "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}},
}


def call(request_id: int, text: str) -> bytes:
    message = {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": {"name": "echo", "arguments": {"text": text}}}
    return json.dumps(message).encode() + b"\n"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    env = Env(tmp_path_factory.mktemp("handoff"))
    env.write_tool(env.global_tools, "echo.py", ECHO)
    daemon = Daemon(env).start()
    yield daemon
    daemon.stop()
    env.cleanup()


_started: list[subprocess.Popen[bytes]] = []


@pytest.fixture(autouse=True)
def _no_shim_left() -> Iterator[None]:
    """Every shim a test started is gone after it, whatever the test did (a stopped one included)."""
    yield
    while _started:
        shim = _started.pop()
        if shim.poll() is None:
            shim.send_signal(signal.SIGCONT)
            shim.kill()
            shim.wait()
        for stream in (shim.stdin, shim.stdout, shim.stderr):
            if stream is not None:
                stream.close()


def spawn_shim(env: Env, *args: str) -> subprocess.Popen[bytes]:
    shim = subprocess.Popen(
        [SHIM, "mcp", *args], env=env.vars, cwd=env.project,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        bufsize=0,  # nothing read ahead of what select sees (read_line)
    )
    _started.append(shim)
    return shim


def read_line(shim: subprocess.Popen[bytes], timeout: float = 10.0) -> dict:  # type: ignore[type-arg]
    """The next line the agent reads from the shim's stdout, within ``timeout``."""
    assert shim.stdout is not None
    ready, _, _ = select.select([shim.stdout], [], [], timeout)
    assert ready, f"no line on the shim's stdout within {timeout} s"
    return json.loads(shim.stdout.readline())


def pipe_inode(fd: int) -> int:
    return os.fstat(fd).st_ino


def holds_pipe(pid: int, inode: int) -> bool:
    """Whether process ``pid`` holds a descriptor of the pipe ``inode``."""
    try:
        return any(os.readlink(f"/proc/{pid}/fd/{fd}") == f"pipe:[{inode}]" for fd in os.listdir(f"/proc/{pid}/fd"))
    except FileNotFoundError:
        return False


def handed_over(daemon: Daemon, shim: subprocess.Popen[bytes]) -> bool:
    """Whether the daemon holds the pipe the agent writes the shim's stdin through."""
    assert shim.stdin is not None
    return holds_pipe(daemon.pid, pipe_inode(shim.stdin.fileno()))


def initialized(shim: subprocess.Popen[bytes]) -> None:
    assert shim.stdin is not None
    shim.stdin.write(json.dumps(INITIALIZE).encode() + b"\n")
    shim.stdin.flush()
    assert read_line(shim)["id"] == 1


def closed(shim: subprocess.Popen[bytes]) -> int:
    assert shim.stdin is not None
    shim.stdin.close()
    code = shim.wait(timeout=10)
    for stream in (shim.stdout, shim.stderr):
        if stream is not None:
            stream.close()
    return code


# -- the shim --------------------------------------------------------------------------------------


def test_calls_skip_a_shim_that_handed_its_stdio_over(daemon: Daemon) -> None:
    """Stopped (SIGSTOP) once it handed over, the shim is in no call's way: the daemon reads the
    agent's stdin and answers on its stdout. The workers hold none of those descriptors."""
    shim = spawn_shim(daemon.env)
    initialized(shim)
    assert shim.stdin is not None
    assert handed_over(daemon, shim)
    shim.send_signal(signal.SIGSTOP)
    for i in range(2, 5):
        shim.stdin.write(call(i, f"text {i}"))
        shim.stdin.flush()
        answer = read_line(shim)
        assert answer["id"] == i and answer["result"]["content"][0]["text"] == f"text {i}"
    inode = pipe_inode(shim.stdin.fileno())
    assert daemon.descendants() and not any(holds_pipe(p.pid, inode) for p in daemon.descendants())
    shim.send_signal(signal.SIGCONT)
    assert closed(shim) == 0
    wait_for(lambda: not holds_pipe(daemon.pid, inode), message="the daemon to let go of the agent's stdin")


def test_an_agent_asking_for_a_handoff_itself_is_refused_and_served_on(daemon: Daemon) -> None:
    shim = spawn_shim(daemon.env)
    initialized(shim)
    assert shim.stdin is not None
    shim.stdin.write(b'{"jsonrpc":"2.0","id":7,"method":"atomic/handoff"}\n')
    shim.stdin.flush()
    refusal = read_line(shim)
    assert refusal["id"] == 7 and "handed its descriptors over already" in refusal["error"]["message"]
    shim.stdin.write(call(8, "still here"))
    shim.stdin.flush()
    assert read_line(shim)["result"]["content"][0]["text"] == "still here"
    assert closed(shim) == 0


def test_a_file_for_stdin_and_stdout_is_relayed(daemon: Daemon, tmp_path: Path) -> None:
    """A file is no pipe: the daemon could not wait on it, so the shim copies the messages."""
    requests = tmp_path / "requests.jsonl"
    requests.write_bytes(json.dumps(INITIALIZE).encode() + b"\n" + call(2, "from a file"))
    answers = tmp_path / "answers.jsonl"
    with open(requests, "rb") as stdin, open(answers, "wb") as stdout:
        done = subprocess.run([SHIM, "mcp"], env=daemon.env.vars, cwd=daemon.env.project, stdin=stdin, stdout=stdout,
                              stderr=subprocess.PIPE, timeout=30)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in answers.read_bytes().splitlines()]
    assert [line["id"] for line in lines] == [1, 2]
    assert lines[1]["result"]["content"][0]["text"] == "from a file"


def test_relay_keeps_the_shim_in_between(daemon: Daemon) -> None:
    shim = spawn_shim(daemon.env, "--relay")
    initialized(shim)
    assert shim.stdin is not None
    assert not handed_over(daemon, shim)
    shim.stdin.write(call(2, "relayed"))
    shim.stdin.flush()
    assert read_line(shim)["result"]["content"][0]["text"] == "relayed"
    assert closed(shim) == 0


def test_max_connections_counts_a_handed_over_session_once(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    env.write_tool(env.global_tools, "echo.py", ECHO)
    daemon = make_daemon({"ATOMICTOOLS_MAX_CONNECTIONS": "2"})
    shims = [spawn_shim(env), spawn_shim(env)]
    for shim in shims:
        initialized(shim)
        assert handed_over(daemon, shim)
    assert all(closed(shim) == 0 for shim in shims)


def answers_left_unread(daemon: Daemon, shim: subprocess.Popen[bytes]) -> list[str]:
    """Calls whose answers a pipe cannot hold (64 kB; the requests it does, read whole with the
    stdin's end), then the stdin's end: once the session ended its reading, the daemon is still
    writing them (the test reads none). The texts the answers carry, in order."""
    assert shim.stdin is not None
    inode = pipe_inode(shim.stdin.fileno())
    texts = [str(i) * 30_000 for i in (2, 3, 4)]
    for i, text in enumerate(texts, start=2):
        shim.stdin.write(call(i, text))
    shim.stdin.close()
    wait_for(lambda: not holds_pipe(daemon.pid, inode), message="the session to end its reading")
    return texts


def test_a_shim_whose_agent_reads_slowly_waits_for_every_answer_to_be_written(
    env: Env, make_daemon,  # type: ignore[no-untyped-def]
) -> None:
    """The agent closed its stdin with answers larger than the pipe still unread: the session holds
    on (counted: a second connection is refused) and the shim runs until the last byte is written,
    then exits 0. An agent that stops reading when its server exits has every answer."""
    env.write_tool(env.global_tools, "echo.py", ECHO)
    daemon = make_daemon({"ATOMICTOOLS_MAX_CONNECTIONS": "1"})
    shim = spawn_shim(env)
    initialized(shim)
    assert shim.stdout is not None
    texts = answers_left_unread(daemon, shim)
    assert shim.poll() is None, "the shim exited with answers still unwritten"
    with RawConnection(env.socket) as raw:
        assert "Too many connections" in raw.recv()["error"]["message"]
    answers = [json.loads(line) for line in shim.stdout.read().splitlines()]  # to the end: all written
    assert [a["result"]["content"][0]["text"] for a in answers] == texts
    assert shim.wait(timeout=10) == 0


def test_a_session_that_ended_says_nothing_more_while_its_answers_are_written(
    env: Env, make_daemon,  # type: ignore[no-untyped-def]
) -> None:
    """Its stdin ended and every call answered, the session is over: a tool added while its answers
    are still being written sends it no ``list_changed``."""
    env.write_tool(env.global_tools, "echo.py", ECHO)
    daemon = make_daemon()
    shim = spawn_shim(env)
    initialized(shim)
    assert shim.stdin is not None
    shim.stdin.write(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
    answers_left_unread(daemon, shim)
    env.write_tool(env.global_tools, "added_late.py", ECHO.replace("def echo", "def added_late"))
    with daemon.raw() as probe:
        wait_for(lambda: "added_late" in {t["name"] for t in probe.result("tools/list")["tools"]},
                 message="the daemon to load the added tool")
    assert shim.stdout is not None
    lines = [json.loads(line) for line in shim.stdout.read().splitlines()]
    assert [line.get("id") for line in lines] == [2, 3, 4], [line.get("method") for line in lines]
    assert shim.wait(timeout=10) == 0


def test_an_agent_that_stops_reading_midway_ends_the_shim_with_0(daemon: Daemon) -> None:
    """The agent closed its stdin, then its end of the stdout with answers still being written: the
    agent's doing, as a closed stdout always is, not a daemon that stopped."""
    shim = spawn_shim(daemon.env)
    initialized(shim)
    answers_left_unread(daemon, shim)
    assert shim.stdout is not None
    shim.stdout.read(1000)
    shim.stdout.close()
    assert shim.wait(timeout=10) == 0
    assert shim.stderr is not None and b"daemon" not in shim.stderr.read()


def test_a_shim_killed_while_its_answers_are_written_leaves_nothing_held(daemon: Daemon) -> None:
    """The shim's end is the session's, however far its answers got: the daemon lets go of the
    agent's stdout and what it held for it, with the session that counted them."""
    shim = spawn_shim(daemon.env)
    initialized(shim)
    assert shim.stdout is not None
    inode = pipe_inode(shim.stdout.fileno())
    answers_left_unread(daemon, shim)
    assert holds_pipe(daemon.pid, inode)
    shim.kill()
    shim.wait()
    wait_for(lambda: not holds_pipe(daemon.pid, inode), message="the daemon to let go of the agent's stdout")


SLOW = '''
import time

from atomictools import tool


@tool
def slow(seconds: float) -> str:
    """Sleep, then say so."""
    time.sleep(seconds)
    return "slept"
'''


def test_a_daemon_that_stops_with_a_call_of_a_half_closed_session_running_says_so(
    env: Env, make_daemon,  # type: ignore[no-untyped-def]
) -> None:
    """The agent closed its stdin with a call running, and the daemon stops before it ends: the
    call is never answered, and the shim says the daemon stopped (exit 1), not that all is done."""
    env.write_tool(env.global_tools, "slow.py", SLOW)
    daemon = make_daemon({"ATOMICTOOLS_SHUTDOWN_GRACE": "0.2"})
    shim = spawn_shim(env)
    initialized(shim)
    assert shim.stdin is not None and shim.stdout is not None and shim.stderr is not None
    message = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "slow", "arguments": {"seconds": 30}}}
    shim.stdin.write(json.dumps(message).encode() + b"\n")
    shim.stdin.close()
    with daemon.raw() as probe:
        wait_for(lambda: any(m["inflight"] for m in probe.result("atomic/status")["modules"]), message="the call to run")
    daemon.stop()
    assert shim.wait(timeout=10) == 1
    assert shim.stdout.read() == b""
    assert b"the daemon closed the connection" in shim.stderr.read()


@pytest.mark.parametrize("args", [(), ("--relay",)], ids=["handing-over", "relaying"])
def test_a_shim_the_daemon_refuses_says_why_and_exits_1(
    env: Env, make_daemon, args: tuple[str, ...],  # type: ignore[no-untyped-def]
) -> None:
    """Past ``max_connections`` the daemon answers a refusal and closes the connection, often before
    the shim has sent its attach: the shim still reads the refusal, says it, and fails."""
    env.write_tool(env.global_tools, "echo.py", ECHO)
    make_daemon({"ATOMICTOOLS_MAX_CONNECTIONS": "1"})
    with RawConnection(env.socket) as holder:
        assert holder.result("atomic/status") is not None  # the one connection the daemon takes
        for _ in range(8):
            shim = spawn_shim(env, *args)
            assert shim.stdin is not None and shim.stderr is not None
            try:
                shim.stdin.write(json.dumps(INITIALIZE).encode() + b"\n")
            except BrokenPipeError:
                pass
            assert shim.wait(timeout=10) == 1
            said = shim.stderr.read().decode()
            assert "the daemon refused the connection: Too many connections" in said, said
            assert "stopped or restarted" not in said, said


def test_past_the_descriptor_budget_a_shim_relays(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    """A handed-over session counts five descriptors: with six for the socket's clients (an open-file
    limit of 134, 128 kept for workers), the first shim hands over, and the second, for whom four
    more would leave none, relays; both are served."""
    env.write_tool(env.global_tools, "echo.py", ECHO)
    daemon = make_daemon()
    resource.prlimit(daemon.pid, resource.RLIMIT_NOFILE, (134, resource.prlimit(daemon.pid, resource.RLIMIT_NOFILE)[1]))
    first = spawn_shim(env)
    initialized(first)
    second = spawn_shim(env)
    initialized(second)
    assert handed_over(daemon, first)
    assert not handed_over(daemon, second)
    for i, shim in enumerate((first, second), start=2):
        assert shim.stdin is not None
        shim.stdin.write(call(i, f"shim {i}"))
        shim.stdin.flush()
        assert read_line(shim)["result"]["content"][0]["text"] == f"shim {i}"
    assert closed(first) == 0 and closed(second) == 0


def test_socket_stdio_counts_five_descriptors(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    """Sockets for stdin and stdout, as Node starts a child: the daemon holds each and a copy of each
    (to put its flags back). With eight descriptors for the socket's clients (an open-file limit of
    136), the first shim hands over and the second relays."""
    env.write_tool(env.global_tools, "echo.py", ECHO)
    daemon = make_daemon()
    resource.prlimit(daemon.pid, resource.RLIMIT_NOFILE, (136, resource.prlimit(daemon.pid, resource.RLIMIT_NOFILE)[1]))
    agents = []
    for _ in range(2):
        stdin_ours, stdin_theirs = socket.socketpair()
        stdout_ours, stdout_theirs = socket.socketpair()
        shim = subprocess.Popen([SHIM, "mcp"], env=env.vars, cwd=env.project, stdin=stdin_theirs, stdout=stdout_theirs,
                                stderr=subprocess.PIPE)
        _started.append(shim)
        stdin_theirs.close()
        stdout_theirs.close()
        answers = stdout_ours.makefile("rb")
        stdin_ours.sendall(json.dumps(INITIALIZE).encode() + b"\n")
        assert json.loads(answers.readline())["id"] == 1
        agents.append((shim, stdin_ours, stdout_ours, answers))
    held = [holds_shims_stdin(daemon.pid, shim) for shim, _, _, _ in agents]
    assert held == [True, False]
    for shim, stdin_ours, stdout_ours, answers in agents:
        stdin_ours.sendall(call(2, "socket stdio"))
        assert json.loads(answers.readline())["result"]["content"][0]["text"] == "socket stdio"
        stdin_ours.shutdown(socket.SHUT_WR)
        assert shim.wait(timeout=10) == 0
        answers.close()
        stdin_ours.close()
        stdout_ours.close()


def holds_shims_stdin(pid: int, shim: subprocess.Popen[bytes]) -> bool:
    """Whether process ``pid`` holds what the shim has for its stdin (a pipe's or a socket's end)."""
    theirs = os.readlink(f"/proc/{shim.pid}/fd/0")
    return any(os.readlink(f"/proc/{pid}/fd/{fd}") == theirs for fd in os.listdir(f"/proc/{pid}/fd"))


def test_an_agent_whose_stdout_is_already_closed_gets_a_shim_that_exits_0(daemon: Daemon) -> None:
    """The agent's end of the stdout is gone before the hand-over: the daemon gives the connection
    back (refused), never ends it before it was taken, and the shim, relaying into a closed pipe,
    exits 0 as a relaying shim does."""
    for _ in range(5):
        read_end, write_end = os.pipe()
        os.close(read_end)
        shim = subprocess.Popen([SHIM, "mcp"], env=daemon.env.vars, cwd=daemon.env.project, stdin=subprocess.PIPE,
                                stdout=write_end, stderr=subprocess.PIPE)
        _started.append(shim)
        os.close(write_end)
        assert shim.stdin is not None
        try:
            shim.stdin.write(json.dumps(INITIALIZE).encode() + b"\n")
            shim.stdin.flush()
        except BrokenPipeError:
            pass
        assert shim.wait(timeout=10) == 0, shim.stderr.read() if shim.stderr else b""


def test_stdin_and_stdout_on_one_socket_are_relayed(daemon: Daemon) -> None:
    """As ``socat EXEC:…`` or inetd start a program: one socket for both, which a reader and a writer
    apart cannot share."""
    ours, theirs = socket.socketpair()
    shim = subprocess.Popen([SHIM, "mcp"], env=daemon.env.vars, cwd=daemon.env.project, stdin=theirs, stdout=theirs,
                            stderr=subprocess.PIPE)
    _started.append(shim)
    theirs.close()
    with ours, ours.makefile("rb") as answers:
        ours.sendall(json.dumps(INITIALIZE).encode() + b"\n")
        assert json.loads(answers.readline())["id"] == 1
        for i in range(2, 5):  # each once the first is answered: after any hand-over
            ours.sendall(call(i, "one socket"))
            assert json.loads(answers.readline())["result"]["content"][0]["text"] == "one socket"
        ours.shutdown(socket.SHUT_WR)
        assert shim.wait(timeout=10) == 0


def test_the_shims_descriptions_keep_their_flags(daemon: Daemon, tmp_path: Path) -> None:
    """The daemon serves a pipe through a description of its own: the shim's stays blocking, for
    whoever shares it (a wrapper that writes after the shim); a socket's flags are put back at the end."""
    shim = spawn_shim(daemon.env)
    initialized(shim)
    assert handed_over(daemon, shim)
    for fd in (0, 1):
        flags = int(Path(f"/proc/{shim.pid}/fdinfo/{fd}").read_text().split("flags:")[1].split()[0], 8)
        assert not flags & os.O_NONBLOCK, fd
    assert closed(shim) == 0
    # A socket's, as Node starts a child: the wrapper reads its stdout's flags after the shim.
    ours, theirs = socket.socketpair()
    wrapper = subprocess.Popen(
        ["sh", "-c", f"{SHIM} mcp; grep '^flags' /proc/self/fdinfo/1"], env=daemon.env.vars, cwd=daemon.env.project,
        stdin=subprocess.PIPE, stdout=theirs, stderr=subprocess.PIPE,
    )
    _started.append(wrapper)
    theirs.close()
    assert wrapper.stdin is not None
    with ours, ours.makefile("rb") as answers:
        wrapper.stdin.write(json.dumps(INITIALIZE).encode() + b"\n")
        wrapper.stdin.flush()
        assert json.loads(answers.readline())["id"] == 1
        wrapper.stdin.close()
        assert wrapper.wait(timeout=10) == 0
        flags = int(answers.read().split()[1], 8)
    assert not flags & os.O_NONBLOCK


def test_an_agent_that_closes_its_end_of_the_stdout_ends_the_shim_with_0(daemon: Daemon) -> None:
    shim = spawn_shim(daemon.env)
    initialized(shim)
    assert shim.stdin is not None and shim.stdout is not None
    shim.stdout.close()
    try:
        shim.stdin.write(call(2, "nobody reads this"))  # answered into a pipe nobody reads
    except BrokenPipeError:
        pass  # the daemon saw the stdout closed first, and ended the session
    assert shim.wait(timeout=10) == 0
    shim.stdin.close()


def test_an_agents_own_handoff_through_a_relaying_shim_is_refused(daemon: Daemon) -> None:
    shim = spawn_shim(daemon.env, "--relay")
    initialized(shim)
    assert shim.stdin is not None
    shim.stdin.write(b'{"jsonrpc":"2.0","id":7,"method":"atomic/handoff"}\n' + call(8, "next"))
    shim.stdin.flush()
    refusal = read_line(shim)
    assert refusal["id"] == 7 and "before the session's first MCP request" in refusal["error"]["message"]
    assert read_line(shim)["result"]["content"][0]["text"] == "next"
    assert closed(shim) == 0


# -- a client that is no shim ----------------------------------------------------------------------


def ask_for_handoff(raw) -> dict:  # type: ignore[no-untyped-def,type-arg]
    raw.send_bytes(b'{"jsonrpc":"2.0","id":"h","method":"atomic/handoff"}\n')
    return raw.recv()


def send_descriptors(raw, fds: list[int]) -> None:  # type: ignore[no-untyped-def]
    ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    raw.sock.sendmsg([b"\0"], ancillary)


def open_descriptors(pid: int) -> int:
    return psutil.Process(pid).num_fds()


@pytest.mark.parametrize("what", ["nothing", "a file", "a pipe the wrong way round", "one descriptor"])
def test_descriptors_the_daemon_cannot_serve_are_refused_and_the_socket_goes_on(
    daemon: Daemon, tmp_path: Path, what: str,
) -> None:
    before = open_descriptors(daemon.pid)
    read_end, write_end = os.pipe()
    afile = os.open(tmp_path / "file", os.O_RDWR | os.O_CREAT)
    fds = {"nothing": [], "a file": [afile, afile], "a pipe the wrong way round": [write_end, read_end],
           "one descriptor": [read_end]}[what]
    try:
        with daemon.raw() as raw:
            assert ask_for_handoff(raw)["result"] == {"descriptors": ["stdin", "stdout"]}
            send_descriptors(raw, fds)
            notice = raw.recv()
            assert notice["method"] == "atomic/handoff" and notice["params"]["state"] == "refused"
            assert notice["params"]["why"]
            assert "result" in raw.request("ping")  # the same connection, read as a socket again
    finally:
        for fd in (read_end, write_end, afile):
            os.close(fd)
    wait_for(lambda: open_descriptors(daemon.pid) <= before, message="the daemon to close what it was sent")


def test_descriptors_that_fail_at_their_first_read_end_the_session(daemon: Daemon) -> None:
    """A listening socket passes as a stream socket; reading it fails at once: the session ends,
    nothing of it is left in the daemon."""
    with daemon.raw() as probe:
        before = len(probe.result("atomic/status")["sessions"])
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    read_end, write_end = os.pipe()
    try:
        with daemon.raw() as raw:
            assert "result" in ask_for_handoff(raw)
            send_descriptors(raw, [listener.fileno(), write_end])
            assert raw.recv()["params"] == {"state": "taken"}
    finally:
        for fd in (read_end, write_end):
            os.close(fd)
        listener.close()
    with daemon.raw() as probe:
        wait_for(lambda: len(probe.result("atomic/status")["sessions"]) <= before, message="the session to end")


def test_a_stdout_whose_reader_is_gone_is_refused_never_ended_before_it_was_taken(daemon: Daemon) -> None:
    with daemon.raw() as probe:
        before = len(probe.result("atomic/status")["sessions"])
    stdin_read, stdin_write = os.pipe()
    stdout_read, stdout_write = os.pipe()
    os.close(stdout_read)
    try:
        with daemon.raw() as raw:
            assert "result" in ask_for_handoff(raw)
            send_descriptors(raw, [stdin_read, stdout_write])
            notice = raw.recv()
            assert notice["params"]["state"] == "refused" and "stdout" in notice["params"]["why"]
            assert "result" in raw.request("ping")
    finally:
        for fd in (stdin_read, stdin_write, stdout_write):
            os.close(fd)
    with daemon.raw() as probe:
        wait_for(lambda: len(probe.result("atomic/status")["sessions"]) <= before, message="the session to end")


def test_a_handoff_with_a_request_in_flight_is_refused(daemon: Daemon) -> None:
    with daemon.raw() as raw:
        raw.send_bytes(b'{"jsonrpc":"2.0","id":"l","method":"tools/list"}\n{"jsonrpc":"2.0","id":"h","method":"atomic/handoff"}\n')
        replies = {reply["id"]: reply for reply in (raw.recv(), raw.recv())}
        assert "send it alone" in replies["h"]["error"]["message"]
        assert "result" in raw.request("ping")


def test_a_client_that_goes_before_sending_its_descriptors_leaves_nothing_open(daemon: Daemon) -> None:
    before = open_descriptors(daemon.pid)
    with daemon.raw() as raw:
        assert "result" in ask_for_handoff(raw)
    wait_for(lambda: open_descriptors(daemon.pid) <= before, message="the daemon to close the connection")
    with daemon.raw() as raw:
        assert "result" in raw.request("ping")


def test_a_raw_client_can_hand_over_a_pipe_pair(daemon: Daemon) -> None:
    """The protocol itself, as a shim speaks it: answers come on the pipe, ``done`` on the socket
    after the stdin ends."""
    stdin_read, stdin_write = os.pipe()
    stdout_read, stdout_write = os.pipe()
    with daemon.raw() as raw:
        assert "result" in ask_for_handoff(raw)
        send_descriptors(raw, [stdin_read, stdout_write])
        assert raw.recv()["params"] == {"state": "taken"}
        os.close(stdin_read)
        os.close(stdout_write)
        with os.fdopen(stdin_write, "wb") as agent_out, os.fdopen(stdout_read, "rb") as agent_in:
            agent_out.write(json.dumps(INITIALIZE).encode() + b"\n" + call(2, "piped"))
            agent_out.flush()
            assert json.loads(agent_in.readline())["id"] == 1
            assert json.loads(agent_in.readline())["result"]["content"][0]["text"] == "piped"
            agent_out.close()
            assert raw.recv()["params"] == {"state": "done"}
            assert agent_in.read() == b""  # the daemon closed its end of the stdout


def test_a_shim_whose_agent_dies_before_the_daemon_answers_exits(env: Env) -> None:
    """A daemon that never answers the attach (a listener that only accepts): the shim still sees its
    parent, the agent, die, and exits."""
    env.runtime_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(env.runtime_dir, 0o700)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(env.socket))
    listener.listen()
    read_end, write_end = os.pipe()
    parent = subprocess.Popen(
        [sys.executable, "-c",
         "import subprocess, sys, time; p = subprocess.Popen(sys.argv[1:], stdin=0, stdout=subprocess.PIPE);"
         " print(p.pid, flush=True); time.sleep(120)", SHIM, "mcp", "--no-autostart"],
        env=env.vars, cwd=env.project, stdin=read_end, stdout=subprocess.PIPE,
    )
    os.close(read_end)
    shim: psutil.Process | None = None
    try:
        assert parent.stdout is not None
        shim = psutil.Process(int(parent.stdout.readline()))
        accepted, _ = listener.accept()  # the shim connected and waits for its attach's answer
        parent.kill()
        parent.wait()
        shim.wait(timeout=10)  # raises TimeoutExpired when the shim outlives its agent
        accepted.close()
    finally:
        os.close(write_end)
        listener.close()
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        if parent.stdout is not None:
            parent.stdout.close()
        if shim is not None and shim.is_running():
            shim.kill()
            shim.wait()
