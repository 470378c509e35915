"""The stdio MCP shim: what ``atomictoolsd mcp`` and every bridge script run.

An agent launches the shim as its MCP server. The shim connects to the daemon's socket (starting the
daemon, fully detached, when none answers) and sends ``atomic/attach`` with its directory, agent name,
session id and allow/deny globs. Then, when its stdin and stdout are pipes or sockets (as every agent
starts an MCP server), it hands them to the daemon (``atomic/handoff``, ``SCM_RIGHTS``), which reads
the agent's requests and writes its answers there itself: a call skips the shim altogether, and the
shim only waits, its socket to the daemon open as the session's life (``_hand_over``). Otherwise (a
terminal, a file, ``--relay``, a daemon that does not take them) it relays bytes both ways. The
socket speaks the same one-message-per-line JSON-RPC as MCP's stdio transport, so nothing is parsed
on the way: the only lines the shim looks at are the daemon's answers to its own two requests, which
it keeps off stdout.

When stdin closes (the MCP shutdown signal) it half-closes the socket and relays the answers the daemon
still owes, then exits once the daemon closes the connection: the daemon answers every request it
read before it does (a call still running included), so `printf '…' | atomictoolsd mcp` gets every
answer. It also exits when its parent process dies, or when the daemon closes the connection.

Start-up cost is the product here: an agent spawns a shim for every session. So this module imports
only ``os``, ``sys``, ``time``, ``select``, ``_socket`` (the C module under ``socket``, which
itself costs ~4 ms for ``enum``) and ``_thread`` (the C module under ``threading``), plus
``atomictools._paths`` for the socket's location. Latency is the product too: the relay is two
threads doing blocking reads and writes, so a call costs it no more syscalls than a copy must
(``_Relay``). It must
never import argparse, json, subprocess, threading, the daemon's modules or any third-party package
(a test checks the import set), and must never write anything but MCP to stdout: diagnostics go to
stderr. Starting a daemon is the one slow path and imports ``atomictools._autostart`` only then.
"""

from __future__ import annotations

import _socket
import _thread
import os
import select
import sys
import time

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~5 ms)
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

__all__ = ["ATTACH_ID", "USAGE", "ShimOptions", "UsageError", "attach_line", "main", "parse_args"]

# The id of the shim's own attach request. The daemon frames every answer as
# ``{"jsonrpc":"2.0","id":<id>,…`` so the answer is recognised by this prefix alone.
ATTACH_ID = "atomictoolsd-shim-attach"
_ATTACH_ANSWER = b'{"jsonrpc":"2.0","id":"' + ATTACH_ID.encode() + b'",'
HANDOFF_ID = "atomictoolsd-shim-handoff"
_HANDOFF_LINE = ('{"jsonrpc":"2.0","id":"' + HANDOFF_ID + '","method":"atomic/handoff"}\n').encode()
_HANDOFF_ANSWER = b'{"jsonrpc":"2.0","id":"' + HANDOFF_ID.encode() + b'",'
_HANDOFF_NOTICE = b'{"jsonrpc":"2.0","method":"atomic/handoff","params":{"state":"'
_REFUSAL = b'{"jsonrpc":"2.0","id":null,"error":'  # a connection the daemon closes at once (too many)
_S_IFMT, _S_IFIFO, _S_IFSOCK = 0o170000, 0o010000, 0o140000  # stat's, without its import

# How much one read asks for: a chunk once a read filled the size asked, else a page (a request or
# an answer is a line of a few hundred bytes, and CPython allocates the whole size before it shrinks
# the bytes to what came: at 64 KiB that costs each read ~0.2 µs more).
_CHUNK = 1 << 16
_PAGE = 4096
_PARENT_CHECK = 1.0  # seconds between checks that the parent is still alive
_CONNECT_ERRORS = (FileNotFoundError, ConnectionRefusedError)
_PARENT = os.getppid()  # as early as possible: the agent may die while we start

