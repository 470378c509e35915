"""What a client sends that the daemon only looks at: a key's presence, a short string or number.

A JSON value decoded whole costs the event loop per element in it, and a client's line may hold
millions within ``max_message_bytes`` (an ``initialize`` whose capabilities held 4,000,000 empty
arrays kept every other client waiting 2 s). So such values are taken as ``msgspec.Raw``, which
the decoder skips without building anything, and read here: ``scalar`` for a string, number,
boolean or null of a few KiB, ``keys_of`` for an object's keys (its values left raw). A value of
another kind, or larger, reads as absent: the place that reads it treats it as a value of the
wrong type, which it ignores or refuses.
"""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = ["NULL", "SCALAR_MOST", "keys_of", "scalar", "text_of"]

NULL = msgspec.Raw(b"null")  # the default of a raw field the client left out
SCALAR_MOST = 4096  # bytes of a scalar read (a revision, a name, a token, a timeout)

_decode_scalar = msgspec.json.Decoder(str | int | float | bool | None).decode
_decode_keys = msgspec.json.Decoder(dict[str, msgspec.Raw]).decode


def scalar(raw: msgspec.Raw | None) -> str | int | float | bool | None:
    """The string, number, boolean or null ``raw`` holds (at most ``SCALAR_MOST`` bytes), else None."""
    if raw is NULL or raw is None or len(raw) > SCALAR_MOST:  # NULL: a key left out (most of them)
        return None
    try:
        return _decode_scalar(raw)
    except (msgspec.ValidationError, msgspec.DecodeError, UnicodeDecodeError):
        return None


def keys_of(raw: msgspec.Raw | None) -> dict[str, msgspec.Raw] | None:
    """The object ``raw`` holds, its values raw; None when it holds something else."""
    if raw is None:
        return None
    try:
        return _decode_keys(raw)
    except (msgspec.ValidationError, msgspec.DecodeError, UnicodeDecodeError, RecursionError):
        return None


def text_of(raw: Any) -> str:
    """``scalar`` as text: "" for nothing usable."""
    value = scalar(raw)
    return "" if value is None else str(value)
