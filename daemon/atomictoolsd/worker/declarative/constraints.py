"""Whether a parameter's schema keeps its value from being read as more than data.

A value the ``shell`` checker guards (``commands.Guard``) lands where a program could read it as an
option (it starts with ``-``, or ``+`` for a shell), an assignment (``NAME=VALUE``, as ``make`` and
``awk`` read one) or a command to open (``x|``, ``<x``, ``>x``: perl's two-argument open). Its schema
constrains it when every value the schema accepts is free of those:

- ``enum`` or ``const``: the author's own values;
- ``boolean``, ``null`` (the word is left out), an ``integer`` or ``number`` whose ``minimum`` (or
  ``exclusiveMinimum``) is 0 or more;
- a ``string`` whose ``pattern``, anchored at both ends (``^…$``, ``\\A…\\Z``), admits no ``-`` or
  ``+`` first and no ``=``, ``|``, ``<`` or ``>`` anywhere, or whose ``format`` is one the validator
  checks and that admits none of them (``date-time``, ``hostname``, ``ipv4``, ``ipv6``);
- an ``array`` whose ``items`` are constrained (each item is one word);
- ``anyOf``/``oneOf`` of constrained schemas, an ``allOf`` holding one.

A pattern is read with Python's own parser (the validator's regular expressions are Python's) and
over-approximated: the characters it may match anywhere, and those it may match first. Lookarounds
are taken to admit everything, but for a negative lookahead of one character before the first one
(``^(?!-)``), which keeps that character from being first.

Runs inside a worker; standard library only.
"""

from __future__ import annotations

import re
from re import _constants as sre  # type: ignore[attr-defined]  # the parser's opcodes
from re import _parser as sre_parse  # type: ignore[attr-defined]
from typing import Any

__all__ = ["constrained", "safe_pattern"]

FIRST = frozenset("-+")  # an option (``+o`` for a shell) when first
ANYWHERE = frozenset("=|<>")  # an assignment, a command to open
SPECIAL = FIRST | ANYWHERE
FORMATS = frozenset({"date-time", "hostname", "ipv4", "ipv6"})  # checked by the validator in every draft

_STARTS = (sre.AT_BEGINNING, sre.AT_BEGINNING_STRING)
_ENDS = (sre.AT_END, sre.AT_END_STRING)
_REPEATS = (sre.MAX_REPEAT, sre.MIN_REPEAT, getattr(sre, "POSSESSIVE_REPEAT", sre.MAX_REPEAT))
_NONE_SPECIAL = (sre.CATEGORY_DIGIT, sre.CATEGORY_SPACE, sre.CATEGORY_WORD, sre.CATEGORY_LINEBREAK,
                 getattr(sre, "CATEGORY_UNI_DIGIT", sre.CATEGORY_DIGIT), getattr(sre, "CATEGORY_UNI_SPACE", sre.CATEGORY_SPACE),
                 getattr(sre, "CATEGORY_UNI_WORD", sre.CATEGORY_WORD))


def constrained(schema: Any) -> bool:
    """Whether every value ``schema`` (with its ``$ref``s inlined) accepts is free of ``SPECIAL``
    characters where they would matter (see the module docstring)."""
    if not isinstance(schema, dict):
        return False
    if "enum" in schema or "const" in schema:
        return True
    for key in ("anyOf", "oneOf"):
        if key in schema:
            branches = schema[key]
            return isinstance(branches, list) and bool(branches) and all(constrained(b) for b in branches)
    if isinstance(schema.get("allOf"), list) and any(constrained(b) for b in schema["allOf"]):
        return True
    types = schema.get("type")
    types = [types] if isinstance(types, str) else types
    if not isinstance(types, list) or not types:
        return False  # untyped: any value
    return all(_type_constrained(kind, schema) for kind in types)


def _type_constrained(kind: Any, schema: dict[str, Any]) -> bool:
    if kind in ("null", "boolean"):
        return True
    if kind in ("integer", "number"):
        least = schema.get("exclusiveMinimum")
        if not isinstance(least, (int, float)) or isinstance(least, bool):
            least = schema.get("minimum")
        return isinstance(least, (int, float)) and not isinstance(least, bool) and least >= 0
    if kind == "string":
        pattern = schema.get("pattern")
        return schema.get("format") in FORMATS or (isinstance(pattern, str) and safe_pattern(pattern))
    if kind == "array":
        return constrained(schema.get("items"))
    return False


def safe_pattern(pattern: str) -> bool:
    """Whether every string ``re.search(pattern, s)`` accepts has no ``-`` or ``+`` first and no
    ``=``, ``|``, ``<`` or ``>``."""
    try:
        parsed = sre_parse.parse(pattern)
    except (re.error, RecursionError, OverflowError):
        return False
    multiline = bool(parsed.state.flags & re.MULTILINE)
    if not (_anchored(list(parsed), _STARTS, 0, multiline) and _anchored(list(parsed), _ENDS, -1, multiline)):
        return False  # a search finds it anywhere: the rest of the string is anything
    first, _nullable = _first(list(parsed))
    return not (first & FIRST) and not (_chars(list(parsed)) & ANYWHERE)


