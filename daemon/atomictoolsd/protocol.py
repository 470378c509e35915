"""What the daemon and a worker say to each other: ``WorkerSpec`` (what a new worker is told),
``LoadFailure`` (a module that cannot load), the messages, and the framing: a 4-byte big-endian
length, then one msgpack value. And what the daemon and a fork server say to each other: the
same kind of messages, one per datagram.

Both sides import this, so it stays at the standard library, msgspec and the protocol's types.
Every message is a tagged, array-like struct: on the wire a msgpack array whose first element names
it; ``worker/main.py`` says what a worker sends and accepts. A result travels as the JSON of an MCP ``CallToolResult``; ``error_result`` makes the
error one that either side may have to answer with (a worker for a tool that raised, the daemon for a
worker that died).

A worker runs a tool's code, and a tool can write anything to its channel. So the daemon reads it
with a limit (``FrameReader(limit=...)``: a frame is judged by its header, never buffered past the
limit) and decodes each frame as one of the ``WorkerMessage`` types, whose shape and field types
msgspec checks; anything else is a ``FrameError`` and the channel is not read further.
"""

from __future__ import annotations

import re
import struct
from typing import Annotated, Any, Literal

import msgspec

from atomictools._protocol import LogLevel

__all__ = [
    "ASK_METHODS", "ERROR_END", "FRAME_OVERHEAD", "INVALID_ARGUMENTS", "MAX_DROPPED_KEYS", "MAX_FRAME", "MAX_LOAD_REPORT",
    "MAX_REPORTED_FILES", "MAX_SITE_DIRS", "MAX_SITE_ENTRIES", "NEEDS_TRUSTED_DIRECTORY", "SITE_NAMES", "TEXT_HEAD", "TEXT_TAIL", "Answer", "Ask",
    "AskMethod", "CallContext", "CallTool", "Cancel", "DaemonMessage", "Dropped", "EnvSpec", "Exited", "Failed",
    "FailureReport", "FileReport", "Fingerprint", "ForkServerMessage", "ForkServerRequest", "FrameError", "FrameReader",
    "FrameTooLarge", "JsRuntime", "LoadFailure", "Loaded", "Log", "Output", "Pid", "Ping", "Pong", "Progress", "Ready",
    "Result", "SiteDir", "SiteReport", "Spawn", "SpawnFailed", "Spawned", "WorkerMessage", "WorkerSpec", "bounded_site",
    "encode_frame", "error_result", "read_site", "well_formed_json",
]

_HEADER = struct.Struct(">I")
_unpack_header = _HEADER.unpack_from
MAX_FRAME = 1 << 30  # a larger frame means the stream is corrupt, not that a result is big
# What a frame may carry beyond the largest message the daemon relays (the array around a result,
# its call id): a reader given a limit of ``max_message_bytes + FRAME_OVERHEAD`` refuses nothing
# the runtime sends.
FRAME_OVERHEAD = 64 * 1024


class EnvSpec(msgspec.Struct, kw_only=True, frozen=True):
    """An environment a worker imports from, besides the daemon's own (``worker/environment.py``):
    the packages a module declares (``declared``: an environment the daemon built for them), or its
    project's (``project``: a virtual environment the user named, with the project's own code)."""

    kind: Literal["declared", "project"]
    name: str  # how messages name it: its directory
    site: list[str] = []  # its site-packages dirs: searched after the standard library, before the daemon's
    code: list[str] = []  # the project's own code (its root, its src/), searched before ``site``
    python: str = ""  # a project environment's interpreter: the one an install command names
    requirements: list[str] = []  # what the module declares (``declared``)

