"""What a tool may return besides text and data: ``Image``, ``Audio``, ``Resource`` and ``ResourceLink``.

Each is a small value a tool builds from bytes or a path; the worker turns it into the matching MCP
content block (``block()``) when the call returns, so a file is read once, in the worker, and a
tool's own tests can inspect the value without a daemon. The MIME type is the caller's, else guessed
from the data's first bytes, else from the file name; one that cannot be told is an error that says
to pass ``mime_type=``.

Standard library only: the worker runtime imports this for every result it shapes.
"""

from __future__ import annotations

import base64
import mimetypes
import os
from pathlib import Path
from typing import Any

__all__ = ["Audio", "Content", "Image", "Resource", "ResourceLink", "guess_mime_type"]

# (prefix at offset, offset, MIME type): the signatures of the formats agents show.
_MAGIC: tuple[tuple[bytes, int, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", 0, "image/png"),
    (b"\xff\xd8\xff", 0, "image/jpeg"),
    (b"GIF87a", 0, "image/gif"),
    (b"GIF89a", 0, "image/gif"),
    (b"WEBP", 8, "image/webp"),
    (b"BM", 0, "image/bmp"),
    (b"WAVE", 8, "audio/wav"),
    (b"ID3", 0, "audio/mpeg"),
    (b"\xff\xfb", 0, "audio/mpeg"),
    (b"\xff\xf3", 0, "audio/mpeg"),
    (b"OggS", 0, "audio/ogg"),
    (b"fLaC", 0, "audio/flac"),
    (b"%PDF-", 0, "application/pdf"),
)


def guess_mime_type(data: bytes | None, name: str | None = None) -> str | None:
    """The MIME type of ``data`` from its signature, else of ``name`` from its extension, else None."""
    if data:
        for magic, offset, mime in _MAGIC:
            if data.startswith(magic, offset) and (offset == 0 or data.startswith(b"RIFF")):
                return mime
        head = data[:256].lstrip()
        if head.startswith(b"<svg") or (head.startswith(b"<?xml") and b"<svg" in data[:1024]):
            return "image/svg+xml"
    if name:
        guessed, _ = mimetypes.guess_type(name)
        if guessed == "audio/x-wav":
            return "audio/wav"
        return guessed
    return None


class Content:
    """Base of the values a tool may return as content; ``block()`` is the MCP content block."""

    __slots__ = ()

    def block(self) -> dict[str, Any]:  # pragma: no cover - every subclass defines it
        raise NotImplementedError


class _Binary(Content):
    """Bytes, or a path read when the block is built."""

    __slots__ = ("_data", "mime_type", "path")
    kind = ""  # "image" or "audio"

    def __init__(self, source: bytes | bytearray | memoryview | str | os.PathLike[str], *, mime_type: str | None = None) -> None:
        if isinstance(source, (bytes, bytearray, memoryview)):
            self._data: bytes | None = bytes(source)
            self.path: str | None = None
        elif isinstance(source, (str, os.PathLike)):
            self._data = None
            self.path = os.fspath(source)
        else:
            raise TypeError(f"{type(self).__name__}() takes bytes or a path, not {type(source).__name__}")
        self.mime_type = mime_type

    @property
    def data(self) -> bytes:
        """The bytes (read from ``path`` on first use)."""
        if self._data is None:
            assert self.path is not None
            self._data = Path(self.path).read_bytes()
        return self._data

    def resolved_mime_type(self) -> str:
        mime = self.mime_type or guess_mime_type(self.data, self.path)
        if mime is None:
            what = f"{self.path!r}" if self.path else f"{len(self.data):,} bytes"
            raise ValueError(
                f"cannot tell the MIME type of the {self.kind} {what}: pass mime_type=, e.g. "
                f"{type(self).__name__}(..., mime_type='{self.kind}/png')"
            )
        if not mime.startswith(f"{self.kind}/"):
            raise ValueError(f"{type(self).__name__} got {mime} data; an {self.kind} needs an {self.kind}/* MIME type")
        return mime

    def block(self) -> dict[str, Any]:
        mime = self.resolved_mime_type()
        return {"type": self.kind, "data": base64.b64encode(self.data).decode("ascii"), "mimeType": mime}

    def __repr__(self) -> str:
        source = repr(self.path) if self.path is not None else f"<{len(self.data):,} bytes>"
        return f"{type(self).__name__}({source}, mime_type={self.mime_type!r})"


class Image(_Binary):
    """An image result: ``Image("plot.png")`` or ``Image(png_bytes)``; ``mime_type`` when it cannot be guessed."""

    __slots__ = ()
    kind = "image"


class Audio(_Binary):
    """An audio result: ``Audio("clip.wav")`` or ``Audio(wav_bytes, mime_type="audio/wav")``."""

    __slots__ = ()
    kind = "audio"


def _file_uri(path: str) -> str:
    return Path(path).resolve().as_uri()


class Resource(Content):
    """An embedded resource: its contents travel in the result.

    ``Resource("notes.md")`` reads a file (its URI is the file's ``file://`` URI);
    ``Resource(uri="test://x", text="…")`` or ``Resource(uri="…", data=b"…")`` embed what is given.
    Text goes as ``text``; bytes that are not UTF-8, or whose type is not textual, as a base64 ``blob``.
    """

    __slots__ = ("_data", "mime_type", "path", "text", "uri")

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        uri: str | None = None,
        text: str | None = None,
        data: bytes | None = None,
        mime_type: str | None = None,
    ) -> None:
        given = sum(x is not None for x in (path, text, data))
        if given != 1:
            raise TypeError("Resource() takes exactly one of a path, text= or data=")
        self.path = None if path is None else os.fspath(path)
        if uri is None:
            if self.path is None:
                raise TypeError("Resource(text=…) and Resource(data=…) need a uri=")
            uri = _file_uri(self.path)
        self.uri = uri
        self.text = text
        self._data = data
        self.mime_type = mime_type

    def block(self) -> dict[str, Any]:
        text = self.text
        data = self._data
        if self.path is not None:
            data = Path(self.path).read_bytes()
        mime = self.mime_type or ("text/plain" if text is not None else guess_mime_type(data, self.path or self.uri))
        body: dict[str, Any] = {"uri": self.uri}
        if mime:
            body["mimeType"] = mime
        if text is None and data is not None and _textual(mime):
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                text = None
        if text is not None:
            body["text"] = text
        else:
            assert data is not None
            body["blob"] = base64.b64encode(data).decode("ascii")
        return {"type": "resource", "resource": body}

    def __repr__(self) -> str:
        return f"Resource(uri={self.uri!r}, mime_type={self.mime_type!r})"


