"""Content blocks a client's MCP revision cannot show, turned into the nearest thing it can.

A worker builds a result once, for every client; this module rewrites it for one that would reject
part of it (what each revision takes: ``sessions.revisions.Revision``): a block it lacks (audio
before 2025-03-26, a resource link before 2025-06-18) becomes a line of text saying what was there,
and ``structuredContent`` (2025-06-18 on) is dropped, its text block mirroring it already. The
common case costs an attribute test, an old client's a byte search: a result that holds nothing to
shape is never decoded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

if TYPE_CHECKING:
    from atomictoolsd.sessions.revisions import Revision

__all__ = ["shape_result"]

_decode = msgspec.json.decode
_encode = msgspec.json.encode


def shape_result(result: bytes, revision: Revision | None) -> bytes:
    """``result`` (a ``CallToolResult`` as JSON) as a client of ``revision`` accepts it (None: a
    client that never said, such as the tiny client, takes everything)."""
    if revision is None or revision.full_results:
        return result
    # find, not ``in`` (every call of such a client): see sessions/connection.py.
    if result.find(b'"audio"') < 0 and result.find(b'"resource_link"') < 0 and result.find(b'"structuredContent"') < 0:
        return result
    value = _decode(result)
    if not revision.structured_content:
        value.pop("structuredContent", None)
    value["content"] = [_nearest(block, revision) for block in value.get("content", [])]
    return _encode(value)


def _nearest(block: dict[str, Any], revision: Revision) -> dict[str, Any]:
    kind = block.get("type")
    if not isinstance(kind, str) or kind in revision.blocks:
        return block
    version = revision.version
    if kind == "audio":  # a tool may write any value in any field (its blocks are only shaped as dicts)
        data = block.get("data")
        size = len(data) * 3 // 4 if isinstance(data, str) else 0
        text = (
            f"[audio ({block.get('mimeType', 'unknown type')}, about {size:,} bytes) not shown: this client's "
            f"MCP revision ({version}) has no audio content]"
        )
    elif kind == "resource_link":
        details = ", ".join(str(block[k]) for k in ("mimeType", "size") if block.get(k) is not None)
        title = block.get("title") or block.get("name") or block.get("uri")
        text = f"[resource: {title} <{block.get('uri')}>{f' ({details})' if details else ''}]"
        if block.get("description"):
            text += f" {block['description']}"
    else:  # a type no revision has: the worker never makes one
        return block
    return {"type": "text", "text": text}
