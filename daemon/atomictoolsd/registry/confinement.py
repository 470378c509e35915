"""How each tools directory may run: with the user's full rights, confined, or not at all.

The daemon asks this for every tools dir whenever trust may have changed (``Lifetimes.judge``). It
reads the trust level of a project (``trust --sandbox`` or plain ``trust``), the user's widening of
the sandbox (``trust --sandbox --allow-…`` in the trust store, ``sandbox_allow_*`` in the
configuration: both the user's, never a repository's) and what the kernel can enforce
(``worker/sandbox.support``). A project trusted with ``--sandbox`` on a machine that cannot confine
it is blocked with the reason: nothing here ever hands a worker less confinement than was chosen.

The built-in tools are judged per project (each project has its own built-in tools dir where the
sandbox is available, ``Registry.project``): confined to read that project and its repository, and
to write nothing; where the sandbox is unavailable they run unconfined, as the product's own code.
Their policy is made by running ``git config`` on each file of your git configuration and by
walking up to the project's repository: ``judge`` hands that work back as a function, which the
registry runs in a thread (``Lifetimes.rejudge``), never on the daemon's event loop.

A confined project's policy names its root and the entries of it that stay read-only
(``sandbox.PROTECTED``, plus the user's ``sandbox_protect`` and ``trust --protect``: the list only
grows), the variables of the daemon's environment its workers get by name (``sandbox_allow_env``,
``--allow-env``: their values go to each worker over its own channel, never through the fork
server, which serves every project), and the copy of your git configuration they get
(``config/gitcopy.py``).

It never applies a confinement (the worker does, ``worker/sandbox.confine``) and never writes trust.
"""

from __future__ import annotations

import logging
import os
import re
import stat
import subprocess
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from atomictoolsd.config.discovery import (
    GIT_INCLUDE_KEYS,
    GIT_PATH_KEYS,
    KEPT_GIT_VARS,
    RepositoryRefused,
    git_config_path,
    locate_repository,
    within,
)
from atomictoolsd.config.gitcopy import harmless_copy
from atomictoolsd.config.nethosts import parse_hosts, parse_private

if TYPE_CHECKING:
    from atomictoolsd.config.settings import Config
    from atomictoolsd.registry.model import Judgement, ToolsDir
    from atomictoolsd.registry.trust import TrustStore

__all__ = [
    "TRUSTED_ENV", "builtin_policy", "configure_sandbox", "env_name_problem", "git_config_identity", "git_config_paths",
    "git_named_entries", "held_policy", "judge", "network_policy", "policy", "protect_path_problem", "root_listing",
]

# How a confined built-in worker learns whether its project is trusted (``workspace-info`` says so):
# it cannot read the trust store, which names every other project.
TRUSTED_ENV = "ATOMICTOOLS_PROJECT_TRUSTED"

_FULL: Judgement = (True, None, None)
log = logging.getLogger("atomictoolsd.trust")


def _dirs(value: str | list[str] | None, home: Path) -> list[str]:
    if not value:
        return []
    items = value.split(os.pathsep) if isinstance(value, str) else value
    out = []
    for item in items:
        item = str(item).strip()
        if item:
            path = home / item[2:] if item == "~" or item.startswith("~/") else Path(item)
            out.append(os.path.realpath(path))  # Landlock binds the directory, not the path to it
    return out


def configure_sandbox(config: Config) -> None:
    """Have this process rely on the Landlock ABI the user's configuration says (``sandbox_abi``: a
    lower kernel, for testing), where the sandbox is in use or the setting is made."""
    module = sys.modules.get("atomictoolsd.worker.sandbox")
    if module is None and config.sandbox_abi >= 0:
        from atomictoolsd.worker import sandbox as module  # lazy: ctypes, only once the setting asks for it
    if module is not None:
        module.limit_abi(config.sandbox_abi)