class JsRuntime(msgspec.Struct, frozen=True, kw_only=True):
    """How the worker of a TypeScript or JavaScript module starts (``WorkerSpec.javascript``): the
    runtime the daemon chose (``pool/javascript/runtimes.py``), run by ``worker/jsexec.py``."""

    name: str = ""  # "bun" or "node"; empty when no runtime can run the module
    version: str = ""
    command: list[str] = []  # the runtime's executable and its flags
    packages: str = ""  # the directory whose node_modules holds the support packages ("": none)
    read: list[str] = []  # what a confined worker reads besides the Python runtime: the runtime's files, the packages
    problem: str = ""  # why no runtime can run the module (then ``command`` is empty)


class WorkerSpec(msgspec.Struct, kw_only=True, frozen=True):
    """What the daemon tells a new worker: which module, and the limits to apply. Frozen: a changed
    spec is a new value (``msgspec.structs.replace``)."""

    path: str
    kind: str = "python"
    cwd: str = "/"
    # The limits have no defaults here: the daemon's Config holds them (config/settings.py), and
    # pool.pool.PoolSettings.from_config is the one place that writes them into a spec.
    threads: int
    memory_limit: int  # bytes; 0 means no limit
    truncate_lines: int
    truncate_bytes: int
    max_result_bytes: int  # the daemon's max_message_bytes
    spill_dir: str = ""
    # Set for a worker that must run confined (``worker/sandbox.confine``): {"read": [...], "write":
    # [...], "net": bool}. None: it runs with the user's full rights.
    sandbox: dict[str, Any] | None = None
    temp_dir: str = ""  # a confined worker's private TMPDIR, made and removed by the fork server
    # A worker of a fully trusted project whose content is followed (registry/content.py): it reads a
    # ``Trusted`` message first, which says what it may load from its tools dir.
    follow_content: bool = False
    runtime_paths: list[str] = []  # what a confined worker reads of the Python runtime
    # A confined worker allowed the network: the socket on which it hands the daemon its proxy
    # listener (``worker/netns.isolate``). Set by the fork server, which received it with the
    # spawn request; -1 for every other worker.
    net_handoff: int = -1
    env: EnvSpec | None = None  # the environment it imports from besides the daemon's; None: the daemon's alone
    javascript: JsRuntime | None = None  # set for a TypeScript or JavaScript module (kind "javascript")


class LoadFailure(Exception):
    """A module could not be loaded; carries where and why, for the daemon's listings.

    The one name for the idea on both sides: a worker raises it while loading, and the daemon raises
    it (``from_info``, with what the worker reported) from ``ModuleRunner.load``. ``by_module``: the
    module's own doing (its import raised, its tools are malformed, its import outlived the load
    timeout), so loading the same files fails the same way and the failure may be cached; False
    when its worker died while loading, which may not happen again.
    """

    def __init__(self, file: str, line: int | None, message: str, trace: str = "", *, by_module: bool = True) -> None:
        super().__init__(message)
        self.info: dict[str, Any] = {"file": file, "line": line, "message": message, "traceback": trace}
        self.by_module = by_module

    @classmethod
    def from_info(cls, info: dict[str, Any], by_module: bool = True) -> LoadFailure:
        """The failure a worker reported (``info`` as it sent it, with whatever else it read)."""
        failure = cls(info.get("file", ""), info.get("line"), info.get("message", "load failed"), by_module=by_module)
        failure.info = info
        return failure



class FrameError(ValueError):
    """The stream cannot be read on: a frame is too large, or is not a valid message.

    ``messages`` are the whole messages that came before it in the same feed, still to be handled.
    """

    def __init__(self, reason: str, messages: list[Any] | None = None) -> None:
        super().__init__(reason)
        self.messages = messages or []


class FrameTooLarge(FrameError):
    """A frame announced more bytes than the reader's limit; refused from its header, unread."""

    def __init__(self, length: int, limit: int, messages: list[Any] | None = None) -> None:
        super().__init__(f"a message of {length:,} bytes, more than the {limit:,}-byte limit", messages)
        self.length = length
        self.limit = limit


# What a worker sends (see ``worker/main.py``), as the daemon accepts it: exactly these arrays, these types.


