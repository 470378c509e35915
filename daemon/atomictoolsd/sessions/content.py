"""Content blocks a client's MCP revision cannot show, turned into the nearest thing it can.

A worker builds a result once, for every client; this module rewrites it for one that would reject
part of it: audio (2025-03-26 on) and resource links (2025-06-18 on) become a line of text saying
what was there, and ``structuredContent`` (2025-06-18 on) is dropped, its text block mirroring it
already. The common case costs a byte search: a result that holds none of those is never decoded.
"""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = ["BLOCKS_SINCE", "shape_result"]

# The first revision whose clients accept each content block type (text, image and resource: all).
BLOCKS_SINCE = {"audio": "2025-03-26", "resource_link": "2025-06-18"}
_STRUCTURED_SINCE = "2025-06-18"
_NEWEST_SINCE = max(max(BLOCKS_SINCE.values()), _STRUCTURED_SINCE)

_decode = msgspec.json.decode
_encode = msgspec.json.encode


def shape_result(result: bytes, version: str | None) -> bytes:
    """``result`` (a ``CallToolResult`` as JSON) as a client speaking ``version`` accepts it."""
    if version is None or version >= _NEWEST_SINCE:
        return result
    if b'"audio"' not in result and b'"resource_link"' not in result and b'"structuredContent"' not in result:
        return result
    value = _decode(result)
    if version < _STRUCTURED_SINCE:
        value.pop("structuredContent", None)
    value["content"] = [_nearest(block, version) for block in value.get("content", [])]
    return _encode(value)


def _nearest(block: dict[str, Any], version: str) -> dict[str, Any]:
    kind = block.get("type")
    since = BLOCKS_SINCE.get(kind or "")
    if since is None or version >= since:
        return block
    if kind == "audio":
        size = len(block.get("data", "")) * 3 // 4
        text = (
            f"[audio ({block.get('mimeType', 'unknown type')}, about {size:,} bytes) not shown: this client's "
            f"MCP revision ({version}) has no audio content]"
        )
    else:
        details = ", ".join(str(block[k]) for k in ("mimeType", "size") if block.get(k) is not None)
        title = block.get("title") or block.get("name") or block.get("uri")
        text = f"[resource: {title} <{block.get('uri')}>{f' ({details})' if details else ''}]"
        if block.get("description"):
            text += f" {block['description']}"
    return {"type": "text", "text": text}
