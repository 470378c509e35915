"""The public surface of atomictools, the layers of atomictoolsd, and the imports that must never
happen (docs/architecture.md)."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import atomictools
import atomictoolsd


def test_public_names_are_exactly_the_intended_ones() -> None:
    assert atomictools.__all__ == sorted(atomictools.__all__)
    assert set(atomictools.__all__) == {
        "AskError", "AsyncClient", "AtomicToolsError", "Audio", "CallTimeout", "CannotConnect", "Client",
        "ConnectError", "ConnectionLost", "Context", "Elicitation", "Field", "Image", "ProtocolError", "RPCError",
        "Resource", "ResourceLink", "Sample", "ToolError", "ToolResult", "TransportError", "UnknownTool",
        "__version__", "tool",
    }
    for name in atomictools.__all__:
        assert getattr(atomictools, name) is not None
    with pytest.raises(AttributeError):
        atomictools.nonexistent  # noqa: B018


def modules_after(code: str) -> set[str]:
    """The modules a fresh interpreter has loaded after running ``code``."""
    out = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys, json\nprint(json.dumps(sorted(sys.modules)))"],
        capture_output=True, text=True, check=True,
    ).stdout
    return set(json.loads(out.splitlines()[-1]))


def test_tool_authoring_never_imports_the_daemon() -> None:
    loaded = modules_after("from atomictools import tool, Field, Context, ToolError, Client")
    assert not {m for m in loaded if m.startswith("atomictoolsd")}
    assert not loaded & {"uvloop", "watchfiles", "psutil", "platformdirs"}


DAEMON_SIDE = ("atomictoolsd.server", "atomictoolsd.sessions", "atomictoolsd.registry", "atomictoolsd.pool",
               "atomictoolsd.eventlog", "atomictoolsd.config")


def ours(loaded: set[str], prefixes: tuple[str, ...]) -> set[str]:
    return {m for m in loaded if any(m == p or m.startswith(p + ".") for p in prefixes)}


def test_the_worker_runtime_stays_light() -> None:
    loaded = modules_after("import atomictoolsd.worker.main, atomictoolsd.worker.forkserver")
    assert not loaded & {"uvloop", "watchfiles", "psutil", "platformdirs"}
    assert not ours(loaded, DAEMON_SIDE)
    assert ours(loaded, ("atomictoolsd",)) - ours(loaded, (WORKER, PROTOCOL, UTIL)) == {"atomictoolsd"}
    # pydantic only in a worker whose module imports it (tests/e2e/test_pydantic.py).
    assert not {m for m in loaded if m.partition(".")[0] in ("pydantic", "pydantic_core")}


def test_python_workers_never_pay_for_declarative_tools() -> None:
    # The fork server imports these only before forking the first worker of a JSON file.
    loaded = modules_after("import atomictoolsd.worker.main, atomictoolsd.worker.forkserver")
    assert "fastjsonschema" not in loaded
    assert not ours(loaded, ("atomictoolsd.worker.declarative",))


def test_declarative_handlers_and_builtins_stay_in_workers() -> None:
    loaded = modules_after(
        "import atomictoolsd.worker.declarative, atomictoolsd.worker.builtins._common, atomictoolsd.registry.trust,"
        " atomictoolsd.config.discovery"
    )
    assert not ours(loaded, ("atomictoolsd.server", "atomictoolsd.sessions", "atomictoolsd.registry.projects",
                             "atomictoolsd.pool"))
    assert not loaded & {"uvloop", "watchfiles", "psutil"}


def test_socket_path_lookup_is_standard_library_only() -> None:
    loaded = modules_after("from atomictools._paths import socket_path; socket_path()")
    assert "msgspec" not in loaded
    assert not {m for m in loaded if m.startswith("atomictoolsd")}


def test_the_registry_knows_nothing_of_sockets_or_sessions() -> None:
    loaded = modules_after(
        "import atomictoolsd.registry.projects, atomictoolsd.registry.watcher, atomictoolsd.registry.idle"
    )
    assert not ours(loaded, ("atomictoolsd.sessions", "atomictoolsd.server", "atomictoolsd.bridges"))


def test_the_sandbox_needs_only_the_standard_library() -> None:
    # It moves with the worker runtime and runs in a worker before the tool module: nothing of the
    # daemon, and nothing outside the standard library.
    loaded = modules_after("import atomictoolsd.worker.sandbox")
    assert not ours(loaded, ("atomictoolsd",)) - {"atomictoolsd", "atomictoolsd.worker",
                                                  "atomictoolsd.worker.sandbox", "atomictoolsd.worker.netns",
                                                  "atomictoolsd.worker.gitindex"}
    assert not loaded & {"msgspec", "uvloop", "watchfiles", "psutil", "platformdirs"}
    # And workers that are not confined never import it.
    assert "atomictoolsd.worker.sandbox" not in modules_after(
        "import atomictoolsd.worker.main, atomictoolsd.worker.forkserver"
    )


# -- the import graph of atomictoolsd ------------------------------------------------------------
#
# Layers, top to bottom (docs/architecture.md). An import may point down, or sideways inside one
# layer; never up, and never in a circle. The worker package (runtime, tool kinds) and the protocol
# are beside the daemon side's bottom, not on it: they may not import config or the event log.

LAYERS: list[tuple[str, ...]] = [
    ("atomictoolsd.__main__", "atomictoolsd.cli", "atomictoolsd.shim"),  # entry points
    ("atomictoolsd.server",),  # the daemon process: lifecycle, socket, signals, wiring
    # The built-in tools run in workers (they are in atomictoolsd.worker) but are tools like any
    # other: the workspace tool reads the trust store and the configuration to report them.
    ("atomictoolsd.sessions", "atomictoolsd.transports", "atomictoolsd.bridges", "atomictoolsd.service", "atomictoolsd.worker.builtins"),
    ("atomictoolsd.registry", "atomictoolsd.environments"),  # environments: what a module's workers import from
    ("atomictoolsd.pool",),  # the daemon's side of workers: pool, worker, spawner, monitor
    ("atomictoolsd.worker",),  # inside a worker and the fork servers: the runtime, the tool kinds
    ("atomictoolsd.protocol",),  # both sides
    ("atomictoolsd.eventlog",),
    ("atomictoolsd.config",),
    ("atomictoolsd.util",),  # general helpers of any process, standard library only
    ("atomictoolsd",),  # the package itself: __version__
]
WORKER = "atomictoolsd.worker"  # what runs in a worker process or a fork server
PROTOCOL = "atomictoolsd.protocol"  # what the daemon and a worker say: both import it
UTIL = "atomictoolsd.util"  # what any process may import
BUILTINS = "atomictoolsd.worker.builtins"
WORKER_SIDE = (WORKER, PROTOCOL)
# What the daemon's side imports of the worker package besides the protocol, and why: probes,
# constants and the fork server's entry, never the code that serves a call. Anything else the
# daemon needs of a worker's code goes to the protocol or to util.
DAEMON_USES_OF_THE_WORKER = {
    "atomictoolsd.worker.sandbox": "support() and limit_abi: what this kernel can enforce; PROTECTED for the policy",
    "atomictoolsd.worker.netns": "support(): whether this machine lets a worker have a network namespace",
    "atomictoolsd.worker.gitindex": "the submodules an index lists, for an agent's trust entry",
    "atomictoolsd.worker.forkserver": "fork_early forks the first fork server from the daemon and runs it",
    "atomictoolsd.worker.jsexec": "JS_DIR: where the JavaScript runtime's files are",
    "atomictoolsd.worker.output": "the output rate limit, which the daemon holds again",
    "atomictoolsd.worker.limits": "describe_limit: the memory limit's text, the same on both sides",
    "atomictoolsd.worker.truncate": "remove_old_spills: the daemon sweeps the spill files workers leave",
    "atomictoolsd.worker.builtins": "BUILTIN_DIR: the wiring serves the built-ins' tools dir",
    "atomictoolsd.worker.portable": "the portable-schema pass, which the daemon gives a JavaScript worker's definitions",
}
# The built-in tools report the daemon's settings, trust and tools dirs as the CLI reads them.
BUILTINS_USE_OF_THE_DAEMON = ("atomictoolsd.config", "atomictoolsd.registry.trust", "atomictoolsd.registry.confinement")
DAEMON_BOTTOM = ("atomictoolsd.config", "atomictoolsd.eventlog")
PACKAGE_DIR = Path(atomictoolsd.__file__).resolve().parent
CLIENT_DIR = Path(atomictools.__file__).resolve().parent


class Import:
    def __init__(self, source: str, target: str, path: Path, line: int, lazy: bool, reason: str | None) -> None:
        self.source, self.target, self.path, self.line, self.lazy, self.reason = source, target, path, line, lazy, reason

    def __repr__(self) -> str:
        return f"{self.source} -> {self.target} ({self.path}:{self.line})"


def module_files(root: Path = PACKAGE_DIR) -> dict[str, Path]:
    modules = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def lazy_reason(text: str) -> str | None:
    """What a ``# lazy: REASON`` comment in ``text`` (an import's lines) says, if it has one."""
    match = re.search(r"#\s*lazy:\s*(\S[^\n]*)", text)
    return match.group(1).strip() if match else None


