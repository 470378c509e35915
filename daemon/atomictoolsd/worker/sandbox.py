"""Confining a tool worker on Linux: Landlock for files, TCP and signals; seccomp for the sockets
Landlock does not see.

A worker of a project trusted with ``--sandbox`` calls ``confine()`` right after the fork, while it
is still the only thread and before it imports the tool module. From then on it, and everything it
starts, can:

- read the project, the Python runtime (prefixes, ``sys.path``, the packages of this program), the
  system directories programs need (``/usr``, ``/bin``, ``/sbin``, ``/lib*``, ``/etc``), its own
  ``/proc/PID`` and a few system-wide files of ``/proc``, and a few devices (``/dev/null``, ``/dev/zero``, ``/dev/full``, ``/dev/random``, ``/dev/urandom``);
- write the project but what others execute (``PROTECTED``: git's directory and config, agents' and
  editors' configs, ``.envrc``, the tools dir itself; and the ``.git`` of every submodule the
  repository's index names), its private temporary directory (``TMPDIR``) and its spill directory
  (the full text of truncated results), plus what the user allowed. Landlock cannot take an
  exception out of a writable tree, so a tree holding a protected entry is granted entry by entry
  (``_add_split``): each other entry written whole, the tree's own directory read only, so that
  nothing can be created, removed or renamed in it, a protected name that is not there included;
- not connect or bind TCP (Landlock ABI 4), nor create any socket (seccomp: UDP, raw, netlink, and
  pathname Unix sockets such as the daemon's own); where the user allowed the network, it runs in a
  network namespace of its own (``netns``, set up before this) and may create sockets, but connect
  only to the daemon's proxy port there and create no Unix socket; not set up ``io_uring`` (it would
  create sockets past seccomp); not use the kernel keyrings (``keyctl``: the user's keys are not the
  project's);
- not signal, trace or read the memory of any process outside its own tree (Landlock scoping, ABI
  6, and Landlock's ptrace rule: each worker is a domain of its own), nor reach an abstract Unix
  socket outside it;
- not gain privileges (``no_new_privs``: set-uid programs run without them), nor keep any: a worker
  of a daemon run as root drops every capability, the bounding set included; not make a file set-uid
  or set-gid, nor let others write it (``chmod``; seccomp), nor set extended attributes (an ACL).

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

from atomictoolsd.worker.gitindex import submodule_git_dirs
from atomictoolsd.worker.netns import PROXY_PORT

__all__ = [
    "BASE_ENV",
    "PROTECTED",
    "REQUIRED_ABI",
    "SandboxError",
    "confine",
    "drop_bounding_set",
    "drop_shared_rules",
    "kernel_abi",
    "limit_abi",
    "narrow",
    "open_shared_rules",
    "prepare",
    "forget_prepared",
    "runtime_read_paths",
    "support",
    "warm_up",
    "with_environment",
    "worker_environ",
]

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

# What others execute, kept read-only in a project (names at its root; compared case-insensitively):
# git's directory (config: core.fsmonitor, hooks) and its submodule list, the other version
# controls', the configs that agents and editors run commands from (MCP servers, hooks, tasks run on
# open: every project config of ``atomictools._paths.PROJECT_MARKERS``), direnv's, the commit hooks'
# managers, and this program's tools dir. The user adds more (``sandbox_protect``, ``trust
# --protect``); a repository can take none away.
PROTECTED = (
    ".git", ".gitmodules", ".hg", ".jj", ".envrc", ".mcp.json", ".claude", ".gemini", ".qwen", ".codex", ".cursor",
    ".opencode", "opencode.json", "opencode.jsonc", ".vscode", ".idea", ".devcontainer", ".husky",
    ".pre-commit-config.yaml", ".atomic",
)

# The variables a confined worker takes from the daemon's environment: what programs need to run
# (where they are, who and where the user is, the locale and the terminal), none that names a
# secret; and every ``LC_*``. Anything else only by name (``sandbox_allow_env``, ``--allow-env``).
BASE_ENV = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TERM", "COLORTERM", "NO_COLOR", "TZ",
    "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME",
})

# seccomp (linux/seccomp.h, linux/filter.h, linux/audit.h), per architecture:
# (audit arch, socket, socketpair, io_uring_setup, seccomp, first number of another ABI or None,
#  add_key/request_key/keyctl)
_ARCHES = {
    "x86_64": (0xC000003E, 41, 53, 425, 317, 0x40000000, (248, 249, 250)),  # x32 numbers have bit 30 set
    "aarch64": (0xC00000B7, 198, 199, 425, 277, None, (217, 218, 219)),
}
_AF_UNIX, _SOCK_STREAM = 1, 1
_EACCES, _EPERM, _ENOSYS = 13, 1, 38

# Per architecture, the calls that touch a file's mode or attributes (seccomp; Landlock mediates
# neither): those that set a mode ((number, index of the mode argument)), that create a file with
# one, that open with flags (the index of the flags; the mode follows), that set or remove extended
# attributes (an ACL grants as a mode does), and openat2, whose mode the filter cannot see.
_FILE_CALLS = {
    "x86_64": {
        "chmod": ((90, 1), (91, 1), (268, 2), (452, 2)),  # chmod, fchmod, fchmodat, fchmodat2
        "make": ((85, 1), (133, 1), (259, 2)),  # creat, mknod, mknodat
        "open": ((2, 1), (257, 2)),  # open, openat
        "xattr": (188, 189, 190, 197, 198, 199, 463, 466),
        "openat2": 437,
    },
    "aarch64": {
        "chmod": ((52, 1), (53, 2), (452, 2)),
        "make": ((33, 2),),
        "open": ((56, 2),),
        "xattr": (5, 6, 7, 14, 15, 16, 463, 466),
        "openat2": 437,
    },
}
_SET_ID, _OTHERS_WRITE = 0o6000, 0o0002
_O_CREAT, _O_TMPFILE = 0o100, 0o20000000  # the same on both


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


# The highest ABI the daemon and the CLI rely on (``sandbox_abi`` of the user's configuration, for
# testing a lower kernel); -1: the kernel's. A worker is told in its policy (``"abi"``).
_ABI_LIMIT = [-1]


def limit_abi(abi: int) -> None:
    """Rely on at most Landlock ABI ``abi`` (0: none at all; -1: on what the kernel offers)."""
    _ABI_LIMIT[0] = abi


def _abi(policy: dict[str, Any] | None = None) -> int:
    """The ABI to rely on: the kernel's, or less where the configuration (``limit_abi``) or a
    worker's policy says so."""
    abi = kernel_abi()
    for limit in (_ABI_LIMIT[0], (policy or {}).get("abi", -1)):
        if limit >= 0:
            abi = min(abi, int(limit))
    return abi