class _Message(msgspec.Struct, array_like=True, forbid_unknown_fields=True, frozen=True, tag_field="op"):
    pass


# What a load report may name, as the runtimes report it (``worker/main.py``, ``worker/js/worker.mjs``):
# the types below carry these bounds, so a report naming more is refused from the lengths msgpack
# announces, before anything of it is built (a worker's word costs the daemon no more than this).
MAX_LOAD_REPORT = 4 << 20  # bytes of one load report (its tools' definitions, mostly); the runtimes fail a larger load
MAX_REPORTED_FILES = 4096  # files of the tools dir one load report names (deps, helpers, refused)
MAX_SITE_DIRS = 16  # site dirs one load report may name
MAX_SITE_ENTRIES = 256  # their entries, in all (the runtime reports a module's first 256 imports)

# A file a module loaded: ``[path, size, mtime_ns]`` (deps) or ``[path, size, crc32]`` (helpers).
FileReport = Annotated[list[tuple[str, int, int]], msgspec.Meta(max_length=MAX_REPORTED_FILES)]
Fingerprint = Annotated[list[int], msgspec.Meta(max_length=2)]  # ``[size, crc32]`` of the module's file
# A site-packages dir a module imported from: ``[dir, dir's mtime_ns, [[entry, inode, mtime_ns], ...]]``,
# each entry the top-level file or directory of a package it imported from there (``worker/environment.py``).
SiteDir = tuple[str, int, Annotated[list[tuple[str, int, int]], msgspec.Meta(max_length=MAX_SITE_ENTRIES)]]
SiteReport = Annotated[list[SiteDir], msgspec.Meta(max_length=MAX_SITE_DIRS)]
SITE_NAMES = ("site-packages", "dist-packages")


def read_site(value: Any) -> list[SiteDir]:
    """``value`` (a failed load's ``site``, as a worker sent it or the cache kept it) as ``SiteDir``s,
    bounded as ``bounded_site`` keeps them; empty when it is not a list of them."""
    try:
        return bounded_site(msgspec.convert(value or [], SiteReport))
    except msgspec.ValidationError:
        return []


def bounded_site(site: list[SiteDir]) -> list[SiteDir]:
    """Of a worker's report of the site dirs its module imported from (the worker's word: the daemon
    looks at each of them every second), those the runtime reports: absolute dirs named
    ``site-packages`` or ``dist-packages``, at most ``MAX_SITE_DIRS``, with the entries directly in
    them, at most ``MAX_SITE_ENTRIES`` in all. The others are not looked at."""
    kept: list[SiteDir] = []
    left = MAX_SITE_ENTRIES
    for directory, mtime, entries in site:
        if len(kept) == MAX_SITE_DIRS:
            break
        prefix = directory.rstrip("/") + "/"
        if not directory.startswith("/") or "\0" in directory or prefix[:-1].rpartition("/")[2] not in SITE_NAMES:
            continue
        own = [e for e in entries[:left] if e[0].startswith(prefix) and "/" not in e[0][len(prefix):] and e[0] != prefix]
        left -= len(own)
        kept.append((directory, mtime, own))
    return kept


class Loaded(_Message, tag="loaded"):
    definitions: list[dict[str, Any]]
    load_ms: float
    problems: list[dict[str, Any]] = []
    deps: FileReport = []
    fingerprint: Fingerprint | None = None
    helpers: FileReport = []
    site: SiteReport = []


class FailureReport(msgspec.Struct, kw_only=True):
    """Why a module did not load, as its worker reports it (``LoadFailure.info``; on the wire a map).
    A key the daemon does not read is skipped unread."""

    file: str = ""
    line: int | None = None
    message: str = "load failed"
    traceback: str = ""
    deps: FileReport = []
    fingerprint: Fingerprint | None = None
    helpers: FileReport = []
    site: SiteReport = []
    refused: Annotated[list[str], msgspec.Meta(max_length=MAX_REPORTED_FILES)] = []  # files not judged trusted
    outside: bool = False  # the module's environment, not its code (tried again on the next scan)


