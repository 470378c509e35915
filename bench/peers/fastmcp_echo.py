"""The peer for mcp 1.x: FastMCP serving the same echo tool over stdio (run in its own venv)."""

from mcp.server.fastmcp import FastMCP

server = FastMCP("bench")


@server.tool()
def echo(text: str) -> str:
    """Echo the text back."""
    return text


if __name__ == "__main__":
    server.run("stdio")
