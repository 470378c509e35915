"""Confining a tool worker on Linux: Landlock for files, TCP and signals; seccomp for the sockets
Landlock does not see.

A worker of a project trusted with ``--sandbox`` calls ``confine()`` right after the fork, while it
is still the only thread and before it imports the tool module. From then on it, and everything it
starts, can:

- read the project, the Python runtime (prefixes, ``sys.path``, the packages of this program), the
  system directories programs need (``/usr``, ``/bin``, ``/sbin``, ``/lib*``, ``/etc``), its own
  ``/proc/PID`` and a few system-wide files of ``/proc``, and a few devices (``/dev/null``, ``/dev/zero``, ``/dev/full``, ``/dev/random``, ``/dev/urandom``);
- write the project, its private temporary directory (``TMPDIR``) and its spill directory (the full
  text of truncated results), plus what the user allowed;
- not connect or bind TCP (Landlock ABI 4), nor create any socket (seccomp: UDP, raw, netlink, and
  pathname Unix sockets such as the daemon's own), unless the user allowed the network, and even
  then no Unix socket; not set up ``io_uring`` (it would create sockets past seccomp); not use the
  kernel keyrings (``keyctl``: the user's keys are not the project's);
- not signal, trace or read the memory of any process outside its own tree (Landlock scoping, ABI
  6, and Landlock's ptrace rule: each worker is a domain of its own), nor reach an abstract Unix
  socket outside it;
- not gain privileges (``no_new_privs``: set-uid programs run without them).

Rules only ever add up: a module that declares it needs less (``__atomic_sandbox__``) gets a second
layer on top after its import, never a wider one.

This module runs inside workers (standard library and ``ctypes`` only), and in the daemon for
``support()``. It never decides who is confined (the registry does); it never weakens a confinement
it cannot apply whole: ``confine()`` raises, and the worker reports a load failure instead of
running the module.
"""

from __future__ import annotations

import ctypes
import functools
import os
import stat
import sys
from collections.abc import Iterable
from typing import Any

__all__ = [
    "ABI_ENV",
    "REQUIRED_ABI",
    "SandboxError",
    "confine",
    "drop_shared_rules",
    "kernel_abi",
    "narrow",
    "open_shared_rules",
    "prepare",
    "forget_prepared",
    "runtime_read_paths",
    "support",
    "warm_up",
    "with_environment",
]

ABI_ENV = "ATOMICTOOLS_SANDBOX_ABI"  # lowers the ABI the daemon believes in (tests simulate old kernels)
REQUIRED_ABI = 6  # signal scoping; below it a tool could stop the daemon, so nothing runs

# Landlock (include/uapi/linux/landlock.h); the syscall numbers are the generic ones on every arch.
_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH, _RULE_NET_PORT = 1, 2

_EXECUTE, _WRITE_FILE, _READ_FILE, _READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_REMOVE_DIR, _REMOVE_FILE, _MAKE_CHAR, _MAKE_DIR = 1 << 4, 1 << 5, 1 << 6, 1 << 7
_MAKE_REG, _MAKE_SOCK, _MAKE_FIFO, _MAKE_BLOCK, _MAKE_SYM = 1 << 8, 1 << 9, 1 << 10, 1 << 11, 1 << 12
_REFER, _TRUNCATE, _IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15

_FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1}
_FS_ALL_LATEST = (1 << 16) - 1  # ABI 5 and later
_FILE_ONLY = _EXECUTE | _WRITE_FILE | _READ_FILE | _TRUNCATE | _IOCTL_DEV  # rights a rule on a file may hold

_READ = _EXECUTE | _READ_FILE | _READ_DIR
_WRITE = (
    _WRITE_FILE | _REMOVE_DIR | _REMOVE_FILE | _MAKE_DIR | _MAKE_REG | _MAKE_SOCK | _MAKE_FIFO | _MAKE_SYM
    | _REFER | _TRUNCATE
)
_NET_BIND_TCP, _NET_CONNECT_TCP = 1 << 0, 1 << 1
_SCOPE_ABSTRACT_UNIX, _SCOPE_SIGNAL = 1 << 0, 1 << 1

