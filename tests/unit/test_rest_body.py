"""A REST call's body is the tool's arguments, which its worker reads against the tool's schema:
the daemon only checks that it is a JSON object, without building it (a body of a million keys
decoded into a dict held the event loop 0.6 s a call)."""

from __future__ import annotations

import tracemalloc

from atomictoolsd.transports.rest import _arguments

MILLION_KEYS = b"{" + b",".join(b'"k%d":0' % i for i in range(1_000_000)) + b"}"


def test_a_body_of_a_million_keys_is_checked_without_being_built() -> None:
    tracemalloc.start()
    try:
        assert _arguments(MILLION_KEYS) == (MILLION_KEYS, None)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, f"checking the body allocated {peak / (1 << 20):.0f} MiB"


def test_a_body_that_is_no_json_object_is_refused() -> None:
    for body, status in ((b"[1, 2]", 400), (b'"text"', 400), (b"{", 400), (b'{"a": 1} x', 400)):
        _, refusal = _arguments(body)
        assert refusal is not None and refusal[0] == status, (body, refusal)
