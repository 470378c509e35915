"""A result's blocks as each MCP revision's clients accept them (sessions/content.py)."""

from __future__ import annotations

import json

from atomictoolsd.sessions.content import shape_result
from atomictoolsd.sessions.revisions import BY_VERSION

RESULT = json.dumps({
    "content": [
        {"type": "text", "text": "here"},
        {"type": "audio", "data": "UklGRg==", "mimeType": "audio/wav"},
        {"type": "resource_link", "uri": "file:///r/report.html", "name": "report.html", "mimeType": "text/html", "size": 12},
        {"type": "image", "data": "iVBO", "mimeType": "image/png"},
    ],
    "structuredContent": {"n": 1},
}).encode()


def test_a_current_client_gets_the_result_untouched() -> None:
    assert shape_result(RESULT, BY_VERSION["2025-06-18"]) is RESULT
    assert shape_result(RESULT, BY_VERSION["2025-11-25"]) is RESULT
    assert shape_result(RESULT, BY_VERSION["2026-07-28"]) is RESULT
    assert shape_result(RESULT, None) is RESULT  # no initialize: the tiny client takes everything


def test_an_older_client_gets_text_for_what_its_revision_lacks() -> None:
    before_links = json.loads(shape_result(RESULT, BY_VERSION["2025-03-26"]))
    assert [b["type"] for b in before_links["content"]] == ["text", "audio", "text", "image"]
    assert before_links["content"][2]["text"] == "[resource: report.html <file:///r/report.html> (text/html, 12)]"
    assert "structuredContent" not in before_links

    oldest = json.loads(shape_result(RESULT, BY_VERSION["2024-11-05"]))
    assert [b["type"] for b in oldest["content"]] == ["text", "text", "text", "image"]
    assert "audio/wav" in oldest["content"][1]["text"] and "2024-11-05" in oldest["content"][1]["text"]


def test_a_result_with_nothing_to_change_is_not_decoded() -> None:
    plain = b'{"content":[{"type":"text","text":"x"}]}'
    assert shape_result(plain, BY_VERSION["2024-11-05"]) is plain