class Failed(_Message, tag="failed"):
    info: FailureReport


class Result(_Message, tag="result"):
    call_id: int
    result: bytes | None


class Progress(_Message, tag="progress"):
    call_id: int
    progress: float
    total: float | None
    message: str | None


class Log(_Message, tag="log"):
    call_id: int
    level: LogLevel
    data: bytes


MAX_DROPPED_KEYS = 64  # undeclared arguments one report names (the runtimes send the first ones)


class Dropped(_Message, tag="dropped"):
    """The call's undeclared arguments the worker dropped (a client's own, e.g. Gemini's
    ``wait_for_previous``), sent before its result so the daemon can log them."""

    call_id: int
    keys: Annotated[list[str], msgspec.Meta(max_length=MAX_DROPPED_KEYS)]


class Output(_Message, tag="output"):
    fd: Literal[1, 2]
    data: bytes
    dropped: int


AskMethod = Literal["elicitation/create", "sampling/createMessage"]
ASK_METHODS: tuple[str, ...] = ("elicitation/create", "sampling/createMessage")


class Ask(_Message, tag="ask"):
    """A tool asks the client that made its call (``ctx.elicit``, ``ctx.sample``): the daemon sends
    ``method`` to that client as a request and returns its answer as an ``Answer``."""

    call_id: int
    ask_id: int  # the worker's, unique while the call runs
    method: AskMethod
    params: bytes  # the JSON object of the request's params
    wait: float | None = None  # seconds the tool waits for the answer (None: as long as the daemon lets it)


WorkerMessage = Loaded | Failed | Result | Progress | Log | Dropped | Output | Ask


# What the daemon sends a worker. ``array_like``: on the wire each is the same msgpack array a list
# would be (``["call", call_id, tool, arguments, context, progress]``), so naming the fields costs
# no byte.


class CallContext(msgspec.Struct, array_like=True, frozen=True):
    """Who asked for a call: what its tool's ``ctx`` says. The same for every call of a session but
    ``message_id`` and ``tool_use_id``, which a call's ``_meta`` may set."""

    session_id: str = ""
    message_id: str = ""
    agent: str = ""
    directory: str = ""
    worktree: str = ""
    tool_use_id: str = ""


class CallTool(_Message, tag="call"):
    call_id: int
    tool: str
    arguments: bytes  # the JSON object of the arguments, as the client sent it
    # Who asked; None: the same as the last call on this channel. A session's calls share one
    # context, so it is sent (and decoded) only when it changes, not with every call.
    context: CallContext | None
    progress: bool  # the caller asked for progress notifications


class Cancel(_Message, tag="cancel"):
    call_id: int  # an async call is cancelled; a sync one sees ctx.cancel_event set


class Answer(_Message, tag="answer"):
    """The client's answer to an ``Ask``: the JSON of its result, or why there is none (the client
    cannot be asked, it answered with an error, it went away)."""

    call_id: int
    ask_id: int
    result: bytes | None
    error: str | None = None


DaemonMessage = CallTool | Cancel | Answer


class Trusted(_Message, tag="trusted"):
    """The first message to a worker whose spec says ``follow_content``, read before it loads its
    module: the SHA-256 of the bytes it may load from each file of its tools dir, by path. It goes
    on the channel, not in the spec, which travels in one datagram to the fork server."""

    allowed: dict[str, str]


# What the daemon and a fork server say to each other (``spawner.py``, ``worker/forkserver.py``):
# one of these per datagram, unframed. A confined fork server runs next to a project's code, so the
# daemon decodes what it sends as ``ForkServerMessage`` and takes anything else, or a pid that
# could name no worker (a signal to it would reach init, the daemon's group or every process),
# for a fork server that has failed.

