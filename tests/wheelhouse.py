"""A package index of the test's own: real wheels (built here, pure Python), served over real HTTP
as PEP 503 pages, which uv and pip install from as from PyPI. A test can hold a download back
(``Index.hold``) to see what the daemon does while an install runs."""

from __future__ import annotations

import base64
import hashlib
import http.server
import threading
import zipfile
from pathlib import Path

__all__ = ["Index", "make_wheel"]


def make_wheel(directory: Path, name: str, version: str, source: str) -> Path:
    """A wheel of one module ``name`` holding ``source``."""
    dist = f"{name}-{version}"
    files = {
        f"{name}.py": source.encode(),
        f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{dist}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = [
        f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},{len(data)}"
        for path, data in files.items()
    ]
    files[f"{dist}.dist-info/RECORD"] = ("\n".join([*record, f"{dist}.dist-info/RECORD,,"]) + "\n").encode()
    wheel = directory / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, data in files.items():
            archive.writestr(path, data)
    return wheel


class Index:
    """``http://127.0.0.1:PORT/simple/`` serving the wheels in ``directory``; stop it with ``close``."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.released = threading.Event()
        self.released.set()
        self.asked = threading.Event()  # a wheel was asked for (while held, it waits)
        index = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
                self._answer(body=True)

            def do_HEAD(self) -> None:  # noqa: N802 - uv asks whether a wheel can be read in ranges
                self._answer(body=False)

            def _answer(self, body: bool) -> None:
                parts = [p for p in self.path.split("?")[0].split("/") if p]
                wheel = index.directory / parts[1] if parts[:1] == ["files"] and len(parts) == 2 else None
                if parts[:1] == ["simple"] and len(parts) == 2:
                    self._page(parts[1])
                elif wheel is not None and wheel.suffix == ".whl" and wheel.is_file():
                    if body:
                        index.asked.set()
                        index.released.wait(60)
                    self._send(wheel.read_bytes(), "application/octet-stream", body)
                else:
                    self.send_error(404)

            def _page(self, project: str) -> None:
                wheels = [w for w in sorted(index.directory.glob("*.whl"))
                          if w.name.split("-")[0].replace("_", "-").lower() == project.replace("_", "-").lower()]
                if not wheels:
                    self.send_error(404)
                    return
                links = "".join(
                    f'<a href="/files/{w.name}#sha256={hashlib.sha256(w.read_bytes()).hexdigest()}">{w.name}</a>\n'
                    for w in wheels
                )
                self._send(f"<!DOCTYPE html><html><body>\n{links}</body></html>".encode(), "text/html")

            def _send(self, data: bytes, kind: str, body: bool = True) -> None:
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if body:
                    self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the stdlib's name
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/simple"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def hold(self) -> None:
        """Keep every download waiting until ``release``."""
        self.asked.clear()
        self.released.clear()

    def release(self) -> None:
        self.released.set()

    def close(self) -> None:
        self.released.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)
