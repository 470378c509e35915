"""The code inside a tool worker: load one tool module (``loading``), then serve calls to its tools
(``scheduling``), answering each with what ``results`` makes of what the tool returned. This module
is the entry: ``serve`` (what the fork server runs in a new worker) and ``main`` (a cold start).

A worker is a process of its own, so whatever a tool does (raise, hang, leak, crash, fork) stays
here. This module must never import the server, uvloop or watchfiles: a fork server pre-imports it,
and every import here is paid by every worker that is not forked.

Messages (``protocol.py`` defines each as a tagged, array-like struct, and the framing):

daemon → worker
    ``Trusted``: ``["trusted", {path: sha256}]`` first, before the module loads, when the spec says
    ``follow_content``: what the worker may load from its tools dir (``sourceload.follow_content``).
    ``CallTool``: ``["call", call_id, tool, arguments_json, context, progress]`` where ``context`` is a
    ``CallContext`` (``[session_id, message_id, agent, directory, worktree, tool_use_id]``), or None
    when it is the same as the call before's, and ``progress`` says whether the caller asked for
    progress notifications.
    ``Cancel``: ``["cancel", call_id]``: cancel an async call; set ``ctx.cancel_event`` for a sync one.
    ``Answer``: ``["answer", call_id, ask_id, result_json, error]``: the client's answer to an ``ask``
    (``result_json`` None and ``error`` why, when there is none).

worker → daemon
    ``["loaded", definitions, load_ms, problems, deps, fingerprint, helpers, site]`` once, when the module loaded;
    ``problems`` lists the tools it skipped (``{tool, line, message}``: a declarative file's malformed
    tools), else ``[]``; ``deps`` lists ``[path, size, mtime_ns]`` of the other files of its directory
    it imported; ``fingerprint`` is ``[size, crc32]`` of the module file's bytes it loaded (None if it
    read none), ``helpers`` ``[path, size, crc32]`` of the bytes it loaded from each of those files.
    ``site`` lists the site-packages dirs it imported from (``[dir, mtime_ns, [[entry, inode, mtime_ns], ...]]``,
    ``environment.site_report``).
    ``["failed", {file, line, message, traceback, deps, fingerprint, helpers, refused?, site}]`` once, instead,
    when it did not (``refused``: the files of its tools dir whose content it was not allowed to load;
    ``site``: every site-packages dir on its path); then it exits.
    ``["result", call_id, result_json]``: the MCP ``CallToolResult`` as JSON; ``None`` for a call that
    ended by cancellation.
    ``["progress", call_id, progress, total, message]`` and ``["log", call_id, level, data]``.
    ``["dropped", call_id, keys]``: the call's undeclared arguments that were dropped (see
    ``arguments``), before its result.
    ``["ask", call_id, ask_id, method, params_json, wait]``: ``ctx.elicit``/``ctx.sample`` asks the
    client that made the call (``method`` is ``elicitation/create`` or ``sampling/createMessage``).
    ``["output", fd, data, dropped]``: what the worker wrote to its stdout (1) or stderr (2); see
    ``output``.

The daemon accepts exactly these shapes and types (``protocol.WorkerMessage``) and no message larger
than ``max_result_bytes`` (its ``max_message_bytes``); it kills a worker that sends anything else. So
a result past the limit is refused here (kept in a spill file), and a ``ctx.log`` or ``ctx.progress``
message past it is not sent: its call answers with an error naming the limit.
"""

from __future__ import annotations

import os
import socket
import struct
import sys
import threading
import time
from typing import Any

import msgspec

from atomictoolsd.protocol import MAX_LOAD_REPORT, Failed, Loaded, LoadFailure, Trusted, WorkerSpec, encode_frame
from atomictoolsd.worker.environment import site_report
from atomictoolsd.worker.limits import apply_memory_limit, describe_limit
from atomictoolsd.worker.loading import LOADERS, declared, load_module, prepare, warm_up
from atomictoolsd.worker.output import capture as capture_output
from atomictoolsd.worker.results import make_result
from atomictoolsd.worker.scheduling import Runtime
from atomictoolsd.worker.sender import Sender, exit_worker
from atomictoolsd.worker.sourceload import fingerprint, fingerprints, follow_content, imported_from, refused