def policy(
    read: list[str], write: list[str], allow: dict[str, Any], config: Config, home: Path, project: Path | None = None,
) -> dict[str, Any]:
    """The policy a confined worker applies: what it reads, writes, and whether it has the network;
    for a project (``project``), what of it stays read-only, the variables it gets by name and the
    copy of your git configuration it gets."""
    write = [*write, *_dirs(config.sandbox_allow_write, home), *_dirs(allow.get("write"), home)]
    read = [*read, *_dirs(config.sandbox_allow_read, home), *_dirs(allow.get("read"), home)]
    made: dict[str, Any] = {
        "read": sorted(set(read)),
        "write": sorted(set(write)),
        **network_policy(allow.get("net"), config),
    }
    if project is not None:
        made.update(_project_policy(project, allow, config, home))
    if config.sandbox_abi >= 0:
        made["abi"] = config.sandbox_abi
    return made


def _project_policy(project: Path, allow: dict[str, Any], config: Config, home: Path) -> dict[str, Any]:
    """What a confined project's policy holds beyond its paths: the entries kept read-only, the
    variables passed by name (``pass_env``: the daemon sends their values to each worker), the
    git configuration's copy."""
    from atomictoolsd.worker.sandbox import PROTECTED  # lazy: ctypes, only once a dir is to be confined

    protect = [*PROTECTED, *_items(config.sandbox_protect), *(allow.get("protect") or []),
               *git_named_entries(project, home)]
    names = [*_items(config.sandbox_allow_env), *(allow.get("env") or [])]
    made: dict[str, Any] = {
        "project": os.path.realpath(project),
        "protect": sorted({_clean(p) for p in protect if _usable(p, protect_path_problem, "sandbox_protect")}),
        "gitconfig": harmless_copy(home),
    }
    passed = sorted({name for name in names if _usable(name, env_name_problem, "sandbox_allow_env")})
    if passed:
        made["pass_env"] = passed
    return made


_WARNED: set[tuple[str, str]] = set()


def _usable(value: str, problem_of: Callable[[str], str | None], setting: str) -> bool:
    """Whether ``value`` can be used; one that cannot is left out, and said once in the log (the CLI
    refuses it; the configuration file may hold it)."""
    problem = problem_of(value)
    if problem is not None and (setting, value) not in _WARNED:
        _WARNED.add((setting, value))
        log.warning("%s: %r is left out: %s", setting, value, problem)
    return problem is None


def _items(value: str) -> list[str]:
    return [item.strip() for item in value.split(":") if item.strip()]


def _clean(path: str) -> str:
    return "/".join(part for part in path.strip().split("/") if part not in ("", "."))


def protect_path_problem(path: str) -> str | None:
    """Why ``path`` cannot name an entry of a project to keep read-only (None: it can): it must be
    relative to the project's root, and stay in it."""
    parts = [part for part in path.strip().split("/") if part not in ("", ".")]
    if path.strip().startswith("/") or not parts:
        return "a name or a path relative to the project's root (such as .github/workflows) is expected"
    if ".." in parts:
        return "a path in the project is expected, without '..'"
    return None


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def env_name_problem(name: str) -> str | None:
    """Why a confined worker cannot be given the variable ``name`` (None: it can): not a variable's
    name, the daemon's own (``ATOMICTOOLS_*``: its token, its paths), or one the sandbox sets."""
    if not _ENV_NAME.match(name):
        return "not a variable's name"
    if name.upper().startswith("ATOMICTOOLS_"):
        return "the daemon's own variables are never given to a confined tool"
    if name in ("TMPDIR", "GIT_CONFIG_GLOBAL"):
        return "the sandbox sets it (a private temporary directory; the copy of your git configuration)"
    return None