USAGE = """\
usage: atomictoolsd mcp [-h] [--directory DIR] [--allow GLOB] [--deny GLOB] [--dispatcher]
                        [--agent NAME] [--no-autostart] [--relay]

Run the stdio MCP server that AI coding agents launch: it relays MCP between stdin/stdout and the
atomictoolsd daemon, starting the daemon when none is running. `atomictoolsd connect AGENT` writes
the agent's config entry that runs it.

options:
  -h, --help           show this help message and exit
  -C, --directory DIR  project directory whose tools to serve (default: the current directory)
  --allow GLOB         serve only tools whose name matches GLOB (repeat it for more globs)
  --deny GLOB          never serve tools whose name matches GLOB (repeat it for more globs)
  --dispatcher         add the meta-tools atomic_list_tools and atomic_call_tool, for agents
                       that ignore notifications/tools/list_changed
  --agent NAME         the agent's name, shown in `atomictoolsd status` and in ctx.agent
  --no-autostart       fail instead of starting the daemon when none is running
  --relay              copy every message itself, rather than handing stdin and stdout to the
                       daemon to read and write directly

exit codes:
  0    stdin closed (the agent is done)
  1    the daemon could not be reached or started
  2    bad arguments
  130  interrupted (Ctrl-C)
"""


class UsageError(Exception):
    """Bad command-line arguments (exit code 2)."""


class ShimOptions:
    """What one shim attaches with."""

    __slots__ = ("agent", "allow", "autostart", "deny", "directory", "dispatcher", "help", "relay")

    def __init__(self) -> None:
        self.directory: str | None = None
        self.allow: list[str] = []
        self.deny: list[str] = []
        self.dispatcher = False
        self.agent = ""
        self.autostart = True
        self.help = False
        self.relay = False


def parse_args(argv: Sequence[str]) -> ShimOptions:
    """Parse the shim's arguments (argparse costs ~10 ms to import; these few need no parser)."""
    options = ShimOptions()
    args = list(argv)
    valued = {"-C": "directory", "--directory": "directory", "--allow": "allow", "--deny": "deny", "--agent": "agent"}
    while args:
        arg = args.pop(0)
        name, eq, value = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        if name in valued:
            if not eq:
                if not args:
                    raise UsageError(f"{name} needs a value")
                value = args.pop(0)
            field = valued[name]
            if field in ("allow", "deny"):
                getattr(options, field).append(value)
            else:
                setattr(options, field, value)
        elif eq:
            raise UsageError(f"{name} takes no value")
        elif arg == "--dispatcher":
            options.dispatcher = True
        elif arg == "--no-autostart":
            options.autostart = False
        elif arg == "--relay":
            options.relay = True
        elif arg in ("-h", "--help"):
            options.help = True
        else:
            raise UsageError(f"unrecognized argument: {arg}")
    return options


def _json_string(text: str) -> str:
    # json.dumps for one string, without importing json (~9 ms with re): escape what JSON requires.
    return '"' + text.translate(_ESCAPES) + '"'


_ESCAPES = {i: f"\\u{i:04x}" for i in range(0x20)}
_ESCAPES.update({ord('"'): '\\"', ord("\\"): "\\\\", 0x7F: "\\u007f"})


def attach_line(directory: str, agent: str, session_id: str, allow: Sequence[str], deny: Sequence[str],
                dispatcher: bool) -> bytes:
    """The shim's ``atomic/attach`` request, as one NDJSON line."""
    params = [
        '"lock":true',  # the agent may not re-attach (widen its allowlist) or stop the daemon
        f'"directory":{_json_string(directory)}',
        f'"agent":{_json_string(agent)}',
        f'"sessionId":{_json_string(session_id)}',
        f'"allow":[{",".join(_json_string(g) for g in allow)}]',
        f'"deny":[{",".join(_json_string(g) for g in deny)}]',
    ]
    if dispatcher:
        params.append('"dispatcher":true')
    text = f'{{"jsonrpc":"2.0","id":"{ATTACH_ID}","method":"atomic/attach","params":{{{",".join(params)}}}}}\n'
    return text.encode("utf-8")


def _say(message: str) -> None:
    try:
        os.write(2, f"atomictoolsd mcp: {message}\n".encode(errors="replace"))
    except OSError:
        pass


def _resolve_directory(requested: str | None) -> str:
    """The directory to attach: ``--directory`` or the current one, absolute.

    An agent that does not expand a placeholder such as ``${workspaceFolder}`` passes it literally;
    the shim then falls back to its working directory rather than failing the agent's session.
    """
    cwd = os.getcwd()
    if requested is None:
        return cwd
    if "${" in requested:
        _say(f"--directory {requested!r} was not expanded by the agent; using {cwd}")
        return cwd
    directory = os.path.abspath(os.path.expanduser(requested))
    if not os.path.isdir(directory):
        raise UsageError(f"--directory {requested!r} is not a directory")
    return directory


