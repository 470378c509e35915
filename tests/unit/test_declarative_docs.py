"""Every declarative tool file shown in the README and docs loads without a problem."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from atomictoolsd.worker.declarative import load_file

ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"```json\n(.*?)```", re.DOTALL)


def tool_files() -> list[tuple[str, str]]:
    found = []
    for doc in (ROOT / "README.md", ROOT / "docs" / "declarative.md"):
        for index, block in enumerate(BLOCK.findall(doc.read_text())):
            if '"tools"' in block:
                found.append((f"{doc.name}#{index}", block))
    found.append(("toolbox.json", (ROOT / "examples" / "tools" / "toolbox.json").read_text()))
    return found


@pytest.mark.parametrize(("where", "text"), tool_files(), ids=[w for w, _ in tool_files()])
def test_documented_tool_files_load_cleanly(tmp_path: Path, where: str, text: str) -> None:
    path = tmp_path / "doc.json"
    path.write_text(text)
    specs, problems = load_file(str(path))
    assert problems == []
    assert [s.name for s in specs] == [t["name"] for t in json.loads(text)["tools"]]


def test_the_docs_show_at_least_the_readme_and_reference_examples() -> None:
    assert {w.split("#")[0] for w, _ in tool_files()} == {"README.md", "declarative.md", "toolbox.json"}


def test_the_programs_whose_arguments_are_data_are_the_ones_documented() -> None:
    from atomictoolsd.worker.declarative.commands import PLAIN

    text = (ROOT / "docs" / "declarative.md").read_text()
    listed = re.search(r"<!-- plain-programs -->(.*?)<!-- /plain-programs -->", text, re.DOTALL)
    assert listed is not None
    assert re.findall(r"`([^`]+)`", listed.group(1)) == sorted(PLAIN)
