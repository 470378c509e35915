"""Which JavaScript runtime runs TypeScript and JavaScript tool modules, and how it is started.

``js_runtime = "auto"`` (the default) takes Bun when it is installed (what Atomic and OpenCode run
their tools on), else Node 22.6 or newer (type stripping); ``bun`` or ``node`` takes only that one; a path takes
that executable, whichever of the two it is. Each is looked for on the daemon's ``PATH``, and Bun
also where its installer puts it (``~/.bun/bin``). A runtime too old, or none, is a ``problem``
that names what was found and the command that installs one: the modules are listed as failed with
it, and everything else keeps serving.

The answer is a ``JsRuntime`` (``protocol.py``): the command a worker execs (the runtime and
its flags), and what a confined worker must read of it. Finding it runs the candidate with
``--version`` (a few milliseconds), once per setting and executable; nothing is looked for until a
TypeScript or JavaScript module is loaded.

Daemon side: never imported by workers.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from atomictoolsd.protocol import JsRuntime
from atomictoolsd.worker.jsexec import JS_DIR

__all__ = ["INSTALL_HINT", "MIN_BUN", "MIN_NODE", "find_runtime", "runtime_read_paths"]

MIN_BUN = (1, 2, 0)
MIN_NODE = (22, 6, 0)
INSTALL_HINT = (
    "install Bun (`npm install -g bun`, or `curl -fsSL https://bun.sh/install | bash`) or Node.js 22.6 or newer "
    "(`npm install -g node@22`), or set js_runtime to the path of one"
)
_VERSION = re.compile(r"v?(\d+)\.(\d+)\.(\d+)")
_BUNFIG = os.path.join(JS_DIR, "bunfig.toml")
_cache: dict[tuple[str, str, int], tuple[str, tuple[int, int, int]] | None] = {}


def _version_of(path: str) -> tuple[str, tuple[int, int, int]] | None:
    """``("bun" | "node", version)`` of the executable at ``path``; None when it is neither."""
    try:
        key = (path, str(os.stat(path).st_mtime_ns), os.stat(path).st_size)
    except OSError:
        return None
    if key in _cache:
        return _cache[key]
    found = None
    try:
        out = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=15, env={"PATH": os.environ.get("PATH", "")},
            cwd="/", stdin=subprocess.DEVNULL,
        )
        match = _VERSION.match(out.stdout.strip())
        if out.returncode == 0 and match is not None:
            version = (int(match[1]), int(match[2]), int(match[3]))
            found = ("node" if out.stdout.strip().startswith("v") else "bun", version)
    except (OSError, subprocess.SubprocessError):
        found = None
    _cache[key] = found
    return found


def _candidates(name: str, home: Path) -> list[str]:
    found = []
    on_path = shutil.which(name)
    if on_path:
        found.append(on_path)
    if name == "bun":
        installed = home / ".bun" / "bin" / "bun"
        if installed.is_file() and str(installed) not in found:
            found.append(str(installed))
    return found


def _dotted(version: tuple[int, int, int]) -> str:
    return ".".join(map(str, version))


def runtime_read_paths(executable: str, packages: str) -> list[str]:
    """What a confined worker reads besides the project and the Python runtime: the runtime's own
    directory (Bun and Node are single executables) and the support packages."""
    paths = [os.path.dirname(os.path.realpath(executable))]
    if packages:
        paths.append(os.path.realpath(packages))
    return paths


def _command(name: str, path: str, version: tuple[int, int, int]) -> list[str]:
    if name == "bun":
        return [path, f"--config={_BUNFIG}", "--no-env-file", "--no-install"]
    # Transforming (enums, namespaces, parameter properties) came in 22.7; 22.6 strips types only.
    types = "--experimental-transform-types" if version >= (22, 7, 0) else "--experimental-strip-types"
    return [path, types, "--disable-warning=ExperimentalWarning"]


def find_runtime(setting: str, home: Path, packages: str = "") -> JsRuntime:
    """The runtime ``js_runtime = setting`` chooses, or a ``JsRuntime`` whose ``problem`` says why
    there is none."""
    setting = setting.strip() or "auto"
    if setting in ("auto", "bun", "node"):
        wanted = ("bun", "node") if setting == "auto" else (setting,)
        candidates = [(name, path) for name in wanted for path in _candidates(name, home)]
        where = "on PATH" if setting != "bun" else "on PATH or in ~/.bun/bin"
    else:
        path = os.path.expanduser(setting)
        if not os.path.isabs(path):
            return JsRuntime(problem=f"js_runtime = {setting!r} is neither auto, bun, node nor an absolute path")
        candidates = [("", path)]
        where = f"at {path}"
    seen: list[str] = []
    for expected, path in candidates:
        found = _version_of(path)
        if found is None:
            seen.append(f"{path} does not run as Bun or Node")
            continue
        name, version = found
        if expected and name != expected:
            continue
        minimum = MIN_BUN if name == "bun" else MIN_NODE
        if version < minimum:
            seen.append(f"{name} {_dotted(version)} at {path} is older than {_dotted(minimum)}")
            continue
        return JsRuntime(
            name=name, version=_dotted(version), command=_command(name, path, version), packages=packages,
            read=runtime_read_paths(path, packages),
        )
    what = "Bun or Node" if setting == "auto" else setting if setting in ("bun", "node") else "a runtime"
    found_text = f" ({'; '.join(seen)})" if seen else ""
    return JsRuntime(problem=f"no JavaScript runtime to run it: {what} was not found {where}{found_text}; {INSTALL_HINT}")