_PR_SET_NO_NEW_PRIVS = 38

SYSTEM_READ = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
# Not all of /proc: Landlock refuses another process's memory, not its environment, file list or
# command line (measured on 6.18: /proc/PID/environ of a process outside the domain reads). So the
# worker gets its own /proc/PID (added in confine()) and these system-wide files.
PROC_READ = (
    "/proc/cpuinfo", "/proc/meminfo", "/proc/stat", "/proc/loadavg", "/proc/uptime", "/proc/version",
    "/proc/filesystems", "/proc/sys",
)
DEVICES_READ = ("/dev/random", "/dev/urandom")
DEVICES_WRITE = ("/dev/null", "/dev/zero", "/dev/full")

# seccomp (linux/seccomp.h, linux/filter.h, linux/audit.h), per architecture:
# (audit arch, socket, socketpair, io_uring_setup, seccomp, first number of another ABI or None,
#  add_key/request_key/keyctl)
_ARCHES = {
    "x86_64": (0xC000003E, 41, 53, 425, 317, 0x40000000, (248, 249, 250)),  # x32 numbers have bit 30 set
    "aarch64": (0xC00000B7, 198, 199, 425, 277, None, (217, 218, 219)),
}
_AF_UNIX, _SOCK_STREAM = 1, 1
_EACCES, _EPERM = 13, 1


class SandboxError(Exception):
    """The confinement cannot be applied whole; the message says what the kernel lacks."""


@functools.cache
def _libc() -> Any:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def _syscall(number: int, *args: Any) -> int:
    result = _libc().syscall(ctypes.c_long(number), *args)
    if result < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))
    return int(result)


@functools.cache
def kernel_abi() -> int:
    """The Landlock ABI this kernel offers: 0 when none (not Linux, too old, the LSM disabled)."""
    if not sys.platform.startswith("linux") or os.uname().machine not in _ARCHES:
        return 0
    try:
        return _syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    except OSError:
        return 0


def _abi() -> int:
    """The ABI to rely on: the kernel's, or less where ``ATOMICTOOLS_SANDBOX_ABI`` says so."""
    abi = kernel_abi()
    override = os.environ.get(ABI_ENV, "").strip()
    if override.isdigit():
        abi = min(abi, int(override))
    return abi


def support() -> dict[str, Any]:
    """What this machine can enforce: ``{abi, available, reason, enforced}``; ``reason`` says why a
    sandboxed project cannot run here, when it cannot."""
    abi = _abi()
    enforced: list[str] = []
    if abi >= 1:
        enforced += ["files (read, write, execute)"]
    if abi >= 2:
        enforced += ["links and renames across directories"]
    if abi >= 3:
        enforced += ["truncate"]
    if abi >= 4:
        enforced += ["TCP bind and connect"]
    if abi >= 5:
        enforced += ["device ioctls"]
    if abi >= 6:
        enforced += ["signals and abstract Unix sockets scoped to the worker's own processes"]
    reason = None
    if not sys.platform.startswith("linux"):
        reason = f"the sandbox needs Linux with Landlock; this is {sys.platform}"
    elif os.uname().machine not in _ARCHES:
        reason = f"the sandbox's seccomp filter has no syscall table for {os.uname().machine}"
    elif abi == 0:
        reason = (
            "this kernel offers no Landlock (Linux 5.13+ with CONFIG_SECURITY_LANDLOCK and landlock in "
            "the lsm= boot list)"
        )
    elif abi < REQUIRED_ABI:
        reason = (
            f"this kernel offers Landlock ABI {abi}; the sandbox needs ABI {REQUIRED_ABI} (Linux 6.12+) "
            "to keep a tool from signalling processes outside its own"
        )
    if reason is None:
        enforced += ["sockets other than TCP (seccomp)", "no new privileges"]
    return {"abi": abi, "available": reason is None, "reason": reason, "enforced": enforced}


