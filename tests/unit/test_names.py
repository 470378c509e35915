"""One name per idea: no two exception classes of the daemon share a name, so an ``except`` that
names one can never be read as catching the other (there were two ``ConfigError``s)."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import atomictoolsd

ROOT = Path(atomictoolsd.__file__).parent


def test_no_two_exception_classes_share_a_name() -> None:
    places: dict[str, list[str]] = defaultdict(list)
    for path in sorted(ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef) and (node.name.endswith(("Error", "Failure", "Failed")) or any(
                isinstance(base, ast.Name) and base.id.endswith(("Error", "Exception")) for base in node.bases
            )):
                places[node.name].append(f"{path.relative_to(ROOT)}:{node.lineno}")
    shared = {name: where for name, where in places.items() if len(where) > 1}
    assert not shared, f"exception classes sharing a name: {shared}"
