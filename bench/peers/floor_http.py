"""The HTTP floor: the least an MCP ``tools/call`` over HTTP can cost here, with the daemon's own
HTTP library (httptools' parser on an asyncio Protocol, in a uvloop loop), now.

    python floor_http.py PORT

Every POST is parsed and answered with a canned ``tools/call`` result (``Content-Length``, keep-
alive) in one write; no header is looked at, no JSON decoded, no session, no worker. The http bench
measures it with the same client in the same run, so the distance from it to the daemon's endpoint
is what the daemon's HTTP glue, session and worker hop cost. Prints ``ready`` once it listens; exits
on SIGTERM.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import httptools

ANSWER = b'{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"hi"}]}}'
RESPONSE = (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nmcp-session-id: floor\r\ncontent-length: %d\r\n\r\n"
            % len(ANSWER) + ANSWER)


class Floor(asyncio.Protocol):
    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.parser = httptools.HttpRequestParser(self)

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_message_complete(self) -> None:
        self.transport.write(RESPONSE)


async def main(port: int) -> None:
    server = await asyncio.get_running_loop().create_server(Floor, "127.0.0.1", port)
    print("ready", flush=True)
    await server.serve_forever()


if __name__ == "__main__":
    import uvloop

    uvloop.run(main(int(sys.argv[1])))