__all__ = ["LOADERS", "LoadFailure", "WorkerSpec", "load_module", "main", "make_result", "prepare", "send_loaded", "serve", "warm_up"]


def serve(fd: int, spec: WorkerSpec) -> None:
    """Load the module and serve calls on channel ``fd`` until the daemon closes it. Never returns."""
    sock = socket.socket(fileno=fd)
    sock.setblocking(True)
    sender = Sender(sock)

    def send(message: Any) -> None:
        sender.send(encode_frame(message))

    if spec.sandbox is not None:
        # The fork server imported it before forking a confined worker.
        from atomictoolsd.worker import sandbox  # lazy: ctypes, for confined workers only

        # Before the first thread (Landlock binds the calling thread and what it starts) and
        # before the module's first line: nothing of it ever runs unconfined.
        try:
            _isolate_network(spec)
            sandbox.confine(spec.sandbox, spec.runtime_paths, spec.temp_dir, spec.spill_dir)
        except sandbox.SandboxError as exc:
            send(Failed({"file": spec.path, "line": None, "traceback": "",
                         "message": f"not loaded: its project is trusted with --sandbox, and {exc}"}))
            exit_worker()
        if spec.sandbox.get("pass_env"):
            try:
                os.environ.update(_passed_env(sock))
            except (OSError, struct.error, msgspec.DecodeError):
                exit_worker()  # the daemon closed the channel first
    if spec.kind == "javascript":
        from atomictoolsd.worker.jsexec import exec_runtime  # lazy: JavaScript workers only

        # Confined already: becomes Bun or Node, serving the module on this channel; in a project
        # whose content is followed, its load hooks refuse what the daemon did not judge trusted.
        trusted = _read_trusted(sock) if spec.follow_content else None
        exec_runtime(sock.detach(), spec, trusted)
    capture_output(send)  # first: what the module prints while it loads is the author's clue
    started = time.perf_counter()
    apply_memory_limit(spec.memory_limit)  # before the import: a module's own allocations count too
    directory = os.path.dirname(spec.path)
    if spec.follow_content:
        follow_content(directory, _read_trusted(sock))
    try:
        if spec.cwd:
            os.chdir(spec.cwd)
        specs, problems = load_module(spec)
        tools = {t.name: t for t in specs}
    except LoadFailure as failure:
        info = {
            **failure.info, "deps": imported_from(directory, spec.path), "fingerprint": fingerprint(spec.path),
            "helpers": fingerprints(directory, spec.path), "site": site_report(failed=True),
        }
        if refused():
            info["refused"] = refused()  # the daemon judges these again (registry/content.py)
        if info["message"].startswith("MemoryError") and spec.memory_limit:
            info["message"] = f"MemoryError: importing the module needs more than {describe_limit(spec.memory_limit)}"
        info["message"], info["traceback"] = _clipped(info["message"], 16_384), _clipped(info["traceback"], 65_536)
        send(Failed(info))
        exit_worker()
    except BaseException as exc:  # noqa: BLE001 - report anything, then go
        send(Failed({"file": spec.path, "line": None, "message": _clipped(repr(exc), 16_384), "traceback": ""}))
        exit_worker()
    if spec.sandbox is not None and "sandbox" in declared:
        from atomictoolsd.worker import sandbox  # lazy: ctypes, for confined workers only

        try:
            sandbox.narrow(declared["sandbox"], spec.sandbox, spec.temp_dir, spec.spill_dir)
        except sandbox.SandboxError as exc:
            send(Failed({"file": spec.path, "line": None, "traceback": "", "message": str(exc)}))
            exit_worker()
    load_ms = (time.perf_counter() - started) * 1000
    report = encode_frame(Loaded(
        [t.definition() for t in tools.values()], load_ms, problems, imported_from(directory, spec.path),
        fingerprint(spec.path), fingerprints(directory, spec.path), site_report(failed=False),
    ))
    if len(report) - 4 > MAX_LOAD_REPORT:  # the daemon would refuse it: say why instead
        send(Failed({"file": spec.path, "line": None, "traceback": "", "message": _report_too_large(len(report) - 4, len(tools))}))
        exit_worker()
    runtime = Runtime(sock, tools, spec, sender)
    send_loaded(sender, report)
    runtime.run()
    # The reading role moved to another thread (a call here ran long); the process ends when
    # the channel closes, from whichever thread reads the end of it.
    threading.Event().wait()