def _socket_path(anchors: Sequence[str]) -> str:
    from atomictools._paths import RuntimeDirError, socket_path  # lazy: stdlib only: os, stat and sys

    try:
        return socket_path(anchors)
    except RuntimeDirError as exc:  # refused, never replaced by a directory the user's CLI does not use
        raise ConnectionError(str(exc)) from None


def _try_connect(path: str) -> _socket.socket:
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except BaseException:
        sock.close()
        raise
    return sock


def connect(path: str, autostart: bool, timeout: float = 20.0, anchors: Sequence[str] = ()) -> _socket.socket:
    """Connect to the daemon's socket, starting the daemon (detached) when none answers; ``anchors``:
    the directories whose projects the daemon's files may not be in (``_paths.check_locations``).

    After a start, the connection is retried with a doubling backoff from 5 ms: a daemon that
    another shim started at the same moment may hold the lock before its socket listens.

    Raises:
        ConnectionError: nothing listens and the daemon could not be started (or autostart is off);
            the message says what to do.
    """
    try:
        return _try_connect(path)
    except _CONNECT_ERRORS:
        if not autostart:
            raise ConnectionError(f"no daemon is listening on {path}; start one with `atomictoolsd start`") from None
    except OSError as exc:
        raise ConnectionError(f"cannot connect to {path}: {exc}") from None
    _start_daemon(anchors)
    delay = 0.005
    deadline = time.monotonic() + timeout
    while True:
        try:
            return _try_connect(path)
        except _CONNECT_ERRORS:
            if time.monotonic() > deadline:
                raise ConnectionError(f"the daemon started but {path} does not accept connections") from None
            time.sleep(delay)
            delay = min(delay * 2, 0.25)
        except OSError as exc:
            raise ConnectionError(f"cannot connect to {path}: {exc}") from None


def _start_daemon(anchors: Sequence[str]) -> None:
    # The slow path: subprocess and friends load only here. start_daemon() runs the daemon in a new
    # session and double-forks it, so the agent killing this shim's process group leaves it running.
    from atomictools._autostart import start_daemon  # lazy: the slow path (above)
    from atomictools._errors import ConnectError  # lazy: the slow path (above)

    try:
        start_daemon(anchors=anchors)
    except ConnectError as exc:
        raise ConnectionError(str(exc)) from None


