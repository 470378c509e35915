"""The docs say what the code does."""

from __future__ import annotations

from pathlib import Path

from atomictoolsd.config.settings import Config

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_every_setting_is_documented_with_its_default_and_variable() -> None:
    text = (DOCS / "configuration.md").read_text()
    for item in Config().describe():
        row = next((line for line in text.splitlines() if line.startswith(f"| `{item['key']}` |")), None)
        assert row is not None, f"{item['key']} is missing from docs/configuration.md"
        value = item["value"]
        shown = str(value).lower() if isinstance(value, bool) else f'"{value}"' if isinstance(value, str) else str(value)
        variable = f"`{item['env']}`" if item["env"] is not None else "config.toml only"  # a file-only setting has none
        assert f"`{shown}`" in row and variable in row, row


def test_architecture_lists_each_component_file_once() -> None:
    # One entry a file: two that drift apart say two different things about the same module.
    import re
    from collections import Counter

    section = (DOCS / "architecture.md").read_text().split("\n## Components\n", 1)[1].split("\n## ", 1)[0]
    entries = Counter(re.findall(r"^- `([^`]+\.py)`:", section, re.MULTILINE))
    assert entries, "no component entries found"
    assert not [path for path, n in entries.items() if n > 1], entries.most_common(3)


def test_the_docs_describe_the_product_not_its_history() -> None:
    # How the product got here is CHANGELOG.md's; a page that says "as before" or "the third pass"
    # makes its reader learn a past they never saw to understand what runs.
    import re

    past = re.compile(r"\b(previously|as it always has|as before|until this version|before this change|in this branch"
                      r"|(first|second|third|fourth|fifth) pass)\b", re.IGNORECASE)
    pages = [*sorted(DOCS.glob("*.md")), DOCS.parent / "README.md"]
    found = [f"{page.name}:{n}: {line.strip()}" for page in pages
             for n, line in enumerate(page.read_text().splitlines(), 1) if past.search(line)]
    assert not found, "\n".join(found)


def test_performance_doc_shows_the_committed_bench_run() -> None:
    # Its tables are rendered from bench/results/latest.json by bench/render.py; a renderer or a doc
    # changed alone shows figures no run produced.
    import subprocess
    import sys

    root = DOCS.parent
    check = subprocess.run([sys.executable, str(root / "bench" / "render.py"), "--check", str(root / "bench" / "results" / "latest.json")],
                           capture_output=True, text=True, cwd=root, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