def worker_environ(environ: dict[str, str]) -> dict[str, str]:
    """What of ``environ`` a confined worker may see (``BASE_ENV``, ``LC_*``)."""
    return {key: value for key, value in environ.items() if key in BASE_ENV or key.startswith("LC_")}


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
        enforced += ["sockets other than TCP and new namespaces (seccomp)", "no new privileges"]
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
    opened: Iterable[tuple[int, int]] = (), split: dict[str, _Tree] | None = None,
) -> int:
    """A Landlock ruleset (its descriptor) holding these rules; not applied yet. ``split``: the
    writable trees that hold a protected entry, each granted entry by entry (``_add_split``)."""
    fs = _FS_BY_ABI.get(abi, _FS_ALL_LATEST)
    attr = _RulesetAttr(fs, 0, 0)
    size = 8
    if abi >= 4:
        size = 16
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
        if net and abi >= 4:
            _add_proxy_port(ruleset)
        for root, tree in (split or {}).items():
            _add_split(ruleset, root, tree, fs)
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


class _NetPort(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("port", ctypes.c_uint64)]


def _add_proxy_port(ruleset: int) -> None:
    """The one TCP port a worker with the network may connect to: the daemon's proxy, in the
    worker's own network namespace (``netns``); it binds none."""
    rule = _NetPort(_NET_CONNECT_TCP, PROXY_PORT)
    _syscall(_SYS_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(_RULE_NET_PORT), ctypes.byref(rule), ctypes.c_uint32(0))


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


# -- protected entries ---------------------------------------------------------------------------