class _Relay:
    """The shim's session: stdin and stdout handed to the daemon, or copied to and from its socket.

    Handed over (``_hand_over``), the main thread only reads the socket until the daemon closes it.
    Relayed, it is a plain byte relay with blocking I/O, as the floor it is measured against
    (``bench/peers/floor_stdio_relay.py``): one thread copies stdin to the socket, the main thread
    the socket to stdout, so a call costs one read and one write each way and no ``poll``. Either
    way a thread watches that the parent (the agent) is alive. Nothing is parsed but the daemon's
    lines up to the answers to the shim's own requests, which are kept off stdout.
    """

    def __init__(self, sock: _socket.socket, first: bytes, hand_over: bool = False) -> None:
        self.sock = sock
        self.first = first  # the attach request, sent before anything the agent writes
        self.hand_over = hand_over  # try handing stdin and stdout to the daemon first
        self.before_attach: bytearray | None = bytearray()  # daemon bytes until the attach answer
        self.pending = bytearray()  # handing over: the daemon's bytes past the last line read (_next_line)
        self.stdin_open = True
        self.parent = _PARENT
        self.parent_gone = False
        self.refused = False  # the daemon refused the connection, and the shim said why

    def run(self) -> int:
        sock = self.sock
        sock.setblocking(True)
        try:
            _send(sock, self.first)
            _thread.start_new_thread(self._watch_parent, ())  # the agent may die while the daemon answers
            if self.hand_over:
                handed = self._hand_over()
                if handed is not None:
                    return handed
        except BrokenPipeError:
            raise  # our stdout, written a line the daemon sent: the agent is gone (main)
        except OSError:
            pass  # the daemon is gone: the read below finds it so, and says so
        else:
            _thread.start_new_thread(self._copy_stdin, ())
        size = _PAGE
        while True:
            data = _recv(sock, size)
            if not data:
                break
            size = _CHUNK if len(data) == size else _PAGE
            if self.before_attach is not None:
                data = self._drop_attach_answer(data)
            if data:
                _write_all(1, data)
        if self.parent_gone:
            return 0  # the agent died without closing our stdin
        if self.refused:
            return 1
        if self.stdin_open:
            _say("the daemon closed the connection (it stopped or restarted); restart this MCP server")
            return 1
        return 0

    def _hand_over(self) -> int | None:
        """Hand stdin and stdout to the daemon and wait for the session's end: the exit code; None
        when the daemon does not take them (the caller relays; what the daemon said meanwhile is on
        stdout). Raises OSError when the daemon goes."""
        self._next_line(_ATTACH_ANSWER)  # the attach is answered before stdin is read elsewhere
        self.before_attach = None
        _send(self.sock, _HANDOFF_LINE)
        if not self._next_line(_HANDOFF_ANSWER).startswith(_HANDOFF_ANSWER + b'"result"'):
            self._flush_pending()
            return None  # a daemon that does not take descriptors, or not now
        fds = (0).to_bytes(4, sys.byteorder) + (1).to_bytes(4, sys.byteorder)
        _send(self.sock, b"\0", [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, fds)])
        if not self._next_line(_HANDOFF_NOTICE).startswith(_HANDOFF_NOTICE + b'taken"'):
            self._flush_pending()
            return None  # refused: the daemon reads the socket again
        ended = self.pending.find(_HANDOFF_NOTICE + b'done"') >= 0
        while not ended:
            data = _recv(self.sock, _PAGE)
            if not data:
                break
            self.pending += data
            ended = self.pending.find(_HANDOFF_NOTICE + b'done"') >= 0
            del self.pending[: max(0, len(self.pending) - len(_HANDOFF_NOTICE) - 8)]
        if ended or self.parent_gone:
            return 0  # the agent closed stdin and every answer was written, or the agent is gone
        _say("the daemon closed the connection (it stopped or restarted); restart this MCP server")
        return 1

    def _next_line(self, prefix: bytes) -> bytes:
        """Read the daemon's lines up to the first that starts with ``prefix`` and return it; the lines
        before it go to stdout (an attach answer that is an error, to stderr). Raises OSError at the
        socket's end."""
        buffer = self.pending
        start = 0
        while True:
            newline = buffer.find(b"\n", start)
            if newline < 0:
                data = self.sock.recv(_CHUNK)
                if not data:
                    raise ConnectionError("the daemon closed the connection")
                buffer += data
                continue
            line = bytes(buffer[start : newline + 1])
            start = newline + 1
            if line.startswith(_ATTACH_ANSWER):
                if line[len(_ATTACH_ANSWER) :].startswith(b'"error"'):
                    _say(f"attach failed: {line.decode(errors='replace').strip()}")
                if prefix != _ATTACH_ANSWER:
                    continue
            elif not line.startswith(prefix):
                self._pass_on(line)
                continue
            del buffer[:start]
            return line

    def _flush_pending(self) -> None:
        """Relay what the daemon sent past the hand-over's last line, before relaying goes on."""
        if self.pending:
            _write_all(1, bytes(self.pending))
            self.pending = bytearray()

    def _copy_stdin(self) -> None:
        """stdin → the socket. At stdin's end, half-close the socket: the daemon answers every request
        it has read (a call still running included; its timeout bounds it), then closes, and the main
        thread relays those answers until it does."""
        size = _PAGE
        while True:
            try:
                data = os.read(0, size)
            except BlockingIOError:  # a non-blocking stdin, inherited
                _wait(0, select.POLLIN)
                continue
            except InterruptedError:
                continue
            except OSError:  # stdin was closed or never opened
                data = b""
            if not data:
                break
            size = _CHUNK if len(data) == size else _PAGE
            try:
                self.sock.sendall(data)
            except OSError:
                return  # the daemon is gone: the main thread's read ends too
        self.stdin_open = False
        try:
            self.sock.shutdown(_socket.SHUT_WR)
        except OSError:
            pass

    def _watch_parent(self) -> None:
        while True:
            time.sleep(_PARENT_CHECK)
            if os.getppid() != self.parent:
                self.parent_gone = True
                try:
                    self.sock.shutdown(_socket.SHUT_RDWR)  # ends the main thread's read
                except OSError:
                    pass
                return

    def _drop_attach_answer(self, data: bytes) -> bytes:
        """Pass on whole lines up to the answer to our attach, which goes to stderr when it is an error."""
        assert self.before_attach is not None
        buffer = self.before_attach
        buffer += data
        out = bytearray()
        start = 0
        while True:
            newline = buffer.find(b"\n", start)
            if newline < 0:
                del buffer[:start]
                return bytes(out)
            line = buffer[start : newline + 1]
            start = newline + 1
            if line.startswith(_ATTACH_ANSWER):
                if line[len(_ATTACH_ANSWER) :].startswith(b'"error"'):
                    _say(f"attach failed: {line.decode(errors='replace').strip()}")
                out += buffer[start:]
                self.before_attach = None
                return bytes(out)
            self._note_refusal(line)
            out += line

    def _pass_on(self, line: bytes) -> None:
        """A line of the daemon's before the one the hand-over waits for: the agent's."""
        self._note_refusal(line)
        _write_all(1, line)

    def _note_refusal(self, line: bytes) -> None:
        """The daemon's error with no id, before the attach is answered, is its refusal of the
        connection (it closes it next): said on stderr, where the agent's user looks, and passed on."""
        if not line.startswith(_REFUSAL):
            return
        import json  # lazy: only a refused shim reads a message

        try:
            why = json.loads(line)["error"]["message"]
        except (ValueError, KeyError, TypeError):
            why = line.decode(errors="replace").strip()
        _say(f"the daemon refused the connection: {why}")
        self.refused = True


