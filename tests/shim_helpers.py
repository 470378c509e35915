"""Helpers for driving the stdio shim with the official MCP client, as agents do.

``mcp_session`` launches a command (the ``atomictoolsd mcp`` console script by default, or a bridge
script) with the official client's ``stdio_client`` and yields an initialized ``ClientSession``
together with a ``Seen`` record of every notification and of every stdout line that was not MCP.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from mcp import ClientSession, StdioServerParameters, stdio_client

from helpers import Env

__all__ = ["SHIM", "Seen", "mcp_session", "run", "shim_params", "wait_until"]

# The console script agents run, beside this interpreter (never through a pyenv shim).
SHIM = str(Path(sys.executable).parent / "atomictoolsd")


@dataclass
class Seen:
    """What arrived besides responses: notifications by method, and stdout lines that were not MCP."""

    notifications: list[Any] = field(default_factory=list)
    garbage: list[Exception] = field(default_factory=list)

    def methods(self) -> list[str]:
        return [getattr(n, "method", "") for n in self.notifications]

    async def handle(self, message: Any) -> None:
        if isinstance(message, Exception):
            self.garbage.append(message)
        else:
            self.notifications.append(message)


def shim_params(env: Env, *args: str, command: str | None = None, cwd: Path | None = None) -> StdioServerParameters:
    """Launch parameters for the shim (``command`` replaces the console script, e.g. a bridge)."""
    if command is None:
        return StdioServerParameters(command=SHIM, args=["mcp", *args], env=env.vars, cwd=str(cwd or env.project))
    return StdioServerParameters(command=command, args=list(args), env=env.vars, cwd=str(cwd or env.project))


@asynccontextmanager
async def mcp_session(
    env: Env, *args: str, command: str | None = None, initialize: bool = True, cwd: Path | None = None,
    **callbacks: Any,
) -> AsyncIterator[tuple[ClientSession, Seen]]:
    """An official ``ClientSession`` over the shim's stdio; the shim's stderr goes to ``env.root``.

    ``callbacks`` go to the ``ClientSession`` (``elicitation_callback``, ``sampling_callback``).
    """
    seen = Seen()
    with open(env.root / "shim.stderr", "a") as errlog:
        async with stdio_client(shim_params(env, *args, command=command, cwd=cwd), errlog=errlog) as (read, write):
            async with ClientSession(read, write, message_handler=seen.handle, **callbacks) as session:
                if initialize:
                    await session.initialize()
                yield session, seen
    assert not seen.garbage, f"the shim wrote something that is not MCP: {seen.garbage}"


async def wait_until(predicate: Callable[[], Any], timeout: float = 15.0, message: str = "condition") -> Any:
    """Poll ``predicate`` inside an event loop until it is truthy."""
    with anyio.fail_after(timeout):
        while True:
            value = predicate()
            if value:
                return value
            await anyio.sleep(0.01)
    raise AssertionError(message)  # pragma: no cover - fail_after raises first


def run(scenario: Callable[[], Awaitable[Any]]) -> Any:
    """Run an async test scenario to completion."""
    return anyio.run(scenario)