Pid = Annotated[int, msgspec.Meta(gt=1)]


class Spawn(_Message, tag="spawn"):
    """Fork a worker. The datagram carries its channel's socket, and for a confined worker allowed
    the network a second one, on which it hands the daemon its proxy listener (``netns``)."""

    request_id: int
    spec: bytes  # the ``WorkerSpec`` as JSON: read on its own, so that a spec it cannot read fails this spawn alone


class Ping(_Message, tag="ping"):
    """The daemon's health check, answered by a ``Pong`` of the same number."""

    number: int


ForkServerRequest = Spawn | Ping


class Ready(_Message, tag="ready"):
    """Sent once, when the fork server serves."""


class Spawned(_Message, tag="spawned"):
    request_id: int
    pid: Pid


class SpawnFailed(_Message, tag="failed"):
    """It could not fork (the process limit, memory): that request fails, nothing else."""

    request_id: int
    reason: str


class Exited(_Message, tag="exited"):
    """A worker ended, reaped by the fork server (only a parent can reap)."""

    pid: Pid
    status: int  # as ``os.waitpid`` gives it


class Pong(_Message, tag="pong"):
    number: int


ForkServerMessage = Ready | Spawned | SpawnFailed | Exited | Pong

_encoder = msgspec.msgpack.Encoder()
_json = msgspec.json.encode


def encode_frame(message: Any) -> bytes:
    """One message, framed."""
    body = _encoder.encode(message)
    return _HEADER.pack(len(body)) + body


# A result of one text block is these around the text as a JSON string: the runtime builds the
# common result so, and the daemon relays one of this shape without decoding and encoding it again.
TEXT_HEAD = b'{"content":[{"type":"text","text":'
TEXT_TAIL = b"}]}"


# How the runtime's answer to arguments that do not fit a tool's schema begins (then the tool's name
# and what is wrong): the REST API tells it from a tool's own error by it (transports/rest.py).
INVALID_ARGUMENTS = "Invalid arguments for tool"


# The key of a tool definition that marks a tool running a program that may run what a directory
# holds (a declarative shell tool), in a directory relative to the caller's (``"."``, ``"src"``): the
# daemon refuses its calls where that directory is not trusted with all the user's rights
# (``Registry.untrusted_root``). Never sent to clients.
NEEDS_TRUSTED_DIRECTORY = "atomic/needsTrustedDirectory"


# How every error result ends, this one's and the daemon's re-encoding of a tool's (``isError``
# last): the pool tells an error from its end, without decoding it.
ERROR_END = b'"isError":true}'


def error_result(text: str) -> bytes:
    """An MCP ``CallToolResult`` with ``isError: true`` and one text block, as JSON."""
    return TEXT_HEAD + _json(text) + b"}]," + ERROR_END


# A \u escape of a UTF-16 surrogate with the run of backslashes before it (an even run is text,
# not an escape), and the escape of a low half that may follow it.
_SURROGATE_ESCAPE = re.compile(rb"(\\+)(u[dD]([89a-fA-F])[0-9a-fA-F]{2})(\\u[dD][c-fC-F][0-9a-fA-F]{2})?")
_REPLACEMENT = rb"\ufffd"
MOST_REPAIRED = 1 << 20  # bytes of JSON looked at for lone surrogates: a MiB of them costs ~0.15 s


