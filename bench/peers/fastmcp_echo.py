"""The peer for mcp 1.x: FastMCP serving the same echo tool over stdio (run in its own venv).

``fastmcp_echo.py N`` also serves ``echo0`` … ``echo{N-1}`` (the same function under N names): the
peer's side of the "eight modules" load, which a single-process server can only serve as tools.
"""

import sys

from mcp.server.fastmcp import FastMCP

server = FastMCP("bench")


def echo(text: str) -> str:
    """Echo the text back."""
    return text


server.tool()(echo)
for i in range(int(sys.argv[1]) if len(sys.argv) > 1 else 0):
    server.tool(name=f"echo{i}")(echo)

if __name__ == "__main__":
    server.run("stdio")