def network_policy(allowed: Any, config: Config) -> dict[str, Any]:
    """The network part of a confined worker's policy: ``net`` (it runs in a network namespace of
    its own, ``worker/netns``, whose one way out is the daemon's proxy), ``net_hosts`` (the
    hosts ``--allow-net HOST,…`` named; absent: any public host), ``net_private``
    (``sandbox_allow_net_private``) and ``env`` (the proxy's variables); where this machine cannot
    make the namespace, no network and ``net_off`` saying why. ``allowed`` is the trust entry's
    ``allow.net``: True, or the hosts."""
    if not (config.sandbox_allow_net or allowed):
        return {"net": False}
    from atomictoolsd.worker import netns  # lazy: ctypes, only for a worker allowed the network

    support = netns.support()
    if not support["available"]:
        return {"net": False, "net_off": f"a confined tool reaches the network only from a namespace of its own, and {support['reason']}"}
    out: dict[str, Any] = {"net": True, "env": netns.proxy_environ()}
    if isinstance(allowed, (list, str)) and not config.sandbox_allow_net:
        try:
            out["net_hosts"] = parse_hosts(allowed)
        except ValueError as exc:  # the store was edited by hand: nothing wider than it says
            return {"net": False, "net_off": f"the trust store's hosts are not readable ({exc})"}
    if config.sandbox_allow_net_private:
        out["net_private"] = parse_private(config.sandbox_allow_net_private)
    return out


def judge(tools_dir: ToolsDir, config: Config, store: TrustStore, home: Path) -> Judgement | Callable[[], Judgement]:
    """``(loads, policy or None, why blocked or None)`` for ``tools_dir`` now; for built-ins that run
    confined, the function that makes it (it runs git and reads the file system: for a thread).
    Asked on the event loop: the trust store is read there, as everywhere else."""
    if tools_dir.scope == "builtin":
        from atomictoolsd.worker import sandbox  # lazy: ctypes, only once a dir is to be confined

        if not sandbox.support()["available"] or not _utf8(str(tools_dir.cwd)):
            # The product's own code: it runs unconfined rather than not at all (a project whose
            # path is not UTF-8 cannot reach the fork server: the shared workers serve it).
            return _FULL
        trusted = config.trust_all or store.is_trusted(tools_dir.cwd)
        return partial(_confined_builtins, tools_dir.cwd, home, trusted, config.sandbox_abi)
    if tools_dir.scope == "global":
        if not config.sandbox_global:
            return _FULL
        read, write, allow, project = [str(tools_dir.path)], [], {}, None
        what = "the global tools are confined (sandbox_global)"
    else:
        if config.trust_all:
            return _FULL
        entry = store.entry(tools_dir.cwd)
        if entry is None:
            return (False, None, None)
        if entry.get("level", "full") != "sandbox":
            return _FULL
        read = write = [os.path.realpath(tools_dir.cwd)]  # as the protected entries' paths are made
        allow = entry.get("allow") or {}
        project = tools_dir.cwd
        what = "this project is trusted with --sandbox"
    from atomictoolsd.worker import sandbox  # lazy: ctypes, only once a dir is to be confined

    support = sandbox.support()
    if not support["available"]:
        return (False, None, f"{what}, but {support['reason']}: its tools do not run unconfined")
    return (True, policy(read, write, allow, config, home, project), None)


def held_policy(root: Path, config: Config, home: Path) -> tuple[dict[str, Any] | None, str | None]:
    """How a held module of the fully trusted project at ``root`` runs (content that came through git
    and awaits review: ``registry/holding.py``): confined as ``trust --sandbox`` confines, without a
    project's widening; or ``(None, why)`` where this machine cannot confine it (it does not run)."""
    from atomictoolsd.worker import sandbox  # lazy: ctypes, only once a module is held

    support = sandbox.support()
    if not support["available"]:
        return None, str(support["reason"])
    return policy([str(root)], [str(root)], {}, config, home, Path(root)), None


def _confined_builtins(root: Path, home: Path, trusted: bool, abi: int) -> Judgement:
    return (True, builtin_policy(root, home, trusted, abi), None)