def _anchored(items: list[Any], anchors: tuple[Any, ...], end: int, multiline: bool) -> bool:
    """Whether ``items`` begin (``end`` 0) or end (``end`` -1) with one of ``anchors``, in every branch."""
    if not items:
        return False
    op, av = items[end]
    if op is sre.AT:
        return av in anchors and not (multiline and av in (sre.AT_BEGINNING, sre.AT_END))
    if op is sre.SUBPATTERN:  # (group, flags added, flags removed, items): (?m:^x) is multiline
        return _anchored(list(av[-1]), anchors, end, multiline or bool(av[1] & re.MULTILINE))
    if op is sre.BRANCH:
        return all(_anchored(list(branch), anchors, end, multiline) for branch in av[1])
    return False


def _first(items: list[Any]) -> tuple[frozenset[str], bool]:
    """(the special characters the sequence may match first, whether it may match nothing)."""
    found: set[str] = set()
    barred: set[str] = set()  # kept from being first by a one-character negative lookahead
    for op, av in items:
        if op is sre.ASSERT_NOT and av[0] == 1 and _one_character(list(av[1])):
            barred |= _chars(list(av[1]))
            continue
        first, nullable = _first_of(op, av)
        found |= first - barred
        if not nullable:
            return frozenset(found), False
    return frozenset(found), True


def _first_of(op: Any, av: Any) -> tuple[frozenset[str], bool]:
    if op in (sre.AT, sre.ASSERT, sre.ASSERT_NOT):
        return frozenset(), True
    if op in _REPEATS:
        low, high, sub = av
        first, nullable = _first(list(sub))
        return (frozenset(), True) if high == 0 else (first, nullable or low == 0)
    if op is sre.SUBPATTERN:
        return _first(list(av[-1]))
    if op is getattr(sre, "ATOMIC_GROUP", None):
        return _first(list(av))
    if op is sre.BRANCH:
        results = [_first(list(branch)) for branch in av[1]]
        return frozenset().union(*(f for f, _ in results)), any(n for _, n in results)
    if op is sre.GROUPREF_EXISTS:
        _group, yes, no = av
        results = [_first(list(yes)), _first(list(no)) if no is not None else (frozenset(), True)]
        return frozenset().union(*(f for f, _ in results)), any(n for _, n in results)
    if op is sre.GROUPREF:
        return SPECIAL, True
    return _chars([(op, av)]), False  # one character


def _one_character(items: list[Any]) -> bool:
    return len(items) == 1 and items[0][0] in (sre.LITERAL, sre.NOT_LITERAL, sre.ANY, sre.IN, sre.CATEGORY)


def _chars(items: list[Any]) -> frozenset[str]:
    """The special characters a sequence may match, anywhere (over-approximated)."""
    found: set[str] = set()
    for op, av in items:
        if op is sre.LITERAL:
            found |= {chr(av)} & SPECIAL
        elif op is sre.NOT_LITERAL:
            found |= SPECIAL - {chr(av)}
        elif op is sre.IN:
            found |= _in(av)
        elif op is sre.CATEGORY:
            found |= set() if av in _NONE_SPECIAL else SPECIAL
        elif op in (sre.AT, sre.ASSERT, sre.ASSERT_NOT):
            continue
        elif op in _REPEATS:
            found |= _chars(list(av[2]))
        elif op is sre.SUBPATTERN:
            found |= _chars(list(av[-1]))
        elif op is getattr(sre, "ATOMIC_GROUP", None):
            found |= _chars(list(av))
        elif op is sre.BRANCH:
            for branch in av[1]:
                found |= _chars(list(branch))
        elif op is sre.GROUPREF_EXISTS:
            found |= _chars(list(av[1])) | (_chars(list(av[2])) if av[2] is not None else frozenset())
        else:
            return SPECIAL  # ANY, a back reference, anything else: any character
    return frozenset(found)


def _in(items: list[Any]) -> frozenset[str]:
    """The special characters a class ``[…]`` matches."""
    found: set[str] = set()
    negate = False
    for op, av in items:
        if op is sre.NEGATE:
            negate = True
        elif op is sre.LITERAL:
            found |= {chr(av)} & SPECIAL
        elif op is sre.RANGE:
            found |= {c for c in SPECIAL if av[0] <= ord(c) <= av[1]}
        elif op is sre.CATEGORY:
            found |= set() if av in _NONE_SPECIAL else SPECIAL
        else:
            found |= SPECIAL
    return frozenset(SPECIAL - found) if negate else frozenset(found)