def runtime_read_paths() -> list[str]:
    """The Python runtime a worker needs to read: prefixes, ``sys.path`` and this program's packages.

    Computed in the fork server (before any project directory is on ``sys.path``) and handed to
    every confined worker it forks.
    """
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    paths.add(os.path.dirname(os.path.realpath(sys.executable)))
    paths.add(os.path.dirname(os.path.dirname(os.path.realpath(sys.executable))))
    paths.update(p for p in sys.path if p)
    for name in ("atomictools", "atomictoolsd", "msgspec"):
        module = sys.modules.get(name)
        if module is not None and getattr(module, "__file__", None):
            paths.add(os.path.dirname(os.path.dirname(os.path.realpath(module.__file__))))
    return sorted(p for p in paths if os.path.isabs(p) and os.path.exists(p))


# -- Landlock ------------------------------------------------------------------------------------


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _landlock(
    abi: int, read: Iterable[str], write: Iterable[str], net: bool, scope: bool = True,
    opened: Iterable[tuple[int, int]] = (),
) -> None:
    ruleset = _ruleset(abi, read, write, net, scope, opened)
    try:
        _restrict(ruleset)
    finally:
        os.close(ruleset)


def _ruleset(
    abi: int, read: Iterable[str], write: Iterable[str], net: bool, scope: bool = True,
    opened: Iterable[tuple[int, int]] = (),
) -> int:
    """A Landlock ruleset (its descriptor) holding these rules; not applied yet."""
    fs = _FS_BY_ABI.get(abi, _FS_ALL_LATEST)
    attr = _RulesetAttr(fs, 0, 0)
    size = 8
    if abi >= 4:
        size = 16
        if not net:
            attr.handled_access_net = _NET_BIND_TCP | _NET_CONNECT_TCP  # no rule: no port at all
    if abi >= 6:
        size = 24
        if scope:
            attr.scoped = _SCOPE_ABSTRACT_UNIX | _SCOPE_SIGNAL
    ruleset = _syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    try:
        rights: dict[str, int] = {}
        for path in read:
            rights[path] = rights.get(path, 0) | _READ
        for path in write:
            rights[path] = rights.get(path, 0) | _READ | _WRITE
        for path, access in rights.items():
            _add_path(ruleset, path, access & fs)
        if opened is _STATIC:
            _add_shared(ruleset, fs)
        else:
            for fd, access in opened:
                _add_fd(ruleset, fd, access & fs)
    except BaseException:
        os.close(ruleset)
        raise
    return ruleset


def _restrict(ruleset: int) -> None:
    if _libc().prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise SandboxError(f"cannot set no_new_privs: {os.strerror(ctypes.get_errno())}")
    _syscall(_SYS_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0))


