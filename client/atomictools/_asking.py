"""What a tool asks the client mid-call and what it gets back: the params of ``elicitation/create``
and ``sampling/createMessage`` built from ``ctx.elicit`` and ``ctx.sample``'s arguments, and their
answers as ``Elicitation`` and ``Sample``.

No I/O here: ``Context`` sends what this module builds through the worker's channel. An elicitation
schema may be a JSON Schema dict (sent as it is, so every form the spec allows, SEP-1330's titled
enums included, can be written), or a ``msgspec.Struct``/dataclass/TypedDict type, whose fields'
defaults become the schema's ``default`` (SEP-1034), whose ``Literal`` fields become ``enum``s, and
into which an accepted answer is converted.
"""

from __future__ import annotations

import types
import typing
from typing import Any, Literal

import msgspec

from atomictools._jsonschema import inline_refs

__all__ = ["Elicitation", "Sample", "elicitation_params", "read_elicitation", "read_sample", "sampling_params"]

Action = Literal["accept", "decline", "cancel"]

_JSON_TYPES = ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"))


class Elicitation:
    """The user's answer to ``ctx.elicit``.

    Attributes:
        action: ``"accept"`` (the user answered), ``"decline"`` (said no) or ``"cancel"`` (dismissed it).
        content: what the user entered when accepted: an instance of the schema's type when a type
            was given, else a dict; None otherwise.
    """

    __slots__ = ("action", "content")

    def __init__(self, action: Action, content: Any = None) -> None:
        self.action = action
        self.content = content

    @property
    def accepted(self) -> bool:
        """True when the user accepted (for a confirmation: said yes)."""
        return self.action == "accept"

    def __repr__(self) -> str:
        return f"Elicitation(action={self.action!r}, content={self.content!r})"


class Sample:
    """A completion from the client's model (``ctx.sample``).

    Attributes:
        text: the text of the reply ("" when it is not text).
        content: the reply's content block as MCP sends it.
        model: the model that wrote it, as the client names it.
        stop_reason: why it stopped (``"endTurn"``, ``"maxTokens"``, …), or None.
    """

    __slots__ = ("content", "model", "stop_reason", "text")

    def __init__(self, content: Any, model: str, stop_reason: str | None) -> None:
        self.content = content
        self.model = model
        self.stop_reason = stop_reason
        blocks = content if isinstance(content, list) else [content]
        self.text = "".join(b.get("text", "") for b in blocks if isinstance(b, dict) and b.get("type") == "text")

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return f"Sample(text={self.text!r}, model={self.model!r}, stop_reason={self.stop_reason!r})"


def _typed_enum(node: dict[str, Any]) -> None:
    """msgspec writes ``Literal`` as a bare ``enum``; the elicitation schema wants its ``type`` too."""
    values = node.get("enum")
    if values and "type" not in node:
        for python, name in _JSON_TYPES:
            if all(type(v) is python for v in values):
                node["type"] = name
                break


def _primitive(node: dict[str, Any]) -> dict[str, Any]:
    """A property schema as an elicitation form takes it: ``X | None`` is X, enums are typed."""
    if "anyOf" in node:
        branches = [b for b in node["anyOf"] if b.get("type") != "null"]
        if len(branches) == 1:
            merged = {**node, **branches[0]}
            merged.pop("anyOf")
            node = merged
    _typed_enum(node)
    items = node.get("items")
    if isinstance(items, dict):
        _typed_enum(items)
    return node


def _literal_values(hint: Any) -> tuple[Any, ...] | None:
    """The values of a ``Literal`` (inside ``Annotated`` or ``X | None``), in the order written."""
    while typing.get_origin(hint) is typing.Annotated:
        hint = typing.get_args(hint)[0]
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        rest = [a for a in typing.get_args(hint) if a is not type(None)]
        hint = rest[0] if len(rest) == 1 else None
    return typing.get_args(hint) if typing.get_origin(hint) is Literal else None


def _declared_order(node: dict[str, Any], hint: Any) -> None:
    """msgspec sorts a ``Literal``'s values; a form shows them as the author wrote them."""
    if hint is None:
        return
    values = _literal_values(hint)
    if values is not None and "enum" in node:
        node["enum"] = list(values)
        return
    items = node.get("items")
    args = typing.get_args(hint)
    if isinstance(items, dict) and "enum" in items and len(args) == 1:
        values = _literal_values(args[0])
        if values is not None:
            items["enum"] = list(values)


