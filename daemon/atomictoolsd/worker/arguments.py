"""What the worker forgives in a call's arguments once strict validation failed: a number such as
``2.0`` where an integer is declared, and arguments the tool does not declare.

JSON Schema's ``integer`` is a number with no fractional part, so ``2.0`` is one; Python clients
send it (``json.dumps(2.0)``), and msgspec's strict decoding refuses it. Every integral float of the
arguments is therefore read as an integer on this path (a ``float`` parameter takes an integer as it
is). The rest of this module is the rule for arguments a tool does not declare: a near miss is an
error, anything else is dropped.

Clients add arguments of their own to every call: Gemini CLI injects ``wait_for_previous`` into each
tool's schema and passes what the model sets through to the server. Refusing those fails calls at
random; accepting every unknown key silently would hide a model's typo (``pth`` for ``path``) and
run the tool without the value the model meant. So an unknown key that is within a small edit
distance of a declared parameter is an error naming that parameter; any other unknown key is dropped
and reported (the daemon writes it to the event log with the client's name).

Runs inside the worker, and only after strict validation failed: a call with exactly the declared
arguments never gets here. Standard library and msgspec only (the worker runtime stays light); it
must never decide anything about declared parameters, whose validation stays the tool's own.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import msgspec

__all__ = ["Undeclared", "misspelling_of", "relax", "split_undeclared", "with_choices"]


class Undeclared(ValueError):
    """An argument is not declared but is so close to a declared one that it is taken for a typo."""


def _fold(name: str) -> str:
    # `filePath`, `file-path` and `file_path` are one name to a model guessing a parameter.
    return name.lower().replace("-", "").replace("_", "")


def _distance(a: str, b: str, limit: int) -> int:
    """Damerau-Levenshtein distance (adjacent transpositions count 1), or ``limit + 1`` past limit."""
    if abs(len(a) - len(b)) > limit:
        return limit + 1
    previous2: list[int] = []
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i] + [0] * len(b)
        for j, cb in enumerate(b, 1):
            cost = ca != cb
            current[j] = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + cost)
            if i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                current[j] = min(current[j], previous2[j - 2] + 1)
        if min(current) > limit:
            return limit + 1
        previous2, previous = previous, current
    return previous[-1]


def _limit(name: str) -> int:
    # One slip in a short name, two in a longer one: `nme` → `name`, `recursve` → `recursive`;
    # `wait_for_previous` is nowhere near `path` or `query`.
    return 1 if len(name) <= 4 else 2


def misspelling_of(key: str, declared: Iterable[str]) -> str | None:
    """The declared parameter ``key`` is most likely a misspelling of, or None when it is none's."""
    folded = _fold(key)
    best: tuple[int, str] | None = None
    for name in declared:
        target = _fold(name)
        limit = _limit(target)
        distance = 0 if folded == target else _distance(folded, target, limit)
        if distance <= limit and (best is None or distance < best[0]):
            best = (distance, name)
    return None if best is None else best[1]


def _object(raw: bytes) -> dict[str, Any] | None:
    """``raw`` decoded, when it is a JSON object."""
    try:
        arguments: Any = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return None
    return arguments if isinstance(arguments, dict) else None


def split_undeclared(raw: bytes, declared: Iterable[str]) -> tuple[bytes, list[str]] | None:
    """Drop the undeclared keys of ``raw`` (a JSON object) under the rule above.

    Returns:
        ``(arguments without them, the dropped keys)``, or None when ``raw`` has no undeclared key
        (or is not an object): the strict validation's error stands as it was.

    Raises:
        Undeclared: a key is a near miss of a declared parameter; the message names both.
    """
    arguments = _object(raw)
    if arguments is None:
        return None
    known = set(declared)
    unknown = [key for key in arguments if key not in known]
    if not unknown:
        return None
    for key in unknown:
        meant = misspelling_of(key, known)
        if meant is not None:
            raise Undeclared(f"unknown argument {key!r}; did you mean {meant!r}?")
    kept = {key: value for key, value in arguments.items() if key in known}
    return msgspec.json.encode(kept), unknown


def _integral(value: Any) -> Any:
    """``value`` with every float that has no fractional part made an ``int``, at any depth."""
    if type(value) is float:
        return int(value) if value.is_integer() else value
    if type(value) is dict:
        return {key: _integral(item) for key, item in value.items()}
    if type(value) is list:
        return [_integral(item) for item in value]
    return value


def relax(raw: bytes, declared: Iterable[str]) -> tuple[bytes, list[str]] | None:
    """``raw`` (a JSON object) with its integral floats read as integers and its undeclared keys
    dropped (the rule above).

    Returns:
        ``(the arguments so relaxed, the dropped keys)``, or None when neither changes anything
        (or ``raw`` is not an object): the strict validation's error stands as it was.

    Raises:
        Undeclared: a key is a near miss of a declared parameter; the message names both.
    """
    arguments = _object(raw)
    if arguments is None:
        return None
    encoded = msgspec.json.encode(_integral(arguments))
    split = split_undeclared(encoded, declared)
    if split is not None:
        return split
    return None if encoded == msgspec.json.encode(arguments) else (encoded, [])


_PATH_STEP = re.compile(r"\.([^.\[]+)|\[(\d+|\.\.\.)\]")


def with_choices(message: str, schema: dict[str, Any]) -> str:
    """msgspec's ``Invalid enum value 'x' - at `$.color``` with the values the schema allows there
    (``; expected one of 'red', 'blue'``): the model that sent it needs them to try again."""
    if not message.startswith("Invalid enum value") or " - at `$" not in message:
        return message
    path = message.rsplit(" - at `", 1)[1].rstrip("`")
    node: Any = schema
    for name, index in _PATH_STEP.findall(path[1:]):
        node = _member(node, name, index, schema)
        if not isinstance(node, dict):
            return message
    choices = _enum_of(_resolve(node, schema), schema)
    if not choices:
        return message
    return f"{message}; expected one of {', '.join(repr(c) if isinstance(c, str) else str(c) for c in choices)}"


def _member(node: dict[str, Any], name: str, index: str, schema: dict[str, Any]) -> Any:
    """The schema at one step of msgspec's path below ``node``: a property (``.name``), an item
    (``[0]``, by its position in a tuple), a dict's value (``[...]``), through a union's options
    (``Options | None``); None when the schema has none there."""
    node = _resolve(node, schema)
    for option in node.get("anyOf") or []:
        found = _member(option, name, index, schema) if isinstance(option, dict) else None
        if isinstance(found, dict):
            return found
    if name:
        return (node.get("properties") or {}).get(name)
    if index == "...":
        return node.get("additionalProperties")
    prefix = node.get("prefixItems")
    if isinstance(prefix, list) and int(index) < len(prefix):
        return prefix[int(index)]
    return node.get("items")


def _resolve(node: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """``node`` with a local ``$ref`` followed (``#/$defs/NAME``), as msgspec's schemas write them."""
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        return (schema.get("$defs") or {}).get(ref[len("#/$defs/"):], node)
    return node


def _enum_of(node: dict[str, Any], schema: dict[str, Any]) -> list[Any]:
    if isinstance(node.get("enum"), list):
        return node["enum"]
    choices: list[Any] = []
    for option in node.get("anyOf") or []:  # Optional[Enum]: the enum is one of the options
        if isinstance(option, dict):
            choices += _enum_of(_resolve(option, schema), schema)
    return choices