def imports_of(modules: dict[str, Path], every: bool = False) -> list[Import]:
    """Every import of a module of the package ``modules`` make up (atomictoolsd or atomictools), at
    any depth: top level, inside functions (lazy) and under ``if TYPE_CHECKING`` alike: a type-only
    import is an arrow too. With ``every``, imports of any other module (the standard library's, a
    third party's) as well."""
    own = {name.partition(".")[0] for name in modules}
    found: list[Import] = []
    for name, path in modules.items():
        source = path.read_text()
        lines = source.splitlines()
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]

        def visit(node: ast.AST, in_function: bool, name: str = name, package: str = package, path: Path = path,
                  lines: list[str] = lines) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.Import):
                    targets = [alias.name for alias in child.names]
                elif isinstance(child, ast.ImportFrom):
                    base = child.module or ""
                    if child.level:
                        parts = package.split(".")
                        base = ".".join(parts[: len(parts) - child.level + 1] + ([child.module] if child.module else []))
                    # ``from package import module`` imports the module; ``from module import name`` the module.
                    targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in child.names]
                else:
                    visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))
                    continue
                text = "\n".join(dict.fromkeys((lines[child.lineno - 1], lines[(child.end_lineno or child.lineno) - 1])))
                for target in targets:
                    if (every or target.split(".")[0] in own) and target != name:
                        found.append(Import(name, target, path, child.lineno, in_function, lazy_reason(text)))

        visit(ast.parse(source), False)
    return found


