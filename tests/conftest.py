"""Fixtures: an isolated environment per test, and a daemon running in it.

``daemon`` starts a real ``atomictoolsd serve`` in a temporary home/runtime dir; at teardown it is
stopped with SIGTERM and the test fails if any process it started is still alive.
"""

from __future__ import annotations

import compileall
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import atomictools
import atomictoolsd

sys.path.insert(0, str(Path(__file__).parent))

from helpers import Daemon, Env, stop_detached  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    """Compile the daemon's and the client's sources to bytecode once, before the tests start.

    Every daemon, fork server, CLI command and shim a test starts imports them; a Python that writes
    no bytecode (PYTHONDONTWRITEBYTECODE, as containers set it) would compile them from source
    again in each of those processes, which was more than half of a daemon's start-up CPU. An
    installed package has its bytecode from the installer; this gives the editable checkout the
    same. It still reads a file that changed: the bytecode records its source's time and size.
    Only the controller compiles (pytest-xdist's workers start after it)."""
    if not hasattr(config, "workerinput"):
        for package in (atomictools, atomictoolsd):
            compileall.compile_dir(Path(package.__file__).parent, quiet=1)


@pytest.hookimpl(hookwrapper=True)
def pytest_collection(session: pytest.Session) -> Iterator[None]:
    """Let pytest keep the test modules it rewrote (its own bytecode, in ``__pycache__``) even where
    Python writes none: each pytest-xdist worker collects every test module, and rewriting them all
    again cost each worker more than half of its collection time."""
    writes = sys.dont_write_bytecode
    sys.dont_write_bytecode = False
    try:
        yield
    finally:
        sys.dont_write_bytecode = writes


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Env]:
    environment = Env(tmp_path)
    # In-process code (clients, path helpers) must see the same isolated paths as the daemon.
    for key in list(__import__("os").environ):
        if key.startswith(("ATOMICTOOLS_", "XDG_")):
            monkeypatch.delenv(key)
    for key, value in environment.vars.items():
        if key == "HOME" or key.startswith("XDG_"):
            monkeypatch.setenv(key, value)
    yield environment
    environment.cleanup()


@pytest.fixture
def make_daemon(env: Env) -> Iterator[object]:
    """Start daemons in ``env`` (with extra environment); every one is stopped and checked."""
    started: list[Daemon] = []

    def make(extra_env: dict[str, str] | None = None, start: bool = True, **options: Any) -> Daemon:
        daemon = Daemon(env, extra_env, **options)
        started.append(daemon)
        return daemon.start() if start else daemon

    yield make
    problems = []
    for daemon in started:
        if daemon.proc is not None and daemon.proc.poll() is None:
            daemon.stop()
        left = daemon.reap_leftovers() if daemon.leftovers() else []
        if left:
            problems.append(f"processes left behind: {[p.pid for p in left]}")
    if problems:
        pytest.fail("; ".join(problems))


@pytest.fixture
def daemon(make_daemon: object) -> Daemon:
    return make_daemon()  # type: ignore[operator]


@pytest.fixture
def detached(env: Env) -> Iterator[Env]:
    """For tests whose daemon is started detached (by the CLI or a client): stopped by its pid."""
    yield env
    stop_detached(env)
