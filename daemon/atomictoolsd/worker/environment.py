"""The environment a worker imports from, and what it says when a module is not there.

A worker forked from the fork server runs the daemon's interpreter with the daemon's ``sys.path``.
When its module has an environment of its own (``WorkerSpec.env``: the packages it declares, or its
project's virtual environment), ``activate`` puts it on ``sys.path`` before the module is imported:

    the standard library, then the project's own code (its root, its ``src/``), then the
    environment's site-packages (with their ``.pth`` files), then the daemon's own packages.

So the fork server stays the one forked from the daemon and a worker of an environment starts as
fast as any other. What the worker runtime imported before the fork (msgspec, atomictools, the
standard library modules it uses) stays the daemon's: an environment's copy of those is not read.

A module that is not there (``ModuleNotFoundError``) is explained by ``missing_module_hint``: the
package that provides it, the environment the worker ran in, and the one thing that installs it
there (the line to declare it, or the exact command).

What the module imported from a site-packages dir is reported with its load (``site_report``): each
dir with its mtime, and the top-level entry (``yaml/``, ``six.py``) of each package imported from it,
with its inode and mtime. The daemon (``registry/sitewatch.py``) reloads the module when one of
those changes (a package installed or upgraded there); a module that failed, when anything there
changes. The names are recorded as they are imported (``_Recorder``, first on ``sys.meta_path``):
nothing walks ``sys.modules``, whose every entry a freshly forked worker would copy.

Runs inside workers: standard library only, and nothing here runs for a worker without an
environment but a look at ``spec.env``.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import sys

from atomictoolsd.protocol import MAX_SITE_DIRS, MAX_SITE_ENTRIES, SITE_NAMES, EnvSpec, WorkerSpec

__all__ = ["activate", "distribution_of", "missing_module_hint", "site_report"]

_current: list[WorkerSpec] = []  # the spec of the module this worker serves (``activate``)
_VENV_NAMES = (".venv", "venv")  # a project's own environment, as environments/project.py looks for it
_MOST_ENTRIES = MAX_SITE_ENTRIES  # a module importing more is watched by its first 256 (the report stays small)


class _Recorder:
    """A finder that finds nothing: it notes the top-level modules imported after the fork."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> None:
        if path is None:  # a top-level module (a submodule is asked with its package's path)
            self.names.append(fullname)


_recorder = _Recorder()

# Import names whose package on the index is named otherwise (the usual ones; others are their
# import name, which the index matches however it is written: `typing_extensions`).
_DISTRIBUTIONS = {
    "yaml": "pyyaml", "PIL": "pillow", "cv2": "opencv-python", "sklearn": "scikit-learn", "skimage": "scikit-image",
    "bs4": "beautifulsoup4", "dateutil": "python-dateutil", "dotenv": "python-dotenv", "jwt": "pyjwt",
    "magic": "python-magic", "serial": "pyserial", "usb": "pyusb", "Crypto": "pycryptodome", "OpenSSL": "pyopenssl",
    "git": "gitpython", "docx": "python-docx", "pptx": "python-pptx", "gi": "pygobject", "attr": "attrs",
    "zmq": "pyzmq", "MySQLdb": "mysqlclient", "psycopg2": "psycopg2-binary", "fitz": "pymupdf", "google": "protobuf",
    "Levenshtein": "levenshtein", "multipart": "python-multipart", "jose": "python-jose", "slugify": "python-slugify",
    "tomli_w": "tomli-w", "ruamel": "ruamel.yaml", "websocket": "websocket-client", "lxml": "lxml", "github": "pygithub",
}


def activate(spec: WorkerSpec) -> None:
    """Remember the module's spec (for ``missing_module_hint``) and put its environment on ``sys.path``."""
    _current[:] = [spec]
    if spec.env is not None:
        _add_paths(spec.env)
    sys.meta_path.insert(0, _recorder)


