"""What a tool returned, as the MCP ``CallToolResult`` (JSON bytes) its call answers with.

The common case (a short string) is built directly; content blocks (images, audio, resources,
links) go through ``blocks``; a text past the truncation limits is cut and the whole kept in a spill
file (``truncate``); a value for a tool with an output schema is checked against it and sent as
``structuredContent`` too. A result larger than a message may carry is refused, kept whole in a
spill file. ``exception_text`` is what a tool that raised answers with.
"""

from __future__ import annotations

import dataclasses
import traceback
from typing import Any

import msgspec

from atomictools._errors import ToolError
from atomictoolsd.protocol import TEXT_HEAD, TEXT_TAIL, WorkerSpec, error_result
from atomictoolsd.worker.blocks import content_blocks, is_content
from atomictoolsd.worker.environment import missing_module_hint
from atomictoolsd.worker.limits import memory_error_text
from atomictoolsd.worker.schema import ToolSpec, enc_hook
from atomictoolsd.worker.truncate import spill, truncate

__all__ = ["encode_json", "exception_text", "make_result", "well_formed"]

encode_json = msgspec.json.Encoder(enc_hook=enc_hook).encode


MOST_MESSAGE = 4_000  # characters of an exception's message in a tool's error result
MOST_TRACE = 16_000  # characters of its traceback (its first and its last lines kept)


def exception_text(tool: str, exc: BaseException, memory_limit: int = 0) -> str:
    """What a call whose tool raised ``exc`` answers: its type, message and traceback, cut to a
    size a model reads (an exception may carry megabytes), whatever its ``__str__`` does."""
    if isinstance(exc, ToolError):
        return _clipped(_message(exc), MOST_MESSAGE) or type(exc).__name__
    if isinstance(exc, MemoryError):
        return memory_error_text(tool, memory_limit)
    # Drop the runtime's own frame: the model and the author need the tool's frames only.
    tb = exc.__traceback__
    if tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    trace = _clipped("".join(traceback.format_exception(type(exc), exc, tb)), MOST_TRACE)
    hint = missing_module_hint(exc)
    message = _clipped(_message(exc), MOST_MESSAGE)
    return f"Tool {tool!r} raised {type(exc).__name__}: {message}{': ' + hint if hint else ''}\n\n{trace}".rstrip()


def _message(exc: BaseException) -> str:
    """``str(exc)``, or why there is none: a tool's exception class may raise in its ``__str__``."""
    try:
        return str(exc)
    except Exception as failure:  # noqa: BLE001 - any error of the tool's own __str__
        return f"(its message could not be made: {type(failure).__name__} in its __str__)"


def _clipped(text: str, most: int) -> str:
    """``text`` within ``most`` characters: its start and its end, and how much was left out."""
    if len(text) <= most:
        return text
    head, tail = most // 4, most - most // 4
    return f"{text[:head]}\n… ({len(text) - head - tail:,} characters left out) …\n{text[-tail:]}"


def make_result(spec: ToolSpec, value: Any, worker: WorkerSpec) -> bytes:
    """Turn what a tool returned into an MCP ``CallToolResult`` (JSON bytes). A string UTF-8 cannot
    carry (one holding a surrogate: half of a pair, or a byte ``os.fsdecode`` could not decode, as a
    file name may) is sent with U+FFFD in its place (``well_formed``)."""
    if (
        type(value) is str
        and spec.output_schema is None
        and len(value) <= worker.truncate_bytes // 4  # 4 bytes a character at most in UTF-8
        and ("\n" not in value or value.count("\n") < worker.truncate_lines)  # most results are one line
    ):
        # The common case, well inside every limit: one text block, built directly.
        try:
            return TEXT_HEAD + encode_json(value) + TEXT_TAIL
        except UnicodeEncodeError:
            return TEXT_HEAD + encode_json(well_formed(value)) + TEXT_TAIL
    try:
        return _built_result(spec, value, worker)
    except UnicodeEncodeError:
        return _built_result(spec, well_formed(value), worker)


def well_formed(value: Any) -> Any:
    """``value`` with every surrogate in its strings (keys included) as U+FFFD, and each pair of them
    as the one character it stands for: what UTF-8 can carry. Structs and dataclasses are taken as
    their fields; other objects are left as they are."""
    if isinstance(value, str):
        return value.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    if isinstance(value, dict):
        return {well_formed(key): well_formed(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [well_formed(item) for item in value]
    if isinstance(value, msgspec.Struct) or (dataclasses.is_dataclass(value) and not isinstance(value, type)):
        return well_formed(msgspec.to_builtins(value, enc_hook=enc_hook))
    return value


def _built_result(spec: ToolSpec, value: Any, worker: WorkerSpec) -> bytes:
    """``make_result`` for any value but a short string."""
    if spec.output_schema is None and is_content(value):  # with a schema, the value must match it
        return _content_result(spec, value, worker)
    structured = None
    if spec.output_schema is not None:
        try:
            value = spec.structured(value)
        except (ValueError, TypeError) as exc:  # msgspec's ValidationError and pydantic's are ValueErrors
            return error_result(
                f"Tool {spec.name!r} returned a value that does not match its return annotation: {exc}"
            )
        structured = {"result": value} if spec.wrap_output else value
        text = encode_json(structured).decode()
    elif isinstance(value, str):
        text = value
    elif value is None:
        text = None
    elif isinstance(value, (bytes, bytearray)):
        text = bytes(value).decode("utf-8", "replace")
    else:
        text = encode_json(value).decode()

    meta = None
    if text is not None:
        cut = truncate(text, worker.truncate_lines, worker.truncate_bytes, worker.spill_dir, spec.name)
        if cut is not None:
            text = cut.text
            meta = {"atomic/fullOutput": cut.path}
    result: dict[str, Any] = {"content": [] if text is None else [{"type": "text", "text": text}]}
    if structured is not None:
        result["structuredContent"] = structured
    if meta is not None:
        result["_meta"] = meta
    return _checked_size(spec, encode_json(result), worker)


def _content_result(spec: ToolSpec, value: Any, worker: WorkerSpec) -> bytes:
    """An image, audio, a resource or a link, or a list mixing them with text: their blocks."""
    try:
        blocks, spilled = content_blocks(
            value, spec.name, worker.truncate_lines, worker.truncate_bytes, worker.spill_dir, encode_json
        )
    except (OSError, ValueError, TypeError) as exc:
        return error_result(f"Tool {spec.name!r} returned content that cannot be sent: {exc}")
    result: dict[str, Any] = {"content": blocks}
    if spilled:
        result["_meta"] = {"atomic/fullOutput": spilled[0], "atomic/spilled": spilled}
    return _checked_size(spec, encode_json(result), worker)


def _checked_size(spec: ToolSpec, encoded: bytes, worker: WorkerSpec) -> bytes:
    if len(encoded) > worker.max_result_bytes:
        # Structured content is never cut (it would no longer match its schema), and a result this
        # large would cost the daemon several times its size in memory on its way to a client that
        # refuses messages past the same limit: refuse it, keeping the whole in a spill file.
        path = spill(encoded, worker.spill_dir, spec.name, ".json")
        return error_result(
            f"Tool {spec.name!r} returned a result of {len(encoded):,} bytes, more than the {worker.max_result_bytes:,} "
            f"bytes a message may carry (max_message_bytes); the whole result is in {path}"
        )
    return encoded