def layer_of(module: str) -> int:
    """The index in LAYERS of the most specific prefix naming ``module``'s layer."""
    best, best_len = -1, -1
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_len:
                best, best_len = index, len(prefix)
    assert best >= 0, f"{module} is in no layer: add it to LAYERS and docs/architecture.md"
    return best


def in_any(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


GRAPH = imports_of(module_files())
CLIENT_GRAPH = imports_of(module_files(CLIENT_DIR))


def test_every_module_is_in_a_layer() -> None:
    for module in module_files():
        layer_of(module)


def test_no_import_points_up() -> None:
    upward = [i for i in GRAPH if layer_of(i.target) < layer_of(i.source)]
    assert not upward, "imports from a lower layer to a higher one (pass a protocol down instead):\n" + "\n".join(
        map(repr, upward)
    )


def test_the_worker_side_needs_nothing_of_the_daemon_side() -> None:
    # The runtime, the tool kinds and the protocol run in workers: not config, not the event log.
    wrong = [i for i in GRAPH if in_any(i.source, WORKER_SIDE) and not in_any(i.source, (BUILTINS,))
             and in_any(i.target, DAEMON_BOTTOM)]
    assert not wrong, wrong


def test_the_shim_imports_only_the_standard_library() -> None:
    shim = [(name, path) for name, path in module_files().items() if in_any(name, ("atomictoolsd.shim",))]
    assert shim
    for name, path in shim:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                roots = [alias.name.split(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                roots = [(node.module or "").split(".")[0]]
            else:
                continue
            for root in roots:
                # atomictools._paths is standard library only (test_socket_path_lookup_is_standard_library_only)
                own = root == "atomictoolsd" or (root == "atomictools" and node.module in ("atomictools._paths",
                      "atomictools._autostart", "atomictools._errors"))
                assert own or root in sys.stdlib_module_names or root == "__future__", f"{name}:{node.lineno} imports {root}"


def cycles_of(graph: list[Import]) -> list[list[str]]:
    """The import cycles of ``graph``, each as the modules along it, the first again at the end."""
    edges: dict[str, set[str]] = {}
    for i in graph:
        edges.setdefault(i.source, set()).add(i.target)
    cycles = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node)
    return cycles


def test_there_are_no_import_cycles() -> None:
    cycles = cycles_of(GRAPH)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_atomictools_has_no_import_cycles() -> None:
    # What tool authors and clients import. The code that builds a tool's schemas from its
    # signature needs the authoring surface, so it lives above it, in atomictoolsd.worker.
    assert {i.source for i in CLIENT_GRAPH} >= {"atomictools", "atomictools._authoring", "atomictools._client"}
    cycles = cycles_of(CLIENT_GRAPH)
    assert not cycles, "import cycles in atomictools:\n" + "\n".join(" -> ".join(c) for c in cycles)


# An import inside a function hides an arrow and costs at the call: it is there only to keep a cost
# off a path that does not need it, and its line says which (``# lazy: REASON``). The command line
# says it once for all of its own: a command imports what only it uses, so that ``--help``, the
# shim's ``mcp`` branch and the other commands never pay for it (docs/architecture.md, "Imports
# inside functions").
LAZY_BY_RULE = ("atomictoolsd.cli",)


def test_every_lazy_import_says_why() -> None:
    every = imports_of(module_files(), every=True) + imports_of(module_files(CLIENT_DIR), every=True)
    assert any(i.lazy and in_any(i.source, LAZY_BY_RULE) for i in every)
    silent = [i for i in every if i.lazy and not i.reason and not in_any(i.source, LAZY_BY_RULE)]
    assert not silent, "imports inside functions without a `# lazy: REASON` comment:\n" + "\n".join(map(repr, silent))


def test_the_graph_test_sees_what_it_must(tmp_path: Path) -> None:
    # The checks above would pass on an empty graph: make sure each kind of import is found, and that
    # an upward arrow and a cycle are caught, on a package made for it.
    root = tmp_path / "atomictoolsd"
    (root / "registry").mkdir(parents=True)
    (root / "server").mkdir()
    (root / "__init__.py").write_text("")
    (root / "registry" / "__init__.py").write_text("")
    (root / "server" / "__init__.py").write_text("")
    (root / "registry" / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from atomictoolsd.server.b import B\n"
    )
    (root / "server" / "b.py").write_text("def f():\n    from atomictoolsd.registry import a\n")
    found = imports_of(module_files(root))
    assert {(i.source, i.target, i.lazy) for i in found} == {
        ("atomictoolsd.registry.a", "atomictoolsd.server.b", False),
        ("atomictoolsd.server.b", "atomictoolsd.registry.a", True),
    }
    assert [i for i in found if layer_of(i.target) < layer_of(i.source)][0].source == "atomictoolsd.registry.a"
    assert not any(i.reason for i in found)
    (root / "server" / "b.py").write_text("def f():\n    from atomictoolsd.registry import a  # lazy: a reason\n")
    assert [i.reason for i in imports_of(module_files(root)) if i.lazy] == ["a reason"]


# -- folders by process (docs/architecture.md, "Where each process's code lives") ---------------


def daemon_side(module: str) -> bool:
    """The daemon's side and the entry points: everything of ours but the worker package, the
    protocol, the general helpers and the package's own ``__init__``."""
    return module.startswith("atomictoolsd.") and not in_any(module, (WORKER, PROTOCOL, UTIL))


def test_the_worker_package_imports_nothing_of_the_daemon_side() -> None:
    wrong = [i for i in GRAPH if in_any(i.source, (WORKER,)) and daemon_side(i.target)
             and not (in_any(i.source, (BUILTINS,)) and in_any(i.target, BUILTINS_USE_OF_THE_DAEMON))]
    assert not wrong, "the worker package imports the daemon's side (move the code, or pass it in the spec):\n" + (
        "\n".join(map(repr, wrong)))


def test_the_daemon_side_imports_of_the_worker_package_only_the_protocol_and_named_probes() -> None:
    named = tuple(DAEMON_USES_OF_THE_WORKER)
    wrong = [i for i in GRAPH if daemon_side(i.source) and in_any(i.target, (WORKER,)) and not in_any(i.target, named)]
    assert not wrong, "the daemon imports a worker's code (use atomictoolsd.protocol, or name it in " \
        "DAEMON_USES_OF_THE_WORKER with the reason):\n" + "\n".join(map(repr, wrong))


def test_general_helpers_need_only_the_standard_library() -> None:
    helpers = {name: path for name, path in module_files().items() if in_any(name, (UTIL,))}
    assert helpers
    for name, path in helpers.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                roots = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                roots = [node.module or ""]
            else:
                continue
            for root in roots:
                ok = in_any(root, (UTIL,)) or root.split(".")[0] in sys.stdlib_module_names or root == "__future__"
                assert ok, f"{name}:{node.lineno} imports {root}: util is for any process, standard library only"