def site_report(failed: bool) -> list[tuple[str, int, list[tuple[str, int, int]]]]:
    """The site-packages dirs the module imported from: ``(dir, mtime_ns, [(entry, inode, mtime_ns)])``
    (``protocol.SiteDir``). A module that ``failed`` reports every site dir on its path (the first
    ``MAX_SITE_DIRS``), whatever it imported: installing anything there may be what it lacks."""
    dirs = [entry for entry in sys.path if os.path.basename(entry) in SITE_NAMES][:MAX_SITE_DIRS]
    used: dict[str, list[tuple[str, int, int]]] = {d: [] for d in dirs} if failed else {}
    for name in _recorder.names[:_MOST_ENTRIES]:
        found = _entry_of(sys.modules.get(name), dirs)
        if found is None:
            continue
        directory, entry = found
        try:
            info = os.stat(entry)
        except OSError:
            continue
        used.setdefault(directory, []).append((entry, info.st_ino, info.st_mtime_ns))
    report = []
    for directory, entries in used.items():
        try:
            report.append((directory, os.stat(directory).st_mtime_ns, entries))
        except OSError:
            continue
    return report


def _entry_of(module: object, dirs: list[str]) -> tuple[str, str] | None:
    """The site dir ``module`` came from and its top-level entry there (``yaml/``, ``six.py``)."""
    where = getattr(module, "__file__", None) or next(iter(getattr(module, "__path__", None) or ()), None)
    if not isinstance(where, str):
        return None
    for directory in dirs:
        prefix = directory.rstrip(os.sep) + os.sep
        if where.startswith(prefix):
            return directory, prefix + where[len(prefix):].split(os.sep, 1)[0]
    return None


def _add_paths(env: EnvSpec) -> None:
    import site  # lazy: imported at start-up already (the interpreter runs without -S); named here

    before = set(sys.path)
    for directory in env.site:
        try:
            pth = any(name.endswith(".pth") for name in os.listdir(directory))
        except OSError:
            continue
        if pth:
            site.addsitedir(directory)  # appends it, and what its .pth files name (an editable install)
        elif directory not in before:
            sys.path.append(directory)  # the same, for a quarter of the time in a new worker (no stat of sys.path)
    added = [entry for entry in sys.path if entry not in before]
    for entry in added:
        sys.path.remove(entry)
    code = [entry for entry in env.code if entry not in before and os.path.isdir(entry)]
    at = _after_stdlib()
    sys.path[at:at] = [*code, *added]


def _after_stdlib() -> int:
    """Where ``sys.path``'s standard library entries end (the zip, the library, ``lib-dynload``).

    The library is where ``os`` came from: ``sysconfig`` would say so too, at the cost of its
    configuration's import (~5 ms), on the path of every such worker's start."""
    stdlib = os.path.dirname(os.__file__)
    for index, entry in enumerate(sys.path):
        path = os.path.normpath(entry or ".")
        if path.endswith(".zip") or (
            (path == stdlib or path.startswith(stdlib + os.sep)) and "-packages" not in path
        ):
            continue
        return index
    return len(sys.path)


def distribution_of(name: str) -> str:
    """The package on the index that usually provides the top-level module ``name``."""
    return _DISTRIBUTIONS.get(name, name.replace("_", "-").lower())


