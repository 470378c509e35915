"""The reliability suite states what it held: each test records its figures (calls made, faults
injected, inputs tried), and the session ends with them in a "reliability record" section, so a
normal test run reads as a record."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

_RECORD: list[tuple[str, str]] = []


@pytest.fixture
def record(request: pytest.FixtureRequest) -> Callable[[str], None]:
    """``record("12,000 calls answered exactly once")`` adds a line to the reliability record."""

    def add(figure: str) -> None:
        _RECORD.append((request.node.name, figure))

    return add


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _RECORD:
        return
    terminalreporter.section("reliability record")
    for name, figure in _RECORD:
        terminalreporter.write_line(f"{name}: {figure}")
