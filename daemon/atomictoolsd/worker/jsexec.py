"""A TypeScript or JavaScript module's worker: forked as any worker is, it becomes the JavaScript
runtime (Bun or Node) running ``js/worker.mjs``, which loads the module and speaks the same protocol
on the same channel. The process stays the one the fork server forked (same pid, session and
process group, parent-death signal, child subreaper: ``execve`` keeps them), so the daemon watches,
stops and kills it as it does any worker.

Before the ``execve``, and so before anything of the module or of the runtime runs:

- a module file another user could have written is refused (``check_writers``);
- a worker whose project is trusted with ``--sandbox`` was confined by ``main.serve``, as any
  worker, with a policy that reads the runtime's files and the support packages besides the project
  (``pool/javascript``); Landlock and seccomp hold across ``execve``;
- descriptor 3 becomes the channel, 1 and 2 pipes that a small drain process (forked here) reads
  and sends on as ``output`` frames to descriptor 4, which the worker passes on whole; nothing else is
  left open;
- the environment loses every variable that would make the runtime load or run something
  (``NODE_OPTIONS``, ``BUN_OPTIONS``, ``NODE_*``, ``BUN_*``, npm's); Bun is told to read no
  ``bunfig.toml`` (``--config`` names an empty one), no ``.env`` file and never to install a package.

There is no memory rlimit: JavaScript engines reserve far more address space than they use, and
fail outright under one. The daemon's resident-memory watch (``pool/monitor``) holds the limit;
Node's heap is also capped at it (``--max-old-space-size``).

Runs inside workers: standard library and the protocol only.
"""

from __future__ import annotations

import fcntl
import os
import select
import socket
import sys
import time
from typing import NoReturn

import msgspec

from atomictoolsd.protocol import Failed, Output, WorkerSpec, encode_frame
from atomictoolsd.worker.output import BURST_BYTES, CHUNK_BYTES, RATE_BYTES
from atomictoolsd.worker.sourceload import check_writers

__all__ = ["JS_DIR", "WORKER_SCRIPT", "clean_environment", "exec_runtime"]

JS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "js")
WORKER_SCRIPT = os.path.join(JS_DIR, "worker.mjs")
MODULES_DIR = os.path.join(JS_DIR, "modules")  # @atomic/plugin
_CHANNEL, _RELAY = 3, 4
_DROPPED_PREFIXES = ("NODE_", "BUN_", "__BUN", "NPM_CONFIG_", "TS_NODE_")


def _fail(fd: int, spec: WorkerSpec, message: str, outside: bool = True) -> NoReturn:
    """Report the module as not loaded, and end the worker. ``outside``: not the module's doing (no
    runtime, no sandbox), so the daemon tries again on its next scan rather than keep the failure."""
    frame = encode_frame(Failed({"file": spec.path, "line": None, "message": message, "traceback": "", "outside": outside}))
    try:
        while frame:
            frame = frame[os.write(fd, frame):]
    except OSError:
        pass
    os._exit(0)


def clean_environment(environ: dict[str, str], packages: str) -> dict[str, str]:
    """The worker's environment: ``environ`` without what makes a runtime load or run something,
    with ``NODE_PATH`` naming the worker's own ``@atomic/plugin`` and then the support packages."""
    env = {key: value for key, value in environ.items() if not key.upper().startswith(_DROPPED_PREFIXES)}
    search = [MODULES_DIR]
    if packages:
        search.append(os.path.join(packages, "node_modules"))
    env["NODE_PATH"] = os.pathsep.join(search)
    return env


