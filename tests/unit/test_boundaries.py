"""The public surface of atomictools, and the imports that must never happen (DESIGN §3)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import atomictools


def test_public_names_are_exactly_the_intended_ones() -> None:
    assert atomictools.__all__ == sorted(atomictools.__all__)
    assert set(atomictools.__all__) == {
        "AsyncClient", "AtomicToolsError", "Client", "ConnectError", "Context", "Field",
        "RPCError", "ToolError", "ToolResult", "__version__", "tool",
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


def test_the_worker_runtime_stays_light() -> None:
    loaded = modules_after("import atomictoolsd.workers.runtime, atomictoolsd.workers.forkserver")
    assert not loaded & {"uvloop", "watchfiles", "psutil", "platformdirs"}
    daemon_side = {"atomictoolsd.server", "atomictoolsd.session", "atomictoolsd.registry", "atomictoolsd.workers.pool"}
    assert not loaded & daemon_side


def test_python_workers_never_pay_for_declarative_tools() -> None:
    # The fork server imports these only before forking the first worker of a JSON file.
    loaded = modules_after("import atomictoolsd.workers.runtime, atomictoolsd.workers.forkserver")
    assert "fastjsonschema" not in loaded
    assert not {m for m in loaded if m.startswith("atomictoolsd.declarative")}


def test_declarative_handlers_and_builtins_stay_in_workers() -> None:
    loaded = modules_after(
        "import atomictoolsd.declarative, atomictoolsd.builtins._common, atomictoolsd.trust, atomictoolsd.discovery"
    )
    daemon_side = {"atomictoolsd.server", "atomictoolsd.session", "atomictoolsd.registry", "atomictoolsd.workers.pool"}
    assert not loaded & daemon_side
    assert not loaded & {"uvloop", "watchfiles", "psutil"}


def test_socket_path_lookup_is_standard_library_only() -> None:
    loaded = modules_after("from atomictools._paths import socket_path; socket_path()")
    assert "msgspec" not in loaded
    assert not {m for m in loaded if m.startswith("atomictoolsd")}


def test_the_registry_knows_nothing_of_sockets_or_sessions() -> None:
    loaded = modules_after("import atomictoolsd.registry")
    assert not loaded & {"atomictoolsd.session", "atomictoolsd.server"}


def test_the_sandbox_needs_only_the_standard_library() -> None:
    # It moves with the worker runtime and runs in a worker before the tool module: nothing of the
    # daemon, and nothing outside the standard library.
    loaded = modules_after("import atomictoolsd.workers.sandbox")
    assert not {m for m in loaded if m.startswith("atomictoolsd.") and m not in {"atomictoolsd.workers", "atomictoolsd.workers.sandbox"}}
    assert not loaded & {"msgspec", "uvloop", "watchfiles", "psutil", "platformdirs"}
    # And workers that are not confined never import it.
    assert "atomictoolsd.workers.sandbox" not in modules_after("import atomictoolsd.workers.runtime, atomictoolsd.workers.forkserver")
