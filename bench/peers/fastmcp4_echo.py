"""The standalone FastMCP (4.x) peer: the same echo tool, over stdio or its Streamable HTTP server.

    fastmcp4_echo.py [N]                 # stdio; N more tools echo0 … echo{N-1}
    fastmcp4_echo.py --http PORT         # Streamable HTTP on 127.0.0.1:PORT/mcp
"""

import sys

from fastmcp import FastMCP

server = FastMCP("bench")


def echo(text: str) -> str:
    """Echo the text back."""
    return text


server.tool(echo)
if len(sys.argv) > 1 and sys.argv[1] != "--http":
    for i in range(int(sys.argv[1])):
        server.tool(echo, name=f"echo{i}")

if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--http":
        server.run(transport="http", host="127.0.0.1", port=int(sys.argv[2]), show_banner=False, log_level="warning")
    else:
        server.run("stdio", show_banner=False)
