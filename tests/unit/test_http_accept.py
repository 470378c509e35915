"""How the HTTP endpoint reads a request's ``Accept``: which of its answer's forms it takes."""

from __future__ import annotations

import pytest

from atomictoolsd.transports.http import accepts

SSE = b"text/event-stream"
JSON = b"application/json"


@pytest.mark.parametrize(("accept", "sse", "json"), [
    (None, True, True),
    (b"application/json, text/event-stream", True, True),
    (b"Text/Event-Stream", True, False),
    (b"*/*", True, True),
    (b"text/*", True, False),
    (b"application/json", False, True),
    (b"text/html", False, False),
    (b"text/event-stream;q=0, application/json", False, True),
    (b"application/json; q=0, text/event-stream", True, False),
    (b"text/*;q=0, */*", False, True),
    (b"text/*;q=0, text/event-stream", True, False),
    (b"*/*;q=0.5, text/event-stream;q=0", False, True),
    (b"text/event-stream;q=oops", True, False),
])
def test_the_most_specific_matching_range_decides_and_q_0_refuses(accept: bytes | None, sse: bool, json: bool) -> None:
    assert accepts(accept, SSE) is sse
    assert accepts(accept, JSON) is json