# A writable tree's protected entries as a tree of (case-folded) names: None marks a protected entry,
# a dict a directory on the way to one. Everything else in the tree is written whole.
_Tree = dict[str, Any]
_UNPROTECTED: Any = object()


def _writable(write: Iterable[str], project: str | None, protect: Iterable[str]) -> tuple[list[str], dict[str, _Tree]]:
    """The writable directories ``write``, split: those written whole, and those that hold a
    protected entry of ``project`` (``protect``, relative to it, and the ``.git`` of each submodule
    its repository's index lists), each with the tree of what it protects."""
    if not project:
        return list(write), {}
    protected = [os.path.join(project, path) for path in protect] + submodule_git_dirs(project)
    unprotected: list[str] = []
    split: dict[str, _Tree] = {}
    for root in write:
        prefix = root.rstrip("/") + "/"
        inside = [os.path.relpath(path, root) for path in protected if path.startswith(prefix)]
        if inside:
            split[root] = _tree(inside)
        else:
            unprotected.append(root)  # outside the project, or a protected entry the user allowed by name
    return unprotected, split


def _tree(paths: Iterable[str]) -> _Tree:
    tree: _Tree = {}
    for path in paths:
        parts = [part.casefold() for part in path.split("/") if part not in ("", ".")]
        if not parts or ".." in parts:
            continue
        node: _Tree | None = tree
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if node is None:
                break  # beneath an entry protected whole
        else:
            node[parts[-1]] = None
    return tree


def _add_split(ruleset: int, root: str, tree: _Tree, fs: int) -> None:
    """Grant the entries of ``root`` one by one: each written whole but those ``tree`` protects and
    the directories on the way to them, whose entries are granted so in turn. ``root`` itself and
    those directories are not written (their rules are read rules above them): nothing can be
    created, removed or renamed there, so no protected name can be made, nor an entry moved over one.
    A symlink is not followed: its target is not granted."""
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        _add_entries(ruleset, fd, tree, fs)
    finally:
        os.close(fd)


def _add_entries(ruleset: int, directory: int, tree: _Tree, fs: int) -> None:
    for name in os.listdir(directory):
        below = tree.get(name.casefold(), _UNPROTECTED)
        if below is None:
            continue  # protected: read, as what is above it
        flags = os.O_PATH if below is _UNPROTECTED else os.O_RDONLY | os.O_DIRECTORY
        try:
            fd = os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=directory)
        except OSError:
            continue  # gone, or a symlink on the way to a protected entry
        try:
            mode = os.fstat(fd).st_mode
            if below is not _UNPROTECTED:
                _add_entries(ruleset, fd, below, fs)
            elif stat.S_ISDIR(mode):
                _add_fd(ruleset, fd, (_READ | _WRITE) & fs)
            elif stat.S_ISREG(mode):
                _add_fd(ruleset, fd, (_READ | _WRITE) & _FILE_ONLY & fs)
        finally:
            os.close(fd)


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
    program += _namespace_checks()
    program += [
        (_JEQ, "deny", 0, sys_io_uring),
        (_JEQ, "socket", 0, sys_socket),
        (_JEQ, "socketpair", 0, sys_socketpair),
        *_file_dispatch(),
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
        *_file_checks(),
        ("refuse",),  # type: ignore[list-item]
        (_RET, 0, 0, _ERRNO | _EACCES),
        ("deny",),  # type: ignore[list-item]
        (_RET, 0, 0, _ERRNO | _EPERM),
        *_namespace_verdicts(),
    ]
    return program


# clone, clone3, unshare, setns by architecture; the CLONE_NEW* flags (linux/sched.h).
_NAMESPACE_CALLS = {"x86_64": (56, 435, 272, 308), "aarch64": (220, 435, 97, 268)}
_CLONE_NEW_ANY = 0x7E020000  # NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET
_ENOSYS = 38