def _add_path(ruleset: int, path: str, access: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return  # what does not exist cannot be read through a rule either
    try:
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            access &= _FILE_ONLY
        _add_fd(ruleset, fd, access)
    finally:
        os.close(fd)


def _add_fd(ruleset: int, fd: int, access: int) -> None:
    rule = _PathBeneath(access, fd)
    _syscall(_SYS_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(_RULE_PATH_BENEATH), ctypes.byref(rule),
             ctypes.c_uint32(0))


# The rules every confined worker shares (system dirs, devices, the runtime), opened once by the fork
# server: each worker inherits the descriptors, uses them and closes its copies, so its own set-up
# opens only its project's paths (measured: about half of the set-up's time otherwise).
_STATIC: list[tuple[int, int]] = []
_STATIC_FOR: list[str] = []


# The shared rules' arguments to landlock_add_rule, by the access rights handled, built once: the
# ruleset they go to is in _TO_RULESET. The fork server adds them for every confined worker.
_STATIC_ARGS: dict[int, list[tuple[Any, ...]]] = {}
_TO_RULESET: list[Any] = []


def _add_shared(ruleset: int, fs: int) -> None:
    args = _STATIC_ARGS.get(fs)
    if args is None:
        if not _TO_RULESET:
            _TO_RULESET.append(ctypes.c_int(-1))
        args = _STATIC_ARGS[fs] = [
            (ctypes.c_long(_SYS_ADD_RULE), _TO_RULESET[0], ctypes.c_int(_RULE_PATH_BENEATH),
             ctypes.byref(_PathBeneath(access & fs, fd)), ctypes.c_uint32(0))  # byref keeps the rule alive
            for fd, access in _STATIC
        ]
    _TO_RULESET[0].value = ruleset
    syscall = _libc().syscall
    for arguments in args:
        if syscall(*arguments) < 0:
            errno = ctypes.get_errno()
            raise OSError(errno, os.strerror(errno))


def open_shared_rules(runtime: list[str]) -> None:
    """Open the paths every confined worker reads or writes, once (in the fork server)."""
    if _STATIC_FOR == runtime and _STATIC:
        return
    for fd, _ in _STATIC:
        os.close(fd)
    _STATIC.clear()
    _STATIC_ARGS.clear()
    rights: dict[str, int] = {}
    for path in (*SYSTEM_READ, *PROC_READ, *DEVICES_READ, *runtime):
        rights[path] = rights.get(path, 0) | _READ
    for path in DEVICES_WRITE:
        rights[path] = rights.get(path, 0) | _READ | _WRITE
    # A rule covers everything beneath it: one beneath another with no more rights adds nothing but
    # a system call per worker (the runtime's paths: sys.prefix holds its lib dir and site-packages).
    real = {path: os.path.realpath(path) for path in rights}
    rights = {
        path: access for path, access in rights.items()
        if not any(other != path and real[path].startswith(real[other].rstrip("/") + "/")
                   and access & ~rights[other] == 0 for other in rights)
    }
    for path, access in rights.items():
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            continue
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            access &= _FILE_ONLY
        _STATIC.append((fd, access))
    _STATIC_FOR[:] = runtime


def drop_shared_rules() -> None:
    """Close this process's copies of the shared rules' descriptors (in a worker, confined or not).

    The rules' ``ctypes`` arguments (``_STATIC_ARGS``) stay: freeing them would write to the fork
    server's pages, each first write a page copied (measured: ~10 page faults, 30 µs per worker), and
    with ``_STATIC_FOR`` empty nothing uses them again (``open_shared_rules`` builds them anew)."""
    fds = sorted(fd for fd, _ in _STATIC)
    if fds and fds[-1] - fds[0] + 1 == len(fds):
        os.closerange(fds[0], fds[-1] + 1)  # one call: they were opened one after another
    else:
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass
    _STATIC.clear()
    _STATIC_FOR.clear()


# -- seccomp -------------------------------------------------------------------------------------


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_SockFilter))]


_LD_W_ABS, _JEQ, _JGE, _RET, _AND = 0x20, 0x15, 0x35, 0x06, 0x54
_ALLOW = 0x7FFF0000
_ERRNO = 0x00050000


def _seccomp_program(net: bool) -> list[tuple[int, int | str, int | str, int]]:
    """The filter, as (code, jump if true, jump if false, k) with jumps to labels ("deny", …)."""
    arch, sys_socket, sys_socketpair, sys_io_uring, _, foreign, keys = _ARCHES[os.uname().machine]
    program: list[tuple[int, int | str, int | str, int]] = [
        (_LD_W_ABS, 0, 0, 4),  # seccomp_data.arch: a 32-bit syscall would use another table
        (_JEQ, 0, "deny", arch),
        (_LD_W_ABS, 0, 0, 0),  # seccomp_data.nr
    ]
    if foreign is not None:
        program.append((_JGE, "deny", 0, foreign))
    # The kernel keyrings are the user's, not the directory's: Landlock does not mediate them.
    program += [(_JEQ, "deny", 0, number) for number in keys]
    program += [
        (_JEQ, "deny", 0, sys_io_uring),
        (_JEQ, "socket", 0, sys_socket),
        (_JEQ, "socketpair", 0, sys_socketpair),
        (_RET, 0, 0, _ALLOW),
        ("socket",),  # type: ignore[list-item]
    ]
    if net:
        program += [(_LD_W_ABS, 0, 0, 16), (_JEQ, "refuse", 0, _AF_UNIX), (_RET, 0, 0, _ALLOW)]
    else:
        program += [(_RET, 0, 0, _ERRNO | _EACCES)]
    program += [
        ("socketpair",),  # type: ignore[list-item]
        # A connected stream pair is what Python needs (asyncio's self-pipe); a datagram one could
        # sendto() a named socket.
        (_LD_W_ABS, 0, 0, 16), (_JEQ, 0, "refuse", _AF_UNIX),
        (_LD_W_ABS, 0, 0, 24), (_AND, 0, 0, 0xF), (_JEQ, 0, "refuse", _SOCK_STREAM),
        (_RET, 0, 0, _ALLOW),
        ("refuse",),  # type: ignore[list-item]
        (_RET, 0, 0, _ERRNO | _EACCES),
        ("deny",),  # type: ignore[list-item]
        (_RET, 0, 0, _ERRNO | _EPERM),
    ]
    return program


