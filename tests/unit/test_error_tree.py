"""The client's error tree as drawn at the top of atomictools/_errors.py and in README.md is the
tree the classes make: each drawn child is a direct subclass of the node above it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import atomictools
from atomictools import _errors

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def drawn_edges(text: str) -> list[tuple[str, str]]:
    """(parent, child) for each node of the tree drawn in ``text`` with ├── / └── under a root."""
    lines = text.splitlines()
    first = next(i for i, line in enumerate(lines) if line.strip() and line.split()[0] == "AtomicToolsError")
    indent = len(lines[first]) - len(lines[first].lstrip())
    edges, stack = [], ["AtomicToolsError"]  # stack[depth]: the node last seen at that depth
    for line in lines[first + 1 :]:
        node = re.match(r"^([ │]*)[├└]── (\w+)", line[indent:])
        if node is None:
            if not line[indent:].startswith(("│", " ")) or not line.strip():
                break  # the drawing ended
            continue  # a node's description going on
        depth = len(node.group(1)) // 4 + 1
        del stack[depth:]
        edges.append((stack[-1], node.group(2)))
        stack.append(node.group(2))
    return edges


@pytest.mark.parametrize("where", ["_errors.py", "README.md"])
def test_the_drawn_error_tree_is_the_class_tree(where: str) -> None:
    text = _errors.__doc__ if where == "_errors.py" else README
    assert text is not None
    edges = drawn_edges(text)
    assert len(edges) >= 7 and edges[-1] == ("ProtocolError", "UnknownTool"), edges
    for parent, child in edges:
        assert getattr(atomictools, parent) in getattr(atomictools, child).__bases__, f"{child} is not a {parent}"


def test_the_old_names_are_the_branches_they_became() -> None:
    assert atomictools.ConnectError is atomictools.TransportError
    assert atomictools.RPCError is atomictools.ProtocolError
    assert issubclass(atomictools.CallTimeout, TimeoutError)