def _namespace_checks() -> list[tuple[Any, ...]]:
    """No new namespace, nor joining one: a user namespace hands its maker every capability in it,
    and with them kernel code (netfilter, mounts) no confined tool needs. A worker allowed the
    network made its own namespaces before this filter (``netns.isolate``). ``clone3`` passes its
    flags in memory a filter cannot read: it answers ENOSYS, and the C library falls back to
    ``clone``, whose flags it can."""
    sys_clone, sys_clone3, sys_unshare, sys_setns = _NAMESPACE_CALLS[os.uname().machine]
    return [
        (_JEQ, "deny", 0, sys_unshare),
        (_JEQ, "deny", 0, sys_setns),
        (_JEQ, "clone3", 0, sys_clone3),
        (_JEQ, "clone_flags", 0, sys_clone),
    ]


def _namespace_verdicts() -> list[tuple[Any, ...]]:
    return [
        ("clone_flags",),
        (_LD_W_ABS, 0, 0, 16), (_AND, 0, 0, _CLONE_NEW_ANY),  # the flags: the low half of the first argument
        (_JEQ, 0, 1, 0),
        (_RET, 0, 0, _ALLOW),
        (_RET, 0, 0, _ERRNO | _EPERM),
        ("clone3",),
        (_RET, 0, 0, _ERRNO | _ENOSYS),
    ]


def _file_dispatch() -> list[Any]:
    """The file calls the filter looks at (``_FILE_CALLS``), each sent to its check."""
    calls = _FILE_CALLS[os.uname().machine]
    return [
        *[(_JEQ, f"chmod{arg}", 0, number) for number, arg in calls["chmod"]],
        *[(_JEQ, f"make{arg}", 0, number) for number, arg in calls["make"]],
        *[(_JEQ, f"open{arg}", 0, number) for number, arg in calls["open"]],
        *[(_JEQ, "deny", 0, number) for number in calls["xattr"]],
        (_JEQ, "nosys", 0, calls["openat2"]),  # ENOSYS: callers fall back on openat, which is checked
    ]