def _assemble(program: list[Any]) -> list[tuple[int, int, int, int]]:
    labels: dict[str, int] = {}
    code: list[tuple[int, Any, Any, int]] = []
    for item in program:
        if len(item) == 1:
            labels[item[0]] = len(code)
        else:
            code.append(item)
    out = []
    for index, (op, jt, jf, k) in enumerate(code):
        jt = labels[jt] - index - 1 if isinstance(jt, str) else jt
        jf = labels[jf] - index - 1 if isinstance(jf, str) else jf
        out.append((op, jt, jf, k))
    return out


@functools.cache
def _filter(net: bool) -> tuple[Any, Any]:
    code = _assemble(_seccomp_program(net))
    filters = (_SockFilter * len(code))(*(_SockFilter(*c) for c in code))
    return filters, _SockFprog(len(code), filters)


def _seccomp(net: bool) -> None:
    sys_seccomp = _ARCHES[os.uname().machine][4]
    _filters, prog = _filter(net)
    # SECCOMP_SET_MODE_FILTER with SECCOMP_FILTER_FLAG_TSYNC: every thread, or none.
    _syscall(sys_seccomp, ctypes.c_uint(1), ctypes.c_uint(1), ctypes.byref(prog))


def warm_up() -> None:
    """Do once, in the fork server, what every confined worker would otherwise do after its fork."""
    kernel_abi()
    _libc()
    _filter(False)
    _filter(True)


# -- applying it ---------------------------------------------------------------------------------


def confine(policy: dict[str, Any], runtime: Iterable[str], temp_dir: str, spill_dir: str) -> None:
    """Confine this process (and all it will start) to ``policy``; raise ``SandboxError`` if any part
    of it cannot be applied.

    Args:
        policy: ``{"read": [dirs], "write": [dirs], "net": bool}`` from the daemon (the project root
            is in both lists; the user's widening is in them too), and ``"env"``: variables the
            daemon tells the worker (a built-in's project trust, which it cannot read itself).
        runtime: the Python runtime's paths (``runtime_read_paths`` of the fork server).
        temp_dir: the worker's private temporary directory; it becomes ``TMPDIR``.
        spill_dir: where this worker may write the full text of truncated results.
    """
    # Looked up, not popped: the worker never frees it, for the same reason (``drop_shared_rules``).
    prepared = _PREPARED.get((id(policy), temp_dir, spill_dir))
    if prepared is not None:
        # Made by the fork server for this very worker, right before the fork that made it: one
        # thread (fork copies only the caller), the kernel checked, TMPDIR and the policy's
        # variables set; what is left are its own /proc/PID and the system calls that apply it.
        try:
            prepared.apply()
        except OSError as exc:
            raise SandboxError(f"cannot confine the worker: {exc}") from None
        finally:
            prepared.close()
            drop_shared_rules()  # this worker's copies; the fork server keeps its own
        return
    abi = _abi()
    if abi < REQUIRED_ABI or os.uname().machine not in _ARCHES:
        raise SandboxError(support()["reason"] or "the sandbox is not available")
    if len(os.listdir("/proc/self/task")) != 1:
        # Landlock binds the calling thread only: a thread started before would stay free.
        raise SandboxError("a worker must be confined before it starts a thread")
    os.environ.update(policy.get("env") or {})
    os.environ["TMPDIR"] = temp_dir
    import tempfile  # noqa: PLC0415 - already imported in the fork server; the cache must forget /tmp

    tempfile.tempdir = None
    runtime = list(runtime)
    read, write = _rules(policy, runtime, temp_dir, spill_dir, f"/proc/{os.getpid()}")  # its own /proc/self only
    try:
        _landlock(abi, read, write, bool(policy.get("net")), opened=_STATIC if _STATIC_FOR == runtime else ())
        _seccomp(bool(policy.get("net")))
    except OSError as exc:
        raise SandboxError(f"cannot confine the worker: {exc}") from None
    finally:
        drop_shared_rules()  # this worker's copies; the fork server keeps its own


