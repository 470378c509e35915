"""Render the tables of a benchmark run into docs/performance.md.

    python bench/render.py                          # bench/results/latest.json → docs/performance.md
    python bench/render.py bench/results/run-….json
    python bench/render.py bench/results/latest.json bench/results/compare-….json   # several runs
    python bench/render.py --check                  # exit 1 if the doc is not what the JSON renders

The doc marks where each table goes with a pair of comments, ``<!-- bench:KEY -->`` and
``<!-- /bench:KEY -->``; everything between them is replaced. ``KEY`` is a table's key (as printed
by ``bench/run.py`` and saved in the JSON), or ``run`` for the command, machine and load averages of
the run. A table no given run measured keeps what the doc has. The prose around the blocks is the
author's: after a new run, reread it against the figures.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import RESULTS, ROOT, fmt, numeric_columns  # noqa: E402

__all__ = ["markdown_table", "merge", "render", "render_text"]

DOC = ROOT / "docs" / "performance.md"
BLOCK = re.compile(r"(<!-- bench:(?P<key>[\w-]+) -->\n).*?(<!-- /bench:(?P=key) -->)", re.S)


def markdown_table(table: dict[str, Any]) -> str:
    numeric = numeric_columns(table["rows"], len(table["headers"]))
    lines = [
        "| " + " | ".join(table["headers"]) + " |",
        "|" + "|".join("---:" if num else "---" for num in numeric) + "|",
    ]
    lines += ["| " + " | ".join(fmt(cell) for cell in row) + " |" for row in table["rows"]]
    lines += [f"\n{note}" for note in table.get("notes", [])]
    return "\n".join(lines) + "\n"


def run_block(results: dict[str, Any]) -> str:
    m = results["machine"]
    lines = [
        f"`{results.get('command', 'python bench/run.py')}`, {results.get('started', results.get('when'))}, "
        f"{results.get('minutes', '?')} minutes.",
        f"Machine: {m['cpus']} × {m['cpu']}, {m.get('memory_gib')} GiB, Linux {m.get('kernel')}, "
        f"Python {m['python']}.",
        "",
        "| benchmark | seconds | load average before (1, 5, 15 min) | after |",
        "|---|---:|---|---|",
    ]
    for bench in results.get("benches", []):
        lines.append(f"| {bench['name']} | {bench['seconds']} | {bench['load_before']} | {bench['load_after']} |")
    return "\n".join(lines) + "\n"


def render_text(text: str, results: dict[str, Any]) -> tuple[str, list[str], list[str]]:
    """The doc with every block filled; the keys filled, and the tables the doc has no block for."""
    tables = {t["key"]: t for report in results["reports"] for t in report["tables"]}
    data = {report["name"]: report["data"] for report in results["reports"] if report.get("data")}
    if "targets" in tables and data:  # judged again by today's run.targets(), from the run's own figures
        from dataclasses import asdict

        from run import targets

        tables["targets"] = asdict(targets(data))
    filled: list[str] = []

    def fill(match: re.Match[str]) -> str:
        key = match["key"]
        if key == "run":
            body = run_block(results)
        elif key in tables:
            body = markdown_table(tables[key])
        else:
            return match[0]  # this run did not measure it: keep what is there
        filled.append(key)
        return match[1] + body + match[3]

    rendered = BLOCK.sub(fill, text)
    return rendered, filled, sorted(set(tables) - set(filled))


def merge(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One result of several: the first run's description, every run's reports."""
    return {**runs[0], "reports": [report for run in runs for report in run["reports"]]}


def render(results: dict[str, Any], doc: Path = DOC) -> str:
    text, filled, missing = render_text(doc.read_text(), results)
    doc.write_text(text)
    message = f"rendered {', '.join(filled) or 'nothing'} into {doc}"
    if missing:
        message += f"; no block for {', '.join(missing)}"
    return message


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="*", type=Path, default=[RESULTS / "latest.json"],
                        help="result files; the first gives the run block, a later one's table wins")
    parser.add_argument("--doc", type=Path, default=DOC)
    parser.add_argument("--check", action="store_true", help="only check that the doc matches the results")
    args = parser.parse_args()
    results = merge([json.loads(path.read_text()) for path in args.results])
    if args.check:
        text = args.doc.read_text()
        rendered, _, _ = render_text(text, results)
        if rendered != text:
            names = " ".join(str(path) for path in args.results)
            print(f"{args.doc} does not show {names}: run python bench/render.py {names}")
            return 1
        return 0
    print(render(results, args.doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
