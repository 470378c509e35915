"""Content blocks from what a tool returned: an ``Image``, ``Audio``, ``Resource`` or ``ResourceLink``,
or a list mixing them with strings (and other values, sent as JSON text).

Runs inside a worker, under the same limits as text: a text block past ``truncate_bytes`` or
``truncate_lines`` is truncated and spilled as usual; a binary block (an image, audio, an embedded
resource's contents) is never cut, since half an image is no image: past ``truncate_bytes`` it is
spilled whole and replaced by a text block saying so and where the file is. Must never import the
daemon side.
"""

from __future__ import annotations

import base64
import mimetypes
from typing import Any

from atomictools._content import Content
from atomictoolsd.worker.truncate import spill, truncate

__all__ = ["is_content", "content_blocks"]


def is_content(value: Any) -> bool:
    """Whether a tool's return value is content (one block, or a list holding at least one)."""
    if isinstance(value, Content):
        return True
    return type(value) is list and any(isinstance(item, Content) for item in value)


def content_blocks(
    value: Any, tool: str, max_lines: int, max_bytes: int, spill_dir: str, encode: Any
) -> tuple[list[dict[str, Any]], list[str]]:
    """The content blocks of ``value`` and the paths of the files spilled on the way.

    Raises:
        ValueError, OSError: a block cannot be built (its MIME type cannot be told, its file
            cannot be read); the message says which and what to do.
    """
    items = value if type(value) is list else [value]
    blocks: list[dict[str, Any]] = []
    spilled: list[str] = []
    for item in items:
        if isinstance(item, Content):
            block = item.block()
            cut = _spill_binary(block, tool, max_bytes, spill_dir)
            if cut is not None:
                block = cut[0]
                spilled.append(cut[1])
            blocks.append(block)
            continue
        text = item if isinstance(item, str) else encode(item).decode()
        cut_text = truncate(text, max_lines, max_bytes, spill_dir, tool)
        if cut_text is not None:
            text = cut_text.text
            spilled.append(cut_text.path)
        blocks.append({"type": "text", "text": text})
    return blocks, spilled


def _spill_binary(block: dict[str, Any], tool: str, max_bytes: int, spill_dir: str) -> tuple[dict[str, Any], str] | None:
    """A text block standing for ``block`` once its contents are in a spill file, when they are
    over ``max_bytes``; None when the block goes as it is."""
    kind = block["type"]
    if kind in ("image", "audio"):
        encoded, mime = block["data"], block["mimeType"]
        what = kind
    elif kind == "resource":
        resource = block["resource"]
        mime = resource.get("mimeType") or "application/octet-stream"
        what = f"resource {resource['uri']}"
        encoded = resource.get("blob")
        if encoded is None:
            text = resource.get("text", "")
            if len(text) <= max_bytes // 4 or len(text.encode("utf-8", "surrogatepass")) <= max_bytes:
                return None
            path = spill(text.encode("utf-8", "surrogatepass"), spill_dir, tool, mimetypes.guess_extension(mime) or ".txt")
            return _notice(what, mime, len(text.encode("utf-8", "surrogatepass")), max_bytes, path), path
    else:
        return None
    size = len(encoded) * 3 // 4  # the decoded size, near enough to judge; exact below
    if size <= max_bytes:
        return None
    data = base64.b64decode(encoded)
    if len(data) <= max_bytes:
        return None
    path = spill(data, spill_dir, tool, mimetypes.guess_extension(mime) or ".bin")
    return _notice(what, mime, len(data), max_bytes, path), path


def _notice(what: str, mime: str, size: int, limit: int, path: str) -> dict[str, Any]:
    return {
        "type": "text",
        "text": (
            f"[{what} ({mime}, {size:,} bytes) not sent: more than the {limit:,}-byte limit of a result "
            f"(truncate_bytes), and a binary is never cut; the whole of it is in {path}]"
        ),
    }
