"""The four-process floor's extra hop: a stdio relay in front of ``floor_relay.py``'s socket.

    python -I -S floor_stdio_relay.py SOCKET_PATH

What the shim costs at the least: a standard-library process that copies stdin to a Unix socket and
the socket to stdout, with one thread each way and no parsing at all. The calls bench puts it in
front of the floor relay (client → this → relay → worker: four processes, as client → shim → daemon
→ worker), so the shim path has a floor of its own, measured in the same run.

Exits when stdin closes or the socket does.
"""

from __future__ import annotations

import os
import socket
import sys
import threading


def main() -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(sys.argv[1])

    def up() -> None:
        while data := os.read(0, 65536):
            sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)

    threading.Thread(target=up, daemon=True).start()
    while data := sock.recv(65536):
        os.write(1, data)


if __name__ == "__main__":
    main()