def _textual(mime: str | None) -> bool:
    if mime is None:
        return True  # unknown: sent as text when it decodes, else as a blob
    return mime.startswith("text/") or mime.endswith(("json", "xml", "yaml", "javascript", "toml")) or "+json" in mime or "+xml" in mime


class ResourceLink(Content):
    """A link to a resource the client may read or show; its contents do not travel.

    ``ResourceLink("build/report.html")`` links a file (name, size and type from the file);
    ``ResourceLink("https://…", name="Docs")`` links any URI. A client whose MCP revision has no
    resource links gets the link as a line of text.
    """

    __slots__ = ("description", "mime_type", "name", "size", "title", "uri")

    def __init__(
        self,
        target: str | os.PathLike[str],
        *,
        name: str | None = None,
        title: str | None = None,
        description: str | None = None,
        mime_type: str | None = None,
        size: int | None = None,
    ) -> None:
        target = os.fspath(target)
        if "://" in target or target.startswith(("data:", "mailto:", "urn:")):
            self.uri = target
            default_name = target.rstrip("/").rsplit("/", 1)[-1] or target
        else:
            path = Path(target)
            self.uri = _file_uri(target)
            default_name = path.name
            if size is None and path.is_file():
                size = path.stat().st_size
        self.name = name or default_name
        self.title = title
        self.description = description
        self.mime_type = mime_type or guess_mime_type(None, self.uri)
        self.size = size

    def block(self) -> dict[str, Any]:
        block: dict[str, Any] = {"type": "resource_link", "uri": self.uri, "name": self.name}
        for key, value in (("title", self.title), ("description", self.description), ("mimeType", self.mime_type), ("size", self.size)):
            if value is not None:
                block[key] = value
        return block

    def __repr__(self) -> str:
        return f"ResourceLink({self.uri!r}, name={self.name!r})"
