"""The peer for mcp 2.x: MCPServer serving the same echo tool over stdio (run in its own venv)."""

from mcp.server.mcpserver import MCPServer

server = MCPServer("bench")


@server.tool()
def echo(text: str) -> str:
    """Echo the text back."""
    return text


if __name__ == "__main__":
    server.run("stdio")