def _send(sock: _socket.socket, data: bytes, ancillary: list[tuple[int, int, bytes]] | None = None) -> None:
    """Send all of ``data`` to the daemon. A connection it closed raises ConnectionResetError, never
    BrokenPipeError, which stands for the agent's stdout (``main``)."""
    try:
        if ancillary is None:
            sock.sendall(data)
        else:
            sock.sendmsg([data], ancillary)
    except BrokenPipeError as exc:
        raise ConnectionResetError(exc.errno, "the daemon closed the connection") from None


def _recv(sock: _socket.socket, size: int) -> bytes:
    """Up to ``size`` bytes from the daemon; b"" once it closed the connection or the read failed.
    (An interrupted read is retried by Python itself.)"""
    try:
        return sock.recv(size)
    except OSError:
        return b""


def _write_all(fd: int, data: bytes) -> None:
    try:
        written = os.write(fd, data)
    except (BlockingIOError, InterruptedError):
        written = 0
    if written == len(data):
        return  # the common case: all of it in one write
    view = memoryview(data)[written:]
    while view:
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:  # a non-blocking stdout, inherited: wait until it takes more
            _wait(fd, select.POLLOUT)
        except InterruptedError:
            continue


def _pipes_or_sockets(*fds: int) -> bool:
    """Whether each of ``fds`` is a pipe or a socket: what the daemon can take (not a terminal or a file)."""
    try:
        return all(os.fstat(fd).st_mode & _S_IFMT in (_S_IFIFO, _S_IFSOCK) for fd in fds)
    except OSError:
        return False


def _wait(fd: int, event: int) -> None:
    poller = select.poll()
    poller.register(fd, event)
    poller.poll()


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """Run the shim; returns the exit code.

    Args:
        argv: the arguments after ``mcp`` (default ``sys.argv[1:]``).
        environ: variables to set first; bridge scripts bake ``ATOMICTOOLS_SOCKET`` and
            ``ATOMICTOOLS_RUNTIME_DIR`` in this way, so a daemon they start serves the same socket.
    """
    if environ:
        os.environ.update(environ)
    try:
        options = parse_args(sys.argv[1:] if argv is None else argv)
        if options.help:  # no MCP session runs: the help goes where every command's help goes
            sys.stdout.write(USAGE)
            return 0
        directory = _resolve_directory(options.directory)
        line = attach_line(directory, options.agent, os.urandom(8).hex(), options.allow, options.deny,
                           options.dispatcher)
    except (UsageError, UnicodeEncodeError) as exc:
        _say(f"{exc}\n{USAGE}")
        return 2
    except OSError as exc:
        _say(str(exc))
        return 2
    anchors = (os.getcwd(), directory)  # where the agent runs, and the project it attaches
    try:
        sock = connect(_socket_path(anchors), options.autostart, anchors=anchors)
    except ConnectionError as exc:
        _say(str(exc))
        return 1
    try:
        return _Relay(sock, line, not options.relay and _pipes_or_sockets(0, 1)).run()
    except BrokenPipeError:
        return 0  # the agent closed our stdout: it is gone
    except KeyboardInterrupt:
        return 130
    finally:
        sock.close()


if __name__ == "__main__":
    sys.exit(main())