def missing_module_hint(exc: BaseException) -> str:
    """What to do about ``exc`` when it is a module that is not installed where the worker ran; ""
    otherwise (another error, a helper of the tools dir, a submodule of a package that is there)."""
    if not isinstance(exc, ModuleNotFoundError) or not exc.name or not _current:
        return ""
    top = exc.name.partition(".")[0]
    if not top or top.startswith("_") or top in sys.stdlib_module_names:
        return ""
    try:
        if top != exc.name and importlib.util.find_spec(top) is not None:
            return ""  # the package is there, its submodule is not: nothing to install
    except (ImportError, ValueError):
        pass
    spec = _current[0]
    if spec.env is None or not spec.env.code:  # the project's environment is not on
        own = _own_code(top, spec.cwd)
        if own is not None:
            return _own_code_hint(top, own, spec.cwd)
        found = _in_project_venv(top, spec.cwd)
        if found is not None:
            return (
                f"`{top}` is installed in the project's environment ({found[1]}), which its tools do not use; "
                f"turn it on: {_trust_command(found[0], spec.cwd)}"
            )
    package = distribution_of(top)
    env = spec.env
    if env is not None and env.kind == "declared":
        listed = ", ".join(f'"{r}"' for r in [*env.requirements, package])
        return (
            f"no package provides `{top}` in the environment of the dependencies the module declares "
            f"({env.name}); add the package that provides it to them (`{package}`, usually): "
            f"dependencies = [{listed}]"
        )
    if env is not None:
        return (
            f"no package provides `{top}` in the project's environment ({env.name}) nor in atomictoolsd's own; "
            f"install it in the project's: {_install_command(env.python, package)}"
        )
    return (
        f"no package provides `{top}` in the environment the worker ran in (atomictoolsd's own: "
        f"{sys.prefix}, Python {sys.version_info.major}.{sys.version_info.minor}); declare it in the module, "
        f"and the daemon installs it for the module (PEP 723): # /// script / # dependencies = [\"{package}\"] / "
        f"# ///; or install it there: {_install_command(sys.executable, package)}"
    )


def _install_command(python: str, package: str) -> str:
    """The command that installs ``package`` for the interpreter ``python``: its pip where it has
    one, else uv (which needs none)."""
    prefix = os.path.dirname(os.path.dirname(python))
    has_pip = (python == sys.executable and importlib.util.find_spec("pip") is not None) or any(
        os.path.isdir(os.path.join(prefix, lib, f"python{sys.version_info.major}.{sys.version_info.minor}", "site-packages", "pip"))
        for lib in ("lib", "lib64")
    )
    if has_pip:
        return f"{shlex.quote(python)} -m pip install {shlex.quote(package)}"
    return f"uv pip install --python {shlex.quote(python)} {shlex.quote(package)}"


def _own_code(top: str, root: str) -> str | None:
    """Where the project at ``root`` has a module or package named ``top`` (its root, its ``src/``);
    None for no project (the global tools run in the home directory)."""
    if not root or root == "/" or root == os.path.expanduser("~"):
        return None
    for base in (root, os.path.join(root, "src")):
        for candidate in (os.path.join(base, top), os.path.join(base, f"{top}.py")):
            if os.path.exists(candidate):
                return candidate
    return None


def _project_venv(root: str) -> str | None:
    """The project's virtual environment, as ``list`` and ``doctor`` offer it (its ``.venv``, else
    its ``venv``); None for none, or for no project (the global tools run in the home directory)."""
    if not root or root == "/" or root == os.path.expanduser("~"):
        return None
    for name in _VENV_NAMES:
        path = os.path.join(root, name)
        if os.path.isfile(os.path.join(path, "pyvenv.cfg")):
            return path
    return None


def _in_project_venv(top: str, root: str) -> tuple[str, str] | None:
    """The project's virtual environment and its site-packages dir that holds ``top``, if one does."""
    venv = _project_venv(root)
    if venv is None:
        return None
    site = os.path.join(venv, "lib", f"python{sys.version_info.major}.{sys.version_info.minor}", "site-packages")
    try:
        names = os.listdir(site)
    except OSError:
        return None
    if top in names or f"{top}.py" in names or any(n.startswith(f"{top}.") and n.endswith(".so") for n in names):
        return venv, site
    return None


def _trust_command(venv: str, root: str) -> str:
    return f"atomictoolsd trust --python {shlex.quote(venv)} {shlex.quote(root)}"


def _own_code_hint(top: str, found: str, root: str) -> str:
    venv = _project_venv(root)
    if venv is not None:
        how = f"turn it on: {_trust_command(venv, root)}"
    else:
        trust = _trust_command(os.path.join(root, ".venv"), root)
        how = f"make one (uv venv, or python -m venv .venv, in {shlex.quote(root)}) and turn it on: {trust}"
    return (
        f"`{top}` is the project's own code ({found}): a tool imports it when its tools run with the "
        f"project's environment (the project's root and src/ on the path); {how}"
    )
