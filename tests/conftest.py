"""Fixtures: an isolated environment per test, and a daemon running in it.

``daemon`` starts a real ``atomictoolsd serve`` in a temporary home/runtime dir; at teardown it is
stopped with SIGTERM and the test fails if any process it started is still alive.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from helpers import Daemon, Env, stop_detached  # noqa: E402


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