def requested_schema(schema: Any) -> dict[str, Any]:
    """The ``requestedSchema`` for ``schema``: None (a plain confirmation), a dict, or a type.

    Raises:
        TypeError: ``schema`` is none of those, or a type msgspec cannot describe as an object.
    """
    if schema is None:
        return {"type": "object", "properties": {}}
    if isinstance(schema, dict):
        if schema.get("type") != "object" or not isinstance(schema.get("properties", {}), dict):
            raise TypeError('an elicitation schema must be a JSON Schema object: {"type": "object", "properties": {...}}')
        return schema
    try:
        built = inline_refs(msgspec.json.schema(schema))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"cannot build an elicitation schema from {schema!r}: {exc}") from None
    if built.get("type") != "object":
        raise TypeError(f"an elicitation schema must describe an object (a Struct, dataclass or TypedDict), not {schema!r}")
    try:
        hints = typing.get_type_hints(schema)
    except Exception:  # noqa: BLE001 - only for the order of choices; msgspec's sorted order stands
        hints = {}
    properties = {}
    for name, node in built.get("properties", {}).items():
        node = _primitive(dict(node))
        if node.get("default", 0) is None:
            del node["default"]  # "no value" is not a choice a form can preselect
        _declared_order(node, hints.get(name))
        properties[name] = node
    result: dict[str, Any] = {"type": "object", "properties": properties}
    if built.get("required"):
        result["required"] = built["required"]
    return result


def elicitation_params(message: str, schema: Any) -> dict[str, Any]:
    if not isinstance(message, str) or not message:
        raise TypeError("ctx.elicit needs a message to show the user")
    return {"message": message, "requestedSchema": requested_schema(schema)}


def read_elicitation(result: bytes, schema: Any) -> Elicitation:
    """The client's ``ElicitResult`` as an ``Elicitation`` (its content converted to ``schema``'s type)."""
    answer = msgspec.json.decode(result)
    action = answer.get("action") if isinstance(answer, dict) else None
    if action not in ("accept", "decline", "cancel"):
        raise ValueError(f"the client answered the elicitation with {answer!r}, not an action accept/decline/cancel")
    content = answer.get("content")
    if action == "accept":
        content = content or {}
        if schema is not None and not isinstance(schema, dict):
            try:
                content = msgspec.convert(content, schema, strict=False)
            except msgspec.ValidationError as exc:
                raise ValueError(f"the user's answer does not fit the schema: {exc}") from None
    return Elicitation(action, content if action == "accept" else None)


def sampling_params(
    messages: str | list[Any],
    *,
    max_tokens: int,
    system: str | None,
    temperature: float | None,
    stop: list[str] | None,
    model_hints: list[str] | None,
    include_context: str | None,
) -> dict[str, Any]:
    """``sampling/createMessage`` params: a string is one user message; a list holds strings (user
    messages) and MCP ``SamplingMessage`` dicts (``{"role": …, "content": {…}}``)."""
    if isinstance(messages, str):
        messages = [messages]
    turns = [
        {"role": "user", "content": {"type": "text", "text": m}} if isinstance(m, str) else m
        for m in messages
    ]
    if not turns:
        raise TypeError("ctx.sample needs at least one message")
    params: dict[str, Any] = {"messages": turns, "maxTokens": int(max_tokens)}
    if system is not None:
        params["systemPrompt"] = system
    if temperature is not None:
        params["temperature"] = float(temperature)
    if stop:
        params["stopSequences"] = list(stop)
    if model_hints:
        params["modelPreferences"] = {"hints": [{"name": h} for h in model_hints]}
    if include_context is not None:
        params["includeContext"] = include_context
    return params


def read_sample(result: bytes) -> Sample:
    answer = msgspec.json.decode(result)
    if not isinstance(answer, dict) or "content" not in answer:
        raise ValueError(f"the client answered the sampling request with {answer!r}, not a message")
    return Sample(answer["content"], str(answer.get("model", "")), answer.get("stopReason"))