def _rules(
    policy: dict[str, Any], runtime: list[str], temp_dir: str, spill_dir: str, *extra_read: str,
) -> tuple[list[str], list[str]]:
    """The paths a confined worker reads and writes, but for the shared rules the fork server opened
    (``open_shared_rules``) when they are open for this runtime."""
    read = [*extra_read, *policy.get("read", ())]
    write = [temp_dir, spill_dir, *policy.get("write", ())]
    if not (_STATIC and _STATIC_FOR == runtime):
        read += [*SYSTEM_READ, *PROC_READ, *DEVICES_READ, *runtime]
        write += DEVICES_WRITE
    return read, write


class _Prepared:
    """A worker's confinement made ready by the fork server before the fork: the ruleset with every
    rule but the worker's own ``/proc/PID`` (its PID is not known yet), the system calls' arguments,
    ``TMPDIR`` and the policy's variables.

    After the fork, each first touch of a page of the worker's memory copies it (measured on this
    machine: a first ctypes call ~150 µs there, ~2 µs again); so the worker runs as little Python as
    it can: its own rule, no_new_privs, restrict_self, the seccomp filter.
    """

    def __init__(self, ruleset: int, abi: int, policy: dict[str, Any], temp_dir: str) -> None:
        import tempfile  # noqa: PLC0415 - in the fork server, which has it imported already

        libc = _libc()
        self.syscall = libc.syscall
        self.prctl = libc.prctl
        self.ruleset = ruleset
        self.rule = _PathBeneath(_READ & _FS_BY_ABI.get(abi, _FS_ALL_LATEST), -1)
        self.add_rule = (ctypes.c_long(_SYS_ADD_RULE), ctypes.c_int(ruleset), ctypes.c_int(_RULE_PATH_BENEATH),
                         ctypes.byref(self.rule), ctypes.c_uint32(0))
        self.restrict = (ctypes.c_long(_SYS_RESTRICT_SELF), ctypes.c_int(ruleset), ctypes.c_uint32(0))
        _filters, prog = _filter(bool(policy.get("net")))
        self.seccomp = (ctypes.c_long(_ARCHES[os.uname().machine][4]), ctypes.c_uint(1), ctypes.c_uint(1),
                        ctypes.byref(prog))
        env = {**(policy.get("env") or {}), "TMPDIR": temp_dir}
        self.saved_env = {name: os.environ.get(name) for name in env}
        self.saved_tempdir = tempfile.tempdir
        os.environ.update(env)  # the worker inherits it; the fork server puts its own back (close)
        tempfile.tempdir = None  # the cache must forget /tmp

    def apply(self) -> None:
        """In the worker: its own /proc/PID, then apply it all."""
        fd = os.open(f"/proc/{os.getpid()}", os.O_PATH | os.O_CLOEXEC)
        try:
            self.rule.parent_fd = fd
            self._call(self.syscall(*self.add_rule))
        finally:
            os.close(fd)
        if self.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise SandboxError(f"cannot set no_new_privs: {os.strerror(ctypes.get_errno())}")
        self._call(self.syscall(*self.restrict))
        # SECCOMP_SET_MODE_FILTER with SECCOMP_FILTER_FLAG_TSYNC: every thread, or none.
        self._call(self.syscall(*self.seccomp))

    @staticmethod
    def _call(result: int) -> None:
        if result < 0:
            errno = ctypes.get_errno()
            raise OSError(errno, os.strerror(errno))

    def close(self) -> None:
        os.close(self.ruleset)

    def restore(self) -> None:
        """In the fork server, once the worker is forked: its own environment back."""
        import tempfile  # noqa: PLC0415 - in the fork server, which has it imported already

        self.close()
        for name, value in self.saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        tempfile.tempdir = self.saved_tempdir