def builtin_policy(root: Path, home: Path, trusted: bool, abi: int = -1) -> dict[str, Any]:
    """What the built-in tools of the project at ``root`` may do: read the project and what git needs
    of its repository and of your git configuration; write nothing (their temporary dir aside).

    The repository is located as the built-ins locate it (``locate_repository``): a ``.git`` file or
    ``commondir`` that leads anywhere else is refused there. Nothing else a repository holds names
    a path here: its ignore and attribute files are added as the paths they are, never through a
    symlink, so a repository cannot widen this.
    """
    root = Path(os.path.realpath(root))
    read = [str(root)]
    try:
        repository = locate_repository(root)
    except (RepositoryRefused, OSError):
        repository = None  # the built-ins refuse it too, with the reason
    if repository is not None:
        read += [str(repository.git_dir), str(repository.common_dir)]
        if root != repository.worktree:
            # A project inside a larger repository: git reads the ignore and attribute files on the
            # way down to it, not the rest of the work tree.
            for directory in (repository.worktree, *[p for p in root.parents if repository.worktree in p.parents]):
                read += [str(directory / name) for name in (".gitignore", ".gitattributes") if _plain_file(directory / name)]
    git_files = [p for p in git_config_paths(home) if _utf8(p)]  # the policy goes to the fork server as JSON
    # Your own configuration's files are followed to where they are (a dotfiles repository's link):
    # a Landlock rule binds the file, not the link.
    mine = [os.path.realpath(p) for p in git_files if os.access(p, os.R_OK)]
    # Which git configuration git reads is yours to say (the fork server's environment has none
    # of these: it serves every confined worker).
    chosen = {name: os.environ[name] for name in KEPT_GIT_VARS if name in os.environ}
    return {
        # A path that is not UTF-8 cannot reach the fork server: left out (git goes without it).
        "read": sorted({p for p in (*read, *mine) if _utf8(p)}), "write": [], "net": False,
        "env": {**chosen, TRUSTED_ENV: "1" if trusted else "0"},
        "git_files": git_files,
        "git_config": git_config_identity(git_files),
        **({"abi": abi} if abi >= 0 else {}),
    }