def _clipped(text: str, most: int) -> str:
    """``text`` cut to about ``most`` characters, its start and end kept (what a load error shows:
    an exception's message can be megabytes, and a load report has 4 MiB in all)."""
    if len(text) <= most:
        return text
    return f"{text[: most // 2]}\n… {len(text) - most:,} characters left out …\n{text[-most // 2 :]}"


def send_loaded(sender: Sender, report: bytes) -> None:
    """Send the module's load report (``report``: a ``Loaded`` frame), once."""
    try:
        sender.send(report)
    except OSError:
        exit_worker()  # the daemon is gone


def _report_too_large(size: int, tools: int) -> str:
    return (
        f"the module's load report (the definitions of its {tools} tool(s), the files it imported) takes "
        f"{size / (1 << 20):.1f} MiB, more than the {MAX_LOAD_REPORT >> 20} MiB one may take: split the module, "
        f"or shorten its schemas and descriptions"
    )


def _isolate_network(spec: WorkerSpec) -> None:
    """A confined worker allowed the network gets a network namespace of its own, whose one way out
    is the daemon's proxy (``netns``); raise ``SandboxError`` where that cannot be done: it must not
    run with the host's network instead."""
    if not (spec.sandbox or {}).get("net"):
        return
    from atomictoolsd.worker import netns, sandbox  # lazy: imported by the fork server already

    if spec.net_handoff < 0:
        raise sandbox.SandboxError("its network cannot be isolated (no hand-over socket from the fork server)")
    try:
        netns.isolate(spec.net_handoff)
    except OSError as exc:
        raise sandbox.SandboxError(f"its network cannot be isolated: {exc}") from None


def _passed_env(sock: socket.socket) -> dict[str, str]:
    """The variables the daemon sent this worker alone, first on its channel (``Spawner.spawn``):
    those the user allows a confined worker by name, which never pass through the fork server."""
    (length,) = struct.unpack(">I", sock.recv(4, socket.MSG_WAITALL))
    return msgspec.msgpack.decode(sock.recv(length, socket.MSG_WAITALL), type=dict[str, str])


def _read_trusted(sock: socket.socket) -> dict[str, str]:
    """The daemon's message after those variables (``Trusted``): what this worker may load. A channel
    that closes or says anything else first leaves it nothing to load."""
    def exactly(count: int) -> bytes:
        data = b""
        while len(data) < count:
            chunk = sock.recv(count - len(data))
            if not chunk:
                exit_worker()
            data += chunk
        return data

    (length,) = struct.unpack(">I", exactly(4))
    try:
        return msgspec.msgpack.decode(exactly(length), type=Trusted).allowed
    except msgspec.DecodeError:
        return {}


def main(argv: list[str] | None = None) -> None:
    """Cold start, without the fork server: ``python -m atomictoolsd.worker.main FD SPEC_JSON``."""
    args = sys.argv[1:] if argv is None else argv
    spec = msgspec.json.decode(args[1], type=WorkerSpec)
    if spec.sandbox is not None and not spec.runtime_paths:
        from atomictoolsd.worker import sandbox  # lazy: ctypes, for confined workers only

        policy = spec.sandbox
        if spec.env is not None:
            policy = sandbox.with_environment(policy, [*spec.env.site, *spec.env.code])
        spec = msgspec.structs.replace(spec, runtime_paths=sandbox.runtime_read_paths(), sandbox=policy)
    serve(int(args[0]), spec)


if __name__ == "__main__":
    main()
