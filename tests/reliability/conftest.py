"""The reliability suite states what it held: each test records its figures (calls made, faults
injected, inputs tried), and the session ends with them in a "reliability record" section, so a
normal test run reads as a record.

A figure travels as a user property of its test's report, so the record is whole when the tests
run in several processes (pytest-xdist): the controller reads the reports of every worker.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

_KEY = "reliability-record"
_RECORD: list[tuple[str, str]] = []


@pytest.fixture
def record(request: pytest.FixtureRequest) -> Callable[[str], None]:
    """``record("12,000 calls answered exactly once")`` adds a line to the reliability record."""

    def add(figure: str) -> None:
        request.node.user_properties.append((_KEY, figure))

    return add


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when != "teardown":
        return
    name = report.nodeid.rsplit("::", 1)[-1]
    _RECORD.extend((name, figure) for key, figure in report.user_properties if key == _KEY)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _RECORD:
        return
    terminalreporter.section("reliability record")
    for name, figure in _RECORD:
        terminalreporter.write_line(f"{name}: {figure}")
