"""The elicitation forms ``ctx.elicit`` sends (SEP-1034 defaults, SEP-1330 enums) and how it reads
the answers (atomictools._asking)."""

from __future__ import annotations

from typing import Literal

import msgspec
import pytest

from atomictools import Elicitation
from atomictools._asking import elicitation_params, read_elicitation, requested_schema, sampling_params


class Order(msgspec.Struct):
    item: str
    size: Literal["S", "M", "L"] = "M"
    extras: list[Literal["cheese", "olives"]] = []
    note: str | None = None
    count: int = 1


def test_a_struct_becomes_a_flat_form_with_defaults_and_typed_enums() -> None:
    schema = requested_schema(Order)
    assert schema == {
        "type": "object",
        "properties": {
            "item": {"type": "string"},
            "size": {"type": "string", "enum": ["S", "M", "L"], "default": "M"},
            "extras": {"type": "array", "items": {"type": "string", "enum": ["cheese", "olives"]}, "default": []},
            "note": {"type": "string"},
            "count": {"type": "integer", "default": 1},
        },
        "required": ["item"],
    }


def test_a_dict_goes_as_written_and_none_is_a_confirmation() -> None:
    titled = {"type": "object", "properties": {"t": {"type": "string", "oneOf": [{"const": "a", "title": "A"}]}}}
    assert elicitation_params("Pick", titled)["requestedSchema"] is titled
    assert requested_schema(None) == {"type": "object", "properties": {}}
    with pytest.raises(TypeError, match="JSON Schema object"):
        requested_schema({"type": "string"})
    with pytest.raises(TypeError, match="must describe an object"):
        requested_schema(int)


def test_answers_are_read_into_the_schemas_type() -> None:
    answer = read_elicitation(b'{"action":"accept","content":{"item":"pizza","extras":["olives"]}}', Order)
    assert answer.accepted and answer.content == Order(item="pizza", extras=["olives"])
    declined = read_elicitation(b'{"action":"decline"}', Order)
    assert not declined.accepted and declined.content is None
    with pytest.raises(ValueError, match="does not fit"):
        read_elicitation(b'{"action":"accept","content":{"size":"XL"}}', Order)
    with pytest.raises(ValueError, match="not an action"):
        read_elicitation(b'{"action":"maybe"}', None)
    assert repr(Elicitation("cancel")) == "Elicitation(action='cancel', content=None)"


def test_sampling_params_take_a_prompt_or_turns() -> None:
    params = sampling_params(
        ["Hi", {"role": "assistant", "content": {"type": "text", "text": "Hello"}}],
        max_tokens=10, system="s", temperature=0.2, stop=["\n"], model_hints=["claude"], include_context="none",
    )
    assert params == {
        "messages": [{"role": "user", "content": {"type": "text", "text": "Hi"}},
                     {"role": "assistant", "content": {"type": "text", "text": "Hello"}}],
        "maxTokens": 10, "systemPrompt": "s", "temperature": 0.2, "stopSequences": ["\n"],
        "modelPreferences": {"hints": [{"name": "claude"}]}, "includeContext": "none",
    }