def well_formed_json(text: bytes) -> bytes | None:
    """``text``, JSON that did not decode, with each lone UTF-16 surrogate escape (half of a pair, as
    ``\ud83d`` alone) replaced by ``\ufffd``; None when it holds none, or is over ``MOST_REPAIRED``.

    JavaScript writes such escapes: ``JSON.stringify`` of a string cut inside a surrogate pair (half
    an emoji). JSON allows them; msgspec, and UTF-8, cannot hold them. U+FFFD is what a UTF-8 decode
    with ``errors="replace"`` makes of half a character, and the rest of the message is kept.
    """
    if len(text) > MOST_REPAIRED or text.find(b"\\u") < 0:
        return None
    replaced = False

    def replace(match: re.Match[bytes]) -> bytes:
        nonlocal replaced
        backslashes, code, first, low = match.groups()
        if len(backslashes) % 2 == 0:  # "\\ud83d": a backslash, then text; a low escape after it is alone
            if low is None:
                return match[0]
            replaced = True
            return backslashes + code + _REPLACEMENT
        if low is not None and first in b"89abAB":  # a high half and its low half: one character
            return match[0]
        replaced = True
        return backslashes[:-1] + _REPLACEMENT + (_REPLACEMENT if low is not None else b"")

    repaired = _SURROGATE_ESCAPE.sub(replace, text)
    return repaired if replaced else None


class FrameReader:
    """Reassembles frames from a byte stream fed in arbitrary chunks."""

    __slots__ = ("_buffer", "_decode", "limit")

    def __init__(self, limit: int = MAX_FRAME, type: Any = Any) -> None:  # noqa: A002 - msgspec's own name
        self._buffer = bytearray()
        self._decode = msgspec.msgpack.Decoder(type).decode
        self.limit = limit

    @property
    def partial(self) -> bool:
        """Bytes of a frame not yet complete are held."""
        return bool(self._buffer)

    def single_frame(self, data: bytes) -> Any:
        """The message ``data`` holds when it is exactly one whole frame and no bytes are held from
        before (how calls arrive one at a time); None otherwise, and then ``feed(data)`` reads it.

        One call instead of ``feed``'s list (and its caller's queue) on every call's path.
        """
        length = len(data) - 4  # what the header must say
        if self._buffer or length <= 0 or _unpack_header(data)[0] != length or length > self.limit:
            return None
        try:
            return self._decode(data[4:])  # a small frame: copying it is cheaper than a memoryview
        except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
            return None  # feed() reads it again, and raises the error it is

    def feed(self, data: bytes) -> list[Any]:
        """Add bytes; return every message now complete, in order.

        A frame's size is judged from its header, before its body is held: a sender cannot make
        the reader buffer more than ``limit`` bytes, whatever it announces.

        Raises:
            FrameError: a frame announces a size above ``limit`` (``FrameTooLarge``), or its body is
                not a message of the reader's type (or is nested too deep to decode); nothing after it
                can be read.
        """
        message = self.single_frame(data)
        if message is not None:
            return [message]  # the common case: exactly one whole frame
        buffer = self._buffer
        limit = self.limit
        decode = self._decode
        if len(buffer) < 4 and len(buffer) + len(data) >= 4:
            # Judge the first header before taking the bytes behind it.
            (length,) = _HEADER.unpack_from(bytes(buffer[:4]) + bytes(data[: 4 - len(buffer)]))
            if length > limit:
                buffer.clear()
                raise FrameTooLarge(length, limit)
        buffer += data
        messages: list[Any] = []
        offset = 0
        size = len(buffer)
        try:
            with memoryview(buffer) as view:  # released before the buffer is resized below
                while size - offset >= 4:
                    (length,) = _HEADER.unpack_from(buffer, offset)
                    if length > limit:
                        raise FrameTooLarge(length, limit, messages)
                    end = offset + 4 + length
                    if end > size:
                        break
                    try:
                        messages.append(decode(view[offset + 4 : end]))
                    except (msgspec.DecodeError, UnicodeDecodeError) as exc:  # a str that is not UTF-8 too
                        raise FrameError(f"a malformed message ({exc})", messages) from None
                    except RecursionError:  # msgspec's depth check: a value nested past what it recurses
                        raise FrameError("a message nested too deep to read", messages) from None
                    offset = end
        except FrameError:
            buffer.clear()  # nothing after a bad frame can be trusted
            raise
        if offset:
            del buffer[:offset]
        return messages