def _arrange_descriptors(channel: int) -> None:
    """Channel on 3, stdout and stderr on pipes that a drain process reads, its ``output`` frames
    arriving on 4; nothing else open."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    relay, drained = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    if os.fork() == 0:
        try:
            os.close(channel)
            os.close(out_w)
            os.close(err_w)
            relay.close()
            _drain({out_r: 1, err_r: 2}, drained)
        finally:
            os._exit(0)
    drained.close()
    os.close(out_r)
    os.close(err_r)
    os.dup2(out_w, 1)
    os.dup2(err_w, 2)
    moved = [fcntl.fcntl(fd, fcntl.F_DUPFD, 16) for fd in (channel, relay.fileno())]
    relay.close()
    for fd in {channel, out_w, err_w}:
        os.close(fd)
    for target, fd in zip((_CHANNEL, _RELAY), moved, strict=True):
        os.dup2(fd, target)  # inheritable: the runtime takes them over
        os.close(fd)
    os.closerange(5, os.sysconf("SC_OPEN_MAX") if hasattr(os, "sysconf") else 1024)


def _drain(pipes: dict[int, int], relay: socket.socket) -> None:
    """The drain process: read what the worker and the programs it starts write to descriptors 1
    and 2, as fast as they write it, and send it to the worker as ``output`` frames, within the
    bounds a Python worker keeps (``output``); what is over, and what the worker is too busy to
    take, is counted as dropped. So a tool's program never blocks on a full pipe, even while the
    tool itself blocks the worker's only thread (``spawnSync`` with inherited output).

    Ends when every writer has closed the pipes (the worker and what it started are gone), or the
    worker has closed its end."""
    relay.setblocking(False)
    dropped = dict.fromkeys(pipes.values(), 0)
    tokens, last = float(BURST_BYTES), time.monotonic()
    while pipes:
        readable, _, _ = select.select(list(pipes), [], [], 1.0 if any(dropped.values()) else None)
        now = time.monotonic()
        tokens, last = min(float(BURST_BYTES), tokens + (now - last) * RATE_BYTES), now
        for read_end in readable or [r for r, fd in pipes.items() if dropped[fd]]:
            fd = pipes[read_end]
            data = os.read(read_end, 65536) if readable else b""
            if readable and not data:
                del pipes[read_end]
                continue
            kept = data[:CHUNK_BYTES] if tokens >= 1 else b""
            if readable and not kept:
                dropped[fd] += len(data)
                continue
            try:
                relay.send(encode_frame(Output(fd, kept, dropped[fd] + len(data) - len(kept))))
            except BlockingIOError:
                dropped[fd] += len(data)  # the worker is busy: counted, never waited for
                continue
            except OSError:
                return  # the worker is gone
            tokens -= len(kept)
            dropped[fd] = 0


def _argument(spec: WorkerSpec, trusted: dict[str, str] | None) -> str:
    runtime = spec.javascript
    assert runtime is not None
    return msgspec.json.encode({
        "path": spec.path,
        "trusted": trusted,  # what of its tools dir it may load, by path: SHA-256 (None: not followed)
        "cwd": spec.cwd,
        "runtime": runtime.name,
        "version": runtime.version,
        "packages": runtime.packages,
        "limits": {
            "truncateLines": spec.truncate_lines,
            "truncateBytes": spec.truncate_bytes,
            "maxResultBytes": spec.max_result_bytes,
            "spillDir": spec.spill_dir,
        },
    }).decode()


def exec_runtime(channel: int, spec: WorkerSpec, trusted: dict[str, str] | None = None) -> NoReturn:
    """Become the JavaScript runtime serving ``spec``'s module on ``channel`` (called by ``main.serve``
    once the worker is confined, before anything else runs in it). ``trusted``: in a project whose
    content is followed, the files of its tools dir it may load and their SHA-256 (its load hooks
    refuse any other bytes, ``js/content.mjs``). Never returns."""
    runtime = spec.javascript
    if runtime is None or not runtime.command:
        _fail(channel, spec, (runtime.problem if runtime is not None else "") or "no JavaScript runtime was chosen for it")
    try:
        check_writers(spec.path)
    except PermissionError as exc:
        _fail(channel, spec, str(exc), outside=False)
    except OSError:
        pass  # the runtime reads it, and says what is wrong with it
    command = list(runtime.command)
    if runtime.name == "node" and spec.memory_limit > 0:
        command.append(f"--max-old-space-size={max(16, spec.memory_limit // (1024 * 1024))}")
    env = clean_environment(dict(os.environ), runtime.packages)
    try:
        if spec.cwd:
            os.chdir(spec.cwd)
    except OSError as exc:
        _fail(channel, spec, f"cannot enter its working directory {spec.cwd}: {exc.strerror}")
    argv = [*command, WORKER_SCRIPT, _argument(spec, trusted)]
    sys.stdout.flush()
    sys.stderr.flush()
    _arrange_descriptors(channel)
    try:
        os.execve(command[0], argv, env)
    except OSError as exc:
        _fail(_CHANNEL, spec, f"cannot start {runtime.name} ({command[0]}): {exc.strerror}")