# The confinement the fork server made ready for the worker it forks next, by (the policy's id, the
# temp dir, the spill dir): the worker's confine() with the same objects finds it.
_PREPARED: dict[tuple[int, str, str], _Prepared] = {}


def prepare(policy: dict[str, Any], runtime: list[str], temp_dir: str, spill_dir: str) -> None:
    """Make the next worker's confinement ready, in the fork server, before the fork (``_Prepared``);
    ``forget_prepared`` once forked. Where it cannot be made here, the worker makes it itself (and
    says why it cannot, if it cannot either)."""
    forget_prepared()
    abi = _abi()
    if abi < REQUIRED_ABI or os.uname().machine not in _ARCHES:
        return
    try:
        ruleset = _ruleset(abi, *_rules(policy, runtime, temp_dir, spill_dir), bool(policy.get("net")),
                           opened=_STATIC if _STATIC_FOR == runtime else ())
    except OSError:
        return
    _PREPARED[(id(policy), temp_dir, spill_dir)] = _Prepared(ruleset, abi, policy, temp_dir)


def forget_prepared() -> None:
    """In the fork server, once the worker is forked (or the fork failed): close the prepared
    ruleset and put the fork server's own environment back."""
    while _PREPARED:
        _PREPARED.popitem()[1].restore()


def with_environment(policy: dict[str, Any], paths: Iterable[str]) -> dict[str, Any]:
    """``policy`` with the directories of a worker's environment readable (``WorkerSpec.env``: the
    packages it declares, the project's own environment): what it imports from. Never written: a
    directory of a policy's ``project`` (its ``.venv``) is added to what stays read-only in it
    (``protect``) too, where the policy names its project. ``policy`` itself is left as it is."""
    read = list(policy.get("read", ()))
    protect = list(policy.get("protect", ()))
    project = policy.get("project")
    for path in paths:
        real = os.path.realpath(path)
        if real not in read:
            read.append(real)
        if isinstance(project, str) and real.startswith(project.rstrip("/") + "/"):
            inside = os.path.relpath(real, project)
            if inside not in protect:
                protect.append(inside)
    widened = {**policy, "read": read}
    if protect:
        widened["protect"] = protect
    return widened


def narrow(declared: Any, policy: dict[str, Any], temp_dir: str, spill_dir: str) -> list[str]:
    """Apply what a tool module declares it needs less of (``__atomic_sandbox__``) as one more layer;
    return the narrowings applied. A key that would widen anything is ignored: layers only restrict.

    Known keys: ``"write": False`` (no writes but its temporary and spill directories), ``"net": False``.
    """
    if not isinstance(declared, dict):
        raise SandboxError("__atomic_sandbox__ must be a dict such as {'write': False, 'net': False}")
    unknown = set(declared) - {"write", "net"}
    if unknown:
        raise SandboxError(f"__atomic_sandbox__ has unknown keys {sorted(unknown)}; known: 'write', 'net'")
    applied = []
    no_write = declared.get("write") is False
    no_net = declared.get("net") is False and bool(policy.get("net"))
    if no_write or no_net:
        everything = ["/"]
        write = [*DEVICES_WRITE, temp_dir, spill_dir] if no_write else ["/"]
        try:
            _landlock(_abi(), everything, write, net=not no_net, scope=False)
            if no_net:
                _seccomp(False)
        except OSError as exc:
            raise SandboxError(f"cannot narrow the worker's sandbox: {exc}") from None
        applied = [k for k, on in (("write", no_write), ("net", no_net)) if on]
    return applied
