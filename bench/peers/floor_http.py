"""The HTTP floor: the least an MCP ``tools/call`` over HTTP can cost here, with the daemon's own
HTTP library (uvicorn on httptools, a raw ASGI app), now.

    python floor_http.py PORT

Every POST is read whole and answered with a canned ``tools/call`` result (``Content-Length``, keep-
alive); no JSON is decoded, no session, no worker. The http bench measures it with the same client
in the same run, so the distance from it to the daemon's endpoint is what the daemon's HTTP layer,
session and worker hop cost. Prints ``ready`` once it listens; exits on SIGTERM.
"""

from __future__ import annotations

import asyncio
import socket
import sys

import uvicorn

ANSWER = b'{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"hi"}]}}'
HEADERS = [(b"content-type", b"application/json"), (b"content-length", str(len(ANSWER)).encode()),
           (b"mcp-session-id", b"floor")]


async def app(scope, receive, send):  # type: ignore[no-untyped-def]
    if scope["type"] != "http":
        return
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
    await send({"type": "http.response.body", "body": ANSWER})


async def main(port: int) -> None:
    sock = socket.create_server(("127.0.0.1", port))
    config = uvicorn.Config(app, http="httptools", ws="none", lifespan="off", log_config=None, access_log=False,
                            server_header=False, date_header=False, loop="uvloop")
    server = uvicorn.Server(config)
    task = asyncio.ensure_future(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
    print("ready", flush=True)
    await task


if __name__ == "__main__":
    import uvloop

    uvloop.run(main(int(sys.argv[1])))