def _plain_file(path: Path) -> bool:
    """A regular file, not a symlink (whose target a repository chooses)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


_MAX_CONFIG_FILES = 80  # includes of includes: git stops at a depth of 10
_MAX_CONFIG_BYTES = 1024 * 1024  # of one config file; of a repository's, of all its files


def git_config_paths(home: Path) -> list[str]:
    """Every file of your git configuration the built-ins' git may read, there or not (one made
    later is noticed: ``git_config_identity``): your global and system config files, the files
    they include (under any condition: an ``includeIf`` depends on the repository, whose config is
    never run here), the files they name for status and diff (``GIT_PATH_KEYS``), and
    ``$XDG_CONFIG_HOME/git`` (the default ignore and attributes files).

    Each config file is read by git itself (``git config --file - --no-includes --list``, given its
    content: a regular file of at most ``_MAX_CONFIG_BYTES``), in the built-ins' environment: only
    your ``GIT_CONFIG_*`` choices, no repository.
    """
    env = _git_environ(home)
    xdg = Path(os.environ.get("XDG_CONFIG_HOME") or home / ".config")
    if env.get("GIT_CONFIG_GLOBAL"):
        configs = [Path(env["GIT_CONFIG_GLOBAL"])]
    else:
        configs = [home / ".gitconfig", xdg / "git" / "config"]
    if not env.get("GIT_CONFIG_NOSYSTEM"):
        configs.append(Path(env.get("GIT_CONFIG_SYSTEM") or "/etc/gitconfig"))
    seen: list[Path] = []
    named: list[Path] = []
    while configs and len(seen) < _MAX_CONFIG_FILES:
        config = configs.pop(0)
        if config in seen:
            continue
        seen.append(config)
        for key, value in _config_entries(config, env):
            if GIT_INCLUDE_KEYS.match(key) and value:
                configs.append(git_config_path(value, config.parent, home))
            elif key in GIT_PATH_KEYS and value and (value.startswith("~") or os.path.isabs(value)):
                named.append(git_config_path(value, home, home))  # a relative one is in the work tree
    return [str(xdg / "git"), *dict.fromkeys(str(p) for p in (*seen, *named))]


# Keys of a repository's git config that name a program git runs (the first word of the value);
# ``core.hooksPath`` names a directory of them, an include more config.
_GIT_PROGRAM_KEYS = re.compile(
    r"(?i)^(core\.fsmonitor|core\.sshcommand|core\.gitproxy|core\.askpass|core\.editor|"
    r"core\.pager|pager\..*|sequence\.editor|diff\.external|credential\.(.*\.)?helper|gpg\.(.*\.)?program|"
    r"alias\..*|remote\..*\.(uploadpack|receivepack)|filter\..*\.(clean|smudge|process)|"
    r"diff\..*\.(textconv|command)|merge\..*\.driver|(diff|merge)tool\..*\.(cmd|path)|sendemail\..*)$",
    re.DOTALL,
)


def git_named_entries(project: Path, home: Path) -> list[str]:
    """The paths inside ``project`` (relative to it) that its repository's git config names for git
    to run — a hooks directory (``core.hooksPath``), a program at the start of a command
    (``core.fsmonitor = scripts/watch``) — or to read as config (an include: ``../.gitconfig``):
    a confined tool that wrote one would have your next ``git`` run it. Read with ``git config
    --file``, which runs nothing, once per content of those files (a policy is made on the event
    loop, at each load: ``Lifetimes.rejudge`` reads them in a thread first), and bounded: regular
    files only, ``_MAX_CONFIG_BYTES`` in all (a repository's config may name any file); an
    unreadable repository names none."""
    try:
        repository = locate_repository(project)
    except (RepositoryRefused, OSError):
        return []
    if repository is None:
        return []
    root = Path(os.path.realpath(project))
    cached = _NAMED.get(root)
    if cached is not None and cached[0] == repository and cached[1] == _signature(cached[2]):
        return cached[3]
    seen, named = _git_named_paths(repository, home)
    inside = (os.path.relpath(p, root) for p in named if within(p, root) and p != root)
    found = sorted({p for p in inside if protect_path_problem(p) is None})
    _NAMED[root] = (repository, _signature(seen), seen, found)
    return found


# By project: (its repository, the signature of the config files read, those files, what they name).
_NAMED: dict[Path, tuple[Any, list[tuple[int, int, int] | None], list[Path], list[str]]] = {}


def _signature(files: list[Path]) -> list[tuple[int, int, int] | None]:
    signature: list[tuple[int, int, int] | None] = []
    for path in files:
        try:
            info = os.stat(path)
            signature.append((info.st_mtime_ns, info.st_size, info.st_ino))
        except OSError:
            signature.append(None)
    return signature


def _git_named_paths(repository: Any, home: Path) -> tuple[list[Path], list[Path]]:
    """The config files of ``repository`` (its own and those they include), and the paths they
    name for git to run or read."""
    configs = [repository.common_dir / "config", repository.git_dir / "config.worktree"]
    seen: list[Path] = []
    named: list[Path] = []
    env = _git_environ(home)
    left = _MAX_CONFIG_BYTES  # for all of them: their reading holds up the event loop
    while configs and len(seen) < _MAX_CONFIG_FILES and len(named) < _MAX_NAMED:
        config = configs.pop(0)
        if config in seen:
            continue
        seen.append(config)
        data = _config_bytes(config, left)
        left -= len(data)
        for key, value in _listed_entries(data, env):
            if len(named) >= _MAX_NAMED:
                break
            if GIT_INCLUDE_KEYS.match(key) and value:
                configs.append(git_config_path(value, config.parent, home))
                named.append(configs[-1])
            elif key == "core.hookspath" and value:
                named.append(git_config_path(value, repository.worktree, home))
            elif _GIT_PROGRAM_KEYS.match(key) and value:
                # An alias without '!' is git's own command: only a program's path counts there.
                command = key.startswith("alias.") and not value.startswith("!")
                named.extend(_programs_of(value.removeprefix("!"), repository.worktree, home, not command))
    return seen, named[:_MAX_NAMED]


_MAX_NAMED = 256  # paths one repository's config names (each is a protected entry); the rest are not
_MAX_COMMAND_WORDS = 32
# A command's words, as crudely as a shell splits them: between spaces, quotes, operators, and '='
# (``--file=tools/x``).
_COMMAND_WORD = re.compile(r"[^\s;&|()<>'\"`=]+")


def _programs_of(command: str, worktree: Path, home: Path, arguments: bool) -> list[Path]:
    """The files a command git runs names, as git runs it from the top of the work tree: its program
    (the first word; a bare name is looked up on PATH, none of the repository's) and, with
    ``arguments``, the scripts and files the words after it name (``python3 tools/conv.py``,
    ``sh up.sh``): a word with a '/' or a '~', or the name of a file at the top of the work tree."""
    named = []
    for position, word in enumerate(_COMMAND_WORD.findall(command)[:_MAX_COMMAND_WORDS]):
        if position and not arguments:
            break
        if word.startswith(("-", "$", "%")) or "://" in word:
            continue  # an option, a variable, git's placeholder (%f), a URL
        if "/" in word or word.startswith("~") or (position and os.path.isfile(worktree / word)):
            named.append(git_config_path(word, worktree, home))
    return named


def _git_environ(home: Path) -> dict[str, str]:
    """The environment ``git config --file`` reads a config file in: only your ``GIT_CONFIG_*``
    choices, no repository."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_") or k in KEPT_GIT_VARS}
    env.update({"HOME": str(home), "GIT_DIR": "/nonexistent", "LC_ALL": "C"})
    return env