def _file_checks() -> list[Any]:
    """What a confined tool may not do to a file's mode, whichever file (Landlock does not mediate
    it): make it set-uid or set-gid (anyone who runs it would run as the user, outside the sandbox),
    nor, by ``chmod``, writable by every user (a protected entry handed to anyone)."""

    def arg(index: int) -> tuple[int, int, int, int]:
        return (_LD_W_ABS, 0, 0, 16 + 8 * index)  # seccomp_data.args[index], its low 32 bits (little-endian)

    always = "chmod_mode"
    return [
        ("chmod1",), arg(1), (_JEQ, always, always, 0),
        ("chmod2",), arg(2), (_JEQ, always, always, 0),
        (always,), (_AND, 0, 0, _SET_ID | _OTHERS_WRITE), (_JEQ, "allowed", "deny", 0),
        # Opening creates a file only with O_CREAT or O_TMPFILE: only then is its mode looked at.
        ("open1",), arg(1), (_AND, 0, 0, _O_CREAT | _O_TMPFILE), (_JEQ, "allowed", "make2", 0),
        ("open2",), arg(2), (_AND, 0, 0, _O_CREAT | _O_TMPFILE), (_JEQ, "allowed", "make3", 0),
        ("make1",), arg(1), (_JEQ, "new_mode", "new_mode", 0),
        ("make2",), arg(2), (_JEQ, "new_mode", "new_mode", 0),
        ("make3",), arg(3), (_JEQ, "new_mode", "new_mode", 0),
        ("new_mode",), (_AND, 0, 0, _SET_ID), (_JEQ, "allowed", "deny", 0),
        ("allowed",), (_RET, 0, 0, _ALLOW),
        ("nosys",), (_RET, 0, 0, _ERRNO | _ENOSYS),
    ]


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
        policy: from the daemon: ``"read"`` and ``"write"``, the directories (and files) it reads and
            writes, the user's widening included; ``"project"``, the project root (written but for
            its protected entries, ``"protect"``, relative to it); ``"net"``; ``"env"``, variables
            the daemon tells it (a built-in's project trust, which it cannot read itself);
            ``"gitconfig"``, the text of the git configuration it gets (``GIT_CONFIG_GLOBAL``), and
            ``"abi"``, the highest Landlock ABI to rely on, where the user's configuration says so.
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
    abi = _abi(policy)
    if abi < REQUIRED_ABI or os.uname().machine not in _ARCHES:
        raise SandboxError(support()["reason"] or "the sandbox is not available")
    if len(os.listdir("/proc/self/task")) != 1:
        # Landlock binds the calling thread only: a thread started before would stay free.
        raise SandboxError("a worker must be confined before it starts a thread")
    try:
        os.environ.update(_worker_env(policy, temp_dir))
        import tempfile  # lazy: already imported in the fork server; the cache must forget /tmp

        tempfile.tempdir = None
        runtime = list(runtime)
        read, write, split = _rules(policy, runtime, temp_dir, spill_dir, f"/proc/{os.getpid()}")  # its own /proc/self only
        ruleset = _ruleset(abi, read, write, bool(policy.get("net")),
                           opened=_STATIC if _STATIC_FOR == runtime else (), split=split)
        try:
            if _capabilities_held():
                _drop_capabilities()
            _restrict(ruleset)
        finally:
            os.close(ruleset)
        _seccomp(bool(policy.get("net")))
    except OSError as exc:
        raise SandboxError(f"cannot confine the worker: {exc}") from None
    finally:
        drop_shared_rules()  # this worker's copies; the fork server keeps its own


def _rules(
    policy: dict[str, Any], runtime: list[str], temp_dir: str, spill_dir: str, *extra_read: str,
) -> tuple[list[str], list[str], dict[str, _Tree]]:
    """The paths a confined worker reads and writes whole, and the writable trees it is granted entry
    by entry (``_writable``), but for the shared rules the fork server opened
    (``open_shared_rules``) when they are open for this runtime."""
    read = [*extra_read, *policy.get("read", ())]
    unprotected, split = _writable(policy.get("write", ()), policy.get("project"), policy.get("protect", ()))
    write = [temp_dir, spill_dir, *unprotected]
    if not (_STATIC and _STATIC_FOR == runtime):
        read += [*SYSTEM_READ, *PROC_READ, *DEVICES_READ, *runtime]
        write += DEVICES_WRITE
    return read, write, split


def _worker_env(policy: dict[str, Any], temp_dir: str) -> dict[str, str]:
    """The variables a confined worker gets beyond the fork server's own: the policy's, ``TMPDIR``,
    and ``GIT_CONFIG_GLOBAL`` naming the copy of the user's git configuration it is given (written
    into its temporary directory), so that git reads neither the user's own (credentials, which it
    could not read anyway) nor fails on it."""
    env = {**(policy.get("env") or {}), "TMPDIR": temp_dir}
    text = policy.get("gitconfig")
    if text is not None:
        path = os.path.join(temp_dir, "gitconfig")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            with open(fd, "wb", closefd=False) as f:
                f.write(str(text).encode())
        finally:
            os.close(fd)
        env["GIT_CONFIG_GLOBAL"] = path
    return env


# -- capabilities --------------------------------------------------------------------------------


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


_CAPABILITY_VERSION_3 = 0x20080522
_PR_CAPBSET_DROP = 24
_EINVAL = 22


@functools.cache
def _capabilities_held() -> bool:
    """Whether this process holds any capability (it runs as root): its workers drop them all."""
    try:
        with open("/proc/self/status") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
    except OSError:
        return True  # unknown: drop them, if any
    return any(int(fields.get(name, "0").strip() or "0", 16) for name in ("CapInh", "CapPrm", "CapEff", "CapAmb"))


@functools.cache
def _last_capability() -> int:
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 63


_BOUNDING_DROPPED: list[bool] = []


def drop_bounding_set() -> None:
    """Empty this process's capability bounding set, where it holds capabilities (a daemon run as
    root): no program it or a process it forks runs later gains one, set-uid root or run as root.
    The confined workers' fork server does it once (it runs no program), so that each worker has
    only its own sets to drop (``_drop_capabilities``): a system call per capability is ~40."""
    if not _capabilities_held() or _BOUNDING_DROPPED:
        return
    libc = _libc()
    for capability in range(_last_capability() + 1):
        if libc.prctl(_PR_CAPBSET_DROP, capability, 0, 0, 0) != 0 and ctypes.get_errno() != _EINVAL:
            raise OSError(ctypes.get_errno(), f"cannot drop capability {capability} from the bounding set")
    _BOUNDING_DROPPED.append(True)


@functools.cache
def _capset() -> tuple[Any, ...]:
    """``capset``'s arguments that drop every capability of the calling thread (the ambient ones
    go with the permitted), made once."""
    return (_libc().capset, ctypes.byref(_CapHeader(_CAPABILITY_VERSION_3, 0)), ctypes.byref((_CapData * 2)()))


def _drop_capabilities(capset: tuple[Any, ...] | None = None) -> None:
    """Drop every capability for good: the bounding set (``drop_bounding_set``, if the fork server
    has not), then the permitted, effective, inheritable and ambient sets."""
    drop_bounding_set()
    function, *arguments = capset or _capset()
    if function(*arguments) != 0:
        raise OSError(ctypes.get_errno(), "cannot drop the capabilities")


class _Prepared:
    """A worker's confinement made ready by the fork server before the fork: the ruleset with every
    rule but the worker's own ``/proc/PID`` (its PID is not known yet), the system calls' arguments,
    ``TMPDIR`` and the policy's variables.

    After the fork, each first touch of a page of the worker's memory copies it (measured on this
    machine: a first ctypes call ~150 µs there, ~2 µs again); so the worker runs as little Python as
    it can: its own rule, no_new_privs, restrict_self, the seccomp filter (and, as root, dropping
    its capabilities).
    """

    def __init__(self, ruleset: int, abi: int, policy: dict[str, Any], temp_dir: str) -> None:
        import tempfile  # lazy: in the fork server, which has it imported already

        libc = _libc()
        self.syscall = libc.syscall
        self.prctl = libc.prctl
        self.ruleset = ruleset
        self.capset = _capset() if _capabilities_held() else None
        self.rule = _PathBeneath(_READ & _FS_BY_ABI.get(abi, _FS_ALL_LATEST), -1)
        self.add_rule = (ctypes.c_long(_SYS_ADD_RULE), ctypes.c_int(ruleset), ctypes.c_int(_RULE_PATH_BENEATH),
                         ctypes.byref(self.rule), ctypes.c_uint32(0))
        self.restrict = (ctypes.c_long(_SYS_RESTRICT_SELF), ctypes.c_int(ruleset), ctypes.c_uint32(0))
        _filters, prog = _filter(bool(policy.get("net")))
        self.seccomp = (ctypes.c_long(_ARCHES[os.uname().machine][4]), ctypes.c_uint(1), ctypes.c_uint(1),
                        ctypes.byref(prog))
        env = _worker_env(policy, temp_dir)
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
        if self.capset is not None:
            _drop_capabilities(self.capset)
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
        import tempfile  # lazy: in the fork server, which has it imported already

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
    abi = _abi(policy)
    if abi < REQUIRED_ABI or os.uname().machine not in _ARCHES:
        return
    try:
        read, write, split = _rules(policy, runtime, temp_dir, spill_dir)
        ruleset = _ruleset(abi, read, write, bool(policy.get("net")),
                           opened=_STATIC if _STATIC_FOR == runtime else (), split=split)
    except OSError:
        return
    try:
        _PREPARED[(id(policy), temp_dir, spill_dir)] = _Prepared(ruleset, abi, policy, temp_dir)
    except OSError:
        os.close(ruleset)  # the worker tries itself, and says what keeps it from it


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
        if isinstance(project, str) and _leaves(path, real, project):
            continue  # the repository's link out of itself (src -> /): what it names is not the project's
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


def _leaves(path: str, real: str, project: str) -> bool:
    """Whether ``path``, in the project by its name, is in fact elsewhere: a symbolic link the
    repository holds (its ``src``, its ``.venv``'s site-packages) that names a directory outside it."""
    def within(candidate: str, root: str) -> bool:
        return candidate == root or candidate.startswith(root.rstrip("/") + "/")

    named = os.path.abspath(path)
    project_real = os.path.realpath(project)
    return (within(named, project) or within(named, project_real)) and not within(real, project_real)


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
            _landlock(_abi(policy), everything, write, net=not no_net, scope=False)
            if no_net:
                _seccomp(False)
        except OSError as exc:
            raise SandboxError(f"cannot narrow the worker's sandbox: {exc}") from None
        applied = [k for k, on in (("write", no_write), ("net", no_net)) if on]
    return applied