def _config_entries(config: Path, env: dict[str, str]) -> list[tuple[str, str]]:
    return _listed_entries(_config_bytes(config, _MAX_CONFIG_BYTES), env)


def _config_bytes(config: Path, limit: int) -> bytes:
    """The content of the config file ``config`` when it is a regular file of at most ``limit``
    bytes; else nothing (a repository's config names what it likes: a FIFO, a device, a sparse file
    of terabytes or ``/proc/kmsg`` would hold git, and the event loop, for as long as it reads)."""
    try:
        if not stat.S_ISREG(os.stat(config).st_mode):
            return b""
        fd = os.open(config, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return b""
    try:
        info = os.fstat(fd)
        # A file of the kernel's says it is empty whatever it holds: read as what it says.
        if not stat.S_ISREG(info.st_mode) or not 0 < info.st_size <= limit:
            return b""
        data = b""
        while len(data) <= limit and (chunk := os.read(fd, limit + 1 - len(data))):
            data += chunk
    except OSError:
        return b""
    finally:
        os.close(fd)
    return data if len(data) <= limit else b""


def _listed_entries(data: bytes, env: dict[str, str]) -> list[tuple[str, str]]:
    """The ``(key, value)`` entries of a config file's content ``data``, as git reads them."""
    if not data:
        return []
    try:
        done = subprocess.run(
            ["git", "config", "--file", "-", "--no-includes", "-z", "--list"], cwd="/", env=env,
            input=data, capture_output=True, timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    entries = []
    for item in done.stdout.decode("utf-8", "surrogateescape").split("\0") if done.returncode == 0 else []:
        key, _, value = item.partition("\n")
        if key:
            entries.append((key, value))
    return entries


def root_listing(root: Path) -> tuple[int, int] | None:
    """What tells whether entries were made, removed or renamed in the directory ``root`` since
    (its inode and modification time); None when it is gone. A confined worker may write the
    entries its project's root held when it was made, and make none there."""
    try:
        info = os.stat(root)
    except OSError:
        return None
    return (info.st_ino, info.st_mtime_ns)


def git_config_identity(paths: list[str]) -> list[list[int] | None]:
    """Which files ``paths`` are now, and when last written (None: none there). A Landlock rule
    binds the file there when the worker started (``git config --global`` writes a new
    ~/.gitconfig, which the worker could not read), and an edit may include or name another file:
    a built-in worker whose identity differs is replaced (``Lifetimes._check_git_config``)."""
    identity: list[list[int] | None] = []
    for path in paths:
        try:
            info = os.stat(path)
        except OSError:
            identity.append(None)
        else:
            identity.append([info.st_dev, info.st_ino, info.st_mtime_ns])
    return identity


def _utf8(path: str) -> bool:
    try:
        path.encode()
    except UnicodeEncodeError:
        return False
    return True
